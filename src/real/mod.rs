//! The real libc functions behind our hooks.
//!
//! gdrshim defines `dlsym` and `dlvsym` itself, so it cannot ask `dlsym` for the real `dlsym`.
//! It reads libc's own dynamic symbol table instead (found with `dl_iterate_phdr`), then resolves
//! everything else with the real `dlsym(RTLD_NEXT, …)`, which names the next definition after
//! gdrshim, as a preloaded library should.

use core::ffi::{c_char, c_int, c_void};

pub use gdrshim_common::{attach, elf};
pub mod scope;

mod dl;
pub use dl::{
    real_dlsym, real_dlvsym, resolve_dl, DlsymFn, DlvsymFn, GDRSHIM_REAL_DLSYM, GDRSHIM_REAL_DLVSYM,
};
mod next;
pub(crate) use next::next_def;
pub use next::{dlclose, front_object, in_loaded_library, next, set_front, NextFn, DL_GENERATION};

/// Declares a typed accessor for the real function behind a hook.
macro_rules! real_fn {
    ($vis:vis $acc:ident, $sym:literal, $ty:ty) => {
        $vis fn $acc() -> Option<$ty> {
            let p = $crate::real::next_def!($sym);
            // SAFETY: p is the next definition of a libc symbol with exactly this C signature.
            (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut core::ffi::c_void, $ty>(p) })
        }
    };
}

real_fn!(pub open, c"open", unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub open64, c"open64", unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub openat, c"openat", unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub openat64, c"openat64", unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub open_2, c"__open_2", unsafe extern "C" fn(*const c_char, c_int) -> c_int);
real_fn!(pub open64_2, c"__open64_2", unsafe extern "C" fn(*const c_char, c_int) -> c_int);
real_fn!(pub openat_2, c"__openat_2", unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int);
real_fn!(pub openat64_2, c"__openat64_2", unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int);
real_fn!(pub open_by_handle_at, c"open_by_handle_at", unsafe extern "C" fn(c_int, *mut c_void, c_int) -> c_int);
real_fn!(pub close, c"close", unsafe extern "C" fn(c_int) -> c_int);
real_fn!(pub dup, c"dup", unsafe extern "C" fn(c_int) -> c_int);
real_fn!(pub dup2, c"dup2", unsafe extern "C" fn(c_int, c_int) -> c_int);
real_fn!(pub dup3, c"dup3", unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
real_fn!(pub fcntl, c"fcntl", unsafe extern "C" fn(c_int, c_int, libc::c_ulong) -> c_int);
real_fn!(pub close_range, c"close_range", unsafe extern "C" fn(libc::c_uint, libc::c_uint, c_int) -> c_int);
real_fn!(pub closefrom, c"closefrom", unsafe extern "C" fn(c_int));

#[cfg(test)]
mod tests {
    #[test]
    fn finds_libc_dlsym_and_it_works() {
        assert!(super::resolve_dl());
        let f = super::real_dlsym().unwrap();
        // SAFETY: RTLD_DEFAULT lookup of a libc symbol.
        let p = unsafe { f(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert_eq!(p, libc::getpid as *mut core::ffi::c_void);
    }

    #[test]
    fn a_wheels_renamed_copy_is_the_library() {
        let lib = |f: &[u8]| super::next::is_library(f, b"libibverbs.so");
        assert!(
            lib(b"libibverbs.so.1")
                && lib(b"libibverbs.so.1.14.50.0")
                && lib(b"libibverbs-1a2b3c4d.so.1.14.0")
        );
        // another library that only starts alike, and a provider plugin (libmlx5-rdmav34.so) shape
        assert!(
            !lib(b"libibverbs-extra.so")
                && !lib(b"libibverbsx.so.1")
                && !lib(b"libibverbs-1a2b3c4.so.1")
        );
        assert!(
            !super::next::is_library(b"libmlx5-rdmav34.so", b"libmlx5.so")
                && super::next::is_library(b"libmlx5-0badf00d.so.1", b"libmlx5.so")
        );
    }
}
