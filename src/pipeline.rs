//! The hooks' work on its way to the core. A hook decodes its call and pushes the event onto a
//! queue (a lock of its own, one cache line); full batches are applied to the core by a helper
//! thread, or by the filling thread where there is none. The only way to the core is [`Pipeline::core`]
//! or [`Pipeline::lend`], which drain the queue first: nobody decides on a map that lacks calls.
//! ([`Pipeline::lend_for_release`] drains it too, unless the call to decide on touches only what
//! was created since a registration could last be made, and so needs no decision: [`FreshRecord`].)
//!
//! Why batches and a thread: applying a batch at once brings the tracker's code and tables back
//! into the caches once per batch instead of once per call, and the helper takes that work off the
//! program's thread. Same-process A/B on the H200 (docs/results/h200-variants4): 2 MiB /
//! 4 KiB alloc loop 1.0149 / 1.0156 with the helper, 1.0160 / 1.0204 without it (the 4 KiB loop
//! over 1.02), so it stays. CLDEMOTE after each batch measured another 0.4 %; it went, since the
//! helper holds 1.02 without it (docs/results/h200-ab6: 1.0131 / 1.0122).

use crate::decode;
use crate::fresh::FreshRecord;
use crate::registrar::Outcome;
use crate::sys::Guard;
use core::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use once_cell::sync::OnceCell;
use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

pub use crate::state::Work;

/// The pure core as the process has it: its RM calls are the real ones.
pub type Core = crate::state::Core<crate::rm::RealRm>;

/// Most work items the hooks leave unapplied (512 × 72 bytes). Applying them in a batch is
/// cheaper than one by one: between two NVIDIA calls the driver's own work evicts the caches,
/// so a lone event pays for the tracker's code and tables coming back, a batch once. H200, the
/// 2 MiB cuMemAlloc/cuMemFree loop with/without the shim in one process: 1.0295 with none
/// waiting against 1.0222 with 128 (h200-variants); 128 → 512 one more −0.15 % (h200-variants2).
pub const BACKLOG: usize = 512;

/// How the helper thread learns of a full batch: it looks every millisecond while batches come,
/// and sleeps until woken after a second without one. The hooks wake it only then: a wake-up from
/// the hook cost the calling thread 30–60 µs on our 2-vCPU VM (about what the helper then spent
/// applying the batch, as if it ran on the caller's CPU), and on the H200 the 2 MiB loop measured
/// 1.0235 woken against 1.0181 polling (h200-variants3).
const HELPER_POLL: Duration = Duration::from_millis(1);
const HELPER_POLLS: u32 = 1000;

/// The hooks' work not applied yet, behind a lock of its own, so that a hook never waits for a
/// batch being applied. `handed` (a full batch given to the helper thread) is older than
/// `current`; batches are taken out and applied only under the core's lock, so they are applied
/// one after the other, in the order they were filled.
struct Queue {
    current: Vec<Work>,
    /// Work items that may wait: 1 (none wait) in trace mode and at debug level, where lines
    /// must come out in the order of the calls.
    backlog_max: u32,
    helper: Helper,
    /// Keep [`QueueRest::fresh`]: only where releases are checked (register mode).
    record_fresh: bool,
    /// Boxed: what the hooks touch on every call (this lock, `current`) stays in one cache line
    /// (in register mode a call that creates an object or range also writes `rest.fresh`).
    rest: Box<QueueRest>,
}
struct QueueRest {
    /// Full and waiting for the helper thread; empty when none waits.
    handed: Vec<Work>,
    /// Emptied batches, for reuse: no allocation in the hooks once there are enough.
    spare: Vec<Vec<Work>>,
    /// What the calls pushed since a registration could last be made created (see [`FreshRecord`]):
    /// forgotten by [`Pipeline::core`], the only way to a registration.
    fresh: FreshRecord,
}
/// The queue and its lock, in a cache line of their own. The lock is released with a plain
/// store, not a locked instruction: that would make the hook wait until the line of the slot it
/// just wrote arrives (a cache miss after each driver call), where a store lets the core go on.
/// It is held for a push or a swap of batches only, so a waiter spins, then yields.
#[repr(C, align(64))]
struct QueueLine {
    locked: core::sync::atomic::AtomicBool,
    queue: core::cell::UnsafeCell<Queue>,
}
const _: () = assert!(core::mem::size_of::<QueueLine>() == 64);
// SAFETY: the queue is reached only through a QueueGuard, which exists while `locked` is held.
unsafe impl Sync for QueueLine {}

struct QueueGuard<'a>(&'a QueueLine);

impl QueueLine {
    fn new(q: Queue) -> QueueLine {
        QueueLine {
            locked: core::sync::atomic::AtomicBool::new(false),
            queue: core::cell::UnsafeCell::new(q),
        }
    }

    #[inline]
    fn try_lock_for(&self, wait: Duration) -> Option<QueueGuard<'_>> {
        use core::sync::atomic::Ordering::Acquire;
        match self.locked.compare_exchange(false, true, Acquire, Relaxed) {
            Ok(_) => Some(QueueGuard(self)),
            Err(_) => self.lock_contended(wait),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self, wait: Duration) -> Option<QueueGuard<'_>> {
        use core::sync::atomic::Ordering::Acquire;
        let deadline = std::time::Instant::now() + wait;
        for spin in 1u32.. {
            if !self.locked.load(Relaxed)
                && self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok()
            {
                return Some(QueueGuard(self));
            }
            if spin < 128 {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
                if spin % 256 == 0 && std::time::Instant::now() > deadline {
                    return None;
                }
            }
        }
        None
    }
}

impl core::ops::Deref for QueueGuard<'_> {
    type Target = Queue;
    fn deref(&self) -> &Queue {
        // SAFETY: this guard holds the lock, so no other reference to the queue exists.
        unsafe { &*self.0.queue.get() }
    }
}
impl core::ops::DerefMut for QueueGuard<'_> {
    fn deref_mut(&mut self) -> &mut Queue {
        // SAFETY: as in deref; `&mut self` makes this the only reference through this guard.
        unsafe { &mut *self.0.queue.get() }
    }
}
impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        self.0.locked.store(false, core::sync::atomic::Ordering::Release);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Helper {
    /// Started when the first batch is full.
    NotStarted,
    Running,
    /// Not wanted (trace mode, debug level, GDRSHIM_APPLY_THREAD=0 in a knobs build) or could
    /// not be started (or `Starting` now): a full batch is applied by the thread that filled it.
    Inline,
    Starting,
}

/// The warning line of what applying the queue noticed (rate-limited under one key).
pub fn map_notice(line: &str) {
    crate::log_limited!(crate::config::Level::Warn, "map notice", "{line}");
}

/// What a catch-up forgets besides the queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Forget {
    Nothing,
    /// The record of what was created since a registration could last be made: one may now be.
    FreshRecord,
}

/// The core lent out; `complete` when every queued call was applied to it first.
pub struct Lent<'a> {
    pub core: MutexGuard<'a, Core>,
    pub complete: bool,
}

/// The queue, the helper thread and the core behind its lock.
pub struct Pipeline {
    /// The hooks' work not applied yet ([`Pipeline::push`]).
    queue: QueueLine,
    /// `queue.handed` holds a batch: read by the helper thread without the queue's lock, so that
    /// it never waits on (nor is handed) the lock the hooks take on every call.
    batch_handed: AtomicBool,
    /// The helper thread, to wake it ([`Pipeline::helper_loop`]).
    helper: OnceCell<std::thread::Thread>,
    helper_asleep: AtomicBool,
    core: Mutex<Core>,
    /// Work was dropped ([`Pipeline::push`] could not take the queue's lock): the core's map is
    /// marked incomplete at its next catch-up, and no release is let through unchecked.
    lost: AtomicBool,
    /// Full batches the helper thread applied.
    pub helper_batches: AtomicU64,
    /// GDRSHIM_TIMING: clock ticks the helper spent applying (not the program's time).
    #[cfg(feature = "knobs")]
    pub helper_ticks: AtomicU64,
    #[cfg(feature = "knobs")]
    timing: bool,
    /// Outcomes of verbs calls kept for the core's next holder (`late.rs`).
    late: late::Late,
    /// MRs holding a registration: a deregistration with none (and no outcome kept) needs no lock.
    live_mrs: core::sync::atomic::AtomicUsize,
}

impl Pipeline {
    /// `backlog_max`: work items that may wait (1: each is applied at once); `helper`: apply full
    /// batches on a thread of their own; `record_fresh`: keep the record of what is created
    /// ([`FreshRecord`]) for the release checks ([`lend_for_release`](Self::lend_for_release)).
    pub fn new(
        core: Core,
        backlog_max: usize,
        helper: bool,
        timing: bool,
        record_fresh: bool,
    ) -> Pipeline {
        let _ = timing;
        let helper = if helper && backlog_max > 1 { Helper::NotStarted } else { Helper::Inline };
        let queue = Queue {
            current: Vec::with_capacity(backlog_max),
            backlog_max: backlog_max as u32,
            helper,
            record_fresh,
            rest: Box::new(QueueRest {
                handed: Vec::new(),
                spare: Vec::new(),
                fresh: FreshRecord::default(),
            }),
        };
        Pipeline {
            queue: QueueLine::new(queue),
            batch_handed: AtomicBool::new(false),
            helper: OnceCell::new(),
            helper_asleep: AtomicBool::new(false),
            core: Mutex::new(core),
            lost: AtomicBool::new(false),
            helper_batches: AtomicU64::new(0),
            #[cfg(feature = "knobs")]
            helper_ticks: AtomicU64::new(0),
            #[cfg(feature = "knobs")]
            timing,
            late: Default::default(),
            live_mrs: Default::default(),
        }
    }

    /// The core with every hook's work applied to it: the way in for anyone who reads or changes
    /// the map or the registrations. `None` if the lock is not free within `wait`, or the queue's
    /// not within 5 s (a map that may lack queued calls is no map to decide on).
    /// Registrations are made only on a core from here, so it forgets what was created before
    /// (a registration may now use it).
    pub fn core(&self, wait: Duration) -> Option<MutexGuard<'_, Core>> {
        let mut core = self.core.try_lock_for(wait)?;
        self.take_late(&mut core);
        let complete = self.catch_up(&mut core, &mut map_notice, Forget::FreshRecord);
        complete.then_some(core)
    }

    /// The core, with as much of the queue applied as could be: for those that must act on what
    /// is known even when the queue's lock stays taken (taking registrations down before a
    /// release; the summary at exit). `warn` gets the lines worth a warning.
    pub fn lend(&self, wait: Duration, warn: &mut dyn FnMut(&str)) -> Option<Lent<'_>> {
        let mut core = self.core.try_lock_for(wait)?;
        self.take_late(&mut core);
        let complete = self.catch_up(&mut core, warn, Forget::Nothing);
        Some(Lent { core, complete })
    }

    /// For the decision before a call that releases memory or VA: [`lend`](Self::lend), with the
    /// call `read` gives, but only when `needed` says so of the core as it is before the queue is
    /// applied (what it looks at must be something the queue can only take away: the
    /// registrations in use) and the call touches more than what was created since a
    /// registration could last be made ([`FreshRecord`]) or the registrations themselves say it may
    /// touch one of them (`Registrar::may_touch`: one left behind by a release that got no
    /// decision). `None`: not needed, nothing to decide, only fresh, or the core's lock not free.
    /// The record of what is fresh stays: this decision makes no registration.
    pub fn lend_for_release(
        &self,
        wait: Duration,
        needed: impl FnOnce(&Core) -> bool,
        read: impl FnOnce() -> Option<decode::Pending>,
        warn: &mut dyn FnMut(&str),
    ) -> Option<(Lent<'_>, decode::Pending)> {
        let mut core = self.core.try_lock_for(wait)?;
        self.take_late(&mut core);
        if !needed(&core) {
            return None;
        }
        // read before the queue's lock, which the hooks take on every call
        let call = read()?;
        let Some(q) = self.queue.try_lock_for(Duration::from_secs(5)) else {
            // as catch_up: decide on what is known rather than not at all
            return Some((Lent { core, complete: false }, call));
        };
        let fresh = q.rest.fresh.fresh(&call);
        drop(q);
        // (a dropped call may have been the free of something still in the record)
        if fresh.is_some_and(|f| !core.registrar.may_touch(&call, f)) && !self.lost.load(SeqCst) {
            return None;
        }
        let complete = self.catch_up(&mut core, warn, Forget::Nothing);
        Some((Lent { core, complete }, call))
    }

    /// Applies everything queued to `c` (whose lock the caller holds), oldest batch first;
    /// `false` if the queue's lock was not free within 5 s.
    fn catch_up(&self, c: &mut Core, warn: &mut dyn FnMut(&str), forget: Forget) -> bool {
        if self.lost.load(SeqCst) {
            c.tracker.incomplete = true;
        }
        let (older, newer) = {
            let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) else { return false };
            if forget == Forget::FreshRecord {
                // under the queue's lock, with the queue drained below: whatever is pushed after
                // this is new to a registration made on this core
                q.rest.fresh.forget();
            }
            if q.rest.handed.is_empty() && q.current.is_empty() {
                return true;
            }
            let fresh = q.rest.spare.pop().unwrap_or_default();
            let newer = core::mem::replace(&mut q.current, fresh);
            self.batch_handed.store(false, Relaxed);
            (core::mem::take(&mut q.rest.handed), newer)
        };
        c.apply(&older, warn);
        c.apply(&newer, warn);
        self.give_back(older, newer);
        true
    }

    /// Emptied batches go back to the queue for reuse.
    fn give_back(&self, a: Vec<Work>, b: Vec<Work>) {
        if let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) {
            for mut v in [a, b] {
                if v.capacity() > 0 && q.rest.spare.len() < 2 {
                    v.clear();
                    q.rest.spare.push(v);
                }
            }
        }
    }

    /// Hands work to the core: applied once its batch is full (on the helper thread), or before
    /// anyone reads the core; given back if the queue's lock is not free within 5 s.
    pub fn push(&'static self, w: Work) -> Result<(), Work> {
        let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) else {
            // a lost release could leave the map, or the record of the program's memory,
            // describing what is gone
            self.lost.fetch_or(
                matches!(w, Work::Event(_) | Work::ProgramRelease { .. } | Work::ContextEnded(_)),
                SeqCst,
            );
            return Err(w);
        };
        if let (true, Work::Event(ref ev)) = (q.record_fresh, &w) {
            q.rest.fresh.record(ev);
        }
        q.current.push(w);
        if q.current.len() >= q.backlog_max as usize {
            self.batch_full(q);
        }
        Ok(())
    }

    /// The current batch is full: to the helper thread if it is free, else applied here.
    #[cold]
    #[inline(never)]
    fn batch_full(&'static self, mut q: QueueGuard<'_>) {
        if q.helper == Helper::NotStarted {
            // Started holding no lock of ours (this batch is applied here): a thread start may wait for
            // the loader's lock, held by a dlopen whose constructor's NVIDIA call needs ours.
            q.helper = Helper::Starting;
            drop(q);
            drop(self.lend(Duration::from_secs(5), &mut map_notice));
            let r = self.start_helper();
            if let Err(e) = &r {
                crate::log_info!("no helper thread ({e}): batches of the map's work are applied by the threads that fill them");
            }
            let helper = if r.is_ok() { Helper::Running } else { Helper::Inline };
            let _ = self.queue.try_lock_for(Duration::from_secs(5)).map(|mut q| q.helper = helper);
            return;
        }
        if q.helper == Helper::Running && q.rest.handed.is_empty() {
            let fresh = q.rest.spare.pop().unwrap_or_else(|| Vec::with_capacity(BACKLOG));
            q.rest.handed = core::mem::replace(&mut q.current, fresh);
            self.batch_handed.store(true, SeqCst);
            drop(q);
            if self.helper_asleep.load(SeqCst) {
                if let Some(t) = self.helper.get() {
                    t.unpark();
                }
            }
            return;
        }
        // no helper, or it is still on the batch before: this thread catches up itself
        drop(q);
        drop(self.lend(Duration::from_secs(5), &mut map_notice));
    }

    /// The helper thread's loop: waits for a handed batch and applies it (and nothing newer, so
    /// that the hooks keep filling their batch undisturbed).
    fn helper_loop(&'static self) -> ! {
        loop {
            let mut polls = 0u32;
            while !self.batch_handed.load(SeqCst) {
                if polls < HELPER_POLLS {
                    polls += 1;
                    std::thread::park_timeout(HELPER_POLL);
                } else {
                    self.helper_asleep.store(true, SeqCst);
                    if !self.batch_handed.load(SeqCst) {
                        std::thread::park();
                    }
                    self.helper_asleep.store(false, SeqCst);
                    polls = 0;
                }
            }
            let _ = crate::sys::contained(|| {
                let Some(mut c) = self.core.try_lock_for(Duration::from_secs(5)) else { return };
                let batch = match self.queue.try_lock_for(Duration::from_secs(5)) {
                    Some(mut q) => {
                        self.batch_handed.store(false, Relaxed);
                        core::mem::take(&mut q.rest.handed)
                    }
                    None => return,
                };
                if batch.is_empty() {
                    return; // a reader caught up first
                }
                #[cfg(feature = "knobs")]
                let t0 = self.timing.then(crate::sys::Clock::now);
                c.apply(&batch, &mut map_notice);
                drop(c);
                #[cfg(feature = "knobs")]
                if let Some(t0) = t0 {
                    self.helper_ticks.fetch_add(crate::sys::Clock::now() - t0, Relaxed);
                }
                self.helper_batches.fetch_add(1, Relaxed);
                self.give_back(batch, Vec::new());
            });
        }
    }

    /// Starts the thread that applies handed batches ([`Pipeline::helper_loop`]), with every signal
    /// blocked: the program's handlers stay with the program's threads.
    fn start_helper(&'static self) -> std::io::Result<()> {
        // SAFETY: plain signal-set operations on local sets; pthread_sigmask changes only this
        // thread's mask, restored below, and the new thread inherits the full mask.
        let old = unsafe {
            let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
                (core::mem::zeroed(), core::mem::zeroed());
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            old
        };
        let r = std::thread::Builder::new()
            .name("gdrshim-apply".into())
            .stack_size(256 << 10)
            .spawn(|| {
                // our own calls in this thread (the log file) bypass our hooks
                let _inside = Guard::enter();
                self.helper_loop()
            });
        // SAFETY: restores this thread's mask as it was.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
        let _ = self.helper.set(r?.thread().clone());
        Ok(())
    }
}

mod late;
#[cfg(test)]
mod tests;

impl Pipeline {
    /// Hands `o` to the registrar, now if the core's lock is had within `wait` (and `keep_only`
    /// is false: the tests' knob), else through the queue of outcomes (`late.rs`).
    pub fn settle(&self, o: Outcome, wait: Duration, keep_only: bool) {
        let now = if keep_only { None } else { self.core(wait) };
        match now {
            Some(mut c) => self.take_in(&mut c, o),
            None => self.late.keep(o),
        }
    }

    /// Keeps `o` in the queue of outcomes, to be taken in by the core lock's next holder, in order.
    pub fn keep_outcome(&self, o: Outcome) {
        self.late.keep(o);
    }

    fn take_in(&self, c: &mut Core, o: Outcome) {
        c.take_outcome(o);
        self.live_mrs.store(c.registrar.live_mrs(), SeqCst);
    }

    /// Takes in the outcomes kept meanwhile, oldest first (the core's lock is held).
    fn take_late(&self, c: &mut Core) {
        let Some(kept) = self.late.take_all() else { return };
        for o in kept {
            self.take_in(c, o);
            // after the MR count above: there is no moment in which a kept MR is in neither
            self.late.taken();
        }
    }

    /// Some MR may hold a registration of ours: a deregistration must look (no lock taken).
    pub fn may_hold_mrs(&self) -> bool {
        self.live_mrs.load(SeqCst) > 0 || self.late.pending() > 0
    }

    /// The MRs holding a registration, as the registrar counts them after a change made outside
    /// an outcome (a dereg's reference taken out, an explicit unregister).
    pub fn note_live_mrs(&self, n: usize) {
        self.live_mrs.store(n, SeqCst);
    }
}
