//! `access`: NCCL's NIC-side GDR gate is `access(".../nv_mem/version", F_OK)`. Only with
//! `GDRSHIM_ADVERTISE_GDR=1`, only for that one path, and only once gdrshim is up (it never
//! starts the runtime from here); every other call is the real one, untouched.

use crate::real;
use crate::shim::{self, errno, set_errno};
use core::ffi::{c_char, c_int, CStr};

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    let Some(real) = real::access() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let e0 = errno();
    // SAFETY: forwarded unchanged.
    let r = unsafe { real(path, mode) };
    if r == 0 || path.is_null() {
        return r;
    }
    match shim::try_get() {
        Some(sh) if sh.cfg.advertise_gdr => {}
        _ => return r,
    }
    // SAFETY: a non-null path the real access accepted as a C string.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    if p != crate::advertise::PEER_MEMORY_PROBE_PATH {
        return r;
    }
    // call_in leaves errno as the real call set it
    if shim::call_in(|sh| sh.answer_peer_memory_probe(p, mode)) == Some(true) {
        // A success leaves errno as the caller had it.
        set_errno(e0);
        return 0;
    }
    r
}
