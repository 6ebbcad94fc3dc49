//! The registration path: before a verbs registration of GPU memory is delegated, make sure the
//! RM memory behind it is registered with NV50_THIRD_PARTY_P2P exactly as libcuda does it on
//! datacenter GPUs, and undo it when the last MR goes or the memory/VA goes away.
//!
//! Pure logic behind the [`Rm`] trait: real ioctls in production (`rm.rs`), a fake in tests.
//!
//! Where the 503C lives: in the CUDA client, under the subdevice of the memory's device, with an
//! RM-generated handle, issued on the client's own /dev/nvidiactl fd. Reasons (fact sheet S3):
//! REGISTER_VIDMEM accepts only memory of the 503C's own client, so the CUDA client needs no DUP;
//! RM itself unregisters a vidmem object from every 503C of its client when the object is freed,
//! so a free we fail to see can never leave a registration pointing at recycled memory; a DUP
//! into a client of ours would instead keep the memory alive and registered after CUDA freed it.

use crate::abi::{p2p, status};
use crate::decode::Pending;
use crate::fxhash::FxHashMap as HashMap;
use crate::tracker::{ObjKind, Tracker, VidmemTuple};
use crate::vamap::{MemRef, Miss};
use std::fmt;

/// The RM calls the registrar needs. Errors are RM status codes.
pub trait Rm {
    fn alloc_p2p(&mut self, client: u32, subdevice: u32) -> Result<u32, u32>;
    fn register_va_space(&mut self, client: u32, p2p: u32, h_vaspace: u32) -> Result<u64, u32>;
    fn register_vidmem(&mut self, client: u32, p2p: u32, t: &VidmemTuple) -> Result<(), u32>;
    fn unregister_vidmem(&mut self, client: u32, p2p: u32, h_memory: u32) -> Result<(), u32>;
    fn free(&mut self, client: u32, parent: u32, h: u32) -> Result<(), u32>;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegMiss {
    Lookup(Miss),
    NotVidmem {
        class: u32,
    },
    NoDevice,
    NoSubdevice,
    NoVaSpace,
    Unaligned(VidmemTuple),
    SpansMappings {
        mapping_end: u64,
    },
    /// The UVM mapping an MR lies in is no longer whole: part of it was unmapped or mapped again.
    MappingNotWhole {
        tuple: VidmemTuple,
    },
    OtherAddress {
        registered: VidmemTuple,
    },
    Rm {
        call: &'static str,
        status: u32,
    },
}

impl fmt::Display for RegMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegMiss::Lookup(m) => write!(f, "{m}"),
            RegMiss::NotVidmem { class } => write!(f, "memory class {class:#x} is not vidmem"),
            RegMiss::NoDevice => write!(f, "the memory's device is unknown"),
            RegMiss::NoSubdevice => write!(f, "no single subdevice under the memory's device"),
            RegMiss::NoVaSpace => write!(f, "no VA space registered with UVM under the memory's device"),
            RegMiss::Unaligned(t) => write!(f, "backing range {t} is not 64 KiB aligned"),
            RegMiss::SpansMappings { mapping_end } => write!(f, "the MR runs past its UVM mapping (ends at {mapping_end:#x})"),
            RegMiss::MappingNotWhole { tuple } => write!(f, "the UVM mapping {tuple} is no longer whole (part of it was unmapped or mapped to other memory); registering it would describe memory that is not there"),
            RegMiss::OtherAddress { registered } => write!(f, "the memory is already registered at another VA {registered} (one range per hMemory)"),
            RegMiss::Rm { call, status: st } => write!(f, "{call} refused: {:#x} {} ({})", st, status::name(*st), likely_cause(call, *st)),
        }
    }
}

/// What a refused RM status most likely means, for people.
pub fn likely_cause(call: &str, st: u32) -> &'static str {
    match (call, st) {
        ("NV503C alloc", status::NV_ERR_STATE_IN_USE) => "a 503C already exists under this subdevice: native registration present",
        ("NV503C alloc", status::NV_ERR_NOT_SUPPORTED) => "third-party P2P unavailable: no P2P-patched driver, or APM/CC enabled",
        ("NV503C alloc", status::NV_ERR_INVALID_CLASS) => "the GPU does not list class 0x503C: unpatched or unsupported driver",
        ("NV503C alloc", status::NV_ERR_INVALID_ARGUMENT) => "BAR1 type refused (coherent CPU mapping?) or unknown driver ABI",
        (_, status::NV_ERR_INVALID_CLIENT) => "the client is not usable from this fd: strict client validation",
        (_, status::NV_ERR_OBJECT_NOT_FOUND) => "handle not found in the client (freed, or another client's memory)",
        (_, status::NV_ERR_INSERT_DUPLICATE_NAME) => "already registered (same memory or overlapping address)",
        (_, status::NV_ERR_NOT_SUPPORTED) => "not FBMEM, or third-party P2P not supported here",
        (_, status::NV_ERR_INVALID_ARGUMENT) => "size/address/offset not 64 KiB aligned or past the allocation, or unknown driver ABI",
        _ => "see nvidia-abi.md S3",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GpuReg {
    p2p: u32,
    subdevice: u32,
    vaspace: u32,
    token: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reg {
    tuple: VidmemTuple,
    p2p: u32,
    refs: u32,
    /// Distinguishes a registration from a later one of the same memory, so that an MR left over
    /// from before an unmap can never release its successor.
    id: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegCounts {
    pub pass0_hits: u64,
    pub pass0_misses: u64,
    pub registered: u64,
    pub unregistered: u64,
    pub rm_errors: u64,
    pub host: u64,
    pub stood_aside: u64,
    pub p2p_objects: u64,
}

/// The registration reference of an MR being deregistered, held across the provider's call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldRef {
    mem: MemRef,
    id: u64,
}

/// What to do about one verbs registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not GPU memory: delegate, nothing to do.
    Host,
    /// Native registration present (datacenter GPU): delegate, register nothing.
    StandAside,
    /// Registered (or shared an existing registration) for this memory; commit or release.
    Hit { mem: MemRef, offset: u64, tuple: VidmemTuple, fresh: bool, id: u64 },
    /// Nothing registered; delegate and let the real call fail as it would.
    Miss(RegMiss),
}

#[derive(Default)]
pub struct Registrar {
    gpus: HashMap<(u32, u32), GpuReg>, // (client, device)
    regs: HashMap<MemRef, Reg>,
    /// Live MRs (by the provider's `ibv_mr*`) and the registration they hold a reference on.
    mrs: HashMap<u64, (MemRef, u64)>,
    next_id: u64,
    pub counts: RegCounts,
    /// Only compute and log decisions (shadow mode), never call RM.
    pub dry_run: bool,
}

const G: u64 = p2p::GRANULE;
fn down(x: u64) -> u64 {
    x & !(G - 1)
}
fn up(x: u64) -> Option<u64> {
    x.checked_add(G - 1).map(down)
}

impl Registrar {
    pub fn new(dry_run: bool) -> Self {
        Registrar { dry_run, ..Default::default() }
    }

    pub fn live_registrations(&self) -> usize {
        self.regs.len()
    }
    /// Whether `mr` holds a registration reference.
    pub fn holds_mr(&self, mr: u64) -> bool {
        self.mrs.contains_key(&mr)
    }
    pub fn live_mrs(&self) -> usize {
        self.mrs.len()
    }
    pub fn p2p_objects(&self) -> usize {
        self.gpus.len()
    }

    /// Before delegating a verbs registration of `[addr, addr+len)`.
    pub fn before_reg(&mut self, t: &Tracker, rm: &mut dyn Rm, addr: u64, len: u64) -> Decision {
        let d = self.decide(t, rm, addr, len);
        match &d {
            Decision::Host => self.counts.host += 1,
            Decision::StandAside => self.counts.stood_aside += 1,
            Decision::Hit { .. } => self.counts.pass0_hits += 1,
            Decision::Miss(m) => {
                self.counts.pass0_misses += 1;
                if matches!(m, RegMiss::Rm { .. }) {
                    self.counts.rm_errors += 1;
                }
            }
        }
        d
    }

    fn decide(&mut self, t: &Tracker, rm: &mut dyn Rm, addr: u64, len: u64) -> Decision {
        // Host memory first, with two tree lookups: most verbs registrations of a job are not GPU
        // memory, and they must cost next to nothing.
        if !t.is_gpu_va(addr) && !t.map.was_mapped(addr) {
            return Decision::Host;
        }
        let piece = match t.map.lookup_single(addr, len) {
            Ok(p) => p,
            Err(m) => return Decision::Miss(RegMiss::Lookup(m)),
        };
        match t.memory_class(piece.mem) {
            Some(crate::abi::class::NV01_MEMORY_LOCAL_USER) => {}
            Some(class) if class == crate::abi::class::NV01_MEMORY_SYSTEM => return Decision::Host,
            Some(class) => return Decision::Miss(RegMiss::NotVidmem { class }),
            None => return Decision::Miss(RegMiss::NoDevice),
        }
        if t.native_p2p_present() || t.native_seen {
            return Decision::StandAside;
        }
        let tuple = Tracker::predict(&piece);
        if !tuple.address.is_multiple_of(G) || !tuple.size.is_multiple_of(G) || !tuple.offset.is_multiple_of(G) || tuple.size == 0 {
            return Decision::Miss(RegMiss::Unaligned(tuple));
        }
        // peermem rounds the MR out to 64 KiB: the whole rounded range must sit in this one
        // registration, which is this one UVM mapping.
        let end = match addr.checked_add(len).and_then(up) {
            Some(e) => e,
            None => return Decision::Miss(RegMiss::Lookup(Miss::Overflow)),
        };
        let map_end = tuple.address + tuple.size;
        if down(addr) < tuple.address || end > map_end {
            return Decision::Miss(RegMiss::SpansMappings { mapping_end: map_end });
        }
        // The registration describes the whole mapping: all of it must still be this memory, at
        // these offsets, on every GPU that maps it.
        match t.map.lookup_single(tuple.address, tuple.size) {
            Ok(p) if p.mem == piece.mem && p.offset == tuple.offset => {}
            _ => return Decision::Miss(RegMiss::MappingNotWhole { tuple }),
        }
        let offset = piece.offset;
        if let Some(r) = self.regs.get_mut(&piece.mem) {
            if r.tuple != tuple {
                return Decision::Miss(RegMiss::OtherAddress { registered: r.tuple });
            }
            r.refs += 1;
            return Decision::Hit { mem: piece.mem, offset, tuple, fresh: false, id: r.id };
        }
        if self.dry_run {
            return Decision::Hit { mem: piece.mem, offset, tuple, fresh: true, id: 0 };
        }
        let Some((h_device, _)) = t.memory_device(piece.mem) else { return Decision::Miss(RegMiss::NoDevice) };
        let client = piece.mem.client;
        let g = match self.gpus.get(&(client, h_device)) {
            Some(g) => *g,
            None => {
                let Some(subdevice) = t.subdevice_of(client, h_device) else { return Decision::Miss(RegMiss::NoSubdevice) };
                let Some(vaspace) = t.uvm_vaspace_of(client, h_device) else { return Decision::Miss(RegMiss::NoVaSpace) };
                let p2p = match rm.alloc_p2p(client, subdevice) {
                    Ok(h) => h,
                    Err(st) => return Decision::Miss(RegMiss::Rm { call: "NV503C alloc", status: st }),
                };
                let token = match rm.register_va_space(client, p2p, vaspace) {
                    Ok(tk) => tk,
                    Err(st) => {
                        // Never leave a half-made object behind.
                        let _ = rm.free(client, subdevice, p2p);
                        return Decision::Miss(RegMiss::Rm { call: "REGISTER_VA_SPACE", status: st });
                    }
                };
                let g = GpuReg { p2p, subdevice, vaspace, token };
                self.gpus.insert((client, h_device), g);
                self.counts.p2p_objects += 1;
                g
            }
        };
        if let Err(st) = rm.register_vidmem(client, g.p2p, &tuple) {
            return Decision::Miss(RegMiss::Rm { call: "REGISTER_VIDMEM", status: st });
        }
        self.counts.registered += 1;
        self.next_id += 1;
        let id = self.next_id;
        self.regs.insert(piece.mem, Reg { tuple, p2p: g.p2p, refs: 1, id });
        Decision::Hit { mem: piece.mem, offset, tuple, fresh: true, id }
    }

    /// After the real verbs call: keep the reference if it produced an MR, else drop it.
    pub fn after_reg(&mut self, rm: &mut dyn Rm, d: &Decision, mr: u64) {
        let Decision::Hit { mem, id, .. } = d else { return };
        if self.dry_run {
            return;
        }
        if mr != 0 {
            if let Some((old, old_id)) = self.mrs.insert(mr, (*mem, *id)) {
                // The provider reused an MR pointer we still hold: drop the stale reference.
                self.release(rm, old, old_id);
            }
        } else {
            self.release(rm, *mem, *id);
        }
    }

    /// After a successful `ibv_dereg_mr(mr)`.
    pub fn after_dereg(&mut self, rm: &mut dyn Rm, mr: u64) {
        if let Some(held) = self.take_mr(mr) {
            self.finish_dereg(rm, mr, held, true);
        }
    }

    /// Before the provider's `ibv_dereg_mr(mr)`: take the MR's reference out of the table while
    /// `mr` still names this MR. Once the provider frees it, another thread's registration can
    /// get the same pointer back from malloc at once; a lookup after the call would then release
    /// that thread's registration instead.
    pub fn take_mr(&mut self, mr: u64) -> Option<HeldRef> {
        self.mrs.remove(&mr).map(|(mem, id)| HeldRef { mem, id })
    }

    /// After the provider's dereg: release the reference taken by [`take_mr`](Self::take_mr),
    /// or give it back to `mr` if the provider refused (the MR still exists).
    pub fn finish_dereg(&mut self, rm: &mut dyn Rm, mr: u64, held: HeldRef, deregistered: bool) {
        if deregistered {
            self.release(rm, held.mem, held.id);
        } else {
            self.mrs.insert(mr, (held.mem, held.id));
        }
    }

    fn release(&mut self, rm: &mut dyn Rm, mem: MemRef, id: u64) {
        let Some(r) = self.regs.get_mut(&mem).filter(|r| r.id == id) else { return };
        r.refs = r.refs.saturating_sub(1);
        if r.refs == 0 {
            let r = self.regs.remove(&mem).expect("present");
            self.unregister(rm, mem, r.p2p);
        }
    }

    fn unregister(&mut self, rm: &mut dyn Rm, mem: MemRef, p2p: u32) {
        match rm.unregister_vidmem(mem.client, p2p, mem.memory) {
            Ok(()) => self.counts.unregistered += 1,
            Err(st) => {
                self.counts.rm_errors += 1;
                tracing::warn!("UNREGISTER_VIDMEM hMemory={:#010x} refused: {st:#x} {}", mem.memory, status::name(st));
            }
        }
    }

    /// Before memory or VA goes away (UVM_FREE, UVM_UNMAP_EXTERNAL, RM_FREE): unregister every
    /// registration that `gone` selects, whatever MRs still reference it (they keep only a
    /// dangling entry, released as a no-op at dereg).
    pub fn before_release(&mut self, rm: &mut dyn Rm, gone: impl Fn(&VidmemTuple) -> bool) -> Vec<VidmemTuple> {
        self.release_where(rm, |t, _| gone(t))
    }

    /// As [`before_release`](Self::before_release), selecting by the tuple and the 503C it is on.
    fn release_where(&mut self, rm: &mut dyn Rm, gone: impl Fn(&VidmemTuple, u32) -> bool) -> Vec<VidmemTuple> {
        let hit: Vec<MemRef> = self.regs.iter().filter(|(_, r)| gone(&r.tuple, r.p2p)).map(|(m, _)| *m).collect();
        let mut out = Vec::new();
        for m in &hit {
            let r = self.regs.remove(m).expect("listed");
            self.unregister(rm, *m, r.p2p);
            out.push(r.tuple);
        }
        out
    }

    /// Before the driver runs a call that releases or replaces memory or VA: unregister every
    /// registration that would otherwise describe memory that is no longer at its address.
    /// Returns what was unregistered.
    pub fn before_driver_call(&mut self, t: &Tracker, rm: &mut dyn Rm, call: Pending) -> Vec<VidmemTuple> {
        if self.regs.is_empty() && self.gpus.is_empty() {
            return Vec::new();
        }
        let overlaps = |x: &VidmemTuple, base: u64, end: u64| x.address < end && base < x.address.saturating_add(x.size);
        match call {
            Pending::UvmFree { base } => {
                let end = base.saturating_add(t.uvm_free_extent(base, None));
                self.before_release(rm, |x| overlaps(x, base, end))
            }
            // Registrations are per memory, not per GPU: an unmap on any GPU drops them (safe side).
            Pending::UvmUnmap { base, length } => self.before_release(rm, |x| overlaps(x, base, base.saturating_add(length))),
            Pending::UvmMap { base, length, offset, h_client, h_memory } => {
                // UVM first unmaps what the new mapping overlaps. A registration survives only
                // where the new mapping says the same thing: same memory at the same offsets
                // (cuMemSetAccess maps a range again exactly so).
                let mem = MemRef { client: h_client, memory: h_memory };
                let same = |x: &VidmemTuple| x.mem == mem && (x.offset as i128 - x.address as i128) == (offset as i128 - base as i128);
                self.before_release(rm, |x| overlaps(x, base, base.saturating_add(length)) && !same(x))
            }
            Pending::RmFree { h_client, h_object } => match t.object(h_client, h_object).map(|o| o.kind) {
                Some(ObjKind::Memory { .. }) => self.before_release(rm, |x| x.mem.client == h_client && x.mem.memory == h_object),
                Some(ObjKind::Client { .. }) => self.before_release(rm, |x| x.mem.client == h_client),
                Some(_) => {
                    // A device, subdevice or VA space: RM frees our 503C with it (a child of the
                    // subdevice, dependent on the VA space). Take it down first, cleanly.
                    let gone = self.p2p_freed_with(h_client, h_object);
                    let mut out = Vec::new();
                    for (key, g) in gone {
                        out.extend(self.release_where(rm, |x, p2p| x.mem.client == h_client && p2p == g.p2p));
                        self.gpus.remove(&key);
                        if let Err(st) = rm.free(h_client, g.subdevice, g.p2p) {
                            tracing::warn!("freeing gdrshim's NV503C {:#010x} refused: {st:#x} {}", g.p2p, status::name(st));
                        }
                    }
                    out
                }
                None => Vec::new(),
            },
        }
    }

    /// RM freed `h` in `client` (a free that succeeded): if it was the device, subdevice or VA
    /// space of one of our 503C objects, RM freed that 503C with it (child of the subdevice,
    /// dependent on the VA space) and every registration on it.
    pub fn forget_freed(&mut self, client: u32, h: u32) {
        for (key, g) in self.p2p_freed_with(client, h) {
            self.regs.retain(|m, r| !(m.client == client && r.p2p == g.p2p));
            self.gpus.remove(&key);
        }
    }

    /// Our 503C objects that RM frees together with `h` of `client`: those whose device,
    /// subdevice or VA space `h` is.
    fn p2p_freed_with(&self, client: u32, h: u32) -> Vec<((u32, u32), GpuReg)> {
        self.gpus
            .iter()
            .filter(|((c, dev), g)| *c == client && (*dev == h || g.subdevice == h || g.vaspace == h))
            .map(|(k, g)| (*k, *g))
            .collect()
    }

    /// A client went away: RM freed its 503C objects and their registrations itself.
    pub fn forget_client(&mut self, client: u32) {
        self.regs.retain(|m, _| m.client != client);
        self.mrs.retain(|_, (m, _)| m.client != client);
        self.gpus.retain(|(c, _), _| *c != client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Event, P2pCtrl};

    const C: u32 = 0xc1d0_0001;
    const DEV: u32 = 0x5c00_0002;
    const SUB: u32 = 0x5c00_0003;
    const VAS: u32 = 0x5c00_0009;
    const GPU: [u8; 16] = [9; 16];

    /// A fake RM that enforces the 503C rules the registrar depends on.
    #[derive(Default)]
    struct FakeRm {
        p2p: Vec<(u32, u32)>, // (subdevice, handle)
        vaspaces: u32,
        regs: Vec<VidmemTuple>,
        fail_va_space: bool,
        fail_alloc: Option<u32>,
        frees: u32,
    }
    impl Rm for FakeRm {
        fn alloc_p2p(&mut self, _c: u32, sub: u32) -> Result<u32, u32> {
            if let Some(st) = self.fail_alloc {
                return Err(st);
            }
            if self.p2p.iter().any(|p| p.0 == sub) {
                return Err(status::NV_ERR_STATE_IN_USE);
            }
            self.p2p.push((sub, 0xcaf0_0000));
            Ok(0xcaf0_0000)
        }
        fn register_va_space(&mut self, _c: u32, _p: u32, _v: u32) -> Result<u64, u32> {
            if self.fail_va_space {
                return Err(status::NV_ERR_INVALID_ARGUMENT);
            }
            self.vaspaces += 1;
            Ok(0xfe00)
        }
        fn register_vidmem(&mut self, _c: u32, _p: u32, t: &VidmemTuple) -> Result<(), u32> {
            if self.regs.iter().any(|r| r.mem == t.mem || (t.address < r.address + r.size && r.address < t.address + t.size)) {
                return Err(status::NV_ERR_INSERT_DUPLICATE_NAME);
            }
            self.regs.push(*t);
            Ok(())
        }
        fn unregister_vidmem(&mut self, _c: u32, _p: u32, h: u32) -> Result<(), u32> {
            let n = self.regs.len();
            self.regs.retain(|r| r.mem.memory != h);
            if self.regs.len() == n {
                Err(status::NV_ERR_OBJECT_NOT_FOUND)
            } else {
                Ok(())
            }
        }
        fn free(&mut self, _c: u32, _parent: u32, h: u32) -> Result<(), u32> {
            self.frees += 1;
            self.p2p.retain(|p| p.1 != h);
            Ok(())
        }
    }

    fn tracker_with(maps: &[(u32, u64, u64)]) -> Tracker {
        let mut t = Tracker::new();
        t.apply(&Event::RootClient { fd: 8, h_client: C });
        t.apply(&Event::Device { h_client: C, h_device: DEV, device_id: 0 });
        t.apply(&Event::Subdevice { h_client: C, h_device: DEV, h_subdevice: SUB, subdevice_id: 0 });
        t.apply(&Event::VaSpace { h_client: C, h_parent: DEV, h_vaspace: VAS, class: 0x90f1, flags: 0x48 });
        t.apply(&Event::UvmRegisterGpuVaSpace { uuid: GPU, rm_ctrl_fd: 8, h_client: C, h_vaspace: VAS });
        for &(h, va, len) in maps {
            t.apply(&Event::Memory { h_client: C, h_parent: DEV, h_memory: h, class: 0x40, size: Some(len), attr: 0, attr2: 0, flags: 0 });
            t.apply(&Event::UvmCreateExternalRange { base: va, length: len });
            t.apply(&Event::UvmMapExternal {
                base: va,
                length: len,
                offset: 0,
                gpus: smallvec::smallvec![GPU],
                rm_ctrl_fd: 8,
                h_client: C,
                h_memory: h,
            });
        }
        t
    }

    #[test]
    fn registers_the_backing_mapping_once_and_refcounts_mrs() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        // NCCL-style 4 KiB-rounded MRs inside one 2 MiB chunk
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_1000, 0x1000);
        assert!(matches!(a, Decision::Hit { fresh: true, offset: 0x1000, .. }));
        r.after_reg(&mut rm, &a, 0xa);
        let b = r.before_reg(&t, &mut rm, 0x7f00_0001_0000, 0x2000);
        assert!(matches!(b, Decision::Hit { fresh: false, .. }));
        r.after_reg(&mut rm, &b, 0xb);
        assert_eq!(
            rm.regs,
            vec![VidmemTuple { mem: MemRef { client: C, memory: 0x10 }, address: 0x7f00_0000_0000, size: 0x20_0000, offset: 0 }]
        );
        assert_eq!((rm.p2p.len(), rm.vaspaces), (1, 1), "one 503C with exactly one VA space");
        r.after_dereg(&mut rm, 0xa);
        assert_eq!(rm.regs.len(), 1);
        r.after_dereg(&mut rm, 0xb);
        assert!(rm.regs.is_empty());
        assert_eq!((r.counts.registered, r.counts.unregistered, r.counts.rm_errors), (1, 1, 0));
    }

    #[test]
    fn a_failed_verbs_call_drops_its_reference() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &a, 0);
        assert!(rm.regs.is_empty());
        assert_eq!(r.live_registrations(), 0);
    }

    #[test]
    fn misses_register_nothing() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000), (0x11, 0x7f00_0020_0000, 0x20_0000)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        assert!(matches!(
            r.before_reg(&t, &mut rm, 0x7f00_001f_f000, 0x2000),
            Decision::Miss(RegMiss::Lookup(Miss::SpansMemoryObjects { count: 2 }))
        ));
        assert!(matches!(r.before_reg(&t, &mut rm, 0x7f00_003f_f000, 0x2000), Decision::Miss(RegMiss::Lookup(Miss::Unmapped { .. }))));
        assert_eq!(r.before_reg(&t, &mut rm, 0x1000, 0x1000), Decision::Host);
        assert!(rm.regs.is_empty() && rm.p2p.is_empty());
        assert_eq!(r.counts.pass0_misses, 2);
    }

    #[test]
    fn unaligned_mapping_is_a_miss_not_a_guess() {
        let mut t = tracker_with(&[]);
        t.apply(&Event::Memory {
            h_client: C,
            h_parent: DEV,
            h_memory: 0x20,
            class: 0x40,
            size: Some(0x10_0000),
            attr: 0,
            attr2: 0,
            flags: 0,
        });
        t.apply(&Event::UvmMapExternal {
            base: 0x7f00_0000_1000,
            length: 0x8000,
            offset: 0x1000,
            gpus: smallvec::smallvec![GPU],
            rm_ctrl_fd: 8,
            h_client: C,
            h_memory: 0x20,
        });
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        assert!(matches!(r.before_reg(&t, &mut rm, 0x7f00_0000_1000, 0x1000), Decision::Miss(RegMiss::Unaligned(_))));
        assert!(rm.p2p.is_empty());
    }

    #[test]
    fn refused_va_space_leaves_no_half_made_object() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        let mut rm = FakeRm { fail_va_space: true, ..Default::default() };
        let mut r = Registrar::new(false);
        let d = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        assert!(matches!(d, Decision::Miss(RegMiss::Rm { call: "REGISTER_VA_SPACE", .. })));
        assert!(rm.p2p.is_empty(), "the 503C was freed again");
        assert_eq!((rm.frees, r.counts.rm_errors), (1, 1));
        let mut rm = FakeRm { fail_alloc: Some(status::NV_ERR_NOT_SUPPORTED), ..Default::default() };
        let d = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        let Decision::Miss(m) = d else { panic!() };
        assert!(m.to_string().contains("no P2P-patched driver"), "{m}");
    }

    #[test]
    fn native_registration_means_stand_aside() {
        let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        t.apply(&Event::P2pAlloc { h_client: C, h_parent: SUB, h_object: 0x5c00_000d, flags: 1 });
        t.apply(&Event::P2pControl {
            h_client: C,
            h_object: 0x5c00_000d,
            ctrl: P2pCtrl::RegisterVaSpace { h_vaspace: VAS, token: 0xfe00 },
        });
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        assert_eq!(r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000), Decision::StandAside);
        assert!(rm.p2p.is_empty());
    }

    #[test]
    fn release_before_free_and_the_same_memory_at_a_new_va() {
        let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &a, 0xa);
        // VMM unmap of the VA while the MR is live: unregistered first
        let gone = r.before_release(&mut rm, |x| x.address == 0x7f00_0000_0000);
        assert_eq!(gone.len(), 1);
        assert!(rm.regs.is_empty());
        t.apply(&Event::UvmFree { base: 0x7f00_0000_0000, length: Some(0x20_0000) });
        t.apply(&Event::UvmMapExternal {
            base: 0x7f00_1000_0000,
            length: 0x20_0000,
            offset: 0,
            gpus: smallvec::smallvec![GPU],
            rm_ctrl_fd: 8,
            h_client: C,
            h_memory: 0x10,
        });
        let b = r.before_reg(&t, &mut rm, 0x7f00_1000_0000, 0x1000);
        assert!(matches!(b, Decision::Hit { fresh: true, .. }));
        r.after_reg(&mut rm, &b, 0xb);
        // the old MR's dereg is a no-op now; the new one's unregisters
        r.after_dereg(&mut rm, 0xa);
        assert_eq!(rm.regs.len(), 1);
        r.after_dereg(&mut rm, 0xb);
        assert!(rm.regs.is_empty());
        assert_eq!(r.counts.rm_errors, 0);
    }

    #[test]
    fn a_remap_to_other_memory_unregisters_first_an_identical_one_does_not() {
        let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x40_0000)]);
        t.apply(&Event::Memory {
            h_client: C,
            h_parent: DEV,
            h_memory: 0x11,
            class: 0x40,
            size: Some(0x40_0000),
            attr: 0,
            attr2: 0,
            flags: 0,
        });
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &a, 0xa);
        // cuMemSetAccess maps the first half again, same memory, same offsets: kept
        let same = Pending::UvmMap { base: 0x7f00_0000_0000, length: 0x20_0000, offset: 0, h_client: C, h_memory: 0x10 };
        assert!(r.before_driver_call(&t, &mut rm, same).is_empty());
        // the second half now at another offset of the same memory: the registration would lie
        let shifted = Pending::UvmMap { base: 0x7f00_0020_0000, length: 0x10_0000, offset: 0, h_client: C, h_memory: 0x10 };
        assert_eq!(r.before_driver_call(&t, &mut rm, shifted).len(), 1);
        assert!(rm.regs.is_empty());
        r.after_dereg(&mut rm, 0xa);
        let b = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &b, 0xb);
        // other memory over part of it: unregistered before UVM replaces it
        let other = Pending::UvmMap { base: 0x7f00_0030_0000, length: 0x1_0000, offset: 0, h_client: C, h_memory: 0x11 };
        assert_eq!(r.before_driver_call(&t, &mut rm, other).len(), 1);
        t.apply(&Event::UvmMapExternal {
            base: 0x7f00_0030_0000,
            length: 0x1_0000,
            offset: 0,
            gpus: smallvec::smallvec![GPU],
            rm_ctrl_fd: 8,
            h_client: C,
            h_memory: 0x11,
        });
        // and the mapping it cut is no longer registrable as a whole
        let c = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        assert!(matches!(c, Decision::Miss(RegMiss::MappingNotWhole { .. })), "{c:?}");
        assert!(c_miss_text(&c).contains("no longer whole"));
        assert!(rm.regs.is_empty());
    }

    fn c_miss_text(d: &Decision) -> String {
        match d {
            Decision::Miss(m) => m.to_string(),
            _ => String::new(),
        }
    }

    #[test]
    fn a_freed_device_with_nothing_registered_takes_our_503c_with_it() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &a, 0xa);
        r.after_dereg(&mut rm, 0xa);
        assert_eq!((r.live_registrations(), r.p2p_objects()), (0, 1));
        r.forget_freed(C, 0x5c00_0077); // some other object: nothing
        assert_eq!(r.p2p_objects(), 1);
        r.forget_freed(C, VAS);
        assert_eq!(r.p2p_objects(), 0, "RM freed our 503C with the VA space");
    }

    #[test]
    fn freeing_the_va_space_or_device_takes_our_503c_down_first() {
        let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
        for h in [VAS, SUB, DEV] {
            let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
            let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
            r.after_reg(&mut rm, &a, 0xa);
            assert_eq!(r.p2p_objects(), 1);
            let gone = r.before_driver_call(&t, &mut rm, Pending::RmFree { h_client: C, h_object: h });
            assert_eq!(gone.len(), 1, "freeing {h:#x}");
            assert!(rm.regs.is_empty() && rm.p2p.is_empty(), "freeing {h:#x}: our 503C and its registration are gone");
            assert_eq!(r.p2p_objects(), 0);
            assert_eq!(r.counts.rm_errors, 0);
        }
    }

    /// Model-based: random allocations, maps (sub-ranges, offsets), unmaps, frees in any order,
    /// verbs registrations of random sub-ranges (and of random addresses), deregistrations. After
    /// every step every registration the fake RM holds is exactly a live mapping of the model, and
    /// every hit names the mapping the model has at that address. `GDRSHIM_MODEL_OPS` sets the
    /// number of operations (default 1 000 000).
    #[test]
    fn model_based_random_operations() {
        let ops: u64 = std::env::var("GDRSHIM_MODEL_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        const SLOT: u64 = 16 << 20; // one VA slot per mapping, so model mappings never overlap
        const BASE: u64 = 0x7f00_0000_0000;
        let mut t = tracker_with(&[]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let mut mems: Vec<(u32, u64)> = Vec::new(); // (handle, size)
        let mut next_mem = 0x100u32;
        let mut maps: std::collections::BTreeMap<u64, (u64, u32, u64)> = Default::default(); // slot base -> (len, mem, offset)
        let mut mrs: Vec<(u64, VidmemTuple)> = Vec::new();
        let mut next_mr = 1u64;
        let (mut hits, mut misses, mut frees, mut unmaps) = (0u64, 0u64, 0u64, 0u64);
        for step in 0..ops {
            match rnd(100) {
                0..=9 if mems.len() < 48 => {
                    let size = (1 + rnd(128)) << 16;
                    t.apply(&Event::Memory {
                        h_client: C,
                        h_parent: DEV,
                        h_memory: next_mem,
                        class: 0x40,
                        size: Some(size),
                        attr: 0,
                        attr2: 0,
                        flags: 0,
                    });
                    mems.push((next_mem, size));
                    next_mem += 1;
                }
                10..=29 if !mems.is_empty() => {
                    let slot = BASE + rnd(64) * SLOT;
                    if maps.contains_key(&slot) {
                        continue;
                    }
                    let (h, size) = mems[rnd(mems.len() as u64) as usize];
                    let offset = rnd(size >> 16) << 16;
                    let len = (1 + rnd((size - offset) >> 16)) << 16;
                    t.apply(&Event::UvmCreateExternalRange { base: slot, length: len });
                    t.apply(&Event::UvmMapExternal {
                        base: slot,
                        length: len,
                        offset,
                        gpus: smallvec::smallvec![GPU],
                        rm_ctrl_fd: 8,
                        h_client: C,
                        h_memory: h,
                    });
                    maps.insert(slot, (len, h, offset));
                }
                30..=37 if !maps.is_empty() => {
                    // UVM_FREE of a mapping, as the shim's before_ioctl handles it
                    let slot = *maps.keys().nth(rnd(maps.len() as u64) as usize).unwrap();
                    r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: slot });
                    t.apply(&Event::UvmFree { base: slot, length: None });
                    maps.remove(&slot);
                    unmaps += 1;
                }
                38..=41 if !mems.is_empty() => {
                    // RM_FREE of a memory object, mapped or not
                    let (h, _) = mems.swap_remove(rnd(mems.len() as u64) as usize);
                    r.before_driver_call(&t, &mut rm, Pending::RmFree { h_client: C, h_object: h });
                    t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: h });
                    // RM frees the memory; UVM keeps the VA range (now backed by nothing we may register)
                    maps.retain(|_, m| m.1 != h);
                    frees += 1;
                }
                42..=79 => {
                    // a verbs registration: mostly inside a mapping, sometimes anywhere
                    let (addr, len) = match (maps.is_empty(), rnd(5)) {
                        (false, 0..=3) => {
                            let (&slot, &(mlen, _, _)) = maps.iter().nth(rnd(maps.len() as u64) as usize).unwrap();
                            let a = slot + (rnd(mlen >> 12) << 12);
                            (a, (1 + rnd(64)) << 12)
                        }
                        _ => (BASE + rnd(64 * SLOT), 1 + rnd(1 << 22)),
                    };
                    let d = r.before_reg(&t, &mut rm, addr, len);
                    if let Decision::Hit { tuple, .. } = &d {
                        // exactly the model's mapping at that address, and the MR inside it
                        let (&slot, &(mlen, h, off)) = maps.range(..=addr).next_back().expect("a hit lies in a live mapping");
                        assert_eq!(
                            (tuple.address, tuple.size, tuple.mem.memory, tuple.offset),
                            (slot, mlen, h, off),
                            "step {step}: hit at {addr:#x}+{len:#x}"
                        );
                        assert!(addr >= slot && addr + len <= slot + mlen.div_ceil(0x10000) * 0x10000 + 0x10000, "step {step}");
                        hits += 1;
                        let mr = if rnd(10) == 0 { 0 } else { next_mr };
                        next_mr += 1;
                        r.after_reg(&mut rm, &d, mr);
                        if mr != 0 {
                            mrs.push((mr, *tuple));
                        }
                    } else {
                        misses += 1;
                    }
                }
                80..=99 if !mrs.is_empty() => {
                    let (mr, _) = mrs.swap_remove(rnd(mrs.len() as u64) as usize);
                    r.after_dereg(&mut rm, mr);
                }
                _ => {}
            }
            // every registration RM holds is a live mapping of the model, exactly
            for reg in &rm.regs {
                let m = maps.get(&reg.address);
                assert_eq!(
                    m.map(|&(l, h, o)| (l, h, o)),
                    Some((reg.size, reg.mem.memory, reg.offset)),
                    "step {step}: RM holds {reg} but the model has {m:?} there"
                );
            }
            assert!(rm.regs.len() <= maps.len());
        }
        // drop every MR: nothing stays registered
        for (mr, _) in mrs.drain(..) {
            r.after_dereg(&mut rm, mr);
        }
        assert!(rm.regs.is_empty(), "{:?}", rm.regs);
        assert_eq!(r.live_registrations(), 0);
        assert_eq!(r.counts.registered, r.counts.unregistered);
        assert!(hits > ops / 10 && misses > 0 && frees > 0 && unmaps > 0, "hits={hits} misses={misses} frees={frees} unmaps={unmaps}");
        eprintln!(
            "model: {ops} operations, {hits} hits, {misses} misses, {unmaps} unmaps, {frees} frees, {} registered, rm_errors={}",
            r.counts.registered, r.counts.rm_errors
        );
    }
}
