//! What the front's exports answer where no core answers them (none may run here, none could be
//! loaded, or it has not started): the mode GDRSHIM_MODE asks for, the queries as a shim that has
//! seen no GPU, and a failure (CUDA_ERROR_NOT_FOUND, ENOSYS) for a call with nowhere to go.

use core::ffi::c_int;
/// The mode GDRSHIM_MODE asks for, as the core answers it before it starts; 0 where there is
/// no core to run it (secure execution, or loading it failed): every call is forwarded.
pub extern "C" fn asked_mode() -> c_int {
    // SAFETY: getauxval has no preconditions.
    if crate::no_core() || unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return crate::mode_word::OFF;
    }
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    let v = unsafe { libc::getenv(c"GDRSHIM_MODE".as_ptr()) };
    // SAFETY: getenv answered null or a NUL-terminated string of the environment.
    crate::mode_word::effective(
        (!v.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(v) }.to_bytes()),
    )
}
/// Whether a core would run here (not off, not secure, loadable): then the queries answer as
/// a core that has seen no NVIDIA call, else as no shim.
fn would_run() -> bool {
    asked_mode() != crate::mode_word::OFF
}
/// `gdrshim_lookup`: nothing is mapped in a process that has touched no GPU (-ENOENT).
pub extern "C" fn lookup_unseen() -> c_int {
    if would_run() {
        -libc::ENOENT
    } else {
        -libc::ENOSYS
    }
}
/// `struct gdrshim_counters`' 8-byte fields (src/counters.rs), the last two the BAR1 fields,
/// unknown (all ones) until an export asks.
const COUNTERS: usize = 22;
const UNKNOWN_FROM: usize = 20;
/// `gdrshim_counters(out, size)`: a shim that has seen nothing: zeros and the BAR1 fields
/// unknown, at most `size` bytes; the bytes written.
pub extern "C" fn counters_unseen(out: *mut u64, size: usize) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    if !would_run() {
        return -libc::ENOSYS;
    }
    let n = (size / 8).min(COUNTERS);
    for i in 0..n {
        // SAFETY: the caller's struct has `size` writable bytes (gdrshim.h), i < size / 8.
        unsafe { out.add(i).write_unaligned(if i >= UNKNOWN_FROM { u64::MAX } else { 0 }) };
    }
    (n * 8) as c_int
}
/// CUDA_ERROR_NOT_FOUND
pub extern "C" fn cuda_not_found() -> c_int {
    500
}
pub extern "C" fn null_enosys() -> *mut core::ffi::c_void {
    crate::set_errno(libc::ENOSYS);
    core::ptr::null_mut()
}
/// `ibv_dereg_mr` answers an errno value.
pub extern "C" fn enosys() -> c_int {
    libc::ENOSYS
}
pub extern "C" fn minus_one_enosys() -> c_int {
    crate::set_errno(libc::ENOSYS);
    -1
}
pub extern "C" fn zero() -> c_int {
    0
}
/// -ENOSYS, as the `int` and the `int64_t` functions of include/gdrshim.h say "no shim".
pub extern "C" fn minus_enosys() -> i64 {
    -(libc::ENOSYS as i64)
}
pub extern "C" fn minus_enoent() -> c_int {
    -libc::ENOENT
}
pub extern "C" fn nothing() {}
