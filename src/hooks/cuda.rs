//! CUDA driver allocation entry points, reached three ways: as exported symbols (programs linked
//! against libcuda), through `dlsym` on a libcuda handle, and through `cuGetProcAddress` (how
//! cudart, NCCL, PyTorch and perftest reach the driver).
//!
//! Each wrapped function has a few slots, one per distinct real pointer seen (the exported
//! `_v2`, a `_ptsz` variant, whatever `cuGetProcAddress` hands out), each with its own wrapper,
//! so a wrapper always calls exactly the function it replaced. Only the ABI versions we
//! implement are wrapped (`cuMemAlloc` only from CUDA 3.2's `_v2`); anything else is returned
//! untouched. Our own pointers are never wrapped again, so nothing recurses.
#![allow(non_snake_case)] // the CUDA driver API names

use super::slots::slotted;
use crate::real::next_def;
use crate::shim;
use crate::shim::registrations::Served;
use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use crate::abi::cuda::mem_range::{
    FLAG_DMA_BUF_MAPPING_TYPE_PCIE as CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE,
    HANDLE_TYPE_DMA_BUF_FD as CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
};
use crate::abi::cuda::result::{
    INVALID_VALUE as CUDA_ERROR_INVALID_VALUE, NOT_INITIALIZED as CUDA_ERROR_NOT_INITIALIZED,
    NOT_SUPPORTED as CUDA_ERROR_NOT_SUPPORTED, SUCCESS as CUDA_SUCCESS,
};
use crate::abi::cuda::CUresult;
use crate::vamap::ContextTag;
type CUdeviceptr = u64;
type CUstream = *mut c_void;

macro_rules! cuda_fn {
    ($modname:ident, $export:ident, $sym:literal, ($($a:ident : $t:ty),*), |$sh:ident, $res:ident| $body:block) => {
        cuda_fn!($modname, $export, $sym, ($($a: $t),*), outside |$res| { let _ = $res; } as _unused, |$sh, $res| $body);
    };
    // `outside` runs after the real call and before our bookkeeping, outside gdrshim's guard:
    // where the bookkeeping needs libcuda again (whose NVIDIA calls the hooks must see).
    ($modname:ident, $export:ident, $sym:literal, ($($a:ident : $t:ty),*), outside |$res0:ident| $pre:block as $o:ident, |$sh:ident, $res:ident| $body:block) => {
        pub mod $modname {
            use super::*;
            type F = unsafe extern "C" fn($($t),*) -> CUresult;
            slotted!(install, REAL, super::$export, call, ($($a: $t),*) -> CUresult);

            #[inline(always)]
            pub unsafe fn call(real: *mut c_void, $($a: $t),*) -> CUresult {
                if real.is_null() {
                    return CUDA_ERROR_NOT_INITIALIZED;
                }
                // SAFETY: real is the driver's function of exactly this signature (see install).
                let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
                // SAFETY: forwarded unchanged.
                let $res = unsafe { f($($a),*) };
                let $o = {
                    let $res0 = $res;
                    $pre
                };
                // Our bookkeeping: errno preserved, panics contained.
                shim::call_in_waking(|$sh| $body);
                $res
            }
        }

        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $export($($a: $t),*) -> CUresult {
            // the next definition, or libcuda's own where it was loaded RTLD_LOCAL (as cudart
            // loads it; next_def! finds it by name), never ours
            let real = Some(next_def!($sym in b"libcuda.so")).filter(|&p| p != $export as *mut c_void).unwrap_or(null_mut());
            // SAFETY: libcuda's definition of this symbol, with this signature.
            unsafe { $modname::call(real, $($a),*) }
        }
    };
}

// Memory of the current context, which CUDA frees with it (`cuda_ctx`).
cuda_fn!(mem_alloc, cuMemAlloc_v2, c"cuMemAlloc_v2", (dptr: *mut CUdeviceptr, bytesize: usize),
    outside |r| { ctx::current_context(r) } as made_in, |sh, r| {
    if r == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: on success the driver wrote the pointer into *dptr.
        sh.user_allocation("cuMemAlloc_v2", unsafe { *dptr }, bytesize as u64, made_in);
    }
});
cuda_fn!(mem_alloc_pitch, cuMemAllocPitch_v2, c"cuMemAllocPitch_v2", (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32),
    outside |r| { ctx::current_context(r) } as made_in, |sh, r| {
    let _ = (width, elem);
    if r == CUDA_SUCCESS && !dptr.is_null() && !pitch.is_null() {
        // SAFETY: on success the driver wrote both outputs.
        let (p, pt) = unsafe { (*dptr, *pitch) };
        sh.user_allocation("cuMemAllocPitch_v2", p, (pt as u64).saturating_mul(height as u64), made_in);
    }
});
cuda_fn!(mem_free, cuMemFree_v2, c"cuMemFree_v2", (dptr: CUdeviceptr), |sh, r| {
    if r == CUDA_SUCCESS {
        sh.line.cuda_frees.fetch_add(1, Relaxed);
        sh.program_release(dptr, None);
    }
});
// A handle mapped into the program's VA (its own cuMemCreate, or one imported from another
// process by a shareable handle) is the program's memory there until it unmaps it, whatever
// context ends meanwhile (VMM memory is no context's).
cuda_fn!(mem_map, cuMemMap, c"cuMemMap", (ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64), |sh, r| {
    let _ = (offset, handle, flags);
    crate::log_debug!("cuMemMap [{ptr:#x}, +{size:#x}) -> {r}");
    if r == CUDA_SUCCESS {
        sh.program_mapping(ptr, size as u64, ContextTag::NoContext);
    }
});
// libcuda makes the UVM mapping (and its native REGISTER_VIDMEM) of a VMM range only when access
// is granted: seen on the H200, where the range is still unmapped when cuMemMap returns. The
// range becomes usable memory here, so this is the user allocation.
cuda_fn!(mem_set_access, cuMemSetAccess, c"cuMemSetAccess", (ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize), |sh, r| {
    let _ = (desc, count);
    if r == CUDA_SUCCESS {
        sh.user_allocation("cuMemSetAccess", ptr, size as u64, ContextTag::NoContext);
    }
});
cuda_fn!(mem_unmap, cuMemUnmap, c"cuMemUnmap", (ptr: CUdeviceptr, size: usize), |sh, r| {
    if r == CUDA_SUCCESS {
        sh.line.cuda_frees.fetch_add(1, Relaxed);
        sh.program_release(ptr, Some(size as u64));
    }
});
cuda_fn!(mem_release, cuMemRelease, c"cuMemRelease", (handle: u64), |sh, r| {
    let _ = (handle, sh, r);
});
// A pool's memory (pools are per device) is no context's.
cuda_fn!(mem_alloc_async, cuMemAllocAsync, c"cuMemAllocAsync", (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream), |sh, r| {
    let _ = stream;
    if r == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: on success the driver wrote the pointer into *dptr.
        sh.user_allocation("cuMemAllocAsync", unsafe { *dptr }, bytesize as u64, ContextTag::NoContext);
    }
});
cuda_fn!(mem_alloc_pool_async, cuMemAllocFromPoolAsync, c"cuMemAllocFromPoolAsync", (dptr: *mut CUdeviceptr, bytesize: usize, pool: *mut c_void, stream: CUstream), |sh, r| {
    let _ = (pool, stream);
    if r == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: on success the driver wrote the pointer into *dptr.
        sh.user_allocation("cuMemAllocFromPoolAsync", unsafe { *dptr }, bytesize as u64, ContextTag::NoContext);
    }
});
// (freed in stream order: the program may not hand the memory to anyone from this call on)
cuda_fn!(mem_free_async, cuMemFreeAsync, c"cuMemFreeAsync", (dptr: CUdeviceptr, stream: CUstream), |sh, r| {
    let _ = stream;
    if r == CUDA_SUCCESS {
        sh.line.cuda_frees.fetch_add(1, Relaxed);
        sh.program_release(dptr, None);
    }
});
// Memory of another process the program opened: its own from here, as big as the allocation
// it came from (which only libcuda knows), until it closes it or the context it was opened in
// ends.
cuda_fn!(ipc_open, cuIpcOpenMemHandle_v2, c"cuIpcOpenMemHandle_v2", (dptr: *mut CUdeviceptr, handle: CuIpcMemHandle, flags: u32),
    outside |r| { imported_extent(r, dptr).map(|e| (e, ctx::current_context(r))) } as extent, |sh, r| {
    let _ = (handle, flags, r);
    if let Some(((base, len), made_in)) = extent {
        sh.program_mapping(base, len, made_in);
    }
});
cuda_fn!(ipc_close, cuIpcCloseMemHandle, c"cuIpcCloseMemHandle", (dptr: CUdeviceptr), |sh, r| {
    if r == CUDA_SUCCESS {
        sh.program_release(dptr, None);
    }
});
cuda_fn!(pool_import, cuMemPoolImportPointer, c"cuMemPoolImportPointer", (dptr: *mut CUdeviceptr, pool: *mut c_void, data: *mut c_void),
    outside |r| { imported_extent(r, dptr) } as extent, |sh, r| {
    let _ = (pool, data, r);
    if let Some((base, len)) = extent {
        sh.program_mapping(base, len, ContextTag::NoContext);
    }
});
cuda_fn!(address_free, cuMemAddressFree, c"cuMemAddressFree", (ptr: CUdeviceptr, size: usize), |sh, r| {
    if r == CUDA_SUCCESS {
        sh.program_release(ptr, Some(size as u64));
    }
});

/// `CUipcMemHandle` (cuda.h): 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CuIpcMemHandle {
    pub reserved: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<CuIpcMemHandle>() == 64);

/// After an import that answered `r` into `*dptr`: the allocation libcuda says the imported
/// pointer starts (`cuMemGetAddressRange_v2`), as `(base, size)`. Called outside gdrshim's guard
/// (libcuda's NVIDIA calls, if it makes any, are seen), keeping errno.
fn imported_extent(r: CUresult, dptr: *mut CUdeviceptr) -> Option<(u64, u64)> {
    if r != CUDA_SUCCESS || dptr.is_null() || !crate::activation::active() {
        return None;
    }
    let e = crate::sys::errno();
    // SAFETY: on success the driver wrote the pointer into *dptr, which the caller owns.
    let extent = allocation_extent(unsafe { *dptr });
    crate::sys::set_errno(e);
    extent
}

/// The allocation libcuda says holds `ptr` (`cuMemGetAddressRange_v2`): `(base, size)`.
fn allocation_extent(ptr: CUdeviceptr) -> Option<(u64, u64)> {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;
    let p = next_def!(c"cuMemGetAddressRange_v2" in b"libcuda.so");
    if p.is_null() {
        return None;
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: libcuda's cuMemGetAddressRange_v2, with valid out-pointers of ours.
    let r = unsafe { core::mem::transmute::<*mut c_void, F>(p)(&mut base, &mut size, ptr) };
    (r == CUDA_SUCCESS && size > 0).then_some((base, size as u64))
}
// The ends of CUDA contexts (`cuda_ctx`), NCCL's GPU-side GDR gate, its DMA-BUF and VMM questions
// and cuMemCreate's GDR flag (`cuda_gdr`): siblings of these hooks, reached the same three ways.
use super::cuda_ctx as ctx;
use super::cuda_gdr::{device_get_attribute, mem_create};
// A dma-buf of device memory: where libcuda refuses (801 on GeForce) and the DMA-BUF route serves,
// gdrshim's export of exactly the map's pieces; where libcuda answers, its export is compared with
// the map's (shadow oracle).
#[allow(clippy::too_many_arguments)]
pub mod handle_range {
    use super::*;
    type F = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, c_int, u64) -> CUresult;
    /// libcuda's own.
    pub fn next() -> *mut c_void {
        next_def!(c"cuMemGetHandleForAddressRange" in b"libcuda.so")
    }
    slotted!(install, REAL, super::cuMemGetHandleForAddressRange, call, (handle: *mut c_void, dptr: CUdeviceptr, size: usize, kind: c_int, flags: u64) -> CUresult);

    pub unsafe fn call(
        real: *mut c_void,
        handle: *mut c_void,
        dptr: CUdeviceptr,
        size: usize,
        kind: c_int,
        flags: u64,
    ) -> CUresult {
        if real.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: the driver's function of exactly this signature (see install).
        let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
        if kind != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || handle.is_null() {
            // SAFETY: forwarded unchanged.
            return unsafe { f(handle, dptr, size, kind, flags) };
        }
        let hide = shim::try_get().is_some_and(|s| s.cfg.knobs.hide_dmabuf);
        // SAFETY: forwarded unchanged.
        let native = unsafe { f(handle, dptr, size, kind, flags) };
        let mut r = native;
        if r == CUDA_SUCCESS {
            // SAFETY: on success the driver wrote the fd (an int) into *handle.
            let fd = unsafe { *(handle as *const c_int) };
            shim::call_in_waking(|s| s.dmabuf_handed_out(dptr, size as u64, fd));
            if hide {
                // GeForce emulation: libcuda's export is seen and compared, then taken back
                if let Some(close) = crate::real::close() {
                    // close is a cancellation point; our own fd must be closed whatever the thread
                    let _no_cancel = crate::sys::NoCancel::new();
                    // SAFETY: the fd libcuda just made for this call, not handed out yet.
                    unsafe { close(fd) };
                }
            }
        }
        if hide {
            // GeForce emulation: libcuda refuses every dma-buf there; its real answer here is
            // the oracle gdrshim's own answer is compared with
            r = CUDA_ERROR_NOT_SUPPORTED;
        }
        if r == CUDA_ERROR_NOT_SUPPORTED
            && flags & !CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE == 0
        {
            let mapping = if flags != 0 {
                crate::abi::dmabuf::MAPPING_FORCE_PCIE
            } else {
                crate::abi::dmabuf::MAPPING_DEFAULT
            };
            match shim::call_in_waking(|s| s.serve_dmabuf(dptr, size as u64, mapping)) {
                Some(Served::Fd(fd)) => {
                    // SAFETY: the caller's out-parameter, an int, as for the driver.
                    unsafe { *(handle as *mut c_int) = fd };
                    r = CUDA_SUCCESS;
                }
                Some(Served::InvalidRange) => r = CUDA_ERROR_INVALID_VALUE,
                Some(Served::NotServed) | None => {}
            }
        }
        if hide {
            shim::call_in(|s| s.export_oracle(dptr, size as u64, native, r));
        }
        r
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: CUdeviceptr,
    size: usize,
    kind: c_int,
    flags: u64,
) -> CUresult {
    let real = Some(handle_range::next())
        .filter(|&p| p != cuMemGetHandleForAddressRange as *mut c_void)
        .unwrap_or(null_mut());
    // SAFETY: libcuda's definition of this symbol, with this signature.
    unsafe { handle_range::call(real, handle, dptr, size, kind, flags) }
}

cuda_fn!(get_proc_v1, cuGetProcAddress, c"cuGetProcAddress", (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64), |sh, r| {
    let _ = (sh, flags);
    // SAFETY: on success the driver wrote the function pointer into *pfn.
    unsafe { rewrite(r, symbol, pfn, version) };
});
cuda_fn!(get_proc_v2, cuGetProcAddress_v2, c"cuGetProcAddress_v2", (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int), |sh, r| {
    let _ = (sh, flags, status);
    // SAFETY: on success the driver wrote the function pointer into *pfn.
    unsafe { rewrite(r, symbol, pfn, version) };
});

type Install = fn(*mut c_void) -> *mut c_void;

/// Names as `dlsym` sees them (exact ABI in the name).
pub fn by_symbol_name(name: &[u8]) -> Option<Install> {
    Some(match name {
        b"cuMemAlloc_v2" => mem_alloc::install,
        b"cuMemAllocPitch_v2" => mem_alloc_pitch::install,
        b"cuMemFree_v2" => mem_free::install,
        b"cuMemCreate" => mem_create::install,
        b"cuMemMap" => mem_map::install,
        b"cuMemSetAccess" => mem_set_access::install,
        b"cuMemUnmap" => mem_unmap::install,
        b"cuMemRelease" => mem_release::install,
        b"cuMemAllocAsync" | b"cuMemAllocAsync_ptsz" => mem_alloc_async::install,
        b"cuMemAllocFromPoolAsync" | b"cuMemAllocFromPoolAsync_ptsz" => {
            mem_alloc_pool_async::install
        }
        b"cuMemFreeAsync" | b"cuMemFreeAsync_ptsz" => mem_free_async::install,
        b"cuDeviceGetAttribute" => device_get_attribute::install,
        b"cuMemGetHandleForAddressRange" => handle_range::install,
        b"cuIpcOpenMemHandle_v2" => ipc_open::install,
        b"cuIpcCloseMemHandle" => ipc_close::install,
        b"cuMemPoolImportPointer" => pool_import::install,
        b"cuMemAddressFree" => address_free::install,
        b"cuCtxDestroy_v2" => ctx::ctx_destroy::install,
        b"cuDevicePrimaryCtxReset_v2" => ctx::primary_reset::install,
        b"cuDevicePrimaryCtxRelease_v2" => ctx::primary_release::install,
        b"cuDevicePrimaryCtxRetain" => ctx::primary_retain::install,
        b"cuCtxCreate_v2" => ctx::ctx_create::install,
        b"cuGetProcAddress" => get_proc_v1::install,
        b"cuGetProcAddress_v2" => get_proc_v2::install,
        _ => return None,
    })
}

/// Names as `cuGetProcAddress` sees them: the base name, with the ABI chosen by the caller's
/// CUDA version. Only the versions whose signature we implement are wrapped.
pub fn by_proc_name(name: &[u8], cuda_version: c_int) -> Option<Install> {
    let at_least = |v: c_int| cuda_version >= v;
    Some(match name {
        b"cuMemAlloc" if at_least(3020) => mem_alloc::install,
        b"cuMemAllocPitch" if at_least(3020) => mem_alloc_pitch::install,
        b"cuMemFree" if at_least(3020) => mem_free::install,
        b"cuMemCreate" if at_least(10020) => mem_create::install,
        b"cuMemMap" if at_least(10020) => mem_map::install,
        b"cuMemSetAccess" if at_least(10020) => mem_set_access::install,
        b"cuMemUnmap" if at_least(10020) => mem_unmap::install,
        b"cuMemRelease" if at_least(10020) => mem_release::install,
        b"cuMemAllocAsync" if at_least(11020) => mem_alloc_async::install,
        b"cuMemAllocFromPoolAsync" if at_least(11020) => mem_alloc_pool_async::install,
        b"cuMemFreeAsync" if at_least(11020) => mem_free_async::install,
        b"cuDeviceGetAttribute" if at_least(2000) => device_get_attribute::install,
        b"cuMemGetHandleForAddressRange" if at_least(11070) => handle_range::install,
        b"cuIpcOpenMemHandle" if at_least(11000) => ipc_open::install,
        b"cuIpcCloseMemHandle" if at_least(4010) => ipc_close::install,
        b"cuMemPoolImportPointer" if at_least(11020) => pool_import::install,
        b"cuMemAddressFree" if at_least(10020) => address_free::install,
        b"cuCtxDestroy" if at_least(4000) => ctx::ctx_destroy::install,
        b"cuDevicePrimaryCtxReset" if at_least(11000) => ctx::primary_reset::install,
        b"cuDevicePrimaryCtxRelease" if at_least(11000) => ctx::primary_release::install,
        b"cuDevicePrimaryCtxRetain" if at_least(7000) => ctx::primary_retain::install,
        // (CUDA 11.4 added cuCtxCreate_v3 and 12.5 _v4, with other signatures; which one the
        // name answers at those versions is not known here, so it is left alone: a context made
        // so is of unknown kind, which any primary context's end ends too)
        b"cuCtxCreate" if at_least(3020) && !at_least(11040) => ctx::ctx_create::install,
        b"cuGetProcAddress" if at_least(12000) => get_proc_v2::install,
        b"cuGetProcAddress" if at_least(11030) => get_proc_v1::install,
        _ => return None,
    })
}

/// Replaces `*pfn` with our wrapper when `symbol` is one we wrap at this version.
///
/// # Safety
/// `pfn` is the caller's out-pointer and `symbol` its C string, as passed to cuGetProcAddress.
unsafe fn rewrite(r: CUresult, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) {
    if r != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: per the contract.
    let (name, cur) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn) };
    if let Some(install) = by_proc_name(name, version) {
        let w = install(cur);
        // SAFETY: per the contract; the wrapper has the signature the caller asked for.
        unsafe { *pfn = w };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_gates() {
        assert!(by_proc_name(b"cuMemAlloc", 3010).is_none());
        assert!(by_proc_name(b"cuMemAlloc", 13000).is_some());
        assert!(by_proc_name(b"cuMemMap", 10010).is_none());
        assert_eq!(
            by_proc_name(b"cuGetProcAddress", 12000).map(|f| f as usize),
            Some(get_proc_v2::install as *const () as usize)
        );
        assert_eq!(
            by_proc_name(b"cuGetProcAddress", 11040).map(|f| f as usize),
            Some(get_proc_v1::install as *const () as usize)
        );
        assert!(by_proc_name(b"cuMemAlloc_v2", 13000).is_none());
        assert!(by_symbol_name(b"cuMemAlloc").is_none(), "the v1 ABI is never wrapped");
    }

    unsafe extern "C" fn fake_a(_: *mut CUdeviceptr, _: usize) -> CUresult {
        7
    }
    unsafe extern "C" fn fake_b(_: *mut CUdeviceptr, _: usize) -> CUresult {
        8
    }

    #[test]
    fn slots_keep_distinct_reals_and_never_wrap_ours() {
        let a = mem_alloc::install(fake_a as *mut c_void);
        let a2 = mem_alloc::install(fake_a as *mut c_void);
        let b = mem_alloc::install(fake_b as *mut c_void);
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert_eq!(mem_alloc::install(a), a, "a wrapper is never wrapped again");
        type F = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
        // SAFETY: a and b are wrappers of exactly this signature.
        let (fa, fb): (F, F) = unsafe {
            (core::mem::transmute::<*mut c_void, F>(a), core::mem::transmute::<*mut c_void, F>(b))
        };
        let mut p = 0;
        // SAFETY: the wrappers forward to the fakes above.
        unsafe {
            assert_eq!(fa(&mut p, 1), 7);
            assert_eq!(fb(&mut p, 1), 8);
        }
    }
}
