//! The program's closes and the fds gdrshim is making: between the call that makes an fd of ours
//! (an export's ioctl, an `open`) and its [`super::own::adopt`], the new number is not marked
//! ours yet. A program's `closefrom`, `close_range` or `close` of a number it does not hold
//! could close it there, and its next `open` take the number: we would then adopt, use and
//! one day close the program's file. An identity check after the fact cannot tell: a GPU node
//! the program opened itself is the same (dev, ino, rdev) as ours, and a dma-buf of its own is a
//! dma-buf. So the two never overlap: a call that makes an fd of ours waits until no program
//! close is under way and holds new ones back until its fd is adopted ([`creating`]); a program
//! close waits while one is ([`closing`]). Program closes never wait for each other, so a close
//! that blocks (a lingering socket, a flush on NFS) holds back only gdrshim's next export.
//!
//! Counters and a thread's own count, no lock (as `forkgate`): a signal handler's close inside
//! our own making, or our making inside a handler that interrupted a close, does not wait for
//! itself.

use core::cell::Cell;
use core::sync::atomic::{
    AtomicI32, AtomicU32,
    Ordering::{Relaxed, SeqCst},
};

/// Program closes under way in the process.
static CLOSING: AtomicU32 = AtomicU32::new(0);
/// The thread (its tid) making an fd of ours, 0 when none.
static CREATING: AtomicI32 = AtomicI32::new(0);

thread_local! {
    /// Of [`CLOSING`], this thread's.
    static CLOSING_HERE: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Held by a program close (the `close` family's hooks) for the whole call: no fd of ours is
/// made meanwhile.
#[must_use]
pub struct Closing(());

/// Waits while an fd of ours is being made, then marks a program close as under way.
pub fn closing() -> Closing {
    loop {
        CLOSING.fetch_add(1, SeqCst);
        let maker = CREATING.load(SeqCst);
        if maker == 0 || maker == tid() {
            break;
        }
        // gdrshim is making an fd: it waits for this count, so step back until it is adopted
        CLOSING.fetch_sub(1, SeqCst);
        wait_while(|| CREATING.load(SeqCst) != 0);
    }
    CLOSING_HERE.with(|c| c.set(c.get() + 1));
    Closing(())
}

impl Drop for Closing {
    fn drop(&mut self) {
        CLOSING_HERE.with(|c| c.set(c.get().saturating_sub(1)));
        CLOSING.fetch_sub(1, SeqCst);
    }
}

/// Held from before the call that makes an fd of ours until that fd is adopted (or the call
/// failed): no program close runs meanwhile.
#[must_use]
pub struct Creating(bool);

/// Waits for the program closes under way (other threads'), and holds new ones back.
pub fn creating() -> Creating {
    let me = tid();
    if CREATING.load(Relaxed) == me {
        return Creating(false);
    }
    wait_while(|| CREATING.compare_exchange(0, me, SeqCst, Relaxed).is_err());
    let mine = CLOSING_HERE.with(Cell::get);
    wait_while(|| CLOSING.load(SeqCst) > mine);
    Creating(true)
}

impl Drop for Creating {
    fn drop(&mut self) {
        if self.0 {
            CREATING.store(0, SeqCst);
        }
    }
}

/// In a forked child: it has only this thread.
pub fn after_fork_in_child() {
    CREATING.store(0, SeqCst);
    CLOSING.store(CLOSING_HERE.with(Cell::get), SeqCst);
}

/// A short wait: the other side is inside one system call.
fn wait_while(mut busy: impl FnMut() -> bool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_making_waits_for_a_close_under_way_and_a_close_waits_for_a_making() {
        // this thread's own close does not hold its making back (a signal handler's export)
        let here = closing();
        drop(creating());
        drop(here);

        let started = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let t = {
            let (started, ended) = (started.clone(), ended.clone());
            std::thread::spawn(move || {
                let c = closing();
                started.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                ended.store(true, SeqCst);
                drop(c);
            })
        };
        while !started.load(SeqCst) {
            std::thread::yield_now();
        }
        let making = creating();
        assert!(ended.load(SeqCst), "an fd was made while a program close was under way");
        let began = Arc::new(AtomicBool::new(false));
        let u = {
            let began = began.clone();
            std::thread::spawn(move || {
                let _c = closing();
                began.store(true, SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!began.load(SeqCst), "a program close began while an fd was being made");
        drop(making);
        u.join().unwrap();
        t.join().unwrap();
        assert!(began.load(SeqCst));
    }
}
