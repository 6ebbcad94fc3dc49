//! Plain ABI values: structs of integers and byte arrays that any bit pattern makes valid, read
//! from and written as bytes, and the macro that declares them with their size and field offsets
//! checked at compile time.

use core::mem::size_of;

/// Marker for plain-integer ABI structs: every bit pattern is a valid value.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs made of integers and byte arrays.
pub unsafe trait Pod: Copy {}

/// Reads `T` from the front of `bytes`, or `None` when there are fewer bytes than `T` needs.
pub fn read_pod<T: Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the slice holds at least size_of::<T>() initialised bytes, T is Pod (any bit
    // pattern is valid) and read_unaligned has no alignment requirement.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}

/// An all-zero value, the usual starting point of a request.
pub fn zeroed<T: Pod>() -> T {
    // SAFETY: T is Pod, so the all-zero bit pattern is a valid value.
    unsafe { core::mem::zeroed() }
}

/// The bytes of a Pod value, for building requests and fixtures.
pub fn pod_bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: T is Pod, so viewing its storage as bytes is sound; padding is covered by
    // the explicit `_pad` fields of every struct here, so no byte is uninitialised.
    unsafe { core::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
}

macro_rules! abi_struct {
    ($(#[$m:meta])* $name:ident, size $size:expr, { $($field:ident : $ty:ty = $off:expr),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name { $(pub $field: $ty),* }
        // SAFETY: repr(C), integer and byte-array fields only, padding spelled out.
        unsafe impl $crate::abi::pod::Pod for $name {}
        const _: () = {
            assert!(core::mem::size_of::<$name>() == $size);
            $(assert!(offset_of!($name, $field) == $off);)*
        };
    };
}
pub(crate) use abi_struct;
