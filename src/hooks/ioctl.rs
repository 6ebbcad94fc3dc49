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
    let e0 = errno();
    let Some(dev) = fd::kind(fd) else {
        set_errno(e0);
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    };
    let _ = std::panic::catch_unwind(|| shim::get().before_ioctl(dev, request, arg));
    set_errno(e0);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { real(fd, request, arg) };
    let e = errno();
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: arg is the caller's pointer; after_ioctl reads it only when rc == 0.
        unsafe { shim::get().after_ioctl(dev, fd, request, rc, arg) }
    });
    set_errno(e);
    rc
}
