//! `dlsym`/`dlvsym` interposition.
//!
//! glibc decides what `RTLD_NEXT` means from the return address of the `dlsym` call. A hook that
//! calls the real `dlsym` itself therefore answers `RTLD_NEXT` lookups for the wrong caller
//! (HAMi-core's loop during `import torch`). Ours are assembly stubs: they ask [`pick`] whether
//! the name is one we wrap and, if not, tail-jump to the real function with the caller's return
//! address still on the stack, so glibc sees exactly the call it would have seen without us.

use super::{cuda, mlx5dv, verbs};
use crate::activation::active;
use crate::real;
use crate::sys::in_hook;
use core::ffi::{c_char, c_void, CStr};
use gdrshim_common::elf;

/// What `pick` answers: forward untouched, return NULL, or return this pointer.
const FORWARD: usize = 0;
const RETURN_NULL: usize = 1;

gdrshim_common::dl_stubs!(
    #[cfg(not(test))]
    pick = pick,
    dlsym = real::GDRSHIM_REAL_DLSYM,
    dlvsym = real::GDRSHIM_REAL_DLVSYM,
    found = "ret"
);

/// Decides one lookup. Never panics across the boundary; never touches errno.
extern "C" fn pick(handle: *mut c_void, name: *const c_char, version: *const c_char) -> usize {
    if !real::resolve_dl() {
        return RETURN_NULL; // cannot forward anywhere; glibc >= 2.34 always lets us resolve
    }
    // RTLD_NEXT means "after the caller": only glibc, seeing the caller's return address, can
    // answer it. (An interposer of its own finding its next ibv_reg_mr/cuMemAlloc must get
    // exactly that, or it calls itself through us forever.)
    if handle == libc::RTLD_NEXT
        || name.is_null()
        // SAFETY: a non-null name is the caller's C string; we only peek at its first byte here.
        || !matches!(unsafe { *name } as u8, b'c' | b'i' | b'm')
    {
        return FORWARD;
    }
    in_hook(|| {
        #[cfg(feature = "knobs")]
        if let Some(s) = crate::shim::try_get() {
            s.test_panic("dlsym");
        }
        // SAFETY: name is a valid C string (checked non-null above).
        let n = unsafe { CStr::from_ptr(name) };
        // SAFETY: a non-null version is the caller's C string.
        let ver = (!version.is_null()).then(|| unsafe { CStr::from_ptr(version) }.to_bytes());
        let install = match n.to_bytes() {
            b if b.starts_with(b"ibv_") => verbs::by_symbol(b, ver),
            b if b.starts_with(b"mlx5dv_") => mlx5dv::by_symbol(b, ver),
            b => cuda::by_symbol_name(b),
        };
        let Some(install) = install else { return FORWARD };
        // SAFETY: the real functions with the caller's own arguments.
        let found = unsafe {
            if version.is_null() {
                real::real_dlsym().map_or(core::ptr::null_mut(), |f| f(handle, name))
            } else {
                real::real_dlvsym().map_or(core::ptr::null_mut(), |f| f(handle, name, version))
            }
        };
        if found.is_null() {
            return RETURN_NULL;
        }
        // Our own export (we are in the global scope), where no other object defines the name:
        // the answer without gdrshim is none (a program asking whether CUDA or verbs is loaded).
        if elf::in_gdrshim(found as usize) && !elf::defined_beside_gdrshim(n.to_bytes()) {
            // dlerror as after a failed lookup: none after us either
            // SAFETY: a lookup of the caller's C string(s).
            unsafe {
                if version.is_null() {
                    real::real_dlsym().map(|f| f(libc::RTLD_NEXT, name));
                } else {
                    real::real_dlvsym().map(|f| f(libc::RTLD_NEXT, name, version));
                }
            }
            return RETURN_NULL;
        }
        // a wrapper costs nothing until called, and wakes nothing: only off mode forwards
        if !active() {
            return FORWARD;
        }
        let w = install(found);
        let named = |p: &[u8]| n.to_bytes().starts_with(p);
        if w != found && (named(b"ibv_") || named(b"mlx5dv_")) && crate::shim::try_get().is_some() {
            let v = ver
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "default".into());
            crate::log_info!(
                "{}({}, {v}) resolved to gdrshim's wrapper",
                if version.is_null() { "dlsym" } else { "dlvsym" },
                n.to_string_lossy()
            );
        }
        w as usize
    })
    .unwrap_or(FORWARD)
}

/// `dlclose`: after a library is unloaded, cached pointers into libraries we forward to are
/// looked up again (libibverbs unloaded with NCCL's net plugin and loaded again elsewhere).
///
/// # Safety
/// As glibc's `dlclose`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> core::ffi::c_int {
    let Some(f) = real::dlclose() else { return -1 };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(handle) };
    if rc == 0 {
        real::DL_GENERATION.fetch_add(1, core::sync::atomic::Ordering::AcqRel);
    }
    rc
}

#[cfg(test)]
mod tests {
    #[test]
    fn pick_forwards_names_that_are_not_ours() {
        assert_eq!(
            super::pick(libc::RTLD_DEFAULT, c"printf".as_ptr(), core::ptr::null()),
            super::FORWARD
        );
        assert_eq!(
            super::pick(libc::RTLD_DEFAULT, c"cuInit".as_ptr(), core::ptr::null()),
            super::FORWARD
        );
        assert_eq!(
            super::pick(libc::RTLD_DEFAULT, core::ptr::null(), core::ptr::null()),
            super::FORWARD
        );
    }
}
