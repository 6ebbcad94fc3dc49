//! `gpu-facts`: what libcuda says of each GPU that decides whether NCCL's receive-side flush must
//! be forced there: the compute capability and `GPU_DIRECT_RDMA_WRITES_ORDERING` (118). NCCL
//! flushes received GDR data itself only below sm_90; from sm_90 on it assumes the GPU orders
//! remote writes for their owner, which a GPU whose libcuda answers 118 below `OWNER` (100) does
//! not (an RTX 5090 class GeForce): there the flush must be forced, `NCCL_NET_FORCE_FLUSH=1` in
//! the job or in /etc/nccl.conf, and gdrshim answers `GPU_DIRECT_RDMA_SUPPORTED` only then (the
//! library's rule, src/advertise.rs). scripts/deploy.sh and the .deb ask this before they write
//! that line; gdr-state-record keeps its answer for the doctor.

use crate::report::{Check, Report, Status};
use core::ffi::c_int;
use libloading::Library;

pub const AFTER_HELP: &str = "Each GPU's line carries its facts for scripts: sm=<major><minor> writes_ordering=<118's answer>
needs_forced_flush=<1|0> (unknown where libcuda did not answer; nothing is then taken as needed).

Exit codes:
  0  every GPU's facts read: gpu.forced-flush is WARN where a GPU needs NCCL's flush forced, else PASS
  2  could not check: libcuda cannot be loaded, no GPU, or a GPU whose facts libcuda did not give;
     or a usage error";

/// `gdrshim-tool gpu-facts`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The CUDA driver library to load (a name the dynamic loader searches for, or a path)
    #[arg(long, value_name = "LIB", default_value = "libcuda.so.1")]
    libcuda: String,
    /// One JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let r = match read(&self.libcuda) {
            Ok(gpus) => judge(&gpus),
            Err(why) => {
                let mut r = Report::default();
                r.push(Check::new("gpu.facts", Status::CouldNotCheck, why.clone()));
                r.could_not_check(why);
                r
            }
        };
        Ok(r.print("gpu-facts", self.json))
    }
}

// CUDA's numbers (cuda.h), as dmabuf-probe keeps its own
const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;
const ATTR_GPU_DIRECT_RDMA_WRITES_ORDERING: c_int = 118;
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER`: the GPU orders remote writes for itself.
const WRITES_ORDERING_OWNER: i32 = 100;

/// One GPU as libcuda describes it (`None`: no answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    pub compute_capability: Option<(i32, i32)>,
    pub writes_ordering: Option<i32>,
}

impl Facts {
    /// NCCL skips its flush here unless forced, and the GPU does not order remote writes itself;
    /// `None` where libcuda did not say.
    pub fn needs_forced_flush(&self) -> Option<bool> {
        let (major, _) = self.compute_capability?;
        let ordering = self.writes_ordering?;
        Some(major >= 9 && ordering < WRITES_ORDERING_OWNER)
    }
}

type CUresult = c_int;

/// Every GPU's facts, in CUDA's order.
fn read(libcuda: &str) -> Result<Vec<Facts>, String> {
    // SAFETY: loading the system's libcuda runs its initialisers, as any CUDA program does.
    let lib = unsafe { Library::new(libcuda) }
        .map_err(|e| format!("{libcuda} cannot be loaded ({e}): no NVIDIA driver here"))?;
    // SAFETY: the CUDA driver API's symbols, typed with their documented signatures.
    let (init, count, get, attr) = unsafe {
        let sym =
            |n: &[u8]| format!("libcuda lacks {}", String::from_utf8_lossy(&n[..n.len() - 1]));
        (
            lib.get::<unsafe extern "C" fn(u32) -> CUresult>(b"cuInit\0")
                .map_err(|_| sym(b"cuInit\0"))?,
            lib.get::<unsafe extern "C" fn(*mut c_int) -> CUresult>(b"cuDeviceGetCount\0")
                .map_err(|_| sym(b"cuDeviceGetCount\0"))?,
            lib.get::<unsafe extern "C" fn(*mut c_int, c_int) -> CUresult>(b"cuDeviceGet\0")
                .map_err(|_| sym(b"cuDeviceGet\0"))?,
            lib.get::<unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult>(
                b"cuDeviceGetAttribute\0",
            )
            .map_err(|_| sym(b"cuDeviceGetAttribute\0"))?,
        )
    };
    // SAFETY: plain driver API calls with valid out-pointers.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(format!("cuInit failed (CUresult {rc}): no usable GPU here"));
    }
    let mut n = 0;
    // SAFETY: as above.
    let rc = unsafe { count(&mut n) };
    if rc != 0 || n <= 0 {
        return Err(format!("libcuda finds no GPU (cuDeviceGetCount: CUresult {rc}, {n} devices)"));
    }
    let mut gpus = Vec::new();
    for ordinal in 0..n {
        let mut dev = 0;
        // SAFETY: as above.
        let ok = unsafe { get(&mut dev, ordinal) } == 0;
        let ask = |a: c_int| -> Option<i32> {
            let mut v = 0;
            // SAFETY: as above; `dev` is a device libcuda gave.
            (ok && unsafe { attr(&mut v, a, dev) } == 0).then_some(v)
        };
        let major = ask(ATTR_COMPUTE_CAPABILITY_MAJOR);
        let minor = ask(ATTR_COMPUTE_CAPABILITY_MINOR);
        gpus.push(Facts {
            compute_capability: major.zip(minor),
            writes_ordering: ask(ATTR_GPU_DIRECT_RDMA_WRITES_ORDERING),
        });
    }
    Ok(gpus)
}

/// The facts' line for scripts: `sm=120 writes_ordering=0 needs_forced_flush=1`.
pub fn facts_line(f: &Facts) -> String {
    let sm = f.compute_capability.map_or("unknown".into(), |(a, b)| format!("{a}{b}"));
    let o = f.writes_ordering.map_or("unknown".into(), |o| o.to_string());
    let need = f.needs_forced_flush().map_or("unknown", |n| if n { "1" } else { "0" });
    format!("sm={sm} writes_ordering={o} needs_forced_flush={need}")
}

/// Parses [`facts_line`]'s text back (the doctor reads it from a saved state).
pub fn parse_facts_line(line: &str) -> Option<Facts> {
    let mut f = Facts { compute_capability: None, writes_ordering: None };
    let mut seen = false;
    for kv in line.split_whitespace() {
        match kv.split_once('=') {
            Some(("sm", v)) => {
                seen = true;
                f.compute_capability = v.parse::<i32>().ok().map(|n| (n / 10, n % 10));
            }
            Some(("writes_ordering", v)) => f.writes_ordering = v.parse().ok(),
            _ => {}
        }
    }
    seen.then_some(f)
}

/// One check per GPU and the verdict `gpu.forced-flush`.
pub fn judge(gpus: &[Facts]) -> Report {
    let mut r = Report::default();
    let mut need = Vec::new();
    let mut unknown = Vec::new();
    for (i, g) in gpus.iter().enumerate() {
        let sm = g
            .compute_capability
            .map_or("compute capability unknown".into(), |(a, b)| format!("sm_{a}{b}"));
        let o = g.writes_ordering.map_or("unknown".into(), |o| o.to_string());
        let what = match g.needs_forced_flush() {
            Some(true) => {
                need.push(format!("GPU {i} ({sm}, 118 = {o})"));
                "NCCL skips its receive-side flush here unless NCCL_NET_FORCE_FLUSH is set"
            }
            Some(false) if g.compute_capability.is_some_and(|(a, _)| a < 9) => {
                "NCCL flushes received data itself (below sm_90)"
            }
            Some(false) => "the GPU orders remote writes itself (OWNER or above)",
            None => {
                unknown.push(format!("GPU {i}"));
                "libcuda did not give these facts"
            }
        };
        r.push(
            Check::new(
                &format!("gpu.{i}"),
                Status::Info,
                format!("{sm}, GPU_DIRECT_RDMA_WRITES_ORDERING {o}: {what}"),
            )
            .evidence(facts_line(g)),
        );
    }
    if !need.is_empty() {
        r.push(
            Check::new(
                "gpu.forced-flush",
                Status::Warn,
                format!("{} need NCCL's flush forced for GPUDirect RDMA through gdrshim", need.join(", ")),
            )
            .fix("NCCL_NET_FORCE_FLUSH=1 in the job, or a line NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf (deploy.sh writes it)"),
        );
    } else if unknown.is_empty() {
        r.push(Check::new(
            "gpu.forced-flush",
            Status::Pass,
            "no GPU here needs NCCL's flush forced",
        ));
    }
    if !unknown.is_empty() {
        r.could_not_check(format!("libcuda did not give the facts of {}", unknown.join(", ")));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(cc: (i32, i32), o: i32) -> Facts {
        Facts { compute_capability: Some(cc), writes_ordering: Some(o) }
    }

    #[test]
    fn the_forced_flush_is_needed_from_sm_90_below_owner_only() {
        assert_eq!(gpu((12, 0), 0).needs_forced_flush(), Some(true));
        assert_eq!(gpu((9, 0), 99).needs_forced_flush(), Some(true));
        assert_eq!(gpu((9, 0), 100).needs_forced_flush(), Some(false), "the H200");
        assert_eq!(gpu((8, 9), 0).needs_forced_flush(), Some(false), "the RTX 4090");
        let half = Facts { compute_capability: Some((12, 0)), writes_ordering: None };
        assert_eq!(half.needs_forced_flush(), None);
        let r = judge(&[gpu((8, 9), 0), gpu((12, 0), 0)]);
        let c = r.get("gpu.forced-flush").unwrap();
        assert_eq!(c.status, Status::Warn);
        assert!(c.summary.starts_with("GPU 1 (sm_120, 118 = 0) need"), "{}", c.summary);
        assert!(c.fix.contains("/etc/nccl.conf"));
        assert_eq!(
            r.get("gpu.1").unwrap().evidence,
            ["sm=120 writes_ordering=0 needs_forced_flush=1"]
        );
        assert_eq!(r.exit_code(), 0);
        let r = judge(&[gpu((9, 0), 100)]);
        assert_eq!(r.get("gpu.forced-flush").unwrap().status, Status::Pass);
        assert_eq!(
            r.get("gpu.0").unwrap().evidence,
            ["sm=90 writes_ordering=100 needs_forced_flush=0"]
        );
        // facts not given: could not check, nothing said to be needed
        let r = judge(&[half]);
        assert!(r.get("gpu.forced-flush").is_none());
        assert_eq!(r.exit_code(), 2);
        assert_eq!(facts_line(&half), "sm=120 writes_ordering=unknown needs_forced_flush=unknown");
    }

    #[test]
    fn the_line_reads_back() {
        for f in [gpu((12, 0), 0), gpu((9, 0), 100), gpu((8, 9), 0)] {
            assert_eq!(parse_facts_line(&facts_line(&f)), Some(f));
        }
        assert_eq!(parse_facts_line("nothing here"), None);
    }
}
