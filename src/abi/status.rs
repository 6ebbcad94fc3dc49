//! RM status codes (kernel-open/common/inc/nvstatuscodes.h), their names, and what a refusal of
//! each call gdrshim makes most likely means, as the driver's source gives it (open-gpu-kernel-
//! modules 535 … 595.45.04; file names below are in that tree).

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
pub const NV_ERR_INVALID_OBJECT: u32 = 0x31;
pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x33;
pub const NV_ERR_INVALID_OBJECT_NEW: u32 = 0x34;
pub const NV_ERR_INVALID_OBJECT_PARENT: u32 = 0x36;
pub const NV_ERR_INVALID_PARAM_STRUCT: u32 = 0x3A;
pub const NV_ERR_INVALID_STATE: u32 = 0x40;
pub const NV_ERR_NO_MEMORY: u32 = 0x51;
pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;
pub const NV_ERR_OPERATING_SYSTEM: u32 = 0x59;
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
        NV_ERR_INVALID_OBJECT => "NV_ERR_INVALID_OBJECT",
        NV_ERR_INVALID_OBJECT_HANDLE => "NV_ERR_INVALID_OBJECT_HANDLE",
        NV_ERR_INVALID_OBJECT_NEW => "NV_ERR_INVALID_OBJECT_NEW",
        NV_ERR_INVALID_OBJECT_PARENT => "NV_ERR_INVALID_OBJECT_PARENT",
        NV_ERR_INVALID_PARAM_STRUCT => "NV_ERR_INVALID_PARAM_STRUCT",
        NV_ERR_INVALID_STATE => "NV_ERR_INVALID_STATE",
        NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY",
        NV_ERR_NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
        NV_ERR_OBJECT_NOT_FOUND => "NV_ERR_OBJECT_NOT_FOUND",
        NV_ERR_OPERATING_SYSTEM => "NV_ERR_OPERATING_SYSTEM",
        NV_ERR_OUT_OF_RANGE => "NV_ERR_OUT_OF_RANGE",
        NV_ERR_STATE_IN_USE => "NV_ERR_STATE_IN_USE",
        NV_ERR_UVM_ADDRESS_IN_USE => "NV_ERR_UVM_ADDRESS_IN_USE",
        NV_ERR_GENERIC => "NV_ERR_GENERIC",
        _ => "NV_ERR_(unknown)",
    }
}

/// The RM calls gdrshim issues itself, for [`cause`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// RM_ALLOC of NV50_THIRD_PARTY_P2P under a subdevice.
    P2pAlloc,
    RegisterVaSpace,
    RegisterVidmem,
    UnregisterVidmem,
    /// NV_ESC_EXPORT_TO_DMABUF_FD on a /dev/nvidiaN fd.
    DmabufExport,
    /// NV2080_CTRL_CMD_GPU_GET_INFO_V2 (the dma-buf capability) and the NV0000 GPU queries.
    GpuQuery,
    /// RM_FREE of an object of ours.
    Free,
}

impl Call {
    pub fn name(self) -> &'static str {
        match self {
            Call::P2pAlloc => "NV503C alloc",
            Call::RegisterVaSpace => "REGISTER_VA_SPACE",
            Call::RegisterVidmem => "REGISTER_VIDMEM",
            Call::UnregisterVidmem => "UNREGISTER_VIDMEM",
            Call::DmabufExport => "EXPORT_TO_DMABUF_FD",
            Call::GpuQuery => "GPU query",
            Call::Free => "RM_FREE",
        }
    }
}

/// What a refusal of `call` with status `st` most likely means, for people.
pub fn cause(call: Call, st: u32) -> &'static str {
    use Call::*;
    match (call, st) {
        // gpu/bus/third_party_p2p.c, the 503C constructor; the P2P patch touches none of this
        (P2pAlloc, NV_ERR_STATE_IN_USE) => "a 503C already exists under this subdevice in this client: native registration present",
        (P2pAlloc, NV_ERR_NOT_SUPPORTED) => {
            "APM (Ampere Protected Memory / confidential computing) is enabled on this GPU, or the 503C was asked for without \
             TYPE_BAR1 (the GPU-to-GPU P2P patch does not touch third-party P2P)"
        }
        (P2pAlloc, NV_ERR_INVALID_ARGUMENT) => {
            "BAR1 type refused: a coherent CPU-mapped GPU (Grace Hopper/Blackwell C2C); use the DMA-BUF route"
        }
        (P2pAlloc, NV_ERR_INVALID_STATE) => "NVLINK type on a GPU without a coherent CPU mapping",
        (P2pAlloc, NV_ERR_INVALID_OBJECT_PARENT) => "the parent is not a subdevice of this client",
        (P2pAlloc, NV_ERR_INVALID_CLASS) => "the GPU's class list has no 0x503C",
        (RegisterVaSpace, NV_ERR_INSERT_DUPLICATE_NAME) => "this VA space is registered on the 503C already",
        (RegisterVidmem, NV_ERR_INSERT_DUPLICATE_NAME) => "the memory, or an overlapping address range, is registered on this 503C already",
        (RegisterVidmem, NV_ERR_NOT_SUPPORTED) => "the memory is not video memory (FBMEM)",
        (RegisterVidmem, NV_ERR_INVALID_ARGUMENT) => "address, size or offset not 64 KiB aligned, or past the end of the memory",
        (RegisterVidmem | UnregisterVidmem, NV_ERR_OBJECT_NOT_FOUND) => {
            "the memory handle is not in the 503C's client or not under its device (freed meanwhile?)"
        }
        // kernel-open/nvidia/nv-dmabuf.c and osapi.c RmDmabufVerifyMemHandle
        (DmabufExport, NV_ERR_NOT_SUPPORTED) => {
            "the GPU reports no dma-buf capability (kernel without CONFIG_DMA_SHARED_BUFFER, APM on, or ppc64le), SLI, \
             FORCE_PCIE on a GPU without a coherent CPU mapping, or bAllowMmap on a discrete GPU"
        }
        (DmabufExport, NV_ERR_INVALID_OBJECT_PARENT) => "the memory belongs to another GPU than the /dev/nvidiaN the export was issued on",
        (DmabufExport, NV_ERR_INVALID_ARGUMENT) => {
            "offset or size not page aligned or past the end of the memory, not video memory, mixed kinds of memory in one \
             buffer, or sizes that do not add up to totalSize"
        }
        (DmabufExport, NV_ERR_OBJECT_NOT_FOUND) => "the memory handle is not in the client (freed meanwhile?)",
        (DmabufExport, NV_ERR_INVALID_OBJECT_HANDLE) => "the client handle is unknown to RM",
        (DmabufExport, NV_ERR_INVALID_OBJECT) => "the handle is not a memory object",
        (DmabufExport, NV_ERR_IN_USE) => "a slot of the buffer was filled twice",
        (DmabufExport, NV_ERR_OPERATING_SYSTEM) => "the kernel refused to make the dma-buf or its fd (fd limit?)",
        (DmabufExport, NV_ERR_NO_MEMORY) => "out of kernel memory for the buffer's bookkeeping",
        (GpuQuery, NV_ERR_INVALID_PARAM_STRUCT) => "parameter size differs from this driver's: unknown driver ABI",
        (GpuQuery, NV_ERR_INSUFFICIENT_PERMISSIONS) => "this process has not opened the GPU's /dev/nvidiaN",
        (_, NV_ERR_INVALID_CLIENT) => "the client is not usable from this fd: strict client validation",
        (_, NV_ERR_OBJECT_NOT_FOUND) => "handle not found in the client",
        (_, NV_ERR_INVALID_ARGUMENT) => "argument refused, or an unknown driver ABI",
        (_, NV_ERR_GENERIC) => "the ioctl itself failed (wrong fd, size mismatch, or a lost GPU)",
        _ => "see the driver's status code list",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_follow_the_driver_source() {
        // the 503C constructor refuses with NOT_SUPPORTED for APM/CC, not for an unpatched driver
        assert!(cause(Call::P2pAlloc, NV_ERR_NOT_SUPPORTED).contains("APM"));
        assert!(!cause(Call::P2pAlloc, NV_ERR_NOT_SUPPORTED).contains("patched driver?"));
        assert!(cause(Call::DmabufExport, NV_ERR_INVALID_OBJECT_PARENT).contains("another GPU"));
        assert!(cause(Call::DmabufExport, NV_ERR_NOT_SUPPORTED).contains("dma-buf capability"));
        assert_eq!(name(0x36), "NV_ERR_INVALID_OBJECT_PARENT");
        assert_eq!(name(0x1234), "NV_ERR_(unknown)");
    }
}
