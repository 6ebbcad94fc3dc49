//! What verbs calls came to (`registrar::Outcome`), handed to the registrar under the core's
//! lock; where that lock is not had within the hooks' wait, kept here in order and taken in by
//! the lock's next holder before the queue of hooks' work is applied: that work (a free, an
//! unmap) came after the call's decision, so it must meet the registrar with the call's MR in it.
//! A dereg's fast path (`may_hold_mrs`) counts kept outcomes as MRs that may be ours.

use super::{Core, Pipeline};
use crate::registrar::Outcome;
use core::sync::atomic::{AtomicUsize, Ordering::*};
use std::time::Duration;

/// How long a hook waits for the outcome queue's own lock: it is only ever held to push or to
/// take the whole queue (a thread of the program stopped by a debugger in between is the only
/// way to find it held; the outcome is then lost, and said).
const QUEUE_WAIT: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(super) struct Late {
    outcomes: parking_lot::Mutex<Vec<Outcome>>,
    /// Outcomes kept and not yet taken in (the queue's length, read without its lock).
    pending: AtomicUsize,
}

impl Pipeline {
    /// Hands `o` to the registrar, now if the core's lock is had within `wait` (and `keep_only`
    /// is false: the tests' knob), else through the queue.
    pub fn settle(&self, o: Outcome, wait: Duration, keep_only: bool) {
        let now = if keep_only { None } else { self.core(wait) };
        match now {
            Some(mut c) => self.take_in(&mut c, o),
            None => self.keep(o),
        }
    }

    /// Keeps `o` in the queue, to be taken in by the core lock's next holder, in order.
    pub fn keep_outcome(&self, o: Outcome) {
        self.keep(o);
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
        // before the hook returns the MR: a dereg of it looks
        self.late.pending.fetch_add(1, SeqCst);
    }

    fn take_in(&self, c: &mut Core, o: Outcome) {
        let Core { registrar, rm, .. } = c;
        registrar.take_outcome(rm, o);
        self.live_mrs.store(registrar.live_mrs(), SeqCst);
    }

    /// Takes in the outcomes kept meanwhile, oldest first (the core's lock is held).
    pub(super) fn take_late(&self, c: &mut Core) {
        if self.late.pending.load(SeqCst) == 0 {
            return;
        }
        let Some(mut q) = self.late.outcomes.try_lock_for(QUEUE_WAIT) else { return };
        let kept = core::mem::take(&mut *q);
        drop(q);
        for o in kept {
            self.take_in(c, o);
            // after the MR count above: there is no moment in which a kept MR is in neither
            self.late.pending.fetch_sub(1, SeqCst);
        }
    }

    /// Some MR may hold a registration of ours: a deregistration must look (no lock taken).
    pub fn may_hold_mrs(&self) -> bool {
        self.live_mrs.load(SeqCst) > 0 || self.late.pending.load(SeqCst) > 0
    }

    /// The MRs holding a registration, as the registrar counts them after a change made outside
    /// an outcome (a dereg's reference taken out, an explicit unregister).
    pub fn note_live_mrs(&self, n: usize) {
        self.live_mrs.store(n, SeqCst);
    }
}
