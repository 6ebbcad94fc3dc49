//! The front's exports: the same names as the core's hooks (tests/front.rs compares the lists).

use crate::{
    attach, core_fn, Libc, CLOSE, CLOSEFROM, CLOSE_RANGE, DLCLOSE, DLSYM, DLVSYM, DUP, DUP2, DUP3,
    FCNTL, IOCTL, OPEN, OPEN64, OPEN64_2, OPENAT, OPENAT64, OPENAT64_2, OPENAT_2, OPEN_2,
    OPEN_BY_HANDLE_AT,
};
use crate::{errno, fallback, set_errno};
use core::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use core::mem::transmute;
use core::sync::atomic::{
    AtomicPtr, AtomicU64, AtomicU8, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use gdrshim_common::fdpages::{cached, forget_if_mapped, forget_range, store, NOT_NV, UNKNOWN};

macro_rules! libc_fn {
    ($name:literal, $ty:ty) => {{
        static F: Libc = Libc::new();
        let p = F.get($name);
        // SAFETY: p is the next definition of a libc function with exactly this C signature.
        (!p.is_null()).then(|| unsafe { transmute::<*mut c_void, $ty>(p) })
    }};
}

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

/// `ioctl` is variadic; its one optional argument travels in the third integer register.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if let Some(c) = core_fn(IOCTL) {
        // SAFETY: the core's ioctl hook, with the caller's arguments.
        return unsafe { transmute::<*mut c_void, IoctlFn>(c)(fd, request, arg) };
    }
    let Some(real) = libc_fn!(c"ioctl", IoctlFn) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let b = cached(fd);
    if b == NOT_NV || crate::no_core() || (b == UNKNOWN && !classify(fd)) || !attach() {
        // SAFETY: forwarded unchanged.
        return unsafe { real(fd, request, arg) };
    }
    // an NVIDIA node: the core has everything from its first call on
    match core_fn(IOCTL) {
        // SAFETY: the core's ioctl hook, with the caller's arguments.
        Some(c) => unsafe { transmute::<*mut c_void, IoctlFn>(c)(fd, request, arg) },
        // SAFETY: forwarded unchanged.
        None => unsafe { real(fd, request, arg) },
    }
}

/// Whether `fd` may be an NVIDIA device node, from its `fstat` (kept in the fd table). Keeps
/// errno. The same test as the core's `fdtable::classify_fstat`, less exact: the control and GPU
/// nodes (`abi/nodes.rs`), or /dev/nvidia-uvm's own number (its major is dynamic).
#[cold]
#[inline(never)]
fn classify(fd: c_int) -> bool {
    type FstatFn = unsafe extern "C" fn(c_int, *mut libc::stat64) -> c_int;
    let Some(fstat) = libc_fn!(c"fstat64", FstatFn) else { return true };
    let e = errno();
    // SAFETY: zeroed stat is a valid out-buffer, which fstat fills.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { fstat(fd, &mut st) } == 0;
    let kind = st.st_mode & libc::S_IFMT;
    let nv = ok
        && ((kind == libc::S_IFCHR
            && (crate::nodes::node(libc::major(st.st_rdev), libc::minor(st.st_rdev)).is_some()
                || Some(st.st_rdev) == uvm_rdev()))
            || (kind == libc::S_IFREG && test_devices()));
    set_errno(e);
    // An fd that may be an NVIDIA node stays unknown: the table is the core's too once it is
    // attached (FrontApi), and the core classifies such an fd exactly itself.
    if !nv {
        store(fd, NOT_NV);
    }
    nv
}

/// /dev/nvidia-uvm's device number, looked up once (0: not looked up; 1: none). A node made later
/// (nvidia-modprobe) stays unknown here, as in the core's `fdtable`: harmless, since CUDA's first
/// NVIDIA call is on /dev/nvidiactl (major 195), which attaches the core before any UVM call.
fn uvm_rdev() -> Option<u64> {
    static UVM: AtomicU64 = AtomicU64::new(0);
    let mut v = UVM.load(Acquire);
    if v == 0 {
        type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int;
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
        let found = libc_fn!(c"stat64", StatFn)
            // SAFETY: a C string path and a valid out-buffer.
            .is_some_and(|stat| unsafe { stat(c"/dev/nvidia-uvm".as_ptr(), &mut st) } == 0)
            && st.st_mode & libc::S_IFMT == libc::S_IFCHR;
        v = if found { st.st_rdev.saturating_add(2) } else { 1 };
        UVM.store(v, Release);
    }
    (v > 1).then(|| v - 2)
}

/// The tests' stand-in device nodes are plain files (a knobs build only): any plain file may be
/// one, and the core tells.
#[cfg(feature = "knobs")]
fn test_devices() -> bool {
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    let d = unsafe { libc::getenv(c"GDRSHIM_TEST_DEV_DIR".as_ptr()) };
    // SAFETY: getenv's answer is a C string of the environment, or null.
    !d.is_null() && unsafe { *d } != 0
}
#[cfg(not(feature = "knobs"))]
fn test_devices() -> bool {
    false
}

/// The `open` entry points: the core's once attached, else libc's and the fd table. The open of
/// an NVIDIA node by its usual name loads the core first and is the core's (which starts its
/// runtime there): a program's first NVIDIA ioctl may come from a signal handler that interrupted
/// `malloc` or the loader, where neither loading nor starting is safe; its `open` comes from
/// CUDA's initialisation.
macro_rules! open_hook {
    ($name:ident, $i:ident, $c:literal, ($($a:ident : $t:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            type F = unsafe extern "C" fn($($t),*) -> c_int;
            if let Some(c) = core_fn($i) {
                // SAFETY: the core's hook of the same name and signature.
                return unsafe { transmute::<*mut c_void, F>(c)($($a),*) };
            }
            let path: *const c_char = open_path!($($a),*);
            // SAFETY: a non-null path is the caller's NUL-terminated C string, as `open` takes it.
            if !path.is_null() && unsafe { crate::names::nvidia_path(path) } && !crate::no_core() && attach() {
                if let Some(c) = core_fn($i) {
                    // SAFETY: as above.
                    return unsafe { transmute::<*mut c_void, F>(c)($($a),*) };
                }
            }
            let Some(f) = libc_fn!($c, F) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwarded unchanged.
            let fd = unsafe { f($($a),*) };
            if fd >= 0 {
                // whatever the number held before is forgotten (maps nothing)
                forget_if_mapped(fd);
            }
            fd
        }
    };
}
use gdrshim_common::open_path;

open_hook!(open, OPEN, c"open", (path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(open64, OPEN64, c"open64", (path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(openat, OPENAT, c"openat", (dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t));
open_hook!(openat64, OPENAT64, c"openat64", (dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t));
// the fortified entry points (-D_FORTIFY_SOURCE) and open_by_handle_at: fds too (src/hooks/fd.rs)
open_hook!(__open_2, OPEN_2, c"__open_2", (path: *const c_char, flags: c_int));
open_hook!(__open64_2, OPEN64_2, c"__open64_2", (path: *const c_char, flags: c_int));
open_hook!(__openat_2, OPENAT_2, c"__openat_2", (dirfd: c_int, path: *const c_char, flags: c_int));
open_hook!(__openat64_2, OPENAT64_2, c"__openat64_2", (dirfd: c_int, path: *const c_char, flags: c_int));
open_hook!(open_by_handle_at, OPEN_BY_HANDLE_AT, c"open_by_handle_at", (mount_fd: c_int, handle: *mut c_void, flags: c_int));

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_int) -> c_int;
    if let Some(c) = core_fn(CLOSE) {
        // SAFETY: the core's close hook.
        return unsafe { transmute::<*mut c_void, F>(c)(fd) };
    }
    let Some(f) = libc_fn!(c"close", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // forgotten first: a racing open can only make us look at the number again
    store(fd, UNKNOWN);
    // SAFETY: forwarded unchanged.
    unsafe { f(fd) }
}

/// `dup`, `dup2`, `dup3`: the new number has the old one's byte.
macro_rules! dup_hook {
    ($name:ident, $i:ident, $c:literal, ($old:ident $(, $a:ident : $t:ty)*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($old: c_int $(, $a: $t)*) -> c_int {
            type F = unsafe extern "C" fn(c_int $(, $t)*) -> c_int;
            if let Some(c) = core_fn($i) {
                // SAFETY: the core's hook of the same name and signature.
                return unsafe { transmute::<*mut c_void, F>(c)($old $(, $a)*) };
            }
            let Some(f) = libc_fn!($c, F) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwarded unchanged.
            let fd = unsafe { f($old $(, $a)*) };
            if fd >= 0 {
                store(fd, cached($old));
            }
            fd
        }
    };
}
dup_hook!(dup, DUP, c"dup", (old));
dup_hook!(dup2, DUP2, c"dup2", (old, new: c_int));
dup_hook!(dup3, DUP3, c"dup3", (old, new: c_int, flags: c_int));

/// `close_range` and `closefrom` (glibc 2.34): the core's once attached (it lets go of its own
/// fds in the range); before, libc's, and every number in the range is forgotten.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
    if let Some(c) = core_fn(CLOSE_RANGE) {
        // SAFETY: the core's close_range hook.
        return unsafe { transmute::<*mut c_void, F>(c)(first, last, flags) };
    }
    let Some(f) = libc_fn!(c"close_range", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(first, last, flags) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        forget_range(
            c_int::try_from(first).unwrap_or(c_int::MAX),
            c_int::try_from(last).unwrap_or(c_int::MAX),
        );
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    type F = unsafe extern "C" fn(c_int);
    if let Some(c) = core_fn(CLOSEFROM) {
        // SAFETY: the core's closefrom hook.
        return unsafe { transmute::<*mut c_void, F>(c)(low) };
    }
    if let Some(f) = libc_fn!(c"closefrom", F) {
        // SAFETY: forwarded unchanged.
        unsafe { f(low) };
        forget_range(low.max(0), c_int::MAX);
    }
}

/// `fcntl` is variadic; every command takes at most one integer or pointer argument, which the
/// x86-64 ABI passes in the same register either way.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    unsafe { fcntl_any(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the same contract as fcntl, which glibc's fcntl64 also implements.
    unsafe { fcntl_any(fd, cmd, arg) }
}

/// Both names' body (not one calling the other's export: that is a symbol the loader looks up).
#[inline(always)]
unsafe fn fcntl_any(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    type F = unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int;
    if let Some(c) = core_fn(FCNTL) {
        // SAFETY: the core's fcntl hook.
        return unsafe { transmute::<*mut c_void, F>(c)(fd, cmd, arg) };
    }
    let Some(f) = libc_fn!(c"fcntl", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(fd, cmd, arg) };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        store(r, cached(fd));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void) -> c_int;
    let f = core_fn(DLCLOSE).or_else(|| libc_fn!(c"dlclose", F).map(|f| f as *mut c_void));
    // SAFETY: the core's dlclose hook or libc's, forwarded unchanged.
    f.map_or(-1, |f| unsafe { transmute::<*mut c_void, F>(f)(handle) })
}

// `dlsym` and `dlvsym`: glibc answers `RTLD_NEXT` from the return address of the call, so these
// are assembly stubs that ask [`pick`] and then jump (never call) on, with the caller's return
// address still on the stack: to libc's, or to the core's own stub, which does the same.
gdrshim_common::dl_stubs!(
    pick = pick,
    dlsym = crate::REAL_DLSYM,
    dlvsym = crate::REAL_DLVSYM,
    found = "jmp rax"
);

/// 0: on to libc's; 1: answer NULL (no libc `dlsym` found); else the core's stub to jump to.
/// A name the core may wrap (`ibv_…`, `cuX…`) attaches the core first.
extern "C" fn pick(handle: *mut c_void, name: *const c_char, version: *const c_char) -> usize {
    let which = if version.is_null() { DLSYM } else { DLVSYM };
    if let Some(c) = core_fn(which) {
        return c as usize;
    }
    if crate::real_dlsym().is_none() {
        return 1;
    }
    if handle == libc::RTLD_NEXT || name.is_null() {
        return 0;
    }
    // SAFETY: a non-null name is the caller's C string; its first bytes are read, up to the NUL.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    let ours = n.starts_with(b"ibv_")
        || n.starts_with(b"mlx5dv_")
        || (n.starts_with(b"cu") && n.get(2).is_some_and(u8::is_ascii_uppercase));
    if ours && attach() {
        if let Some(c) = core_fn(which) {
            return c as usize;
        }
    }
    // without a core: where the name is ours only (the front's stub), the answer without
    // gdrshim is none, with dlerror as after a failed lookup (none after the front either)
    let front = crate::elf::object_holding(pick as *const () as usize).map_or(0, |(base, _)| base);
    if ours && crate::elf::definition_at(front, n) != 0 && !crate::elf::defined_beside_gdrshim(n) {
        if let Some(dlsym) = crate::real_dlsym() {
            // SAFETY: a lookup of the caller's C string.
            unsafe { dlsym(libc::RTLD_NEXT, name) };
        }
        return 1;
    }
    0
}

/// The version of the core too: it takes only a front of its own version.
#[no_mangle]
pub extern "C" fn gdrshim_version() -> *const c_char {
    crate::VERSION.as_ptr().cast()
}

/// `name` as a NUL-terminated array (bytes only: a pointer in a static is a relocation the loader
/// writes in every process).
const fn c_array<const N: usize>(name: &str) -> [u8; N] {
    let mut a = [0u8; N];
    let b = name.as_bytes();
    let mut i = 0;
    while i < b.len() && i + 1 < N {
        a[i] = b[i];
        i += 1;
    }
    a
}

/// The CUDA, verbs and gdrshim entry points: the core's, loaded at the first call. Each is a stub
/// that jumps through its slot (the core's function once found), or else to [`slow`], which
/// finds it with every argument register kept. None is variadic, and none takes a float; an
/// argument passed in memory (`cuIpcOpenMemHandle_v2`'s 64-byte handle) stays where the caller
/// put it, since neither the stub nor [`slow`] leaves the stack other than it found it.
macro_rules! forwarded {
    ($($name:ident => $fallback:path;)*) => { $(
        #[allow(non_snake_case)]
        mod $name {
            pub static SLOT: core::sync::atomic::AtomicPtr<core::ffi::c_void> =
                core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());
            pub static NAME: [u8; stringify!($name).len() + 1] = super::c_array(stringify!($name));
        }
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + {slot}]",
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                "2: lea r11, [rip + {slot}]",
                "lea r10, [rip + {name}]",
                "lea rax, [rip + {fallback}]",
                "jmp {slow}",
                slot = sym $name::SLOT,
                name = sym $name::NAME,
                fallback = sym $fallback,
                slow = sym slow,
            )
        }
    )* };
}

/// Entered by a [`forwarded!`] stub with its slot in r11, its name in r10 and its fallback in
/// rax, and the caller's arguments untouched; jumps to what [`resolve`] finds.
#[unsafe(naked)]
unsafe extern "C" fn slow() {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "sub rsp, 8",
        "mov rdi, r11",
        "mov rsi, r10",
        "mov rdx, rax",
        "call {resolve}",
        "add rsp, 8",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        resolve = sym resolve,
    )
}

/// The core's `name` (kept in `slot`); without a core, the next definition (looked up each time:
/// a library after the front may be unloaded) or, for gdrshim's own names and where there is
/// none, `fallback`, which answers as the header says a process without gdrshim does.
extern "C" fn resolve(
    slot: &AtomicPtr<c_void>,
    name: *const c_char,
    fallback: *mut c_void,
) -> *mut c_void {
    let Some(dlsym) = crate::real_dlsym() else { return fallback };
    if crate::core_handle().is_null()
        // SAFETY: name is one of the stubs' NUL-terminated names.
        && ASKED_WITHOUT_A_GPU.contains(&unsafe { CStr::from_ptr(name) }.to_bytes())
        && preloaded()
    {
        // a query of ours is no GPU touch: answered as the core answers before its first NVIDIA
        // call, without loading it (a launcher, a tool, a script asks these). A front loaded with
        // dlopen sees no GPU touch ever: its core is loaded at the query, and says why it
        // registers nothing.
        return fallback;
    }
    if attach() {
        // SAFETY: a lookup in the core (loaded and never unloaded) of a C string of ours.
        let p = unsafe { dlsym(crate::core_handle(), name) };
        if !p.is_null() {
            slot.store(p, Release);
            return p;
        }
    }
    // SAFETY: name is one of the stubs' NUL-terminated names.
    let own = unsafe { CStr::from_ptr(name) }.to_bytes().starts_with(b"gdrshim_");
    // SAFETY: as above.
    let p = if own { core::ptr::null_mut() } else { unsafe { crate::next(name) } };
    if p.is_null() {
        fallback
    } else {
        p
    }
}

/// Whether this front's names are the process's global ones (preloaded), as the loader's list has
/// them (no `dlsym`, no lock).
/// Looked at once: `dl_iterate_phdr` takes the loader's write lock, and a query asked in a loop by
/// one thread while another forks would leave that lock held in the child (0 unknown, 1 yes, 2 no).
fn preloaded() -> bool {
    static PRELOADED: AtomicU8 = AtomicU8::new(0);
    match PRELOADED.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let ours = gdrshim_version as *const () as usize;
            // (the loader's list holds objects loaded with dlopen too, after libc)
            let yes = crate::elf::loaded_before_libc(ours)
                && crate::elf::first_definition(b"gdrshim_version") == ours;
            PRELOADED.store(if yes { 1 } else { 2 }, Relaxed);
            yes
        }
    }
}

/// gdrshim's queries that tools and launchers ask in processes that never touch a GPU: their
/// fallbacks are what the core answers before its first NVIDIA call (src/hooks/query.rs).
const ASKED_WITHOUT_A_GPU: [&[u8]; 5] = [
    b"gdrshim_mode",
    b"gdrshim_gdr_active",
    b"gdrshim_gdr_route",
    b"gdrshim_counters",
    b"gdrshim_lookup",
];

forwarded! {
    cuCtxDestroy_v2 => fallback::cuda_not_found;
    cuDevicePrimaryCtxReset_v2 => fallback::cuda_not_found;
    cuDevicePrimaryCtxRelease_v2 => fallback::cuda_not_found;
    cuDevicePrimaryCtxRetain => fallback::cuda_not_found;
    cuCtxCreate_v2 => fallback::cuda_not_found;
    cuDeviceGetAttribute => fallback::cuda_not_found;
    cuGetProcAddress => fallback::cuda_not_found;
    cuGetProcAddress_v2 => fallback::cuda_not_found;
    cuMemAllocAsync => fallback::cuda_not_found;
    cuMemAllocFromPoolAsync => fallback::cuda_not_found;
    cuMemAllocPitch_v2 => fallback::cuda_not_found;
    cuMemAlloc_v2 => fallback::cuda_not_found;
    cuMemCreate => fallback::cuda_not_found;
    cuMemFreeAsync => fallback::cuda_not_found;
    cuMemFree_v2 => fallback::cuda_not_found;
    cuMemGetHandleForAddressRange => fallback::cuda_not_found;
    cuIpcOpenMemHandle_v2 => fallback::cuda_not_found;
    cuIpcCloseMemHandle => fallback::cuda_not_found;
    cuMemPoolImportPointer => fallback::cuda_not_found;
    cuMemAddressFree => fallback::cuda_not_found;
    cuMemMap => fallback::cuda_not_found;
    cuMemRelease => fallback::cuda_not_found;
    cuMemSetAccess => fallback::cuda_not_found;
    cuMemUnmap => fallback::cuda_not_found;
    ibv_reg_mr => fallback::null_enosys;
    ibv_reg_mr_ex => fallback::null_enosys;
    ibv_reg_mr_iova => fallback::null_enosys;
    ibv_reg_mr_iova2 => fallback::null_enosys;
    ibv_reg_dmabuf_mr => fallback::null_enosys;
    ibv_rereg_mr => fallback::minus_one_enosys;
    ibv_dereg_mr => fallback::enosys;
    mlx5dv_devx_umem_reg => fallback::null_enosys;
    mlx5dv_devx_umem_reg_ex => fallback::null_enosys;
    mlx5dv_devx_umem_dereg => fallback::enosys;
    gdrshim_mode => fallback::asked_mode;
    gdrshim_gdr_active => fallback::zero;
    gdrshim_gdr_route => fallback::zero;
    gdrshim_export_dmabuf => fallback::minus_enosys;
    gdrshim_lookup => fallback::lookup_unseen;
    gdrshim_register => fallback::minus_enosys;
    gdrshim_counters => fallback::counters_unseen;
    gdrshim_unregister => fallback::minus_enoent;
    gdrshim_mark => fallback::nothing;
}

#[cfg(feature = "knobs")]
forwarded! {
    gdrshim_bench_pause => fallback::minus_enosys;
    gdrshim_test_touches => fallback::minus_enosys;
}
