//! The start-up benchmark's second yardstick (ours): the smallest Rust preload library, an ioctl
//! wrapper that forwards, built as libgdrshim.so is (std, fat LTO, unwinding panics caught at the
//! boundary, the static unwinder). Its cost over the minimal C library is what any Rust library
//! with std costs a process; gdrshim's own share is the rest. Built by benches/startup.rs with
//! rustc alone (no crates).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}
/// glibc's RTLD_NEXT
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
type Ioctl = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    std::panic::catch_unwind(|| {
        let mut f = REAL.load(Ordering::Relaxed);
        if f.is_null() {
            // SAFETY: a C string literal; RTLD_NEXT is valid in a shared library.
            f = unsafe { dlsym(RTLD_NEXT, c"ioctl".as_ptr()) };
            REAL.store(f, Ordering::Relaxed);
        }
        if f.is_null() {
            return -1;
        }
        // SAFETY: libc's ioctl, of this signature.
        unsafe { std::mem::transmute::<*mut c_void, Ioctl>(f)(fd, req, arg) }
    })
    .unwrap_or(-1)
}
