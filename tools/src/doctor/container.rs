//! What a container runtime gave, and the locked-memory limit, which CDI cannot carry: inside a
//! container (gdr-state-record's `container` item names the runtime) the verbs device nodes,
//! `LD_PRELOAD` and the shim's files; everywhere the memlock limit, judged by what the kernel
//! charges to it (from its source, in our words):
//! - `ib_umem_get()` (drivers/infiniband/core/umem.c), which pins user memory for an MR: with a
//!   limit of 0 and no CAP_IPC_LOCK it refuses with EPERM (`can_do_mlock()`); otherwise it adds
//!   the MR's pages to the process's pinned count and refuses with ENOMEM past
//!   RLIMIT_MEMLOCK, unless the process has CAP_IPC_LOCK. Host-memory MRs go through it, and so
//!   do the queues' own buffers that mlx5's user-space provider hands the kernel (its CQs and
//!   QPs), whatever the route.
//! - `ib_umem_dmabuf_get()` (umem_dmabuf.c) attaches a dma-buf and pins nothing of the
//!   process: the DMA-BUF route's GPU MRs count nothing. ODP MRs (umem_odp.c) pin nothing either.
//! - The NV503C route's GPU MRs reach nvidia-peermem through MLNX_OFED's own `ib_umem_get`,
//!   which is not the mainline kernel's: counted here as charged, the safe side.

use crate::machine::*;
use crate::report::{Check, Report, Status};

/// What the self-test pins of host memory at its default size: two 16 MiB buffers (reg.host),
/// and a MiB for its queues' rings.
const SELFTEST_KIB: u64 = 33 << 10;
/// A limit from which a job's host MRs are unlikely to be what stops it.
const AMPLE_KIB: u64 = 64 << 20;

/// The runtime the record names, if the state was recorded in a container.
pub(super) fn runtime(st: &State) -> Option<(&'static str, String)> {
    let t = st.item("container").ok()?;
    let rt = if t.contains("KUBERNETES_SERVICE_HOST") || t.contains("kubepods") {
        "kubernetes"
    } else if t.contains("/run/.containerenv")
        || t.contains("container=podman")
        || t.contains("libpod")
    {
        "podman"
    } else if t.contains("/.dockerenv") || t.contains("docker") {
        "docker"
    } else if t.trim().is_empty() {
        return None;
    } else {
        "a container runtime"
    };
    Some((rt, t.lines().next().unwrap_or("").to_string()))
}

/// The fix for the locked-memory limit, for where the state was recorded.
fn memlock_fix(rt: Option<&str>) -> String {
    match rt {
        Some("kubernetes") => "Kubernetes has no memlock setting: a container gets the container runtime's own limit (containerd: LimitMEMLOCK=infinity in a systemd drop-in for containerd.service; CRI-O: default_ulimits = [\"memlock=-1:-1\"] in crio.conf), or add IPC_LOCK to the container's securityContext.capabilities (ib_umem_get does not count for CAP_IPC_LOCK)".into(),
        Some(rt @ ("docker" | "podman")) => format!("{rt} run --ulimit memlock=-1 (or --cap-add=IPC_LOCK: ib_umem_get does not count for CAP_IPC_LOCK, outside a user namespace; not rootless)"),
        Some(_) => "give the container an unlimited memlock limit, or CAP_IPC_LOCK".into(),
        None => "ulimit -l unlimited (limits.conf: * - memlock unlimited; a systemd service: LimitMEMLOCK=infinity; jobs in containers: docker/podman run --ulimit memlock=-1)".into(),
    }
}

/// `limits.memlock`: the limit, and what will be refused under it.
pub(super) fn memlock(st: &State, r: &mut Report, matters: bool) {
    let v = match st.item("memlock").ok().map(str::trim) {
        Some(v) => v.to_string(),
        None => {
            return r.push(Check::new(
                "limits.memlock",
                Status::Info,
                st.item("memlock").why_not("ulimit -l"),
            ))
        }
    };
    let kernel = "charged: pinned user memory, ib_umem_get (host MRs, the provider's CQ/QP buffers; NV503C GPU MRs through MLNX_OFED); not charged: dma-buf MRs, ib_umem_dmabuf_get (the DMA-BUF route's GPU MRs), and ODP MRs";
    let rt = runtime(st).map(|(rt, _)| rt);
    let kib = match v.as_str() {
        "unlimited" => {
            return r.push(
                Check::new("limits.memlock", Status::Pass, "locked-memory limit unlimited")
                    .evidence(kernel),
            )
        }
        n => match n.parse::<u64>() {
            Ok(k) => k,
            Err(_) => {
                return r.push(Check::new(
                    "limits.memlock",
                    Status::Info,
                    format!("ulimit -l said {n:?}"),
                ))
            }
        },
    };
    let bad = if matters { Status::Fail } else { Status::Warn };
    let (status, summary) = if kib == 0 {
        (bad, "locked-memory limit 0: every pinned registration is refused with EPERM (can_do_mlock): host MRs, and the CQs and QPs of every verbs program".to_string())
    } else if kib < SELFTEST_KIB {
        (bad, format!("locked-memory limit {kib} KiB: pinned registrations past it fail with ENOMEM: host MRs and the queues' buffers count, the DMA-BUF route's GPU MRs do not; the self-test's reg.host (2 x 16 MiB) fails, and a job's host buffers and rings soon do (NCCL then goes over sockets: nvidia-container-toolkit#2037)"))
    } else if kib < AMPLE_KIB {
        (bad, format!("locked-memory limit {kib} KiB: enough for the self-test, but a job that pins more than that gets ENOMEM: its host buffers and rings count, and on the NV503C route its GPU MRs too (NCCL's buffers, per channel and peer); the DMA-BUF route's GPU MRs do not"))
    } else {
        return r.push(
            Check::new("limits.memlock", Status::Pass, format!("locked-memory limit {kib} KiB"))
                .evidence(kernel),
        );
    };
    r.push(
        Check::new("limits.memlock", status, summary)
            .evidence(format!("ulimit -l: {kib}"))
            .evidence(kernel)
            .fix(memlock_fix(rt)),
    );
}

/// `container.*`, where the state was recorded inside a container: what the runtime gave.
pub(super) fn container(st: &State, r: &mut Report) {
    let Some((rt, how)) = runtime(st) else { return };
    r.push(
        Check::new(
            "container.runtime",
            Status::Info,
            format!("recorded inside a container ({rt})"),
        )
        .evidence(how),
    );
    let cdi = "--device gdrshim/rdma=all (the CDI spec gdrshim-tool cdi writes; scripts/deploy.sh installs it in /etc/cdi)";
    let nodes = st.item("dev-nodes").any().unwrap_or("");
    let given = |n: &str| nodes.lines().any(|l| l.split_whitespace().last() == Some(n));
    let nics: Vec<CharDev> = st.item("uverbs").ok().map(parse_uverbs).unwrap_or_default();
    let verbs: Vec<&CharDev> = nics.iter().filter(|d| d.ibdev.is_some()).collect();
    let lacking: Vec<&str> =
        verbs.iter().filter(|d| !given(&d.name)).map(|d| d.name.as_str()).collect();
    r.push(if verbs.is_empty() {
        Check::new("container.devices", Status::Info, "no RDMA NIC in /sys/class/infiniband_verbs: no verbs device to give")
    } else if lacking.len() == verbs.len() {
        Check::new(
            "container.devices",
            Status::Fail,
            format!("the runtime gave no verbs device node: /dev/infiniband lacks {}", lacking.join(" ")),
        )
        .evidence(nodes.lines().find(|l| l.contains("infiniband")).unwrap_or("no /dev/infiniband"))
        .fix(format!("run the container with {cdi}, or --device /dev/infiniband/uverbsN --device /dev/infiniband/rdma_cm"))
    } else if !lacking.is_empty() {
        Check::new("container.devices", Status::Warn, format!("some NICs' nodes are missing: {}", lacking.join(" "))).fix(cdi)
    } else {
        Check::new("container.devices", Status::Pass, format!("every NIC's verbs node is here ({})", verbs.len()))
    });
    let mgmt: Vec<&str> = nodes
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| n.starts_with("issm") || n.starts_with("umad"))
        .collect();
    if !mgmt.is_empty() {
        r.push(Check::new("container.privileged", Status::Warn, format!("the container has {}: --privileged or all of /dev/infiniband; a tenant can send management datagrams and set ports' subnet-manager state", mgmt.join(" "))).fix(format!("give it only what it needs: {cdi}")));
    }
    r.push(shim_files(st, cdi));
}

/// `container.shim`: LD_PRELOAD names the shim, and its two files are there.
fn shim_files(st: &State, cdi: &str) -> Check {
    let Some(t) = st.item("preload").ok() else {
        return Check::new(
            "container.shim",
            Status::Info,
            st.item("preload").why_not("LD_PRELOAD"),
        );
    };
    let value = t.lines().find_map(|l| l.strip_prefix("LD_PRELOAD=")).unwrap_or("");
    let ev = format!("LD_PRELOAD={value}");
    if !value.split([':', ' ']).any(|p| p.ends_with("/libgdrshim.so")) {
        return Check::new(
            "container.shim",
            Status::Fail,
            "LD_PRELOAD does not name libgdrshim.so: the shim is not loaded in this container",
        )
        .evidence(ev)
        .fix(format!(
            "{cdi} sets it; by hand: -v /opt/rtx4090-gdr:/opt/rtx4090-gdr:ro -e LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so"
        ));
    }
    match t.lines().find(|l| l.contains("No such file")) {
        Some(l) => Check::new(
            "container.shim",
            Status::Fail,
            "LD_PRELOAD names the shim, but its files are not in the container",
        )
        .evidence(ev)
        .evidence(l)
        .fix(format!("mount the release read-only: {cdi}")),
        None => Check::new(
            "container.shim",
            Status::Pass,
            "LD_PRELOAD names libgdrshim.so and both its files are here",
        )
        .evidence(ev),
    }
}
