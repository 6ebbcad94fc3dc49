//! A queue pair and its way to RTS, to itself (the self-test's loopback) or to a peer's (the
//! fleet check's links): the port and GID queried, the CQ and RC QP made and taken to INIT
//! ([`open`]), then RTR to a destination and RTS ([`to_rts`]); and the transfers it runs.

use super::args::Args;
use super::ffi::*;
use super::findings::Findings;
use super::host::{wait_completions, Region};
use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

pub struct Qp {
    qp: *mut IbvQpHead,
    cq: *mut IbvCqHead,
    post_send: PostSend,
    poll_cq: PollCq,
    modify_qp: ModifyQp,
}

const WINDOW: usize = 32;
pub const LIMIT: Duration = Duration::from_secs(20);

/// Link data rate in Gb/s from `active_speed` × `active_width` (verbs.h's encodings), if known.
pub fn link_gbps(speed: u8, width: u8) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let per_lane = match speed {
        1 => 2.0,
        2 => 4.0,
        4 => 8.0,
        8 => 10.0,
        16 => 13.64,
        32 => 25.0,
        64 => 50.0,
        128 => 100.0,
        _ => return None,
    };
    Some(lanes * per_lane)
}

/// What a peer needs to reach a QP: its number, first PSN, LID and GID.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: IbvGid,
}

/// The local port as the QP uses it.
pub struct Port {
    pub link: Option<f64>,
    pub roce: bool,
    pub mtu: u32,
    /// `ibv_query_port`'s answer, for the report.
    pub call: String,
}

/// Queries the port and GID, makes the CQ and QP (stored in `cq`/`qp` for the caller to
/// release) and takes the QP to INIT. Returns it, the port and its own destination.
pub fn open(
    a: &Args,
    v: &Verbs,
    cq: &mut *mut IbvCqHead,
    qp: &mut *mut IbvQpHead,
    ctx: *mut IbvContext,
    pd: *mut c_void,
    r: &mut Findings,
) -> Option<(Qp, Port, Dest)> {
    let (port, lid) = query_port(a, v, ctx, r)?;
    let gid = query_gid(a, v, ctx, port.roce, r)?;
    let (qpn, post_send, poll_cq) = create_cq_qp(v, cq, qp, ctx, pd, r)?;
    let q = Qp { qp: *qp, cq: *cq, post_send, poll_cq, modify_qp: v.modify_qp };
    let mut at = IbvQpAttr {
        qp_state: IBV_QPS_INIT,
        port_num: a.port,
        qp_access_flags: 7,
        ..Default::default()
    };
    let rc =
        q.modify(&mut at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if rc != 0 {
        r.fail(
            4,
            "rdma.connect",
            "QP RESET→INIT failed",
            format!("ibv_modify_qp(INIT, port {}) -> {}", a.port, errno_text(rc)),
            "the port number or the pkey table (IB)",
        );
        return None;
    }
    let me = Dest { qpn, psn: 0x1234, lid, gid };
    Some((q, port, me))
}

/// `--port` queried: the port as the QP uses it and its LID, if it is ACTIVE.
fn query_port(a: &Args, v: &Verbs, ctx: *mut IbvContext, r: &mut Findings) -> Option<(Port, u16)> {
    let mut pa = IbvPortAttr::default();
    // SAFETY: our context; pa is a zeroed ibv_port_attr, larger than the compat prefix filled.
    let rc = unsafe { (v.query_port)(ctx, a.port, &mut pa) };
    if rc != 0 {
        r.fail(
            4,
            "rdma.port",
            format!("cannot query port {}", a.port),
            format!("ibv_query_port({}) -> {}", a.port, errno_text(rc)),
            "--port names no such port (ports count from 1)",
        );
        return None;
    }
    let link = link_gbps(pa.active_speed, pa.active_width);
    let roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    let port_call = format!(
        "ibv_query_port({}) -> state {} link_layer {} lid {} active_mtu {} speed {} width {}",
        a.port,
        pa.state,
        if roce { "Ethernet" } else { "InfiniBand" },
        pa.lid,
        pa.active_mtu,
        pa.active_speed,
        pa.active_width
    );
    if pa.state != IBV_PORT_ACTIVE {
        r.fail(
            4,
            "rdma.port",
            format!("port {} is not ACTIVE (state {})", a.port, pa.state),
            port_call,
            "the link is down: cable, switch port, or (RoCE) the netdev is down (ip link; ibstat)",
        );
        return None;
    }
    Some((Port { link, roce, mtu: pa.active_mtu, call: port_call }, pa.lid))
}

/// `--gid-index` of the port: a GID that is there (on RoCE, not all zeros).
fn query_gid(
    a: &Args,
    v: &Verbs,
    ctx: *mut IbvContext,
    roce: bool,
    r: &mut Findings,
) -> Option<IbvGid> {
    let mut gid = IbvGid::default();
    // SAFETY: our context and a 16-byte GID out-buffer.
    let rc = unsafe { (v.query_gid)(ctx, a.port, a.gid_index, &mut gid) };
    if rc != 0 || (roce && gid.is_zero()) {
        r.fail(
            4,
            "rdma.gid",
            format!("no GID at index {} on port {}", a.gid_index, a.port),
            format!("ibv_query_gid({}, {}) -> {rc}, {}", a.port, a.gid_index, gid.text()),
            "--gid-index names an empty entry: use the RoCE v2 IPv4 GID (show_gids; the doctor names it); the netdev needs an IP address",
        );
        return None;
    }
    Some(gid)
}

/// The CQ and the RC QP (stored in `cq`/`qp`), and the provider's post_send and poll_cq for it:
/// (its QP number, post_send, poll_cq).
fn create_cq_qp(
    v: &Verbs,
    cq: &mut *mut IbvCqHead,
    qp: &mut *mut IbvQpHead,
    ctx: *mut IbvContext,
    pd: *mut c_void,
    r: &mut Findings,
) -> Option<(u32, PostSend, PollCq)> {
    // SAFETY: our context; no completion channel.
    *cq = unsafe { (v.create_cq)(ctx, 256, core::ptr::null_mut(), core::ptr::null_mut(), 0) };
    if cq.is_null() {
        let e = errno();
        r.fail(
            4,
            "rdma.qp",
            "cannot create a CQ",
            format!("ibv_create_cq(256) -> NULL, {}", errno_text(e)),
            "locked-memory limit (ulimit -l) or the HCA driver (dmesg)",
        );
        return None;
    }
    let mut init = IbvQpInitAttr {
        qp_context: core::ptr::null_mut(),
        send_cq: (*cq).cast(),
        recv_cq: (*cq).cast(),
        srq: core::ptr::null_mut(),
        cap: IbvQpCap {
            max_send_wr: 128,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: our pd and a filled ibv_qp_init_attr.
    *qp = unsafe { (v.create_qp)(pd, &mut init) };
    if qp.is_null() {
        let e = errno();
        r.fail(
            4,
            "rdma.qp",
            "cannot create an RC QP",
            format!("ibv_create_qp(RC) -> NULL, {}", errno_text(e)),
            "locked-memory limit (ulimit -l) or the HCA driver (dmesg)",
        );
        return None;
    }
    // SAFETY: a live QP and CQ from libibverbs: their first field is the context, whose ops
    // table holds the provider's post_send and poll_cq (verbs.h's inline functions read them so).
    let (qpn, ops) = unsafe { ((**qp).qp_num, &(*(**qp).context).ops) };
    let (Some(post_send), Some(poll_cq)) = (ops.post_send, ops.poll_cq) else {
        r.fail(
            4,
            "rdma.qp",
            "the provider's ops table lacks post_send/poll_cq",
            "context->ops",
            "a libibverbs whose ABI this tool does not know",
        );
        return None;
    };
    Some((qpn, post_send, poll_cq))
}

/// RTR to `to` (`whom` names it in the report: "itself", a peer's name) and RTS; the
/// destination's text on success. `mtu`: the peer's port MTU (the path takes the smaller).
#[allow(clippy::too_many_arguments)]
pub fn to_rts(
    a: &Args,
    q: &Qp,
    port: &Port,
    me: &Dest,
    to: &Dest,
    mtu: u32,
    whom: &str,
    r: &mut Findings,
) -> Option<String> {
    let dest = to_rtr(a, q, port, to, mtu, whom, r)?;
    let rts_mask = IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC;
    let mut rc = 0;
    for rd in [16u8, 1] {
        let mut at = IbvQpAttr {
            qp_state: IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: me.psn,
            max_rd_atomic: rd,
            ..Default::default()
        };
        rc = q.modify(&mut at, rts_mask);
        if rc == 0 {
            break;
        }
    }
    if rc != 0 {
        r.fail(
            4,
            "rdma.connect",
            "QP RTR→RTS failed",
            format!("ibv_modify_qp(RTS) -> {}", errno_text(rc)),
            "the HCA driver refused the QP's send parameters (dmesg)",
        );
        return None;
    }
    Some(dest)
}

/// INIT to RTR, addressed to `to`; the destination's text.
fn to_rtr(
    a: &Args,
    q: &Qp,
    port: &Port,
    to: &Dest,
    mtu: u32,
    whom: &str,
    r: &mut Findings,
) -> Option<String> {
    let mut ah = IbvAhAttr { dlid: to.lid, port_num: a.port, ..Default::default() };
    if port.roce || !to.gid.is_zero() && to.lid == 0 {
        ah.is_global = 1;
        ah.grh = IbvGlobalRoute {
            dgid: to.gid,
            sgid_index: a.gid_index as u8,
            hop_limit: 64,
            ..Default::default()
        };
    }
    let rtr_mask = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    let mut rc = 0;
    for rd in [16u8, 1] {
        let mut at = IbvQpAttr {
            qp_state: IBV_QPS_RTR,
            path_mtu: port.mtu.min(mtu),
            dest_qp_num: to.qpn,
            rq_psn: to.psn,
            max_dest_rd_atomic: rd,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        rc = q.modify(&mut at, rtr_mask);
        if rc == 0 {
            break;
        }
    }
    let dest = if ah.is_global == 1 {
        format!("GID {} (index {})", to.gid.text(), a.gid_index)
    } else {
        format!("LID {}", to.lid)
    };
    if rc != 0 {
        r.fail(
            4,
            "rdma.connect",
            format!("QP INIT→RTR to {whom} ({dest}) failed"),
            format!("ibv_modify_qp(RTR, dest QPN {}, {dest}) -> {}", to.qpn, errno_text(rc)),
            format!(
                "the address does not resolve{}: a wrong --gid-index (RoCE v1 vs v2, an IPv6 link-local GID), no IP on the \
                 netdev, or (IB) no LID: the subnet manager is not running",
                if whom == "itself" { " to this port" } else { "" }
            ),
        );
        return None;
    }
    Some(dest)
}

impl Qp {
    /// ibv_modify_qp on this QP: `mask` names the fields of `at` that are set.
    fn modify(&self, at: &mut IbvQpAttr, mask: c_int) -> c_int {
        // SAFETY: our QP and a filled ibv_qp_attr; the mask names the fields set.
        unsafe { (self.modify_qp)(self.qp, at, mask) }
    }

    /// After a failed transfer: the QP to ERR, which flushes every work request still queued, and
    /// its completions drained, so that nothing the NIC still had in flight lands in a buffer a
    /// later step fills and compares.
    pub fn quiesce(&self) {
        let mut at = IbvQpAttr { qp_state: IBV_QPS_ERR, ..Default::default() };
        // SAFETY: our QP and an ibv_qp_attr with the state set, as the mask says.
        unsafe { (self.modify_qp)(self.qp, &mut at, IBV_QP_STATE) };
        let mut wc = [IbvWc::default(); 16];
        let t0 = Instant::now();
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(200) && t0.elapsed() < Duration::from_secs(5)
        {
            // SAFETY: our CQ and a buffer of 16 work completions, as we say.
            if unsafe { (self.poll_cq)(self.cq, 16, wc.as_mut_ptr()) } > 0 {
                quiet = Instant::now();
            }
        }
    }

    /// `count` work requests of `op`, each `len` bytes from `local` to (WRITE) or from (READ)
    /// `remote`, each starting at offset `i*len % span`, at most WINDOW in flight; all signaled.
    pub fn run(
        &self,
        op: u32,
        local: Region,
        remote: Region,
        len: usize,
        count: usize,
        span: usize,
    ) -> Result<(), (String, String)> {
        let mut posted = 0;
        let mut done = 0;
        while done < count {
            while posted < count && posted - done < WINDOW {
                let off = (posted * len % span) as u64;
                let mut sge =
                    IbvSge { addr: local.addr + off, length: len as u32, lkey: local.lkey };
                let mut wr = IbvSendWr {
                    wr_id: posted as u64,
                    next: core::ptr::null_mut(),
                    sg_list: &mut sge,
                    num_sge: 1,
                    opcode: op,
                    send_flags: IBV_SEND_SIGNALED,
                    imm_data: 0,
                    remote_addr: remote.addr + off,
                    rkey: remote.rkey,
                    wr_rest: [0; 5],
                    qp_type_xrc: 0,
                    tail: [0; 6],
                };
                let mut bad = core::ptr::null_mut();
                // SAFETY: the provider's post_send on our QP; wr and sge live across the call
                // (the provider copies them into its send queue before returning).
                let rc = unsafe { (self.post_send)(self.qp, &mut wr, &mut bad) };
                if rc != 0 {
                    return Err((
                        format!("ibv_post_send(wr {posted}) -> {}", errno_text(rc)),
                        "the send queue is full or the QP left RTS (an earlier error)".into(),
                    ));
                }
                posted += 1;
            }
            let n = (posted - done).min(WINDOW);
            wait_completions(self.poll_cq, self.cq, n, LIMIT)?;
            done += n;
        }
        Ok(())
    }
}
