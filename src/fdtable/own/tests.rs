//! The fd table's lock and marks: what the program's closes, our checks and signals do to them.
use super::*;

fn memfd() -> c_int {
    // SAFETY: a name and flags; memfd_create has no other preconditions.
    unsafe { libc::memfd_create(c"gdrshim-own-test".as_ptr(), libc::MFD_CLOEXEC) }
}

/// An fd of ours the program closed, and whose number now names the program's own file, is
/// never closed by us; one still ours is.
#[test]
fn only_a_number_that_is_still_our_file_is_closed() {
    let dup2 = |from: c_int, to: c_int| {
        // SAFETY: dup2 of two numbers of this test's own.
        unsafe { libc::dup2(from, to) }
    };
    // the program makes a dup over our number through the hook: its file there now
    let ours = adopt(memfd()).expect("a fresh fd");
    let (n, theirs) = (ours.num(), memfd());
    let (was, r) = program_closes(n, || dup2(theirs, n), |&r| r == n);
    assert!(was && r == n, "the number was ours");
    assert!(!is_ours(&ours), "the number is the program's file now");
    assert!(!close(ours), "not closed");
    assert!(file_of(n).is_some(), "the program's file is open");
    raw_close(n);
    // the same behind every hook (a raw dup2): the file check tells
    let ours = adopt(memfd()).expect("a fresh fd");
    let n = ours.num();
    assert_eq!(dup2(theirs, n), n);
    assert!(!is_ours(&ours) && !close(ours), "another file at our number");
    assert!(file_of(n).is_some());
    raw_close(n);
    raw_close(theirs);
    // still ours: closed, and the mark gone
    let ours = adopt(memfd()).expect("a fresh fd");
    let n = ours.num();
    assert!(close(ours));
    assert!(!pages::is_own(n));
}

/// A fork holds the lock from its prepare handler to its parent handler; where the forking
/// thread holds it already (a signal handler's fork inside our close), it is left to that
/// close.
#[test]
fn a_fork_holds_the_lock_and_gives_it_back() {
    before_fork();
    assert_eq!(HOLDER.load(Relaxed), tid(), "held across the fork");
    after_fork_in_parent();
    assert_ne!(HOLDER.load(Relaxed), tid(), "given back in the parent");
    let close = lock();
    before_fork();
    after_fork_in_parent();
    assert_eq!(HOLDER.load(Relaxed), tid(), "still the close's");
    drop(close);
    assert_ne!(HOLDER.load(Relaxed), tid());
}

/// A signal handler's fork inside its thread's own fork (between the prepare and the parent
/// handler) leaves the lock to the outer fork: given back by the outer parent handler only.
#[test]
fn a_fork_inside_a_fork_leaves_the_lock_to_the_outer_one() {
    std::thread::spawn(|| {
        before_fork();
        // the handler's fork
        before_fork();
        after_fork_in_parent();
        assert_eq!(HOLDER.load(Relaxed), tid(), "still held for the outer fork");
        after_fork_in_parent();
        assert_ne!(HOLDER.load(Relaxed), tid(), "given back by the outer fork");
    })
    .join()
    .unwrap();
}

/// A use is granted only while the number is still ours and its file; one the program made
/// a dup over is refused, and a program close of a number in use waits for the use.
#[test]
fn a_number_is_used_only_while_it_is_ours_and_closes_of_it_wait() {
    let ours = adopt(memfd()).expect("a fresh fd");
    let (n, file) = (ours.num(), ours.file());
    let in_use = using(&[(n, file)]).expect("ours");
    let closer = std::thread::spawn(move || {
        let theirs = memfd();
        // SAFETY: a dup2 of two numbers of this test's own.
        let (was, r) = program_closes(n, || unsafe { libc::dup2(theirs, n) }, |&r| r == n);
        raw_close(theirs);
        (was, r)
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!closer.is_finished(), "a dup over a number in use went on during the use");
    assert_eq!(file_of(n), Some(file));
    drop(in_use);
    assert_eq!(closer.join().unwrap(), (true, n));
    assert!(using(&[(n, file)]).is_none(), "the program's file now");
    assert!(!close(ours));
    raw_close(n);
}

/// A signal that comes while its thread holds the lock is handled once the lock is given
/// back. Its handler's making (an export in a handler) waits for another thread's making,
/// which waits for this lock to adopt its fd: run while the lock was held, the two would wait
/// for each other for ever. Run in a forked child, so that a deadlock fails this test alone.
#[test]
fn a_signal_handler_never_runs_while_its_thread_holds_the_lock() {
    use core::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};
    static HANDLED: AtomicBool = AtomicBool::new(false);
    static HANDLED_WHILE_HELD: AtomicBool = AtomicBool::new(false);
    extern "C" fn handler(_: c_int) {
        HANDLED_WHILE_HELD.store(HOLDER.load(SeqCst) == tid(), SeqCst);
        drop(making());
        HANDLED.store(true, SeqCst);
    }
    fn in_child() -> i32 {
        // the gates as a fork handler leaves them: this thread alone, nothing held
        close_all_in_child();
        // SAFETY: a zeroed sigaction with a handler that is async-signal-safe (atomics,
        // gettid and the gates' spin), in this child only.
        unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = handler as extern "C" fn(c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            if libc::sigaction(libc::SIGUSR2, &sa, core::ptr::null_mut()) != 0 {
                return 10;
            }
        }
        let held = lock();
        let maker = std::thread::spawn(|| {
            let m = making();
            let fd = adopt(memfd());
            drop(m);
            fd.map(close)
        });
        let t0 = Instant::now();
        while closegate::maker_now() == 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: a signal to this very thread, whose handler is installed above.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
        std::thread::sleep(Duration::from_millis(20));
        let early = HANDLED.load(SeqCst);
        drop(held);
        let closed = maker.join().ok().flatten();
        match (early || HANDLED_WHILE_HELD.load(SeqCst), HANDLED.load(SeqCst), closed) {
            (true, _, _) => 1,
            (_, false, _) => 2,
            (_, _, Some(true)) => 0,
            _ => 3,
        }
    }
    // SAFETY: fork; the child runs `in_child` and leaves by _exit, never returning here.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let rc = crate::sys::contained(in_child).unwrap_or(100);
        // SAFETY: ends the child at once (no test harness, no atexit of the parent's).
        unsafe { libc::_exit(rc) };
    }
    let t0 = Instant::now();
    let mut status = 0;
    // SAFETY: waits for our own child, without blocking.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if t0.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above, now that it is killed.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("deadlock: a handler ran while its thread held the lock");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let rc = libc::WEXITSTATUS(status);
    assert!(libc::WIFEXITED(status), "the child: status {status:#x}");
    let why = [
        "",
        "handled while the lock was held",
        "not handled once it was given back",
        "the other thread's fd was not adopted and closed",
    ];
    assert_eq!(rc, 0, "{}", why.get(rc as usize).copied().unwrap_or("the child panicked"));
}

/// The thread's signals are blocked while it holds the lock, but those the kernel forces on it
/// (faults, a seccomp filter's SIGSYS), and its mask is exactly what it was once the lock is
/// given back.
#[test]
fn the_lock_blocks_signals_while_held_and_restores_the_mask() {
    fn mask() -> libc::sigset_t {
        // SAFETY: reads this thread's mask into a zeroed set.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut set);
            set
        }
    }
    let blocked = |set: &libc::sigset_t, sig| {
        // SAFETY: a query of a valid set.
        unsafe { libc::sigismember(set, sig) == 1 }
    };
    std::thread::spawn(move || {
        // the program's own mask: SIGUSR2 blocked, SIGUSR1 not
        // SAFETY: a set built here; changes this thread's mask only.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, core::ptr::null_mut());
        }
        let before = mask();
        let held = lock();
        let during = mask();
        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
            assert!(blocked(&during, sig), "signal {sig} blocked while the lock is held");
        }
        for sig in
            [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS]
        {
            assert!(!blocked(&during, sig), "signal {sig} is forced by the kernel: left as it was");
        }
        drop(held);
        let after = mask();
        for sig in 1..=64 {
            assert_eq!(blocked(&before, sig), blocked(&after, sig), "signal {sig} as it was");
        }
    })
    .join()
    .unwrap();
}

/// A thread that gives up waiting for the lock (a log line while a fork holds it) takes
/// nothing, and so gives nothing back: the holder keeps it.
#[test]
fn giving_up_on_the_lock_leaves_it_to_its_holder() {
    use std::sync::mpsc::channel;
    let (tell, told) = channel();
    let (release, released) = channel::<()>();
    let holder = std::thread::spawn(move || {
        let held = lock();
        tell.send(tid()).unwrap();
        released.recv().unwrap();
        drop(held);
    });
    let holder_tid = told.recv().unwrap();
    assert!(lock_or_give_up(|| true).is_none(), "given up while another thread holds it");
    assert_eq!(HOLDER.load(Relaxed), holder_tid, "still the holder's");
    release.send(()).unwrap();
    holder.join().unwrap();
    assert!(lock_or_give_up(|| true).is_some(), "free: taken at once");
}

#[test]
fn a_number_handed_out_is_the_callers() {
    let ours = adopt(memfd()).expect("a fresh fd");
    let n = hand_out(ours);
    assert!(!pages::is_own(n) && file_of(n).is_some());
    assert!(!program_closes(n, || raw_close(n), |_| true).0, "not ours when the caller closes it");
}
