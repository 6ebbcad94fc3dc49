//! The registration paths: before a verbs registration of GPU memory is delegated, make the exact
//! RM memory behind it reachable for the NIC by the route this machine supports, and undo it when
//! the last MR goes or the memory goes away.
//!
//! - NV503C ([`nv503c`]): register the memory with NV50_THIRD_PARTY_P2P exactly as libcuda does on
//!   datacenter GPUs; the verbs call is then delegated unchanged, and nvidia-peermem resolves it.
//! - DMA-BUF ([`dmabuf`]): export the exact pieces as one dma-buf; the hook registers it with
//!   `ibv_reg_dmabuf_mr` in place of the call that could only fail.
//!
//! Both rest on the same exact map and stand aside where libcuda registers natively. Pure logic
//! behind the [`Rm`] trait: real ioctls in production (`rm.rs`), fakes in the tests.
#![forbid(unsafe_code)]

pub mod bar1;
pub mod dmabuf;
mod miss;
pub mod nv503c;
mod outcome;

pub use miss::RegMiss;
pub use outcome::{DeregStart, Outcome};
mod types;
use types::shrink_when_sparse;
pub use types::{Client, Decision, Export, HeldRef, RegCounts, Rm, StillInUse, VerbsReg};
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_dmabuf;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_owned;
#[cfg(test)]
mod tests_shared;

use crate::decode::Pending;
use crate::fresh::Fresh;
use crate::route::Route;
use crate::tracker::{Tracker, VidmemTuple};
use rustc_hash::FxHashMap as HashMap;

#[derive(Default)]
pub struct Registrar {
    nv: nv503c::Nv503c,
    dmabuf: dmabuf::Dmabuf,
    /// Live MRs (by the provider's `ibv_mr*`) and what they hold.
    mrs: HashMap<u64, HeldRef>,
    next_id: u64,
    pub counts: RegCounts,
    /// Only compute and log decisions (shadow mode), never call RM.
    pub dry_run: bool,
    /// The route registrations take; `Err` says why there is none.
    route: Option<Result<Route, String>>,
    /// Live MRs on dma-bufs of ours.
    dmabuf_live: usize,
    /// Bytes of their buffers, one count per MR (live and the most at once).
    registered_bytes: u64,
    registered_peak: u64,
    /// References of MRs whose deregistration began by a queued outcome, by its ticket.
    dereg_in_flight: HashMap<u64, HeldRef>,
}

impl Registrar {
    /// A registrar on the NV503C route.
    pub fn new(dry_run: bool) -> Self {
        Self::with_route(dry_run, Ok(Route::Nv503c))
    }

    pub fn with_route(dry_run: bool, route: Result<Route, String>) -> Self {
        Registrar { dry_run, route: Some(route), ..Default::default() }
    }

    /// A registrar whose route is decided later ([`set_route`](Self::set_route)).
    pub fn undecided(dry_run: bool) -> Self {
        Registrar { dry_run, ..Default::default() }
    }

    pub fn route(&self) -> Option<&Result<Route, String>> {
        self.route.as_ref()
    }

    pub fn set_route(&mut self, r: Result<Route, String>) {
        self.route = Some(r);
    }

    pub fn live_registrations(&self) -> usize {
        self.nv.live()
    }
    /// Whether `mr` holds a registration reference.
    pub fn holds_mr(&self, mr: u64) -> bool {
        self.mrs.contains_key(&mr)
    }
    pub fn live_mrs(&self) -> usize {
        self.mrs.len()
    }
    pub fn p2p_objects(&self) -> usize {
        self.nv.p2p_objects()
    }
    /// Live MRs on a dma-buf of ours.
    pub fn dmabuf_mrs(&self) -> usize {
        self.dmabuf_live
    }
    /// Whether anything a release must care about is live: NV503C registrations or dma-buf MRs.
    pub fn in_use(&self) -> bool {
        self.nv.live() > 0 || self.dmabuf_live > 0
    }

    /// RM's dma-buf capability of the first GPU the program's own clients hold a subdevice of
    /// (`None`: no GPU yet, or RM could not be asked), cached per device.
    pub fn probe_gpu_dmabuf(&mut self, t: &Tracker, rm: &mut dyn Rm) -> Option<bool> {
        self.dmabuf.probe_any(t, rm)
    }

    /// Before delegating a verbs registration of `[addr, addr+len)` (NV503C route, no flags).
    pub fn before_reg(&mut self, t: &Tracker, rm: &mut dyn Rm, addr: u64, len: u64) -> Decision {
        self.before_verbs(t, rm, VerbsReg { addr, len, access: 0, rereg: false })
    }

    /// Before a verbs registration: what to do, with every RM call it needs made.
    pub fn before_verbs(&mut self, t: &Tracker, rm: &mut dyn Rm, r: VerbsReg) -> Decision {
        let d = match self.decide(t, rm, r) {
            Decision::Miss(m)
                if !self.dry_run && !matches!(m, RegMiss::NoRoute(_)) && t.is_gpu_va(r.addr) =>
            {
                Decision::Refuse(m)
            }
            d => d,
        };
        match &d {
            Decision::Host => self.counts.host += 1,
            Decision::Odp => self.counts.odp += 1,
            Decision::StandAside => self.counts.stood_aside += 1,
            Decision::Hit { .. } | Decision::Exported(_) | Decision::WouldExport { .. } => {
                self.counts.pass0_hits += 1
            }
            Decision::Miss(m) | Decision::Refuse(m) => {
                self.counts.pass0_misses += 1;
                if matches!(m, RegMiss::Rm { .. }) {
                    self.counts.rm_errors += 1;
                }
            }
        }
        d
    }

    fn decide(&mut self, t: &Tracker, rm: &mut dyn Rm, r: VerbsReg) -> Decision {
        // Host memory first, with two tree lookups: most verbs registrations of a job are not GPU
        // memory, and they must cost next to nothing.
        if !t.is_gpu_va(r.addr) && !t.map.was_mapped(r.addr) {
            return Decision::Host;
        }
        if r.access & crate::abi::verbs::IBV_ACCESS_ON_DEMAND != 0 {
            return Decision::Odp;
        }
        if t.incomplete {
            return Decision::Miss(RegMiss::MapIncomplete);
        }
        // The common case in one read of the map: one entry, on the one GPU that maps any of the
        // range, covers all of it. The checks below then ask that entry instead of the map.
        let whole = t.map.lookup_one_owned(r.addr, r.len);
        // pinned host memory CUDA also mapped for the GPU (its own, cudaHostAlloc's,
        // cudaHostRegister's), whole or with plain host memory beside it: host memory to the NIC
        let sysmem = match &whole {
            Some((p, _)) => p.alloc.class().is_some_and(crate::abi::class::is_sysmem),
            None => t.map.only_sysmem_in(r.addr, r.addr.saturating_add(r.len)),
        };
        if sysmem {
            return Decision::Host;
        }
        if whole.is_none() {
            if let Err(m) = t.map.lookup(r.addr, r.len) {
                return Decision::Miss(RegMiss::Lookup(m));
            }
        }
        if t.native_p2p_present() || t.native_seen {
            return Decision::StandAside;
        }
        // (the lookup above took the range, so its end does not wrap)
        let unowned = match &whole {
            Some((_, true)) => None,
            _ => t.map.first_unowned(r.addr, r.addr + r.len),
        };
        if let Some(at) = unowned {
            return Decision::Miss(RegMiss::NotProgramMemory { at });
        }
        let whole = whole.map(|(p, _)| p);
        match self.route.clone() {
            Some(Ok(Route::Nv503c)) => {
                let next_id = &mut self.next_id;
                self.nv.decide(
                    t,
                    rm,
                    (r.addr, r.len, whole),
                    self.dry_run,
                    nv503c::Book { counts: &mut self.counts, next_id },
                )
            }
            Some(Ok(Route::Dmabuf)) if r.rereg => Decision::Miss(RegMiss::Rereg),
            Some(Ok(Route::Dmabuf)) => match self.export_as(
                t,
                rm,
                r.addr,
                r.len,
                crate::abi::dmabuf::MAPPING_DEFAULT,
                true,
            ) {
                Ok(Some(e)) => Decision::Exported(e),
                Ok(None) => {
                    let p = t.dmabuf_plan(r.addr, r.len).expect("planned once already");
                    Decision::WouldExport { pieces: p.spans.len(), bytes: p.total }
                }
                Err(m) => Decision::Miss(m),
            },
            Some(Err(why)) => Decision::Miss(RegMiss::NoRoute(why)),
            None => Decision::Miss(RegMiss::NoRoute("not decided yet".into())),
        }
    }

    /// The dma-buf of `[addr, addr+len)` (rounded out to host pages) for CUDA's callers
    /// (`cuMemGetHandleForAddressRange`): a new export whose fd is the caller's alone, never kept.
    /// `Ok(None)` in shadow mode.
    pub fn export(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        addr: u64,
        len: u64,
        mapping_type: u8,
    ) -> Result<Option<Export>, RegMiss> {
        self.export_as(t, rm, addr, len, mapping_type, false)
    }

    /// `shared`: for a verbs MR, over the buffer of the same pieces where one is kept
    /// (`dmabuf::Dmabuf::export_shared`).
    fn export_as(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        addr: u64,
        len: u64,
        mapping_type: u8,
        shared: bool,
    ) -> Result<Option<Export>, RegMiss> {
        if t.incomplete {
            return Err(RegMiss::MapIncomplete);
        }
        // the program's own memory first, as libcuda asks (a hole or a host page is not either)
        if let Some(at) = addr.checked_add(len).and_then(|end| t.map.first_unowned(addr, end)) {
            return Err(RegMiss::NotProgramMemory { at });
        }
        let plan = t.dmabuf_plan(addr, len).map_err(RegMiss::Export)?;
        if self.dry_run {
            return Ok(None);
        }
        let r = if shared {
            self.dmabuf.export_shared(t, rm, &plan, addr, mapping_type)
        } else {
            self.dmabuf.export(t, rm, &plan, addr, mapping_type)
        };
        let e = r.inspect_err(|m| {
            if matches!(m, RegMiss::Rm { .. }) {
                self.counts.rm_errors += 1;
            }
        })?;
        if e.reused {
            self.counts.dmabuf_reused += 1;
        } else {
            self.counts.dmabuf_exports += 1;
        }
        Ok(Some(e))
    }

    /// An [`Export`] for a verbs MR whose call made no MR (refused, or not made at all).
    pub fn dmabuf_not_used(&mut self, rm: &mut dyn Rm, e: &Export) {
        if let Some(id) = e.buf {
            self.dmabuf.settle(rm, id, false);
        }
    }

    /// Bytes of GPU memory in our dma-buf MRs and in our buffers under them: live, and the most
    /// at once (`(registered, registered_peak, exported, exported_peak)`).
    pub fn dmabuf_bytes(&self) -> (u64, u64, u64, u64) {
        (
            self.registered_bytes,
            self.registered_peak,
            self.dmabuf.exported_bytes,
            self.dmabuf.exported_peak,
        )
    }

    /// The smallest BAR1 of the GPUs we exported on and whether all are static (`None`: unknown).
    pub fn bar1(&self) -> (Option<u64>, Option<bool>) {
        self.dmabuf.budget.summary()
    }

    /// Our buffers alive, and how many of them gdrshim holds open.
    pub fn dmabuf_buffers(&self) -> (usize, usize) {
        self.dmabuf.buffers()
    }

    /// After the real verbs call: keep the reference if it produced an MR, else drop it.
    pub fn after_reg(&mut self, rm: &mut dyn Rm, d: &Decision, mr: u64) {
        let Decision::Hit { mem, id, .. } = d else { return };
        if self.dry_run {
            return;
        }
        if mr != 0 {
            if let Some(old) = self.mrs.insert(mr, HeldRef::Nv503c { mem: *mem, id: *id }) {
                // The provider reused an MR pointer we still hold: drop the stale reference.
                self.finish_dereg(rm, mr, old, true);
            }
        } else {
            self.nv.release(rm, *mem, *id, &mut self.counts);
        }
    }

    /// After `ibv_reg_dmabuf_mr` of an [`Export`] produced `mr`; `provider_addr` is what the
    /// provider put in `ibv_mr.addr` (gdrshim shows the caller its VA instead).
    pub fn after_dmabuf_reg(
        &mut self,
        rm: &mut dyn Rm,
        mr: u64,
        e: &Export,
        provider_addr: u64,
        va: u64,
    ) {
        let held =
            HeldRef::Dmabuf { provider_addr, va, mems: e.mems.clone(), buf: e.buf, bytes: e.bytes };
        self.dmabuf.mr_added(&e.mems);
        if let Some(id) = e.buf {
            self.dmabuf.settle(rm, id, true);
        }
        self.dmabuf_live += 1;
        self.registered_bytes += e.bytes;
        self.registered_peak = self.registered_peak.max(self.registered_bytes);
        if let Some(old) = self.mrs.insert(mr, held) {
            // the provider reused an MR pointer we still hold: that MR is gone
            self.finish_dereg(rm, mr, old, true);
        }
    }

    /// After a successful `ibv_dereg_mr(mr)`.
    pub fn after_dereg(&mut self, rm: &mut dyn Rm, mr: u64) {
        if let Some(held) = self.remove_mr(mr) {
            self.finish_dereg(rm, mr, held, true);
        }
    }

    /// Before the provider's `ibv_dereg_mr(mr)`: take the MR's reference out of the table while
    /// `mr` still names this MR. Once the provider frees it, another thread's registration can
    /// get the same pointer back from malloc at once; a lookup after the call would then release
    /// that thread's registration instead.
    ///
    /// `shown_addr` is what `ibv_mr.addr` reads now. A dma-buf MR of ours shows the caller's VA;
    /// one that shows anything else is not that MR any more (its deregistration got past us, and
    /// malloc gave the pointer to another MR): the stale reference is finished here and nothing
    /// is returned, so that the hook writes nothing into the other MR.
    pub fn take_mr(&mut self, rm: &mut dyn Rm, mr: u64, shown_addr: u64) -> Option<HeldRef> {
        match self.remove_mr(mr) {
            Some(held @ HeldRef::Dmabuf { va, .. }) if va != shown_addr => {
                self.finish_dereg(rm, mr, held, true);
                None
            }
            held => held,
        }
    }

    fn remove_mr(&mut self, mr: u64) -> Option<HeldRef> {
        let held = self.mrs.remove(&mr);
        shrink_when_sparse(&mut self.mrs);
        held
    }

    /// After the provider's dereg: release the reference taken by [`take_mr`](Self::take_mr),
    /// or give it back to `mr` if the provider refused (the MR still exists).
    pub fn finish_dereg(&mut self, rm: &mut dyn Rm, mr: u64, held: HeldRef, deregistered: bool) {
        if !deregistered {
            self.mrs.insert(mr, held);
            return;
        }
        match held {
            HeldRef::Nv503c { mem, id } => self.nv.release(rm, mem, id, &mut self.counts),
            HeldRef::Dmabuf { mems, buf, bytes, .. } => {
                self.dmabuf.mr_gone(&mems);
                if let Some(id) = buf {
                    self.dmabuf.buffer_mr_gone(rm, id);
                }
                self.dmabuf_live -= 1;
                self.registered_bytes -= bytes;
            }
        }
    }

    /// Before the driver runs a call that releases or replaces memory or VA: unregister every
    /// NV503C registration that would otherwise describe memory that is no longer at its
    /// address. Returns what was unregistered, and what verbs MRs still use.
    /// Whether a release of only what was created since the last registration (`fresh`) could
    /// still touch a registration, by what the registrations alone say (no map needed): `false`
    /// lets it through without a decision. A dma-buf MR needs none: its buffer holds its memory
    /// whatever happens to the VA, and only a warning would be lost.
    pub fn may_touch(&self, call: &Pending, fresh: Fresh) -> bool {
        self.nv.may_touch(call, fresh)
    }

    pub fn before_driver_call(
        &mut self,
        t: &Tracker,
        rm: &mut dyn Rm,
        call: Pending,
    ) -> (Vec<VidmemTuple>, Vec<StillInUse>) {
        let mut in_use = self.dmabuf.in_use_by(t, &call);
        self.dmabuf.forget_released(t, rm, &call);
        let gone = self.nv.before_driver_call(t, rm, call, &mut self.counts, &mut in_use);
        (gone, in_use)
    }

    /// RM freed `h` in `client` (a free that succeeded): forget our 503C objects RM freed with it.
    pub fn forget_freed(&mut self, client: u32, h: u32) {
        self.nv.forget_freed(client, h);
    }

    /// A client went away: RM freed its 503C objects and their registrations itself.
    pub fn forget_client(&mut self, client: u32) {
        self.nv.forget_client(client);
        self.mrs.retain(|_, h| !matches!(h, HeldRef::Nv503c { mem, .. } if mem.client == client));
    }
}

impl Registrar {
    /// Takes in what a call over one of this registrar's decisions came to.
    pub fn take_outcome(&mut self, rm: &mut dyn Rm, o: Outcome) {
        match o {
            Outcome::Nv503c { d, mr } => self.after_reg(rm, &d, mr),
            Outcome::DmabufMr { e, mr, provider_addr, va } => {
                self.after_dmabuf_reg(rm, mr, &e, provider_addr, va)
            }
            Outcome::DmabufUnused(e) => self.dmabuf_not_used(rm, &e),
            Outcome::DeregEnd { mr, held, deregistered } => {
                self.finish_dereg(rm, mr, held, deregistered)
            }
            Outcome::Dereg { mr } => self.after_dereg(rm, mr),
            Outcome::DeregQueuedBegin { ticket, mr, shown_addr } => {
                if let Some(held) = self.take_mr(rm, mr, shown_addr) {
                    self.dereg_in_flight.insert(ticket, held);
                }
            }
            Outcome::DeregQueuedEnd { ticket, mr, deregistered } => {
                if let Some(held) = self.dereg_in_flight.remove(&ticket) {
                    self.finish_dereg(rm, mr, held, deregistered);
                }
            }
        }
    }
}
