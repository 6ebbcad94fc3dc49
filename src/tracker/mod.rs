//! Per-process model of the RM objects and UVM mappings that decoded events describe, the VA map
//! built from them, and the shadow oracle that compares gdrshim's predictions with libcuda's own
//! REGISTER_VIDMEM calls.
//!
//! Pure: no FFI, no locks, no I/O. The hooks feed it events and log what it reports.
#![forbid(unsafe_code)]

use crate::decode::{Event, P2pCtrl, Uuid};
use crate::vamap::{ContextTag, MemRef, Piece, VaMap};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

mod contexts;
pub mod dmabuf;
mod types;
pub use contexts::{ContextEnd, Contexts};
use types::NativeReg;
pub use types::{NativeAnswer, Notice, Obj, ObjKind, ShadowCounts, Verdict, VidmemTuple};

#[derive(Default)]
pub struct Tracker {
    objects: HashMap<(u32, u32), Obj>,
    children: HashMap<(u32, u32), HashSet<u32>>,
    pub map: VaMap,
    /// GPUs UVM knows, with the RM client that registered them.
    pub gpus: HashMap<Uuid, u32>,
    native_p2p: HashSet<(u32, u32)>,
    /// VA spaces registered with UVM (client, hVaSpace): the one libcuda also gives to 503C.
    uvm_vaspaces: HashSet<(u32, u32)>,
    native_regs: HashMap<MemRef, NativeReg>,
    pub native_seen: bool,
    pub counts: ShadowCounts,
    /// libcuda's dma-buf exports waiting for CUDA to hand out their fd (see `dmabuf`).
    native_exports: dmabuf::NativeExports,
    /// Duplicated memory handles (RM_DUP_OBJECT) → the memory they duplicate.
    dups: HashMap<(u32, u32), MemRef>,
    /// A call the driver accepted never reached the map (its queue's lock was not free in time):
    /// the map may hold what is gone, so nothing is registered or exported on it any more.
    pub incomplete: bool,
    /// The program's CUDA contexts: what a context's end ends.
    contexts: Contexts,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// An RM object of the process (memory objects live in the map's table, see `VaMap::memory`).
    pub fn object(&self, client: u32, h: u32) -> Option<Obj> {
        crate::vamap::touch::add(crate::vamap::touch::HASH_PROBE);
        if let Some(o) = self.objects.get(&(client, h)) {
            return Some(*o);
        }
        let m = self.map.memory(MemRef { client, memory: h })?;
        Some(Obj { parent: m.parent, kind: ObjKind::Memory { class: m.class } })
    }

    pub fn objects(&self) -> usize {
        self.objects.len() + self.map.memories()
    }

    /// The ctl fd on which a client was allocated.
    pub fn client_fd(&self, client: u32) -> Option<i32> {
        crate::vamap::touch::add(crate::vamap::touch::HASH_PROBE);
        match self.objects.get(&(client, client))?.kind {
            ObjKind::Client { fd } => Some(fd),
            _ => None,
        }
    }

    /// The Device handle and deviceId a memory object hangs under.
    pub fn memory_device(&self, mem: MemRef) -> Option<(u32, u32)> {
        self.device_under(mem.client, self.map.memory(mem)?.parent)
    }

    /// The Device handle and deviceId of a looked-up piece's memory (from the piece: no lookup
    /// of the memory table).
    pub fn piece_device(&self, p: &Piece) -> Option<(u32, u32)> {
        self.device_under(p.mem.client, p.alloc.parent()?)
    }

    fn device_under(&self, client: u32, parent: u32) -> Option<(u32, u32)> {
        crate::vamap::touch::add(crate::vamap::touch::HASH_PROBE);
        match self.objects.get(&(client, parent))?.kind {
            ObjKind::Device { device_id } => Some((parent, device_id)),
            _ => None,
        }
    }

    /// Every (client, device) of the clients this process allocated.
    pub fn devices(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .objects
            .iter()
            .filter(|(&(c, _), o)| {
                matches!(o.kind, ObjKind::Device { .. }) && self.client_fd(c).is_some()
            })
            .map(|(&(c, h), _)| (c, h))
            .collect();
        v.sort_unstable();
        v
    }

    /// The subdevice under a device (the parent a 503C object needs).
    pub fn subdevice_of(&self, client: u32, h_device: u32) -> Option<u32> {
        let kids = self.children.get(&(client, h_device))?;
        let mut subs = kids.iter().filter(|&&k| {
            matches!(self.objects.get(&(client, k)).map(|o| o.kind), Some(ObjKind::Subdevice))
        });
        let first = *subs.next()?;
        // SLI-style devices with several subdevices are not handled: refuse rather than guess.
        subs.next().is_none().then_some(first)
    }

    /// The VA space under `h_device` that the process registered with UVM.
    pub fn uvm_vaspace_of(&self, client: u32, h_device: u32) -> Option<u32> {
        let kids = self.children.get(&(client, h_device))?;
        let mut v = kids.iter().filter(|&&k| self.uvm_vaspaces.contains(&(client, k)));
        let first = *v.next()?;
        v.next().is_none().then_some(first)
    }

    /// Whether `addr` lies in a UVM external range or mapping gdrshim knows: GPU memory.
    pub fn is_gpu_va(&self, addr: u64) -> bool {
        self.map.is_gpu_va(addr)
    }

    /// The VA that UVM_FREE(base) releases: the external range created there, or else the run
    /// of mappings continuing from base.
    pub fn uvm_free_extent(&self, base: u64, length: Option<u64>) -> u64 {
        self.map.free_extent(base, length)
    }

    /// Whether any native 503C object is alive.
    pub fn native_p2p_present(&self) -> bool {
        !self.native_p2p.is_empty()
    }

    /// The memory a duplicated handle stands for (`None`: not a duplicate).
    pub fn dup_root(&self, mem: MemRef) -> Option<MemRef> {
        self.dups.get(&(mem.client, mem.memory)).copied()
    }

    pub fn memory_class(&self, mem: MemRef) -> Option<u32> {
        Some(self.map.memory(mem)?.class)
    }

    fn insert(&mut self, client: u32, h: u32, parent: u32, kind: ObjKind) {
        crate::vamap::touch::add(crate::vamap::touch::HASH_PROBE);
        // A handle reused without a free we saw: drop the stale object first.
        let mem = MemRef { client, memory: h };
        if self.objects.contains_key(&(client, h)) || self.map.memory(mem).is_some() {
            self.remove_tree(client, h);
        }
        // Memory, which comes and goes all the time, lives in the map's table (one table per
        // allocation) and is not listed under its parent: a parent's free finds it by a scan
        // (parents go rarely).
        if let ObjKind::Memory { class } = kind {
            self.map.add_memory(mem, parent, class);
            return;
        }
        self.objects.insert((client, h), Obj { parent, kind });
        if parent != h {
            self.children.entry((client, parent)).or_default().insert(h);
        }
    }

    fn remove_tree(&mut self, client: u32, h: u32) -> Vec<Notice> {
        let mut notes = Vec::new();
        // the usual case is a leaf (memory): no stack allocated for it
        let mut stack = Vec::new();
        let mut first = Some(h);
        while let Some(x) = first.take().or_else(|| stack.pop()) {
            let mem = MemRef { client, memory: x };
            let memory = self.map.memory(mem).is_some();
            // (also memory allocated before we saw it, known only by its mappings)
            if memory || self.map.knows(mem) {
                self.map.remove_memory(mem);
                if !self.dups.is_empty() {
                    self.dups.remove(&(client, x));
                }
                // RM unregisters freed vidmem from every 503C of the client by itself.
                notes.extend(self.drop_native(mem));
            }
            if memory {
                continue;
            }
            if let Some(kids) = self.children.remove(&(client, x)) {
                stack.extend(kids);
            }
            // the memory under it, which is not listed (see insert)
            stack.extend(self.map.memory_under(client, x).into_iter().map(|m| m.memory));
            let Some(o) = self.objects.remove(&(client, x)) else { continue };
            if o.parent != x {
                if let Some(sib) = self.children.get_mut(&(client, o.parent)) {
                    sib.remove(&x);
                }
            }
            match o.kind {
                ObjKind::VaSpace { .. } => {
                    self.uvm_vaspaces.remove(&(client, x));
                }
                ObjKind::P2p => {
                    self.native_p2p.remove(&(client, x));
                    let gone: Vec<MemRef> =
                        self.native_regs.keys().filter(|m| m.client == client).copied().collect();
                    for m in gone {
                        notes.extend(self.drop_native(m));
                    }
                }
                _ => {}
            }
        }
        notes
    }

    fn drop_native(&mut self, mem: MemRef) -> Option<Notice> {
        let r = self.native_regs.remove(&mem)?;
        if r.matched {
            None
        } else {
            self.counts.unpredicted += 1;
            Some(Notice::Unpredicted(r.tuple))
        }
    }

    /// Applies one decoded event.
    pub fn apply(&mut self, ev: &Event) -> Vec<Notice> {
        let mut notes = Vec::new();
        match *ev {
            Event::RootClient { fd, h_client } => {
                self.insert(h_client, h_client, h_client, ObjKind::Client { fd })
            }
            Event::Device { h_client, h_device, device_id } => {
                self.insert(h_client, h_device, h_client, ObjKind::Device { device_id })
            }
            Event::Subdevice { h_client, h_device, h_subdevice, .. } => {
                self.insert(h_client, h_subdevice, h_device, ObjKind::Subdevice)
            }
            Event::VaSpace { h_client, h_parent, h_vaspace, flags, .. } => {
                self.insert(h_client, h_vaspace, h_parent, ObjKind::VaSpace { flags })
            }
            Event::Memory { h_client, h_parent, h_memory, class, .. } => {
                self.insert(h_client, h_memory, h_parent, ObjKind::Memory { class })
            }
            Event::OtherObject { h_client, h_parent, h_object, class } => {
                self.insert(h_client, h_object, h_parent, ObjKind::Other { class })
            }
            Event::P2pAlloc { h_client, h_parent, h_object, .. } => {
                self.insert(h_client, h_object, h_parent, ObjKind::P2p);
                self.native_p2p.insert((h_client, h_object));
                if !self.native_seen {
                    self.native_seen = true;
                    notes.push(Notice::NativeRegistrationPresent);
                }
            }
            Event::P2pControl { h_client, ref ctrl, .. } => match *ctrl {
                P2pCtrl::RegisterVidmem { h_memory, address, size, offset } => {
                    let mem = MemRef { client: h_client, memory: h_memory };
                    self.counts.native += 1;
                    if !self.native_seen {
                        self.native_seen = true;
                        notes.push(Notice::NativeRegistrationPresent);
                    }
                    let tuple = VidmemTuple { mem, address, size, offset };
                    if let Some(old) =
                        self.native_regs.insert(mem, NativeReg { tuple, matched: false })
                    {
                        if !old.matched {
                            self.counts.unpredicted += 1;
                            notes.push(Notice::Unpredicted(old.tuple));
                        }
                    }
                }
                P2pCtrl::UnregisterVidmem { h_memory } => {
                    notes.extend(self.drop_native(MemRef { client: h_client, memory: h_memory }))
                }
                _ => {}
            },
            Event::Free { h_client, h_object, .. } => {
                if h_object == h_client {
                    // Freeing a client frees everything in it.
                    let all: Vec<u32> = self
                        .objects
                        .keys()
                        .filter(|(c, _)| *c == h_client)
                        .map(|&(_, h)| h)
                        .collect();
                    for h in all {
                        notes.extend(self.remove_tree(h_client, h));
                    }
                    for m in self.map.memory_of(h_client) {
                        notes.extend(self.drop_native(m));
                        if !self.dups.is_empty() {
                            self.dups.remove(&(m.client, m.memory));
                        }
                    }
                    self.map.remove_client(h_client);
                } else {
                    notes.extend(self.remove_tree(h_client, h_object));
                }
            }
            Event::Dup { h_client, h_parent, h_object, h_client_src, h_object_src } => {
                let src = MemRef { client: h_client_src, memory: h_object_src };
                match self.object(h_client_src, h_object_src).map(|o| o.kind) {
                    Some(ObjKind::Memory { class }) => {
                        let root = self.dup_root(src).unwrap_or(src);
                        self.insert(h_client, h_object, h_parent, ObjKind::Memory { class });
                        self.dups.insert((h_client, h_object), root);
                    }
                    _ => self.insert(h_client, h_object, h_parent, ObjKind::Other { class: 0 }),
                }
            }
            Event::Version(_) => {}
            Event::DmabufExport(ref e) => self.native_exports.record(e),
            Event::UvmRegisterGpu { uuid, h_client, .. } => {
                self.gpus.insert(uuid, h_client);
            }
            Event::UvmRegisterGpuVaSpace { h_client, h_vaspace, .. } => {
                self.uvm_vaspaces.insert((h_client, h_vaspace));
            }
            Event::UvmCreateExternalRange { base, length } => self.map.create_range(base, length),
            Event::UvmMapExternal {
                base, length, offset, ref gpus, h_client, h_memory, ..
            } => {
                let mem = MemRef { client: h_client, memory: h_memory };
                for g in gpus {
                    self.map.map(*g, base, length, mem, offset);
                }
            }
            Event::UvmUnmapExternal { base, length, gpu } => {
                self.map.unmap(gpu, base, length);
                // VA no GPU maps any more holds no allocation of the program: what CUDA maps
                // there next is the program's only once a CUDA call hands it out again
                let end = base.saturating_add(length);
                if self.map.memory_in(base, end).is_empty() {
                    self.map.forget_owned(base, end);
                }
            }
            Event::UvmFree { base, length } => {
                let extent = self.map.free_extent(base, length);
                self.map.forget_owned(base, base.saturating_add(extent));
                // UVM_FREE destroys the whole range that starts at base; the length field, where
                // the branch has one, must equal it. A range created before we saw it: every
                // mapping that starts at base or continues from it goes, so nothing stale can be
                // looked up.
                if !self.map.free_range(base, length) && length.is_none() {
                    notes.push(Notice::UnknownUvmFree { base });
                }
            }
        }
        notes
    }

    /// The program made CUDA context `ctx`: device `primary_of`'s primary context, or one it
    /// created.
    pub fn context_made(&mut self, ctx: u64, primary_of: Option<i32>) {
        self.contexts.made(ctx, primary_of);
    }

    /// A CUDA context ended: the allocations CUDA freed with it are the program's no longer
    /// (those of an unknown context with any end on their GPU: `VaMap::end_owned`).
    pub fn context_ended(&mut self, end: ContextEnd) {
        let unknown_on = match end {
            ContextEnd::Destroyed { .. } => None,
            ContextEnd::Primary { gpu, .. } => gpu,
        };
        let contexts = &self.contexts;
        self.map.end_owned(&|ctx| contexts.ends(end, ctx), unknown_on);
        self.contexts.ended(end);
    }

    /// The dma-buf of `[addr, addr+len)` (see [`dmabuf::plan`]).
    pub fn dmabuf_plan(&self, addr: u64, len: u64) -> Result<dmabuf::Plan, dmabuf::PlanMiss> {
        dmabuf::plan(&self.map, self, addr, len)
    }

    /// CUDA handed out dma-buf `fd` for `[ptr, ptr+size)`: compare libcuda's export with the plan.
    pub fn dmabuf_request(&mut self, ptr: u64, size: u64, fd: i32) -> Option<Notice> {
        let native = self.native_exports.take(fd)?;
        self.counts.dmabuf_native += 1;
        let plan = self.dmabuf_plan(ptr, size);
        let equal = plan.as_ref().is_ok_and(|p| native.equals(p));
        if equal {
            self.counts.dmabuf_matched += 1;
            return None;
        }
        self.counts.dmabuf_mismatched += 1;
        let predicted = match plan {
            Ok(p) => format!("{:?} total {:#x}", p.spans, p.total),
            Err(m) => format!("nothing ({m})"),
        };
        Some(Notice::DmabufMismatch { ptr, size, native: native.describe(), predicted })
    }

    /// Predicted REGISTER_VIDMEM for a piece: libcuda registers the whole UVM mapping it made.
    pub fn predict(piece: &Piece) -> VidmemTuple {
        VidmemTuple {
            mem: piece.mem,
            address: piece.origin.base,
            size: piece.origin.length,
            offset: piece.origin.offset,
        }
    }

    /// A user allocation `[ptr, ptr+len)` returned by a CUDA entry point: check its coverage and
    /// compare the predicted registrations with libcuda's own.
    pub fn user_allocation(&mut self, ptr: u64, len: u64) -> Verdict {
        self.user_allocation_in(ptr, len, ContextTag::Unknown)
    }

    /// [`user_allocation`](Self::user_allocation), made in context `tag`.
    pub fn user_allocation_in(&mut self, ptr: u64, len: u64, tag: ContextTag) -> Verdict {
        self.counts.user_allocs += 1;
        self.map.own_in(ptr, len, tag);
        let pieces = match self.map.lookup(ptr, len) {
            Ok(p) => p,
            Err(miss) => {
                self.counts.uncovered += 1;
                return Verdict::Uncovered(miss);
            }
        };
        Verdict::Covered(pieces.iter().map(|p| self.judge(p)).collect())
    }

    /// The same counts as [`user_allocation`](Self::user_allocation), and its verdict only when it
    /// is worth a warning (uncovered, or a mismatch): the usual allocation — one mapping,
    /// matched — allocates nothing (this runs on every allocation of the process).
    pub fn user_allocation_quiet(
        &mut self,
        ptr: u64,
        len: u64,
        tag: ContextTag,
    ) -> Option<Verdict> {
        let Some(p) = self.map.lookup_one(ptr, len) else {
            // (user_allocation_in records it)
            let v = self.user_allocation_in(ptr, len, tag);
            let worth = match &v {
                Verdict::Uncovered(_) => true,
                Verdict::Covered(p) => {
                    p.iter().any(|(_, a)| matches!(a, NativeAnswer::Mismatched(_)))
                }
            };
            return worth.then_some(v);
        };
        self.counts.user_allocs += 1;
        self.map.own_in(ptr, len, tag);
        match self.judge(&p) {
            (want, a @ NativeAnswer::Mismatched(_)) => Some(Verdict::Covered(vec![(want, a)])),
            _ => None,
        }
    }

    /// One piece's prediction against libcuda's registration of that memory, counted.
    fn judge(&mut self, p: &Piece) -> (VidmemTuple, NativeAnswer) {
        let want = Self::predict(p);
        let answer = match self.native_regs.get_mut(&p.mem) {
            Some(r) if r.tuple == want => {
                if !r.matched {
                    r.matched = true;
                    self.counts.matched += 1;
                }
                NativeAnswer::Matched
            }
            Some(r) => {
                self.counts.mismatched += 1;
                NativeAnswer::Mismatched(r.tuple)
            }
            None => {
                self.counts.predicted_only += 1;
                NativeAnswer::None
            }
        };
        (want, answer)
    }

    /// Native registrations still live and never predicted, counted as unpredicted (at exit).
    pub fn finish(&mut self) -> Vec<VidmemTuple> {
        let left: Vec<VidmemTuple> =
            self.native_regs.values().filter(|r| !r.matched).map(|r| r.tuple).collect();
        self.counts.unpredicted += left.len() as u64;
        for r in self.native_regs.values_mut() {
            r.matched = true;
        }
        left
    }
}

#[cfg(test)]
pub(crate) mod tests;

impl dmabuf::PlanFacts for Tracker {
    fn piece_device(&self, p: &Piece) -> Option<(u32, u32)> {
        Tracker::piece_device(self, p)
    }
    fn own_client(&self, client: u32) -> bool {
        self.client_fd(client).is_some()
    }
}
