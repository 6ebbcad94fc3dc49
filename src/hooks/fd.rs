//! Which fds are NVIDIA device nodes. A table of one byte per fd (below 4096) caches the answer;
//! fds the shim did not see opened, or above the table, are classified with `fstat`.

use crate::decode::DevKind;
use crate::real;
use crate::shim::{active, errno, set_errno, Guard};
use core::ffi::{c_char, c_int, CStr};
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};
use once_cell::sync::OnceCell;

const TABLE: usize = 4096;
pub const UNKNOWN: u8 = 0;
pub const NOT_NV: u8 = 1;
const CTL: u8 = 2;
const UVM: u8 = 3;
const GPU0: u8 = 4;

static KIND: [AtomicU8; TABLE] = [const { AtomicU8::new(UNKNOWN) }; TABLE];

fn encode(k: Option<DevKind>) -> u8 {
    match k {
        None => NOT_NV,
        Some(DevKind::Ctl) => CTL,
        Some(DevKind::Uvm) => UVM,
        Some(DevKind::Gpu(n)) => GPU0 + n as u8,
    }
}
fn decode(b: u8) -> Option<DevKind> {
    match b {
        CTL => Some(DevKind::Ctl),
        UVM => Some(DevKind::Uvm),
        b if b >= GPU0 => Some(DevKind::Gpu((b - GPU0) as u32)),
        _ => None,
    }
}

/// The cached byte for `fd`: [`UNKNOWN`], [`NOT_NV`] or an NVIDIA kind.
#[inline(always)]
pub fn cached(fd: c_int) -> u8 {
    if fd >= 0 && (fd as usize) < TABLE {
        KIND[fd as usize].load(Relaxed)
    } else {
        UNKNOWN
    }
}

fn store(fd: c_int, b: u8) {
    if fd >= 0 && (fd as usize) < TABLE {
        KIND[fd as usize].store(b, Relaxed);
    }
}

struct Nodes {
    uvm_rdev: Option<u64>,
    /// Test stand-ins: (st_dev, st_ino) of the files in GDRSHIM_TEST_DEV_DIR.
    test: Vec<((u64, u64), DevKind)>,
    test_dir: Option<String>,
}

static NODES: OnceCell<Nodes> = OnceCell::new();

fn stat_path(p: &str) -> Option<libc::stat> {
    let c = std::ffi::CString::new(p).ok()?;
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: c is a valid C string and st a valid out-buffer.
    (unsafe { libc::stat(c.as_ptr(), &mut st) } == 0).then_some(st)
}

fn nodes() -> &'static Nodes {
    NODES.get_or_init(|| {
        let test_dir = std::env::var(crate::config::ENV_TEST_DEV_DIR).ok().filter(|s| !s.is_empty());
        let mut test = Vec::new();
        if let Some(d) = &test_dir {
            let mut add = |name: String, k: DevKind| {
                if let Some(st) = stat_path(&format!("{d}/{name}")) {
                    test.push(((st.st_dev, st.st_ino), k));
                }
            };
            add("nvidiactl".into(), DevKind::Ctl);
            add("nvidia-uvm".into(), DevKind::Uvm);
            for n in 0..8 {
                add(format!("nvidia{n}"), DevKind::Gpu(n));
            }
        }
        // nvidia-uvm has a dynamic major: /proc/devices names it.
        let uvm_major = std::fs::read_to_string("/proc/devices").ok().and_then(|t| {
            t.lines().find_map(|l| {
                let mut it = l.split_whitespace();
                let major: u32 = it.next()?.parse().ok()?;
                (it.next()? == "nvidia-uvm").then_some(major)
            })
        });
        let uvm_rdev = uvm_major.map(|m| libc::makedev(m, 0)).or_else(|| stat_path("/dev/nvidia-uvm").map(|s| s.st_rdev));
        Nodes { uvm_rdev, test, test_dir }
    })
}

/// Classifies an fd from its `fstat`. Preserves errno.
pub fn classify_fstat(fd: c_int) -> Option<DevKind> {
    let e = errno();
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into st only.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    set_errno(e);
    if !ok {
        return None;
    }
    let n = nodes();
    if !n.test.is_empty() {
        return n.test.iter().find(|(id, _)| *id == (st.st_dev, st.st_ino)).map(|(_, k)| *k);
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return None;
    }
    let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    if major == 195 {
        return match minor {
            255 => Some(DevKind::Ctl),
            m if m <= 247 => Some(DevKind::Gpu(m)),
            _ => None, // nvidia-modeset and friends
        };
    }
    (Some(st.st_rdev) == n.uvm_rdev).then_some(DevKind::Uvm)
}

/// The NVIDIA kind of `fd`, classifying and caching it if needed.
#[inline]
pub fn kind(fd: c_int) -> Option<DevKind> {
    match cached(fd) {
        NOT_NV => None,
        UNKNOWN => classify_and_cache(fd),
        b => decode(b),
    }
}

/// Keeps errno (the ioctl hook relies on it): the first call also reads /proc/devices.
#[cold]
#[inline(never)]
fn classify_and_cache(fd: c_int) -> Option<DevKind> {
    let e = errno();
    let k = classify_fstat(fd);
    store(fd, encode(k));
    set_errno(e);
    k
}

fn note_open(fd: c_int, path: *const c_char) {
    if fd < 0 || !active() {
        return;
    }
    let Some(_g) = Guard::enter() else {
        store(fd, UNKNOWN);
        return;
    };
    // SAFETY: the real open just accepted path as a valid C string.
    let p = if path.is_null() { &[][..] } else { unsafe { CStr::from_ptr(path) }.to_bytes() };
    let dev_path = p.starts_with(b"/dev/") || nodes().test_dir.as_deref().is_some_and(|d| p.starts_with(d.as_bytes()));
    // Other absolute paths are never device nodes of ours; relative ones are checked lazily.
    store(fd, if dev_path || !p.starts_with(b"/") { UNKNOWN } else { NOT_NV });
}

fn note_dup(old: c_int, new: c_int) {
    if new >= 0 {
        store(new, cached(old));
    }
}

macro_rules! missing {
    () => {{
        set_errno(libc::ENOSYS);
        return -1;
    }};
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let Some(f) = real::open() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(path, flags, mode) };
    let e = errno();
    note_open(fd, path);
    set_errno(e);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let Some(f) = real::open64() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(path, flags, mode) };
    let e = errno();
    note_open(fd, path);
    set_errno(e);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let Some(f) = real::openat() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(dirfd, path, flags, mode) };
    let e = errno();
    note_open(fd, path);
    set_errno(e);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let Some(f) = real::openat64() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(dirfd, path, flags, mode) };
    let e = errno();
    note_open(fd, path);
    set_errno(e);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let Some(f) = real::close() else { missing!() };
    // The number is free once close starts: forget it first, so a racing open can only
    // make us re-check it, never keep a stale kind.
    store(fd, UNKNOWN);
    // SAFETY: forwarded unchanged.
    unsafe { f(fd) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(old: c_int) -> c_int {
    let Some(f) = real::dup() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(old) };
    note_dup(old, fd);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let Some(f) = real::dup2() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(old, new) };
    note_dup(old, fd);
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let Some(f) = real::dup3() else { missing!() };
    // SAFETY: forwarded unchanged.
    let fd = unsafe { f(old, new, flags) };
    note_dup(old, fd);
    fd
}

/// `fcntl` is variadic; every command takes at most one integer or pointer argument, which the
/// x86-64 ABI passes in the same register either way.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    let Some(f) = real::fcntl() else { missing!() };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        note_dup(fd, r);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: same contract as fcntl, which glibc's fcntl64 also implements.
    unsafe { fcntl(fd, cmd, arg) }
}
