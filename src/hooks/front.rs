//! `gdrshim_core_attach`: how the front library (src/front, the libgdrshim.so that ships) takes
//! this one into the process when the process first touches a GPU. Until then the front forwards
//! every call itself, and a process that never touches a GPU never loads this library.
//!
//! Loaded by a front, this library's own references to its exported names (`cuMemAlloc_v2`, …)
//! resolve through the process's global scope to the front's exports, which is what
//! `hooks::slots::install_into` takes for "ours already" (so a pointer to the front is never
//! wrapped twice). That holds only while the core is linked without `-Bsymbolic` (preload/build.rs).

use crate::real::{self, attach::FrontApi, attach::ATTACHED};
use core::ffi::{c_int, CStr};

/// Takes the front's `RTLD_NEXT` and its place: from now on the real functions are the ones
/// after the front, and the front's exports are this copy's hooks (`activation::hooks_in_place`).
/// Refuses (-1) a front of another version or layout: the two files ship together.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn gdrshim_core_attach(api: *const FrontApi) -> c_int {
    // SAFETY: a non-null api is the front's FrontApi; its size is read before anything else.
    let Some(api) = (unsafe { api.as_ref() }) else { return -1 };
    if api.size != core::mem::size_of::<FrontApi>() || api.version.is_null() {
        return -1;
    }
    // SAFETY: version is the front's NUL-terminated version string (checked non-null).
    let theirs = unsafe { CStr::from_ptr(api.version) }.to_bytes();
    if theirs != env!("CARGO_PKG_VERSION").as_bytes() {
        return -1;
    }
    // SAFETY: the front's own table (FrontApi), in a front that is never unloaded.
    unsafe { crate::fdtable::adopt_front_table(api.fd_first, api.fd_more) };
    real::set_front(api.next, api.object);
    ATTACHED
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::{c_char, c_void};

    unsafe extern "C" fn nowhere(_: *const c_char) -> *mut c_void {
        core::ptr::null_mut()
    }

    /// Only refusals here: a front taken would change how this test process finds real functions.
    #[test]
    fn a_front_of_another_version_or_layout_is_refused() {
        let api = |size, version: &CStr| FrontApi {
            size,
            version: version.as_ptr(),
            next: nowhere,
            object: core::ptr::null(),
            fd_first: core::ptr::null_mut(),
            fd_more: core::ptr::null_mut(),
        };
        let size = core::mem::size_of::<FrontApi>();
        let ours = std::ffi::CString::new(env!("CARGO_PKG_VERSION")).unwrap();
        // SAFETY: valid FrontApi values (or null), as a front passes them.
        unsafe {
            assert_eq!(gdrshim_core_attach(core::ptr::null()), -1);
            assert_eq!(gdrshim_core_attach(&api(size, c"0.0.1")), -1, "another version");
            assert_eq!(gdrshim_core_attach(&api(size - 8, &ours)), -1, "another layout");
        }
        assert!(real::front_object().is_none(), "nothing taken");
    }
}
