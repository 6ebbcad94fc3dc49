//! Outcomes of verbs calls that could not be told to the registrar at once: the core's lock was
//! not had within the hooks' wait (a hook never waits longer). They are kept here, in order,
//! and taken in by the next thread that holds the core, before it looks at anything else, so a
//! deregistration or a release always sees the registrations that came before it.

use super::Shim;
use crate::pipeline::Core;
use crate::registrar::Outcome;
use core::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

/// How long a hook waits for the queue's own lock: it is only ever held to push or take the
/// whole queue (a fork or a signal handler can still catch it held; then the outcome is lost,
/// and said).
const QUEUE_WAIT: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct Late {
    outcomes: parking_lot::Mutex<Vec<Outcome>>,
    /// Something is waiting: the holders of the core look at the queue only then.
    waiting: AtomicBool,
}

impl Shim {
    /// Hands `o` to the registrar now, or keeps it for the core's next holder.
    pub(crate) fn settle(&self, o: Outcome) {
        let now = if self.settles_late() { None } else { self.core(super::serve::WAIT) };
        match now {
            Some(mut c) => self.take_in(&mut c, o),
            None => self.keep(o),
        }
    }

    fn keep(&self, o: Outcome) {
        let Some(mut q) = self.late.outcomes.try_lock_for(QUEUE_WAIT) else {
            crate::log_limited!(
                crate::config::Level::Warn,
                "outcome lost",
                "the registrations' lock and its queue stayed taken: one MR's outcome is lost ({o:?}); its dma-buf or registration is kept until exit"
            );
            return;
        };
        q.push(o);
        self.late.waiting.store(true, Release);
    }

    fn take_in(&self, c: &mut Core, o: Outcome) {
        let Core { registrar, rm, .. } = c;
        registrar.take_outcome(rm, o);
        self.live_mrs.store(registrar.live_mrs(), Relaxed);
    }

    /// Takes in the outcomes kept meanwhile, oldest first (the core's lock is held).
    pub(crate) fn take_late(&self, c: &mut Core) {
        if !self.late.waiting.load(Acquire) {
            return;
        }
        let Some(mut q) = self.late.outcomes.try_lock_for(QUEUE_WAIT) else { return };
        let kept = core::mem::take(&mut *q);
        self.late.waiting.store(false, Release);
        drop(q);
        for o in kept {
            self.take_in(c, o);
        }
    }

    /// Some MR may hold a registration of ours: a deregistration must look (no lock taken).
    pub fn may_hold_mrs(&self) -> bool {
        self.live_mrs.load(Relaxed) > 0 || self.late_pending()
    }

    /// Outcomes wait to be taken in: an MR may be ours though the table has none yet.
    pub(crate) fn late_pending(&self) -> bool {
        self.late.waiting.load(Acquire)
    }

    /// GDRSHIM_TEST_SETTLE_LATE=1 (knobs builds): every outcome goes through the queue, as when
    /// the core's lock is not had in time.
    fn settles_late(&self) -> bool {
        #[cfg(feature = "knobs")]
        return self.cfg.knobs.settle_late;
        #[cfg(not(feature = "knobs"))]
        false
    }
}
