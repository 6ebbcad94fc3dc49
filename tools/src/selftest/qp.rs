//! Step 4's queue pair: one RC QP connected to itself through the port (RoCE: its own GID; IB:
//! its own LID), the four transfers with every byte compared, and step 5's bandwidth.

use super::args::Args;
use super::cuda::Cuda;
use super::ffi::*;
use super::host::{compare, fill, wait_completions, HostBuf, Region, Regions};
use super::report::{Bw, Report};
use crate::report::Status;
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
const LIMIT: Duration = Duration::from_secs(20);

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

/// Queries the port and GID, makes the CQ and QP (stored in `cq`/`qp` for the caller to
/// release), and takes the QP through INIT, RTR (to itself) and RTS.
pub fn connect(
    a: &Args,
    v: &Verbs,
    cq: &mut *mut IbvCqHead,
    qp: &mut *mut IbvQpHead,
    ctx: *mut IbvContext,
    pd: *mut c_void,
    r: &mut Report,
) -> Option<(Qp, Option<f64>)> {
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
        cap: IbvQpCap { max_send_wr: 128, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
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
    let psn = 0x1234;
    let mut at = IbvQpAttr { qp_state: IBV_QPS_INIT, port_num: a.port, qp_access_flags: 7, ..Default::default() };
    let modify = |at: &mut IbvQpAttr, mask: c_int| -> c_int {
        // SAFETY: our QP and a filled ibv_qp_attr; the mask names the fields set.
        unsafe { (v.modify_qp)(*qp, at, mask) }
    };
    let rc = modify(&mut at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
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
    let mut ah = IbvAhAttr { dlid: pa.lid, port_num: a.port, ..Default::default() };
    if roce || !gid.is_zero() && pa.lid == 0 {
        ah.is_global = 1;
        ah.grh = IbvGlobalRoute { dgid: gid, sgid_index: a.gid_index as u8, hop_limit: 64, ..Default::default() };
    }
    let rtr_mask =
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    let mut rc = 0;
    for rd in [16u8, 1] {
        at = IbvQpAttr {
            qp_state: IBV_QPS_RTR,
            path_mtu: pa.active_mtu,
            dest_qp_num: qpn,
            rq_psn: psn,
            max_dest_rd_atomic: rd,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        rc = modify(&mut at, rtr_mask);
        if rc == 0 {
            break;
        }
    }
    let dest = if ah.is_global == 1 { format!("GID {} (index {})", gid.text(), a.gid_index) } else { format!("LID {}", pa.lid) };
    if rc != 0 {
        r.fail(4, "rdma.connect", format!("QP INIT→RTR to itself ({dest}) failed"), format!("ibv_modify_qp(RTR, dest QPN {qpn}, {dest}) -> {}", errno_text(rc)), "the address does not resolve to this port: a wrong --gid-index (RoCE v1 vs v2, an IPv6 link-local GID), no IP on the netdev, or (IB) no LID: the subnet manager is not running");
        return None;
    }
    let mut rc = 0;
    for rd in [16u8, 1] {
        at = IbvQpAttr {
            qp_state: IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: psn,
            max_rd_atomic: rd,
            ..Default::default()
        };
        rc = modify(&mut at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
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
    r.pass(4, "rdma.connect", format!("RC QP {qpn} connected to itself through port {} ({dest})", a.port), port_call);
    Some((Qp { qp: *qp, cq: *cq, post_send, poll_cq, modify_qp: v.modify_qp }, link))
}

impl Qp {
    /// After a failed transfer: the QP to ERR, which flushes every work request still queued, and
    /// its completions drained, so that nothing the NIC still had in flight lands in a buffer a
    /// later step fills and compares.
    fn quiesce(&self) {
        let mut at = IbvQpAttr { qp_state: IBV_QPS_ERR, ..Default::default() };
        // SAFETY: our QP and an ibv_qp_attr with the state set, as the mask says.
        unsafe { (self.modify_qp)(self.qp, &mut at, IBV_QP_STATE) };
        let mut wc = [IbvWc::default(); 16];
        let t0 = Instant::now();
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(200) && t0.elapsed() < Duration::from_secs(5) {
            // SAFETY: our CQ and a buffer of 16 work completions, as we say.
            if unsafe { (self.poll_cq)(self.cq, 16, wc.as_mut_ptr()) } > 0 {
                quiet = Instant::now();
            }
        }
    }

    /// `count` work requests of `op`, each `len` bytes from `local` to (WRITE) or from (READ)
    /// `remote`, each starting at offset `i*len % span`, at most WINDOW in flight; all signaled.
    fn run(&self, op: u32, local: Region, remote: Region, len: usize, count: usize, span: usize) -> Result<(), (String, String)> {
        let mut posted = 0;
        let mut done = 0;
        while done < count {
            while posted < count && posted - done < WINDOW {
                let off = (posted * len % span) as u64;
                let mut sge = IbvSge { addr: local.addr + off, length: len as u32, lkey: local.lkey };
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

/// Which buffer a transfer reads or writes.
#[derive(Clone, Copy, PartialEq)]
enum Loc {
    GpuSrc,
    GpuDst,
    HostSrc,
    HostDst,
}

const TRANSFERS: [(&str, u32, Loc, Loc); 4] = [
    ("write.gpu-gpu", IBV_WR_RDMA_WRITE, Loc::GpuSrc, Loc::GpuDst),
    ("write.host-gpu", IBV_WR_RDMA_WRITE, Loc::HostSrc, Loc::GpuDst),
    ("write.gpu-host", IBV_WR_RDMA_WRITE, Loc::GpuSrc, Loc::HostDst),
    ("read.gpu-host", IBV_WR_RDMA_READ, Loc::HostDst, Loc::GpuSrc),
];

/// The transfers' names (their checks are `rdma.NAME` and `bw.NAME`).
#[cfg(test)]
pub(super) fn transfer_names() -> [&'static str; 4] {
    TRANSFERS.map(|t| t.0)
}

fn region(g: &Regions, l: Loc) -> Region {
    match l {
        Loc::GpuSrc => g.gsrc,
        Loc::GpuDst => g.gdst,
        Loc::HostSrc => g.hsrc,
        Loc::HostDst => g.hdst,
    }
}

/// The four transfers, each checked byte by byte; false if any failed.
#[allow(clippy::too_many_arguments)]
pub fn data_steps(a: &Args, cu: &Cuda, q: &Qp, g: &Regions, hsrc: &mut HostBuf, hdst: &mut HostBuf, seed: u64, r: &mut Report) -> bool {
    let mut want = vec![0u8; a.size];
    let mut got = vec![0u8; a.size];
    let chunk = a.size.min(4 << 20);
    let mut ok = true;
    for (k, (name, op, local, remote)) in TRANSFERS.into_iter().enumerate() {
        let id = format!("rdma.{name}");
        // the data goes from `src` to `dst`: for a READ the remote is the source
        let (src, dst) = if op == IBV_WR_RDMA_READ { (remote, local) } else { (local, remote) };
        fill(&mut want, seed, 2 * k as u64 + 1);
        fill(&mut got, seed, 2 * k as u64 + 2); // poison: a transfer that moves nothing is seen
        let put = |l: Loc, data: &[u8], hs: &mut HostBuf, hd: &mut HostBuf| -> Result<(), (String, String)> {
            match l {
                Loc::GpuSrc => cu.htod(region(g, l).addr, data),
                Loc::GpuDst => cu.htod(region(g, l).addr, data),
                Loc::HostSrc => {
                    hs.bytes_mut().copy_from_slice(data);
                    Ok(())
                }
                Loc::HostDst => {
                    hd.bytes_mut().copy_from_slice(data);
                    Ok(())
                }
            }
        };
        if let Err((call, st)) = put(src, &want, hsrc, hdst).and_then(|()| put(dst, &got, hsrc, hdst)) {
            r.fail(4, &id, "cannot fill the buffers", format!("{call} -> {st}"), "the GPU copy engine failed (dmesg for an Xid)");
            return false;
        }
        let t0 = Instant::now();
        if let Err((call, cause)) = q.run(op, region(g, local), region(g, remote), chunk, a.size / chunk, a.size) {
            r.fail(4, &id, format!("RDMA {} failed", if op == IBV_WR_RDMA_READ { "READ" } else { "WRITE" }), call, cause);
            q.quiesce();
            ok = false;
            continue;
        }
        let dt = t0.elapsed();
        let read = match dst {
            Loc::GpuDst | Loc::GpuSrc => cu.dtoh(&mut got, region(g, dst).addr),
            Loc::HostDst => {
                got.copy_from_slice(hdst.bytes());
                Ok(())
            }
            Loc::HostSrc => {
                got.copy_from_slice(hsrc.bytes());
                Ok(())
            }
        };
        if let Err((call, st)) = read {
            r.fail(4, &id, "cannot read the destination back", format!("{call} -> {st}"), "the GPU copy engine failed (dmesg for an Xid)");
            return false;
        }
        match compare(&got, &want) {
            None => r.pass(
                4,
                &id,
                format!(
                    "{} bytes, every byte as sent ({} WRs, completions IBV_WC_SUCCESS, {:.1} ms)",
                    a.size,
                    a.size / chunk,
                    dt.as_secs_f64() * 1e3
                ),
                format!("seed {seed:#018x} pattern {}", 2 * k + 1),
            ),
            Some((at, n)) => {
                r.fail(
                    4,
                    &id,
                    format!("{n} of {} bytes differ; the first at offset {at:#x} (4 KiB page {}): {:#04x} where {:#04x} was sent", a.size, at / 4096, got[at], want[at]),
                    format!("compare after cuMemcpyDtoH/host read, seed {seed:#018x}"),
                    "the NIC's DMA reached other memory than the registered pages (a wrong MR: report it with the shim log), or the write was not flushed before the read-back (sm_89 needs NCCL's flush); the pattern changes per run, so run it again to see whether it moves",
                );
                ok = false;
            }
        }
    }
    explain_read_failure(r, &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    ok
}

/// A READ that fails while every WRITE passed, on a platform where a NIC's reads of GPU memory
/// through the CPU are known to fail: that is named as the cause, first.
fn explain_read_failure(r: &mut Report, cpuinfo: &str) {
    let writes_pass = r.items().iter().filter(|i| i.id.starts_with("rdma.write.")).all(|i| i.status == Status::Pass);
    let cpu = crate::machine::parse_cpu(cpuinfo);
    let Some(cause) = crate::topology::read_failure_cause(&cpu.vendor, &cpu.model_name) else { return };
    if let Some(read) = r.item_mut("rdma.read.gpu-host").filter(|i| i.status == Status::Fail) {
        if writes_pass {
            read.fix = if read.fix.is_empty() { cause } else { format!("{cause}; else: {}", read.fix) };
        }
    }
}

/// Step 5: Gb/s per direction for 64 KiB … --size, against the link rate.
pub fn bandwidth(a: &Args, q: &Qp, g: &Regions, link: Option<f64>, r: &mut Report) {
    r.link_gbps = link;
    let mut sizes = Vec::new();
    let mut s = 64 << 10;
    while s < a.size {
        sizes.push(s);
        s *= 2;
    }
    sizes.push(a.size);
    for (name, op, local, remote) in TRANSFERS {
        let mut best: f64 = 0.0;
        for &s in &sizes {
            let count = ((64usize << 20) / s).clamp(16, 4096);
            let t0 = Instant::now();
            if let Err((call, cause)) = q.run(op, region(g, local), region(g, remote), s, count, a.size) {
                r.fail(5, &format!("bw.{name}"), format!("a transfer of {s} bytes failed"), call, cause);
                return;
            }
            let gbps = (count * s) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
            best = best.max(gbps);
            r.bandwidth.push(Bw { direction: name, size: s, gbps });
        }
        let id = format!("bw.{name}");
        let floor = if op == IBV_WR_RDMA_READ { 0.25 } else { 0.5 };
        match link {
            None => r.not_checked(5, &id, format!("peak {best:.2} Gb/s; the link rate is unknown (an active_speed/width this tool does not know)"), ""),
            Some(l) if best >= floor * l => r.pass(5, &id, format!("peak {best:.2} Gb/s = {:.0}% of the {l:.2} Gb/s link", 100.0 * best / l), format!("{} sizes, 64 KiB … {} bytes", sizes.len(), a.size)),
            Some(l) => r.fail(
                5,
                &id,
                format!("peak {best:.2} Gb/s is below {:.0}% of the {l:.2} Gb/s link", floor * 100.0),
                format!("{} sizes, 64 KiB … {} bytes", sizes.len(), a.size),
                "GPU and NIC are not under one PCIe switch or root port (traffic crosses the CPU), ACS/IOMMU redirect peer traffic, a PCIe link trained below its width or speed (lspci -vv LnkSta), or the NIC's MTU/RoCE settings",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(read: Status, write: Status) -> Report {
        let mut r = Report::default();
        for id in ["rdma.write.gpu-gpu", "rdma.write.host-gpu", "rdma.write.gpu-host"] {
            r.add(4, id, write, "", "", "");
        }
        r.add(4, "rdma.read.gpu-host", read, "RDMA READ failed", "ibv_poll_cq: status REM_ACCESS_ERR", "remote access error");
        r
    }
    const ARROW_LAKE: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 198\nmodel name\t: Intel(R) Core(TM) Ultra 9 285K\n";
    const EPYC: &str = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n";

    #[test]
    fn a_read_that_fails_while_writes_pass_names_the_intel_client_platform() {
        let mut r = report(Status::Fail, Status::Pass);
        explain_read_failure(&mut r, ARROW_LAKE);
        let read = &r.items()[3];
        assert!(read.fix.starts_with("this is an Intel client CPU (Intel(R) Core(TM) Ultra 9 285K): a NIC's PCIe reads"), "{}", read.fix);
        assert!(
            read.fix.contains("NVIDIA/open-gpu-kernel-modules#1253") && read.fix.ends_with("; else: remote access error"),
            "{}",
            read.fix
        );
        // not when a write failed too, nor on another CPU, nor when the read passed
        for (rd, wr, cpu) in
            [(Status::Fail, Status::Fail, ARROW_LAKE), (Status::Fail, Status::Pass, EPYC), (Status::Pass, Status::Pass, ARROW_LAKE)]
        {
            let mut r = report(rd, wr);
            explain_read_failure(&mut r, cpu);
            assert!(!r.items()[3].fix.contains("#1253"), "{rd:?} {wr:?} {cpu}");
        }
    }
}
