//! Whether another thread holds the loader's lock (glibc's `_dl_load_lock`), and waiting for it
//! with a limit.
//!
//! `dlopen` holds that lock while it runs the constructors of what it loads. A constructor that
//! starts a thread and waits for it, where that thread makes the process's first NVIDIA call,
//! would wait forever for the front's own `dlopen` of the core, which waits for the lock. glibc
//! offers no try-lock of it, so the front finds the lock itself: inside a `dl_iterate_phdr`
//! callback this thread holds `_dl_load_write_lock`, the recursive mutex that glibc's
//! `_rtld_global` declares right after `_dl_load_lock`; it is the one mutex there whose owner is
//! this thread. Where that does not hold exactly (another glibc's layout), the front cannot tell
//! and loads the core as before.
//!
//! At the first GPU touch, when another thread holds the lock, the front waits for it to be let
//! go (a `dlopen` elsewhere: a moment), at most [`WAIT_MS`]; then it gives up the core, forwards
//! every call and says so once: the process runs on without GDR rather than hanging.

use crate::{elf, sys};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};

/// How long the first GPU touch waits for the loader's lock held by another thread.
pub const WAIT_MS: u32 = 10_000;

/// glibc's `pthread_mutex_t` on x86-64: 40 bytes, `__count` at 4, `__owner` at 8, `__kind` at 16.
const MUTEX: usize = 40;
const PTHREAD_MUTEX_RECURSIVE_NP: i32 = 1;

/// The address of `_dl_load_lock`: 0 not looked for yet, 1 cannot tell.
static LOCK: AtomicUsize = AtomicUsize::new(0);

fn word(at: usize) -> i32 {
    // SAFETY: `at` is 4-aligned inside `_rtld_global` (its symbol's size bounds the search),
    // which ld.so keeps mapped; the loader writes these words while we read them, hence atomics.
    unsafe { (*(at as *const AtomicI32)).load(Relaxed) }
}

fn recursive_mutex(m: usize) -> bool {
    word(m + 16) & 0x7f == PTHREAD_MUTEX_RECURSIVE_NP
}

struct Find {
    start: usize,
    size: usize,
    me: i32,
    found: usize,
}

unsafe extern "C" fn inside(
    _info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    // SAFETY: our own Find pointer.
    let f = unsafe { &mut *(data as *mut Find) };
    // (here this thread holds _dl_load_write_lock)
    let mut at = f.start + MUTEX;
    let owned = |m: usize| {
        m + MUTEX <= f.start + f.size
            && word(m + 8) == f.me
            && word(m + 4) >= 1
            && recursive_mutex(m)
    };
    while at + MUTEX <= f.start + f.size {
        if owned(at) {
            // the first mutex of ours: the write lock, or the load lock itself where this thread
            // is inside a dlopen too (then the write lock follows it, ours as well)
            let load_lock = if owned(at + MUTEX) { at } else { at - MUTEX };
            if recursive_mutex(load_lock) {
                f.found = load_lock;
            }
            break;
        }
        at += 8;
    }
    1
}

fn lock_address() -> Option<usize> {
    let mut l = LOCK.load(Relaxed);
    if l == 0 {
        l = 1;
        if let Some((start, size)) = elf::object_in(b"ld-linux-x86-64.so.2", b"_rtld_global") {
            let mut f = Find { start, size, me: sys::gettid(), found: 0 };
            // SAFETY: the callback reads inside _rtld_global and writes into `f`.
            unsafe { libc::dl_iterate_phdr(Some(inside), &mut f as *mut Find as *mut c_void) };
            if f.found != 0 {
                l = f.found;
            }
        }
        LOCK.store(l, Relaxed);
    }
    (l > 1).then_some(l)
}

/// Waits while another thread holds the loader's lock, at most `limit_ms`; whether it is free
/// of other threads now (or this cannot be told: then `dlopen` is tried as it always was).
pub fn wait_free(limit_ms: u32) -> bool {
    let Some(lock) = lock_address() else { return true };
    let me = sys::gettid();
    for _ in 0..limit_ms {
        let owner = word(lock + 8);
        if owner == 0 || owner == me {
            return true;
        }
        sys::sleep_a_millisecond();
    }
    false
}
