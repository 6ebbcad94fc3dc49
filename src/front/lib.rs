//! libgdrshim.so as it ships: the front. It carries every hook the process calls, and nothing
//! else: no std, no allocation, a few imports, so that a process that never touches a GPU (the
//! shells, compilers and tools of a job, all preloaded) pays for loading a library about what a
//! minimal C preload library costs.
//!
//! When the process first does something only a GPU program does (an ioctl on an NVIDIA device
//! node, a verbs registration, a CUDA entry point, a `dlsym` of one, a gdrshim query), the front
//! loads libgdrshim-core.so from its own folder with `dlopen` and hands it every call from then
//! on. The core sees all NVIDIA calls from the first one, as when it is preloaded itself: no
//! NVIDIA ioctl is ever forwarded unseen while a core can be had. Without a core (missing,
//! another version, secure execution) every call is forwarded untouched, as in off mode.
//!
//! Loading the core is a `dlopen` inside the hook that needs it (docs/architecture.md, "the
//! hand-off"). Where that hook runs in a signal handler that interrupted the loader or `malloc` on
//! the same thread, or in a child forked while another thread held the loader's lock, the loader
//! may not be usable; a GPU program's first NVIDIA call is made by CUDA's initialisation, in
//! neither. When another thread holds the loader's lock, the front waits for it at most 10 s and
//! then forwards without a core (`loaderlock`).

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)] // each export has exactly the contract of its C namesake

mod fallback;
mod hooks;
mod loaderlock;
mod locate;
mod sys;

use gdrshim_common::{attach, elf, fdpages, mode_word, names, nodes};

use attach::{FrontApi, ATTACHED};
use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{
    AtomicBool, AtomicPtr,
    Ordering::{Acquire, Relaxed, Release},
};

/// Nothing here panics by design (no indexing out of range, no unwrap); if something did, it must
/// not unwind into C.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();

/// libc's `dlsym` and `dlvsym` (the hooks' `dlsym` is ours, so not asked of `dlsym`); read by
/// the assembly of `hooks::dlsym`.
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Acquire);
    if p.is_null() {
        let [dlsym, dlvsym] = elf::libc_dlsym_dlvsym();
        if dlsym == 0 || dlvsym == 0 {
            return None;
        }
        REAL_DLVSYM.store(dlvsym as *mut c_void, Release);
        REAL_DLSYM.store(dlsym as *mut c_void, Release);
        p = dlsym as *mut c_void;
    }
    // SAFETY: p is libc's dlsym, found in its symbol table with this C signature.
    Some(unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// `dlsym(RTLD_NEXT, name)` from inside the front: the definition after it. The core asks
/// through this too (`FrontApi::next`).
///
/// glibc answers `RTLD_NEXT` after the object its return address lies in: the call must return
/// here. A tail call (`jmp`, which the optimiser may choose for a last call) would leave the
/// core's return address on the stack, and the core, loaded in a scope of its own, has nothing
/// after it: every lookup of the core's through the front answered NULL. `black_box` keeps the
/// answer used after the call, so the call stays a call.
#[inline(never)]
unsafe extern "C" fn next(name: *const c_char) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: RTLD_NEXT with the caller's C string; the return address is inside the front.
        Some(f) => core::hint::black_box(unsafe { f(libc::RTLD_NEXT, name) }),
        None => core::ptr::null_mut(),
    }
}

/// A libc function after the front, looked up at its first use and kept (libc is never unloaded).
pub(crate) struct Libc(AtomicPtr<c_void>);
impl Libc {
    pub(crate) const fn new() -> Self {
        Libc(AtomicPtr::new(core::ptr::null_mut()))
    }
    #[inline(always)]
    pub(crate) fn get(&self, name: &'static CStr) -> *mut c_void {
        let p = self.0.load(Acquire);
        if !p.is_null() {
            return p;
        }
        // (the hook's caller keeps its errno, whatever the lookup leaves)
        // SAFETY: __errno_location returns this thread's errno slot.
        let e = unsafe { *libc::__errno_location() };
        // In the loader's list first, without dlsym's lock: a hook's first use may come from a
        // thread that a library's constructor (holding that lock in dlopen) waits for.
        let p = match elf::next_definition(next as *const () as usize, name.to_bytes()) {
            Some(p) => p as *mut c_void,
            // SAFETY: a valid C string.
            None => unsafe { next(name.as_ptr()) },
        };
        self.0.store(p, Release);
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = e };
        p
    }
}

/// The core's functions that the front's own hooks hand their calls to, once it is attached
/// (null before: the front's path). In the order of [`CORE_NAMES`].
pub(crate) static CORE: [AtomicPtr<c_void>; CORE_NAMES.len()] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; CORE_NAMES.len()];
const CORE_NAMES: [&CStr; 20] = [
    c"ioctl",
    c"open",
    c"open64",
    c"openat",
    c"openat64",
    c"close",
    c"dup",
    c"dup2",
    c"dup3",
    c"fcntl",
    c"dlsym",
    c"dlvsym",
    c"dlclose",
    c"__open_2",
    c"__open64_2",
    c"__openat_2",
    c"__openat64_2",
    c"open_by_handle_at",
    c"close_range",
    c"closefrom",
];
pub(crate) const IOCTL: usize = 0;
pub(crate) const OPEN: usize = 1;
pub(crate) const OPEN64: usize = 2;
pub(crate) const OPENAT: usize = 3;
pub(crate) const OPENAT64: usize = 4;
pub(crate) const CLOSE: usize = 5;
pub(crate) const DUP: usize = 6;
pub(crate) const DUP2: usize = 7;
pub(crate) const DUP3: usize = 8;
pub(crate) const FCNTL: usize = 9;
pub(crate) const DLSYM: usize = 10;
pub(crate) const DLVSYM: usize = 11;
pub(crate) const DLCLOSE: usize = 12;
pub(crate) const OPEN_2: usize = 13;
pub(crate) const OPEN64_2: usize = 14;
pub(crate) const OPENAT_2: usize = 15;
pub(crate) const OPENAT64_2: usize = 16;
pub(crate) const OPEN_BY_HANDLE_AT: usize = 17;
pub(crate) const CLOSE_RANGE: usize = 18;
pub(crate) const CLOSEFROM: usize = 19;

/// The core's function at `i` of [`CORE_NAMES`], if attached.
#[inline(always)]
pub(crate) fn core_fn(i: usize) -> Option<*mut c_void> {
    let p = CORE.get(i)?.load(Acquire);
    (!p.is_null()).then_some(p)
}

/// The core's `dlopen` handle, once attached.
static HANDLE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
pub(crate) fn core_handle() -> *mut c_void {
    HANDLE.load(Acquire)
}

/// Set when loading the core failed for good (said once on stderr): calls are forwarded.
static NO_CORE: AtomicBool = AtomicBool::new(false);

/// Whether loading the core failed for good.
#[inline(always)]
pub(crate) fn no_core() -> bool {
    NO_CORE.load(Relaxed)
}

/// Loads and attaches the core if that was not done yet; whether the process has one. Keeps errno.
///
/// Threads that come here together each load it (`dlopen` counts references and answers the
/// same object): none may go on without the core, since an NVIDIA call it forwarded unseen could
/// be a free the core's map never learns of; and waiting for another thread could wait on one
/// that waits for the loader's lock this thread holds (an ioctl in a library's constructor).
/// Whether there is a core is whether one was loaded ([`core_handle`]): a thread whose load
/// failed cannot undo another's that worked.
pub(crate) fn attach() -> bool {
    if !core_handle().is_null() {
        return true;
    }
    if NO_CORE.load(Acquire) {
        return false;
    }
    // SAFETY: __errno_location returns this thread's errno slot.
    let e = unsafe { *libc::__errno_location() };
    if !load_core() {
        NO_CORE.store(true, Release);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    !core_handle().is_null()
}

fn load_core() -> bool {
    // Secure execution (setuid, or /etc/ld.so.preload into a privileged program): ld.so trusted
    // this file, and nothing else is loaded beside it.
    // SAFETY: getauxval has no preconditions.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return false;
    }
    let mut path = [0u8; 4096];
    let len = match locate::core_path(&mut path) {
        Ok(len) => len,
        Err(why) => {
            say(&[b"libgdrshim.so ", why, ONLY_FORWARD]);
            return false;
        }
    };
    let (Some(path_c), Some(shown)) = (path.get(..=len), path.get(..len)) else { return false };
    if let Err(why) = locate::whole_elf(path_c) {
        say(&[b"cannot load ", shown, b": it ", why, ONLY_FORWARD]);
        return false;
    }
    if !loaderlock::wait_free(loader_wait_ms()) {
        say(&[
            b"the loader's lock stayed held by another thread (a library's constructor waiting for this one?), so ",
            shown,
            b" was not loaded",
            ONLY_FORWARD,
        ]);
        return false;
    }
    // SAFETY: path is NUL-terminated. NODELETE: the hooks keep pointers into it.
    let h = unsafe {
        libc::dlopen(path.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE)
    };
    if h.is_null() {
        // SAFETY: dlerror has no preconditions.
        let e = unsafe { libc::dlerror() };
        if e.is_null() {
            say(&[b"cannot load ", shown, ONLY_FORWARD]);
        } else {
            // SAFETY: dlerror answered a C string of the loader's (which names the file).
            say(&[
                b"cannot load its core: ",
                unsafe { CStr::from_ptr(e) }.to_bytes(),
                ONLY_FORWARD,
            ]);
        }
        return false;
    }
    let Some(dlsym) = real_dlsym() else { return false };
    // SAFETY: lookups in the handle just opened, with valid C strings.
    let attach_fn = unsafe { dlsym(h, attach::ATTACH.as_ptr()) };
    let mut fns = [core::ptr::null_mut(); CORE_NAMES.len()];
    for (f, name) in fns.iter_mut().zip(CORE_NAMES) {
        // SAFETY: as above.
        *f = unsafe { dlsym(h, name.as_ptr()) };
    }
    if attach_fn.is_null() || fns.iter().any(|f| f.is_null()) {
        say(&[shown, b" is not a gdrshim core", ONLY_FORWARD]);
        return false;
    }
    // The same file preloaded itself too (LD_PRELOAD=.../lib/*.so), ahead of this front: its
    // hooks are the process's and this front is what they forward to; attached, it would hand
    // the calls back to them. It does the work alone, as when preloaded without a front.
    // (Preloaded after the front, it is attached like any core, and its lookups of the
    // functions after the front skip itself: `real::next`.)
    if locate::comes_first(attach_fn as usize, load_core as *const () as usize) {
        say(&[shown, b" is preloaded itself, ahead of libgdrshim.so: it does the work, and this front only forwards\n"]);
        return false;
    }
    let (fd_first, fd_more) = fdpages::share();
    let api = FrontApi {
        size: core::mem::size_of::<FrontApi>(),
        version: VERSION.as_ptr().cast(),
        next,
        object: load_core as *const c_void,
        fd_first,
        fd_more,
    };
    type AttachFn = unsafe extern "C" fn(*const FrontApi) -> c_int;
    // SAFETY: the core's gdrshim_core_attach, with this signature (src/hooks/front.rs).
    if unsafe { core::mem::transmute::<*mut c_void, AttachFn>(attach_fn)(&api) } != ATTACHED {
        say(&[shown, b" is of another gdrshim version than this front", ONLY_FORWARD]);
        return false;
    }
    for (slot, f) in CORE.iter().zip(fns) {
        slot.store(f, Release);
    }
    // last: a thread that sees the handle (attach) sees every function above too
    HANDLE.store(h, Release);
    true
}

/// [`loaderlock::WAIT_MS`]; a knobs build's tests shorten it (GDRSHIM_TEST_LOADER_WAIT_MS).
fn loader_wait_ms() -> u32 {
    #[cfg(feature = "knobs")]
    {
        // SAFETY: a NUL-terminated name; getenv only reads the environment.
        let v = unsafe { libc::getenv(c"GDRSHIM_TEST_LOADER_WAIT_MS".as_ptr()) };
        if !v.is_null() {
            // SAFETY: getenv's answer is a C string of the environment.
            let digits = unsafe { CStr::from_ptr(v) }.to_bytes();
            let mut n: u32 = 0;
            for &c in digits.iter().take(9).filter(|c| c.is_ascii_digit()) {
                n = n * 10 + (c - b'0') as u32;
            }
            return n;
        }
    }
    loaderlock::WAIT_MS
}

const ONLY_FORWARD: &[u8] = b"; its hooks only forward\n";

/// One line on stderr, the first time only: the front's only output, when it cannot have a core.
fn say(parts: &[&[u8]]) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    // a raw write: no cancellation point, no errno (sys.rs)
    sys::write_all(2, b"gdrshim: ");
    for part in parts {
        sys::write_all(2, part);
    }
}

/// This thread's errno.
fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno (a hook's answer that fails as libc's would).
fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}
