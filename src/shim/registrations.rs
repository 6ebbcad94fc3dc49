//! The runtime side of the two registration routes: the route decision, verbs registrations,
//! dma-bufs for CUDA's callers, the answers to CUDA's capability attributes, and the releases
//! that must wait for (or take down) registrations.
//!
//! A registration and the driver calls that release memory never overlap: releases hold the read
//! side of `Shim::release_gate` across their driver call, a registration its write side from the
//! map lookup to the last RM call. Without it a free and a new allocation reusing the handle
//! (libcuda reuses them) could land between our lookup and our export or REGISTER_VIDMEM, and
//! the NIC would get memory that is no longer at that address.

use super::types::Shim;
use crate::abi::{self, verbs::IBV_ACCESS_ON_DEMAND};
use crate::advertise::FlagRetry;
use crate::capture;
use crate::config::Mode;
use crate::decode::{self, DevKind};
use crate::pipeline::Core;
use crate::registrar::{Decision, DeregStart, Export, Outcome, RegMiss, VerbsReg};
use crate::route::Route;
use crate::sys::read_own_pieces;
use crate::tracker::{ContextEnd, NativeAnswer, Verdict};
use crate::vamap::{ContextTag, Miss, Piece};
use core::ffi::c_void;
use core::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// What gdrshim makes of a dma-buf request that libcuda refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Exported: the caller's fd.
    Fd(i32),
    /// The range is not one dma-buf of the program's own device memory (a byte outside its
    /// allocations, a hole, host or imported memory): libcuda's answer to that (measured on the
    /// H200: CUDA_ERROR_INVALID_VALUE, docs/results/h200-run23-owned).
    InvalidRange,
    /// Not served here (not the DMA-BUF route, not register mode, the map misses): CUDA's answer stands.
    NotServed,
}

pub(crate) const WAIT: Duration = Duration::from_secs(5);

/// What backs an exact hit: the piece, its memory's RM device and deviceId, its client's
/// /dev/nvidiactl fd.
pub type Backing = (Piece, Option<(u32, u32)>, Option<i32>);

/// A release-type driver call in flight (holds the read side of the gate).
pub type ReleaseGuard<'a> = parking_lot::RwLockReadGuard<'a, ()>;

impl Shim {
    /// The route registrations take in this process, decided at the first need (a GPU
    /// registration, a CUDA capability question): `None` outside register mode or when no route
    /// works here (then said once, with what each route lacks).
    pub fn route(&self) -> Option<Route> {
        if let Some(r) = self.route_choice.decided() {
            return r;
        }
        if !self.registering() && self.cfg.mode != Mode::Shadow {
            return None;
        }
        let loader = self.route_choice.loader_facts(&self.cfg);
        let mut c = self.core(WAIT)?;
        self.decide_route(&mut c, loader)
    }

    /// [`RouteChoice::decide`] on this driver (none without its ABI table).
    fn decide_route(&self, c: &mut Core, loader: Option<bool>) -> Option<Route> {
        let table = self.line.table?;
        self.route_choice.decide(c, &self.cfg, table.dmabuf_export, loader)
    }

    /// What the answers to CUDA's attributes depend on: the configuration and the route.
    pub(crate) fn advertise_policy(&self) -> crate::advertise::Policy {
        crate::advertise::Policy {
            advertise: self.cfg.advertise_gdr,
            advertise_asked: self.cfg.advertise_gdr_asked,
            hide_gdr_for_test: self.cfg.knobs.hide_gdr,
            hide_dmabuf_for_test: self.cfg.knobs.hide_dmabuf,
            route: if self.registering() { self.route() } else { None },
            flush_disabled: self.cfg.nccl_flush_disabled,
            force_flush: self.cfg.nccl_force_flush,
        }
    }

    /// `cuDeviceGetAttribute` answered `*value` for `attrib` on `dev`: replaced where the policy
    /// says so ([`Answers::device_attribute`]).
    pub fn answer_device_attribute(
        &self,
        attrib: i32,
        dev: i32,
        value: &mut i32,
        ask: &dyn Fn(i32) -> Option<i32>,
    ) {
        if self.answers.device_attribute(&self.advertise_policy(), attrib, dev, value, ask) {
            self.stats.gdr_answers.fetch_add(1, Relaxed);
        }
    }

    /// `cuMemCreate` failed with `first` for properties whose `gpuDirectRDMACapable` is `flag`:
    /// whether to call it once more without the flag ([`Answers::vmm_flag_retry`]).
    pub fn vmm_flag_retry(&self, first: i32, flag: u8) -> FlagRetry {
        self.answers.vmm_flag_retry(first, flag)
    }

    /// The retry of `vmm_flag_retry` gave `again` ([`Answers::vmm_flag_retried`]).
    pub fn vmm_flag_retried(&self, size: u64, first: i32, again: i32) {
        super::answers::Answers::vmm_flag_retried(size, first, again);
    }

    /// A user allocation `[ptr, ptr+len)` returned by a CUDA entry point (see `user_allocation`).
    pub(crate) fn user_allocation_inner(
        &'static self,
        api: &'static str,
        ptr: u64,
        len: u64,
        ctx: ContextTag,
    ) {
        if self.line.capture_fd.load(Relaxed) >= 0 {
            self.capture(&format!("A {api} {ptr:x} {len:x}"));
        }
        if self.line.table.is_none() {
            return;
        }
        let eager = self.cfg.eager && self.registering();
        if !eager && !crate::log::enabled(crate::config::Level::Debug) {
            // the usual case: counted, and a line only for what deserves a warning
            let _ = self.queue(crate::pipeline::Work::UserAllocation { api, ptr, len, ctx });
            return;
        }
        // an eager registration, like any, only under the release gate: if a release holds it
        // for longer than WAIT, nothing is registered here (the MR's own call registers later)
        let gate = if eager { self.release_gate.try_write_for(WAIT) } else { None };
        let eager = eager && gate.is_some();
        let loader = if eager { self.route_choice.loader_facts(&self.cfg) } else { None };
        let Some(mut c) = self.core(WAIT) else { return };
        let v = c.tracker.user_allocation_in(ptr, len, ctx);
        if let (true, Verdict::Covered(pieces)) = (eager, &v) {
            // Eager registration is NV503C's (a dma-buf exists only for an MR).
            if self.decide_route(&mut c, loader) == Some(Route::Nv503c) {
                // Each UVM mapping behind the allocation, as libcuda registers it; the reference
                // is held until the memory or VA goes.
                let Core { tracker, registrar, rm, .. } = &mut *c;
                for (t, _) in pieces {
                    // the part of this UVM mapping the allocation holds: only the program's own
                    // memory is asked for, and the registration is the whole mapping's
                    let (from, to) =
                        (t.address.max(ptr), (t.address + t.size).min(ptr.saturating_add(len)));
                    if from >= to {
                        continue;
                    }
                    match registrar.before_reg(tracker, rm, from, to - from) {
                        Decision::Miss(m) | Decision::Refuse(m) => {
                            crate::log_warn!("eager {api} [{ptr:#x}, +{len:#x}) pass0 miss: {m}")
                        }
                        Decision::Hit { tuple, .. } => crate::log_debug!(
                            "eager {api} [{ptr:#x}, +{len:#x}) registered {tuple}"
                        ),
                        _ => {}
                    }
                }
            }
        }
        drop(c);
        // The line is only formatted when it will be written: this runs on every allocation.
        match &v {
            Verdict::Uncovered(_) => {
                crate::log_warn!("{}", capture::verdict_line(api, ptr, len, &v))
            }
            Verdict::Covered(p)
                if p.iter().any(|(_, a)| matches!(a, NativeAnswer::Mismatched(_))) =>
            {
                crate::log_warn!("{}", capture::verdict_line(api, ptr, len, &v))
            }
            _ => crate::log_debug!("{}", capture::verdict_line(api, ptr, len, &v)),
        }
    }

    /// Before a verbs registration: the pass0 decision, with every RM call of the route made
    /// (in register mode), logged one line per GPU registration.
    pub fn verbs_before(&self, api: &str, r: VerbsReg) -> Option<Decision> {
        if self.line.table.is_none() || self.cfg.mode == Mode::Trace {
            return None;
        }
        let (addr, len) = (r.addr, r.len);
        let _gate =
            if self.registering() { Some(self.release_gate.try_write_for(WAIT)?) } else { None };
        let loader = self.route_choice.loader_facts(&self.cfg);
        let mut c = self.core(WAIT)?;
        if c.tracker.is_gpu_va(addr) && r.access & IBV_ACCESS_ON_DEMAND == 0 {
            self.decide_route(&mut c, loader);
        }
        let Core { tracker, registrar, rm, .. } = &mut *c;
        let d = registrar.before_verbs(tracker, rm, r);
        drop(c);
        match &d {
            Decision::Host => crate::log_debug!("{api} addr={addr:#x} len={len:#x}: host memory, passed through"),
            Decision::Odp => crate::log_info!(
                "{api} addr={addr:#x} len={len:#x}: IBV_ACCESS_ON_DEMAND on GPU memory: neither route serves ODP MRs; passed through"
            ),
            Decision::StandAside => {
                if !self.stood_aside_logged.swap(true, Relaxed) {
                    crate::log_warn!(
                        "native registration present (libcuda registers third-party P2P itself on this GPU): gdrshim registers nothing"
                    );
                }
                crate::log_debug!("{api} addr={addr:#x} len={len:#x}: native registration present, standing aside");
            }
            Decision::Hit { mem, offset, tuple, fresh, .. } => crate::log_info!(
                "{api} addr={addr:#x} len={len:#x} pass0 hit hMemory={:#010x} offset={offset:#x} {} {tuple}",
                mem.memory,
                match (self.cfg.mode, fresh) {
                    (Mode::Register, true) => "registered",
                    (Mode::Register, false) => "shares registration",
                    _ => "would register",
                }
            ),
            Decision::Exported(e) => crate::log_info!(
                "{api} addr={addr:#x} len={len:#x} pass0 hit: exported {} piece(s), {:#x} bytes, as dma-buf fd {} (MR at offset {:#x})",
                e.pieces,
                e.bytes,
                e.fd,
                e.offset
            ),
            Decision::WouldExport { pieces, bytes } => {
                crate::log_info!(
                    "{api} addr={addr:#x} len={len:#x} pass0 hit: would export {pieces} piece(s), {bytes:#x} bytes, as a dma-buf"
                )
            }
            Decision::Miss(m) => crate::log_limited!(
                crate::config::Level::Warn,
                "pass0 miss",
                "{api} addr={addr:#x} len={len:#x} pass0 miss: {m}; nothing registered, delegating"
            ),
            Decision::Refuse(m) => crate::log_limited!(
                crate::config::Level::Warn,
                "pass0 miss",
                "{api} addr={addr:#x} len={len:#x} pass0 miss: {m}; nothing registered, and the call fails with EFAULT as on a GeForce without gdrshim (it never reaches the NIC's driver)"
            ),
        }
        Some(d)
    }

    pub fn verbs_after(&self, d: &Decision, mr: u64) {
        self.settle(Outcome::Nv503c { d: d.clone(), mr });
    }

    /// `ibv_reg_dmabuf_mr` of an export gave `mr` (whose `addr` the provider set to `provider_addr`).
    pub fn verbs_after_dmabuf(&self, e: &Export, mr: u64, provider_addr: u64, va: u64) {
        self.settle(Outcome::DmabufMr { e: e.clone(), mr, provider_addr, va });
    }

    /// A buffer exported for a call that then did not use it: its hold is given back (the last
    /// closes gdrshim's fd of it).
    pub fn dmabuf_not_wanted(&self, e: &Export) {
        self.settle(Outcome::DmabufUnused(e.clone()));
    }

    /// An export the verbs call did not take (`with`: the provider's call that refused it): its
    /// hold is given back as for [`dmabuf_not_wanted`](Self::dmabuf_not_wanted); counted and said.
    pub fn dmabuf_refused(
        &self,
        api: &str,
        with: &str,
        e: &Export,
        addr: u64,
        len: u64,
        errno: i32,
    ) {
        self.stats.dmabuf_refused.fetch_add(1, Relaxed);
        self.settle(Outcome::DmabufUnused(e.clone()));
        crate::log_limited!(
            crate::config::Level::Warn,
            "export refused",
            "{api} addr={addr:#x} len={len:#x}: {with} refused the export: {} (errno {errno}); delegating the original call",
            std::io::Error::from_raw_os_error(errno)
        );
    }

    /// Before the provider's `ibv_dereg_mr`: the MR's reference, taken out of the table
    /// (`shown_addr`: what the MR's `addr` reads now, see `Registrar::take_mr`); where the core's
    /// lock is not had in time, taken out by a queued outcome (its end is owed, `verbs_dereg_end`).
    pub fn verbs_dereg_begin(&self, mr: u64, shown_addr: u64) -> Option<DeregStart> {
        #[cfg(feature = "knobs")]
        let queue_only = self.cfg.knobs.dereg_queued;
        #[cfg(not(feature = "knobs"))]
        let queue_only = false;
        let now = if queue_only { None } else { self.core(WAIT) };
        let Some(mut c) = now else {
            let ticket = self.dereg_tickets.fetch_add(1, Relaxed);
            self.pipeline.keep_outcome(Outcome::DeregQueuedBegin { ticket, mr, shown_addr });
            return Some(DeregStart::Queued(ticket));
        };
        let Core { registrar, rm, .. } = &mut *c;
        let held = registrar.take_mr(rm, mr, shown_addr);
        self.pipeline.note_live_mrs(registrar.live_mrs());
        held.map(DeregStart::Taken)
    }

    /// After the provider's `ibv_dereg_mr`: release the reference, or give it back on failure.
    pub fn verbs_dereg_end(&self, mr: u64, start: DeregStart, deregistered: bool) {
        match start {
            DeregStart::Taken(held) => self.settle(Outcome::DeregEnd { mr, held, deregistered }),
            DeregStart::Queued(ticket) => {
                self.settle(Outcome::DeregQueuedEnd { ticket, mr, deregistered })
            }
        }
    }

    /// A re-registration moved `mr` off what it held.
    pub fn verbs_dereg(&self, mr: u64) {
        self.settle(Outcome::Dereg { mr });
    }

    /// `gdrshim_unregister` of explicit handle `key`: `Some(true)` taken down, `Some(false)` no
    /// such handle, `None` the core's lock not had (nothing done).
    pub fn unregister_explicit(&self, key: u64) -> Option<bool> {
        let mut c = self.core(WAIT)?;
        let Core { registrar, rm, .. } = &mut *c;
        if !registrar.holds_mr(key) {
            return Some(false);
        }
        registrar.after_dereg(rm, key);
        self.pipeline.note_live_mrs(registrar.live_mrs());
        Some(true)
    }

    /// The exact lookup of `[va, va+len)` (`gdrshim_lookup`): the one memory object that covers
    /// it, its RM device and deviceId, and its client's /dev/nvidiactl fd; or why not. `None`: the
    /// core's lock was not had in time.
    pub fn backing_of(&self, va: u64, len: u64) -> Option<Result<Backing, Miss>> {
        let c = self.core(WAIT)?;
        let t = &c.tracker;
        Some(
            t.map
                .lookup_single(va, len)
                .map(|p| (p, t.piece_device(&p), t.client_fd(p.mem.client))),
        )
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)` that libcuda refused (801, as on GeForce):
    /// the fd of gdrshim's export of exactly the map's pieces, where the DMA-BUF route serves.
    pub fn serve_dmabuf(&self, ptr: u64, size: u64, mapping_type: u8) -> Served {
        if !self.registering() || self.route() != Some(Route::Dmabuf) {
            return Served::NotServed;
        }
        if !ptr.is_multiple_of(crate::tracker::dmabuf::HOST_PAGE)
            || !size.is_multiple_of(crate::tracker::dmabuf::HOST_PAGE)
        {
            crate::log_limited!(
                crate::config::Level::Warn,
                "dma-buf not served",
                "cuMemGetHandleForAddressRange [{ptr:#x}, +{size:#x}): not host-page aligned (CUDA requires it); answering CUDA_ERROR_INVALID_VALUE, as libcuda does (H200, tests/gpu/owned.cu odd-100-*)"
            );
            return Served::InvalidRange;
        }
        let Some(_gate) = self.release_gate.try_write_for(WAIT) else { return Served::NotServed };
        let Some(mut c) = self.core(WAIT) else { return Served::NotServed };
        let Core { tracker, registrar, rm, .. } = &mut *c;
        match registrar.export(tracker, rm, ptr, size, mapping_type) {
            Ok(Some(e)) => {
                self.stats.dmabuf_served.fetch_add(1, Relaxed);
                crate::log_info!(
                    "cuMemGetHandleForAddressRange [{ptr:#x}, +{size:#x}): served dma-buf fd {} ({} piece(s))",
                    e.fd,
                    e.pieces
                );
                Served::Fd(e.fd)
            }
            Ok(None) => Served::NotServed,
            Err(
                m @ (RegMiss::NotProgramMemory { .. } | RegMiss::Export(_) | RegMiss::Lookup(_)),
            ) => {
                crate::log_limited!(
                    crate::config::Level::Warn,
                    "dma-buf refused",
                    "cuMemGetHandleForAddressRange [{ptr:#x}, +{size:#x}): refused: {m}; answering CUDA_ERROR_INVALID_VALUE"
                );
                Served::InvalidRange
            }
            Err(m) => {
                crate::log_limited!(
                    crate::config::Level::Warn,
                    "dma-buf not served",
                    "cuMemGetHandleForAddressRange [{ptr:#x}, +{size:#x}): not served: {m}; CUDA's answer stands"
                );
                Served::NotServed
            }
        }
    }

    /// GeForce emulation: what libcuda answered a dma-buf request itself (`native`) against what
    /// the program got under gdrshim (`ours`): the same outcome, and for a refusal the same code.
    pub fn export_oracle(&self, ptr: u64, size: u64, native: i32, ours: i32) {
        if native == ours {
            self.stats.export_oracle_agree.fetch_add(1, Relaxed);
            return;
        }
        self.stats.export_oracle_disagree.fetch_add(1, Relaxed);
        crate::log_warn!("export oracle: cuMemGetHandleForAddressRange [{ptr:#x}, +{size:#x}): libcuda answers {native}, gdrshim {ours}");
    }

    /// The program was handed `[ptr, ptr+len)` by a CUDA call other than an allocation of new
    /// memory (`cuMemMap`, an IPC or pool import).
    pub fn program_mapping(&'static self, ptr: u64, len: u64, ctx: ContextTag) {
        if self.line.table.is_some() {
            let _ = self.queue(crate::pipeline::Work::ProgramMapping { ptr, len, ctx });
        }
    }

    /// The program made CUDA context `ctx`: device `primary_of`'s primary context, or one it
    /// created.
    pub fn context_made(&'static self, ctx: u64, primary_of: Option<i32>) {
        if self.line.table.is_some() {
            let _ = self.queue(crate::pipeline::Work::ContextMade { ctx, primary_of });
        }
    }

    /// A CUDA context ended (`api`): the allocations made in it are the program's no longer.
    pub fn context_ended(&'static self, api: &str, end: ContextEnd) {
        if self.line.table.is_none() {
            return;
        }
        crate::log_info!(
            "{api}: a CUDA context ended; the program's allocations made in it are its own no longer (registrations and exports over them are refused)"
        );
        let _ = self.queue(crate::pipeline::Work::ContextEnded(end));
    }

    /// The program gave back the allocation at `ptr` (`len` `None`) or `[ptr, ptr+len)`.
    pub fn program_release(&'static self, ptr: u64, len: Option<u64>) {
        if self.line.table.is_some() {
            let _ = self.queue(crate::pipeline::Work::ProgramRelease { ptr, len });
        }
    }

    /// CUDA handed out dma-buf `fd` for `[ptr, ptr+size)`: queued for the shadow oracle.
    pub fn dmabuf_handed_out(&'static self, ptr: u64, size: u64, fd: i32) {
        if self.line.table.is_some() {
            let _ = self.queue(crate::pipeline::Work::DmabufRequest { ptr, size, fd });
        }
    }

    /// Before the real ioctl of a call that releases (or maps over) memory or VA: waits for any
    /// registration in progress (the returned guard is held across the driver call), then takes
    /// down the NV503C registrations it would leave describing memory that is no longer there,
    /// and warns when verbs MRs still use that memory.
    pub fn before_ioctl(
        &self,
        dev: DevKind,
        request: u64,
        arg: *mut c_void,
    ) -> Option<ReleaseGuard<'_>> {
        if !self.registering() || arg.is_null() {
            return None;
        }
        let t = self.line.table?;
        // cheap filter first: only the requests that release anything take a lock
        let releases = match dev {
            DevKind::Uvm => matches!(
                request,
                abi::uvm::FREE
                    | abi::uvm::UNMAP_EXTERNAL
                    | abi::uvm::MAP_EXTERNAL_ALLOCATION
                    | abi::uvm::MAP_EXTERNAL_SPARSE
            ),
            _ => abi::ioc_nr(request) == abi::esc::RM_FREE,
        };
        if !releases {
            return None;
        }
        let gate = self.release_gate.try_read_for(WAIT);
        // Only what is in use needs handling before the driver runs the call (a 503C of ours that
        // an RM free takes with it is forgotten after the free: forget_freed). The queue can only
        // take registrations away (the outcomes of verbs calls, which add them, are taken in
        // first: Pipeline::lend_for_release), so deciding that needs no catching up; and even without the
        // queue (its lock not free in 5 s), taking down what we know of is safer than leaving it
        // registered over memory the driver is about to release. A call that touches only what
        // was created since a registration could last be made touches no registration (FreshRecord):
        // no decision, so no catching up.
        // The caller's buffer has not been vetted by the kernel yet: read it without faulting.
        let read =
            || decode::pending(dev, request, t, &|pieces| read_own_pieces(arg as u64, pieces));
        let Some((mut lent, call)) = self.pipeline.lend_for_release(
            WAIT,
            |c| c.registrar.in_use(),
            read,
            &mut crate::pipeline::map_notice,
        ) else {
            return gate;
        };
        let c: &mut Core = &mut lent.core;
        let Core { tracker, registrar, rm, .. } = c;
        let (gone, in_use) = registrar.before_driver_call(tracker, rm, call);
        for x in gone {
            crate::log_info!(
                "unregistered {x} before the driver releases or remaps its memory or VA"
            );
        }
        for u in in_use {
            crate::log_limited!(
                crate::config::Level::Warn,
                "freed in use",
                "{} is released or remapped while {} verbs MR(s) still use it: the NIC keeps the old memory until they are deregistered ({})",
                u.what,
                u.mrs,
                match u.route {
                    Route::Nv503c => "nvidia-peermem's persistent API, the default since 560",
                    Route::Dmabuf => "the dma-buf holds it, as libcuda's own do",
                }
            );
        }
        gate
    }
}
