//! NV503C route: make sure the RM memory behind a verbs registration of GPU memory is registered
//! with NV50_THIRD_PARTY_P2P exactly as libcuda does it on datacenter GPUs, and undo it when the
//! last MR goes or the memory/VA goes away. Its only reader is nvidia-peermem.
//!
//! Where the 503C lives: in the CUDA client, under the subdevice of the memory's device, with an
//! RM-generated handle, issued on the client's own /dev/nvidiactl fd. Reasons (fact sheet S3):
//! REGISTER_VIDMEM accepts only memory of the 503C's own client, so the CUDA client needs no DUP;
//! RM itself unregisters a vidmem object from every 503C of its client when the object is freed,
//! so a free we fail to see can never leave a registration pointing at recycled memory; a DUP
//! into a client of ours would instead keep the memory alive and registered after CUDA freed it.
#![forbid(unsafe_code)]

use super::miss::RegMiss;
use super::types::{shrink_when_sparse, Client, Decision, RegCounts, Rm, StillInUse};
use crate::abi::p2p;
use crate::abi::status::{self, Call};
use crate::decode::Pending;
use crate::fresh::Fresh;
use crate::route::Route;
use crate::tracker::{ObjKind, Tracker, VidmemTuple};
use crate::vamap::touch;
use crate::vamap::{granule, MemRef, Miss, Piece};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GpuReg {
    p2p: u32,
    subdevice: u32,
    vaspace: u32,
    token: u64,
    ctl_fd: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reg {
    tuple: VidmemTuple,
    p2p: u32,
    ctl_fd: i32,
    refs: u32,
    /// Distinguishes a registration from a later one of the same memory, so that an MR left over
    /// from before an unmap can never release its successor.
    id: u64,
}

/// The route's state: our 503C per GPU and the registrations on them, by memory and by address
/// (a release finds only the registrations it touches).
#[derive(Default)]
pub struct Nv503c {
    gpus: HashMap<(u32, u32), GpuReg>, // (client, device)
    regs: HashMap<MemRef, Reg>,
    /// The registrations that touch each 2 MiB granule of VA (they never overlap: each is a
    /// whole UVM mapping, and a mapping over registered VA takes the registration down first,
    /// unless that call got no decision, its locks not free in time). A release reads the
    /// granules it spans, however many registrations live elsewhere (issue 48); one of VA that no
    /// registration touches (nearly every free) finds every granule absent.
    at_granule: HashMap<u64, SmallVec<[MemRef; 1]>>,
    /// Registrations too wide to list per granule ([`granule::MAX_SPAN`]; each is 128 GiB or
    /// more of VA, so there are few): every release asks each of them.
    wide: Vec<MemRef>,
}

const G: u64 = p2p::GRANULE;
/// The start of the granule holding `x`.
fn granule_floor(x: u64) -> u64 {
    x & !(G - 1)
}
/// The first granule boundary at or after `x`.
fn granule_ceil(x: u64) -> Option<u64> {
    x.checked_add(G - 1).map(granule_floor)
}

/// The registrar's books a decision writes in.
pub struct Book<'a> {
    pub counts: &'a mut RegCounts,
    pub next_id: &'a mut u64,
}

impl Nv503c {
    pub fn live(&self) -> usize {
        self.regs.len()
    }
    pub fn p2p_objects(&self) -> usize {
        self.gpus.len()
    }

    /// The registration for a verbs registration of `[addr, addr+len)`, made if needed; `book`
    /// gets the counts and hands out registration ids.
    pub fn decide(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        (addr, len, whole): (u64, u64, Option<Piece>),
        dry_run: bool,
        book: Book<'_>,
    ) -> Decision {
        let Book { counts, next_id } = book;
        // `whole`: the map's `lookup_one` of the range, already made by the caller
        let piece = match whole.map_or_else(|| t.map.lookup_single(addr, len), Ok) {
            Ok(p) => p,
            Err(m) => return Decision::Miss(RegMiss::Lookup(m)),
        };
        match piece.alloc.class() {
            Some(crate::abi::class::NV01_MEMORY_LOCAL_USER) => {}
            Some(class) if crate::abi::class::is_sysmem(class) => return Decision::Host,
            Some(class) => return Decision::Miss(RegMiss::NotVidmem { class }),
            None => return Decision::Miss(RegMiss::NoDevice),
        }
        let tuple = Tracker::predict(&piece);
        if !tuple.address.is_multiple_of(G)
            || !tuple.size.is_multiple_of(G)
            || !tuple.offset.is_multiple_of(G)
            || tuple.size == 0
        {
            return Decision::Miss(RegMiss::Unaligned(tuple));
        }
        // peermem rounds the MR out to 64 KiB: the whole rounded range must sit in this one
        // registration, which is this one UVM mapping.
        let end = match addr.checked_add(len).and_then(granule_ceil) {
            Some(e) => e,
            None => return Decision::Miss(RegMiss::Lookup(Miss::Overflow)),
        };
        let map_end = tuple.address + tuple.size;
        if granule_floor(addr) < tuple.address || end > map_end {
            return Decision::Miss(RegMiss::SpansMappings { mapping_end: map_end });
        }
        // The registration describes the whole mapping: all of it must still be this memory, at
        // these offsets, on every GPU that maps it.
        match t.map.lookup_single(tuple.address, tuple.size) {
            Ok(p) if p.mem == piece.mem && p.offset == tuple.offset => {}
            _ => return Decision::Miss(RegMiss::MappingNotWhole { tuple }),
        }
        let offset = piece.offset;
        touch::add(touch::HASH_PROBE);
        if let Some(r) = self.regs.get_mut(&piece.mem) {
            if r.tuple != tuple {
                return Decision::Miss(RegMiss::OtherAddress { registered: r.tuple });
            }
            r.refs += 1;
            return Decision::Hit { mem: piece.mem, offset, tuple, fresh: false, id: r.id };
        }
        if dry_run {
            return Decision::Hit { mem: piece.mem, offset, tuple, fresh: true, id: 0 };
        }
        let Some((h_device, _)) = t.piece_device(&piece) else {
            return Decision::Miss(RegMiss::NoDevice);
        };
        let client = piece.mem.client;
        let Some(ctl_fd) = t.client_fd(client) else {
            return Decision::Miss(RegMiss::UnknownClient { client });
        };
        let c = Client { handle: client, ctl_fd };
        let g = match self.gpus.get(&(client, h_device)) {
            Some(g) => *g,
            None => {
                let Some(subdevice) = t.subdevice_of(client, h_device) else {
                    return Decision::Miss(RegMiss::NoSubdevice);
                };
                let Some(vaspace) = t.uvm_vaspace_of(client, h_device) else {
                    return Decision::Miss(RegMiss::NoVaSpace);
                };
                let p2p = match rm.alloc_p2p(c, subdevice) {
                    Ok(h) => h,
                    Err(st) => {
                        return Decision::Miss(RegMiss::Rm { call: Call::P2pAlloc, status: st })
                    }
                };
                let token = match rm.register_va_space(c, p2p, vaspace) {
                    Ok(tk) => tk,
                    Err(st) => {
                        // Never leave a half-made object behind.
                        let _ = rm.free(c, subdevice, p2p);
                        return Decision::Miss(RegMiss::Rm {
                            call: Call::RegisterVaSpace,
                            status: st,
                        });
                    }
                };
                let g = GpuReg { p2p, subdevice, vaspace, token, ctl_fd };
                self.gpus.insert((client, h_device), g);
                counts.p2p_objects += 1;
                g
            }
        };
        if let Err(st) = rm.register_vidmem(c, g.p2p, &tuple) {
            return Decision::Miss(RegMiss::Rm { call: Call::RegisterVidmem, status: st });
        }
        counts.registered += 1;
        *next_id += 1;
        let id = *next_id;
        self.insert(Reg { tuple, p2p: g.p2p, ctl_fd, refs: 1, id });
        Decision::Hit { mem: piece.mem, offset, tuple, fresh: true, id }
    }

    fn insert(&mut self, r: Reg) {
        touch::add(touch::HASH_PROBE);
        let span = granule::touched(r.tuple.address, r.tuple.size);
        if granule::kept(&span) {
            for g in span {
                touch::add(touch::HASH_PROBE);
                self.at_granule.entry(g).or_default().push(r.tuple.mem);
            }
        } else {
            self.wide.push(r.tuple.mem);
        }
        self.regs.insert(r.tuple.mem, r);
    }

    fn remove(&mut self, mem: MemRef) -> Option<Reg> {
        touch::add(touch::HASH_PROBE);
        let r = self.regs.remove(&mem)?;
        shrink_when_sparse(&mut self.regs);
        let span = granule::touched(r.tuple.address, r.tuple.size);
        if granule::kept(&span) {
            for g in span {
                touch::add(touch::HASH_PROBE);
                if let Some(here) = self.at_granule.get_mut(&g) {
                    here.retain(|m| *m != mem);
                    if here.is_empty() {
                        self.at_granule.remove(&g);
                    }
                }
            }
            shrink_when_sparse(&mut self.at_granule);
        } else {
            self.wide.retain(|m| *m != mem);
        }
        Some(r)
    }

    /// One MR's reference on the registration `id` of `mem` goes.
    pub fn release(&mut self, rm: &mut dyn Rm, mem: MemRef, id: u64, counts: &mut RegCounts) {
        touch::add(touch::HASH_PROBE);
        let Some(r) = self.regs.get_mut(&mem).filter(|r| r.id == id) else { return };
        r.refs = r.refs.saturating_sub(1);
        if r.refs == 0 {
            let r = self.remove(mem).expect("present");
            Self::unregister(rm, &r, counts);
        }
    }

    fn unregister(rm: &mut dyn Rm, r: &Reg, counts: &mut RegCounts) {
        let c = Client { handle: r.tuple.mem.client, ctl_fd: r.ctl_fd };
        match rm.unregister_vidmem(c, r.p2p, r.tuple.mem.memory) {
            Ok(()) => counts.unregistered += 1,
            Err(st) => {
                counts.rm_errors += 1;
                rm.refused(
                    "unregister refused",
                    format!(
                        "UNREGISTER_VIDMEM hMemory={:#010x} refused: {st:#x} {} ({})",
                        r.tuple.mem.memory,
                        status::name(st),
                        status::cause(Call::UnregisterVidmem, st)
                    ),
                );
            }
        }
    }

    /// Takes the registrations of `mems` down, whatever MRs still reference them (those keep a
    /// dangling entry, released as a no-op at dereg); MRs still using one are reported.
    fn take_down(
        &mut self,
        rm: &mut dyn Rm,
        mems: Vec<MemRef>,
        counts: &mut RegCounts,
        in_use: &mut Vec<StillInUse>,
    ) -> Vec<VidmemTuple> {
        let mut out = Vec::new();
        for m in mems {
            let Some(r) = self.remove(m) else { continue };
            Self::unregister(rm, &r, counts);
            if r.refs > 0 {
                in_use.push(StillInUse {
                    route: Route::Nv503c,
                    what: r.tuple.to_string(),
                    mrs: r.refs,
                });
            }
            out.push(r.tuple);
        }
        out
    }

    /// The registrations overlapping `[base, end)`: the one starting before `base` that reaches
    /// into it, and those starting inside (they never overlap each other).
    /// Whether a release that touches only what was created since the last registration
    /// (`fresh`) could still touch one of ours by what this route alone knows: a registration
    /// over its VA (one a release that got no decision left behind), one keyed by the object
    /// it frees, or one of our 503C objects under it.
    pub fn may_touch(&self, call: &Pending, fresh: Fresh) -> bool {
        if self.regs.is_empty() && self.gpus.is_empty() {
            return false;
        }
        match (*call, fresh) {
            (_, Fresh::Va { start, end }) => !self.overlapping(start, end).is_empty(),
            (Pending::RmFree { h_client, h_object }, Fresh::Object) => {
                self.regs.contains_key(&MemRef { client: h_client, memory: h_object })
                    || (h_client == h_object && self.regs.keys().any(|m| m.client == h_client))
                    || !self.p2p_freed_with(h_client, h_object).is_empty()
            }
            _ => true,
        }
    }

    fn overlapping(&self, base: u64, end: u64) -> Vec<MemRef> {
        // (an empty range still asks for the registration around base, on the safe side)
        let touches = |r: &Reg| {
            let (a, e) = (r.tuple.address, r.tuple.address.saturating_add(r.tuple.size));
            (a < base && e > base) || (base <= a && a < end)
        };
        let mut hit: Vec<(u64, MemRef)> = Vec::new();
        let mut take = |m: &MemRef| {
            if let Some(r) = self.regs.get(m).filter(|r| touches(r)) {
                hit.push((r.tuple.address, *m));
            }
        };
        // the granules it spans, or the registrations where they are fewer: a release reads
        // no more than the smaller of its own size and the registrations that live
        let span = granule::touched(base, end.saturating_sub(base));
        if span.end() - span.start() < self.regs.len() as u64 {
            for g in span {
                touch::add(touch::HASH_PROBE);
                self.at_granule.get(&g).into_iter().flatten().for_each(&mut take);
            }
            self.wide.iter().for_each(&mut take);
        } else {
            touch::add(self.regs.len() as u64);
            self.regs.keys().for_each(take);
        }
        // in address order, each once
        hit.sort_unstable();
        hit.dedup();
        hit.into_iter().map(|(_, m)| m).collect()
    }

    /// Before the driver runs a call that releases or replaces memory or VA: unregister every
    /// registration that would otherwise describe memory that is no longer at its address.
    pub fn before_driver_call(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        call: Pending,
        counts: &mut RegCounts,
        in_use: &mut Vec<StillInUse>,
    ) -> Vec<VidmemTuple> {
        if self.regs.is_empty() && self.gpus.is_empty() {
            return Vec::new();
        }
        match call {
            Pending::UvmFree { base } => {
                let end = base.saturating_add(t.uvm_free_extent(base, None));
                let hit = self.overlapping(base, end);
                self.take_down(rm, hit, counts, in_use)
            }
            // Registrations are per memory, not per GPU: an unmap on any GPU drops them (safe side).
            Pending::UvmUnmap { base, length } => {
                let hit = self.overlapping(base, base.saturating_add(length));
                self.take_down(rm, hit, counts, in_use)
            }
            Pending::UvmMap { base, length, offset, h_client, h_memory } => {
                // UVM first unmaps what the new mapping overlaps. A registration survives only
                // where the new mapping says the same thing: same memory at the same offsets
                // (cuMemSetAccess maps a range again exactly so).
                let mem = MemRef { client: h_client, memory: h_memory };
                let same = |x: &VidmemTuple| {
                    x.mem == mem
                        && (x.offset as i128 - x.address as i128) == (offset as i128 - base as i128)
                };
                let hit: Vec<MemRef> = self
                    .overlapping(base, base.saturating_add(length))
                    .into_iter()
                    .filter(|m| !same(&self.regs[m].tuple))
                    .collect();
                self.take_down(rm, hit, counts, in_use)
            }
            Pending::RmFree { h_client, h_object } => {
                match t.object(h_client, h_object).map(|o| o.kind) {
                    Some(ObjKind::Memory { .. }) => {
                        let m = MemRef { client: h_client, memory: h_object };
                        let hit = if self.regs.contains_key(&m) { vec![m] } else { Vec::new() };
                        self.take_down(rm, hit, counts, in_use)
                    }
                    Some(ObjKind::Client { .. }) => {
                        let hit: Vec<MemRef> =
                            self.regs.keys().filter(|m| m.client == h_client).copied().collect();
                        self.take_down(rm, hit, counts, in_use)
                    }
                    Some(_) => {
                        // A device, subdevice or VA space: RM frees our 503C with it (a child of the
                        // subdevice, dependent on the VA space). Take it down first, cleanly.
                        let mut out = Vec::new();
                        for (key, g) in self.p2p_freed_with(h_client, h_object) {
                            let hit: Vec<MemRef> = self
                                .regs
                                .iter()
                                .filter(|(m, r)| m.client == h_client && r.p2p == g.p2p)
                                .map(|(m, _)| *m)
                                .collect();
                            out.extend(self.take_down(rm, hit, counts, in_use));
                            self.gpus.remove(&key);
                            let c = Client { handle: h_client, ctl_fd: g.ctl_fd };
                            if let Err(st) = rm.free(c, g.subdevice, g.p2p) {
                                rm.refused(
                                    "free refused",
                                    format!(
                                        "freeing gdrshim's NV503C {:#010x} refused: {st:#x} {}",
                                        g.p2p,
                                        status::name(st)
                                    ),
                                );
                            }
                        }
                        out
                    }
                    None => Vec::new(),
                }
            }
        }
    }

    /// RM freed `h` in `client` (a free that succeeded): if it was the device, subdevice or VA
    /// space of one of our 503C objects, RM freed that 503C with it (child of the subdevice,
    /// dependent on the VA space) and every registration on it.
    pub fn forget_freed(&mut self, client: u32, h: u32) {
        for (key, g) in self.p2p_freed_with(client, h) {
            let gone: Vec<MemRef> = self
                .regs
                .iter()
                .filter(|(m, r)| m.client == client && r.p2p == g.p2p)
                .map(|(m, _)| *m)
                .collect();
            for m in gone {
                self.remove(m);
            }
            self.gpus.remove(&key);
        }
    }

    /// Our 503C objects that RM frees together with `h` of `client`: those whose device,
    /// subdevice or VA space `h` is.
    fn p2p_freed_with(&self, client: u32, h: u32) -> Vec<((u32, u32), GpuReg)> {
        self.gpus
            .iter()
            .filter(|((c, dev), g)| {
                *c == client && (*dev == h || g.subdevice == h || g.vaspace == h)
            })
            .map(|(k, g)| (*k, *g))
            .collect()
    }

    /// A client went away: RM freed its 503C objects and their registrations itself.
    pub fn forget_client(&mut self, client: u32) {
        let gone: Vec<MemRef> = self.regs.keys().filter(|m| m.client == client).copied().collect();
        for m in gone {
            self.remove(m);
        }
        self.gpus.retain(|(c, _), _| *c != client);
    }
}
