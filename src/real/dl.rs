//! libc's own `dlsym` and `dlvsym`: gdrshim defines both itself, so it reads libc's dynamic
//! symbol table for them (`elf`), once.

use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};
use gdrshim_common::elf;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// Read by the assembly stubs in `hooks::dl`, which tail-jump here.
pub static GDRSHIM_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
pub static GDRSHIM_REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Finds the real `dlsym`/`dlvsym`. Idempotent; cheap after the first call.
pub fn resolve_dl() -> bool {
    if !GDRSHIM_REAL_DLSYM.load(Ordering::Acquire).is_null()
        && !GDRSHIM_REAL_DLVSYM.load(Ordering::Acquire).is_null()
    {
        return true;
    }
    let [dlsym, dlvsym] = elf::libc_dlsym_dlvsym();
    if dlsym == 0 || dlvsym == 0 {
        return false;
    }
    GDRSHIM_REAL_DLSYM.store(dlsym as *mut c_void, Ordering::Release);
    GDRSHIM_REAL_DLVSYM.store(dlvsym as *mut c_void, Ordering::Release);
    true
}

pub fn real_dlsym() -> Option<DlsymFn> {
    if !resolve_dl() {
        return None;
    }
    let p = GDRSHIM_REAL_DLSYM.load(Ordering::Acquire);
    // SAFETY: p is libc's dlsym, found in its symbol table with this C signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

pub fn real_dlvsym() -> Option<DlvsymFn> {
    if !resolve_dl() {
        return None;
    }
    let p = GDRSHIM_REAL_DLVSYM.load(Ordering::Acquire);
    // SAFETY: p is libc's dlvsym, found in its symbol table with this C signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, DlvsymFn>(p) })
}
