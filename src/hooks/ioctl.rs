//! The `ioctl` hook: one cached-byte branch for every non-NVIDIA fd, then the real call.

use crate::activation::active;
use crate::fdtable as fd;
use crate::shim;
#[cfg(feature = "knobs")]
use crate::sys::Clock;
use crate::sys::{contained, set_errno, Guard};
use core::ffi::{c_int, c_ulong, c_void};

/// `ioctl` is variadic; its one optional argument travels in the third integer register.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let Some(real) = crate::activation::real_ioctl() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // Only an NVIDIA fd wakes the shim: any other is classified (one fstat, cached) and forwarded.
    let b = fd::cached(fd);
    if b == fd::NOT_NV || (b == fd::UNKNOWN && fd::classify_and_cache(fd).is_none()) || !active() {
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { nvidia(real, fd, request, arg) }
}

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

/// An ioctl on an NVIDIA (or not yet classified) fd. Out of line: the path of every other fd
/// stays a few instructions.
///
/// # Safety
/// The caller's `ioctl` arguments, unchanged.
#[inline(never)]
unsafe fn nvidia(real: IoctlFn, fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let Some(_guard) = Guard::enter() else {
        // SAFETY: forwarded unchanged (our own call, or a hook inside a hook).
        return unsafe { real(fd, request, arg) };
    };
    // (errno: fd::kind keeps it, and so does the first initialisation; the usual path reads it
    // only after the real call, once the line holding it is back in the cache anyway)
    let (Some(dev), Some(s)) = (fd::kind(fd), shim_keeping_errno()) else {
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    };
    #[cfg(feature = "knobs")]
    if s.line.timing {
        // SAFETY: as for this function.
        return unsafe { timed(s, real, dev, fd, request, arg) };
    }
    // A release holds the read side of the release gate across the driver call, so that no
    // registration can be decided over memory the driver is taking away at the same moment.
    // (the guard is held across the real call: the driver call is the program's, our work
    // around it is ours)
    let _release_gate = if s.line.registering {
        contained(|| s.before_ioctl(dev, request, arg)).flatten()
    } else {
        None
    };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { real(fd, request, arg) };
    // SAFETY: arg is the caller's pointer; after_ioctl reads it only when rc == 0.
    let _ = contained(|| unsafe { s.after_ioctl(dev, fd, request, rc, arg) });
    rc
}

/// The runtime, initialised on first use with errno as it was and a panic contained.
#[inline(always)]
fn shim_keeping_errno() -> Option<&'static shim::Shim> {
    shim::try_get().or_else(|| contained(shim::get))
}

#[cfg(feature = "knobs")]
/// [`nvidia`] with GDRSHIM_TIMING: the clock read around our parts, per request kind.
///
/// # Safety
/// The caller's `ioctl` arguments, unchanged.
#[cold]
#[inline(never)]
unsafe fn timed(
    s: &'static shim::Shim,
    real: IoctlFn,
    dev: crate::decode::DevKind,
    fd: c_int,
    request: c_ulong,
    arg: *mut c_void,
) -> c_int {
    let t0 = Clock::now();
    let _release_gate = if s.line.registering {
        contained(|| s.before_ioctl(dev, request, arg)).flatten()
    } else {
        None
    };
    let t1 = Clock::now();
    // SAFETY: forwarded unchanged.
    let rc = unsafe { real(fd, request, arg) };
    let t2 = Clock::now();
    // SAFETY: arg is the caller's pointer; after_ioctl reads it only when rc == 0.
    let _ = contained(|| unsafe { s.after_ioctl(dev, fd, request, rc, arg) });
    use core::sync::atomic::Ordering::Relaxed;
    let ns = (t1 - t0) + (Clock::now() - t2);
    let k = &s.stats.knobs;
    k.hook_ns.fetch_add(ns, Relaxed);
    let i = crate::shim::knob_stats::PerRequest::slot(dev, request);
    k.hook_ns_by_req[i].fetch_add(ns, Relaxed);
    k.hook_calls_by_req[i].fetch_add(1, Relaxed);
    rc
}
