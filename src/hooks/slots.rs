//! Wrapper slots: one per distinct real function pointer seen for a wrapped name, each with its
//! own wrapper, so that a wrapper always calls exactly the function it replaced.

use crate::shim;
use core::ffi::c_void;
use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicPtr,
    Ordering::{AcqRel, Acquire, Relaxed},
};

pub const SLOTS: usize = 4;

/// The wrapper for `real`, or `real` itself when it is ours already or all slots are taken.
pub fn install_into(
    slots: &[AtomicPtr<c_void>; SLOTS],
    wrappers: [*mut c_void; SLOTS],
    exported: *mut c_void,
    real: *mut c_void,
) -> *mut c_void {
    if real.is_null() || real == exported || wrappers.contains(&real) {
        return real;
    }
    for (i, s) in slots.iter().enumerate() {
        match s.compare_exchange(null_mut(), real, AcqRel, Acquire) {
            Ok(_) => {
                if let Some(sh) = shim::try_get() {
                    sh.stats.wrapped.fetch_add(1, Relaxed);
                }
                return wrappers[i];
            }
            Err(cur) if cur == real => return wrappers[i],
            Err(_) => {}
        }
    }
    if let Some(sh) = shim::try_get() {
        sh.stats.unwrapped.fetch_add(1, Relaxed);
    }
    crate::log_warn!(
        "more than {SLOTS} distinct CUDA entry points for one function: returned unwrapped"
    );
    real
}

/// Declares `$slots` and `$install`: four wrappers of one C signature, each forwarding to `$call`
/// with the real function of its own slot, handed out by [`install_into`].
macro_rules! slotted {
    ($install:ident, $slots:ident, $export:path, $call:path, ($($a:ident : $t:ty),*) -> $r:ty) => {
        // In .data, not .bss: the hooks' caches are most of the library's zero-initialised
        // data, and a .bss that runs past the last page of the file costs every process that
        // loads the library a mapping of its own (tests/exports.rs).
        #[link_section = ".data.gdrshim_hooks"]
        pub static $slots: [core::sync::atomic::AtomicPtr<core::ffi::c_void>; $crate::hooks::slots::SLOTS] =
            [const { core::sync::atomic::AtomicPtr::new(core::ptr::null_mut()) }; $crate::hooks::slots::SLOTS];

        pub fn $install(real: *mut core::ffi::c_void) -> *mut core::ffi::c_void {
            use core::sync::atomic::Ordering::Acquire;
            unsafe extern "C" fn w0($($a: $t),*) -> $r {
                // SAFETY: the caller upholds the wrapped function's contract; forwarded to it.
                unsafe { $call($slots[0].load(Acquire), $($a),*) }
            }
            unsafe extern "C" fn w1($($a: $t),*) -> $r {
                // SAFETY: as w0.
                unsafe { $call($slots[1].load(Acquire), $($a),*) }
            }
            unsafe extern "C" fn w2($($a: $t),*) -> $r {
                // SAFETY: as w0.
                unsafe { $call($slots[2].load(Acquire), $($a),*) }
            }
            unsafe extern "C" fn w3($($a: $t),*) -> $r {
                // SAFETY: as w0.
                unsafe { $call($slots[3].load(Acquire), $($a),*) }
            }
            let wrappers = [w0 as *mut core::ffi::c_void, w1 as *mut core::ffi::c_void, w2 as *mut core::ffi::c_void, w3 as *mut core::ffi::c_void];
            $crate::hooks::slots::install_into(&$slots, wrappers, $export as *mut core::ffi::c_void, real)
        }
    };
}
pub(crate) use slotted;
