//! Which fds are NVIDIA device nodes: one cached byte per fd, for any fd number, so that an fd is
//! `fstat`ed once (at its first ioctl) and never again until it is closed.
//!
//! Classifying wakes nothing: a process that never touches an NVIDIA node costs an `fstat` per fd
//! it ioctls (a terminal, a socket), once a `stat` of /dev/nvidia-uvm, and the table's mappings
//! (a page at its first such ioctl; for fds from 4096 up, a 4 MiB directory of untouched zero
//! pages and a page per 4096 fds); no shim, no file. Opening files maps nothing.

use crate::abi::nodes;
use crate::decode::DevKind;
use crate::sys::{errno, set_errno};
use core::ffi::{c_int, CStr};
use once_cell::sync::OnceCell;

pub mod closegate;
pub mod forkgate;
pub mod own;
mod spin;
use gdrshim_common::{fdpages as pages, names};
pub use names::nvidia_path;
use pages::forget_if_mapped;
pub use pages::{adopt as adopt_front_table, cached, forget_range, store, NOT_NV, UNKNOWN};

const CTL: u8 = 2;
const UVM: u8 = 3;
const GPU0: u8 = 4;
/// A GPU node whose minor does not fit beside the [`pages::OWN`] bit: told by its `fstat` each
/// time (no machine has that many GPUs; the byte stays correct if one does).
const GPU_HIGH: u8 = pages::OWN - 1;

fn encode(k: Option<DevKind>) -> u8 {
    match k {
        None => NOT_NV,
        Some(DevKind::Ctl) => CTL,
        Some(DevKind::Uvm) => UVM,
        Some(DevKind::Gpu(n)) if n < u32::from(GPU_HIGH - GPU0) => GPU0 + n as u8,
        Some(DevKind::Gpu(_)) => GPU_HIGH,
    }
}
fn decode(b: u8) -> Option<DevKind> {
    match b {
        CTL => Some(DevKind::Ctl),
        UVM => Some(DevKind::Uvm),
        b if (GPU0..GPU_HIGH).contains(&b) => Some(DevKind::Gpu((b - GPU0) as u32)),
        _ => None,
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
        let test_dir = (!dir.is_null())
            .then(|| unsafe { CStr::from_ptr(dir) }.to_string_lossy().into_owned())
            .filter(|s| !s.is_empty());
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
        let uvm_rdev = stat_path("/dev/nvidia-uvm")
            .filter(|s| s.st_mode & libc::S_IFMT == libc::S_IFCHR)
            .map(|s| s.st_rdev);
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
    if chr && libc::major(st.st_rdev) == nodes::NV_MAJOR {
        // (nvidia-modeset and friends: none of ours)
        return nodes::node(nodes::NV_MAJOR, libc::minor(st.st_rdev)).map(|n| match n {
            nodes::Node::Ctl => DevKind::Ctl,
            nodes::Node::Gpu(m) => DevKind::Gpu(m),
        });
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
        GPU_HIGH => classify_fstat(fd),
        b => decode(b),
    }
}

/// Keeps errno (the ioctl hook relies on it).
#[cold]
#[inline(never)]
pub fn classify_and_cache(fd: c_int) -> Option<DevKind> {
    let e = errno();
    let k = classify_fstat(fd);
    // (an fd of gdrshim's own stays marked so)
    pages::store_kind(fd, encode(k));
    set_errno(e);
    k
}

/// An fd just opened: whatever its number held before is forgotten (the number may have been
/// closed behind our back, by a `close_range` or a raw syscall), and it is classified by its
/// `fstat` at its first ioctl. Not by its path: a node can be reached by any path (a bind mount,
/// a link), and a kind guessed from a name could hide an NVIDIA fd from the map. Maps nothing.
pub fn note_open(fd: c_int) {
    forget(fd);
}

/// `fd`'s kind is forgotten (a close under way); whether it is ours is `own`'s to change. Maps
/// nothing.
pub fn forget(fd: c_int) {
    forget_if_mapped(fd);
}

/// `new` is a dup of `old` now. In a table our marks do not describe (a `vfork` child's), the
/// byte is only forgotten: the parent's number is another file, and keeps its mark.
pub fn note_dup(old: c_int, new: c_int) {
    if new < 0 {
        return;
    }
    let b = cached(old);
    if (b == UNKNOWN && !pages::is_own(new)) || !own::foreign_table() {
        store(new, b);
    } else {
        pages::store_kind(new, UNKNOWN);
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
