//! The fd table's bytes: one per fd, for any fd number, in pages mapped on first use.
//!
//! The front library (src/front, no std) and the core keep one table: core and libc only here,
//! and nothing that can panic.

use core::ffi::c_int;
use core::sync::atomic::{
    AtomicPtr, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// A byte no one has classified (or one forgotten: the fd was closed or reopened).
pub const UNKNOWN: u8 = 0;
pub const NOT_NV: u8 = 1;

/// fds per page of the table; pages are mapped when an fd in them is first classified (fd numbers
/// go up to `RLIMIT_NOFILE`, at most 2^31).
///
/// Nothing of the table is in the library's own memory: a large `.bss` is one more mapping the
/// loader makes in every process at start-up (per-exec cost).
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
    // SAFETY: __errno_location returns this thread's errno slot.
    let e = unsafe { *libc::__errno_location() };
    // SAFETY: an anonymous private mapping of `bytes`; checked below.
    let m = unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        libc::mmap64(core::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
    };
    if m == libc::MAP_FAILED {
        // the byte stays unknown (looked at again); the hook's caller (a dup that worked) keeps
        // its errno
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = e };
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

/// The bit of a byte that says the fd is one gdrshim keeps for itself (the core's `fdtable::own`): set and
/// cleared only by its owner and by the hooks that close or replace a number; never copied by a
/// dup, never part of the kind [`cached`] answers.
pub const OWN: u8 = 0x80;

/// The highest fd number ever marked [`OWN`] (-1: none): a forked child looks no further.
static OWN_MAX: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(-1);
/// The highest fd number whose byte was ever stored (-1: none): a range forgotten looks no
/// further.
static HIGH: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(-1);

/// The cached kind of `fd`: [`UNKNOWN`], [`NOT_NV`] or an NVIDIA kind ([`OWN`] masked out).
#[inline(always)]
pub fn cached(fd: c_int) -> u8 {
    raw(fd) & !OWN
}

#[inline(always)]
fn raw(fd: c_int) -> u8 {
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

/// `fd` now names a new file (opened, closed, a dup's target): its byte is exactly `b`, and it
/// is not gdrshim's own.
pub fn store(fd: c_int, b: u8) {
    // an unknown byte needs no page; a byte that cannot be stored stays unknown (re-checked)
    if let Some(p) = page(fd, b != UNKNOWN) {
        p[fd as usize % PAGE].store(b, Relaxed);
        if b != UNKNOWN {
            HIGH.fetch_max(fd, Relaxed);
        }
    }
}

/// Every number in `[first, last]` names no file now (`close_range`, `closefrom`): its kind is
/// forgotten, as by a close of each. Whether a number is gdrshim's own is its owner's to change
/// (a `vfork` child's close closes nothing of the parent's). Maps nothing.
pub fn forget_range(first: c_int, last: c_int) {
    let last = last.min(HIGH.load(Relaxed));
    let mut fd = first.max(0);
    while fd <= last {
        let in_page = PAGE as c_int - fd % PAGE as c_int;
        if let Some(p) = page(fd, false) {
            for i in 0..in_page.min(last - fd + 1) {
                p[(fd + i) as usize % PAGE].fetch_and(OWN, Relaxed);
            }
        }
        match fd.checked_add(in_page) {
            Some(next) => fd = next,
            None => return,
        }
    }
}

/// `fd`'s kind, learnt by its `fstat`: whether it is gdrshim's own stays as it was.
pub fn store_kind(fd: c_int, b: u8) {
    if let Some(p) = page(fd, b != UNKNOWN) {
        let slot = &p[fd as usize % PAGE];
        let _ = slot.fetch_update(Relaxed, Relaxed, |old| Some((old & OWN) | (b & !OWN)));
        HIGH.fetch_max(fd, Relaxed);
    }
}

/// `fd` was just opened: its kind is forgotten, whether it is gdrshim's own stays (a stale mark
/// is told by the file check at each use; an open in a `vfork` child says nothing of its
/// parent's numbers). Maps nothing: a process that opens files and never ioctls them pays no
/// mapping.
pub fn forget_if_mapped(fd: c_int) {
    if let Some(p) = page(fd, false) {
        p[fd as usize % PAGE].fetch_and(OWN, Relaxed);
    }
}

/// Whether `fd` is marked as gdrshim's own.
pub fn is_own(fd: c_int) -> bool {
    raw(fd) & OWN != 0
}

/// Marks `fd` as gdrshim's own; `false` where its byte cannot be had (no page could be mapped).
pub fn mark_own(fd: c_int) -> bool {
    let Some(p) = page(fd, true) else { return false };
    p[fd as usize % PAGE].fetch_or(OWN, Relaxed);
    OWN_MAX.fetch_max(fd, Relaxed);
    HIGH.fetch_max(fd, Relaxed);
    true
}

/// `fd` is gdrshim's own no longer; whether it was.
pub fn clear_own(fd: c_int) -> bool {
    page(fd, false).is_some_and(|p| p[fd as usize % PAGE].fetch_and(!OWN, Relaxed) & OWN != 0)
}

/// The fds marked as gdrshim's own, lowest first, up to the highest ever marked; each is handed
/// to `f`. Maps nothing and allocates nothing (a forked child calls it).
pub fn each_own(mut f: impl FnMut(c_int)) {
    let max = OWN_MAX.load(Relaxed);
    let mut fd = 0;
    while fd <= max {
        if let Some(p) = page(fd, false) {
            for (i, b) in p.iter().enumerate() {
                let n = fd + i as c_int;
                if n > max {
                    return;
                }
                if b.load(Relaxed) & OWN != 0 {
                    f(n);
                }
            }
        }
        // fd is a page's first number: on to the next page
        match fd.checked_add(PAGE as c_int) {
            Some(next) => fd = next,
            None => return,
        }
    }
}

/// The table's first page and directory, both mapped now (null where that failed): what a front
/// hands the core it loads, so that the two keep one table.
pub fn share() -> (*mut core::ffi::c_void, *mut core::ffi::c_void) {
    let first = mapped(&FIRST, PAGE, true).map_or(core::ptr::null_mut(), |p| p.cast());
    let more = mapped(&MORE, PAGES * core::mem::size_of::<AtomicPtr<AtomicU8>>(), true)
        .map_or(core::ptr::null_mut(), |p| p.cast());
    (first, more)
}

/// Takes a front's table ([`share`]) as this one: every byte the front stored stays, and both
/// write the same bytes from now on. Pages of this copy's own (a core preloaded itself too,
/// whose hooks saw calls the front forwarded) are let go: the front stored those calls too.
///
/// # Safety
/// `first` and `more` are null or [`share`]'s answers in a front that is never unloaded.
pub unsafe fn adopt(first: *mut core::ffi::c_void, more: *mut core::ffi::c_void) {
    if !first.is_null() {
        FIRST.store(first.cast(), Release);
    }
    if !more.is_null() {
        MORE.store(more.cast(), Release);
    }
}
