//! CUDA contexts: which context each allocation of the program's is made in, which contexts the
//! program makes, and their ends. CUDA frees a context's own allocations with it (`cuMemAlloc*`,
//! IPC handles opened in it), whether or not the driver calls that free each are seen (a client
//! freed by closing its fd is not), and keeps every other context's, the VMM memory and the
//! pools'. So an allocation hook learns the current context after its real call
//! ([`current_context`]), `cuDevicePrimaryCtxRetain` names each device's primary context and
//! `cuCtxCreate_v2` the contexts the program creates, and at a context's end (`cuCtxDestroy`; a
//! primary context reset, as `cudaDeviceReset` does, or released by its last holder) the records
//! of exactly the allocations made in it end (`Tracker::context_ended`), so that CUDA's own
//! memory mapped there later is never taken for the program's and the program's live memory
//! stays its own. An allocation whose context could not be learned ends with any context's end
//! on its GPU, and a context whose making no hook saw with any primary context's end (why the
//! primary context is learned from the program's retains, never asked of libcuda at the reset:
//! `tracker::contexts`). Reached as the other CUDA hooks (`cuda`).
#![allow(non_snake_case)] // the CUDA driver API names

use super::slots::slotted;
use crate::abi::cuda::result::{
    NOT_INITIALIZED as CUDA_ERROR_NOT_INITIALIZED, SUCCESS as CUDA_SUCCESS,
};
use crate::abi::cuda::CUresult;
use crate::abi::Uuid;
use crate::real::next_def;
use crate::shim;
use crate::tracker::ContextEnd;
use crate::vamap::ContextTag;
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

/// The calling thread's current context (`cuCtxGetCurrent`), after an allocation that answered
/// `r`: the context it was made in, `Unknown` where libcuda cannot tell. Asked of libcuda outside
/// gdrshim's guard and locks (one call that reads libcuda's thread state), errno kept.
pub(super) fn current_context(r: CUresult) -> ContextTag {
    type F = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
    if r != CUDA_SUCCESS || !crate::activation::active() {
        return ContextTag::Unknown;
    }
    let p = next_def!(c"cuCtxGetCurrent" in b"libcuda.so");
    if p.is_null() {
        return ContextTag::Unknown;
    }
    let e = crate::sys::errno();
    let mut ctx: CUcontext = null_mut();
    // SAFETY: libcuda's function of this signature, with an out-pointer of ours.
    let got = unsafe { core::mem::transmute::<*mut c_void, F>(p)(&mut ctx) };
    crate::sys::set_errno(e);
    match (got, ctx as u64) {
        (CUDA_SUCCESS, c) if c != 0 => ContextTag::Of(c),
        _ => ContextTag::Unknown,
    }
}

/// What ended after a call on context `ctx` (`Some`: a destroy) or device `dev`'s primary context
/// that answered `r`: `None` nothing (it failed, or a release left the primary context in use).
/// Asked of libcuda outside gdrshim's guard, errno kept.
fn ended(
    r: CUresult,
    ctx: Option<CUcontext>,
    dev: Option<CUdevice>,
    only_if_inactive: bool,
) -> Option<ContextEnd> {
    if r != CUDA_SUCCESS || !crate::activation::active() {
        return None;
    }
    if let Some(ctx) = ctx {
        return Some(ContextEnd::Destroyed { ctx: ctx as u64 });
    }
    let dev = dev?;
    let e = crate::sys::errno();
    // a release that left the primary context in use ended nothing
    let still = only_if_inactive && primary_active(dev) == Some(true);
    let end = (!still).then(|| ContextEnd::Primary { dev, gpu: uuid_of(dev) });
    crate::sys::set_errno(e);
    end
}

macro_rules! ctx_fn {
    ($modname:ident, $export:ident, $sym:literal, ($a:ident : $t:ty), $ctx:expr, $dev:expr, $only_if_inactive:expr) => {
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
                if let Some(end) = ended(r, $ctx, $dev, $only_if_inactive) {
                    shim::call_in(|sh| sh.context_ended(stringify!($export), end));
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

ctx_fn!(ctx_destroy, cuCtxDestroy_v2, c"cuCtxDestroy_v2", (ctx: CUcontext), Some(ctx), None, false);
ctx_fn!(primary_reset, cuDevicePrimaryCtxReset_v2, c"cuDevicePrimaryCtxReset_v2", (dev: CUdevice), None, Some(dev), false);
ctx_fn!(primary_release, cuDevicePrimaryCtxRelease_v2, c"cuDevicePrimaryCtxRelease_v2", (dev: CUdevice), None, Some(dev), true);

/// A context the program made, written into `*pctx` by a call that answered `r`: told to the
/// core as device `primary_of`'s primary context, or as one the program created.
fn made(r: CUresult, pctx: *mut CUcontext, primary_of: Option<CUdevice>) {
    if r != CUDA_SUCCESS || pctx.is_null() {
        return;
    }
    // SAFETY: on success the driver wrote the context into *pctx, the caller's.
    let ctx = unsafe { *pctx } as u64;
    if ctx != 0 {
        shim::call_in_waking(|sh| sh.context_made(ctx, primary_of));
    }
}

macro_rules! made_fn {
    ($modname:ident, $export:ident, $sym:literal, ($p:ident, $($a:ident : $t:ty),*), $primary_of:expr) => {
        pub mod $modname {
            use super::*;
            type F = unsafe extern "C" fn(*mut CUcontext, $($t),*) -> CUresult;
            slotted!(install, REAL, super::$export, call, ($p: *mut CUcontext, $($a: $t),*) -> CUresult);

            pub unsafe fn call(real: *mut c_void, $p: *mut CUcontext, $($a: $t),*) -> CUresult {
                if real.is_null() {
                    return CUDA_ERROR_NOT_INITIALIZED;
                }
                // SAFETY: the driver's function of exactly this signature (see install).
                let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
                // SAFETY: forwarded unchanged.
                let r = unsafe { f($p, $($a),*) };
                made(r, $p, $primary_of);
                r
            }
        }

        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $export($p: *mut CUcontext, $($a: $t),*) -> CUresult {
            let real = Some(next_def!($sym in b"libcuda.so")).filter(|&p| p != $export as *mut c_void).unwrap_or(null_mut());
            // SAFETY: libcuda's definition of this symbol, with this signature.
            unsafe { $modname::call(real, $p, $($a),*) }
        }
    };
}

made_fn!(primary_retain, cuDevicePrimaryCtxRetain, c"cuDevicePrimaryCtxRetain", (pctx, dev: CUdevice), Some(dev));
made_fn!(ctx_create, cuCtxCreate_v2, c"cuCtxCreate_v2", (pctx, flags: c_uint, dev: CUdevice), { let _ = (flags, dev); None });
