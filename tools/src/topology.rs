//! NCCL's view of the PCIe path between each GPU and each RDMA device, from the sysfs paths the
//! record holds: which NIC NCCL would take with GDR at its default `NCCL_NET_GDR_LEVEL`, what level
//! it needs otherwise and what that costs; and the platforms where a NIC's reads of GPU memory
//! through the CPU fail while its writes work.

use crate::machine::{parse_cpu, parse_pci_paths, PciDev, State};
use crate::report::{Check, Status};

/// NCCL's path types between a GPU and a NIC (src/graph/topo.h: PIX, PXB, PHB, SYS; nvidia-smi's
/// NODE, two host bridges of one NUMA node, is PHB for NCCL: one CPU node per NUMA node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathType {
    /// At most one PCIe switch between them.
    Pix,
    /// Several PCIe bridges, without the host bridge.
    Pxb,
    /// Through the CPU's PCIe host bridge (different root ports, or root complexes of one NUMA node).
    Phb,
    /// Across the link between CPU sockets (NUMA nodes).
    Sys,
}

impl PathType {
    pub fn name(self) -> &'static str {
        match self {
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
        }
    }
    fn meaning(self) -> &'static str {
        match self {
            PathType::Pix => "one PCIe switch between them",
            PathType::Pxb => "several PCIe switches, not through the CPU",
            PathType::Phb => "through the CPU's PCIe root complex",
            PathType::Sys => "across the link between CPU sockets",
        }
    }
}

/// NCCL's default `NCCL_NET_GDR_LEVEL`: GDR only up to PXB (NCCL 2.28 src/graph/paths.cc,
/// ncclTopoCheckGdr: `int netGdrLevel = PATH_PXB;` unless NCCL_NET_GDR_LEVEL is set).
pub const NCCL_DEFAULT_GDR_LEVEL: PathType = PathType::Pxb;

/// The path type between two devices by their sysfs paths and NUMA nodes.
pub fn classify(a: &PciDev, b: &PciDev) -> PathType {
    if a.path.first() != b.path.first() {
        // two root complexes: one NUMA node is one CPU for NCCL
        return if a.numa.is_some() && a.numa == b.numa { PathType::Phb } else { PathType::Sys };
    }
    let common = a.path.iter().zip(&b.path).take_while(|(x, y)| x == y).count();
    if common <= 1 {
        return PathType::Phb; // apart right below the root bus: different root ports
    }
    // below the last bridge they share: a switch's downstream port and the device is one switch
    let (below_a, below_b) = (a.path.len() - common, b.path.len() - common);
    if below_a <= 2 && below_b <= 2 {
        PathType::Pix
    } else {
        PathType::Pxb
    }
}

/// Per GPU, the closest RDMA device and the path to it (the first of equals, as NCCL ranks them).
pub fn closest_nics(devs: &[PciDev]) -> Vec<(&PciDev, Option<(&PciDev, PathType)>)> {
    let nics: Vec<&PciDev> = devs.iter().filter(|d| !d.gpu).collect();
    devs.iter()
        .filter(|d| d.gpu)
        .map(|g| (g, nics.iter().map(|n| (*n, classify(g, n))).min_by_key(|(_, p)| *p)))
        .collect()
}

/// `topo.<gpu>`: which NIC NCCL takes with GDR at its default level, or the level it needs.
pub fn gdr_level_checks(st: &State) -> Vec<Check> {
    let Some(text) = st.item("pci-paths").ok() else {
        return vec![Check::new(
            "topo.paths",
            Status::Info,
            st.item("pci-paths").why_not("PCIe paths of GPUs and NICs"),
        )];
    };
    let devs = parse_pci_paths(text);
    if !devs.iter().any(|d| d.gpu) {
        return vec![Check::new("topo.paths", Status::Info, "no GPU in the recorded PCIe paths")];
    }
    let mut out = Vec::new();
    for (g, best) in closest_nics(&devs) {
        let id = format!("topo.{}", g.name);
        let path = format!("GPU {} /sys/devices/{}", g.name, g.path.join("/"));
        let c = match best {
            None => Check::new(&id, Status::Info, format!("GPU {}: no RDMA device recorded, no GDR path to judge", g.name)),
            Some((n, p)) if p <= NCCL_DEFAULT_GDR_LEVEL => Check::new(
                &id,
                Status::Pass,
                format!("GPU {} ↔ {}: {} ({}): NCCL uses GDR at its default NCCL_NET_GDR_LEVEL (PXB)", g.name, n.name, p.name(), p.meaning()),
            )
            .evidence(format!("{} /sys/devices/{}", n.name, n.path.join("/"))),
            Some((n, p)) => Check::new(
                &id,
                Status::Warn,
                format!(
                    "GPU {} ↔ {}: {} ({}): NCCL turns GDR off at its default NCCL_NET_GDR_LEVEL (PXB); it needs NCCL_NET_GDR_LEVEL={}",
                    g.name,
                    n.name,
                    p.name(),
                    p.meaning(),
                    p.name()
                ),
            )
            .evidence(format!("{} /sys/devices/{}", n.name, n.path.join("/")))
            .fix(match p {
                PathType::Sys => "NCCL_NET_GDR_LEVEL=SYS (scripts/gdr-env.sh sets it): every transfer then crosses the socket link, often slower than NCCL's copy through host memory; better a NIC on the GPU's socket",
                _ => "NCCL_NET_GDR_LEVEL=PHB or SYS (scripts/gdr-env.sh sets SYS): transfers then go through the CPU's root complex (its peer-to-peer bandwidth; see p2p.reads); best a NIC under the GPU's PCIe switch",
            }),
        };
        out.push(c.evidence(path));
    }
    out
}

/// One kind of platform where a NIC's PCIe reads of GPU memory through the CPU fail while its
/// writes work, with the source that says so.
pub struct ReadsFail {
    pub vendor: &'static str,
    /// Any of these in the CPU's model name.
    pub model_names: &'static [&'static str],
    pub what: &'static str,
    pub source: &'static str,
}

pub const READS_FAIL: &[ReadsFail] = &[ReadsFail {
    vendor: "GenuineIntel",
    model_names: &["Core(TM)", "Core(TM) Ultra", "Pentium", "Celeron"],
    what: "an Intel client CPU",
    source: "NVIDIA/open-gpu-kernel-modules#1253 (NVIDIA: \"Intel client CPUs are known to only support PCIe P2P writes\"; GPUDirect RDMA READ from BAR1 fails on Arrow Lake-S/Z890 while writes work)",
}];

/// The entry of [`READS_FAIL`] this CPU is, if any.
pub fn reads_fail_on(vendor: &str, model_name: &str) -> Option<&'static ReadsFail> {
    READS_FAIL
        .iter()
        .find(|e| e.vendor == vendor && e.model_names.iter().any(|m| model_name.contains(m)))
}

/// The self-test's cause for a READ that fails while the WRITEs pass, on such a CPU.
pub fn read_failure_cause(vendor: &str, model_name: &str) -> Option<String> {
    reads_fail_on(vendor, model_name).map(|e| {
        format!(
            "this is {} ({model_name}): a NIC's PCIe reads of GPU memory through the CPU fail there while its writes work ({}); put the GPU and the NIC under one PCIe switch",
            e.what, e.source
        )
    })
}

/// `p2p.reads`: on a platform of [`READS_FAIL`], where a GPU reaches its NIC through the CPU.
pub fn p2p_reads_check(st: &State) -> Option<Check> {
    let cpu = parse_cpu(st.item("cpu").ok()?);
    let entry = reads_fail_on(&cpu.vendor, &cpu.model_name)?;
    let devs = st.item("pci-paths").ok().map(parse_pci_paths).unwrap_or_default();
    let through_cpu: Vec<String> = closest_nics(&devs)
        .into_iter()
        .filter_map(|(g, b)| {
            b.filter(|(_, p)| *p >= PathType::Phb)
                .map(|(n, p)| format!("GPU {} ↔ {}: {}", g.name, n.name, p.name()))
        })
        .collect();
    let c = if devs.is_empty() || !through_cpu.is_empty() {
        Check::new(
            "p2p.reads",
            Status::Warn,
            format!(
                "P2P reads may fail: run the self-test ({}: a NIC's reads of GPU memory through the CPU fail while writes work)",
                entry.what
            ),
        )
        .fix("scripts/selftest: its READ step shows it; if it fails, put the GPU and the NIC under one PCIe switch")
    } else {
        Check::new(
            "p2p.reads",
            Status::Pass,
            format!("{}, but every GPU shares a PCIe switch with its NIC: the NIC's reads stay below the CPU", entry.what),
        )
    };
    let mut c = c.evidence(format!("{} {}", cpu.vendor, cpu.model_name)).evidence(entry.source);
    for t in through_cpu {
        c = c.evidence(t);
    }
    Some(c)
}
