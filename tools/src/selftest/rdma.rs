//! Steps 3 to 5: registration of GPU and host memory, one RC QP connected to itself, RDMA WRITE
//! and READ between GPU and host memory with every byte compared, and the bandwidth per direction.

use super::args::Args;
use super::cuda::Cuda;
use super::ffi::*;
use super::findings::Findings;
use super::host::{HostBuf, Region, Regions};
use super::qp;
use super::shim::{counter, counters, shim_int};
use core::ffi::{c_int, c_void, CStr};

/// Everything opened on the HCA, released in reverse order.
pub struct Hca<'v> {
    pub v: &'v Verbs,
    pub ctx: *mut IbvContext,
    pub pd: *mut c_void,
    pub cq: *mut IbvCqHead,
    pub qp: *mut IbvQpHead,
    pub mrs: Vec<*mut IbvMr>,
}

impl Hca<'_> {
    /// Destroys the QP and CQ (a fleet check makes one pair of them per peer), keeping the MRs.
    pub fn drop_qp(&mut self) {
        // SAFETY: each was created on this context by libibverbs and is destroyed once, the QP
        // before its CQ; the fields are cleared so that Drop does not destroy them again.
        unsafe {
            if !self.qp.is_null() {
                (self.v.destroy_qp)(self.qp);
            }
            if !self.cq.is_null() {
                (self.v.destroy_cq)(self.cq);
            }
        }
        self.qp = core::ptr::null_mut();
        self.cq = core::ptr::null_mut();
    }
}

impl Drop for Hca<'_> {
    fn drop(&mut self) {
        // SAFETY: each object was created on this context by libibverbs and is released once,
        // children before parents.
        unsafe {
            if !self.qp.is_null() {
                (self.v.destroy_qp)(self.qp);
            }
            if !self.cq.is_null() {
                (self.v.destroy_cq)(self.cq);
            }
            for m in self.mrs.drain(..) {
                (self.v.dereg_mr)(m);
            }
            if !self.pd.is_null() {
                (self.v.dealloc_pd)(self.pd);
            }
            (self.v.close_device)(self.ctx);
        }
    }
}

pub fn mr_region(mr: *mut IbvMr, addr: u64) -> Region {
    // SAFETY: a live MR returned by libibverbs (or the shim, which returns the provider's MR).
    let m = unsafe { &*mr };
    Region { addr, lkey: m.lkey, rkey: m.rkey }
}

pub const ACCESS: c_int = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

pub fn reg_cause(e: i32, gpu: bool) -> &'static str {
    match e {
        libc::EFAULT if gpu => "the NIC could not pin the GPU memory: gdrshim did not make it reachable (a miss: see pass0_misses and the shim log; no route: step 1), nvidia-peermem is not loaded (NV503C), or the HCA driver refused the dma-buf (DMA-BUF)",
        libc::EFAULT | libc::ENOMEM | libc::EPERM => "the locked-memory limit is too low: ulimit -l unlimited (docker: --ulimit memlock=-1, --cap-add=IPC_LOCK)",
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT => "the kernel or the HCA driver lacks DMA-BUF MRs: kernel 5.12+ with CONFIG_DMA_SHARED_BUFFER, rdma-core 34+, an mlx5 HCA",
        libc::EINVAL => "the HCA driver refused the range (a dma-buf it cannot map: firmware, or no DMA-BUF support in this HCA)",
        _ => "see dmesg for the HCA driver's reason",
    }
}

/// `ibv_reg_mr` (the shim's, under it) of [addr, addr+len); the MR is released with `h`.
pub fn reg(h: &mut Hca, addr: u64, len: usize) -> Result<*mut IbvMr, i32> {
    // SAFETY: our pd; [addr, addr+len) is our allocation (GPU or host).
    let m = unsafe { (h.v.reg_mr)(h.pd, addr as *mut c_void, len, ACCESS) };
    if m.is_null() {
        return Err(errno());
    }
    h.mrs.push(m);
    Ok(m)
}

/// Steps 3, 4 and 5 on the GPU buffers `gpu` (each `a.size` bytes).
pub fn steps(a: &Args, cu: &Cuda, gpu: [u64; 2], r: &mut Findings) {
    let fd = export(a, cu, gpu[1], r);
    let v = match Verbs::load() {
        Ok(v) => v,
        Err(e) => {
            r.not_checked(3, "reg.gpu", e, "install rdma-core (libibverbs1 and ibverbs-providers)");
            r.not_checked(4, "rdma.loopback", "no libibverbs: no queue pair", "");
            close_fd(fd);
            return;
        }
    };
    // declared before the HCA, so that they outlive its MRs and queue pair
    let (Some(mut hsrc), Some(mut hdst)) = (HostBuf::new(a.size), HostBuf::new(a.size)) else {
        r.fail(
            3,
            "reg.host",
            "no host memory",
            format!("mmap({}) -> MAP_FAILED", a.size),
            "out of memory",
        );
        close_fd(fd);
        return;
    };
    let Some(mut h) = open_hca(a, &v, r) else {
        close_fd(fd);
        return;
    };
    let Some(gpu_mr) = reg_gpu(a, &mut h, gpu, r) else {
        close_fd(fd);
        return;
    };
    let dst = match fd {
        Some(f) => {
            reg_dmabuf(a, &mut h, gpu[1], f, r).unwrap_or_else(|| mr_region(gpu_mr[1], gpu[1]))
        }
        None => mr_region(gpu_mr[1], gpu[1]),
    };
    close_fd(fd);
    let Some(host_mr) = reg_host(a, &mut h, [&hsrc, &hdst], r) else { return };
    let regions = Regions {
        gsrc: mr_region(gpu_mr[0], gpu[0]),
        gdst: dst,
        hsrc: mr_region(host_mr[0], hsrc.addr()),
        hdst: mr_region(host_mr[1], hdst.addr()),
    };
    transfers(a, cu, &mut h, &regions, [&mut hsrc, &mut hdst], r);
}

/// On the DMA-BUF route, NCCL's way: the fd of the GPU buffer at `addr` from libcuda (served by
/// gdrshim on a GeForce). None off that route, or where the export failed (a FAIL).
fn export(a: &Args, cu: &Cuda, addr: u64, r: &mut Findings) -> Option<c_int> {
    if shim_int(b"gdrshim_gdr_route\0") != Some(1) {
        return None;
    }
    match cu.export_dmabuf(addr, a.size) {
        Some(Ok(f)) => {
            r.pass(
                3,
                "reg.export",
                format!("DMA-BUF fd {f} for {} bytes of GPU memory", a.size),
                "cuMemGetHandleForAddressRange(DMA_BUF_FD) -> CUDA_SUCCESS",
            );
            Some(f)
        }
        Some(Err((call, st))) => {
            r.fail(3, "reg.export", "no DMA-BUF of the GPU memory", format!("{call} -> {st}"), "801 (NOT_SUPPORTED): the shim did not serve it (not an exact hit, or not the DMA-BUF route: see step 1 and the shim log); other: the driver refused the export (open module 570+, kernel with CONFIG_DMA_SHARED_BUFFER)");
            None
        }
        None => {
            r.fail(
                3,
                "reg.export",
                "libcuda lacks cuMemGetHandleForAddressRange",
                "dlsym(libcuda, cuMemGetHandleForAddressRange) -> NULL",
                "a driver older than CUDA 11.7",
            );
            None
        }
    }
}

fn close_fd(fd: Option<c_int>) {
    if let Some(f) = fd {
        // SAFETY: our fd from cuMemGetHandleForAddressRange, closed once.
        unsafe { libc::close(f) };
    }
}

/// Both GPU buffers registered under the shim, with how the shim took part (a PASS); None when
/// one could not be (a FAIL).
fn reg_gpu(a: &Args, h: &mut Hca, gpu: [u64; 2], r: &mut Findings) -> Option<[*mut IbvMr; 2]> {
    let mut gpu_mr = [core::ptr::null_mut(); 2];
    for (k, p) in gpu.iter().enumerate() {
        match reg(h, *p, a.size) {
            Ok(m) => gpu_mr[k] = m,
            Err(e) => {
                r.fail(
                    3,
                    "reg.gpu",
                    "ibv_reg_mr of GPU memory failed",
                    format!("ibv_reg_mr({p:#x}, {}) -> NULL, {}", a.size, errno_text(e)),
                    reg_cause(e, true),
                );
                r.not_checked(4, "rdma.loopback", "GPU memory is not registered: no transfer", "");
                return None;
            }
        }
    }
    r.pass(
        3,
        "reg.gpu",
        format!("ibv_reg_mr of 2 GPU buffers under the shim ({})", shim_part()),
        format!(
            "ibv_reg_mr({:#x}, {}) -> lkey {:#x}",
            gpu[0],
            a.size,
            mr_region(gpu_mr[0], gpu[0]).lkey
        ),
    );
    Some(gpu_mr)
}

/// How the shim took part in the GPU registrations, from its counters.
fn shim_part() -> String {
    let c = counters();
    let aside = c.map_or(0, |c| counter(&c, "stood_aside"));
    match c {
        _ if aside > 0 => {
            format!("stood_aside={aside}: libcuda registers GPU memory natively here (a datacenter GPU), the shim stood aside")
        }
        Some(c) if counter(&c, "pass0_hits") == 0 => {
            "pass0_hits=0: the provider took it without gdrshim's help (the data steps still check every byte)".to_string()
        }
        Some(c) => format!("pass0_hits={}: the shim made exactly this memory reachable", counter(&c, "pass0_hits")),
        None => "no shim counters".to_string(),
    }
}

/// The exported fd `f` of the GPU buffer at `addr` registered as NCCL does, the buffer the RDMA
/// steps then write; None where it could not be (a FAIL).
fn reg_dmabuf(a: &Args, h: &mut Hca, addr: u64, f: c_int, r: &mut Findings) -> Option<Region> {
    let Some(regd) = h.v.reg_dmabuf_mr else {
        r.fail(
            3,
            "reg.dmabuf",
            "libibverbs lacks ibv_reg_dmabuf_mr",
            "dlsym(libibverbs, ibv_reg_dmabuf_mr) -> NULL",
            "rdma-core older than 34",
        );
        return None;
    };
    // SAFETY: our pd and fd; iova = the GPU address, as NCCL registers it.
    let m = unsafe { regd(h.pd, 0, a.size, addr, f, ACCESS) };
    if m.is_null() {
        let e = errno();
        r.fail(
            3,
            "reg.dmabuf",
            "ibv_reg_dmabuf_mr of the exported fd failed",
            format!(
                "ibv_reg_dmabuf_mr(fd {f}, 0, {}, iova {addr:#x}) -> NULL, {}",
                a.size,
                errno_text(e)
            ),
            reg_cause(e, true),
        );
        return None;
    }
    h.mrs.push(m);
    let dst = mr_region(m, addr);
    r.pass(
        3,
        "reg.dmabuf",
        "ibv_reg_dmabuf_mr of the DMA-BUF (the RDMA steps write the GPU through this MR)",
        format!("ibv_reg_dmabuf_mr(fd {f}) -> lkey {:#x}", dst.lkey),
    );
    Some(dst)
}

/// Both host buffers registered (a PASS); None when one could not be (a FAIL).
fn reg_host(
    a: &Args,
    h: &mut Hca,
    host: [&HostBuf; 2],
    r: &mut Findings,
) -> Option<[*mut IbvMr; 2]> {
    let mut host_mr = [core::ptr::null_mut(); 2];
    for (k, b) in host.into_iter().enumerate() {
        match reg(h, b.addr(), a.size) {
            Ok(m) => host_mr[k] = m,
            Err(e) => {
                r.fail(
                    3,
                    "reg.host",
                    "ibv_reg_mr of host memory failed",
                    format!("ibv_reg_mr({:#x}, {}) -> NULL, {}", b.addr(), a.size, errno_text(e)),
                    reg_cause(e, false),
                );
                r.not_checked(4, "rdma.loopback", "host memory is not registered: no transfer", "");
                return None;
            }
        }
    }
    r.pass(
        3,
        "reg.host",
        "ibv_reg_mr of 2 host buffers",
        format!(
            "ibv_reg_mr({:#x}, {}) -> lkey {:#x}",
            host[0].addr(),
            a.size,
            mr_region(host_mr[0], host[0].addr()).lkey
        ),
    );
    Some(host_mr)
}

/// Steps 4 and 5: the QP connected to itself, the data steps over `regions`, the bandwidth.
fn transfers(
    a: &Args,
    cu: &Cuda,
    h: &mut Hca,
    regions: &Regions,
    [hsrc, hdst]: [&mut HostBuf; 2],
    r: &mut Findings,
) {
    let v = h.v;
    let Some((q, link)) = qp::connect(a, v, &mut h.cq, &mut h.qp, h.ctx, h.pd, r) else {
        return;
    };
    let seed = run_seed();
    if !qp::data_steps(a, cu, &q, regions, hsrc, hdst, seed, r) {
        r.not_checked(5, "bandwidth", "the data steps failed: no bandwidth figures", "");
        return;
    }
    if a.no_bandwidth {
        r.not_checked(5, "bandwidth", "skipped (--no-bandwidth)", "");
    } else {
        qp::bandwidth(a, &q, regions, link, r);
    }
}

pub fn run_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.as_nanos() as u64) ^ ((std::process::id() as u64) << 32)
}

pub fn open_hca<'v>(a: &Args, v: &'v Verbs, r: &mut Findings) -> Option<Hca<'v>> {
    let mut n = 0;
    // SAFETY: a valid out-pointer; the list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    let mut names = Vec::new();
    for i in 0..if list.is_null() { 0 } else { n.max(0) as usize } {
        // SAFETY: i < n entries of the list.
        let d = unsafe { *list.add(i) };
        // SAFETY: a device of the list: its name is a NUL-terminated string.
        names.push((
            d,
            unsafe { CStr::from_ptr((v.get_device_name)(d)) }.to_string_lossy().into_owned(),
        ));
    }
    let pick = match &a.hca {
        Some(want) => names.iter().find(|(_, nm)| nm == want).map(|(d, nm)| (*d, nm.clone())),
        None => names.first().cloned(),
    };
    let out = match pick {
        None if names.is_empty() => {
            r.not_checked(
                3,
                "reg.gpu",
                "no HCA: ibv_get_device_list found 0 devices, so nothing can register memory",
                "this machine has no RDMA device (or the container lacks --device /dev/infiniband/uverbsN); run it on a node with the HCA",
            );
            r.not_checked(4, "rdma.loopback", "no HCA: no queue pair", "");
            None
        }
        None => {
            let all: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
            r.fail(
                3,
                "hca",
                format!(
                    "--hca {} is not an RDMA device here (there are: {})",
                    a.hca.as_deref().unwrap_or(""),
                    all.join(", ")
                ),
                "ibv_get_device_list",
                "a typo, or the device was renamed (rdma link show)",
            );
            None
        }
        Some((d, name)) => {
            // SAFETY: a device of the list, opened before the list is freed.
            let ctx = unsafe { (v.open_device)(d) };
            if ctx.is_null() {
                let e = errno();
                r.fail(
                    3,
                    "hca",
                    format!("cannot open {name}"),
                    format!("ibv_open_device({name}) -> NULL, {}", errno_text(e)),
                    "missing /dev/infiniband/uverbs* (containers: --device), ib_uverbs not loaded, or no permission",
                );
                None
            } else {
                // SAFETY: an open context.
                let pd = unsafe { (v.alloc_pd)(ctx) };
                let h = Hca {
                    v,
                    ctx,
                    pd,
                    cq: core::ptr::null_mut(),
                    qp: core::ptr::null_mut(),
                    mrs: Vec::new(),
                };
                if pd.is_null() {
                    let e = errno();
                    r.fail(
                        3,
                        "hca",
                        format!("no protection domain on {name}"),
                        format!("ibv_alloc_pd -> NULL, {}", errno_text(e)),
                        "the HCA driver is in a bad state (dmesg)",
                    );
                    None
                } else {
                    Some(h)
                }
            }
        }
    };
    if !list.is_null() {
        // SAFETY: from ibv_get_device_list; opened contexts stay valid after it is freed.
        unsafe { (v.free_device_list)(list) };
    }
    out
}
