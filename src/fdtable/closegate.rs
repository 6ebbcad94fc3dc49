//! The program's closes and the fds gdrshim is making or using.
//!
//! Making: between the call that makes an fd of ours (an export's ioctl, an `open`) and its
//! [`super::own::adopt`], the new number is not marked ours yet. A program's `closefrom`,
//! `close_range` or `close` of a number it does not hold could close it there, and its next
//! `open` take the number: we would then adopt, use and one day close the program's file. An
//! identity check after the fact cannot tell: a GPU node the program opened itself is the same
//! (dev, ino, rdev) as ours, and a dma-buf of its own is a dma-buf. So the two never overlap: a
//! call that makes an fd of ours waits until no program close is under way and holds new ones
//! back until its fd is adopted ([`creating`]); a program close waits while one is
//! ([`closing`]). Program closes never wait for each other, so a close that blocks (a lingering
//! socket, a flush on NFS) holds back only gdrshim's next export.
//!
//! Using: a number checked to be ours and then used (a kept dma-buf handed to
//! `ibv_reg_dmabuf_mr`, which pins whatever file the number names then) must stay ours until
//! the call returns. The numbers in use are published in a few slots ([`using`]) before the
//! check; a program close whose range covers one of them waits until that use ends, and a use
//! that began while closes were under way lets them end before its check. A close of any other
//! number reads one more counter ([`IN_USE`]), and scans the slots only while a use is under way.
//!
//! Counters, slots and a thread's own count, no lock (as `forkgate`): a signal handler's close
//! inside our own making or use, or our making inside a handler that interrupted a close, does
//! not wait for itself. Nor for another thread that waits for it: a thread that holds closes
//! and must wait (its handler makes an fd or closes while another thread makes one, or while a
//! number in its range is in use) parks those closes ([`PARKED`]) for the wait, and a maker does
//! not wait for parked closes. That is safe: a parked close's real call either ended before the
//! handler ran (its numbers were free before the fd being made took one) or runs after the
//! handler returns, and so after the fd being made is adopted; a close then forgets only what it
//! closed (`own`). And no handler runs where its thread holds the fd table's lock (`own` blocks
//! the thread's signals for it): there it would wait for a maker that waits for that lock.
//!
//! Left (a review of 2026-12-07; each needs a signal handler that exports or forks at a given
//! instruction): a handler between a gate's global and its thread's count (`closing`, the
//! `Closing` drop, `forkgate::making`) waits for its own thread; a handler that interrupts
//! `creating` after it took [`CREATING`] skips the wait for closes; the fork gate's waits are
//! not parked, so a handler's export inside a close can close a cycle with a maker and a fork;
//! a close parked in a handler is not waited for by a use. Blocking signals across each pair of
//! updates (as `own` does for its lock) would close them, at a system call pair per close.

use super::spin::wait_while;
use core::cell::Cell;
use core::ffi::c_int;
use core::sync::atomic::{
    AtomicI32, AtomicU32, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Program closes under way in the process.
static CLOSING: AtomicU32 = AtomicU32::new(0);
/// The thread (its tid) making an fd of ours, 0 when none.
static CREATING: AtomicI32 = AtomicI32::new(0);
/// Of [`CLOSING`], those whose threads wait (to make an fd, or to close) and so cannot end
/// before the maker does: it does not wait for them.
static PARKED: AtomicU32 = AtomicU32::new(0);
/// Slots taken in [`USES`]: while 0, a program close looks no further.
static IN_USE: AtomicU32 = AtomicU32::new(0);
/// The numbers of ours in use, one a slot: the using thread's tid in the high half, the number
/// in the low half; 0 when free (no thread has tid 0). A use takes at most two.
const USE_SLOTS: usize = 16;
static USES: [AtomicU64; USE_SLOTS] = [const { AtomicU64::new(0) }; USE_SLOTS];

thread_local! {
    /// Of [`CLOSING`], this thread's.
    static CLOSING_HERE: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Held by a program close (the `close` family's hooks) for the whole call: no fd of ours is
/// made meanwhile, and none of the range it closes is in use.
#[must_use]
pub struct Closing(());

/// Waits while an fd of ours is being made, and while another thread uses a number of ours in
/// `[first, last]` (unless `foreign`: the close acts on a table our marks do not describe, a
/// `vfork` child's), then marks a program close as under way.
pub fn closing(first: c_int, last: c_int, foreign: impl Fn() -> bool) -> Closing {
    loop {
        CLOSING.fetch_add(1, SeqCst);
        let maker = CREATING.load(SeqCst);
        if maker != 0 && maker != tid() {
            // gdrshim is making an fd: it waits for this count, so step back until it is adopted
            CLOSING.fetch_sub(1, SeqCst);
            parked_while(|| CREATING.load(SeqCst) != 0);
            continue;
        }
        if IN_USE.load(SeqCst) != 0 {
            let me = tid();
            if used_by_others(first, last, me) && !foreign() {
                // a number of the range is in a call of ours: step back (a use that begins
                // meanwhile waits for this count) until that call returns
                CLOSING.fetch_sub(1, SeqCst);
                parked_while(|| used_by_others(first, last, me));
                continue;
            }
        }
        break;
    }
    CLOSING_HERE.with(|c| c.set(c.get() + 1));
    Closing(())
}

/// Whether a thread other than `me` uses a number in `[first, last]`.
fn used_by_others(first: c_int, last: c_int, me: i32) -> bool {
    USES.iter().any(|slot| {
        let v = slot.load(SeqCst);
        let (user, fd) = ((v >> 32) as i32, v as u32 as c_int);
        v != 0 && user != me && fd >= first && fd <= last
    })
}

/// Held while numbers of ours are in use ([`using`]): a program close of one waits.
#[must_use]
pub struct InUse {
    /// The slots taken, with what each holds.
    taken: [(usize, u64); 2],
    count: usize,
}

/// Publishes `fds` (at most two numbers of ours) as in use, and lets the program closes under
/// way end: from its return until the value is dropped, no program close of them runs, so a
/// check made now that they are still ours holds for the call that uses them.
pub fn using(fds: &[c_int]) -> InUse {
    debug_assert!(fds.len() <= 2, "a use takes at most two slots");
    let me = u64::from(tid() as u32) << 32;
    let mut u = InUse { taken: [(0, 0); 2], count: 0 };
    for &fd in fds.iter().take(2) {
        let v = me | u64::from(fd as u32);
        IN_USE.fetch_add(1, SeqCst);
        let mut i = 0;
        // (a use is one call: a slot frees soon)
        parked_while(|| {
            let taken = USES[i].compare_exchange(0, v, SeqCst, Relaxed).is_ok();
            if !taken {
                i = (i + 1) % USE_SLOTS;
            }
            !taken
        });
        u.taken[u.count] = (i, v);
        u.count += 1;
    }
    // A close counted before the slots were published may not have seen them: let those end
    // (a close counted after sees them). Rare: a close under way at this very moment.
    let mine = CLOSING_HERE.with(Cell::get);
    if CLOSING.load(SeqCst) > mine {
        drop(creating());
    }
    u
}

impl Drop for InUse {
    fn drop(&mut self) {
        for &(i, v) in &self.taken[..self.count] {
            // (a forked child cleared every slot: nothing of it to give back there)
            if USES[i].compare_exchange(v, 0, SeqCst, Relaxed).is_ok() {
                IN_USE.fetch_sub(1, SeqCst);
            }
        }
    }
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
    parked_while(|| CREATING.compare_exchange(0, me, SeqCst, Relaxed).is_err());
    let mine = CLOSING_HERE.with(Cell::get);
    // (while this thread holds CREATING, PARKED only grows: a parked thread leaves it only once
    // it has waited for this one)
    wait_while(|| CLOSING.load(SeqCst) > mine + PARKED.load(SeqCst));
    Creating(true)
}

/// Waits while `busy()`, with this thread's closes (a signal handler's wait inside a close)
/// parked: a maker that waits for closes to end does not wait for these, which cannot end
/// before this wait does.
fn parked_while(busy: impl FnMut() -> bool) {
    let mine = CLOSING_HERE.with(Cell::get);
    if mine > 0 {
        PARKED.fetch_add(mine, SeqCst);
    }
    wait_while(busy);
    if mine > 0 {
        PARKED.fetch_sub(mine, SeqCst);
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        if self.0 {
            CREATING.store(0, SeqCst);
        }
    }
}

/// GDRSHIM_TEST_FD_USE_DELAY_US (knobs builds): µs spent between the check that a number is
/// ours and its use ([`widen_use_window`]); 0 in a release build.
#[cfg(feature = "knobs")]
static USE_DELAY_US: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Knobs builds: the delay [`widen_use_window`] spends (set once at start-up).
#[cfg(feature = "knobs")]
pub fn set_use_delay_us(us: u32) {
    USE_DELAY_US.store(us, Relaxed);
}

/// Between the check that a number is ours and the call that uses it: a knobs build may stand
/// still here, as a thread preempted there would (the tests' way to widen the window). A raw
/// `nanosleep`: no cancellation point, errno kept.
#[inline]
pub fn widen_use_window() {
    #[cfg(feature = "knobs")]
    {
        let us = USE_DELAY_US.load(Relaxed);
        if us > 0 {
            let e = crate::sys::errno();
            let t = libc::timespec {
                tv_sec: (us / 1_000_000) as libc::time_t,
                tv_nsec: (us % 1_000_000) as libc::c_long * 1000,
            };
            // SAFETY: a valid timespec; no remainder asked.
            unsafe {
                libc::syscall(libc::SYS_nanosleep, &t, core::ptr::null_mut::<libc::timespec>())
            };
            crate::sys::set_errno(e);
        }
    }
}

/// The thread making an fd of ours now (0: none), for the tests of `own`.
#[cfg(test)]
pub fn maker_now() -> i32 {
    CREATING.load(SeqCst)
}

/// In a forked child: it has only this thread, and none of the parent's uses.
pub fn after_fork_in_child() {
    CREATING.store(0, SeqCst);
    CLOSING.store(CLOSING_HERE.with(Cell::get), SeqCst);
    PARKED.store(0, SeqCst);
    for slot in &USES {
        slot.store(0, SeqCst);
    }
    IN_USE.store(0, SeqCst);
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
        let here = closing(0, c_int::MAX, || false);
        drop(creating());
        drop(here);

        let started = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let t = {
            let (started, ended) = (started.clone(), ended.clone());
            std::thread::spawn(move || {
                let c = closing(0, c_int::MAX, || false);
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
                let _c = closing(0, c_int::MAX, || false);
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

    /// What a signal handler does inside a program close on thread A (holding it) while thread B
    /// makes an fd and so waits for A's close: `then` (a making, another close) must not wait for
    /// B, which cannot go on until it returns. Other tests of this binary make fds too: while
    /// another thread's making holds B back, A parks its close (that maker may wait for it), and
    /// where B got through meanwhile, A tries again.
    fn inside_a_close_while_another_thread_makes(then: fn()) {
        use std::sync::mpsc::channel;
        let (done, finished) = channel();
        std::thread::spawn(move || loop {
            let outer = closing(0, c_int::MAX, || false);
            let made = Arc::new(AtomicBool::new(false));
            let (tell, told) = channel();
            let b = {
                let made = made.clone();
                std::thread::spawn(move || {
                    tell.send(tid()).unwrap();
                    let m = creating();
                    made.store(true, SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    drop(m);
                })
            };
            let maker = told.recv().unwrap();
            let waiting = loop {
                let holder = CREATING.load(SeqCst);
                if made.load(SeqCst) {
                    break false;
                }
                if holder == maker {
                    // B holds CREATING and has not returned: it waits for `outer`
                    break true;
                }
                if holder != 0 {
                    parked_while(|| CREATING.load(SeqCst) == holder);
                }
                std::thread::yield_now();
            };
            if waiting {
                then();
            }
            drop(outer);
            b.join().unwrap();
            if waiting {
                done.send(()).unwrap();
                return;
            }
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(20)).is_ok(),
            "deadlock: a wait inside a close waited for a maker that waited for that close"
        );
    }

    #[test]
    fn a_making_inside_a_close_does_not_wait_for_a_maker_that_waits_for_the_close() {
        inside_a_close_while_another_thread_makes(|| drop(creating()));
    }

    #[test]
    fn a_close_inside_a_close_does_not_wait_for_a_maker_that_waits_for_the_outer_one() {
        inside_a_close_while_another_thread_makes(|| drop(closing(0, c_int::MAX, || false)));
    }

    /// A close whose range covers a number in another thread's use waits for that use to end;
    /// a close of other numbers, the using thread's own close and a close in a foreign table
    /// (a vfork child's) do not.
    #[test]
    fn a_close_of_a_number_in_use_waits_for_the_use() {
        const OURS: c_int = 1_000_001;
        let here = using(&[OURS]);
        drop(closing(OURS, OURS, || false));
        drop(here);

        let (started, ended) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let t = {
            let (started, ended) = (started.clone(), ended.clone());
            std::thread::spawn(move || {
                let u = using(&[7, OURS]);
                started.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(150));
                ended.store(true, SeqCst);
                drop(u);
            })
        };
        while !started.load(SeqCst) {
            std::thread::yield_now();
        }
        drop(closing(OURS + 1, c_int::MAX, || false));
        drop(closing(0, 6, || false));
        assert!(!ended.load(SeqCst), "a close of other numbers waited for the use");
        drop(closing(0, c_int::MAX, || true));
        assert!(!ended.load(SeqCst), "a close in a foreign table waited for the use");
        drop(closing(OURS - 5, OURS + 5, || false));
        assert!(ended.load(SeqCst), "a close of a number in use went on during the use");
        t.join().unwrap();
    }
}
