//! CUDA driver API facts (cuda.h, x86-64) that gdrshim reads or answers: the device attributes
//! consumers ask before they use GPUDirect RDMA, the values those attributes take, and the
//! `cuMemCreate` properties struct whose `gpuDirectRDMACapable` flag gdrshim may retry without.

use super::pod::abi_struct;
use core::mem::offset_of;

/// `CUdevice_attribute` values (cuda.h's `CUdevice_attribute_enum`).
pub mod attr {
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: memory made with
    /// `cuMemCreate` may ask for `gpuDirectRDMACapable`.
    pub const GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: i32 = 110;
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`: NCCL's GPU-side GDR gate.
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`: a bitmask of
    /// [`super::flush_options`].
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: i32 = 117;
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`: one of [`super::writes_ordering`].
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: i32 = 118;
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub const DMA_BUF_SUPPORTED: i32 = 124;
}

/// `CUflushGPUDirectRDMAWritesOptions` (attribute 117's bits).
pub mod flush_options {
    /// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST`: `cuFlushGPUDirectRDMAWrites` is supported.
    pub const HOST: i32 = 1 << 0;
    /// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_MEMOPS`: `CU_STREAM_WAIT_VALUE_FLUSH` is supported.
    pub const MEMOPS: i32 = 1 << 1;
}

/// `CUGPUDirectRDMAWritesOrdering` (attribute 118's values).
pub mod writes_ordering {
    /// `..._NONE`: the device does not order remote writes natively; a flush
    /// (`cuFlushGPUDirectRDMAWrites`, or a read through the NIC as NCCL does) is needed before
    /// the GPU may consume them.
    pub const NONE: i32 = 0;
    /// `..._OWNER`: the device itself consumes remote writes consistently (other devices may not).
    pub const OWNER: i32 = 100;
    /// `..._ALL_DEVICES`: any CUDA device consumes remote writes to this device consistently.
    pub const ALL_DEVICES: i32 = 200;
}

/// `CUresult`: what every driver API call answers.
pub type CUresult = i32;

/// `CUresult` values gdrshim reads or answers.
pub mod result {
    pub const SUCCESS: i32 = 0;
    /// What libcuda answers a dma-buf request over a range that is not the program's device
    /// memory.
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_INITIALIZED: i32 = 3;
    /// What libcuda answers a dma-buf request with on GeForce.
    pub const NOT_SUPPORTED: i32 = 801;
}

/// `cuMemGetHandleForAddressRange`'s handle type and flag (cuda.h).
pub mod mem_range {
    /// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
    pub const HANDLE_TYPE_DMA_BUF_FD: i32 = 1;
    /// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE`.
    pub const FLAG_DMA_BUF_MAPPING_TYPE_PCIE: u64 = 1;
}

abi_struct!(
    /// `CUmemAllocationProp` (CUDA 10.2 on; `usage` took two reserved bytes in 11.x, the size
    /// never changed): `type`, `requestedHandleTypes`, `location` {`type`, `id`},
    /// `win32HandleMetaData` (a pointer, read here as its bits), `allocFlags` {`compressionType`,
    /// `gpuDirectRDMACapable`, `usage`, `reserved[4]`}.
    MemAllocationProp, size 32, {
    alloc_type: u32 = 0, requested_handle_types: u32 = 4, location_type: u32 = 8, location_id: i32 = 12,
    win32_handle_meta_data: u64 = 16, compression_type: u8 = 24, gpu_direct_rdma_capable: u8 = 25,
    usage: u16 = 26, reserved: [u8; 4] = 28 });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rdma_flag_is_the_26th_byte() {
        let mut p: MemAllocationProp = crate::abi::zeroed();
        p.gpu_direct_rdma_capable = 1;
        let b = crate::abi::pod_bytes(&p);
        assert_eq!(b.len(), 32);
        assert_eq!(b.iter().position(|&x| x == 1), Some(25));
        assert_eq!(crate::abi::read_pod::<MemAllocationProp>(b), Some(p));
    }
}
