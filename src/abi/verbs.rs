//! The few facts of rdma-core's `infiniband/verbs.h` (x86-64) the hooks rely on.

/// `IBV_ACCESS_ON_DEMAND`: an ODP MR, which neither route can serve.
pub const IBV_ACCESS_ON_DEMAND: u32 = 0x40;
/// `struct ibv_mr`: `addr` is at 16 (after `context` and `pd`). For a dma-buf MR rdma-core puts
/// the buffer offset there; gdrshim shows the caller the VA it registered instead.
pub const IBV_MR_ADDR_OFFSET: usize = 16;
/// `IBV_REREG_MR_CHANGE_TRANSLATION`: `ibv_rereg_mr` moves the MR to a new range.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: i32 = 1;
/// `struct ibv_mr_init_attr` (rdma-core 59+, `ibv_reg_mr_ex`): 0 length, 8 access, 16 comp_mask,
/// 24 iova, 32 addr, 40 fd, 48 fd_offset, 56 dmah [read from generated bindings of rdma-core
/// HEAD, not from a release's header]; comp_mask IBV_REG_MR_MASK_IOVA = 1.
pub const MR_INIT_ATTR_LENGTH: usize = 0;
pub const MR_INIT_ATTR_ACCESS: usize = 8;
pub const MR_INIT_ATTR_COMP_MASK: usize = 16;
pub const MR_INIT_ATTR_IOVA: usize = 24;
pub const MR_INIT_ATTR_ADDR: usize = 32;
/// Bytes of the struct gdrshim reads (up to and without `fd`).
pub const MR_INIT_ATTR_READ: usize = 40;
pub const REG_MR_MASK_IOVA: u64 = 1;
/// comp_mask IBV_REG_MR_MASK_ADDR and IBV_REG_MR_MASK_FD: `addr` given / a dma-buf registration.
pub const REG_MR_MASK_ADDR: u64 = 2;
pub const REG_MR_MASK_FD: u64 = 4;
