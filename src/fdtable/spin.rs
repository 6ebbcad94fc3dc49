//! The one short wait of the fd table's gates and lock: the other side is inside one system
//! call (a close, an fstat, an export), so spin a little, then yield; never sleep, never block
//! in a way a signal handler or a fork handler could not.

/// Waits while `busy()` says so.
pub fn wait_while(mut busy: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while busy() {
        spins = spins.saturating_add(1);
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}
