//! `gdrshim-tool selftest`: one command that proves GPUDirect RDMA on this machine, with every
//! byte checked. It runs itself under the shim in register mode (re-executing with
//! `LD_PRELOAD=libgdrshim.so GDRSHIM_MODE=register` when the shim is not loaded), then:
//! 1. the route the shim chose (and that it registers at all), and the doctor's checks of that
//!    route over this machine's state (recorded by `scripts/gdr-state-record`, or `--state DIR`);
//! 2. GPU memory from libcuda (`cuMemAlloc`);
//! 3. registration of it with `ibv_reg_mr` under the shim, on the DMA-BUF route also
//!    `cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr` as NCCL does, and of host memory;
//! 4. one RC QP connected to itself: RDMA WRITE GPU→GPU, host→GPU, GPU→host and RDMA READ
//!    GPU→host, a pattern that differs per 4 KiB page and per run, every byte compared;
//! 5. bandwidth per direction against the link rate from `ibv_query_port`;
//! 6. the shim's counters.
//!
//! Each check is PASS, FAIL or COULD NOT CHECK with the call, its errno or CUDA status, and the
//! likely cause. libcuda and libibverbs are loaded at run time (no build-time rdma-core).

pub mod args;
pub mod conn;
pub mod cuda;
pub mod ffi;
pub mod findings;
pub mod host;
#[cfg(test)]
mod layout;
mod qp;
pub mod rdma;
pub mod route_doctor;
pub mod shim;

pub use args::Args;
use shim::{counter, counters, route_name, shim_int, shim_loaded, shim_version, COUNTER_NAMES};

use findings::Findings;
use std::path::PathBuf;

pub const AFTER_HELP: &str = "Runs under libgdrshim.so in register mode (re-executes itself with LD_PRELOAD when the shim is not
loaded: --shim PATH, else libgdrshim.so next to the binary or in ../lib). Needs a GPU and an HCA port
that is up; with no HCA the RDMA steps say COULD NOT CHECK and the exit code is 2.

Exit codes:
  0  every step passed
  1  a step failed (each FAIL names the call, its errno or CUDA status, and the likely cause)
  2  could not check here (no libcuda, no GPU, no libibverbs, no HCA) or a usage error";

/// Set in the re-executed child: never re-execute twice.
const CHILD_VAR: &str = "GDRSHIM_SELFTEST_CHILD";

impl Args {
    pub fn run(self) -> Result<u8, String> {
        if let Some(code) = self.reexec()? {
            return Ok(code);
        }
        let r = selftest(&self);
        print!("{}", if self.json { r.json() + "\n" } else { r.text() });
        Ok(r.exit_code())
    }

    /// Under the shim in register mode (and with the route asked for) already: None. Else
    /// re-executes this program so; an error only where that is impossible.
    pub fn reexec(&self) -> Result<Option<u8>, String> {
        let want_route = (self.route != "auto").then_some(self.route.as_str());
        // register is the shim's default: unset counts
        let mode_ok = std::env::var("GDRSHIM_MODE").map_or(true, |m| m == "register");
        let route_ok =
            want_route.is_none_or(|r| std::env::var("GDRSHIM_ROUTE").is_ok_and(|v| v == r));
        if (shim_loaded() && mode_ok && route_ok) || std::env::var_os(CHILD_VAR).is_some() {
            return Ok(None); // the child reports what is still wrong in step 1
        }
        let mut preload = std::env::var("LD_PRELOAD").unwrap_or_default();
        if !shim_loaded() {
            let lib = self.find_shim()?;
            preload = if preload.is_empty() {
                lib.display().to_string()
            } else {
                format!("{}:{preload}", lib.display())
            };
        }
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this program to re-execute it: {e}"))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.args(std::env::args_os().skip(1))
            .env("LD_PRELOAD", preload)
            .env("GDRSHIM_MODE", "register")
            .env(CHILD_VAR, "1");
        if let Some(r) = want_route {
            cmd.env("GDRSHIM_ROUTE", r);
        }
        let st = cmd.status().map_err(|e| format!("cannot re-execute under the shim: {e}"))?;
        match (st.code(), std::os::unix::process::ExitStatusExt::signal(&st)) {
            (Some(c), _) => Ok(Some(c as u8)),
            (None, sig) => {
                // a crash under the shim is a failure, never "could not check"
                let sig = sig.unwrap_or(0);
                println!("FAIL            selftest: the run under the shim was killed by signal {sig}; rerun with GDRSHIM_LOG_LEVEL=debug and report it with the shim's log");
                Ok(Some(1))
            }
        }
    }

    /// The library to preload, absolute (the loader resolves a relative LD_PRELOAD against each
    /// program's own working folder): --shim's, else the one next to this program or in ../lib.
    fn find_shim(&self) -> Result<PathBuf, String> {
        if let Some(p) = &self.shim {
            return match std::fs::metadata(p) {
                Ok(m) if m.is_file() => {
                    p.canonicalize().map_err(|e| format!("--shim {}: {e}", p.display()))
                }
                Ok(_) => Err(format!(
                    "--shim {}: not a file (give the path of libgdrshim.so)",
                    p.display()
                )),
                Err(e) => Err(format!("--shim {}: {e}", p.display())),
            };
        }
        let near = std::env::current_exe().ok().and_then(|exe| {
            let dir = exe.parent()?.to_path_buf();
            [dir.join("libgdrshim.so"), dir.join("../lib/libgdrshim.so")]
                .into_iter()
                .find(|p| p.is_file())
                .and_then(|p| p.canonicalize().ok())
        });
        near.ok_or_else(|| "libgdrshim.so is not preloaded and not next to this program or in ../lib: give --shim PATH".to_string())
    }
}

pub fn selftest(a: &Args) -> Findings {
    let mut r = Findings::default();
    let mut cu = match cuda::Cuda::load() {
        Ok(c) => c,
        Err(e) => {
            r.not_checked(
                1,
                "route.chosen",
                "the route is decided at the first NVIDIA call: none without libcuda",
                "",
            );
            r.not_checked(
                2,
                "gpu.alloc",
                e,
                "no NVIDIA driver (libcuda.so.1) on this machine or in this container (--gpus)",
            );
            return r;
        }
    };
    let gpu_name = match cu.open(a.gpu) {
        Ok(n) => n,
        Err((call, st)) => {
            r.not_checked(
                1,
                "route.chosen",
                "no CUDA context, so no NVIDIA call for the shim to decide on",
                "",
            );
            r.fail(
                2,
                "gpu.context",
                format!("no CUDA context on GPU {}", a.gpu),
                format!("{call} -> {st}"),
                cu_cause(&st),
            );
            return r;
        }
    };
    step1_route(a, &cu, &mut r);
    // step 2: GPU memory
    let mut gpu = [0u64; 2];
    for (k, p) in gpu.iter_mut().enumerate() {
        match cu.alloc(a.size) {
            Ok(v) => *p = v,
            Err((call, st)) => {
                r.fail(
                    2,
                    "gpu.alloc",
                    format!("GPU memory on {gpu_name}"),
                    format!("{call} -> {st}"),
                    cu_cause(&st),
                );
                for q in &gpu[..k] {
                    cu.free(*q);
                }
                shim_counters(&mut r);
                return r;
            }
        }
    }
    r.pass(
        2,
        "gpu.alloc",
        format!(
            "2 x {} bytes of GPU memory on {gpu_name} (GPU {}) at {:#x}, {:#x}",
            a.size, a.gpu, gpu[0], gpu[1]
        ),
        "cuMemAlloc -> CUDA_SUCCESS",
    );
    rdma::steps(a, &cu, gpu, &mut r);
    for p in gpu {
        cu.free(p);
    }
    shim_counters(&mut r);
    r
}

fn step1_route(a: &Args, cu: &cuda::Cuda, r: &mut Findings) {
    let Some(mode) = shim_int(b"gdrshim_mode\0") else {
        r.fail(
            1,
            "route.shim",
            "libgdrshim.so is not loaded in this process",
            format!("LD_PRELOAD={}", std::env::var("LD_PRELOAD").unwrap_or_default()),
            "the dynamic linker ignored LD_PRELOAD (setuid/secure execution, a 32-bit or foreign-arch library, a wrong path), or --shim named another file",
        );
        route_doctor::route_checks(a.state.as_deref(), None, r);
        return;
    };
    let route = shim_int(b"gdrshim_gdr_route\0").unwrap_or(0);
    let active = shim_int(b"gdrshim_gdr_active\0").unwrap_or(0);
    let attr = cu
        .attribute(cuda::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
        .map_or("unknown".into(), |v| v.to_string());
    let gate = cu
        .attribute(cuda::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
        .map_or("unknown".into(), |v| v.to_string());
    let call = format!(
        "gdrshim_mode()={mode} gdrshim_gdr_route()={route} gdrshim_gdr_active()={active}; CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED={attr} GPU_DIRECT_RDMA_SUPPORTED={gate} (stock NCCL's gate)"
    );
    if mode != 3 {
        r.fail(1, "route.shim", format!("the shim runs in mode {mode}, not register (3)"), call, "GDRSHIM_MODE is not register in this process (a wrapper script overrides it), or the shim is inert (fork child, secure execution, unknown driver ABI: see its log)");
    } else if route == 0 || active == 0 {
        r.fail(1, "route.chosen", "the shim registers by no route here", call, "neither route works on this machine: DMA-BUF needs the open module 570+, kernel 5.12+ with dma-buf and ODP, rdma-core 34+ (ibv_reg_dmabuf_mr); NV503C needs nvidia-peermem (MLNX_OFED/DOCA). The shim's warning names what is missing; scripts/doctor says it per route");
    } else if a.route != "auto" && a.route != route_name(route) {
        r.fail(1, "route.chosen", format!("the shim took route {} but --route {} was asked", route_name(route), a.route), call, "the route asked for cannot work here (the shim falls back only with GDRSHIM_ROUTE=auto); see the shim's warning and scripts/doctor");
    } else {
        r.pass(
            1,
            "route.chosen",
            format!(
                "gdrshim {} registers GPU memory by route {} (register mode)",
                shim_version(),
                route_name(route)
            ),
            call,
        );
    }
    route_doctor::route_checks(
        a.state.as_deref(),
        (mode == 3 && route != 0 && active != 0).then(|| route_name(route)),
        r,
    );
}

/// Step 6: the shim's counters; a miss on our own allocations, an RM error or a mismatch fails.
fn shim_counters(r: &mut Findings) {
    let Some(c) = counters() else {
        r.not_checked(6, "shim.counters", "the shim is not loaded: no counters", "");
        return;
    };
    r.counters = COUNTER_NAMES.iter().zip(c).map(|(n, v)| (*n, v.to_string())).collect();
    r.counters.insert(
        0,
        ("route", route_name(shim_int(b"gdrshim_gdr_route\0").unwrap_or(0)).to_string()),
    );
    let (hits, misses, rm, mism) = (
        counter(&c, "pass0_hits"),
        counter(&c, "pass0_misses"),
        counter(&c, "rm_errors"),
        counter(&c, "mismatched"),
    );
    let call = format!("gdrshim_counters(): pass0_hits={hits} pass0_misses={misses} rm_errors={rm} mismatched={mism}");
    if misses > 0 || rm > 0 || mism > 0 {
        r.fail(6, "shim.counters", "the shim missed, or RM refused, a registration of this test's own memory", call, "a miss: the GPU memory was not one exact mapping the shim saw (its log names the reason); rm_errors: RM refused a registration or export (the log names the status and its cause); mismatched: the shim's plan differs from libcuda's own (report it with the shim log)");
    } else {
        r.pass(6, "shim.counters", "no miss, no RM error, no mismatch", call);
    }
}

/// The likely cause of a failed CUDA call, by status name.
fn cu_cause(st: &str) -> String {
    let c = if st.contains("NO_DEVICE") || st.contains("(100)") {
        "no GPU visible (CUDA_VISIBLE_DEVICES, container without --gpus)"
    } else if st.contains("INVALID_DEVICE") || st.contains("(101)") {
        "--gpu names no such device"
    } else if st.contains("OUT_OF_MEMORY") || st.contains("(2)") {
        "the GPU is out of memory (other processes, or --size too large)"
    } else if st.contains("(999)")
        || st.contains("UNKNOWN")
        || st.contains("SYSTEM_DRIVER_MISMATCH")
        || st.contains("(803)")
    {
        "kernel module and libcuda versions differ, or the driver is wedged (the doctor's driver.versions; dmesg for Xid)"
    } else if st.contains("NOT_SUPPORTED") || st.contains("(801)") {
        "the driver does not support this here (GeForce without the shim serving it)"
    } else {
        "see the CUDA status; dmesg for an Xid"
    };
    c.to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The ids in the first column of the README's table of steps, `*` expanded from the list.
    fn readme_checks() -> BTreeSet<(u8, String)> {
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
                .unwrap();
        let table = readme
            .split("| step | check | what a FAIL means |")
            .nth(1)
            .expect("the README's table of steps");
        let mut out = BTreeSet::new();
        for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
            let first = row.split('|').nth(1).unwrap().trim();
            let step: u8 = first.split_whitespace().next().unwrap().parse().unwrap();
            for id in first.split('`').skip(1).step_by(2) {
                match id.strip_suffix('*') {
                    Some(prefix) => out.extend(
                        super::findings::CHECKS
                            .iter()
                            .filter(|(_, c)| c.starts_with(prefix))
                            .map(|(s, c)| (*s, c.to_string())),
                    ),
                    None => {
                        out.insert((step, id.to_string()));
                    }
                }
            }
        }
        out
    }

    /// The check ids the self-test's code names: its string literals that look like one, and the
    /// transfers' ids made from their names.
    fn ids_in_the_code() -> BTreeSet<String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/selftest");
        let mut out = BTreeSet::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            let code = text.split("mod tests {").next().unwrap();
            for lit in code.split('"').skip(1).step_by(2) {
                let head = lit.split('.').next().unwrap();
                let id_like = lit
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c));
                if id_like
                    && lit.contains('.')
                    && !lit.ends_with('.')
                    && ["route", "gpu", "reg", "rdma", "bw", "shim"].contains(&head)
                    || lit == "bandwidth"
                {
                    out.insert(lit.to_string());
                }
            }
        }
        for name in super::qp::transfer_names() {
            out.insert(format!("rdma.{name}"));
            out.insert(format!("bw.{name}"));
        }
        out
    }

    #[test]
    fn the_readme_the_list_and_the_code_name_the_same_checks() {
        let list: BTreeSet<(u8, String)> =
            super::findings::CHECKS.iter().map(|(s, c)| (*s, c.to_string())).collect();
        assert_eq!(list.len(), super::findings::CHECKS.len(), "a check listed twice");
        assert_eq!(readme_checks(), list, "the README's table of steps and findings::CHECKS");
        let listed: BTreeSet<String> = list.iter().map(|(_, c)| c.clone()).collect();
        let code = ids_in_the_code();
        let unlisted: Vec<&String> = code.difference(&listed).collect();
        assert!(
            unlisted.is_empty(),
            "checks the code makes that findings::CHECKS lacks: {unlisted:?}"
        );
        // the doctor's route checks come from the doctor; every other listed id is the code's
        let never: Vec<&String> = listed
            .difference(&code)
            .filter(|c| !["route.dmabuf", "route.nv503c", "route.choice"].contains(&c.as_str()))
            .collect();
        assert!(never.is_empty(), "listed checks the code never makes: {never:?}");
    }
}
