//! Step 4's queue pair: one RC QP connected to itself through the port (RoCE: its own GID; IB:
//! its own LID), the four transfers with every byte compared, and step 5's bandwidth.

use super::args::Args;
use super::conn::{self, Qp};
use super::cuda::Cuda;
use super::ffi::*;
use super::findings::{Bw, Findings};
use super::host::{compare, fill, HostBuf, Region, Regions};
use crate::report::Status;
use core::ffi::c_void;
use std::time::Instant;

/// Makes the CQ and QP (stored in `cq`/`qp` for the caller to release) and takes the QP through
/// INIT, RTR (to itself) and RTS.
pub fn connect(
    a: &Args,
    v: &Verbs,
    cq: &mut *mut IbvCqHead,
    qp: &mut *mut IbvQpHead,
    ctx: *mut IbvContext,
    pd: *mut c_void,
    r: &mut Findings,
) -> Option<(Qp, Option<f64>)> {
    let (q, port, me) = conn::open(a, v, cq, qp, ctx, pd, r)?;
    let dest = conn::to_rts(a, &q, &port, &me, &me, port.mtu, "itself", r)?;
    r.pass(
        4,
        "rdma.connect",
        format!("RC QP {} connected to itself through port {} ({dest})", me.qpn, a.port),
        port.call,
    );
    Some((q, port.link))
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
pub fn data_steps(
    a: &Args,
    cu: &Cuda,
    q: &Qp,
    g: &Regions,
    hsrc: &mut HostBuf,
    hdst: &mut HostBuf,
    seed: u64,
    r: &mut Findings,
) -> bool {
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
        let filled =
            put(cu, g, src, &want, hsrc, hdst).and_then(|()| put(cu, g, dst, &got, hsrc, hdst));
        if let Err((call, st)) = filled {
            r.fail(
                4,
                &id,
                "cannot fill the buffers",
                format!("{call} -> {st}"),
                "the GPU copy engine failed (dmesg for an Xid)",
            );
            return false;
        }
        let t0 = Instant::now();
        if let Err((call, cause)) =
            q.run(op, region(g, local), region(g, remote), chunk, a.size / chunk, a.size)
        {
            r.fail(
                4,
                &id,
                format!("RDMA {} failed", if op == IBV_WR_RDMA_READ { "READ" } else { "WRITE" }),
                call,
                cause,
            );
            q.quiesce();
            ok = false;
            continue;
        }
        let dt = t0.elapsed();
        if let Err((call, st)) = read_back(cu, g, dst, &mut got, hsrc, hdst) {
            r.fail(
                4,
                &id,
                "cannot read the destination back",
                format!("{call} -> {st}"),
                "the GPU copy engine failed (dmesg for an Xid)",
            );
            return false;
        }
        let done = Done { k, chunk, dt, seed };
        ok &= judge_bytes(a, &id, &done, &got, &want, r);
    }
    explain_read_failure(r, &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    ok
}

/// Writes `data` into buffer `l`.
fn put(
    cu: &Cuda,
    g: &Regions,
    l: Loc,
    data: &[u8],
    hs: &mut HostBuf,
    hd: &mut HostBuf,
) -> Result<(), (String, String)> {
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
}

/// Reads buffer `l` into `got`.
fn read_back(
    cu: &Cuda,
    g: &Regions,
    l: Loc,
    got: &mut [u8],
    hs: &HostBuf,
    hd: &HostBuf,
) -> Result<(), (String, String)> {
    match l {
        Loc::GpuDst | Loc::GpuSrc => cu.dtoh(got, region(g, l).addr),
        Loc::HostDst => {
            got.copy_from_slice(hd.bytes());
            Ok(())
        }
        Loc::HostSrc => {
            got.copy_from_slice(hs.bytes());
            Ok(())
        }
    }
}

/// A transfer that completed: its number, work-request size, time and the run's seed.
struct Done {
    k: usize,
    chunk: usize,
    dt: std::time::Duration,
    seed: u64,
}

/// The bytes that arrived against those sent: the transfer's PASS, or its FAIL with the first
/// byte that differs; whether it passed.
fn judge_bytes(a: &Args, id: &str, done: &Done, got: &[u8], want: &[u8], r: &mut Findings) -> bool {
    let Done { k, chunk, dt, seed } = *done;
    match compare(got, want) {
        None => {
            r.pass(
                4,
                id,
                format!(
                    "{} bytes, every byte as sent ({} WRs, completions IBV_WC_SUCCESS, {:.1} ms)",
                    a.size,
                    a.size / chunk,
                    dt.as_secs_f64() * 1e3
                ),
                format!("seed {seed:#018x} pattern {}", 2 * k + 1),
            );
            true
        }
        Some((at, n)) => {
            r.fail(
                4,
                id,
                format!("{n} of {} bytes differ; the first at offset {at:#x} (4 KiB page {}): {:#04x} where {:#04x} was sent", a.size, at / 4096, got[at], want[at]),
                format!("compare after cuMemcpyDtoH/host read, seed {seed:#018x}"),
                "the NIC's DMA reached other memory than the registered pages (a wrong MR: report it with the shim log), or the write was not flushed before the read-back (sm_89 needs NCCL's flush); the pattern changes per run, so run it again to see whether it moves",
            );
            false
        }
    }
}

/// A READ that fails while every WRITE passed, on a platform where a NIC's reads of GPU memory
/// through the CPU are known to fail: that is named as the cause, first.
fn explain_read_failure(r: &mut Findings, cpuinfo: &str) {
    let writes_pass = r
        .items()
        .iter()
        .filter(|i| i.id.starts_with("rdma.write."))
        .all(|i| i.status == Status::Pass);
    let cpu = crate::machine::parse_cpu(cpuinfo);
    let Some(cause) = crate::topology::read_failure_cause(&cpu.vendor, &cpu.model_name) else {
        return;
    };
    if let Some(read) = r.item_mut("rdma.read.gpu-host").filter(|i| i.status == Status::Fail) {
        if writes_pass {
            read.fix =
                if read.fix.is_empty() { cause } else { format!("{cause}; else: {}", read.fix) };
        }
    }
}

/// Step 5: Gb/s per direction for 64 KiB … --size, against the link rate.
pub fn bandwidth(a: &Args, q: &Qp, g: &Regions, link: Option<f64>, r: &mut Findings) {
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
            if let Err((call, cause)) =
                q.run(op, region(g, local), region(g, remote), s, count, a.size)
            {
                r.fail(
                    5,
                    &format!("bw.{name}"),
                    format!("a transfer of {s} bytes failed"),
                    call,
                    cause,
                );
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

    fn report(read: Status, write: Status) -> Findings {
        let mut r = Findings::default();
        for id in ["rdma.write.gpu-gpu", "rdma.write.host-gpu", "rdma.write.gpu-host"] {
            r.add(4, id, write, "", "", "");
        }
        r.add(
            4,
            "rdma.read.gpu-host",
            read,
            "RDMA READ failed",
            "ibv_poll_cq: status REM_ACCESS_ERR",
            "remote access error",
        );
        r
    }
    const ARROW_LAKE: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 198\nmodel name\t: Intel(R) Core(TM) Ultra 9 285K\n";
    const EPYC: &str = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n";

    #[test]
    fn a_read_that_fails_while_writes_pass_names_the_intel_client_platform() {
        let mut r = report(Status::Fail, Status::Pass);
        explain_read_failure(&mut r, ARROW_LAKE);
        let read = &r.items()[3];
        assert!(
            read.fix.starts_with(
                "this is an Intel client CPU (Intel(R) Core(TM) Ultra 9 285K): a NIC's PCIe reads"
            ),
            "{}",
            read.fix
        );
        assert!(
            read.fix.contains("NVIDIA/open-gpu-kernel-modules#1253")
                && read.fix.ends_with("; else: remote access error"),
            "{}",
            read.fix
        );
        // not when a write failed too, nor on another CPU, nor when the read passed
        for (rd, wr, cpu) in [
            (Status::Fail, Status::Fail, ARROW_LAKE),
            (Status::Fail, Status::Pass, EPYC),
            (Status::Pass, Status::Pass, ARROW_LAKE),
        ] {
            let mut r = report(rd, wr);
            explain_read_failure(&mut r, cpu);
            assert!(!r.items()[3].fix.contains("#1253"), "{rd:?} {wr:?} {cpu}");
        }
    }
}
