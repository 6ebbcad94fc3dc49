//! The verbs ABI the self-test uses, as rdma-core's `<infiniband/verbs.h>` lays it out on x86-64
//! (checked field by field against the header by `layout::tests`), and libibverbs.so.1 loaded at
//! run time: no build-time dependency on rdma-core. `ibv_post_send`, `ibv_post_recv` and
//! `ibv_poll_cq` are inline functions in verbs.h that call through `context->ops`; so do we.

use core::ffi::{c_char, c_int, c_uint, c_void};
use libloading::Library;

/// `union ibv_gid`: 16 bytes, 8-aligned (its `global` view is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

impl IbvGid {
    pub fn text(&self) -> String {
        let r = &self.raw;
        (0..8)
            .map(|i| format!("{:02x}{:02x}", r[2 * i], r[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(":")
    }
    pub fn is_zero(&self) -> bool {
        self.raw.iter().all(|&b| b == 0)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`: the `wr` union is 32 bytes (its `atomic` member); we use its `rdma`
/// view. The trailing union (`bind_mw`/`tso`) is 48 bytes, unused.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub wr_rest: [u32; 5],
    pub qp_type_xrc: u32,
    pub tail: [u64; 6],
}

#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`: 144 bytes on x86-64 (8-aligned through `ibv_gid`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// The first fields of `struct ibv_qp` (we read `context` and `qp_num`).
#[repr(C)]
pub struct IbvQpHead {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// The first field of `struct ibv_cq`.
#[repr(C)]
pub struct IbvCqHead {
    pub context: *mut IbvContext,
}

pub type PollCq = unsafe extern "C" fn(*mut IbvCqHead, c_int, *mut IbvWc) -> c_int;
pub type PostSend =
    unsafe extern "C" fn(*mut IbvQpHead, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub type PostRecv =
    unsafe extern "C" fn(*mut IbvQpHead, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// `struct ibv_context_ops`: 32 pointers; `poll_cq` is the 12th, `post_send`/`post_recv` the
/// 26th and 27th.
#[repr(C)]
pub struct IbvContextOps {
    pub before_poll_cq: [usize; 11],
    pub poll_cq: Option<PollCq>,
    pub before_post_send: [usize; 13],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
    pub after: [usize; 5],
}

#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: [u64; 5],
    pub abi_compat: *mut c_void,
}

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_SEND_SIGNALED: c_uint = 2;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_PORT_ACTIVE: u32 = 4;

/// `ibv_wc_status` names (verbs.h order).
pub fn wc_status_name(s: u32) -> &'static str {
    const N: [&str; 23] = [
        "IBV_WC_SUCCESS",
        "IBV_WC_LOC_LEN_ERR",
        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",
        "IBV_WC_LOC_PROT_ERR",
        "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",
        "IBV_WC_BAD_RESP_ERR",
        "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",
        "IBV_WC_REM_ACCESS_ERR",
        "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "IBV_WC_REM_ABORT_ERR",
        "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR",
        "IBV_WC_FATAL_ERR",
        "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
        "IBV_WC_TM_ERR",
    ];
    N.get(s as usize).copied().unwrap_or("IBV_WC_(unknown)")
}

type GetList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeList = unsafe extern "C" fn(*mut *mut c_void);
type DevName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type Open = unsafe extern "C" fn(*mut c_void) -> *mut IbvContext;
type CtxInt = unsafe extern "C" fn(*mut IbvContext) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut IbvContext) -> *mut c_void;
type PtrInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr;
type RegDmabuf = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr;
type DeregMr = unsafe extern "C" fn(*mut IbvMr) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCqHead;
type DestroyCq = unsafe extern "C" fn(*mut IbvCqHead) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut IbvQpInitAttr) -> *mut IbvQpHead;
type DestroyQp = unsafe extern "C" fn(*mut IbvQpHead) -> c_int;
pub type ModifyQp = unsafe extern "C" fn(*mut IbvQpHead, *mut IbvQpAttr, c_int) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int;

/// libibverbs.so.1 and the entry points the self-test calls. Looked up with `dlsym`, so under
/// gdrshim `ibv_reg_mr`/`ibv_reg_dmabuf_mr`/`ibv_dereg_mr` are the shim's, as NCCL gets them.
pub struct Verbs {
    _lib: Library,
    pub get_device_list: GetList,
    pub free_device_list: FreeList,
    pub get_device_name: DevName,
    pub open_device: Open,
    pub close_device: CtxInt,
    pub alloc_pd: AllocPd,
    pub dealloc_pd: PtrInt,
    pub reg_mr: RegMr,
    /// None: rdma-core older than 34.
    pub reg_dmabuf_mr: Option<RegDmabuf>,
    pub dereg_mr: DeregMr,
    pub create_cq: CreateCq,
    pub destroy_cq: DestroyCq,
    pub create_qp: CreateQp,
    pub destroy_qp: DestroyQp,
    pub modify_qp: ModifyQp,
    /// The exported `ibv_query_port` (IBVERBS_1.1): it fills the compat prefix of the struct,
    /// which holds every field we read; the struct is zeroed first, as verbs.h's inline does.
    pub query_port: QueryPort,
    pub query_gid: QueryGid,
}

impl Verbs {
    /// Loads libibverbs.so.1; Err names what is missing.
    pub fn load() -> Result<Verbs, String> {
        // SAFETY: loading the system's libibverbs runs its initialisers, as any verbs program does.
        let lib = unsafe { Library::new("libibverbs.so.1") }
            .map_err(|e| format!("libibverbs.so.1 cannot be loaded: {e}"))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the libibverbs entry point with its verbs.h signature (the type of the
                // field it is stored in); the pointer stays valid while `_lib` is held.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("libibverbs lacks {}: {e}", $name))?
            };
        }
        // SAFETY: as above; ibv_reg_dmabuf_mr is optional (IBVERBS_1.12, rdma-core 34+).
        let reg_dmabuf_mr =
            unsafe { lib.get::<RegDmabuf>(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s);
        Ok(Verbs {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            reg_dmabuf_mr,
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            _lib: lib,
        })
    }
}

/// The Rust side of the layout check: `name size` and `name.field offset` lines, the same
/// lines `tests/c/selftest_layout.c` prints from verbs.h.
#[cfg(test)]
pub fn layout_lines() -> Vec<String> {
    use core::mem::{offset_of, size_of};
    let mut v = Vec::new();
    macro_rules! s {
        ($c:literal, $t:ty) => {
            v.push(format!("{} {}", $c, size_of::<$t>()))
        };
    }
    macro_rules! o {
        ($c:literal, $t:ty, $($f:tt).+) => {
            v.push(format!("{}.{} {}", $c, stringify!($($f).+).replace(' ', ""), offset_of!($t, $($f).+)))
        };
    }
    s!("ibv_gid", IbvGid);
    s!("ibv_port_attr", IbvPortAttr);
    o!("ibv_port_attr", IbvPortAttr, state);
    o!("ibv_port_attr", IbvPortAttr, active_mtu);
    o!("ibv_port_attr", IbvPortAttr, gid_tbl_len);
    o!("ibv_port_attr", IbvPortAttr, lid);
    o!("ibv_port_attr", IbvPortAttr, active_width);
    o!("ibv_port_attr", IbvPortAttr, active_speed);
    o!("ibv_port_attr", IbvPortAttr, link_layer);
    s!("ibv_wc", IbvWc);
    o!("ibv_wc", IbvWc, wr_id);
    o!("ibv_wc", IbvWc, status);
    o!("ibv_wc", IbvWc, opcode);
    o!("ibv_wc", IbvWc, vendor_err);
    o!("ibv_wc", IbvWc, byte_len);
    o!("ibv_wc", IbvWc, qp_num);
    s!("ibv_sge", IbvSge);
    o!("ibv_sge", IbvSge, addr);
    o!("ibv_sge", IbvSge, length);
    o!("ibv_sge", IbvSge, lkey);
    s!("ibv_send_wr", IbvSendWr);
    o!("ibv_send_wr", IbvSendWr, wr_id);
    o!("ibv_send_wr", IbvSendWr, next);
    o!("ibv_send_wr", IbvSendWr, sg_list);
    o!("ibv_send_wr", IbvSendWr, num_sge);
    o!("ibv_send_wr", IbvSendWr, opcode);
    o!("ibv_send_wr", IbvSendWr, send_flags);
    o!("ibv_send_wr", IbvSendWr, remote_addr);
    o!("ibv_send_wr", IbvSendWr, rkey);
    s!("ibv_recv_wr", IbvRecvWr);
    o!("ibv_recv_wr", IbvRecvWr, wr_id);
    o!("ibv_recv_wr", IbvRecvWr, next);
    o!("ibv_recv_wr", IbvRecvWr, sg_list);
    o!("ibv_recv_wr", IbvRecvWr, num_sge);
    s!("ibv_qp_cap", IbvQpCap);
    s!("ibv_qp_init_attr", IbvQpInitAttr);
    o!("ibv_qp_init_attr", IbvQpInitAttr, send_cq);
    o!("ibv_qp_init_attr", IbvQpInitAttr, recv_cq);
    o!("ibv_qp_init_attr", IbvQpInitAttr, cap);
    o!("ibv_qp_init_attr", IbvQpInitAttr, qp_type);
    o!("ibv_qp_init_attr", IbvQpInitAttr, sq_sig_all);
    s!("ibv_global_route", IbvGlobalRoute);
    s!("ibv_ah_attr", IbvAhAttr);
    o!("ibv_ah_attr", IbvAhAttr, grh.dgid);
    o!("ibv_ah_attr", IbvAhAttr, grh.sgid_index);
    o!("ibv_ah_attr", IbvAhAttr, grh.hop_limit);
    o!("ibv_ah_attr", IbvAhAttr, dlid);
    o!("ibv_ah_attr", IbvAhAttr, is_global);
    o!("ibv_ah_attr", IbvAhAttr, port_num);
    s!("ibv_qp_attr", IbvQpAttr);
    o!("ibv_qp_attr", IbvQpAttr, qp_state);
    o!("ibv_qp_attr", IbvQpAttr, path_mtu);
    o!("ibv_qp_attr", IbvQpAttr, rq_psn);
    o!("ibv_qp_attr", IbvQpAttr, sq_psn);
    o!("ibv_qp_attr", IbvQpAttr, dest_qp_num);
    o!("ibv_qp_attr", IbvQpAttr, qp_access_flags);
    o!("ibv_qp_attr", IbvQpAttr, ah_attr);
    o!("ibv_qp_attr", IbvQpAttr, alt_ah_attr);
    o!("ibv_qp_attr", IbvQpAttr, pkey_index);
    o!("ibv_qp_attr", IbvQpAttr, max_rd_atomic);
    o!("ibv_qp_attr", IbvQpAttr, max_dest_rd_atomic);
    o!("ibv_qp_attr", IbvQpAttr, min_rnr_timer);
    o!("ibv_qp_attr", IbvQpAttr, port_num);
    o!("ibv_qp_attr", IbvQpAttr, timeout);
    o!("ibv_qp_attr", IbvQpAttr, retry_cnt);
    o!("ibv_qp_attr", IbvQpAttr, rnr_retry);
    o!("ibv_qp_attr", IbvQpAttr, rate_limit);
    s!("ibv_mr", IbvMr);
    o!("ibv_mr", IbvMr, addr);
    o!("ibv_mr", IbvMr, length);
    o!("ibv_mr", IbvMr, lkey);
    o!("ibv_mr", IbvMr, rkey);
    o!("ibv_qp", IbvQpHead, context);
    o!("ibv_qp", IbvQpHead, qp_num);
    o!("ibv_cq", IbvCqHead, context);
    s!("ibv_context_ops", IbvContextOps);
    o!("ibv_context_ops", IbvContextOps, poll_cq);
    o!("ibv_context_ops", IbvContextOps, post_send);
    o!("ibv_context_ops", IbvContextOps, post_recv);
    s!("ibv_context", IbvContext);
    o!("ibv_context", IbvContext, ops);
    o!("ibv_context", IbvContext, abi_compat);
    v
}

/// `strerror`-style text of an errno.
pub fn errno_text(e: i32) -> String {
    format!("errno {e} ({})", std::io::Error::from_raw_os_error(e))
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
