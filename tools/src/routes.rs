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

/// One kernel option a route needs, with the source that shows it. Parents come before their
/// children: a kernel cannot have a child option without its parent, so a missing parent is named
/// and its children are not.
pub struct KernelOption {
    pub name: &'static str,
    pub parent: Option<&'static str>,
    /// What needs it.
    pub needed_by: &'static str,
    /// Where that is shown (source file and function, or the run).
    pub source: &'static str,
}

/// The DMA-BUF route's kernel options, the one table the doctor's `route.dmabuf` and
/// `rdma.kernel_config` (and so the self-test's step 1) read; the README's route table names the
/// same (a doctor test checks that).
pub const DMABUF_KERNEL_OPTIONS: &[KernelOption] = &[
    KernelOption {
        name: "CONFIG_DMA_SHARED_BUFFER",
        parent: None,
        needed_by: "RM's dma-buf export",
        source: "open-gpu-kernel-modules kernel-open/nvidia/nv-dmabuf.c: nv_dma_buf_export() is built only #if defined(CONFIG_DMA_SHARED_BUFFER), else NV_ERR_NOT_SUPPORTED",
    },
    KernelOption {
        name: "CONFIG_INFINIBAND",
        parent: None,
        needed_by: "the RDMA core (ib_core)",
        source: "linux drivers/infiniband/Kconfig: menuconfig INFINIBAND; every option below sits inside `if INFINIBAND`",
    },
    KernelOption {
        name: "CONFIG_INFINIBAND_USER_ACCESS",
        parent: Some("CONFIG_INFINIBAND"),
        needed_by: "verbs from user space (ib_uverbs)",
        source: "linux drivers/infiniband/Kconfig: config INFINIBAND_USER_ACCESS",
    },
    KernelOption {
        name: "CONFIG_INFINIBAND_USER_MEM",
        parent: Some("CONFIG_INFINIBAND_USER_ACCESS"),
        needed_by: "user memory regions (ib_umem, ib_umem_dmabuf)",
        source: "linux drivers/infiniband/Kconfig: INFINIBAND_USER_MEM depends on INFINIBAND_USER_ACCESS != n",
    },
    KernelOption {
        name: "CONFIG_INFINIBAND_ON_DEMAND_PAGING",
        parent: Some("CONFIG_INFINIBAND_USER_MEM"),
        needed_by: "mlx5's dma-buf MRs",
        source: "linux drivers/infiniband/hw/mlx5/mr.c: mlx5_ib_reg_user_mr_dmabuf() returns -EOPNOTSUPP unless INFINIBAND_USER_MEM and INFINIBAND_ON_DEMAND_PAGING",
    },
];

/// Whether `nvidia_drm modeset=1` is needed for DMA-BUF export: it is not (the doctor says so
/// where it records modeset).
pub const MODESET_NOT_NEEDED: &str = "RM's dma-buf export does not read nvidia_drm's modeset (nv-dmabuf.c in NVIDIA's open kernel module); on an H200 exports worked with no nvidia_drm loaded at all (gdrshim's docs/nvidia-abi.md, S10)";

/// What of [`DMABUF_KERNEL_OPTIONS`] the kernel config lacks, parents first; a child whose parent
/// is missing is left out (the parent is the cause).
pub fn kernel_lacks(config: &str) -> Vec<&'static KernelOption> {
    let mut lacks: Vec<&'static KernelOption> = Vec::new();
    for o in DMABUF_KERNEL_OPTIONS {
        let parent_missing = o.parent.is_some_and(|p| !option_set(config, p));
        if !option_set(config, o.name) && !parent_missing {
            lacks.push(o);
        }
    }
    lacks
}

/// `name=y` or `=m` in the config, or a child of it set (Kconfig allows no child without its
/// parent; a record of an older gdr-state-record lists only the children).
fn option_set(config: &str, name: &str) -> bool {
    config.lines().any(|l| l.strip_prefix(name).is_some_and(|v| v == "=y" || v == "=m"))
        || DMABUF_KERNEL_OPTIONS
            .iter()
            .any(|o| o.parent == Some(name) && option_set(config, o.name))
}

/// "CONFIG_INFINIBAND is not set (the RDMA core (ib_core))", one per missing option, parents first.
fn lacks_text(lacks: &[&KernelOption]) -> String {
    lacks
        .iter()
        .map(|o| format!("{} is not set ({})", o.name, o.needed_by))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel-config need of the DMA-BUF route, as [`kernel_config_check`] and `route.dmabuf` say it.
fn kernel_config_need(st: &State) -> Need {
    match st.item("kernel-config").ok() {
        Some(t) => {
            let lacks = kernel_lacks(t);
            if lacks.is_empty() {
                let all: Vec<&str> = DMABUF_KERNEL_OPTIONS
                    .iter()
                    .map(|o| o.name.trim_start_matches("CONFIG_"))
                    .collect();
                Need::Met(format!("kernel has {}", all.join(", ")))
            } else {
                Need::Unmet(
                    format!("kernel: {}", lacks_text(&lacks)),
                    "use a distribution kernel built with them (Ubuntu's generic kernels are)",
                )
            }
        }
        None => Need::Unknown(st.item("kernel-config").why_not("kernel config")),
    }
}

/// `rdma.kernel_config`: the same table, for every machine (datacenter GPUs export natively
/// through the same kernel paths).
pub fn kernel_config_check(st: &State) -> Check {
    let mut c = match kernel_config_need(st) {
        Need::Met(w) => Check::new("rdma.kernel_config", Status::Pass, w),
        Need::Unmet(w, fix) => Check::new(
            "rdma.kernel_config",
            Status::Warn,
            format!("{w}: the DMA-BUF route cannot work"),
        )
        .fix(fix),
        Need::Unknown(w) => return Check::new("rdma.kernel_config", Status::Info, w),
    };
    if let Some(t) = st.item("kernel-config").ok() {
        for o in kernel_lacks(t) {
            c = c.evidence(format!("{}: {}", o.name, o.source));
        }
    }
    c
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
    v.push(kernel_config_need(st));
    match rdma_core(st) {
        Some((p, major)) if major >= 34 => {
            v.push(Need::Met(format!("{p} (ibv_reg_dmabuf_mr, rdma-core 34+)")))
        }
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
                v.push(Need::Unmet(
                    "no RDMA driver loaded (mlx5_ib, ib_uverbs)".into(),
                    "sudo modprobe mlx5_ib ib_uverbs",
                ));
            }
        }
        None => v.push(Need::Unknown(st.item("lsmod").why_not("lsmod"))),
    }
    v
}

fn nv503c_needs(st: &State) -> Vec<Need> {
    let params = st.item("module-params").any().unwrap_or("");
    let present = |p: &str| params.lines().any(|l| l.starts_with(p) && !l.contains("No such file"));
    let peer_symbol = st
        .item("kallsyms-peer")
        .any()
        .and_then(|t| t.trim().lines().next()?.trim().parse::<u32>().ok());
    let mut v = Vec::new();
    if present("/sys/module/nvidia_peermem/version")
        || present("/sys/kernel/mm/memory_peers/nv_mem/version")
    {
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
        v.push(Need::Unmet(
            "nvidia-peermem not loaded".into(),
            "sudo modprobe nvidia-peermem (needs MLNX_OFED/DOCA-OFED)",
        ));
    }
    v
}

/// One route's check from its needs, and whether it works.
fn verdict(id: &str, name: &str, needs: &[Need]) -> (Check, Option<bool>) {
    let unmet: Vec<(&String, &str)> = needs
        .iter()
        .filter_map(|n| if let Need::Unmet(w, f) = n { Some((w, *f)) } else { None })
        .collect();
    let unknown: Vec<&String> = needs
        .iter()
        .filter_map(|n| if let Need::Unknown(w) = n { Some(w) } else { None })
        .collect();
    let mut c = if let Some((_, fix)) = unmet.first() {
        Check::new(
            id,
            Status::Fail,
            format!(
                "{name} route cannot work here: {}",
                unmet.iter().map(|u| u.0.as_str()).collect::<Vec<_>>().join("; ")
            ),
        )
        .fix(*fix)
    } else if !unknown.is_empty() {
        Check::new(
            id,
            Status::Info,
            format!(
                "{name} route could not be judged: {}",
                unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
            ),
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
