//! DMA-BUF route: the exact pieces of a range exported as one dma-buf through the GPU's own
//! /dev/nvidiaN, for `ibv_reg_dmabuf_mr` (the hook) or for CUDA's callers. RM keeps its own
//! reference on the memory until the buffer is released, so there is no RM state of ours to undo;
//! what is kept is which memory live MRs use, to say so when that memory is freed.
//!
//! One buffer per piece set ([`Shared`]): every verbs MR over the same pieces of the same
//! allocations uses one export, kept open by gdrshim while MRs use it and closed with the last.
//! An export costs an RM call and, without static BAR1, BAR1 space per buffer (RM maps a buffer's
//! pieces once for all its importers: nv-dmabuf.c `nv_dma_buf_get_phys_addresses`, per-handle
//! `phys_refcount`, 595.45.04 lines 616 and 654), so N MRs over one buffer cost one. The buffer
//! is found by the exact pieces and which allocation of each handle they are (`Plan::serials`):
//! memory freed and allocated again under the same handle is never served by an old buffer, and
//! a buffer is forgotten as soon as a driver call releases or maps over its memory. The hook
//! is handed the kept fd itself (the kernel's `ib_umem_dmabuf` takes its own reference to the
//! buffer) and closes nothing of it; the kept fd is closed only once no registration decided on
//! it is still in its verbs call, so its number cannot be reused under one. System calls per
//! registration (each several µs under gVisor): a new buffer, the export's ioctl and one `fstat`
//! (its identity, for reuse later); a reuse, one `fstat` (still that file: a program may close
//! fds it does not own, closefrom in a daemon). `cuMemGetHandleForAddressRange`'s fds are the
//! caller's and never kept.
#![forbid(unsafe_code)]

pub use crate::tracker::dmabuf::{Plan, PlanMiss, Span, HOST_PAGE};

use super::bar1::Budget;
use super::miss::RegMiss;
use super::types::{shrink_when_sparse, Client, Export, Rm, StillInUse};
use crate::abi::status::{self, Call};
use crate::decode::Pending;
use crate::fd::OwnedFd;
use crate::route::Route;
use crate::tracker::{ObjKind, Tracker};
use crate::vamap::MemRef;
use rustc_hash::FxHashMap as HashMap;

#[derive(Default)]
pub struct Dmabuf {
    /// RM's dma-buf capability per (client, device), asked once RM can answer.
    capable: HashMap<(u32, u32), bool>,
    /// Live dma-buf MRs per memory object they cover.
    users: HashMap<MemRef, u32>,
    /// The buffers verbs MRs use, by id, and the ids of those that may still be used again.
    shared: HashMap<u64, Shared>,
    by_pieces: HashMap<PieceSet, u64>,
    next_id: u64,
    /// Bytes of the buffers in `shared` (live and the most at once).
    pub exported_bytes: u64,
    pub exported_peak: u64,
    /// Each GPU's BAR1 and what our buffers take of it.
    pub budget: Budget,
}

/// What one buffer is: the GPU, the mapping type and, per piece, the memory handle, which
/// allocation of it, offset and size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PieceSet {
    client: u32,
    device_instance: u32,
    mapping_type: u8,
    pieces: Vec<(u32, u64, u64, u64)>,
}

impl PieceSet {
    fn of(plan: &Plan, mapping_type: u8) -> PieceSet {
        let pieces = plan
            .spans
            .iter()
            .zip(&plan.serials)
            .map(|(s, &serial)| (s.memory, serial, s.offset, s.size))
            .collect();
        PieceSet {
            client: plan.client,
            device_instance: plan.device_instance,
            mapping_type,
            pieces,
        }
    }
}

/// A buffer of ours that verbs MRs use.
struct Shared {
    /// Our fd of it; `None` once closed (its memory released, or the number found not to be it
    /// any more: the program closed it; the MRs still hold the buffer in the kernel).
    fd: Option<OwnedFd>,
    /// The GPU's RM device instance (whose BAR1 it takes without static BAR1).
    device_instance: u32,
    bytes: u64,
    mems: Vec<MemRef>,
    /// MRs registered over it, and registrations decided on it whose verbs call has not returned.
    mrs: u32,
    pending: u32,
    /// Where it is found for reuse (`None`: no longer reusable).
    key: Option<PieceSet>,
}

impl Dmabuf {
    fn capability(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        client: u32,
        device: u32,
    ) -> Result<bool, u32> {
        if let Some(&r) = self.capable.get(&(client, device)) {
            return Ok(r);
        }
        // only RM's answer is kept: a question asked before the device has its subdevice, or one
        // RM refused, is asked again next time
        let r = match (t.client_fd(client), t.subdevice_of(client, device)) {
            (Some(ctl_fd), Some(sub)) => {
                rm.gpu_dmabuf_capable(Client { handle: client, ctl_fd }, sub)
            }
            _ => Err(status::NV_ERR_INVALID_OBJECT_PARENT),
        };
        if let Ok(answer) = r {
            self.capable.insert((client, device), answer);
        }
        r
    }

    /// The capability of the first GPU of the program's own clients that RM answers for.
    pub fn probe_any(&mut self, t: &Tracker, rm: &mut dyn Rm) -> Option<bool> {
        let devices = t.devices();
        devices.into_iter().find_map(|(client, device)| self.capability(t, rm, client, device).ok())
    }

    /// A new buffer of `plan`'s pieces: its fd, ours, or why not.
    fn export_new(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        plan: &Plan,
        mapping_type: u8,
    ) -> Result<OwnedFd, RegMiss> {
        match self.capability(t, rm, plan.client, plan.device) {
            Ok(true) => {}
            Ok(false) => return Err(RegMiss::GpuNotCapable),
            Err(st) => return Err(RegMiss::Rm { call: Call::GpuQuery, status: st }),
        }
        let ctl_fd =
            t.client_fd(plan.client).ok_or(RegMiss::UnknownClient { client: plan.client })?;
        let c = Client { handle: plan.client, ctl_fd };
        let mut fd: Option<OwnedFd> = None;
        for k in 0..plan.calls() {
            let mut params = plan.call(k, fd.as_ref().map_or(-1, OwnedFd::num), mapping_type);
            let made = match rm.export_dmabuf(c, plan.device_instance, &mut params, fd.as_ref()) {
                Ok(made) => made,
                Err(st) => {
                    if let Some(f) = fd.take() {
                        rm.close_fd(f);
                    }
                    return Err(RegMiss::Rm { call: Call::DmabufExport, status: st });
                }
            };
            if let Some(new) = made {
                // (only the first call makes a buffer: another would be a second one of ours)
                if let Some(old) = fd.replace(new) {
                    rm.close_fd(old);
                }
            }
        }
        fd.ok_or(RegMiss::Rm { call: Call::DmabufExport, status: status::NV_ERR_GENERIC })
    }

    /// Exports `plan` (for `cuMemGetHandleForAddressRange` of a range starting at `addr`): the
    /// new buffer's fd is the caller's.
    pub fn export(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        plan: &Plan,
        addr: u64,
        mapping_type: u8,
    ) -> Result<Export, RegMiss> {
        let fd = self.export_new(t, rm, plan, mapping_type)?;
        let fd = rm.hand_out(fd);
        Ok(Export {
            fd,
            file: None,
            offset: addr - plan.base,
            pieces: plan.spans.len(),
            bytes: plan.total,
            mems: mems_of(plan),
            buf: None,
            reused: false,
        })
    }

    /// The buffer of `plan` for a verbs MR: the one MRs over the same pieces already use, else a
    /// new export kept for the next. The fd returned is the kept one, open at least until
    /// [`settle`](Self::settle) follows with the call's outcome.
    pub fn export_shared(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        plan: &Plan,
        addr: u64,
        mapping_type: u8,
    ) -> Result<Export, RegMiss> {
        let key = PieceSet::of(plan, mapping_type);
        if let Some(&id) = self.by_pieces.get(&key) {
            let sh = self.shared.get_mut(&id).expect("indexed buffers exist");
            if let Some(fd) = sh.fd.as_ref().filter(|fd| rm.still_ours(fd)) {
                let (fd, file) = (fd.num(), fd.file());
                sh.pending += 1;
                let (bytes, mems) = (sh.bytes, sh.mems.clone());
                return Ok(Export {
                    fd,
                    file: Some(file),
                    offset: addr - plan.base,
                    pieces: plan.spans.len(),
                    bytes,
                    mems,
                    buf: Some(id),
                    reused: true,
                });
            }
            // our fd is not that buffer any more (the program closed it): the number is never
            // closed or used by us again, and a new export follows
            if let Some(fd) = sh.fd.take() {
                rm.close_fd(fd);
            }
            self.unindex(id);
            self.drop_if_unused(rm, id);
        }
        let fd = self.export_new(t, rm, plan, mapping_type)?;
        let (num, file) = (fd.num(), fd.file());
        self.next_id += 1;
        let id = self.next_id;
        self.bar1_before(t, rm, plan, plan.total);
        let mems = mems_of(plan);
        let sh = Shared {
            fd: Some(fd),
            device_instance: plan.device_instance,
            bytes: plan.total,
            mems: mems.clone(),
            mrs: 0,
            pending: 1,
            key: Some(key.clone()),
        };
        self.budget.buffer_added(plan.device_instance, plan.total);
        self.shared.insert(id, sh);
        self.by_pieces.insert(key, id);
        self.exported_bytes += plan.total;
        self.exported_peak = self.exported_peak.max(self.exported_bytes);
        Ok(Export {
            fd: num,
            file: Some(file),
            offset: addr - plan.base,
            pieces: plan.spans.len(),
            bytes: plan.total,
            mems,
            buf: Some(id),
            reused: false,
        })
    }

    /// A new buffer of ours on `plan`'s GPU: its BAR1 asked the first time (here, not at start:
    /// a process that never exports asks nothing), and the warning when it would not fit.
    fn bar1_before(&mut self, t: &Tracker, rm: &mut dyn Rm, plan: &Plan, bytes: u64) {
        let dev = plan.device_instance;
        if !self.budget.known(dev) {
            let answer = match (t.client_fd(plan.client), t.subdevice_of(plan.client, plan.device))
            {
                (Some(ctl_fd), Some(sub)) => {
                    rm.bar1(Client { handle: plan.client, ctl_fd }, sub, dev)
                }
                _ => Default::default(),
            };
            self.budget.learn(dev, answer);
        }
        if let Some(line) = self.budget.before_new_buffer(dev, bytes) {
            rm.notice(line);
        }
    }

    /// The verbs call over buffer `id` returned: it made an MR (`registered`) or not.
    pub fn settle(&mut self, rm: &mut dyn Rm, id: u64, registered: bool) {
        if let Some(sh) = self.shared.get_mut(&id) {
            sh.pending = sh.pending.saturating_sub(1);
            if registered {
                sh.mrs += 1;
            }
            // a buffer no longer reusable whose fd waited for the calls in flight
            if sh.pending == 0 && sh.key.is_none() {
                if let Some(fd) = sh.fd.take() {
                    rm.close_fd(fd);
                }
            }
            self.drop_if_unused(rm, id);
        }
    }

    /// An MR over buffer `id` is gone.
    pub fn buffer_mr_gone(&mut self, rm: &mut dyn Rm, id: u64) {
        if let Some(sh) = self.shared.get_mut(&id) {
            sh.mrs = sh.mrs.saturating_sub(1);
            self.drop_if_unused(rm, id);
        }
    }

    /// Buffers alive (ours open or held by MRs), and how many of them are ours open.
    pub fn buffers(&self) -> (usize, usize) {
        (self.shared.len(), self.shared.values().filter(|s| s.fd.is_some()).count())
    }

    fn unindex(&mut self, id: u64) {
        if let Some(k) = self.shared.get_mut(&id).and_then(|s| s.key.take()) {
            self.by_pieces.remove(&k);
        }
    }

    fn drop_if_unused(&mut self, rm: &mut dyn Rm, id: u64) {
        let Some(sh) = self.shared.get(&id) else { return };
        if sh.mrs > 0 || sh.pending > 0 {
            return;
        }
        let sh = self.shared.remove(&id).expect("just seen");
        if let Some(k) = sh.key {
            self.by_pieces.remove(&k);
        }
        if let Some(fd) = sh.fd {
            rm.close_fd(fd);
        }
        self.exported_bytes -= sh.bytes;
        self.budget.buffer_gone(sh.device_instance, sh.bytes);
        shrink_when_sparse(&mut self.shared);
    }

    /// A driver call is about to release (or map over) memory: no buffer over it is used again,
    /// and our fds of them close, once no verbs call is using them (MRs keep the buffers in the
    /// kernel until they go).
    pub fn forget_released(&mut self, t: &Tracker, rm: &mut dyn Rm, call: &Pending) {
        if self.shared.is_empty() {
            return;
        }
        let gone = released(t, call, || {
            self.shared.values().flat_map(|s| s.mems.iter().copied()).collect()
        });
        if gone.is_empty() {
            return;
        }
        let hit: Vec<u64> = self
            .shared
            .iter()
            .filter(|(_, s)| s.mems.iter().any(|m| gone.contains(m)))
            .map(|(&id, _)| id)
            .collect();
        for id in hit {
            self.unindex(id);
            if let Some(sh) = self.shared.get_mut(&id) {
                // (a registration still in its verbs call uses the fd itself: closed at its settle)
                if sh.pending == 0 {
                    if let Some(fd) = sh.fd.take() {
                        rm.close_fd(fd);
                    }
                }
            }
            self.drop_if_unused(rm, id);
        }
    }

    pub fn mr_added(&mut self, mems: &[MemRef]) {
        for m in mems {
            *self.users.entry(*m).or_default() += 1;
        }
    }

    pub fn mr_gone(&mut self, mems: &[MemRef]) {
        for m in mems {
            if let Some(n) = self.users.get_mut(m) {
                *n -= 1;
                if *n == 0 {
                    self.users.remove(m);
                }
            }
        }
    }

    /// The memory a driver call is about to release (or map over) that dma-buf MRs still use:
    /// the NIC keeps that memory until the MRs go, as with libcuda's own dma-bufs.
    pub fn in_use_by(&self, t: &Tracker, call: &Pending) -> Vec<StillInUse> {
        if self.users.is_empty() {
            return Vec::new();
        }
        let mems = released(t, call, || self.users.keys().copied().collect());
        let mut out: Vec<StillInUse> = Vec::new();
        for m in mems {
            if let Some(&n) = self.users.get(&m) {
                let what = format!("{{hClient={:#010x} hMemory={:#010x}}}", m.client, m.memory);
                if !out.iter().any(|s| s.what == what) {
                    out.push(StillInUse { route: Route::Dmabuf, what, mrs: n });
                }
            }
        }
        out
    }
}

/// The memory objects of a plan's pieces, each once.
fn mems_of(plan: &Plan) -> Vec<MemRef> {
    let mut mems: Vec<MemRef> =
        plan.spans.iter().map(|s| MemRef { client: plan.client, memory: s.memory }).collect();
    mems.sort_unstable();
    mems.dedup();
    mems
}

/// The memory a driver call is about to release or map over (`candidates`: the memory objects
/// an RM free of a parent object is checked against).
fn released(t: &Tracker, call: &Pending, candidates: impl FnOnce() -> Vec<MemRef>) -> Vec<MemRef> {
    match *call {
        Pending::RmFree { h_client, h_object } => {
            match t.object(h_client, h_object).map(|o| o.kind) {
                Some(ObjKind::Memory { .. }) => vec![MemRef { client: h_client, memory: h_object }],
                // RM frees what lies under the object (a device's memory, a client's everything)
                Some(_) => candidates()
                    .into_iter()
                    .filter(|m| m.client == h_client && lies_under(t, *m, h_object))
                    .collect(),
                None => Vec::new(),
            }
        }
        Pending::UvmFree { base } => {
            t.map.memory_in(base, base.saturating_add(t.uvm_free_extent(base, None)))
        }
        Pending::UvmUnmap { base, length } => t.map.memory_in(base, base.saturating_add(length)),
        // mapping the same memory again (cuMemSetAccess) leaves the MRs describing what is there
        Pending::UvmMap { base, length, h_client, h_memory, .. } => {
            let same = MemRef { client: h_client, memory: h_memory };
            t.map
                .memory_in(base, base.saturating_add(length))
                .into_iter()
                .filter(|m| *m != same)
                .collect()
        }
    }
}

/// Whether `object` is among `mem`'s ancestors in the tracker's tree of RM objects.
fn lies_under(t: &Tracker, mem: MemRef, object: u32) -> bool {
    let mut h = mem.memory;
    // (RM's tree is a few levels deep: memory, device, client; the bound stops any loop)
    for _ in 0..8 {
        let Some(o) = t.object(mem.client, h) else { return false };
        if o.parent == object {
            return true;
        }
        if o.parent == h {
            return false; // the client, its own parent
        }
        h = o.parent;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::PieceSet;
    use crate::tracker::dmabuf::{Plan, Span};

    /// A buffer is shared only by MRs over the very same pieces of one client's memory: RM's
    /// handles are numbered per client, so the same handle, offset and size under another client
    /// (another RM client of the process: another context, a library's own) is other memory.
    #[test]
    fn a_buffer_is_never_shared_across_clients_mapping_types_or_allocations() {
        let plan = |client: u32, serial: u64| Plan {
            client,
            device: 0x5c00_0002,
            device_instance: 0,
            base: 0x7f00_0000_0000,
            spans: vec![Span { memory: 0xcaf0_0010, offset: 0, size: 0x20_0000 }],
            total: 0x20_0000,
            serials: vec![serial],
        };
        let key = PieceSet::of(&plan(0xc1d0_0001, 7), 0);
        assert_eq!(key, PieceSet::of(&plan(0xc1d0_0001, 7), 0), "the same pieces: one buffer");
        assert_ne!(
            key,
            PieceSet::of(&plan(0xc1d0_0002, 7), 0),
            "another client's handle of the same number"
        );
        assert_ne!(key, PieceSet::of(&plan(0xc1d0_0001, 8), 0), "the handle allocated again");
        assert_ne!(
            key,
            PieceSet::of(&plan(0xc1d0_0001, 7), 1),
            "another mapping type (forced PCIe)"
        );
    }
}
