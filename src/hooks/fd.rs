//! The file-descriptor hooks: `open` (the four entry points, their four fortified ones that
//! `-D_FORTIFY_SOURCE` programs call, and `open_by_handle_at`), `close`, `dup`, `dup2`, `dup3`
//! and `fcntl`'s duplicating commands keep the fd table (`crate::fdtable`) true; nothing else.
//! (An fd made by a raw system call, `openat2` among them, is out of any hook's reach: the table
//! learns of it at its first ioctl, by its `fstat`; only a number reused behind our back after
//! the table knew it would be stale, and `open*` of any kind forgets what the number held.)

use crate::fdtable::{forget, note_dup, note_open, own};
use crate::real;
use crate::sys::{errno, set_errno};
use core::ffi::{c_char, c_int};

macro_rules! missing {
    () => {{
        set_errno(libc::ENOSYS);
        return -1;
    }};
}

use gdrshim_common::open_path;

/// The runtime starts at the `open` of an NVIDIA node by its usual name, not at the node's first
/// ioctl: a program's first NVIDIA ioctl may come from a signal handler that
/// interrupted `malloc`, where starting the runtime is not safe; its `open` comes from CUDA's
/// initialisation. (A node reached by any other name still starts it at its first ioctl.)
fn wake_at_nvidia_open(path: *const c_char) {
    // SAFETY: a non-null path is the caller's NUL-terminated C string (open's contract).
    if path.is_null() || !unsafe { crate::fdtable::nvidia_path(path) } {
        return;
    }
    if crate::activation::active() {
        let _ = crate::sys::in_hook(crate::shim::get);
    }
}

/// The four `open` entry points: one body.
macro_rules! open_hook {
    ($name:ident, $real:ident, ($($a:ident : $t:ty),*)) => {
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let Some(f) = real::$real() else { missing!() };
            // SAFETY: forwarded unchanged.
            let fd = unsafe { f($($a),*) };
            // recorded even in off mode: the byte is never used then, and reading the mode here
            // would wake the shim in every process that opens a file
            if fd >= 0 {
                let e = errno();
                note_open(fd);
                wake_at_nvidia_open(open_path!($($a),*));
                set_errno(e);
            }
            fd
        }
    };
}
open_hook!(open, open, (path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(open64, open64, (path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(openat, openat, (dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(openat64, openat64, (dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(__open_2, open_2, (path: *const c_char, flags: c_int));
open_hook!(__open64_2, open64_2, (path: *const c_char, flags: c_int));
open_hook!(__openat_2, openat_2, (dirfd: c_int, path: *const c_char, flags: c_int));
open_hook!(__openat64_2, openat64_2, (dirfd: c_int, path: *const c_char, flags: c_int));
open_hook!(open_by_handle_at, open_by_handle_at, (mount_fd: c_int, handle: *mut core::ffi::c_void, flags: c_int));

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let Some(f) = real::close() else { missing!() };
    // A number of ours closed by the program is ours no longer, and never closed by us again
    // (`own` takes its lock for it). The number is free once close starts: its kind is
    // forgotten first, so a racing open can only make us re-check it, never keep a stale kind.
    // Linux frees the number whatever close answers (EINTR, EIO), unless it was not open.
    own::program_closes(
        fd,
        || {
            forget(fd);
            // SAFETY: forwarded unchanged.
            unsafe { f(fd) }
        },
        |_| true,
    )
    .1
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(old: c_int) -> c_int {
    let Some(f) = real::dup() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(old) };
    note_dup(old, fd);
    fd
}

/// `dup2` and `dup3` close `new` first when it is open: a number of ours is let go as by
/// `close` (under the same lock), once the call did replace it (a `dup2` from a bad fd fails
/// with `EBADF` and leaves `new` as it was; `dup2(n, n)` changes nothing).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let Some(f) = real::dup2() else { missing!() };
    // SAFETY: forwarded unchanged.
    let real = || unsafe { f(old, new) };
    let fd = own::program_closes(new, real, |&r| r == new && old != new).1;
    if old != new {
        note_dup(old, fd);
    }
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let Some(f) = real::dup3() else { missing!() };
    // SAFETY: forwarded unchanged.
    let real = || unsafe { f(old, new, flags) };
    let fd = own::program_closes(new, real, |&r| r == new && old != new).1;
    note_dup(old, fd);
    fd
}

/// `close_range` (glibc 2.34): every number in the range is forgotten; those of ours are ours
/// no longer, once the call worked (`ENOSYS` before Linux 5.9, `EINVAL` for bad flags: nothing
/// closed). With `CLOSE_RANGE_CLOEXEC` nothing is closed (ours are close-on-exec already); with
/// `CLOSE_RANGE_UNSHARE` the closes act on the calling thread's own copy of the table, never
/// on the numbers our marks describe.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    let Some(f) = real::close_range() else { missing!() };
    // SAFETY: forwarded unchanged.
    let real = || unsafe { f(first, last, flags) };
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        return real();
    }
    if flags & libc::CLOSE_RANGE_UNSHARE as c_int != 0 {
        let r = real();
        if r == 0 {
            let e = errno();
            own::unshared_by_this_thread();
            set_errno(e);
        }
        return r;
    }
    let (lo, hi) = (clamp_fd(first), clamp_fd(last));
    let forget_closed = |&r: &c_int| {
        if r == 0 {
            let e = errno();
            crate::fdtable::forget_range(lo, hi);
            set_errno(e);
        }
    };
    own::program_closes_range(lo, hi, real, |&r| r == 0, forget_closed)
}

/// `closefrom` (glibc 2.34): as `close_range(low, ~0U, 0)`; glibc closes every number from
/// `low` on or aborts, so every one is closed when it returns.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let Some(f) = real::closefrom() else { return };
    let lo = low.max(0);
    // SAFETY: forwarded unchanged.
    let real = || unsafe { f(low) };
    let forget_closed = |_: &()| {
        let e = errno();
        crate::fdtable::forget_range(lo, c_int::MAX);
        set_errno(e);
    };
    own::program_closes_range(lo, c_int::MAX, real, |_| true, forget_closed);
}

/// A `close_range` bound as an fd number (fd numbers stop at `i32::MAX`).
fn clamp_fd(n: libc::c_uint) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

/// `fcntl` is variadic; every command takes at most one integer or pointer argument, which the
/// x86-64 ABI passes in the same register either way.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    let Some(f) = real::fcntl() else { missing!() };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        note_dup(fd, r);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: same contract as fcntl, which glibc's fcntl64 also implements.
    unsafe { fcntl(fd, cmd, arg) }
}
