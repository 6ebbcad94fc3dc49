//! Whether the hooks work in this process, read first by every hooked call: the hot line that
//! also holds the runtime's pointer and libc's `ioctl`; the first look at the environment; fork
//! handling; and whether this copy of gdrshim is the one whose hooks the process calls.

use crate::config::mode_word;
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering::Relaxed};

/// What every hooked call reads first, in one cache line: between two NVIDIA calls the driver's
/// own work evicts the caches, and each line a hook touches is a miss.
#[repr(C, align(64))]
pub struct HookHotState {
    /// 0 = not read yet, [`OFF`], [`ACTIVE`], [`PAUSED`]. Read from the environment alone (and
    /// AT_SECURE), so that the off mode never initialises anything.
    pub active: AtomicU8,
    /// The runtime once it is initialised (`shim::get`, which alone reads and writes it).
    pub shim: AtomicPtr<c_void>,
    /// libc's `ioctl`.
    pub ioctl: crate::real::NextFn,
}
pub static HOOK: HookHotState = HookHotState {
    active: AtomicU8::new(0),
    shim: AtomicPtr::new(core::ptr::null_mut()),
    ioctl: crate::real::NextFn::libc(),
};
const _: () = assert!(core::mem::size_of::<HookHotState>() == 64);

/// `HOOK.active`: hooks forward only (off mode, secure execution, a forked child, another copy).
pub const OFF: u8 = 1;
/// `HOOK.active`: hooks work.
pub const ACTIVE: u8 = 2;
/// `HOOK.active` while a benchmark has paused the hooks (`gdrshim_bench_pause`, knobs builds).
pub const PAUSED: u8 = 3;

#[inline(always)]
pub fn active() -> bool {
    match HOOK.active.load(Relaxed) {
        ACTIVE => true,
        0 => first_active(),
        _ => false, // OFF, PAUSED
    }
}

/// The first look at the environment (every hook asks `active`: this part stays out of line).
/// Nothing here may wait on anything: a fork can catch another thread in the middle of it, and
/// a forked child must never wait for a thread it does not have.
#[cold]
#[inline(never)]
fn first_active() -> bool {
    // (the hook's caller keeps its errno: dladdr, getenv and the loader may leave theirs)
    // SAFETY: __errno_location returns this thread's errno slot.
    let e = unsafe { *libc::__errno_location() };
    let on = first_active_inner();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    on
}

/// The mode GDRSHIM_MODE asks for (`gdrshim_mode()`'s numbers), read as [`first_active`] reads
/// it: what a shim not started yet will start in, without starting it.
pub fn asked_mode() -> i32 {
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    let v = unsafe { libc::getenv(c"GDRSHIM_MODE".as_ptr()) };
    // SAFETY: getenv answered null or a NUL-terminated string of the environment.
    mode_word::effective((!v.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(v) }.to_bytes()))
}

fn first_active_inner() -> bool {
    // Secure execution (setuid/setgid, or /etc/ld.so.preload reaching a privileged
    // program): inert, and no environment variable is even read.
    // SAFETY: getauxval has no preconditions.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    // GDRSHIM_MODE (config::ENV_MODE) through libc's getenv: std's takes a lock that a fork
    // could leave held.
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    let mode = unsafe { libc::getenv(c"GDRSHIM_MODE".as_ptr()) };
    let off = secure
        || (!mode.is_null() && {
            // SAFETY: getenv returned a NUL-terminated string of the environment.
            let v = unsafe { core::ffi::CStr::from_ptr(mode) }.to_bytes();
            mode_word::parse(v) == Some(mode_word::OFF)
        })
        || another_copy_first();
    if !off {
        // Before anything can start initialising: a fork while another thread is inside the
        // one-time initialisation would leave the child waiting on it forever.
        install_fork_handler();
    }
    // a forked child may have turned inert meanwhile: that stays
    let _ = HOOK.active.compare_exchange(0, if off { OFF } else { ACTIVE }, Relaxed, Relaxed);
    HOOK.active.load(Relaxed) == ACTIVE
}

/// Whether another copy of gdrshim owns the process's global names (two copies preloaded, or this
/// one loaded again under another path): that copy does the work, this one stays inert and says
/// so once, so the process gets one registration per MR and one summary.
fn another_copy_first() -> bool {
    // (our own exported names may resolve to the other copy even from inside this one: the
    // object is told by the address of a function nobody can interpose)
    let global = crate::real::elf::first_definition(b"gdrshim_version");
    let (Some(theirs), Some(ours)) = (object_of(global as *mut c_void), object_of(this_copy()))
    else {
        return false;
    };
    // (a dlopened copy's RTLD_DEFAULT sees its own scope: this library itself is no other copy)
    if theirs.0 == ours.0
        || object_of(another_copy_first as *mut c_void).is_some_and(|me| me.0 == theirs.0)
    {
        return false;
    }
    crate::log::raw_line(
        "WARN",
        &format!(
            "another copy of gdrshim ({}) is loaded before this one ({}): this copy stays inert",
            theirs.1, ours.1
        ),
    );
    true
}

/// An address inside the object whose exports are this copy's hooks: the front that loaded it
/// (src/front), or this copy itself.
fn this_copy() -> *mut c_void {
    crate::real::front_object().unwrap_or(this_copy as *mut c_void)
}

/// The loaded object `p` lies in: its base address and file name. Through the loader's list
/// (`real::elf`), not `dladdr`: the process's first NVIDIA call may come from a thread that a
/// library's constructor started and waits for, while `dlopen` holds the loader's lock.
fn object_of(p: *mut c_void) -> Option<(usize, String)> {
    let (base, name) = crate::real::elf::object_holding(p as usize)?;
    let name = if name.is_null() {
        "?".into()
    } else {
        // SAFETY: a C string of the loader's.
        unsafe { core::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    Some((base, name))
}

/// [`hooks_in_place`], looked at once (it cannot change for a loaded copy): a query asked in a
/// loop must not walk the loader's list each time (`dl_iterate_phdr` holds the loader's write
/// lock, which a fork by another thread would leave held in the child).
pub fn hooks_in_place_once() -> bool {
    static IN_PLACE: AtomicU8 = AtomicU8::new(0);
    match IN_PLACE.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = hooks_in_place();
            IN_PLACE.store(if yes { 1 } else { 2 }, Relaxed);
            yes
        }
    }
}

/// Whether this copy's hooks really see the process's calls: its names are the process's global
/// ones (not a copy loaded with `dlopen`, whose hooks nothing calls), and `ioctl` resolves to it
/// or to another interposer ahead of it, not straight to libc. (The global names as the loader's
/// list has them, without `dlsym`: see [`object_of`].)
pub fn hooks_in_place() -> bool {
    let version = crate::real::elf::first_definition(b"gdrshim_version") as *mut c_void;
    let ioctl = crate::real::elf::first_definition(b"ioctl") as *mut c_void;
    let ours = object_of(this_copy()).map(|o| o.0);
    ours.is_some()
        && crate::real::elf::loaded_before_libc(this_copy() as usize)
        && object_of(version).map(|o| o.0) == ours
        && !ioctl.is_null()
        && ioctl != HOOK.ioctl.get(c"ioctl", None)
}

/// Installs [`fork_child`] once; returns when it is installed. Threads that come while another
/// installs it wait for it, since none may go on to initialise without it. The state word
/// carries the installer's pid: a child forked in the middle finds its parent's installer gone
/// and installs the handler itself (its parent cannot have initialised anything yet).
fn install_fork_handler() {
    use core::sync::atomic::AtomicU64;
    const DONE: u64 = 2;
    static AT_FORK: AtomicU64 = AtomicU64::new(0);
    // SAFETY: getpid has no preconditions.
    let me = (unsafe { libc::getpid() } as u64) << 2 | 1;
    loop {
        match AT_FORK.compare_exchange(0, me, Relaxed, Relaxed) {
            Ok(_) => {
                // SAFETY: extern "C" fns without arguments, as pthread_atfork requires.
                unsafe {
                    libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
                };
                AT_FORK.store(DONE, core::sync::atomic::Ordering::Release);
                return;
            }
            Err(DONE) => return,
            Err(other) if other >> 2 != me >> 2 => {
                // installing in a process that is not this one: we were forked meanwhile
                let _ = AT_FORK.compare_exchange(other, 0, Relaxed, Relaxed);
            }
            Err(_) => std::thread::yield_now(),
        }
    }
}

// fork() after the shim is up (so after CUDA was initialised in this process): the child can
// inherit locks held by threads that do not exist in it, and CUDA does not let a forked child use
// the parent's context anyway. The child turns inert (pure pass-through, no summary) until it
// execs, which starts a fresh shim; the parent is untouched. Before the child's code runs it
// closes every fd gdrshim kept (O_CLOEXEC helps only at exec): a dma-buf holds its GPU memory
// while any copy of its fd lives, and a long-lived worker (a DataLoader's) would otherwise keep
// the parent's freed memory for its whole life.
//
// The fd lock is held across the fork itself (fork_prepare, released by fork_parent and in the
// child): the kernel copies the fd table before the memory, and a close of ours between the two
// would leave the child an fd our table there no longer names (fdtable::own::before_fork).
extern "C" fn fork_prepare() {
    crate::fdtable::own::before_fork();
}

extern "C" fn fork_parent() {
    crate::fdtable::own::after_fork_in_parent();
}

extern "C" fn fork_child() {
    HOOK.active.store(OFF, Relaxed);
    crate::fdtable::own::close_all_in_child();
}

/// libc's `ioctl` (its cache sits in the hooks' hot line).
#[inline(always)]
pub fn real_ioctl(
) -> Option<unsafe extern "C" fn(libc::c_int, libc::c_ulong, *mut c_void) -> libc::c_int> {
    let p = HOOK.ioctl.get(c"ioctl", None);
    // SAFETY: p is the next definition of libc's ioctl, which has exactly this C signature.
    (!p.is_null()).then(|| unsafe {
        core::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(libc::c_int, libc::c_ulong, *mut c_void) -> libc::c_int,
        >(p)
    })
}
