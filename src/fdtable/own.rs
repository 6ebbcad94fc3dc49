//! gdrshim's own fds (its dma-bufs, its /dev/nvidiaN nodes, its log and capture files): taken
//! as ours the moment they exist ([`adopt`]), closed ([`close`]) only while their number is
//! still the file they were made as, and let go when the program closes or replaces the number
//! itself ([`program_closes`], [`program_closes_range`]: the `close`, `dup2`, `dup3`,
//! `close_range` and `closefrom` hooks).
//!
//! Each fd of ours carries the table's [`pages::OWN`] bit, and its file is kept beside it (a
//! side table a forked child can read without a lock). A program's close of a marked number and
//! our own check-then-close of it take one small lock, so neither can slip between the other's
//! check and its close. A number closed by a raw system call is out of every hook's sight: the
//! file check (`fstat`) before each use and each close still tells, since the number then names
//! another file or none.

use super::{closegate, forkgate};
use crate::fd::{FileId, OwnedFd};
use crate::sys::SignalsBlocked;
use core::ffi::c_int;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use gdrshim_common::fdpages as pages;

/// Held from before the call that makes an fd of ours until that fd is adopted (or the call
/// failed): no fork is made ([`forkgate`]) and no program close runs ([`closegate`]) meanwhile.
#[must_use]
pub struct Making {
    _fork: forkgate::Making,
    _closes: closegate::Creating,
}

/// Before a call that makes an fd of ours: see [`Making`].
pub fn making() -> Making {
    // the fork gate first: a fork waits for makers, and never holds back a program close
    let fork = forkgate::making();
    Making { _fork: fork, _closes: closegate::creating() }
}

/// The process whose fd table the marks describe (0: no fd of ours made yet): set at the first
/// adopt, and in a forked child.
static TABLE_PID: AtomicI32 = AtomicI32::new(0);

thread_local! {
    /// This thread unshared its fd table (`close_range` with `CLOSE_RANGE_UNSHARE`): its closes
    /// act on a copy from then on.
    static UNSHARED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// The pid by the system call (not a value libc may keep).
fn raw_getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Whether this thread's fd table is another than the one the marks describe: a `vfork` child
/// (CPython's `subprocess`, `posix_spawn`'s children share our memory, not our fd table) or a
/// thread that unshared its table. A close there closes nothing of ours: it changes no mark,
/// and no fd of ours is made, used or closed there. One system call: asked only where a mark is
/// at stake.
pub fn foreign_table() -> bool {
    if UNSHARED.with(core::cell::Cell::get) {
        return true;
    }
    let p = TABLE_PID.load(Relaxed);
    p != 0 && p != raw_getpid()
}

/// This thread's `close_range(.., CLOSE_RANGE_UNSHARE)` worked: its table is a copy from now
/// on. (Not in a `vfork` child: it runs on its parent thread's thread-local memory.) A process
/// with fds of ours has CUDA's threads sharing its table, so the kernel did copy it.
pub fn unshared_by_this_thread() {
    if !foreign_table() {
        UNSHARED.with(|u| u.set(true));
    }
}

/// The thread holding the lock (its tid), 0 when free.
static HOLDER: AtomicI32 = AtomicI32::new(0);

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The lock, held while it lives, with the thread's signals blocked from before it is taken to
/// after it is given back ([`SignalsBlocked`]; not while waiting for it): no signal handler runs
/// on a thread that holds it, so none can make or use an fd of ours there and wait for a maker
/// that waits for this lock (`closegate`). A signal waits as long as the lock is held: a close
/// or fstat of ours, a log line, or the program's own close of a number of ours (or its
/// `closefrom` over one: the program's files in the range are closed under it too). Taken
/// again by the thread that holds it (a fork's prepare handler holds it with signals as they
/// were, and a handler may run in the fork), it is simply not taken: that thread cannot wait for
/// itself.
struct Held {
    taken: bool,
    _signals: Option<SignalsBlocked>,
}

fn lock() -> Held {
    // never gives up: a lock is always got
    lock_or_give_up(|| false).unwrap_or(Held { taken: false, _signals: None })
}

/// The lock, or `None` as soon as `give_up()` says so while another thread holds it.
fn lock_or_give_up(give_up: impl Fn() -> bool) -> Option<Held> {
    let me = tid();
    if HOLDER.load(Relaxed) == me {
        return Some(Held { taken: false, _signals: None });
    }
    loop {
        // blocked first: a handler between the taking and the blocking would hold the lock too
        let signals = SignalsBlocked::new();
        if HOLDER.compare_exchange(0, me, Acquire, Relaxed).is_ok() {
            return Some(Held { taken: true, _signals: Some(signals) });
        }
        // taken: wait with the signals as they were, until it is free or we give up
        drop(signals);
        let mut gave_up = false;
        super::spin::wait_while(|| {
            let busy = HOLDER.load(Relaxed) != 0;
            gave_up = busy && give_up();
            busy && !gave_up
        });
        if gave_up {
            // (nothing was taken: no `Held` is made, whose drop would free the holder's lock)
            return None;
        }
    }
}

/// The lock, unless a fork holds it (from its prepare handler to its parent handler): `None`
/// then, at once. For the log's lines: a thread that writes one may be inside libcuda holding a
/// lock of libcuda's that another fork handler, run while ours holds this lock, waits for; a
/// line is worth less than that wait.
fn lock_unless_forking() -> Option<Held> {
    lock_or_give_up(|| HELD_FOR_FORK.load(Relaxed))
}

impl Drop for Held {
    fn drop(&mut self) {
        // given back, then the signals (the field's drop, after this)
        if self.taken {
            HOLDER.store(0, Release);
        }
    }
}

/// The file `fd` is now (`None`: no open file). Keeps errno.
pub fn file_of(fd: c_int) -> Option<FileId> {
    let e = crate::sys::errno();
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into st only.
    let ok = unsafe { libc::fstat64(fd, &mut st) } == 0;
    crate::sys::set_errno(e);
    ok.then_some(FileId { dev: st.st_dev, ino: st.st_ino, rdev: st.st_rdev })
}

/// The close system call itself: no cancellation point (a thread cancelled inside it would keep
/// the lock), errno kept.
fn raw_close(fd: c_int) {
    let e = crate::sys::errno();
    // SAFETY: a close of a number; nothing else is touched.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    crate::sys::set_errno(e);
}

/// Takes `fd`, made for gdrshim just now (opened by it, or created by RM for it), as its own:
/// `None` where the number names no open file any more (the program closed it meanwhile).
pub fn adopt(fd: c_int) -> Option<OwnedFd> {
    if fd < 0 {
        return None;
    }
    if TABLE_PID.load(Relaxed) == 0 {
        TABLE_PID.store(raw_getpid(), Relaxed);
    }
    if foreign_table() {
        // made in a table no mark describes (it is O_CLOEXEC: the child's exec closes it)
        return None;
    }
    let _l = lock();
    // marked first: from here on a program's close of the number waits for this lock
    let marked = pages::mark_own(fd);
    let Some(file) = file_of(fd) else {
        pages::clear_own(fd);
        return None;
    };
    if marked {
        idents::set(fd, file);
    }
    Some(OwnedFd::new(fd, file))
}

/// Whether `fd`'s number is still ours and still its file.
pub fn is_ours(fd: &OwnedFd) -> bool {
    pages::is_own(fd.num()) && file_of(fd.num()) == Some(fd.file())
}

/// Closes `fd` if its number is still ours and its file; `false`: the program closed it (the
/// number is another file now, or none), and it is left alone.
pub fn close(fd: OwnedFd) -> bool {
    let (n, file) = fd.into_parts();
    if foreign_table() {
        return false;
    }
    let _l = lock();
    if !pages::is_own(n) || file_of(n) != Some(file) {
        return false;
    }
    idents::clear(n);
    raw_close(n);
    // (after the close: until then a program's close of the number waits for the lock)
    pages::clear_own(n);
    true
}

/// Reads into `buf` from `fd` while its number is still ours and its file (under the lock, as
/// [`Kept::write_all`] writes: the program cannot close the number and open its own file there
/// halfway): the bytes read (0 at the end), or `None` where the number is not ours any more or
/// the read failed. A raw system call: no cancellation point; errno kept.
pub fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    if foreign_table() {
        return None;
    }
    let _l = lock();
    if !is_ours(fd) {
        return None;
    }
    let e = crate::sys::errno();
    // SAFETY: buf is valid for writes of buf.len() bytes; a read system call on our own fd.
    let n = unsafe { libc::syscall(libc::SYS_read, fd.num(), buf.as_mut_ptr(), buf.len()) };
    crate::sys::set_errno(e);
    usize::try_from(n).ok()
}

/// Numbers of ours in use for one call ([`using`]): while it lives, a program close, `dup2` or
/// `dup3` over one of them waits.
#[must_use]
pub struct Using {
    _in_use: closegate::InUse,
}

/// Before a call that uses numbers of ours after checking them (the NIC's registration of a
/// kept dma-buf: the kernel pins whatever file the number names then): `fds` (at most two, each
/// its number and the file it was made as) are published as in use, then checked to be still
/// ours and their files. From here until the value is dropped, a program close whose range
/// covers one of them waits for it (closes of other numbers do not), so the call gets the file
/// checked. `None`: one is not ours any more (the program closed it before): use none of them.
/// (The check costs one `fstat` a number.)
pub fn using(fds: &[(c_int, FileId)]) -> Option<Using> {
    let mut nums = [-1; 2];
    for (n, (fd, _)) in nums.iter_mut().zip(fds) {
        *n = *fd;
    }
    let in_use = closegate::using(&nums[..fds.len().min(2)]);
    let ours = fds.iter().all(|&(n, f)| pages::is_own(n) && file_of(n) == Some(f));
    ours.then_some(Using { _in_use: in_use })
}

/// Hands `fd` to a caller: the number is the caller's from now on, and no longer marked ours.
pub fn hand_out(fd: OwnedFd) -> c_int {
    let (n, file) = fd.into_parts();
    if foreign_table() {
        return n;
    }
    let _l = lock();
    if pages::is_own(n) && file_of(n) == Some(file) {
        idents::clear(n);
        pages::clear_own(n);
    }
    n
}

/// The program closes (or makes a dup over) `fd` itself, by `real`; `closed` tells from
/// `real`'s result whether the number was closed or replaced. Where the number is ours, it is
/// ours no longer once `real` did so (never before: a call that fails leaves it ours), and
/// `real` runs under the lock, so that our own check-then-close of the number cannot meet it
/// halfway. No fd of ours is made meanwhile ([`closegate`]). In a table the marks do not
/// describe (a `vfork` child) nothing changes. Whether it was ours, with `real`'s result.
pub fn program_closes<R>(
    fd: c_int,
    real: impl FnOnce() -> R,
    closed: impl FnOnce(&R) -> bool,
) -> (bool, R) {
    let _c = closegate::closing(fd, fd, foreign_table);
    if !pages::is_own(fd) || foreign_table() {
        return (false, real());
    }
    let _l = lock();
    let r = real();
    let was = closed(&r) && pages::clear_own(fd);
    if was {
        idents::clear(fd);
    }
    (was, r)
}

/// [`program_closes`] for every number in `[first, last]` (`close_range`, `closefrom`), with
/// `after` run at once after `real` (forgetting the range), while no fd of ours can be made.
pub fn program_closes_range<R>(
    first: c_int,
    last: c_int,
    real: impl FnOnce() -> R,
    closed: impl FnOnce(&R) -> bool,
    after: impl FnOnce(&R),
) -> R {
    let _c = closegate::closing(first, last, foreign_table);
    let mut any = false;
    pages::each_own(|fd| any |= fd >= first && fd <= last);
    if !any || foreign_table() {
        let r = real();
        after(&r);
        return r;
    }
    let _l = lock();
    let r = real();
    if closed(&r) {
        pages::each_own(|fd| {
            if fd >= first && fd <= last {
                pages::clear_own(fd);
                idents::clear(fd);
            }
        });
    }
    after(&r);
    r
}

/// A file gdrshim writes to for as long as it is its own (the log, the capture), where any thread
/// reads it: its number and file.
pub struct Kept {
    num: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Kept {
    pub const fn none() -> Kept {
        Kept { num: AtomicI32::new(-1), dev: AtomicU64::new(0), ino: AtomicU64::new(0) }
    }

    /// Keeps `fd`, where none is kept yet (else `fd` is closed).
    pub fn keep(&self, fd: OwnedFd) {
        if self.num().is_some() {
            close(fd);
            return;
        }
        let (n, f) = fd.into_parts();
        self.dev.store(f.dev, Relaxed);
        self.ino.store(f.ino, Relaxed);
        self.num.store(n, Release);
    }

    /// The number while one is kept.
    pub fn num(&self) -> Option<c_int> {
        let n = self.num.load(Acquire);
        (n >= 0).then_some(n)
    }

    /// Writes all of `bytes` while the number is still our file (under the lock: the program
    /// cannot close it and open its own file at the number halfway); `false`: none is kept any
    /// more (the program closed it: it is let go from now on). No cancellation point. While a
    /// fork holds the lock the line is dropped, never waited for ([`lock_unless_forking`]).
    pub fn write_all(&self, bytes: &[u8]) -> bool {
        let Some(n) = self.num() else { return false };
        let file = (self.dev.load(Relaxed), self.ino.load(Relaxed));
        let foreign = foreign_table();
        // (a vfork child has one thread, and no thread of ours closes in its table: no lock)
        let _l = if foreign {
            None
        } else {
            match lock_unless_forking() {
                Some(held) => Some(held),
                // a fork is being made: the line is dropped, the file stays kept
                None => return true,
            }
        };
        if !pages::is_own(n) || file_of(n).map(|f| (f.dev, f.ino)) != Some(file) {
            if foreign {
                // the child's table, not the parent's: the line is dropped, the file stays kept
                return true;
            }
            let _ = self.num.compare_exchange(n, -1, AcqRel, Acquire);
            return false;
        }
        let e = crate::sys::errno();
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: the slice is valid for reads of len - off bytes; a raw write system call.
            let w = unsafe {
                libc::syscall(libc::SYS_write, n, bytes[off..].as_ptr(), bytes.len() - off)
            };
            if w <= 0 {
                break;
            }
            off += w as usize;
        }
        crate::sys::set_errno(e);
        true
    }
}

/// Whether the lock is held across a fork by [`before_fork`] (not taken there again by its holder).
static HELD_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// Before a fork (the `pthread_atfork` prepare handler): the calls that make an fd of ours end
/// and none starts ([`forkgate`]); then the lock is taken, and kept until
/// [`after_fork_in_parent`] or [`close_all_in_child`], so that no adopt, check-then-close or
/// program's close of a number of ours is halfway while the child is made. The kernel copies
/// the fd table before the memory: a number of ours another thread closed in between would be
/// open in the child while our table there says it is not ours, and the child would keep that
/// dma-buf (and the GPU memory behind it) for its life. A short wait: the holder is inside one
/// close, fstat or write.
pub fn before_fork() {
    // first the calls that make an fd of ours (they take the lock to adopt it)
    forkgate::before_fork();
    // taken with the signals as they are: the child and the parent each go on with the
    // program's mask, and the lock is given back by the fork handlers, not by a drop
    let me = tid();
    if HOLDER.load(Relaxed) == me {
        // held already: by this thread's own fork, whose prepare handler a signal handler's
        // fork interrupted (the outer fork gives it back, not this one), or left to its holder
        if HELD_FOR_FORK.load(Relaxed) {
            NESTED_FORKS.fetch_add(1, Relaxed);
        }
        return;
    }
    super::spin::wait_while(|| HOLDER.compare_exchange_weak(0, me, Acquire, Relaxed).is_err());
    HELD_FOR_FORK.store(true, Relaxed);
}

/// Forks made by a signal handler inside the forking thread's own fork (while it holds the lock
/// for it): their parent handlers leave the lock to the outer fork.
static NESTED_FORKS: AtomicU32 = AtomicU32::new(0);

/// After a fork, in the parent: the lock [`before_fork`] took is given back.
pub fn after_fork_in_parent() {
    let nested = NESTED_FORKS.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok();
    if !nested && HELD_FOR_FORK.swap(false, Relaxed) {
        HOLDER.store(0, Release);
    }
    forkgate::after_fork_in_parent();
}

/// In a child just forked: every fd of ours is closed (the GPU memory behind a dma-buf lives as
/// long as any copy of its fd), the lock is free (its holder, if any, is a thread the child does
/// not have). Only numbers that are still the file we made are closed. No lock, no allocation.
pub fn close_all_in_child() {
    HELD_FOR_FORK.store(false, Relaxed);
    NESTED_FORKS.store(0, Relaxed);
    HOLDER.store(0, Relaxed);
    TABLE_PID.store(raw_getpid(), Relaxed);
    UNSHARED.with(|u| u.set(false));
    forkgate::after_fork_in_child();
    closegate::after_fork_in_child();
    pages::each_own(|fd| {
        let same = idents::get(fd)
            .is_some_and(|was| file_of(fd).is_some_and(|now| (now.dev, now.ino) == was));
        if same {
            raw_close(fd);
        }
        pages::clear_own(fd);
        idents::clear(fd);
    });
}

/// The file of each fd of ours, by number: (dev, ino) in pages of 4096 numbers mapped when an fd
/// of ours first lands in them, read by a forked child without a lock.
mod idents {
    use super::*;

    const PAGE: usize = 4096;
    const PAGES: usize = (i32::MAX as usize + 1) / PAGE;
    type Slot = [AtomicU64; 2];
    static DIR: AtomicPtr<AtomicPtr<Slot>> = AtomicPtr::new(core::ptr::null_mut());

    fn map<T>(slot: &AtomicPtr<T>, bytes: usize, create: bool) -> Option<*mut T> {
        let p = slot.load(Acquire);
        if !p.is_null() || !create {
            return (!p.is_null()).then_some(p);
        }
        let e = crate::sys::errno();
        // SAFETY: an anonymous private zeroed mapping of `bytes`; checked below.
        let m = unsafe {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            libc::mmap64(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        crate::sys::set_errno(e);
        if m == libc::MAP_FAILED {
            return None;
        }
        match slot.compare_exchange(core::ptr::null_mut(), m.cast(), AcqRel, Acquire) {
            Ok(_) => Some(m.cast()),
            Err(other) => {
                // SAFETY: our own mapping of `bytes`, never shared.
                unsafe { libc::munmap(m, bytes) };
                Some(other)
            }
        }
    }

    fn slot(fd: c_int, create: bool) -> Option<&'static Slot> {
        let fd = usize::try_from(fd).ok()?;
        let dir = map(&DIR, PAGES * core::mem::size_of::<AtomicPtr<Slot>>(), create)?;
        // SAFETY: a live zeroed mapping of PAGES pointers, never unmapped; fd / PAGE < PAGES.
        let page = unsafe { &*dir.add(fd / PAGE) };
        let p = map(page, PAGE * core::mem::size_of::<Slot>(), create)?;
        // SAFETY: a live zeroed mapping of PAGE slots, never unmapped; zeros are valid atomics.
        Some(unsafe { &*p.add(fd % PAGE) })
    }

    pub fn set(fd: c_int, f: FileId) {
        if let Some(s) = slot(fd, true) {
            s[0].store(f.dev, Relaxed);
            s[1].store(f.ino, Relaxed);
        }
    }
    pub fn clear(fd: c_int) {
        if let Some(s) = slot(fd, false) {
            s[0].store(0, Relaxed);
            s[1].store(0, Relaxed);
        }
    }
    pub fn get(fd: c_int) -> Option<(u64, u64)> {
        let s = slot(fd, false)?;
        let v = (s[0].load(Relaxed), s[1].load(Relaxed));
        (v != (0, 0)).then_some(v)
    }
}

#[cfg(test)]
mod tests;
