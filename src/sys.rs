//! The leaf every runtime layer stands on: the caller's errno, the mark that this thread is
//! inside gdrshim (so that our own calls bypass our hooks), the one wrapper every hook runs its
//! own work in ([`in_hook`]), a cheap clock, reading our own memory without faulting on a bad
//! pointer, and the allocator that puts the map's large tables on huge pages ([`HugeTables`]).
//! No other module of the crate is used here.

use core::cell::Cell;
use core::ffi::c_void;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside gdrshim, so calls we make ourselves bypass our hooks.
pub struct Guard(());
impl Guard {
    pub fn enter() -> Option<Guard> {
        IN_SHIM.with(|g| if g.replace(true) { None } else { Some(Guard(())) })
    }
}
impl Drop for Guard {
    fn drop(&mut self) {
        IN_SHIM.with(|g| g.set(false));
    }
}

/// Thread cancellation held off while it lives, as it was after. Taken around our own
/// calls that are cancellation points (`open`, `read`, `write`, `close` of our own files): a
/// deferred cancellation acted on inside gdrshim would unwind through Rust frames, which aborts
/// the process; held off, it waits for the program's own next cancellation point, as without us.
/// Not a system call: a flag of the thread's.
pub struct NoCancel(libc::c_int);
// glibc's (the libc crate does not declare it); <pthread.h>'s values
extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}
const PTHREAD_CANCEL_ENABLE: libc::c_int = 0;
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;
impl NoCancel {
    #[allow(clippy::new_without_default)]
    pub fn new() -> NoCancel {
        let mut old = PTHREAD_CANCEL_ENABLE;
        // SAFETY: changes only this thread's cancel state; old is a valid out-pointer.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}
impl Drop for NoCancel {
    fn drop(&mut self) {
        // SAFETY: restores this thread's state as it was (a pending cancellation stays pending:
        // setting the state is no cancellation point).
        unsafe { pthread_setcancelstate(self.0, core::ptr::null_mut()) };
    }
}

/// This thread's signals blocked while it lives (all but those the kernel forces on the thread
/// that raised them: blocked, it would kill the process instead), the old mask back after.
/// Taken around the fd table's lock (`fdtable::own`): a handler that ran while its thread holds
/// that lock and then made or used an fd of ours would wait for a maker on another thread that
/// waits for the lock. Blocked, the signal waits while the lock is held (a close, an fstat, a
/// log line) and is handled as it is given back. A raw `rt_sigprocmask`: no libc lock, no
/// cancellation point, errno kept. `None` inside: the call failed, and nothing is restored.
pub struct SignalsBlocked(Option<u64>);
/// The signals the kernel forces on the thread that raised them: faults, and SIGSYS of a
/// seccomp filter that traps a system call (a sandbox emulating our `fstat`'s `newfstatat`).
/// The kernel's mask: bit `n - 1` for signal `n`.
const FORCED_SIGNALS: u64 = signal_bit(libc::SIGSEGV)
    | signal_bit(libc::SIGBUS)
    | signal_bit(libc::SIGFPE)
    | signal_bit(libc::SIGILL)
    | signal_bit(libc::SIGTRAP)
    | signal_bit(libc::SIGSYS);
const fn signal_bit(sig: libc::c_int) -> u64 {
    1 << (sig - 1)
}
// the kernel's sigset on x86-64 and arm64: 64 signals, 8 bytes
const KERNEL_SIGSET_BYTES: usize = 8;
impl SignalsBlocked {
    #[allow(clippy::new_without_default)]
    pub fn new() -> SignalsBlocked {
        let (set, mut old) = (!FORCED_SIGNALS, 0u64);
        let e = errno();
        // SAFETY: reads `set` and writes `old`, both 8-byte kernel sigsets; changes only this
        // thread's mask.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK,
                &set as *const u64,
                &mut old as *mut u64,
                KERNEL_SIGSET_BYTES,
            )
        };
        set_errno(e);
        SignalsBlocked((rc == 0).then_some(old))
    }
}
impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        let Some(old) = self.0 else { return };
        let e = errno();
        // SAFETY: reads the mask saved by `new`; sets this thread's mask back to it.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &old as *const u64,
                core::ptr::null_mut::<u64>(),
                KERNEL_SIGSET_BYTES,
            )
        };
        set_errno(e);
    }
}

/// Why a hook's own work gave no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contained {
    /// This thread is inside gdrshim already: our own call, or a hook inside a hook.
    Reentered,
    /// It panicked (the panic hook logged it); nothing unwound past the hook.
    Panicked,
}

/// A hook's own work, as every hook runs it: with this thread marked as inside gdrshim (our own
/// calls bypass our hooks), a panic contained (none unwinds across the C boundary), and the
/// caller's errno as it was. The core's state after a contained panic is what it was then
/// (parking_lot locks do not poison), and the hook goes on as without gdrshim.
#[inline(always)]
pub fn in_hook<R>(work: impl FnOnce() -> R) -> Result<R, Contained> {
    let Some(_inside) = Guard::enter() else { return Err(Contained::Reentered) };
    contained(work).ok_or(Contained::Panicked)
}

/// [`in_hook`] for code that holds the [`Guard`] itself: the `ioctl` hook (across the real call)
/// and the helper thread (for its life). Errno as it was, a panic contained; `None` if it
/// panicked.
#[inline(always)]
pub fn contained<R>(work: impl FnOnce() -> R) -> Option<R> {
    let e = errno();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).ok();
    set_errno(e);
    r
}

pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}
pub fn set_errno(e: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

thread_local! {
    /// This thread's stack `[low, high)`, asked once (`(0, 0)`: not yet; `(1, 1)`: unknown).
    static STACK: core::cell::Cell<(u64, u64)> = const { core::cell::Cell::new((0, 0)) };
}

fn stack_bounds() -> (u64, u64) {
    // SAFETY: attr is initialised by pthread_getattr_np before it is read, and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (1, 1);
        }
        let (mut addr, mut size) = (core::ptr::null_mut::<c_void>(), 0usize);
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() {
            return (1, 1);
        }
        (addr as u64, addr as u64 + size as u64)
    }
}

/// Whether `[addr, addr+len)` lies in this thread's stack above our own frame: the frames of our
/// callers, mapped and readable, so no system call is needed to read it safely. (Not when
/// running on a signal stack: then our frame is not in the thread's stack.)
#[inline(never)]
fn in_callers_frames(addr: u64, len: u64) -> bool {
    let probe = 0u8;
    let here = core::hint::black_box(core::ptr::addr_of!(probe)) as u64;
    let (lo, hi) = STACK.with(|s| {
        if s.get() == (0, 0) {
            s.set(stack_bounds());
        }
        s.get()
    });
    lo <= here && here < hi && here <= addr && addr.checked_add(len).is_some_and(|end| end <= hi)
}

/// Reads pieces `(offset, len)` of our own memory at `addr`, concatenated, without faulting on a
/// bad pointer: directly where it is in the callers' stack frames (libcuda's parameters are),
/// else with one `process_vm_readv`.
pub fn read_own_pieces(addr: u64, pieces: &[(usize, usize)]) -> Option<Vec<u8>> {
    let total: usize = pieces.iter().map(|p| p.1).sum();
    if pieces.len() > 4 || total == 0 {
        return None;
    }
    let mut buf = vec![0u8; total];
    if pieces.iter().all(|&(off, len)| {
        addr.checked_add(off as u64).is_some_and(|a| in_callers_frames(a, len as u64))
    }) {
        let mut at = 0;
        for &(off, len) in pieces {
            // SAFETY: in_callers_frames: these bytes are in our callers' stack frames, mapped and
            // readable, and nothing else writes them while their thread is in this call.
            let src = unsafe { core::slice::from_raw_parts((addr + off as u64) as *const u8, len) };
            buf[at..at + len].copy_from_slice(src);
            at += len;
        }
        return Some(buf);
    }
    let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: total };
    let mut remote = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; 4];
    for (r, &(off, len)) in remote.iter_mut().zip(pieces) {
        *r = libc::iovec { iov_base: addr.checked_add(off as u64)? as *mut c_void, iov_len: len };
    }
    // SAFETY: the kernel copies between our own address ranges and reports bad ones as errors;
    // `local` is our buffer of `total` bytes.
    let n = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            &local,
            1,
            remote.as_ptr(),
            pieces.len() as libc::c_ulong,
            0,
        )
    };
    (n == total as isize).then_some(buf)
}

/// The hook's own clock for GDRSHIM_TIMING: the time-stamp counter, a few cycles to read (a
/// `clock_gettime` per read would weigh as much as what it measures), turned into nanoseconds
/// against CLOCK_MONOTONIC over the run (`ns_per_tick`).
pub struct Clock;
impl Clock {
    /// Ticks of the time-stamp counter (CLOCK_MONOTONIC nanoseconds off x86-64).
    #[inline(always)]
    pub fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no preconditions; user mode may read it on Linux.
        return unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        return Clock::mono_ns();
    }
    pub fn mono_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: ts is a valid out-buffer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
    /// (ticks, nanoseconds) now, for calibration.
    pub fn mark() -> (u64, u64) {
        (Clock::now(), Clock::mono_ns())
    }
    /// Nanoseconds per tick between `since` and now.
    pub fn ns_per_tick(since: (u64, u64)) -> f64 {
        let (t, n) = Clock::mark();
        let dt = t.saturating_sub(since.0);
        if dt == 0 {
            1.0
        } else {
            n.saturating_sub(since.1) as f64 / dt as f64
        }
    }
}

/// The allocator of libgdrshim-core.so (src/preload names it): the system's, except that an
/// allocation of 4 MiB or more (at a million live allocations, the map's cells and its memory
/// table: tens of MB, read at random, one cell per lookup) is advised `MADV_HUGEPAGE` over the
/// 2 MiB pages it covers whole, before it is first written. Where transparent huge pages are
/// `madvise` (the distributions' usual setting) the kernel then backs those with 2 MiB pages,
/// and a random read of the table misses the TLB far less: on a KVM guest (nested paging) one
/// read at random in 40 MB took 301 / 590 ns (p50 / p99) with 4 KiB pages and 171 / 441 with
/// huge ones (docs/results/scale-2026-12-07b). Nothing is aligned or added, so the heap is what
/// it was; the pure core knows nothing of it.
pub struct HugeTables;

/// Allocations from this size on are advised.
const HUGE_FROM: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

impl HugeTables {
    fn advise(ptr: *mut u8, size: usize) {
        if ptr.is_null() || size < HUGE_FROM {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + size) & !(HUGE_PAGE - 1);
        if start < end {
            // SAFETY: [start, end) lies inside the allocation just made, ours alone; MADV_HUGEPAGE
            // changes how the kernel backs it, never what it holds, and a refusal (no THP, an old
            // kernel) leaves it as it was.
            unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

// SAFETY: every call is the system allocator's, with the caller's layout; the advice changes
// neither the memory's contents nor its lifetime.
unsafe impl core::alloc::GlobalAlloc for HugeTables {
    unsafe fn alloc(&self, layout: core::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires
        let p = unsafe { std::alloc::System.alloc(layout) };
        Self::advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: core::alloc::Layout) -> *mut u8 {
        // SAFETY: as in alloc
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        Self::advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: core::alloc::Layout) {
        // SAFETY: ptr is the system allocator's, allocated with this layout
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: core::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's block, layout and size, as GlobalAlloc::realloc requires
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        // a grown table's new pages are not written yet (what was moved keeps its pages)
        Self::advise(p, new);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the kernel may back the mapping that holds `addr` with huge pages, from
    /// /proc/self/smaps (`None`: it does not say).
    fn thp_eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-')) {
                let (a, b) = range.split_once('-')?;
                let (a, b) = (usize::from_str_radix(a, 16).ok(), usize::from_str_radix(b, 16).ok());
                inside = matches!((a, b), (Some(a), Some(b)) if a <= addr && addr < b);
            } else if inside {
                if let Some(v) = line.strip_prefix("THPeligible:") {
                    return Some(v.trim() == "1");
                }
            }
        }
        None
    }

    #[test]
    fn a_large_table_is_advised_huge_pages_and_keeps_its_bytes_through_growth() {
        use core::alloc::{GlobalAlloc, Layout};
        let a = HugeTables;
        let (small, large) =
            (Layout::array::<u64>(1024).unwrap(), Layout::array::<u64>(1 << 20).unwrap());
        // SAFETY: nonzero layouts; each block is written within its size and freed once with
        // the layout it has then.
        unsafe {
            let s = a.alloc(small).cast::<u64>();
            let p = a.alloc(large).cast::<u64>();
            assert!(!s.is_null() && !p.is_null());
            for i in 0..1 << 20 {
                p.add(i).write(i as u64);
            }
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
            if thp.is_ok_and(|t| !t.contains("[never]")) {
                assert_eq!(thp_eligible(p as usize + (2 << 20)), Some(true), "8 MiB is advised");
            }
            let q = a.realloc(p.cast(), large, 16 << 20).cast::<u64>();
            assert!((0..1 << 20).all(|i| q.add(i).read() == i as u64), "growth keeps the bytes");
            let grown = Layout::array::<u64>(2 << 20).unwrap();
            a.dealloc(q.cast(), grown);
            let s2 = a.realloc(s.cast(), small, 16 << 10);
            a.dealloc(s2, Layout::array::<u64>(2048).unwrap());
        }
    }

    #[test]
    fn a_hooks_work_keeps_errno_contains_a_panic_and_is_not_reentered() {
        set_errno(7);
        let r = in_hook(|| {
            set_errno(99);
            assert_eq!(in_hook(|| 1), Err(Contained::Reentered), "a hook inside a hook");
            2
        });
        assert_eq!((r, errno()), (Ok(2), 7));
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = in_hook(|| -> i32 {
            set_errno(98);
            panic!("contained")
        });
        std::panic::set_hook(quiet);
        assert_eq!((r, errno()), (Err(Contained::Panicked), 7));
        assert!(Guard::enter().is_some(), "the mark is gone after a panic");
    }

    #[test]
    fn guard_is_not_reentrant() {
        let g = Guard::enter().unwrap();
        assert!(Guard::enter().is_none());
        drop(g);
        assert!(Guard::enter().is_some());
    }
}
