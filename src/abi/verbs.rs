//! The few facts of rdma-core's `infiniband/verbs.h` (x86-64) the hooks rely on.

/// `IBV_ACCESS_ON_DEMAND`: an ODP MR, which neither route can serve.
pub const IBV_ACCESS_ON_DEMAND: u32 = 0x40;
/// `struct ibv_mr`: `addr` is at 16 (after `context` and `pd`). For a dma-buf MR rdma-core puts
/// the buffer offset there; gdrshim shows the caller the VA it registered instead.
pub const IBV_MR_ADDR_OFFSET: usize = 16;
/// `IBV_REREG_MR_CHANGE_TRANSLATION`: `ibv_rereg_mr` moves the MR to a new range.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: i32 = 1;
/// `IBV_REREG_MR_ERR_CMD` (enum ibv_rereg_mr_err_code): the kernel refused the command; the MR is
/// as it was.
pub const IBV_REREG_MR_ERR_CMD: i32 = -4;
/// `struct ibv_mr_init_attr` of `ibv_reg_mr_ex` (IBVERBS_1.15), as rdma-core v64.0's verbs.h has
/// it. libibverbs reads a field only when its `comp_mask` bit is set, so a caller built against
/// an older header (without `buf`) passes a shorter struct: gdrshim reads the caller's only up
/// to [`MR_INIT_ATTR_READ`], and `dmah` only with its bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrInitAttr {
    pub length: u64,
    pub access: i32,
    pub comp_mask: u64,
    pub iova: u64,
    pub addr: u64,
    pub fd: i32,
    pub fd_offset: u64,
    pub dmah: u64,
    pub buf: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<MrInitAttr>() == 72);
    assert!(offset_of!(MrInitAttr, length) == MR_INIT_ATTR_LENGTH);
    assert!(offset_of!(MrInitAttr, access) == MR_INIT_ATTR_ACCESS);
    assert!(offset_of!(MrInitAttr, comp_mask) == MR_INIT_ATTR_COMP_MASK);
    assert!(offset_of!(MrInitAttr, iova) == MR_INIT_ATTR_IOVA);
    assert!(offset_of!(MrInitAttr, addr) == MR_INIT_ATTR_ADDR);
    assert!(offset_of!(MrInitAttr, fd) == 40);
    assert!(offset_of!(MrInitAttr, fd_offset) == 48);
    assert!(offset_of!(MrInitAttr, dmah) == MR_INIT_ATTR_DMAH);
    assert!(offset_of!(MrInitAttr, buf) == 64);
};

pub const MR_INIT_ATTR_LENGTH: usize = 0;
pub const MR_INIT_ATTR_ACCESS: usize = 8;
pub const MR_INIT_ATTR_COMP_MASK: usize = 16;
pub const MR_INIT_ATTR_IOVA: usize = 24;
pub const MR_INIT_ATTR_ADDR: usize = 32;
pub const MR_INIT_ATTR_DMAH: usize = 56;
/// Bytes of the caller's struct gdrshim always reads (up to and without `fd`).
pub const MR_INIT_ATTR_READ: usize = 40;
/// `enum ibv_mr_init_attr_mask`.
pub const REG_MR_MASK_IOVA: u64 = 1;
/// `addr` given.
pub const REG_MR_MASK_ADDR: u64 = 2;
/// A dma-buf registration (`fd`).
pub const REG_MR_MASK_FD: u64 = 4;
pub const REG_MR_MASK_FD_OFFSET: u64 = 8;
/// `dmah`: a DMA handle (`ibv_alloc_dmah`: TPH processing hints, CPU id, PCIe ordering).
pub const REG_MR_MASK_DMAH: u64 = 0x10;
/// `buf`: memory of `ibv_alloc_buf`, the provider's own allocation (IBVERBS_1.17).
pub const REG_MR_MASK_BUF: u64 = 0x20;
/// Every bit rdma-core v64.0 knows.
pub const REG_MR_MASK_KNOWN: u64 = 0x3f;
