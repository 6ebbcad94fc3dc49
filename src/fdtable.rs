//! Which fds are NVIDIA device nodes: one cached byte per fd, for any fd number, so that an fd is
//! `fstat`ed once (at its first ioctl) and never again until it is closed.
//!
//! Classifying wakes nothing: a process that never touches an NVIDIA node costs an `fstat` per fd
//! it ioctls (a terminal, a socket), once a `stat` of /dev/nvidia-uvm, and the table's mappings
//! (a page at its first such ioctl; for fds from 4096 up, a 4 MiB directory of untouched zero
//! pages and a page per 4096 fds); no shim, no file. Opening files maps nothing.

use crate::decode::DevKind;
use crate::sys::{errno, set_errno};
use core::ffi::{c_int, CStr};
use core::sync::atomic::{
    AtomicPtr, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use once_cell::sync::OnceCell;

pub const UNKNOWN: u8 = 0;
pub const NOT_NV: u8 = 1;
const CTL: u8 = 2;
const UVM: u8 = 3;
const GPU0: u8 = 4;

/// fds per page of the table; pages are mapped when an fd in them is first classified (fd numbers
/// go up to `RLIMIT_NOFILE`, at most 2^31).
///
/// Nothing of the table is in the library's own memory: a large `.bss` is one more mapping the
/// loader makes in every process at start-up (issue 16's per-exec cost).
const PAGE: usize = 4096;
const PAGES: usize = (i32::MAX as usize + 1) / PAGE;
/// Page 0 (fds below 4096); null until an fd there is classified, and a null page is all UNKNOWN.
static FIRST: AtomicPtr<AtomicU8> = AtomicPtr::new(core::ptr::null_mut());
/// The directory of pages 1.. by fd / PAGE (512 Ki pointers: 4 MiB of zero pages the kernel backs
/// only where touched), mapped when an fd of 4096 or more is first classified.
static MORE: AtomicPtr<AtomicPtr<AtomicU8>> = AtomicPtr::new(core::ptr::null_mut());

/// The zeroed mapping of `bytes` in `slot`, mapped now if `create` (never freed: fds are reused).
fn mapped<T>(slot: &AtomicPtr<T>, bytes: usize, create: bool) -> Option<*mut T> {
    let p = slot.load(Acquire);
    if !p.is_null() {
        return Some(p);
    }
    if !create {
        return None;
    }
    // mmap, not malloc: this runs inside hooks (a signal handler's ioctl, a forked child).
    // NORESERVE: the directory is 4 MiB of which a page or two is ever touched; not charged
    // against a strict overcommit limit.
    let e = errno();
    // SAFETY: an anonymous private mapping of `bytes`; checked below.
    let m = unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        libc::mmap64(core::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
    };
    if m == libc::MAP_FAILED {
        // the byte stays unknown (looked at again); the hook's caller (a dup that worked) keeps
        // its errno
        set_errno(e);
        return None;
    }
    match slot.compare_exchange(core::ptr::null_mut(), m as *mut T, AcqRel, Acquire) {
        Ok(_) => Some(m as *mut T),
        Err(other) => {
            // another thread mapped it first
            // SAFETY: our own mapping of `bytes`, never shared.
            unsafe { libc::munmap(m, bytes) };
            Some(other)
        }
    }
}

/// The page holding `fd`'s byte, mapped if `create`.
fn page(fd: c_int, create: bool) -> Option<&'static [AtomicU8; PAGE]> {
    let fd = usize::try_from(fd).ok()?;
    let p = if fd < PAGE {
        mapped(&FIRST, PAGE, create)?
    } else {
        let dir = mapped(&MORE, PAGES * core::mem::size_of::<AtomicPtr<AtomicU8>>(), create)?;
        // SAFETY: dir is a live, zero-initialised mapping of PAGES pointers that is never
        // unmapped, fd / PAGE < PAGES, and null is a valid AtomicPtr.
        let slot = unsafe { &*dir.add(fd / PAGE) };
        mapped(slot, PAGE, create)?
    };
    // SAFETY: p is a live, zero-initialised mapping of PAGE bytes that is never unmapped; a byte
    // of zeros is a valid AtomicU8.
    Some(unsafe { &*(p as *const [AtomicU8; PAGE]) })
}

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
    let first = FIRST.load(Acquire);
    if fd >= 0 && (fd as usize) < PAGE && !first.is_null() {
        // SAFETY: a page of PAGE AtomicU8 (see `page`), and fd < PAGE.
        unsafe { (*first.add(fd as usize)).load(Relaxed) }
    } else {
        cached_high(fd)
    }
}

#[cold]
fn cached_high(fd: c_int) -> u8 {
    page(fd, false).map_or(UNKNOWN, |p| p[fd as usize % PAGE].load(Relaxed))
}

pub fn store(fd: c_int, b: u8) {
    // an unknown byte needs no page; a byte that cannot be stored stays unknown (re-checked)
    if let Some(p) = page(fd, b != UNKNOWN) {
        p[fd as usize % PAGE].store(b, Relaxed);
    }
}

/// Like [`store`], but maps nothing: a process that opens files and never ioctls them pays no
/// mapping.
fn store_if_mapped(fd: c_int, b: u8) {
    if let Some(p) = page(fd, false) {
        p[fd as usize % PAGE].store(b, Relaxed);
    }
}

struct Nodes {
    uvm_rdev: Option<u64>,
    /// Test stand-ins: (st_dev, st_ino) of the files in GDRSHIM_TEST_DEV_DIR.
    test: Vec<((u64, u64), DevKind)>,
}

static NODES: OnceCell<Nodes> = OnceCell::new();

// stat64/fstat64/mmap64: the names std imports too, so the loader resolves one name fewer in every
// process (the same functions as stat/fstat/mmap on x86-64)
fn stat_path(p: &str) -> Option<libc::stat64> {
    let c = std::ffi::CString::new(p).ok()?;
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: c is a valid C string and st a valid out-buffer.
    (unsafe { libc::stat64(c.as_ptr(), &mut st) } == 0).then_some(st)
}

/// What the device nodes are. libc's getenv, not std's: std's takes a lock a fork could leave held.
fn nodes() -> &'static Nodes {
    NODES.get_or_init(|| {
        // (a knobs build's test stand-ins; a release build never looks)
        #[cfg(feature = "knobs")]
        // SAFETY: a NUL-terminated name; getenv only reads the environment.
        let dir = unsafe { libc::getenv(c"GDRSHIM_TEST_DEV_DIR".as_ptr()) };
        #[cfg(not(feature = "knobs"))]
        let dir: *const core::ffi::c_char = core::ptr::null();
        // SAFETY: getenv returned a NUL-terminated string of the environment, or null.
        let test_dir = (!dir.is_null()).then(|| unsafe { CStr::from_ptr(dir) }.to_string_lossy().into_owned()).filter(|s| !s.is_empty());
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
        // nvidia-uvm has a dynamic major: its node says which (the only path CUDA opens it by)
        let uvm_rdev = stat_path("/dev/nvidia-uvm").filter(|s| s.st_mode & libc::S_IFMT == libc::S_IFCHR).map(|s| s.st_rdev);
        Nodes { uvm_rdev, test }
    })
}

/// Classifies an fd from its `fstat`. Preserves errno.
pub fn classify_fstat(fd: c_int) -> Option<DevKind> {
    let e = errno();
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into st only.
    let ok = unsafe { libc::fstat64(fd, &mut st) } == 0;
    set_errno(e);
    if !ok {
        return None;
    }
    let chr = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
    if chr && libc::major(st.st_rdev) == 195 {
        return match libc::minor(st.st_rdev) {
            255 => Some(DevKind::Ctl),
            m if m <= 247 => Some(DevKind::Gpu(m)),
            _ => None, // nvidia-modeset and friends
        };
    }
    // only a character device can be nvidia-uvm, only a plain file a test stand-in
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    if !chr && !regular {
        return None;
    }
    let n = nodes();
    if !n.test.is_empty() {
        return n.test.iter().find(|(id, _)| *id == (st.st_dev, st.st_ino)).map(|(_, k)| *k);
    }
    (chr && Some(st.st_rdev) == n.uvm_rdev).then_some(DevKind::Uvm)
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

/// Keeps errno (the ioctl hook relies on it).
#[cold]
#[inline(never)]
pub fn classify_and_cache(fd: c_int) -> Option<DevKind> {
    let e = errno();
    let k = classify_fstat(fd);
    store(fd, encode(k));
    set_errno(e);
    k
}

/// An fd just opened: whatever its number held before is forgotten (the number may have been
/// closed behind our back, by a `close_range` or a raw syscall), and it is classified by its
/// `fstat` at its first ioctl. Not by its path: a node can be reached by any path (a bind mount,
/// a link), and a kind guessed from a name could hide an NVIDIA fd from the map. Maps nothing.
pub fn note_open(fd: c_int) {
    store_if_mapped(fd, UNKNOWN);
}

pub fn note_dup(old: c_int, new: c_int) {
    if new >= 0 {
        store(new, cached(old));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_fd_number_has_a_byte() {
        for fd in [0, 4095, 4096, 70_000, 1 << 20, i32::MAX] {
            assert_eq!(cached(fd), UNKNOWN);
            store(fd, NOT_NV);
            assert_eq!(cached(fd), NOT_NV, "fd {fd}");
            store(fd, UNKNOWN);
            assert_eq!(cached(fd), UNKNOWN);
        }
        assert_eq!(cached(-1), UNKNOWN);
        store(-1, NOT_NV);
        assert_eq!(cached(-1), UNKNOWN, "no byte for a negative fd");
    }
}
