//! Whether an `open` names an NVIDIA device node, for the core (`fdtable`) and the front: the
//! runtime starts at that `open` (docs/architecture.md, "the first touch").
//! `core` only, no allocation.

/// Whether `path` (a caller's C string) names an NVIDIA device node by its usual name:
/// `/dev/nvidia…` (a knobs build: the test stand-ins' folder too). Reads at most the prefix.
///
/// # Safety
/// `path` is a NUL-terminated C string.
#[inline(always)]
pub unsafe fn nvidia_path(path: *const core::ffi::c_char) -> bool {
    fn starts_with(path: *const core::ffi::c_char, prefix: &[u8]) -> bool {
        // SAFETY: the caller's NUL-terminated path, read byte by byte up to its NUL or the prefix's end.
        prefix.iter().enumerate().all(|(i, &c)| unsafe { *path.add(i) } as u8 == c)
    }
    if starts_with(path, b"/dev/nvidia") {
        return true;
    }
    #[cfg(feature = "knobs")]
    {
        // SAFETY: a NUL-terminated name; getenv only reads the environment.
        let dir = unsafe { libc::getenv(c"GDRSHIM_TEST_DEV_DIR".as_ptr()) };
        if !dir.is_null() {
            // SAFETY: getenv's answer is a C string of the environment.
            let d = unsafe { core::ffi::CStr::from_ptr(dir) }.to_bytes();
            // (a prefix compare stops at the path's NUL: a shorter path never matches)
            return !d.is_empty() && starts_with(path, d) && {
                // SAFETY: the path matched d's bytes, none of them NUL: it goes on past them.
                let rest = unsafe { path.add(d.len()) };
                starts_with(rest, b"/nvidia")
            };
        }
    }
    false
}
