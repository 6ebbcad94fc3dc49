//! Raw NVIDIA driver ABI: escape numbers, parameter structs, class ids, controls, UVM commands
//! and the per-branch layout table. Facts come from `shared/docs/nvidia-abi.md`; every struct has
//! a compile-time size/offset check and every request word a golden value in the tests.
//!
//! Nothing here touches memory or the kernel: it only describes bytes.

use core::mem::{offset_of, size_of};

pub type NvHandle = u32;

// ---------------------------------------------------------------------------------------------
// ioctl encoding (/dev/nvidiactl, /dev/nvidiaN)

pub const NV_IOCTL_MAGIC: u32 = 0x46; // 'F'

/// `_IOWR('F', nr, size)`: the driver reads only `_IOC_NR` and `_IOC_SIZE`.
pub const fn nv_ioctl(nr: u32, size: usize) -> u64 {
    (0xC000_0000u32 | ((size as u32 & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | nr) as u64
}
pub const fn ioc_nr(request: u64) -> u32 {
    (request & 0xff) as u32
}
pub const fn ioc_type(request: u64) -> u32 {
    ((request >> 8) & 0xff) as u32
}
pub const fn ioc_size(request: u64) -> usize {
    ((request >> 16) & 0x3fff) as usize
}

pub mod esc {
    pub const RM_ALLOC_MEMORY: u32 = 0x27;
    pub const RM_ALLOC_OBJECT: u32 = 0x28;
    pub const RM_FREE: u32 = 0x29;
    pub const RM_CONTROL: u32 = 0x2A;
    pub const RM_ALLOC: u32 = 0x2B;
    pub const RM_DUP_OBJECT: u32 = 0x34;
    pub const RM_SHARE: u32 = 0x35;
    pub const RM_VID_HEAP_CONTROL: u32 = 0x4A;
    pub const RM_MAP_MEMORY: u32 = 0x4E;
    pub const RM_UNMAP_MEMORY: u32 = 0x4F;
    pub const RM_MAP_MEMORY_DMA: u32 = 0x57;
    pub const RM_UNMAP_MEMORY_DMA: u32 = 0x58;
    pub const CARD_INFO: u32 = 0xC8;
    pub const REGISTER_FD: u32 = 0xC9;
    pub const CHECK_VERSION_STR: u32 = 0xD2;
    pub const IOCTL_XFER_CMD: u32 = 0xD3;
}

// ---------------------------------------------------------------------------------------------
// Class ids

pub mod class {
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
    pub const NV01_MEMORY_LOCAL_PRIVILEGED: u32 = 0x3F;
    pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
    pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
    pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xC2;
    pub const NV_MEMORY_FABRIC: u32 = 0xF8;
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50A0;
    pub const NV50_THIRD_PARTY_P2P: u32 = 0x503C;
    pub const FERMI_VASPACE_A: u32 = 0x90F1;

    pub const fn is_root(c: u32) -> bool {
        matches!(c, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
    }
    /// Classes whose alloc parameters are NV_MEMORY_ALLOCATION_PARAMS.
    pub const fn uses_memory_alloc_params(c: u32) -> bool {
        matches!(c, NV01_MEMORY_LOCAL_USER | NV01_MEMORY_SYSTEM | NV50_MEMORY_VIRTUAL)
    }
}

// ---------------------------------------------------------------------------------------------
// NV503C (third-party P2P)

pub mod p2p {
    pub const CTRL_CLASS: u32 = 0x503C;
    pub const REGISTER_VA_SPACE: u32 = 0x503C_0102;
    pub const UNREGISTER_VA_SPACE: u32 = 0x503C_0103;
    pub const REGISTER_VIDMEM: u32 = 0x503C_0104;
    pub const UNREGISTER_VIDMEM: u32 = 0x503C_0105;
    pub const REGISTER_PID: u32 = 0x503C_0106;
    pub const TYPE_BAR1: u32 = 1;
    /// RM takes offset, address and size in 64 KiB units.
    pub const GRANULE: u64 = 64 << 10;
}

// ---------------------------------------------------------------------------------------------
// Status codes

pub mod status {
    pub const NV_OK: u32 = 0x00;
    pub const NV_ERR_GPU_UUID_NOT_FOUND: u32 = 0x12;
    pub const NV_ERR_IN_USE: u32 = 0x17;
    pub const NV_ERR_INSERT_DUPLICATE_NAME: u32 = 0x19;
    pub const NV_ERR_INSUFFICIENT_RESOURCES: u32 = 0x1A;
    pub const NV_ERR_INSUFFICIENT_PERMISSIONS: u32 = 0x1B;
    pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1E;
    pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1F;
    pub const NV_ERR_INVALID_CLASS: u32 = 0x22;
    pub const NV_ERR_INVALID_CLIENT: u32 = 0x23;
    pub const NV_ERR_INVALID_COMMAND: u32 = 0x24;
    pub const NV_ERR_INVALID_DEVICE: u32 = 0x26;
    pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x33;
    pub const NV_ERR_INVALID_OBJECT_NEW: u32 = 0x34;
    pub const NV_ERR_INVALID_OBJECT_PARENT: u32 = 0x36;
    pub const NV_ERR_INVALID_PARAM_STRUCT: u32 = 0x3A;
    pub const NV_ERR_INVALID_STATE: u32 = 0x40;
    pub const NV_ERR_NO_MEMORY: u32 = 0x51;
    pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
    pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;
    pub const NV_ERR_OUT_OF_RANGE: u32 = 0x5B;
    pub const NV_ERR_STATE_IN_USE: u32 = 0x63;
    pub const NV_ERR_UVM_ADDRESS_IN_USE: u32 = 0x68;
    pub const NV_ERR_GENERIC: u32 = 0xFFFF;

    pub fn name(s: u32) -> &'static str {
        match s {
            NV_OK => "NV_OK",
            NV_ERR_GPU_UUID_NOT_FOUND => "NV_ERR_GPU_UUID_NOT_FOUND",
            NV_ERR_IN_USE => "NV_ERR_IN_USE",
            NV_ERR_INSERT_DUPLICATE_NAME => "NV_ERR_INSERT_DUPLICATE_NAME",
            NV_ERR_INSUFFICIENT_RESOURCES => "NV_ERR_INSUFFICIENT_RESOURCES",
            NV_ERR_INSUFFICIENT_PERMISSIONS => "NV_ERR_INSUFFICIENT_PERMISSIONS",
            NV_ERR_INVALID_ADDRESS => "NV_ERR_INVALID_ADDRESS",
            NV_ERR_INVALID_ARGUMENT => "NV_ERR_INVALID_ARGUMENT",
            NV_ERR_INVALID_CLASS => "NV_ERR_INVALID_CLASS",
            NV_ERR_INVALID_CLIENT => "NV_ERR_INVALID_CLIENT",
            NV_ERR_INVALID_COMMAND => "NV_ERR_INVALID_COMMAND",
            NV_ERR_INVALID_DEVICE => "NV_ERR_INVALID_DEVICE",
            NV_ERR_INVALID_OBJECT_HANDLE => "NV_ERR_INVALID_OBJECT_HANDLE",
            NV_ERR_INVALID_OBJECT_NEW => "NV_ERR_INVALID_OBJECT_NEW",
            NV_ERR_INVALID_OBJECT_PARENT => "NV_ERR_INVALID_OBJECT_PARENT",
            NV_ERR_INVALID_PARAM_STRUCT => "NV_ERR_INVALID_PARAM_STRUCT",
            NV_ERR_INVALID_STATE => "NV_ERR_INVALID_STATE",
            NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY",
            NV_ERR_NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
            NV_ERR_OBJECT_NOT_FOUND => "NV_ERR_OBJECT_NOT_FOUND",
            NV_ERR_OUT_OF_RANGE => "NV_ERR_OUT_OF_RANGE",
            NV_ERR_STATE_IN_USE => "NV_ERR_STATE_IN_USE",
            NV_ERR_UVM_ADDRESS_IN_USE => "NV_ERR_UVM_ADDRESS_IN_USE",
            NV_ERR_GENERIC => "NV_ERR_GENERIC",
            _ => "NV_ERR_(unknown)",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// UVM (/dev/nvidia-uvm): the request is the plain command number.

pub mod uvm {
    pub const INITIALIZE: u64 = 0x3000_0001;
    pub const DEINITIALIZE: u64 = 0x3000_0002;
    pub const REGISTER_GPU_VASPACE: u64 = 25;
    pub const UNREGISTER_GPU_VASPACE: u64 = 26;
    pub const MAP_EXTERNAL_ALLOCATION: u64 = 33;
    pub const FREE: u64 = 34;
    pub const REGISTER_GPU: u64 = 37;
    pub const UNREGISTER_GPU: u64 = 38;
    pub const UNMAP_EXTERNAL: u64 = 66;
    pub const CREATE_EXTERNAL_RANGE: u64 = 73;
    pub const MM_INITIALIZE: u64 = 75;
}

// ---------------------------------------------------------------------------------------------
// Parameter structs (x86-64). Identical 535 → 595 unless the name carries a branch.

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
        unsafe impl Pod for $name {}
        const _: () = {
            assert!(size_of::<$name>() == $size);
            $(assert!(offset_of!($name, $field) == $off);)*
        };
    };
}

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

// ---------------------------------------------------------------------------------------------
// Per-branch table

/// What differs between driver branches, as far as gdrshim reads or writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbiTable {
    /// First version this node describes, e.g. "580.65.06".
    pub since: &'static str,
    pub memory_alloc_params_size: usize,
    pub vaspace_alloc_params_size: usize,
    pub root_alloc_params_size: usize,
    pub nvos46_size: usize,
    pub nvos47_size: usize,
    pub uvm_max_gpus: usize,
    /// UVM_FREE_PARAMS carries `length` (24 bytes) up to 580.x.
    pub uvm_free_has_length: bool,
}

impl AbiTable {
    pub const fn uvm_map_external(&self) -> UvmMapExternalLayout {
        UvmMapExternalLayout { max_gpus: self.uvm_max_gpus }
    }
    pub const fn uvm_free_size(&self) -> usize {
        if self.uvm_free_has_length {
            size_of::<UvmFreeParamsV535>()
        } else {
            size_of::<UvmFreeParamsV590>()
        }
    }
}

/// A driver version as `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DriverVersion(pub u32, pub u32, pub u32);

impl DriverVersion {
    /// Parses "580.159.04" (also "580.159" and surrounding whitespace or NUL bytes).
    pub fn parse(s: &str) -> Option<DriverVersion> {
        let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        let mut it = s.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = match it.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if it.next().is_some() {
            return None;
        }
        Some(DriverVersion(major, minor, patch))
    }
}

impl core::fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{:02}", self.0, self.1, self.2)
    }
}

const V535: AbiTable = AbiTable {
    since: "535.0.0",
    memory_alloc_params_size: 120,
    vaspace_alloc_params_size: 48,
    root_alloc_params_size: 108,
    nvos46_size: 56,
    nvos47_size: 40,
    uvm_max_gpus: 32,
    uvm_free_has_length: true,
};
const V545: AbiTable = AbiTable { since: "545.23.06", memory_alloc_params_size: 128, ..V535 };
const V550_40: AbiTable = AbiTable { since: "550.40.07", nvos47_size: 48, ..V545 };
const V550_54: AbiTable = AbiTable { since: "550.54.14", uvm_max_gpus: 256, ..V550_40 };
const V555: AbiTable = AbiTable { since: "555.42.02", ..V550_54 };
const V570: AbiTable = AbiTable { since: "570.86.15", root_alloc_params_size: 120, ..V555 };
const V580: AbiTable = AbiTable { since: "580.65.06", nvos46_size: 64, vaspace_alloc_params_size: 56, ..V570 };
const V590: AbiTable = AbiTable { since: "590.44.01", uvm_free_has_length: false, ..V580 };

/// Branches whose layouts were verified (fact sheet §7). Anything else is pass-through.
pub fn table_for(v: DriverVersion) -> Option<&'static AbiTable> {
    let DriverVersion(major, minor, _) = v;
    Some(match major {
        535 => &V535,
        545 => &V545,
        550 if (minor, v.2) < (54, 14) => &V550_40,
        550 => &V550_54,
        555 | 560 | 565 => &V555,
        570 | 575 => &V570,
        580 => &V580,
        590 | 595 => &V590,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request_words() {
        assert_eq!(nv_ioctl(esc::RM_ALLOC_MEMORY, size_of::<Nvos02WithFd>()), 0xC038_4627);
        assert_eq!(nv_ioctl(esc::RM_FREE, size_of::<Nvos00Free>()), 0xC010_4629);
        assert_eq!(nv_ioctl(esc::RM_CONTROL, size_of::<Nvos54Control>()), 0xC020_462A);
        assert_eq!(nv_ioctl(esc::RM_ALLOC, size_of::<Nvos21Alloc>()), 0xC020_462B);
        assert_eq!(nv_ioctl(esc::RM_ALLOC, size_of::<Nvos64Alloc>()), 0xC030_462B);
        assert_eq!(nv_ioctl(esc::RM_DUP_OBJECT, size_of::<Nvos55Dup>()), 0xC01C_4634);
        assert_eq!(nv_ioctl(esc::RM_VID_HEAP_CONTROL, 184), 0xC0B8_464A);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY, size_of::<Nvos33WithFd>()), 0xC038_464E);
        assert_eq!(nv_ioctl(esc::RM_UNMAP_MEMORY, size_of::<Nvos34Unmap>()), 0xC020_464F);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY_DMA, size_of::<Nvos46V535>()), 0xC038_4657);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY_DMA, size_of::<Nvos46V580>()), 0xC040_4657);
        assert_eq!(nv_ioctl(esc::CARD_INFO, 32 * 72), 0xC900_46C8);
        assert_eq!(nv_ioctl(esc::REGISTER_FD, size_of::<RegisterFd>()), 0xC004_46C9);
        assert_eq!(nv_ioctl(esc::CHECK_VERSION_STR, size_of::<RmApiVersion>()), 0xC048_46D2);
        assert_eq!(nv_ioctl(esc::IOCTL_XFER_CMD, 16), 0xC010_46D3);
    }

    #[test]
    fn request_word_fields_round_trip() {
        let r = 0xC030_462Bu64;
        assert_eq!(ioc_nr(r), esc::RM_ALLOC);
        assert_eq!(ioc_type(r), NV_IOCTL_MAGIC);
        assert_eq!(ioc_size(r), 48);
    }

    #[test]
    fn branch_table_follows_the_fact_sheet() {
        let t = |s| table_for(DriverVersion::parse(s).unwrap()).copied();
        let v535 = t("535.288.01").unwrap();
        assert_eq!((v535.memory_alloc_params_size, v535.uvm_max_gpus, v535.nvos47_size), (120, 32, 40));
        assert_eq!(v535.uvm_map_external().size(), 1200);
        assert_eq!(v535.uvm_free_size(), 24);
        assert_eq!(t("545.23.06").unwrap().memory_alloc_params_size, 128);
        assert_eq!(t("550.40.07").unwrap().nvos47_size, 48);
        assert_eq!(t("550.40.07").unwrap().uvm_max_gpus, 32);
        assert_eq!(t("550.54.14").unwrap().uvm_max_gpus, 256);
        assert_eq!(t("550.163.01").unwrap().uvm_map_external().size(), 9264);
        assert_eq!(t("570.86.15").unwrap().root_alloc_params_size, 120);
        assert_eq!(t("565.57.01").unwrap().root_alloc_params_size, 108);
        let v580 = t("580.159.04").unwrap();
        assert_eq!((v580.nvos46_size, v580.vaspace_alloc_params_size, v580.uvm_free_size()), (64, 56, 24));
        let v590 = t("590.48.01").unwrap();
        assert_eq!(v590.uvm_free_size(), 16);
        assert_eq!(t("595.45.04"), Some(v590));
        assert_eq!(t("595.71.05"), Some(v590));
        // Branches nobody verified are refused, never guessed.
        assert_eq!(t("530.41.03"), None);
        assert_eq!(t("600.10.01"), None);
        assert_eq!(t("540.1.1"), None);
    }

    #[test]
    fn version_parsing() {
        assert_eq!(DriverVersion::parse("580.159.04\0\0"), Some(DriverVersion(580, 159, 4)));
        assert_eq!(DriverVersion::parse(" 595.45.04\n"), Some(DriverVersion(595, 45, 4)));
        assert_eq!(DriverVersion::parse("580.159"), Some(DriverVersion(580, 159, 0)));
        assert_eq!(DriverVersion::parse("580"), None);
        assert_eq!(DriverVersion::parse("a.b.c"), None);
        assert_eq!(DriverVersion::parse("1.2.3.4"), None);
        assert_eq!(DriverVersion(580, 159, 4).to_string(), "580.159.04");
    }

    #[test]
    fn pod_round_trip() {
        let r = Nv503cRegisterVidmem { h_memory: 0x5c00_0096, _pad0: 0, address: 0x7f43_5200_0000, size: 64 << 20, offset: 0 };
        let b = pod_bytes(&r);
        // Bytes as the H200 trace shows them for cudaMalloc(64 MiB).
        assert_eq!(hex(b), "9600005c0000000000000052437f000000000004000000000000000000000000");
        assert_eq!(read_pod::<Nv503cRegisterVidmem>(b), Some(r));
        assert_eq!(read_pod::<Nv503cRegisterVidmem>(&b[..31]), None);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
