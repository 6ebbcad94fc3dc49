//! One rail of this task on the wire: two GPU buffers registered through gdrshim (`src` holds
//! this node's pattern, `dst` receives a peer's), one RC QP per round to that round's peer, and
//! the round's halves: RDMA WRITE of `src` into the peer's `dst` (then a small READ of it, which
//! makes the peer's NIC finish its writes to the GPU: the flush NCCL makes too), RDMA READ of
//! the peer's `src` into `dst`, and the check of what landed in `dst`, every byte, against the
//! pattern regenerated here. The self-test's QP, registration and pattern code does the work.

use super::model::{Fact, Kind};
use crate::selftest::args::Args;
use crate::selftest::conn::{self, Dest, Port, Qp};
use crate::selftest::cuda::Cuda;
use crate::selftest::ffi::{errno_text, IbvGid, Verbs, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE};
use crate::selftest::findings::Findings;
use crate::selftest::host::{fill_at, HostBuf, Region};
use crate::selftest::rdma::{self, Hca};
use crate::selftest::shim::AllCounters;
use std::time::Instant;

/// What a peer needs to reach this rail: its QP, port MTU and the two buffers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub dest: Dest,
    pub mtu: u32,
    pub src: (u64, u32),
    pub dst: (u64, u32),
}

impl Endpoint {
    pub fn to_line(self) -> String {
        let d = &self.dest;
        let gid: String = d.gid.raw.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "ep {} {} {} {gid} {} {:x} {:x} {:x} {:x}",
            d.qpn, d.psn, d.lid, self.mtu, self.src.0, self.src.1, self.dst.0, self.dst.1
        )
    }
    pub fn from_line(l: &str) -> Option<Endpoint> {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() != 10 || f[0] != "ep" || f[4].len() != 32 {
            return None;
        }
        let mut gid = IbvGid::default();
        for (k, b) in gid.raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&f[4][2 * k..2 * k + 2], 16).ok()?;
        }
        let h = |s: &str| u64::from_str_radix(s, 16).ok();
        Some(Endpoint {
            dest: Dest {
                qpn: f[1].parse().ok()?,
                psn: f[2].parse().ok()?,
                lid: f[3].parse().ok()?,
                gid,
            },
            mtu: f[5].parse().ok()?,
            src: (h(f[6])?, h(f[7])? as u32),
            dst: (h(f[8])?, h(f[9])? as u32),
        })
    }
}

/// Why a rail cannot take part: a blocking fact about this node, from the self-test's last check
/// that did not pass (its rail is the caller's to set).
fn unfit(kind: Kind, r: &Findings) -> Fact {
    let bad = r.items().iter().rev().find(|i| i.status != crate::report::Status::Pass);
    Fact::new(
        kind,
        None,
        true,
        bad.map_or("the rail could not be set up".into(), |i| format!("{}: {}", i.id, i.summary)),
        bad.map(|i| i.evidence.clone()).unwrap_or_default(),
        bad.map_or(String::new(), |i| i.fix.clone()),
    )
}

/// Each transfer is timed this many times (the bandwidth is the best of them).
const REPS: usize = 3;

/// One transfer's result: Ok(Gb/s, latency µs) or what failed.
pub type Half = Result<(f64, Option<f64>), String>;

pub struct Rig<'v> {
    a: Args,
    cu: &'v Cuda,
    h: Hca<'v>,
    gpu: [u64; 2],
    src: Region,
    dst: Region,
    scratch: Region,
    _scratch: HostBuf,
    size: usize,
    q: Option<(Qp, Port, Dest)>,
    /// The GPU memory's MRs as gdrshim made them: (counters before, after).
    pub registered: (Option<AllCounters>, Option<AllCounters>),
}

impl Drop for Rig<'_> {
    fn drop(&mut self) {
        self.h.drop_qp();
        for m in self.h.mrs.drain(..) {
            // SAFETY: MRs this rig registered, released once, before the GPU memory they cover.
            unsafe { (self.h.v.dereg_mr)(m) };
        }
        for p in self.gpu {
            if p != 0 {
                self.cu.free(p);
            }
        }
    }
}

impl<'v> Rig<'v> {
    /// The buffers on the GPU and their registration on the NIC, as a job makes them; else why
    /// this rail cannot take part.
    pub fn new(a: &Args, cu: &'v Cuda, v: &'v Verbs, size: usize) -> Result<Rig<'v>, Box<Fact>> {
        let mut r = Findings::default();
        let Some(h) = rdma::open_hca(a, v, &mut r) else {
            return Err(unfit(Kind::NicPort, &r).into());
        };
        let scratch = HostBuf::new(4096).ok_or_else(|| {
            Fact::new(
                Kind::Node,
                None,
                true,
                "no host memory for 4 KiB".into(),
                vec![],
                String::new(),
            )
        })?;
        let mut rig = Rig {
            a: a.clone(),
            cu,
            h,
            gpu: [0; 2],
            src: Region { addr: 0, lkey: 0, rkey: 0 },
            dst: Region { addr: 0, lkey: 0, rkey: 0 },
            scratch: Region { addr: 0, lkey: 0, rkey: 0 },
            _scratch: scratch,
            size,
            q: None,
            registered: (None, None),
        };
        for k in 0..2 {
            rig.gpu[k] = cu.alloc(size).map_err(|(call, st)| {
                Fact::new(
                    Kind::Node,
                    None,
                    true,
                    format!("no GPU memory for 2 x {size} bytes"),
                    vec![format!("{call} -> {st}")],
                    "the GPU is out of memory (other processes) or --size is too large".into(),
                )
            })?;
        }
        rig.registered.0 = crate::selftest::shim::all_counters();
        for k in 0..2 {
            let before = rig.registered.0;
            let m = rdma::reg(&mut rig.h, rig.gpu[k], size)
                .map_err(|e| reg_unfit(rig.gpu[k], size, e, before))?;
            let reg = rdma::mr_region(m, rig.gpu[k]);
            if k == 0 {
                rig.src = reg;
            } else {
                rig.dst = reg;
            }
        }
        rig.registered.1 = crate::selftest::shim::all_counters();
        let s = rig._scratch.addr();
        let m = rdma::reg(&mut rig.h, s, 4096).map_err(|e| {
            Fact::new(
                Kind::Memlock,
                None,
                true,
                "ibv_reg_mr of 4 KiB of host memory failed".into(),
                vec![format!("ibv_reg_mr({s:#x}, 4096) -> NULL, {}", errno_text(e))],
                rdma::reg_cause(e, false).into(),
            )
        })?;
        rig.scratch = rdma::mr_region(m, s);
        Ok(rig)
    }

    /// The HCA's name (libibverbs').
    pub fn nic(&self) -> String {
        // SAFETY: our open context; its first field is the device, whose name libibverbs gives
        // as a NUL-terminated string that lives as long as the device list's devices do.
        unsafe {
            let dev = (*self.h.ctx).device;
            std::ffi::CStr::from_ptr((self.h.v.get_device_name)(dev.cast()))
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Fills `src` with this node's pattern.
    pub fn fill_src(&self, seed: u64, tag: u64) -> Result<(), String> {
        self.put(self.gpu[0], seed, tag)
    }

    /// Fills `dst` with bytes no peer sends: a transfer that moves nothing is seen.
    pub fn poison_dst(&self, seed: u64) -> Result<(), String> {
        self.put(self.gpu[1], seed, 0xfff0)
    }

    fn put(&self, gpu: u64, seed: u64, tag: u64) -> Result<(), String> {
        let chunk = self.size.min(16 << 20);
        let mut buf = vec![0u8; chunk];
        for off in (0..self.size).step_by(chunk) {
            let b = &mut buf[..chunk.min(self.size - off)];
            fill_at(b, seed, tag, off);
            self.cu.htod(gpu + off as u64, b).map_err(|(call, st)| format!("{call} -> {st}"))?;
        }
        Ok(())
    }

    /// A QP for this round's peer, to INIT; what the peer needs to reach it.
    pub fn open(&mut self) -> Result<Endpoint, String> {
        self.close();
        let mut r = Findings::default();
        let (cq, qp) = (&mut self.h.cq, &mut self.h.qp);
        let Some((q, port, me)) =
            conn::open(&self.a, self.h.v, cq, qp, self.h.ctx, self.h.pd, &mut r)
        else {
            return Err(unfit(Kind::NicPort, &r).check.summary);
        };
        let ep = Endpoint {
            dest: me,
            mtu: port.mtu,
            src: (self.src.addr, self.src.rkey),
            dst: (self.dst.addr, self.dst.rkey),
        };
        self.q = Some((q, port, me));
        Ok(ep)
    }

    /// The port's active rate, once a QP is open.
    pub fn port_gbps(&self) -> Option<f64> {
        self.q.as_ref().and_then(|(_, p, _)| p.link)
    }

    /// RTR to the peer's QP, then RTS.
    pub fn connect(&mut self, peer: &Endpoint, name: &str) -> Result<(), String> {
        let (q, port, me) = self.q.as_ref().ok_or("no QP")?;
        let mut r = Findings::default();
        conn::to_rts(&self.a, q, port, me, &peer.dest, peer.mtu, name, &mut r)
            .map(|_| ())
            .ok_or_else(|| {
                let u = unfit(Kind::Link, &r);
                format!("{}; {}", u.check.summary, u.check.evidence.join("; "))
            })
    }

    fn run(
        &self,
        op: u32,
        local: Region,
        remote: (u64, u32),
        len: usize,
        count: usize,
        span: usize,
    ) -> Result<f64, String> {
        let (q, _, _) = self.q.as_ref().ok_or("no QP")?;
        let remote = Region { addr: remote.0, lkey: 0, rkey: remote.1 };
        let t0 = Instant::now();
        q.run(op, local, remote, len, count, span).map_err(|(call, cause)| {
            q.quiesce();
            format!("{call} ({cause})")
        })?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// The whole buffer moved once untimed, then `REPS` times, in 4 MiB work requests: the
    /// fastest time. Whatever slows one pass but not the link (another task on this core, a page
    /// fault) is gone from the best of three; a link that is slow is slow in each of them.
    fn timed(&self, op: u32, local: Region, remote: (u64, u32)) -> Result<f64, String> {
        let chunk = self.size.min(4 << 20);
        let mut best = f64::INFINITY;
        // one pass first, untimed: a connection's first messages set up what later ones reuse
        self.run(op, local, remote, chunk, self.size / chunk, self.size)?;
        for _ in 0..REPS {
            best = best.min(self.run(op, local, remote, chunk, self.size / chunk, self.size)?);
        }
        Ok(best)
    }

    /// RDMA WRITE of `src` into the peer's `dst`, the flush READ, then the latency of 8-byte writes.
    pub fn write(&self, peer: &Endpoint) -> Half {
        let dt = self.timed(IBV_WR_RDMA_WRITE, self.src, peer.dst)?;
        self.flush(peer)?;
        let gbps = self.size as f64 * 8.0 / dt / 1e9;
        let mut lat = Vec::new();
        for _ in 0..20 {
            // the pattern's first 8 bytes again, where they already are
            lat.push(self.run(IBV_WR_RDMA_WRITE, self.src, peer.dst, 8, 1, 8)? * 1e6);
        }
        lat.sort_by(f64::total_cmp);
        Ok((gbps, Some(lat[lat.len() / 2])))
    }

    /// An 8-byte READ of the peer's `dst`: its NIC finishes its writes to that GPU first.
    pub fn flush(&self, peer: &Endpoint) -> Result<(), String> {
        self.run(IBV_WR_RDMA_READ, self.scratch, peer.dst, 8, 1, 8).map(|_| ())
    }

    /// RDMA READ of the peer's `src` into `dst`.
    pub fn read(&self, peer: &Endpoint) -> Half {
        let dt = self.timed(IBV_WR_RDMA_READ, self.dst, peer.src)?;
        Ok((self.size as f64 * 8.0 / dt / 1e9, None))
    }

    /// Whether `dst` holds the peer's pattern, every byte; Err: how it differs.
    pub fn verify(&self, seed: u64, tag: u64) -> Result<(), String> {
        verify_with(self.size, seed, tag, |off, buf| {
            self.cu.dtoh(buf, self.gpu[1] + off as u64).map_err(|(c, st)| format!("{c} -> {st}"))
        })
    }

    pub fn close(&mut self) {
        self.q = None;
        self.h.drop_qp();
    }
}

/// `read(offset, buf)` fills `buf` with the bytes at `offset`; they are compared with the pattern
/// (seed, tag), and a checksum of each side is kept for the message.
pub fn verify_with(
    size: usize,
    seed: u64,
    tag: u64,
    mut read: impl FnMut(usize, &mut [u8]) -> Result<(), String>,
) -> Result<(), String> {
    let chunk = size.min(16 << 20);
    let (mut got, mut want) = (vec![0u8; chunk], vec![0u8; chunk]);
    let (mut sum_got, mut sum_want) = (FNV, FNV);
    let mut first = None;
    let mut differ = 0usize;
    for off in (0..size).step_by(chunk) {
        let n = chunk.min(size - off);
        let (got, want) = (&mut got[..n], &mut want[..n]);
        read(off, got)?;
        fill_at(want, seed, tag, off);
        sum_got = checksum(sum_got, got);
        sum_want = checksum(sum_want, want);
        if got != want {
            if first.is_none() {
                let at = got.iter().zip(want.iter()).position(|(a, b)| a != b).unwrap_or(0);
                first = Some((off + at, got[at], want[at]));
            }
            differ += got.iter().zip(want.iter()).filter(|(a, b)| a != b).count();
        }
    }
    match first {
        None => Ok(()),
        Some((at, g, w)) => Err(format!(
            "{differ} of {size} bytes differ, the first at {at:#x} ({g:#04x} where {w:#04x} was sent); checksum {sum_got:#018x}, sent {sum_want:#018x}"
        )),
    }
}

const FNV: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over 8-byte words.
fn checksum(mut h: u64, b: &[u8]) -> u64 {
    for w in b.chunks(8) {
        let mut x = [0u8; 8];
        x[..w.len()].copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(x)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A GPU registration that failed: which fact of the node it is, by errno and the shim's state.
fn reg_unfit(addr: u64, size: usize, e: i32, before: Option<AllCounters>) -> Fact {
    use crate::selftest::shim::{all_counter, all_counters, route_name};
    let shim = crate::selftest::shim::shim_loaded();
    let route = crate::selftest::shim::shim_int(b"gdrshim_gdr_route\0").unwrap_or(0);
    let kind = match e {
        libc::ENOMEM | libc::EPERM => Kind::Memlock,
        libc::EFAULT if !shim => Kind::Shim,
        libc::EFAULT | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EINVAL => Kind::DmaBuf,
        _ => Kind::Node,
    };
    let now = all_counters();
    // gdrshim made dma-bufs of this memory for this registration, and none became an MR
    let delta = |k| match (before, now) {
        (Some(b), Some(n)) => all_counter(&n, k).saturating_sub(all_counter(&b, k)),
        _ => 0,
    };
    let refused_dmabuf = delta("dmabuf_exports") > 0 && delta("registered_bytes") == 0;
    let summary = match kind {
        Kind::Shim => "GPU memory cannot be registered: gdrshim is not loaded in this task".to_string(),
        Kind::DmaBuf if refused_dmabuf => "GPU memory cannot be registered: gdrshim exported it as a dma-buf and the NIC \
                                           refused the dma-buf MR (this node's kernel or HCA driver)"
            .to_string(),
        Kind::DmaBuf => {
            format!("GPU memory cannot be registered: gdrshim takes route {} here and the NIC refused the memory", route_name(route))
        }
        _ => "ibv_reg_mr of GPU memory failed".to_string(),
    };
    let mut evidence = vec![format!("ibv_reg_mr({addr:#x}, {size}) -> NULL, {}", errno_text(e))];
    if let Some(c) = now {
        let n = |k| all_counter(&c, k);
        evidence.push(format!(
            "gdrshim_counters(): pass0_hits={} pass0_misses={} dmabuf_exports={} (+{} for this MR) registered_bytes={} \
             registered={} rm_errors={}",
            n("pass0_hits"),
            n("pass0_misses"),
            n("dmabuf_exports"),
            delta("dmabuf_exports"),
            n("registered_bytes"),
            n("registered"),
            n("rm_errors")
        ));
    } else {
        evidence.push(format!("LD_PRELOAD={}", std::env::var("LD_PRELOAD").unwrap_or_default()));
    }
    let fix = match kind {
        Kind::Shim => "preload libgdrshim.so in this node's job environment (mpirun -x LD_PRELOAD, srun --export, torchrun's env)".into(),
        Kind::DmaBuf if refused_dmabuf => "the kernel takes dma-buf MRs from 5.12 (CONFIG_DMA_SHARED_BUFFER, \
                                          CONFIG_INFINIBAND_USER_MEM), the HCA driver must too (mlx5): gdrshim's log says \
                                          the errno (GDRSHIM_LOG_LEVEL=info); scripts/doctor checks the kernel"
            .into(),
        _ => rdma::reg_cause(e, true).to_string(),
    };
    Fact::new(kind, None, true, summary, evidence, fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_survive_the_wire() {
        let mut gid = IbvGid::default();
        gid.raw[10] = 0xff;
        gid.raw[11] = 0xff;
        gid.raw[12..].copy_from_slice(&[10, 0, 0, 7]);
        let ep = Endpoint {
            dest: Dest { qpn: 0x1a2b, psn: 0x1234, lid: 0, gid },
            mtu: 5,
            src: (0x7f00_0000_1000, 0xdead),
            dst: (0x7f00_1000_0000, 0xbeef),
        };
        assert!(Endpoint::from_line(&ep.to_line()) == Some(ep));
        assert!(Endpoint::from_line("ep 1 2 3").is_none());
    }

    #[test]
    fn verify_finds_every_differing_byte_across_chunks() {
        let size = 40 << 20; // three chunks, the last short
        let mut mem = vec![0u8; size];
        fill_at(&mut mem, 7, 3, 0);
        let read = |mem: &Vec<u8>| {
            let m = mem.clone();
            move |off: usize, buf: &mut [u8]| {
                buf.copy_from_slice(&m[off..off + buf.len()]);
                Ok(())
            }
        };
        assert_eq!(verify_with(size, 7, 3, read(&mem)), Ok(()));
        // another seed or tag: all differ
        assert!(verify_with(size, 8, 3, read(&mem)).is_err());
        mem[17 << 20] ^= 0x40;
        mem[(33 << 20) + 5] ^= 1;
        let e = verify_with(size, 7, 3, read(&mem)).unwrap_err();
        assert!(e.starts_with("2 of 41943040 bytes differ, the first at 0x1100000"), "{e}");
    }
}
