//! The next definition of a hooked function: libc's after gdrshim (or after the front that
//! loaded this copy), or a library's that may be loaded in a plugin's local scope and unloaded and
//! loaded again (looked up anew after any `dlclose`).

use super::dl;
use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use gdrshim_common::{attach, elf};

/// Set when a front library loaded this copy (`hooks::front`): its [`attach::NextFn`], and an
/// address inside it. Null in a copy that was preloaded itself.
static FRONT_NEXT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static FRONT_OBJECT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Takes the front's answers for [`next`] and its place for [`front_object`]. Idempotent.
pub fn set_front(next: attach::NextFn, object: *const c_void) {
    FRONT_OBJECT.store(object as *mut c_void, Ordering::Release);
    FRONT_NEXT.store(next as *mut c_void, Ordering::Release);
}

/// An address inside the front that loaded this copy, if one did.
pub fn front_object() -> Option<*mut c_void> {
    let p = FRONT_OBJECT.load(Ordering::Acquire);
    (!p.is_null()).then_some(p)
}

/// `dlsym(RTLD_NEXT, name)` as seen from the library the process preloaded: the next definition
/// after gdrshim, or after the front that loaded this copy. A libc function (`libc_name`) is
/// found in the loader's list without `dlsym`, which takes the lock a `dlopen` holds while it
/// runs constructors (a hook's first use from a thread that a constructor waits for).
pub fn next(name: &'static CStr, libc_name: bool) -> *mut c_void {
    let front = FRONT_NEXT.load(Ordering::Acquire);
    let this_copy = in_this_copy as *const () as usize;
    if libc_name {
        let after =
            if front.is_null() { this_copy } else { FRONT_OBJECT.load(Ordering::Acquire) as usize };
        if let Some(p) = elf::next_definition(after, name.to_bytes()) {
            // after the front, this very file preloaded too (see below): the ones after it
            if front.is_null() || !in_this_copy(p as *mut c_void) {
                return p as *mut c_void;
            }
            if let Some(p) = elf::next_definition(this_copy, name.to_bytes()) {
                return p as *mut c_void;
            }
        }
    }
    if !front.is_null() {
        // SAFETY: set_front stored an attach::NextFn; name is a valid C string.
        let p =
            unsafe { core::mem::transmute::<*mut c_void, attach::NextFn>(front)(name.as_ptr()) };
        // This very file preloaded itself too, after the front (LD_PRELOAD=.../lib/*.so): the
        // definitions after the front start with this copy's own hooks, and the real ones are
        // after this copy (no endless recursion into ourselves).
        if p.is_null() || !in_this_copy(p) {
            return p;
        }
    }
    match dl::real_dlsym() {
        // SAFETY: RTLD_NEXT with a valid C string; the return address is inside gdrshim
        // (`black_box`: a call, never a tail call that would leave our caller's address there).
        Some(f) => core::hint::black_box(unsafe { f(libc::RTLD_NEXT, name.as_ptr()) }),
        None => core::ptr::null_mut(),
    }
}

/// Whether `p` lies in this copy of the library.
pub(super) fn in_this_copy(p: *mut c_void) -> bool {
    let ours = elf::object_holding(in_this_copy as *const () as usize).map(|o| o.0);
    ours.is_some() && elf::object_holding(p as usize).map(|o| o.0) == ours
}

/// Counts successful `dlclose` calls: a library reached through `RTLD_NEXT` (libibverbs,
/// libcuda) may have been unloaded and loaded again elsewhere since a pointer was cached.
pub static DL_GENERATION: AtomicU64 = AtomicU64::new(0);

/// A lazily resolved pointer to the next definition of one symbol. It holds no pointer until
/// resolved (the name comes with each call): a static with a pointer in it is a relocation the
/// loader writes in every process at start-up, and a page of it touched.
pub struct NextFn {
    ptr: AtomicPtr<c_void>,
    /// For symbols of libraries that can be unloaded: the [`DL_GENERATION`] `ptr` was resolved
    /// in, plus one (0: never resolved). `u64::MAX` for libc's, which is never unloaded.
    resolved_in: AtomicU64,
}

impl NextFn {
    /// A libc function: resolved once.
    pub const fn libc() -> Self {
        NextFn { ptr: AtomicPtr::new(core::ptr::null_mut()), resolved_in: AtomicU64::new(u64::MAX) }
    }
    /// A function of a library (a file-name prefix such as `libibverbs.so`, given with each
    /// call), which may be loaded only in a plugin's local scope, and may be `dlclose`d and
    /// loaded again at another address: looked up again after any `dlclose`.
    pub const fn reloadable() -> Self {
        NextFn { ptr: AtomicPtr::new(core::ptr::null_mut()), resolved_in: AtomicU64::new(0) }
    }
    /// The next definition of `name` (always the same name for one `NextFn`: use [`next_def!`]),
    /// and where `RTLD_NEXT` does not see it, `library`'s own.
    #[inline(always)]
    pub fn get(&self, name: &'static CStr, library: Option<&'static [u8]>) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        let seen = self.resolved_in.load(Ordering::Acquire);
        let now =
            if seen == u64::MAX { u64::MAX } else { DL_GENERATION.load(Ordering::Acquire) + 1 };
        if !p.is_null() && seen == now {
            return p;
        }
        self.resolve(name, library, seen, now)
    }

    #[cold]
    #[inline(never)]
    fn resolve(
        &self,
        name: &'static CStr,
        library: Option<&'static [u8]>,
        seen: u64,
        now: u64,
    ) -> *mut c_void {
        // the hook's caller never sees what the loader left in errno (a call that works keeps it)
        // SAFETY: __errno_location returns this thread's errno slot.
        let e = unsafe { *libc::__errno_location() };
        let mut p = next(name, seen == u64::MAX);
        if p.is_null() {
            if let Some(lib) = library {
                p = in_loaded_library(lib, name);
            }
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = e };
        self.ptr.store(p, Ordering::Release);
        if seen != u64::MAX {
            self.resolved_in.store(now, Ordering::Release);
        }
        p
    }
}

/// The next definition of a symbol, cached in a static of this call site's own:
/// `next_def!(c"close")` for libc's (resolved once); `next_def!(c"ibv_reg_mr" in b"libibverbs.so")` for
/// a library's that may be unloaded (resolved again after any `dlclose`, and found in a plugin's
/// local scope by the library's file-name prefix).
macro_rules! next_def {
    ($sym:literal) => {{
        // .data, not .bss: see hooks::slots::slotted
        #[link_section = ".data.gdrshim_hooks"]
        static NEXT: $crate::real::NextFn = $crate::real::NextFn::libc();
        NEXT.get($sym, None)
    }};
    ($sym:literal in $lib:literal) => {{
        #[link_section = ".data.gdrshim_hooks"]
        static NEXT: $crate::real::NextFn = $crate::real::NextFn::reloadable();
        NEXT.get($sym, Some($lib))
    }};
}
pub(crate) use next_def;

/// Whether `file` is the library `prefix` (`libibverbs.so`) names: `libibverbs.so…`, or a copy a
/// Python wheel carries, renamed by auditwheel to `libibverbs-<hash>.so…` (NIXL's UCX).
pub(super) fn is_library(file: &[u8], prefix: &[u8]) -> bool {
    if file.starts_with(prefix) {
        return true;
    }
    let Some(stem) = prefix.strip_suffix(b".so") else { return false };
    let Some(rest) = file.strip_prefix(stem).and_then(|r| r.strip_prefix(b"-")) else {
        return false;
    };
    // the hash auditwheel inserts: 8 hex digits, then the original ".so…"
    rest.len() > 8 && rest[..8].iter().all(u8::is_ascii_hexdigit) && rest[8..].starts_with(b".so")
}

/// `name` in an already loaded library whose file name is `prefix`'s library ([`is_library`]),
/// in whatever scope it was loaded (a plugin's `RTLD_LOCAL` dependency). Loads nothing and keeps
/// no reference.
pub fn in_loaded_library(prefix: &[u8], name: &CStr) -> *mut c_void {
    // the first object named exactly so (`libibverbs.so…`); the renamed copies (auditwheel),
    // and whether there is more than one
    let (mut exact, mut renamed, mut renamed_more) = (None, None::<std::ffi::CString>, false);
    elf::each_loaded_object(|info| {
        let Some(file) = elf::file_name(info) else { return false };
        // SAFETY: a named object's dlpi_name is a NUL-terminated string owned by ld.so.
        let full = unsafe { CStr::from_ptr(info.dlpi_name) };
        if file.starts_with(prefix) {
            exact.get_or_insert_with(|| full.to_owned());
        } else if is_library(file, prefix) {
            match &renamed {
                Some(p) if p.as_c_str() != full => renamed_more = true,
                _ => renamed = Some(full.to_owned()),
            }
        }
        false
    });
    // A renamed copy only where it is the one copy there is: with several, which one the caller
    // uses cannot be told here, and another copy's function would read the caller's objects
    // with its own private layouts (nothing is found then, as before).
    let path = exact.or(if renamed_more { None } else { renamed });
    let Some(path) = path else { return core::ptr::null_mut() };
    // SAFETY: RTLD_NOLOAD only finds an object that is loaded already (and counts a reference).
    let h = unsafe {
        libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY | libc::RTLD_LOCAL)
    };
    if h.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: a lookup on the handle just obtained.
    let p = dl::real_dlsym().map_or(core::ptr::null_mut(), |d| unsafe { d(h, name.as_ptr()) });
    // The reference goes back at once (through libc, so our dlclose hook does not count it):
    // an unload later is seen through DL_GENERATION.
    if let Some(close) = dlclose() {
        // SAFETY: the handle dlopen gave above.
        unsafe { close(h) };
    }
    p
}

/// libc's `dlclose` (our hook counts the unloads; a reference of our own goes back through
/// libc's, uncounted).
pub fn dlclose() -> Option<unsafe extern "C" fn(*mut c_void) -> c_int> {
    let p = next_def!(c"dlclose");
    // SAFETY: p is the next definition of libc's dlclose, which has exactly this C signature.
    (!p.is_null()).then(|| unsafe {
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> c_int>(p)
    })
}
