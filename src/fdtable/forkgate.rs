//! Forks and the fds gdrshim is making: a fork waits until no other thread is between the call
//! that makes an fd of ours (an export's ioctl, an `open`) and its [`super::own::adopt`], and no
//! such call starts while a fork is being made. Between the two the fd exists and our table does
//! not name it yet; a child forked there would keep it (for an export: a dma-buf, and the GPU
//! memory behind it) where its copy of our table cannot tell it is ours, so nothing closes it.
//!
//! Counters and a thread's own count, no lock: the prepare handler waits only for other threads
//! (a signal handler's fork inside our own call does not wait for itself), and a thread that
//! finds a fork under way steps back before it begins.

use super::spin::wait_while;
use core::cell::Cell;
use core::sync::atomic::{AtomicU32, Ordering::SeqCst};

/// Calls that make an fd of ours, under way in the process.
static MAKING: AtomicU32 = AtomicU32::new(0);
/// Forks between their prepare handler and their parent handler.
static FORKING: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Of [`MAKING`], this thread's (more than one only in a signal handler inside our call).
    static MAKING_HERE: Cell<u32> = const { Cell::new(0) };
    /// Of [`FORKING`], this thread's: a signal handler's making inside its own fork's prepare
    /// handler does not wait for that fork (it ends, its fd adopted, before the fork goes on).
    static FORKING_HERE: Cell<u32> = const { Cell::new(0) };
}

/// Held from before the call that makes an fd of ours until that fd is adopted (or the call
/// failed): no fork happens meanwhile.
#[must_use]
pub struct Making(());

/// Waits while a fork is being made, then marks a call that makes an fd of ours as under way.
pub fn making() -> Making {
    let mine = FORKING_HERE.with(Cell::get);
    loop {
        wait_while(|| FORKING.load(SeqCst) > mine);
        MAKING.fetch_add(1, SeqCst);
        if FORKING.load(SeqCst) <= mine {
            break;
        }
        // a fork began in between: it waits for this count, so step back until it is made
        MAKING.fetch_sub(1, SeqCst);
    }
    MAKING_HERE.with(|m| m.set(m.get() + 1));
    Making(())
}

impl Drop for Making {
    fn drop(&mut self) {
        MAKING_HERE.with(|m| m.set(m.get().saturating_sub(1)));
        MAKING.fetch_sub(1, SeqCst);
    }
}

/// The prepare handler's part: no new call starts, and the other threads' finish first.
pub fn before_fork() {
    FORKING_HERE.with(|f| f.set(f.get() + 1));
    FORKING.fetch_add(1, SeqCst);
    let mine = MAKING_HERE.with(Cell::get);
    wait_while(|| MAKING.load(SeqCst) > mine);
}

/// In the parent after the fork (made or failed): calls may start again.
pub fn after_fork_in_parent() {
    FORKING.fetch_sub(1, SeqCst);
    FORKING_HERE.with(|f| f.set(f.get().saturating_sub(1)));
}

/// In the child: it has only this thread, and no fork under way.
pub fn after_fork_in_child() {
    FORKING.store(0, SeqCst);
    FORKING_HERE.with(|f| f.set(0));
    MAKING.store(MAKING_HERE.with(Cell::get), SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    /// (The counters are the process's: other tests that open files of ours may count in them
    /// meanwhile, so only this thread's own count is asserted exactly.)
    #[test]
    fn a_fork_waits_for_a_call_under_way_and_a_call_waits_for_a_fork() {
        // a call of this thread's own does not hold its fork back (a signal handler's fork)
        let here = making();
        before_fork();
        after_fork_in_parent();
        drop(here);
        assert_eq!(MAKING_HERE.with(Cell::get), 0);

        // another thread's call under way: the fork waits for it to end
        let started = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let t = {
            let (started, ended) = (started.clone(), ended.clone());
            std::thread::spawn(move || {
                let m = making();
                started.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                ended.store(true, SeqCst);
                drop(m);
            })
        };
        while !started.load(SeqCst) {
            std::thread::yield_now();
        }
        before_fork();
        assert!(ended.load(SeqCst), "the fork went on while another thread's call was under way");
        // and while the fork is under way, a new call waits for it
        let began = Arc::new(AtomicBool::new(false));
        let u = {
            let began = began.clone();
            std::thread::spawn(move || {
                let _m = making();
                began.store(true, SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!began.load(SeqCst), "a call began while a fork was under way");
        after_fork_in_parent();
        u.join().unwrap();
        t.join().unwrap();
        assert!(began.load(SeqCst));
    }

    /// A signal handler's making while its own thread is inside its fork's prepare handler
    /// (after this gate, while another library's prepare handler runs) does not wait for that
    /// fork, which cannot go on until the handler returns.
    #[test]
    fn a_making_inside_its_own_threads_fork_does_not_wait_for_it() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            before_fork();
            drop(making());
            after_fork_in_parent();
            done.send(()).unwrap();
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(10)).is_ok(),
            "deadlock: a making waited for its own thread's fork"
        );
    }
}
