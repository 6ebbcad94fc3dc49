//! The doctor's verdict per registration route (see the README's route table): what the DMA-BUF
//! route and the NV503C route each need on this machine, PASS or FAIL with the fix, and which
//! one gdrshim's `GDRSHIM_ROUTE=auto` takes. A route that is missing while the other works is a
//! WARN (the machine is ready); only when no route works is it a FAIL.

use crate::machine::{Gpu, State};
use crate::report::{Check, Status};

/// One prerequisite: met, not met (why, fix), or not judged (why).
enum Need {
    Met(String),
    Unmet(String, &'static str),
    Unknown(String),
}

fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    Some((it.next()?.parse().ok()?, it.next().and_then(|s| s.parse().ok()).unwrap_or(0)))
}

/// rdma-core's version from the packages list (rdma-core, or libibverbs1 where rdma-core itself
/// is not a package).
fn rdma_core(st: &State) -> Option<(String, u32)> {
    let p = st.item("packages").any()?;
    p.lines().filter(|l| l.ends_with("install ok installed")).find_map(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        let (name, version) = (*t.first()?, *t.get(1)?);
        if name != "rdma-core" && name != "libibverbs1" {
            return None;
        }
        Some((format!("{name} {version}"), major_minor(version)?.0))
    })
}

fn dmabuf_needs(st: &State, kernel_version: Option<&str>) -> Vec<Need> {
    let mut v = Vec::new();
    let first = st.item("proc-driver-version").ok().and_then(|t| t.lines().next()).unwrap_or("");
    match (first.contains("Open Kernel Module"), kernel_version) {
        (true, Some(kv)) if major_minor(kv).is_some_and(|(m, _)| m >= 570) => v.push(Need::Met(format!("open kernel module {kv}"))),
        (true, Some(kv)) => v.push(Need::Unmet(
            format!("driver {kv}: gdrshim issues the dma-buf export only with the 570+ struct"),
            "install a 570 or newer open driver (the P2P-patched open DKMS of that branch on GeForce)",
        )),
        (false, Some(_)) => v.push(Need::Unmet(
            "the proprietary kernel module is loaded: dma-buf export needs the open one".into(),
            "install the open kernel module",
        )),
        _ => v.push(Need::Unknown("no NVIDIA module seen".into())),
    }
    let kernel = st.item("kernel").ok().and_then(|k| k.split_whitespace().nth(2)).unwrap_or("");
    match major_minor(kernel) {
        Some(kv) if kv >= (5, 12) => v.push(Need::Met(format!("kernel {kernel} (ib_umem_dmabuf)"))),
        Some(_) => v.push(Need::Unmet(
            format!("kernel {kernel}: RDMA dma-buf MRs need 5.12 or newer"),
            "boot a 5.15+ kernel (Ubuntu 22.04/24.04 generic)",
        )),
        None => v.push(Need::Unknown("kernel version not recorded".into())),
    }
    match st.item("kernel-config").ok() {
        Some(t) => {
            let has = |k: &str| t.lines().any(|l| l.starts_with(&format!("{k}=y")) || l.starts_with(&format!("{k}=m")));
            let missing: Vec<&str> = ["CONFIG_DMA_SHARED_BUFFER", "CONFIG_INFINIBAND_USER_MEM", "CONFIG_INFINIBAND_ON_DEMAND_PAGING"]
                .into_iter()
                .filter(|k| !has(k))
                .collect();
            if missing.is_empty() {
                v.push(Need::Met("kernel has DMA_SHARED_BUFFER, INFINIBAND_USER_MEM, INFINIBAND_ON_DEMAND_PAGING".into()));
            } else {
                v.push(Need::Unmet(
                    format!("kernel lacks {} (RM reports no dma-buf capability, or mlx5 takes no dma-buf MR)", missing.join(", ")),
                    "use a distribution kernel built with them (Ubuntu's generic kernels are)",
                ));
            }
        }
        None => v.push(Need::Unknown("kernel config not readable".into())),
    }
    match rdma_core(st) {
        Some((p, major)) if major >= 34 => v.push(Need::Met(format!("{p} (ibv_reg_dmabuf_mr, rdma-core 34+)"))),
        Some((p, _)) => v.push(Need::Unmet(
            format!("{p}: ibv_reg_dmabuf_mr needs rdma-core 34 or newer"),
            "install rdma-core 34+ (Ubuntu 22.04 has 39)",
        )),
        None => v.push(Need::Unknown("no rdma-core / libibverbs1 package recorded".into())),
    }
    match st.item("lsmod").ok() {
        Some(t) => {
            let loaded = |m: &str| t.lines().any(|l| l.split_whitespace().next() == Some(m));
            if loaded("mlx5_ib") {
                v.push(Need::Met("mlx5_ib loaded (ConnectX: dma-buf MRs)".into()));
            } else if loaded("ib_uverbs") {
                v.push(Need::Unknown("an RDMA driver other than mlx5_ib: whether it takes dma-buf MRs is not known here".into()));
            } else {
                v.push(Need::Unmet("no RDMA driver loaded (mlx5_ib, ib_uverbs)".into(), "sudo modprobe mlx5_ib ib_uverbs"));
            }
        }
        None => v.push(Need::Unknown(st.item("lsmod").why_not("lsmod"))),
    }
    v
}

fn nv503c_needs(st: &State) -> Vec<Need> {
    let params = st.item("module-params").any().unwrap_or("");
    let present = |p: &str| params.lines().any(|l| l.starts_with(p) && !l.contains("No such file"));
    let peer_symbol = st.item("kallsyms-peer").any().and_then(|t| t.trim().lines().next()?.trim().parse::<u32>().ok());
    let mut v = Vec::new();
    if present("/sys/module/nvidia_peermem/version") || present("/sys/kernel/mm/memory_peers/nv_mem/version") {
        v.push(Need::Met("nvidia-peermem loaded (the only reader of NV503C registrations)".into()));
    } else if params.is_empty() {
        v.push(Need::Unknown("module parameters not recorded".into()));
    } else if peer_symbol == Some(0) {
        v.push(Need::Unmet(
            "nvidia-peermem not loaded, and this kernel lacks ib_register_peer_memory_client (inbox RDMA stack): it cannot load here"
                .into(),
            "install MLNX_OFED/DOCA-OFED and nvidia-peermem built against it, or use the DMA-BUF route (GDRSHIM_ROUTE=dmabuf)",
        ));
    } else {
        v.push(Need::Unmet("nvidia-peermem not loaded".into(), "sudo modprobe nvidia-peermem (needs MLNX_OFED/DOCA-OFED)"));
    }
    v
}

/// One route's check from its needs, and whether it works.
fn verdict(id: &str, name: &str, needs: &[Need]) -> (Check, Option<bool>) {
    let unmet: Vec<(&String, &str)> = needs.iter().filter_map(|n| if let Need::Unmet(w, f) = n { Some((w, *f)) } else { None }).collect();
    let unknown: Vec<&String> = needs.iter().filter_map(|n| if let Need::Unknown(w) = n { Some(w) } else { None }).collect();
    let mut c = if let Some((_, fix)) = unmet.first() {
        Check::new(
            id,
            Status::Fail,
            format!("{name} route cannot work here: {}", unmet.iter().map(|u| u.0.as_str()).collect::<Vec<_>>().join("; ")),
        )
        .fix(*fix)
    } else if !unknown.is_empty() {
        Check::new(
            id,
            Status::Info,
            format!("{name} route could not be judged: {}", unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")),
        )
    } else {
        Check::new(id, Status::Pass, format!("{name} route has everything it needs"))
    };
    for n in needs {
        if let Need::Met(w) = n {
            c = c.evidence(format!("ok: {w}"));
        }
    }
    let works = if !unmet.is_empty() {
        Some(false)
    } else if unknown.is_empty() {
        Some(true)
    } else {
        None
    };
    (c, works)
}

/// The route checks, for machines whose GPUs need gdrshim (GeForce); on datacenter GPUs libcuda
/// registers natively and no route of gdrshim's is used.
pub fn checks(st: &State, kernel_version: Option<&str>, gpus: &[Gpu]) -> Vec<Check> {
    if !gpus.is_empty() && !gpus.iter().any(|g| g.is_geforce()) {
        return vec![Check::new(
            "route.choice",
            Status::Info,
            "datacenter GPUs: libcuda registers and exports natively; gdrshim stands aside (no route of its own needed)",
        )];
    }
    let (mut d, dw) = verdict("route.dmabuf", "DMA-BUF", &dmabuf_needs(st, kernel_version));
    let (mut n, nw) = verdict("route.nv503c", "NV503C", &nv503c_needs(st));
    let modeset =
        st.item("module-params").any().and_then(|p| p.lines().find(|l| l.contains("nvidia_drm/parameters/modeset")).map(str::to_string));
    if let Some(m) = modeset.filter(|m| m.trim_end().ends_with(": N")) {
        d = d.evidence(format!(
            "note: nvidia_drm modeset=0 ({m}); RM's own dma-buf capability does not depend on it, but a Hopper runbook needed it"
        ));
    }
    // a route that cannot work while the other does is no fault of the machine
    let choice = match (dw, nw) {
        (Some(true), _) => Check::new("route.choice", Status::Pass, "GDRSHIM_ROUTE=auto takes DMA-BUF (inbox RDMA stack, no peer-memory module needed)"),
        (_, Some(true)) => Check::new("route.choice", Status::Pass, "GDRSHIM_ROUTE=auto takes NV503C (nvidia-peermem is loaded)"),
        (Some(false), Some(false)) => Check::new("route.choice", Status::Fail, "no registration route works here: GPU memory cannot be registered for the NIC")
            .fix("make the DMA-BUF route work (the simplest: open 570+ driver, 5.12+ kernel, rdma-core 34+), or install MLNX_OFED with nvidia-peermem"),
        _ => Check::new("route.choice", Status::Info, "which route works could not be judged from this state"),
    };
    if choice.status == Status::Pass {
        for c in [&mut d, &mut n] {
            if c.status == Status::Fail {
                c.status = Status::Warn;
                c.summary.push_str(" (not needed: the other route works)");
            }
        }
    }
    vec![d, n, choice]
}
