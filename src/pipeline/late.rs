//! What verbs calls came to (`registrar::Outcome`), handed to the registrar under the core's
//! lock; where that lock is not had within the hooks' wait, kept here in order and taken in by
//! the lock's next holder before the queue of hooks' work is applied: that work (a free, an
//! unmap) came after the call's decision, so it must meet the registrar with the call's MR in it.
//! A dereg's fast path (`may_hold_mrs`) counts kept outcomes as MRs that may be ours.

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

impl Late {
    /// Keeps `o` in order, before the hook returns what it concerns; an outcome the queue's own
    /// lock was not had for is lost, and said.
    pub(super) fn keep(&self, o: Outcome) {
        let Some(mut q) = self.outcomes.try_lock_for(QUEUE_WAIT) else {
            crate::log_limited!(
                crate::config::Level::Warn,
                "outcome lost",
                "the registrations' lock and its queue stayed taken: one MR's outcome is lost ({o:?}); its dma-buf or registration is kept until exit"
            );
            return;
        };
        q.push(o);
        // before the hook returns the MR: a dereg of it looks
        self.pending.fetch_add(1, SeqCst);
    }

    /// Every outcome kept so far, oldest first (`None`: none, or the queue's lock not had); each
    /// one counts as pending until [`taken`](Self::taken) says it was taken in.
    pub(super) fn take_all(&self) -> Option<Vec<Outcome>> {
        if self.pending.load(SeqCst) == 0 {
            return None;
        }
        let mut q = self.outcomes.try_lock_for(QUEUE_WAIT)?;
        Some(core::mem::take(&mut *q))
    }

    /// One outcome of [`take_all`](Self::take_all) was taken in.
    pub(super) fn taken(&self) {
        self.pending.fetch_sub(1, SeqCst);
    }

    /// Outcomes kept and not yet taken in.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(SeqCst)
    }
}
