//! The ends of CUDA contexts: `cuCtxDestroy`, and a primary context reset
//! (`cuDevicePrimaryCtxReset`, which `cudaDeviceReset` calls) or released for the last time
//! (`cuDevicePrimaryCtxRelease`). Every allocation of the context ends with it, whether or not
//! the driver calls that end each are seen (a client freed by closing its fd is not): the
//! program's allocation records of that GPU end here (`VaMap::end_owned_on`), so that CUDA's own
//! memory mapped there later is never taken for the program's. Reached as the other CUDA hooks
//! (`cuda`).
#![allow(non_snake_case)] // the CUDA driver API names

use super::slots::slotted;
use crate::abi::cuda::result::{
    NOT_INITIALIZED as CUDA_ERROR_NOT_INITIALIZED, SUCCESS as CUDA_SUCCESS,
};
use crate::abi::cuda::CUresult;
use crate::abi::Uuid;
use crate::real::next_def;
use crate::shim;
use core::ffi::{c_int, c_uint, c_void};
use core::ptr::null_mut;

type CUcontext = *mut c_void;
type CUdevice = c_int;

/// The UUID of CUDA device `dev`, as UVM names the GPU (`cuDeviceGetUuid_v2`, else
/// `cuDeviceGetUuid`): `None` where libcuda cannot tell.
fn uuid_of(dev: CUdevice) -> Option<Uuid> {
    type F = unsafe extern "C" fn(*mut Uuid, CUdevice) -> CUresult;
    let mut p = next_def!(c"cuDeviceGetUuid_v2" in b"libcuda.so");
    if p.is_null() {
        p = next_def!(c"cuDeviceGetUuid" in b"libcuda.so");
    }
    if p.is_null() {
        return None;
    }
    let mut u: Uuid = [0; 16];
    // SAFETY: libcuda's function of this signature, with a 16-byte out-buffer of ours.
    (unsafe { core::mem::transmute::<*mut c_void, F>(p)(&mut u, dev) } == CUDA_SUCCESS).then_some(u)
}

/// Whether `dev`'s primary context is active (`cuDevicePrimaryCtxGetState`): `None` unknown.
fn primary_active(dev: CUdevice) -> Option<bool> {
    type F = unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult;
    let mut p = next_def!(c"cuDevicePrimaryCtxGetState" in b"libcuda.so");
    if p.is_null() {
        p = next_def!(c"cuDevicePrimaryCtxGetState_v2" in b"libcuda.so");
    }
    if p.is_null() {
        return None;
    }
    let (mut flags, mut active) = (0, 0);
    // SAFETY: libcuda's function of this signature, with out-pointers of ours.
    (unsafe { core::mem::transmute::<*mut c_void, F>(p)(dev, &mut flags, &mut active) }
        == CUDA_SUCCESS)
        .then_some(active != 0)
}

/// What ended after a call that answered `r`: `Some(gpu)` a context of that GPU (`None`: of an
/// unknown GPU, so every allocation), `None` nothing. Asked of libcuda outside gdrshim's guard,
/// errno kept.
fn ended(r: CUresult, dev: Option<CUdevice>, only_if_inactive: bool) -> Option<Option<Uuid>> {
    if r != CUDA_SUCCESS || !crate::activation::active() {
        return None;
    }
    let e = crate::sys::errno();
    // a release that left the primary context in use ended nothing
    let still = only_if_inactive && dev.and_then(primary_active) == Some(true);
    let gpu = if still { None } else { Some(dev.and_then(uuid_of)) };
    crate::sys::set_errno(e);
    gpu
}

macro_rules! ctx_fn {
    ($modname:ident, $export:ident, $sym:literal, ($a:ident : $t:ty), $dev:expr, $only_if_inactive:expr) => {
        pub mod $modname {
            use super::*;
            type F = unsafe extern "C" fn($t) -> CUresult;
            slotted!(install, REAL, super::$export, call, ($a: $t) -> CUresult);

            pub unsafe fn call(real: *mut c_void, $a: $t) -> CUresult {
                if real.is_null() {
                    return CUDA_ERROR_NOT_INITIALIZED;
                }
                // SAFETY: the driver's function of exactly this signature (see install).
                let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
                // SAFETY: forwarded unchanged.
                let r = unsafe { f($a) };
                if let Some(gpu) = ended(r, $dev, $only_if_inactive) {
                    shim::call_in(|sh| sh.context_ended(stringify!($export), gpu));
                }
                r
            }
        }

        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $export($a: $t) -> CUresult {
            let real = Some(next_def!($sym in b"libcuda.so")).filter(|&p| p != $export as *mut c_void).unwrap_or(null_mut());
            // SAFETY: libcuda's definition of this symbol, with this signature.
            unsafe { $modname::call(real, $a) }
        }
    };
}

ctx_fn!(ctx_destroy, cuCtxDestroy_v2, c"cuCtxDestroy_v2", (ctx: CUcontext), { let _ = ctx; None }, false);
ctx_fn!(primary_reset, cuDevicePrimaryCtxReset_v2, c"cuDevicePrimaryCtxReset_v2", (dev: CUdevice), Some(dev), false);
ctx_fn!(primary_release, cuDevicePrimaryCtxRelease_v2, c"cuDevicePrimaryCtxRelease_v2", (dev: CUdevice), Some(dev), true);
