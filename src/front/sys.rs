//! The few system calls the front makes itself, as raw `syscall` instructions (x86-64 Linux).
//!
//! Not libc's: these are no cancellation points (a thread with a cancellation pending is never
//! cancelled inside the front), touch no errno, need no import and no lookup (which
//! takes the loader's lock), and pass through no hook of anyone's.

use core::ffi::c_int;

const SYS_WRITE: usize = 1;
const SYS_CLOSE: usize = 3;
const SYS_FSTAT: usize = 5;
const SYS_PREAD64: usize = 17;
const SYS_OPENAT: usize = 257;
const SYS_READLINKAT: usize = 267;
const AT_FDCWD: isize = -100;

/// One system call with up to four arguments; the kernel's answer (`-errno` on failure).
///
/// # Safety
/// The arguments must be what the kernel expects of `nr`: pointers valid for what it reads or
/// writes.
unsafe fn syscall4(nr: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let r: isize;
    // SAFETY: the caller's contract; the syscall instruction clobbers rcx and r11 only.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => r,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    r
}

/// `readlink(path)` into `out`: the length, or `None`.
pub fn readlink(path: &[u8], out: &mut [u8]) -> Option<usize> {
    if path.last() != Some(&0) {
        return None;
    }
    // SAFETY: a NUL-terminated path and a buffer of out.len() bytes the kernel may write.
    let n = unsafe {
        syscall4(
            SYS_READLINKAT,
            AT_FDCWD as usize,
            path.as_ptr() as usize,
            out.as_mut_ptr() as usize,
            out.len(),
        )
    };
    usize::try_from(n).ok()
}

/// An fd on `path` (NUL-terminated), read-only and close-on-exec.
pub fn open_read(path: &[u8]) -> Option<c_int> {
    if path.last() != Some(&0) {
        return None;
    }
    let flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) as usize;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { syscall4(SYS_OPENAT, AT_FDCWD as usize, path.as_ptr() as usize, flags, 0) };
    c_int::try_from(fd).ok().filter(|&fd| fd >= 0)
}

pub fn close(fd: c_int) {
    // SAFETY: closes our own fd.
    unsafe { syscall4(SYS_CLOSE, fd as usize, 0, 0, 0) };
}

pub fn fstat(fd: c_int) -> Option<libc::stat64> {
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: the kernel writes one struct stat (stat64 on x86-64) into st.
    let r =
        unsafe { syscall4(SYS_FSTAT, fd as usize, &mut st as *mut libc::stat64 as usize, 0, 0) };
    (r == 0).then_some(st)
}

/// Reads exactly `out.len()` bytes at `offset`, or fails.
pub fn pread_exact(fd: c_int, out: &mut [u8], offset: u64) -> bool {
    let mut done = 0;
    while let Some(rest) = out.get_mut(done..).filter(|r| !r.is_empty()) {
        // SAFETY: a buffer of rest.len() bytes the kernel may write.
        let n = unsafe {
            syscall4(
                SYS_PREAD64,
                fd as usize,
                rest.as_mut_ptr() as usize,
                rest.len(),
                offset as usize + done,
            )
        };
        match usize::try_from(n) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(_) if n == -(libc::EINTR as isize) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Writes `b` to `fd`; a short or failed write is let go after what could be written.
pub fn write_all(fd: c_int, b: &[u8]) {
    let mut done = 0;
    while let Some(rest) = b.get(done..).filter(|r| !r.is_empty()) {
        // SAFETY: a buffer of rest.len() bytes the kernel reads.
        let n = unsafe { syscall4(SYS_WRITE, fd as usize, rest.as_ptr() as usize, rest.len(), 0) };
        match usize::try_from(n) {
            Ok(0) => return,
            Ok(n) => done += n,
            Err(_) if n == -(libc::EINTR as isize) => {}
            Err(_) => return,
        }
    }
}

pub fn gettid() -> i32 {
    const SYS_GETTID: usize = 186;
    // SAFETY: no arguments.
    unsafe { syscall4(SYS_GETTID, 0, 0, 0, 0) as i32 }
}

/// Sleeps about a millisecond (an interruption ends it early).
pub fn sleep_a_millisecond() {
    const SYS_NANOSLEEP: usize = 35;
    let t = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    // SAFETY: a valid timespec; no remainder wanted.
    unsafe { syscall4(SYS_NANOSLEEP, &t as *const libc::timespec as usize, 0, 0, 0) };
}
