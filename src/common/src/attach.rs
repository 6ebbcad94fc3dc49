//! What the front library (src/front: the libgdrshim.so that ships) hands this library when it
//! loads it with `dlopen`: one definition for both. Core and libc only here.

use core::ffi::{c_char, c_int, c_void, CStr};

/// The file the front loads, from its own folder.
pub const CORE_FILE: &[u8] = b"libgdrshim-core.so";
/// The function of this library the front calls first, with a [`FrontApi`].
pub const ATTACH: &CStr = c"gdrshim_core_attach";
/// What [`ATTACH`] answers when it takes the front.
pub const ATTACHED: c_int = 0;

/// `dlsym(RTLD_NEXT, name)` asked from inside the front.
pub type NextFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;

#[repr(C)]
pub struct FrontApi {
    /// `size_of::<FrontApi>()` where the front was built.
    pub size: usize,
    /// The front's version, NUL-terminated: it must be this library's own.
    pub version: *const c_char,
    /// The definitions after the front: glibc answers `RTLD_NEXT` by the caller's place in the
    /// search list, where a `dlopen`ed library has none.
    pub next: NextFn,
    /// An address inside the front: the object whose exports the process calls.
    pub object: *const c_void,
    /// The front's fd table (src/common/src/fdpages.rs: its first page and its directory), which the
    /// core takes as its own: every fd change the front's hooks saw, until the last one that
    /// straddles the core's load, is in the table the core reads.
    pub fd_first: *mut c_void,
    pub fd_more: *mut c_void,
}
const _: () = assert!(core::mem::size_of::<FrontApi>() == 48);
