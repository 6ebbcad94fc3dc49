//! Wrapper slots: one per distinct real function pointer seen for a wrapped name, each with its
//! own wrapper, so that a wrapper always calls exactly the function it replaced.

use crate::shim;
use core::ffi::c_void;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, Ordering::{AcqRel, Acquire, Relaxed}};

pub const SLOTS: usize = 4;

/// The wrapper for `real`, or `real` itself when it is ours already or all slots are taken.
pub fn install_into(slots: &[AtomicPtr<c_void>; SLOTS], wrappers: [*mut c_void; SLOTS], exported: *mut c_void, real: *mut c_void) -> *mut c_void {
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
    tracing::warn!("more than {SLOTS} distinct CUDA entry points for one function: returned unwrapped");
    real
}

