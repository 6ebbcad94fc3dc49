//! The dma-buf export escape and the GPU queries around it (kernel-open/common/inc/nv-ioctl.h,
//! kernel-open/nvidia/nv-dmabuf.c, ctrl/ctrl2080/ctrl2080gpu.h, ctrl/ctrl0000/ctrl0000gpu.h).

use super::pod::abi_struct;
use core::mem::offset_of;

/// NV_DMABUF_EXPORT_MAX_HANDLES: pieces one export call carries.
pub const EXPORT_MAX_HANDLES: usize = 128;
/// `mappingType`: DEFAULT (BAR1 on a discrete GPU) and FORCE_PCIE (coherent GPUs only).
pub const MAPPING_DEFAULT: u8 = 0;
pub const MAPPING_FORCE_PCIE: u8 = 1;

abi_struct!(
    /// nv_ioctl_export_to_dma_buf_fd_t from 570 (mappingType added; 535–565 have a 2600-byte
    /// struct without it, which gdrshim does not issue). `fd` -1 creates the buffer, an fd of an
    /// nv dma-buf adds pieces at `index`; RM's answer is in `status`, the ioctl returns 0.
    ExportToDmabufFd, size 2608, {
    fd: i32 = 0, h_client: u32 = 4, total_objects: u32 = 8, num_objects: u32 = 12, index: u32 = 16,
    _pad0: u32 = 20, total_size: u64 = 24, mapping_type: u8 = 32, allow_mmap: u8 = 33,
    _pad1: [u8; 2] = 34, handles: [u32; EXPORT_MAX_HANDLES] = 36, _pad2: u32 = 548,
    offsets: [u64; EXPORT_MAX_HANDLES] = 552, sizes: [u64; EXPORT_MAX_HANDLES] = 1576, status: u32 = 2600,
    _pad3: u32 = 2604 });

/// NV2080_CTRL_CMD_GPU_GET_INFO_V2 (non-privileged, on a subdevice). Its parameters are
/// `{ u32 gpuInfoListSize; {u32 index; u32 data;} gpuInfoList[MAX] }`, MAX differing per branch
/// (the table's `gpu_info_v2_size`), and RM wants `paramsSize` exact.
pub const GPU_GET_INFO_V2: u32 = 0x2080_0102;
pub const GPU_INFO_LIST_SIZE: usize = 0;
pub const GPU_INFO_FIRST_INDEX: usize = 4;
pub const GPU_INFO_FIRST_DATA: usize = 8;
/// NV2080_CTRL_GPU_INFO_INDEX_DMABUF_CAPABILITY and its YES value: RM says YES when the kernel has
/// dma-buf, APM is off and the CPU is not ppc64le (subdevice_ctrl_gpu_kernel.c); no SKU gate.
pub const GPU_INFO_INDEX_DMABUF_CAPABILITY: u32 = 0x3d;
pub const GPU_INFO_DMABUF_CAPABILITY_YES: u32 = 1;

/// NV2080_CTRL_CMD_FB_GET_INFO_V2 (ctrl2080fb.h 580.65.06:458; non-privileged, flags 0x10118 in
/// g_subdevice_nvoc.c): `{ u32 fbInfoListSize; {u32 index; u32 data;} fbInfoList[MAX] }`, MAX per
/// branch (the table's `fb_info_v2_size`); same list offsets as GPU_GET_INFO_V2 above.
pub const FB_GET_INFO_V2: u32 = 0x2080_1303;
/// NV2080_CTRL_FB_INFO_INDEX_BAR1_SIZE (ctrl2080fb.h 580.65.06:307) and BAR1_AVAIL_SIZE (:335),
/// both in KiB (memmgrGetBAR1InfoForDevice; 0 where RM could not tell: kern_mem_sys_ctrl.c:296).
pub const FB_INFO_INDEX_BAR1_SIZE: u32 = 0x05;
pub const FB_INFO_INDEX_BAR1_AVAIL_SIZE: u32 = 0x1d;

/// NV2080_CTRL_CMD_FB_GET_STATIC_BAR1_INFO (ctrl2080fb.h 570.86.15:2686, 580.65.06:2712;
/// RMCTRL_FLAGS_NON_PRIVILEGED 0x8 in g_subdevice_nvoc.c, control.h:208): whether all of video
/// memory is mapped in BAR1 once (static BAR1), so exports take no BAR1 space of their own.
pub const FB_GET_STATIC_BAR1_INFO: u32 = 0x2080_1354;
abi_struct!(
    /// NV2080_CTRL_FB_GET_STATIC_BAR1_INFO_PARAMS (ctrl2080fb.h 580.65.06:2716): two NvBools, then
    /// 8-aligned u64s.
    StaticBar1Info, size 24, {
    enabled: u8 = 0, write_combined: u8 = 1, _pad0: [u8; 6] = 2, start_offset: u64 = 8, size: u64 = 16 });

/// NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, on the root client: a gpuId → its device instance.
pub const GPU_GET_ID_INFO_V2: u32 = 0x0000_0205;
abi_struct!(
    /// NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS.
    GpuIdInfoV2, size 32, {
    gpu_id: u32 = 0, gpu_flags: u32 = 4, device_instance: u32 = 8, sub_device_instance: u32 = 12,
    sli_status: u32 = 16, board_id: u32 = 20, gpu_instance: u32 = 24, numa_id: i32 = 28 });

/// NV_ESC_CARD_INFO fills an array of these (libcuda passes 32; fewer than there are GPUs is
/// refused with -EINVAL). `gpu_id` is RM's gpuId; `minor_number` is N of /dev/nvidiaN.
pub const CARD_INFO_ENTRIES: usize = 32;
abi_struct!(
    /// nv_ioctl_card_info_t.
    CardInfo, size 72, {
    valid: u8 = 0, _pad0: [u8; 3] = 1, pci_domain: u32 = 4, pci_bus: u8 = 8, pci_slot: u8 = 9,
    pci_function: u8 = 10, _pad1: u8 = 11, pci_vendor_id: u16 = 12, pci_device_id: u16 = 14,
    gpu_id: u32 = 16, interrupt_line: u16 = 20, _pad2: [u8; 2] = 22, reg_address: u64 = 24,
    reg_size: u64 = 32, fb_address: u64 = 40, fb_size: u64 = 48, minor_number: u32 = 56,
    dev_name: [u8; 10] = 60, _pad3: [u8; 2] = 70 });

#[cfg(test)]
mod tests {
    use super::super::{esc, nv_ioctl, pod_bytes, zeroed};
    use super::*;
    use core::mem::size_of;

    #[test]
    fn request_words() {
        // as libcuda issued them on the H200 (nvidia-abi.md §1, S10)
        assert_eq!(nv_ioctl(esc::EXPORT_TO_DMABUF_FD, size_of::<ExportToDmabufFd>()), 0xCA30_46D9);
        assert_eq!(
            nv_ioctl(esc::CARD_INFO, CARD_INFO_ENTRIES * size_of::<CardInfo>()),
            0xC900_46C8
        );
    }

    #[test]
    fn export_struct_bytes() {
        let mut e: ExportToDmabufFd = zeroed();
        e.fd = -1;
        e.h_client = 0xc1d0_0022;
        e.total_objects = 2;
        e.num_objects = 2;
        e.total_size = 0x40_0000;
        e.handles[1] = 0x5c00_0099;
        e.offsets[1] = 0x20_0000;
        e.sizes[127] = 7;
        e.status = 0x57;
        let b = pod_bytes(&e);
        assert_eq!(&b[0..4], &[0xff; 4]);
        assert_eq!(&b[40..44], &0x5c00_0099u32.to_le_bytes());
        assert_eq!(&b[560..568], &0x20_0000u64.to_le_bytes());
        assert_eq!(&b[1576 + 127 * 8..2600], &7u64.to_le_bytes());
        assert_eq!(&b[2600..2604], &0x57u32.to_le_bytes());
    }
}
