//! GDRSHIM_MODE's words, in one place for the core's configuration, its activation and the front:
//! `core` only, no allocation.

/// What `gdrshim_mode()` answers for each mode (include/gdrshim.h, `enum gdrshim_mode`).
pub const OFF: i32 = 0;
pub const TRACE: i32 = 1;
pub const SHADOW: i32 = 2;
pub const REGISTER: i32 = 3;

/// The mode a GDRSHIM_MODE value names (ASCII case and surrounding blanks ignored), or `None` for
/// a word not understood.
pub fn parse(value: &[u8]) -> Option<i32> {
    let v = value.trim_ascii();
    let is = |w: &[u8]| v.eq_ignore_ascii_case(w);
    if is(b"off") || is(b"0") || is(b"none") {
        Some(OFF)
    } else if is(b"trace") {
        Some(TRACE)
    } else if is(b"shadow") {
        Some(SHADOW)
    } else if is(b"register") || is(b"on") {
        Some(REGISTER)
    } else {
        None
    }
}

/// The mode of a process whose GDRSHIM_MODE is `value`: unset is register (zero configuration); a
/// mode asked for but not understood registers nothing (shadow).
pub fn effective(value: Option<&[u8]>) -> i32 {
    match value {
        None => REGISTER,
        Some(v) => parse(v).unwrap_or(SHADOW),
    }
}
