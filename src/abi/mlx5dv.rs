//! The few facts of rdma-core's `providers/mlx5/mlx5dv.h` (x86-64, rdma-core v64.0) the devx
//! umem hooks rely on.

use core::mem::{offset_of, size_of};

/// `MLX5DV_UMEM_MASK_DMABUF`: `dmabuf_fd` is given, and `addr` is the offset in that buffer.
pub const UMEM_MASK_DMABUF: u64 = 1;
/// Every `comp_mask` bit of `struct mlx5dv_devx_umem_in` rdma-core v64.0 knows; libmlx5 refuses
/// any other with EOPNOTSUPP.
pub const UMEM_MASK_KNOWN: u64 = UMEM_MASK_DMABUF;
/// The page sizes `mlx5dv_devx_umem_reg` asks the kernel for: every size from the adapter's
/// page (`MLX5_ADAPTER_PAGE_SIZE`, 4 KiB) up (`_mlx5dv_devx_umem_reg` in providers/mlx5/verbs.c).
pub const UMEM_LEGACY_PGSZ_BITMAP: u64 = !(4096 - 1);

/// Symbol versions of libmlx5's map (providers/mlx5/libmlx5.map).
pub const MLX5_1_7: &[u8] = b"MLX5_1.7";
pub const MLX5_1_19: &[u8] = b"MLX5_1.19";

/// `struct mlx5dv_devx_umem_in`, the argument of `mlx5dv_devx_umem_reg_ex` (MLX5_1.19).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevxUmemIn {
    pub addr: u64,
    pub size: u64,
    pub access: u32,
    pub pgsz_bitmap: u64,
    pub comp_mask: u64,
    pub dmabuf_fd: i32,
}

const _: () = {
    assert!(size_of::<DevxUmemIn>() == 48);
    assert!(offset_of!(DevxUmemIn, addr) == 0);
    assert!(offset_of!(DevxUmemIn, size) == 8);
    assert!(offset_of!(DevxUmemIn, access) == 16);
    assert!(offset_of!(DevxUmemIn, pgsz_bitmap) == 24);
    assert!(offset_of!(DevxUmemIn, comp_mask) == 32);
    assert!(offset_of!(DevxUmemIn, dmabuf_fd) == 40);
};
