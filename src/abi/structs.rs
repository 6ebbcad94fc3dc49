//! Parameter structs of the RM escapes and UVM commands gdrshim reads or issues (x86-64).
//! Identical 535 → 595 unless the name carries a branch.

use super::pod::abi_struct;
use core::mem::{offset_of, size_of};

abi_struct!(
    /// NVOS00: NV_ESC_RM_FREE.
    Nvos00Free, size 16, { h_root: u32 = 0, h_object_parent: u32 = 4, h_object_old: u32 = 8, status: u32 = 12 });
abi_struct!(
    /// NVOS21: NV_ESC_RM_ALLOC without access rights.
    Nvos21Alloc, size 32, {
    h_root: u32 = 0, h_object_parent: u32 = 4, h_object_new: u32 = 8, h_class: u32 = 12,
    p_alloc_parms: u64 = 16, params_size: u32 = 24, status: u32 = 28 });
abi_struct!(
    /// NVOS64: NV_ESC_RM_ALLOC with access rights (what libcuda uses).
    Nvos64Alloc, size 48, {
    h_root: u32 = 0, h_object_parent: u32 = 4, h_object_new: u32 = 8, h_class: u32 = 12,
    p_alloc_parms: u64 = 16, p_rights_requested: u64 = 24, params_size: u32 = 32, flags: u32 = 36,
    status: u32 = 40, _pad: u32 = 44 });
abi_struct!(
    /// NVOS54: NV_ESC_RM_CONTROL.
    Nvos54Control, size 32, {
    h_client: u32 = 0, h_object: u32 = 4, cmd: u32 = 8, flags: u32 = 12, params: u64 = 16,
    params_size: u32 = 24, status: u32 = 28 });
abi_struct!(
    /// NVOS33: NV_ESC_RM_MAP_MEMORY, wrapped with the /dev/nvidiaN fd that will be mmapped.
    Nvos33WithFd, size 56, {
    h_client: u32 = 0, h_device: u32 = 4, h_memory: u32 = 8, _pad0: u32 = 12, offset: u64 = 16,
    length: u64 = 24, p_linear_address: u64 = 32, status: u32 = 40, flags: u32 = 44, fd: i32 = 48,
    _pad1: u32 = 52 });
abi_struct!(
    /// NVOS34: NV_ESC_RM_UNMAP_MEMORY.
    Nvos34Unmap, size 32, {
    h_client: u32 = 0, h_device: u32 = 4, h_memory: u32 = 8, _pad0: u32 = 12,
    p_linear_address: u64 = 16, status: u32 = 24, flags: u32 = 28 });
abi_struct!(
    /// NVOS55: NV_ESC_RM_DUP_OBJECT.
    Nvos55Dup, size 28, {
    h_client: u32 = 0, h_parent: u32 = 4, h_object: u32 = 8, h_client_src: u32 = 12,
    h_object_src: u32 = 16, flags: u32 = 20, status: u32 = 24 });
abi_struct!(
    /// NVOS02 wrapped with its fd: NV_ESC_RM_ALLOC_MEMORY (issued on /dev/nvidiaN).
    Nvos02WithFd, size 56, {
    h_root: u32 = 0, h_object_parent: u32 = 4, h_object_new: u32 = 8, h_class: u32 = 12,
    flags: u32 = 16, _pad0: u32 = 20, p_memory: u64 = 24, limit: u64 = 32, status: u32 = 40,
    _pad1: u32 = 44, fd: i32 = 48, _pad2: u32 = 52 });
abi_struct!(
    /// NVOS46 (map DMA) up to 575.
    Nvos46V535, size 56, {
    h_client: u32 = 0, h_device: u32 = 4, h_dma: u32 = 8, h_memory: u32 = 12, offset: u64 = 16,
    length: u64 = 24, flags: u32 = 32, _pad0: u32 = 36, dma_offset: u64 = 40, status: u32 = 48,
    _pad1: u32 = 52 });
abi_struct!(
    /// NVOS46 (map DMA) from 580: flags2 and kindOverride added.
    Nvos46V580, size 64, {
    h_client: u32 = 0, h_device: u32 = 4, h_dma: u32 = 8, h_memory: u32 = 12, offset: u64 = 16,
    length: u64 = 24, flags: u32 = 32, flags2: u32 = 36, kind_override: u32 = 40, _pad0: u32 = 44,
    dma_offset: u64 = 48, status: u32 = 56, _pad1: u32 = 60 });
abi_struct!(
    /// NVOS47 (unmap DMA) in 535.
    Nvos47V535, size 40, {
    h_client: u32 = 0, h_device: u32 = 4, h_dma: u32 = 8, h_memory: u32 = 12, flags: u32 = 16,
    _pad0: u32 = 20, dma_offset: u64 = 24, status: u32 = 32, _pad1: u32 = 36 });
abi_struct!(
    /// NVOS47 (unmap DMA) from 550: size added.
    Nvos47V550, size 48, {
    h_client: u32 = 0, h_device: u32 = 4, h_dma: u32 = 8, h_memory: u32 = 12, flags: u32 = 16,
    _pad0: u32 = 20, dma_offset: u64 = 24, size: u64 = 32, status: u32 = 40, _pad1: u32 = 44 });
abi_struct!(
    /// nv_ioctl_rm_api_version_t: NV_ESC_CHECK_VERSION_STR.
    RmApiVersion, size 72, { cmd: u32 = 0, reply: u32 = 4, version_string: [u8; 64] = 8 });
abi_struct!(
    /// nv_ioctl_register_fd_t.
    RegisterFd, size 4, { ctl_fd: i32 = 0 });

pub const RM_API_VERSION_CMD_QUERY: u32 = b'2' as u32;

abi_struct!(
    /// NV_MEMORY_ALLOCATION_PARAMS from 545 (numaNode added).
    MemoryAllocationParamsV545, size 128, {
    owner: u32 = 0, type_: u32 = 4, flags: u32 = 8, width: u32 = 12, height: u32 = 16,
    pitch: i32 = 20, attr: u32 = 24, attr2: u32 = 28, format: u32 = 32, compr_covg: u32 = 36,
    zcull_covg: u32 = 40, _pad0: u32 = 44, range_lo: u64 = 48, range_hi: u64 = 56, size: u64 = 64,
    alignment: u64 = 72, offset: u64 = 80, limit: u64 = 88, address: u64 = 96, ctag_offset: u32 = 104,
    h_va_space: u32 = 108, internalflags: u32 = 112, tag: u32 = 116, numa_node: i32 = 120,
    _pad1: u32 = 124 });
abi_struct!(
    /// NV_MEMORY_ALLOCATION_PARAMS in 535 (no numaNode).
    MemoryAllocationParamsV535, size 120, {
    owner: u32 = 0, type_: u32 = 4, flags: u32 = 8, width: u32 = 12, height: u32 = 16,
    pitch: i32 = 20, attr: u32 = 24, attr2: u32 = 28, format: u32 = 32, compr_covg: u32 = 36,
    zcull_covg: u32 = 40, _pad0: u32 = 44, range_lo: u64 = 48, range_hi: u64 = 56, size: u64 = 64,
    alignment: u64 = 72, offset: u64 = 80, limit: u64 = 88, address: u64 = 96, ctag_offset: u32 = 104,
    h_va_space: u32 = 108, internalflags: u32 = 112, tag: u32 = 116 });
abi_struct!(
    /// NV0080_ALLOC_PARAMETERS (device).
    Nv0080AllocParams, size 56, {
    device_id: u32 = 0, h_client_share: u32 = 4, h_target_client: u32 = 8, h_target_device: u32 = 12,
    flags: u32 = 16, _pad0: u32 = 20, va_space_size: u64 = 24, va_start_internal: u64 = 32,
    va_limit_internal: u64 = 40, va_mode: u32 = 48, _pad1: u32 = 52 });
abi_struct!(
    /// NV2080_ALLOC_PARAMETERS (subdevice).
    Nv2080AllocParams, size 4, { sub_device_id: u32 = 0 });
abi_struct!(
    /// NV_VASPACE_ALLOCATION_PARAMETERS from 580 (pasid added).
    VaSpaceAllocParamsV580, size 56, {
    index: u32 = 0, flags: u32 = 4, va_size: u64 = 8, va_start_internal: u64 = 16,
    va_limit_internal: u64 = 24, big_page_size: u32 = 32, _pad0: u32 = 36, va_base: u64 = 40,
    pasid: u32 = 48, _pad1: u32 = 52 });
abi_struct!(
    /// NV503C_ALLOC_PARAMETERS.
    Nv503cAllocParams, size 4, { flags: u32 = 0 });
abi_struct!(
    /// NV503C_CTRL_REGISTER_VA_SPACE_PARAMS.
    Nv503cRegisterVaSpace, size 16, { h_va_space: u32 = 0, _pad0: u32 = 4, va_space_token: u64 = 8 });
abi_struct!(
    /// NV503C_CTRL_UNREGISTER_VA_SPACE_PARAMS.
    Nv503cUnregisterVaSpace, size 4, { h_va_space: u32 = 0 });
abi_struct!(
    /// NV503C_CTRL_REGISTER_VIDMEM_PARAMS.
    Nv503cRegisterVidmem, size 32, {
    h_memory: u32 = 0, _pad0: u32 = 4, address: u64 = 8, size: u64 = 16, offset: u64 = 24 });
abi_struct!(
    /// NV503C_CTRL_UNREGISTER_VIDMEM_PARAMS.
    Nv503cUnregisterVidmem, size 4, { h_memory: u32 = 0 });

// UVM

abi_struct!(
    /// UvmGpuMappingAttributes.
    UvmGpuMappingAttributes, size 36, {
    gpu_uuid: [u8; 16] = 0, gpu_mapping_type: u32 = 16, gpu_caching_type: u32 = 20,
    gpu_format_type: u32 = 24, gpu_element_bits: u32 = 28, gpu_compression_type: u32 = 32 });
abi_struct!(
    /// UVM_REGISTER_GPU_PARAMS.
    UvmRegisterGpuParams, size 40, {
    gpu_uuid: [u8; 16] = 0, numa_enabled: u8 = 16, _pad0: [u8; 3] = 17, numa_node_id: i32 = 20,
    rm_ctrl_fd: i32 = 24, h_client: u32 = 28, h_smc_part_ref: u32 = 32, rm_status: u32 = 36 });
abi_struct!(
    /// UVM_REGISTER_GPU_VASPACE_PARAMS.
    UvmRegisterGpuVaspaceParams, size 32, {
    gpu_uuid: [u8; 16] = 0, rm_ctrl_fd: i32 = 16, h_client: u32 = 20, h_va_space: u32 = 24,
    rm_status: u32 = 28 });
abi_struct!(
    /// UVM_CREATE_EXTERNAL_RANGE_PARAMS.
    UvmCreateExternalRangeParams, size 24, { base: u64 = 0, length: u64 = 8, rm_status: u32 = 16, _pad0: u32 = 20 });
abi_struct!(
    /// UVM_FREE_PARAMS up to 580.x (length must match the range).
    UvmFreeParamsV535, size 24, { base: u64 = 0, length: u64 = 8, rm_status: u32 = 16, _pad0: u32 = 20 });
abi_struct!(
    /// UVM_FREE_PARAMS from 590 (length removed).
    UvmFreeParamsV590, size 16, { base: u64 = 0, rm_status: u32 = 8, _pad0: u32 = 12 });
abi_struct!(
    /// UVM_UNMAP_EXTERNAL_PARAMS.
    UvmUnmapExternalParams, size 40, {
    base: u64 = 0, length: u64 = 8, gpu_uuid: [u8; 16] = 16, rm_status: u32 = 32, _pad0: u32 = 36 });
abi_struct!(
    /// UVM_MAP_EXTERNAL_SPARSE_PARAMS (UVM_UNMAP_EXTERNAL_PARAMS' layout).
    UvmMapExternalSparseParams, size 40, {
    base: u64 = 0, length: u64 = 8, gpu_uuid: [u8; 16] = 16, rm_status: u32 = 32, _pad0: u32 = 36 });

/// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS: its size depends on the branch's GPU slot count, so it is
/// described by offsets instead of a struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UvmMapExternalLayout {
    pub max_gpus: usize,
}
impl UvmMapExternalLayout {
    pub const BASE: usize = 0;
    pub const LENGTH: usize = 8;
    pub const OFFSET: usize = 16;
    pub const ATTRS: usize = 24;
    pub const fn count(&self) -> usize {
        Self::ATTRS + self.max_gpus * size_of::<UvmGpuMappingAttributes>()
    }
    /// The UUID of the `i`th GPU slot.
    pub const fn gpu_uuid(&self, i: usize) -> usize {
        Self::ATTRS + i * size_of::<UvmGpuMappingAttributes>()
    }
    pub const fn rm_ctrl_fd(&self) -> usize {
        self.count() + 8
    }
    pub const fn h_client(&self) -> usize {
        self.count() + 12
    }
    pub const fn h_memory(&self) -> usize {
        self.count() + 16
    }
    pub const fn rm_status(&self) -> usize {
        self.count() + 20
    }
    pub const fn size(&self) -> usize {
        self.count() + 24
    }
}
const _: () = {
    assert!(UvmMapExternalLayout { max_gpus: 256 }.size() == 9264);
    assert!(UvmMapExternalLayout { max_gpus: 256 }.count() == 9240);
    assert!(UvmMapExternalLayout { max_gpus: 32 }.size() == 1200);
    assert!(UvmMapExternalLayout { max_gpus: 32 }.count() == 1176);
};
