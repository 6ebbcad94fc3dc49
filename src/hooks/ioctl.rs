//! The `ioctl` hook: one cached-byte branch for every non-NVIDIA fd, then the real call.

use crate::hooks::fd;
use crate::real;
use crate::shim::{self, active, errno, set_errno, Guard};
use core::ffi::{c_int, c_ulong, c_void};

/// `ioctl` is variadic; its one optional argument travels in the third integer register.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let Some(real) = real::ioctl() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    if fd::cached(fd) == fd::NOT_NV || !active() {
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    }
    let Some(_guard) = Guard::enter() else {
        // SAFETY: forwarded unchanged (our own call, or a hook inside a hook).
        return unsafe { real(fd, request, arg) };
    };
    let t0 = Clock::start();
    let e0 = errno();
    let Some(dev) = fd::kind(fd) else {
        set_errno(e0);
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    };
    let _ = std::panic::catch_unwind(|| shim::get().before_ioctl(dev, request, arg));
    set_errno(e0);
    let t1 = t0.map(|_| Clock::now());
    // SAFETY: forwarded unchanged.
    let rc = unsafe { real(fd, request, arg) };
    let e = errno();
    let t2 = t0.map(|_| Clock::now());
    let _ = std::panic::catch_unwind(|| {
        let s = shim::get();
        // SAFETY: arg is the caller's pointer; after_ioctl reads it only when rc == 0.
        unsafe { s.after_ioctl(dev, fd, request, rc, arg) };
        if let (Some(a), Some(b), Some(c)) = (t0, t1, t2) {
            use core::sync::atomic::Ordering::Relaxed;
            let ns = (b - a) + (Clock::now() - c);
            s.stats.hook_ns.fetch_add(ns, Relaxed);
            let i = crate::shim::PerRequest::slot(dev, request);
            s.stats.hook_ns_by_req[i].fetch_add(ns, Relaxed);
            s.stats.hook_calls_by_req[i].fetch_add(1, Relaxed);
        }
    });
    set_errno(e);
    rc
}

/// The hook's own clock for GDRSHIM_TIMING: the time-stamp counter, a few cycles to read (a
/// `clock_gettime` per read would weigh as much as what it measures), turned into nanoseconds
/// against CLOCK_MONOTONIC over the run (`ns_per_tick`).
pub(crate) struct Clock;
impl Clock {
    fn start() -> Option<u64> {
        shim::try_get().filter(|s| s.cfg.timing).map(|_| Clock::now())
    }
    /// Ticks of the time-stamp counter (CLOCK_MONOTONIC nanoseconds off x86-64).
    #[inline(always)]
    pub(crate) fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no preconditions; user mode may read it on Linux.
        return unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        return Clock::mono_ns();
    }
    pub(crate) fn mono_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: ts is a valid out-buffer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
    /// (ticks, nanoseconds) now, for calibration.
    pub(crate) fn mark() -> (u64, u64) {
        (Clock::now(), Clock::mono_ns())
    }
    /// Nanoseconds per tick between `since` and now.
    pub(crate) fn ns_per_tick(since: (u64, u64)) -> f64 {
        let (t, n) = Clock::mark();
        let dt = t.saturating_sub(since.0);
        if dt == 0 {
            1.0
        } else {
            n.saturating_sub(since.1) as f64 / dt as f64
        }
    }
}
