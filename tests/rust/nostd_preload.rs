//! The start-up benchmark's third yardstick (ours): the same ioctl wrapper as floor_preload.rs
//! without std (core only, panics abort, no unwinder). It measures what a small preloaded front
//! would cost a process, one that wraps the hooks and loads the rest of gdrshim only when the
//! process first touches a GPU. Built by benches/startup.rs with rustc alone (no crates).
#![no_std]
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_ulong, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}
/// glibc's RTLD_NEXT
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
type Ioctl = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
static REAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

// nothing here can panic; a yardstick needs no more than a handler that never returns
#[panic_handler]
fn on_panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    let mut f = REAL.load(Ordering::Relaxed);
    if f.is_null() {
        // SAFETY: a C string literal; RTLD_NEXT is valid in a shared library.
        f = unsafe { dlsym(RTLD_NEXT, c"ioctl".as_ptr()) };
        REAL.store(f, Ordering::Relaxed);
    }
    if f.is_null() {
        return -1;
    }
    // SAFETY: RTLD_NEXT's ioctl has this C signature; the caller's arguments, unchanged.
    unsafe { core::mem::transmute::<*mut c_void, Ioctl>(f)(fd, req, arg) }
}
