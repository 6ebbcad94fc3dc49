//! The CUDA entry points a GPUDirect RDMA consumer asks before it uses GPU memory with a NIC:
//! `cuDeviceGetAttribute` (NCCL's GPU-side gate, its DMA-BUF and VMM questions, see `advertise`)
//! and `cuMemCreate`, whose `gpuDirectRDMACapable` request libcuda refuses on a GeForce although
//! gdrshim answered that it may be asked. Both reached as the other CUDA hooks (`cuda`).
#![allow(non_snake_case)] // the CUDA driver API names

use super::slots::slotted;
use crate::abi::cuda::result::{
    NOT_INITIALIZED as CUDA_ERROR_NOT_INITIALIZED, SUCCESS as CUDA_SUCCESS,
};
use crate::abi::cuda::CUresult;
use crate::abi::cuda::MemAllocationProp;
use crate::real::next_def;
use crate::shim;
use core::ffi::{c_int, c_void};
use core::ptr::null_mut;

pub mod device_get_attribute {
    use super::*;
    type F = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult;
    slotted!(install, REAL, super::cuDeviceGetAttribute, call, (pi: *mut c_int, attrib: c_int, dev: c_int) -> CUresult);

    pub unsafe fn call(real: *mut c_void, pi: *mut c_int, attrib: c_int, dev: c_int) -> CUresult {
        if real.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: the driver's function of exactly this signature (see install).
        let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
        // SAFETY: forwarded unchanged.
        let r = unsafe { f(pi, attrib, dev) };
        if r == CUDA_SUCCESS && !pi.is_null() && crate::advertise::answers(attrib) {
            // the GPU's other facts, from the same libcuda function, on the same device
            let ask = |a: c_int| {
                let mut v: c_int = 0;
                // SAFETY: the driver's function with a valid out-pointer of ours.
                (unsafe { f(&mut v, a, dev) } == CUDA_SUCCESS).then_some(v)
            };
            shim::call_in_waking(|sh| {
                // SAFETY: on success the driver wrote the value into *pi, which the caller owns.
                let value = unsafe { &mut *pi };
                sh.answer_device_attribute(attrib, dev, value, &ask)
            });
        }
        r
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: c_int,
) -> CUresult {
    let real = Some(next_def!(c"cuDeviceGetAttribute" in b"libcuda.so"))
        .filter(|&p| p != cuDeviceGetAttribute as *mut c_void)
        .unwrap_or(null_mut());
    // SAFETY: libcuda's definition of this symbol, with this signature.
    unsafe { device_get_attribute::call(real, pi, attrib, dev) }
}

pub mod mem_create {
    use super::*;
    type F = unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> CUresult;
    slotted!(install, REAL, super::cuMemCreate, call, (handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> CUresult);

    pub unsafe fn call(
        real: *mut c_void,
        handle: *mut u64,
        size: usize,
        prop: *const c_void,
        flags: u64,
    ) -> CUresult {
        if real.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: the driver's function of exactly this signature (see install).
        let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
        // SAFETY: forwarded unchanged.
        let first = unsafe { f(handle, size, prop, flags) };
        if first == CUDA_SUCCESS || prop.is_null() {
            shim::call_in_waking(|_| crate::log_debug!("cuMemCreate size={size:#x} -> {first}"));
            return first;
        }
        // a copy of the caller's CUmemAllocationProp (cuda.h's layout, abi::cuda), read without
        // faulting on a bad pointer, and only for a failed call
        let retry_with = shim::call_in_waking(|sh| {
            let bytes = crate::sys::read_own_pieces(
                prop as u64,
                &[(0, core::mem::size_of::<MemAllocationProp>())],
            );
            let copy = bytes.and_then(|b| crate::abi::read_pod::<MemAllocationProp>(&b))?;
            (sh.vmm_flag_retry(first, copy.gpu_direct_rdma_capable)
                == crate::advertise::FlagRetry::WithoutFlag)
                .then_some(copy)
        });
        let Some(Some(mut copy)) = retry_with else { return first };
        // the copy without the flag; the caller's struct is never written
        copy.gpu_direct_rdma_capable = 0;
        // SAFETY: forwarded with a valid properties struct of ours in place of the caller's.
        let again =
            unsafe { f(handle, size, &copy as *const MemAllocationProp as *const c_void, flags) };
        shim::call_in_waking(|sh| sh.vmm_flag_retried(size as u64, first, again));
        if again == CUDA_SUCCESS {
            again
        } else {
            first
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    let real = Some(next_def!(c"cuMemCreate" in b"libcuda.so"))
        .filter(|&p| p != cuMemCreate as *mut c_void)
        .unwrap_or(null_mut());
    // SAFETY: libcuda's definition of this symbol, with this signature.
    unsafe { mem_create::call(real, handle, size, prop, flags) }
}
