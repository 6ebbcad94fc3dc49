//! This task's facts about its node, before any link is tried: gdrshim (loaded? which version,
//! route), the versions the fleet must agree on, the locked-memory limit the task really has,
//! the doctor's checks that bear on GPUDirect RDMA over this node's recorded state, and the
//! self-test's loopback on each of its rails. Only what is wrong becomes a fact.

use super::model::{Fact, Kind};
use crate::doctor;
use crate::machine::{parse_pci_paths, State};
use crate::report::result_word;
use crate::report::{Check, Status};
use crate::selftest::{self, shim};
use crate::topology::closest_nics;
use std::path::{Path, PathBuf};

/// The doctor's checks that bear on GDR across nodes, and what each names when it is not PASS.
/// Its P2P and packaging checks are about GPU-to-GPU inside a node: not the fleet's business.
fn doctor_kind(c: &Check) -> Option<Kind> {
    let bad = matches!(c.status, Status::Fail)
        || (matches!(c.status, Status::Warn) && c.id.starts_with("topo."));
    let warn_counts =
        matches!(c.status, Status::Warn) && matches!(c.id.as_str(), "p2p.iommu" | "p2p.acs");
    if !bad && !warn_counts {
        return None;
    }
    Some(match c.id.as_str() {
        "limits.memlock" => Kind::Memlock,
        "p2p.iommu" => Kind::Iommu,
        "p2p.acs" => Kind::PciePath,
        id if id.starts_with("topo.") => Kind::PciePath,
        "route.choice" | "rdma.kernel_config" => Kind::DmaBuf,
        "rdma.hca" => Kind::NicPort,
        "driver.loaded" | "driver.open" | "driver.modinfo" | "kernel.xid" => Kind::Node,
        _ => return None,
    })
}

/// The doctor's facts for this task's rails: `gpus[k]` is rail k's GPU's PCI address, if known.
pub fn doctor_facts(st: &State, rails: &[(usize, Option<String>)]) -> Vec<Fact> {
    let r = doctor::doctor(st);
    let mut out = Vec::new();
    for c in &r.checks {
        let Some(kind) = doctor_kind(c) else { continue };
        // a path check concerns one GPU: only the rail that has it
        let rail = match c.id.strip_prefix("topo.") {
            Some(addr) => match rails.iter().find(|(_, a)| a.as_deref() == Some(addr)) {
                Some((rail, _)) => Some(*rail),
                None => continue,
            },
            None => None,
        };
        let mut evidence = vec![format!("doctor {} {}", c.status.word(), c.id)];
        evidence.extend(c.evidence.iter().cloned());
        out.push(Fact::new(kind, rail, false, c.summary.clone(), evidence, c.fix.clone()));
    }
    out
}

/// The GPUs' PCI addresses in bus order (CUDA's order with CUDA_DEVICE_ORDER=PCI_BUS_ID, NCCL's)
/// and, per GPU, the RDMA device nearest to it, from the state's PCIe paths.
pub fn topology(st: &State) -> Vec<(String, Option<String>)> {
    let Some(text) = st.item("pci-paths").ok() else { return Vec::new() };
    let devs = parse_pci_paths(text);
    let mut v: Vec<(String, Option<String>)> = closest_nics(&devs)
        .into_iter()
        .map(|(g, n)| (g.name.clone(), n.map(|(n, _)| n.name.clone())))
        .collect();
    v.sort();
    v
}

/// The state to judge: `--state` (its `{node}` replaced by this node's name), else this machine
/// recorded now (the folder to remove afterwards with it).
pub fn state(flag: Option<&Path>, node: &str) -> Result<(State, PathBuf, Option<PathBuf>), String> {
    match flag {
        Some(p) => {
            let dir = PathBuf::from(p.to_string_lossy().replace("{node}", node));
            State::from_dir(&dir)
                .map(|s| (s, dir.clone(), None))
                .map_err(|e| format!("--state {}: {e}", dir.display()))
        }
        None => {
            let (root, saved) = selftest::route_doctor::record()?;
            let st = State::from_dir(&saved).map_err(|e| e.to_string())?;
            Ok((st, saved, Some(root)))
        }
    }
}

/// gdrshim in this task: a blocking fact when it is not loaded, and its version.
pub fn shim_facts() -> (Vec<Fact>, String) {
    if !shim::shim_loaded() {
        let fact = Fact::new(
            Kind::Shim,
            None,
            true,
            "gdrshim is not loaded in this task".into(),
            vec![format!("dlsym(gdrshim_version) -> NULL; LD_PRELOAD={}", std::env::var("LD_PRELOAD").unwrap_or_default())],
            "preload libgdrshim.so where the job starts (mpirun -x LD_PRELOAD=…, srun --export=ALL,LD_PRELOAD=…, torchrun's \
                  environment), or give --shim PATH"
                .into(),
        );
        return (vec![fact], "missing".into());
    }
    let mut facts = Vec::new();
    let mode = shim::shim_int(b"gdrshim_mode\0").unwrap_or(0);
    if mode != 3 {
        facts.push(Fact::new(
            Kind::Shim,
            None,
            true,
            format!("gdrshim runs in mode {mode}, not register (3)"),
            vec![format!(
                "gdrshim_mode() = {mode}; GDRSHIM_MODE={}",
                std::env::var("GDRSHIM_MODE").unwrap_or_default()
            )],
            "unset GDRSHIM_MODE or set it to register in the job's environment".into(),
        ));
    }
    (facts, shim::shim_version())
}

/// The locked-memory limit this task has, where it is below what GPU jobs need and nothing
/// lifts it (CAP_IPC_LOCK lets a task lock memory whatever its limit).
pub fn memlock_fact(status: &str, soft: Option<u64>) -> Option<Fact> {
    let need = 64u64 << 30; // the doctor's floor: 64 GiB in bytes (ulimit -l counts KiB)
    let soft = soft?;
    let cap = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|c| c & (1 << CAP_IPC_LOCK) != 0);
    (soft < need && !cap).then(|| {
        Fact::new(
            Kind::Memlock,
            None,
            false,
            format!("this task may lock {} KiB of memory, and has no CAP_IPC_LOCK", soft >> 10),
            vec![format!("getrlimit(RLIMIT_MEMLOCK) -> soft {soft} bytes; CapEff lacks CAP_IPC_LOCK")],
            "ulimit -l unlimited where the job starts (limits.conf: * - memlock unlimited; docker run --ulimit memlock=-1; \
              slurm: PropagateResourceLimits)"
                .into(),
        )
    })
}

/// linux/capability.h
const CAP_IPC_LOCK: u32 = 14;

/// RLIMIT_MEMLOCK's soft limit; None: unlimited.
pub fn memlock_soft() -> Option<u64> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid out-pointer to an rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut l) };
    (rc == 0 && l.rlim_cur != libc::RLIM_INFINITY).then_some(l.rlim_cur)
}

/// The self-test's loopback on one rail (its own GPU buffers, one QP to itself, every byte
/// checked), as a fact when it fails.
pub fn loopback(a: &selftest::Args, rail: usize) -> (String, Option<Fact>) {
    let r = selftest::selftest(a);
    let word = result_word(r.exit_code()).to_string();
    let Some(bad) = r.items().iter().find(|i| i.status == Status::Fail) else {
        return (word, None);
    };
    let kind = match bad.id.as_str() {
        "route.shim" => Kind::Shim,
        id if id.starts_with("route") || id.starts_with("reg.") => Kind::DmaBuf,
        "limits.memlock" => Kind::Memlock,
        id if id.starts_with("gpu.") || id.starts_with("shim.") => Kind::Node,
        _ => Kind::NicPort,
    };
    let fact = Fact::new(
        kind,
        Some(rail),
        false,
        format!("the self-test's loopback on rail {rail} failed at {}: {}", bad.id, bad.summary),
        bad.evidence.clone(),
        bad.fix.clone(),
    );
    (word, Some(fact))
}

/// The NVIDIA driver's version from /proc (the kernel module), "unknown" without it.
pub fn driver_version() -> String {
    let t = std::fs::read_to_string("/proc/driver/nvidia/version").unwrap_or_default();
    t.split_whitespace()
        .find(|w| w.split('.').count() >= 2 && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .unwrap_or("unknown")
        .to_string()
}

/// rdma-core's version from the libibverbs file this process mapped (libibverbs.so.1.14.50.0
/// is rdma-core 50.0), "unknown" where the name says nothing.
pub fn rdma_core_version(maps: &str) -> String {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter_map(|p| p.rsplit('/').next()?.strip_prefix("libibverbs.so.1."))
        .find_map(|v| {
            let parts: Vec<&str> = v.split('.').collect();
            (parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()))
                .then(|| format!("{}.{}", parts[1], parts[2]))
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> State {
        State::from_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state").join(name),
        )
        .unwrap()
    }

    #[test]
    fn the_doctor_gives_the_path_of_each_rails_gpu_and_nothing_on_a_good_rig() {
        assert!(doctor_facts(&fixture("rig-4090-ok"), &[(0, None)]).is_empty());
        let st = fixture("rig-4090-sys");
        let topo = topology(&st);
        assert_eq!(
            topo.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(),
            ["0000:01:00.0", "0000:41:00.0"]
        );
        assert_eq!(topo[0].1.as_deref(), Some("mlx5_0"));
        // this task has GPU 1 only: one fact, on its rail
        let f = doctor_facts(&st, &[(1, Some(topo[1].0.clone()))]);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].kind, f[0].rail, f[0].blocks), (Kind::PciePath, Some(1), false));
        assert!(
            f[0].check.summary.contains("SYS (across the link between CPU sockets)"),
            "{}",
            f[0].check.summary
        );
        assert!(f[0].check.evidence[0].starts_with("doctor WARN topo.0000:41:00.0"));
        let bad = doctor_facts(&fixture("rig-4090-bad"), &[(0, None)]);
        assert!(bad.iter().any(|f| f.kind == Kind::Memlock), "{bad:#?}");
    }

    #[test]
    fn memlock_counts_only_without_cap_ipc_lock() {
        let without = "Name:\tx\nCapEff:\t0000000000000000\n";
        let with = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        let f = memlock_fact(without, Some(64 << 10)).unwrap();
        assert_eq!(f.check.summary, "this task may lock 64 KiB of memory, and has no CAP_IPC_LOCK");
        assert!(memlock_fact(with, Some(64 << 10)).is_none());
        assert!(memlock_fact(without, None).is_none(), "unlimited");
        assert!(memlock_fact(without, Some(1 << 40)).is_none());
    }

    #[test]
    fn rdma_core_from_the_mapped_file() {
        let maps =
            "7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.50.0\n";
        assert_eq!(rdma_core_version(maps), "50.0");
        assert_eq!(rdma_core_version("7f00-7f01 r-xp 0 0 1 /tmp/lab/libibverbs.so.1\n"), "unknown");
    }
}
