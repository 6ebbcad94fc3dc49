//! The shim's own exports as the self-test reads them (include/gdrshim.h), looked up in this
//! process: whether it is loaded, its mode and route, its version and counters.

use core::ffi::{c_char, c_int, c_void};

/// `dlsym(RTLD_DEFAULT, name)`.
pub fn global_sym(name: &[u8]) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name (every caller passes a literal ending in \0).
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr() as *const c_char) }
}

pub fn shim_loaded() -> bool {
    !global_sym(b"gdrshim_version\0").is_null()
}

pub fn shim_int(name: &[u8]) -> Option<c_int> {
    let f = global_sym(name);
    if f.is_null() {
        return None;
    }
    // SAFETY: the shim's exported `int gdrshim_*(void)` queries (include/gdrshim.h).
    let f: unsafe extern "C" fn() -> c_int = unsafe { core::mem::transmute(f) };
    // SAFETY: as above; they take no arguments and never fail.
    Some(unsafe { f() })
}

/// `struct gdrshim_counters` of include/gdrshim.h, by name.
pub const COUNTER_NAMES: [&str; 13] = [
    "nv_ioctls",
    "native",
    "matched",
    "mismatched",
    "unpredicted",
    "pass0_hits",
    "pass0_misses",
    "registered",
    "unregistered",
    "rm_errors",
    "live_registrations",
    "host_mrs",
    "stood_aside",
];

pub fn counters() -> Option<[u64; 13]> {
    let f = global_sym(b"gdrshim_counters\0");
    if f.is_null() {
        return None;
    }
    // SAFETY: `int gdrshim_counters(struct gdrshim_counters *out, size_t size)` of gdrshim.h.
    let f: unsafe extern "C" fn(*mut u64, usize) -> c_int = unsafe { core::mem::transmute(f) };
    let mut c = [0u64; 13];
    // SAFETY: `c` is 13 u64s, the size we pass; the shim writes at most that many bytes.
    let n = unsafe { f(c.as_mut_ptr(), core::mem::size_of_val(&c)) };
    (n >= 0).then_some(c)
}

pub fn counter(c: &[u64; 13], name: &str) -> u64 {
    COUNTER_NAMES.iter().position(|n| *n == name).map_or(0, |i| c[i])
}

/// The fields gdrshim added after 0.2.0 (the DMA-BUF route's and BAR1's), after the 13 above.
pub const LATER_NAMES: [&str; 9] = [
    "dmabuf_exports",
    "dmabuf_reused",
    "dmabuf_buffers",
    "registered_bytes",
    "registered_peak_bytes",
    "exported_bytes",
    "exported_peak_bytes",
    "bar1_bytes",
    "bar1_static",
];

/// Every counter this tool knows: the 13 of 0.2.0, then the later ones.
pub type AllCounters = [u64; 22];

/// `struct gdrshim_counters` as far as this tool knows it; a field the loaded gdrshim does not
/// write (an older one: it says how many bytes it wrote) stays 0.
pub fn all_counters() -> Option<AllCounters> {
    let f = global_sym(b"gdrshim_counters\0");
    if f.is_null() {
        return None;
    }
    // SAFETY: `int gdrshim_counters(struct gdrshim_counters *out, size_t size)` of gdrshim.h.
    let f: unsafe extern "C" fn(*mut u64, usize) -> c_int = unsafe { core::mem::transmute(f) };
    let mut c = [0u64; 22];
    // SAFETY: `c` is 22 u64s, the size we pass; the shim writes at most that many bytes.
    let n = unsafe { f(c.as_mut_ptr(), core::mem::size_of_val(&c)) };
    (n >= 0).then_some(c)
}

/// A counter of `all_counters` by name (0 for a name it lacks).
pub fn all_counter(c: &AllCounters, name: &str) -> u64 {
    COUNTER_NAMES.iter().chain(LATER_NAMES.iter()).position(|n| *n == name).map_or(0, |i| c[i])
}

pub fn route_name(r: c_int) -> &'static str {
    match r {
        1 => "dmabuf",
        2 => "nv503c",
        _ => "none",
    }
}

pub fn shim_version() -> String {
    let f = global_sym(b"gdrshim_version\0");
    if f.is_null() {
        return "?".into();
    }
    // SAFETY: `const char *gdrshim_version(void)` of gdrshim.h: a static string.
    let f: unsafe extern "C" fn() -> *const c_char = unsafe { core::mem::transmute(f) };
    // SAFETY: as above; the string is NUL-terminated and static.
    unsafe { core::ffi::CStr::from_ptr(f()) }.to_string_lossy().into_owned()
}
