//! The platform checks: P2P between GPUs, boot and kernel, and the RDMA side of each route.

use crate::machine::*;
use crate::report::{Check, Report, Status};

/// P2P between the GPUs, ACS, IOMMU, Secure Boot, kernel headers.
pub(super) fn p2p_and_boot(
    st: &State,
    r: &mut Report,
    gpus: &[Gpu],
    kernel_version: &Option<String>,
) {
    p2p_matrix(st, r, gpus);
    acs_and_iommu(st, r);
    secure_boot(st, r);
    if let Some(h) = st.item("headers").any() {
        kernel_headers(h, r, kernel_version.is_some());
    }
}

/// Every pair of GPUs can do P2P reads (nvidia-smi topo -p2p r).
fn p2p_matrix(st: &State, r: &mut Report, gpus: &[Gpu]) {
    match st.item("nvidia-smi-topo-p2p-r").ok() {
        Some(t) => {
            let pairs = parse_p2p_matrix(t);
            if gpus.len() == 1 || (pairs.is_empty() && t.contains("GPU0")) {
                r.push(Check::new(
                    "p2p.matrix",
                    Status::Info,
                    "one GPU: P2P between GPUs cannot be judged here",
                ));
            } else if pairs.is_empty() {
                r.push(Check::new(
                    "p2p.matrix",
                    Status::Info,
                    "no P2P matrix in nvidia-smi topo -p2p r",
                ));
            } else {
                let bad: Vec<&(String, String, String)> =
                    pairs.iter().filter(|p| p.2 != "OK").collect();
                let table: Vec<String> =
                    pairs.iter().map(|(a, b, c)| format!("{a}-{b} {c}")).collect();
                if bad.is_empty() {
                    r.push(
                        Check::new(
                            "p2p.matrix",
                            Status::Pass,
                            format!("all {} GPU pairs OK for P2P reads", pairs.len()),
                        )
                        .evidence(table.join(", ")),
                    );
                } else {
                    let mut c = Check::new(
                        "p2p.matrix",
                        Status::Fail,
                        format!("{} of {} GPU pairs cannot do P2P", bad.len(), pairs.len()),
                    );
                    for (a, b, code) in bad.iter().take(6) {
                        c = c.evidence(format!("{a}-{b}: {code} ({})", p2p_code_meaning(code)));
                    }
                    r.push(c.fix(
                        "load the P2P-patched open module (doctor's driver.dkms), enable Above 4G Decoding/ReBAR, and check IOMMU/ACS",
                    ));
                }
            }
        }
        None => r.push(Check::new(
            "p2p.matrix",
            Status::Info,
            st.item("nvidia-smi-topo-p2p-r").why_not("nvidia-smi topo -p2p r"),
        )),
    }
}

/// No PCIe bridge redirects peer requests, and the IOMMU does not translate DMA.
fn acs_and_iommu(st: &State, r: &mut Report) {
    let cmdline = st.item("cmdline").ok().unwrap_or("");
    let iommu_on = cmdline
        .split_whitespace()
        .any(|w| w == "intel_iommu=on" || w == "amd_iommu=on" || w == "iommu=force");
    let passthrough = cmdline.split_whitespace().any(|w| w == "iommu=pt");
    let acs_redirect: Vec<&str> = st
        .item("acs")
        .any()
        .map(|a| {
            a.lines()
                .filter(|l| {
                    l.contains("ACSCtl") && (l.contains("ReqRedir+") || l.contains("CmpltRedir+"))
                })
                .collect()
        })
        .unwrap_or_default();
    if !acs_redirect.is_empty() {
        r.push(
            Check::new(
                "p2p.acs",
                Status::Warn,
                format!("{} PCIe bridge(s) redirect peer requests to the root complex (ACS)", acs_redirect.len()),
            )
            .evidence(acs_redirect[0])
            .fix("disable ACS redirection on the bridges between the GPUs and the NIC (BIOS, or setpci), or P2P/GDR slows down or hangs"),
        );
    } else if st.item("acs").ok().is_some() {
        r.push(Check::new(
            "p2p.acs",
            Status::Pass,
            "no ACS request redirection seen on PCIe bridges",
        ));
    } else {
        r.push(Check::new("p2p.acs", Status::Info, st.item("acs").why_not("lspci -vvv (ACS)")));
    }
    if iommu_on && !passthrough {
        r.push(
            Check::new(
                "p2p.iommu",
                Status::Warn,
                "the IOMMU translates DMA (no iommu=pt): peer traffic may be remapped or blocked",
            )
            .evidence(cmdline)
            .fix(
                "add iommu=pt to the kernel command line, or turn the IOMMU off for these devices",
            ),
        );
    } else if !cmdline.is_empty() {
        r.push(Check::new(
            "p2p.iommu",
            Status::Pass,
            if passthrough {
                "IOMMU in pass-through mode"
            } else {
                "IOMMU not forced on in the kernel command line"
            },
        ));
    }
}

/// Secure Boot off, or a self-built module that cannot load.
fn secure_boot(st: &State, r: &mut Report) {
    match st.item("secure-boot").any() {
        Some(t) if t.contains("SecureBoot enabled") => r.push(
            Check::new(
                "boot.secure_boot",
                Status::Warn,
                "Secure Boot is on: a self-built (DKMS) module loads only if signed with an enrolled key",
            )
            .evidence(t.lines().next().unwrap_or(""))
            .fix("enrol the DKMS signing key (mokutil --import /var/lib/dkms/mok.pub) or turn Secure Boot off"),
        ),
        Some(t) if t.contains("SecureBoot disabled") => r.push(Check::new("boot.secure_boot", Status::Pass, "Secure Boot is off")),
        _ => r.push(Check::new("boot.secure_boot", Status::Info, st.item("secure-boot").why_not("mokutil --sb-state"))),
    }
}

/// Headers for the running kernel, for DKMS to build the module (judged where a driver is).
fn kernel_headers(h: &str, r: &mut Report, driver_here: bool) {
    if !driver_here {
        r.push(Check::new(
            "kernel.headers",
            Status::Info,
            "no NVIDIA module here: kernel headers (for DKMS) not judged",
        ));
    } else if h.contains("install ok installed") {
        r.push(Check::new(
            "kernel.headers",
            Status::Pass,
            "headers for the running kernel are installed (DKMS can build)",
        ));
    } else {
        r.push(
            Check::new(
                "kernel.headers",
                Status::Warn,
                "no headers for the running kernel: DKMS cannot build the module for it",
            )
            .evidence(
                h.lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("dpkg -s linux-headers-$(uname -r): not installed"),
            )
            .fix("sudo apt-get install linux-headers-$(uname -r)"),
        );
    }
}

/// The NIC, the routes, memlock, device nodes, Xids.
pub(super) fn rdma(st: &State, r: &mut Report, gpus: &[Gpu], kernel_version: &Option<String>) {
    let driver_here = kernel_version.is_some();
    routes_and_paths(st, r, gpus, kernel_version);
    let hca_here = hca_ports(st, r);
    super::container::memlock(st, r, driver_here || hca_here);
    if let Some(d) = st.item("dev-nodes").any() {
        device_nodes(d, r, driver_here);
    }
    kernel_xid(st, r);
}

/// Each route's checks, nvidia_drm's modeset (seen, not needed), the kernel's configuration,
/// and the PCIe paths GPU↔NIC.
fn routes_and_paths(st: &State, r: &mut Report, gpus: &[Gpu], kernel_version: &Option<String>) {
    let params = st.item("module-params").any().unwrap_or("");
    let param = |p: &str| {
        params
            .lines()
            .find(|l| l.starts_with(p))
            .and_then(|l| l.split_once(": "))
            .map(|(_, v)| v.trim().to_string())
    };
    for c in crate::routes::checks(st, kernel_version.as_deref(), gpus) {
        r.push(c);
    }
    // recorded because the DMA-BUF note this project started from asked for it; no route needs it
    // (docs/nvidia-abi.md, S10)
    let modeset = match param("/sys/module/nvidia_drm/parameters/modeset").as_deref() {
        Some("Y") => "nvidia_drm modeset=1".to_string(),
        Some("N") => "nvidia_drm modeset=0".to_string(),
        _ => "nvidia_drm not loaded".to_string(),
    };
    r.push(
        Check::new("rdma.modeset", Status::Info, format!("{modeset}: not needed for DMA-BUF"))
            .evidence(crate::routes::MODESET_NOT_NEEDED),
    );
    r.push(crate::routes::kernel_config_check(st));
    for c in crate::topology::gdr_level_checks(st) {
        r.push(c);
    }
    if let Some(c) = crate::topology::p2p_reads_check(st) {
        r.push(c);
    }
}

/// The HCAs and each port's state; whether any HCA was seen.
fn hca_ports(st: &State, r: &mut Report) -> bool {
    let devinfo = st.item("ibv-devinfo");
    match devinfo.any() {
        Some(t) if t.contains("No IB devices found") || parse_ibv_devinfo(t).is_empty() => r.push(
            Check::new(
                "rdma.hca",
                Status::Info,
                "no RDMA device (HCA) seen: ports and GIDs cannot be judged",
            )
            .evidence(t.lines().next().unwrap_or("")),
        ),
        Some(t) => {
            let ports = parse_ibv_devinfo(t);
            let hcas: std::collections::BTreeSet<&str> =
                ports.iter().map(|p| p.hca.as_str()).collect();
            r.push(Check::new(
                "rdma.hca",
                Status::Pass,
                format!(
                    "{} HCA(s), {} port(s): {}",
                    hcas.len(),
                    ports.len(),
                    hcas.iter().copied().collect::<Vec<_>>().join(" ")
                ),
            ));
            let active = ports.iter().filter(|p| p.state == "PORT_ACTIVE").count();
            for p in &ports {
                r.push(port_check(p, active));
            }
        }
        None => r.push(Check::new("rdma.hca", Status::Info, devinfo.why_not("ibv_devinfo"))),
    }
    devinfo.any().is_some_and(|t| !parse_ibv_devinfo(t).is_empty())
}

/// One port: active (with a RoCE v2 IPv4 GID on Ethernet), or why not; `active` ports of all.
fn port_check(p: &Port, active: usize) -> Check {
    let id = format!("rdma.{}.{}", p.hca, p.port);
    let ib = p.link_layer == "InfiniBand";
    if p.state == "PORT_ACTIVE" {
        let v2: Vec<&(u32, String, String)> = p
            .gids
            .iter()
            .filter(|g| g.2.contains("RoCE v2") && g.1.starts_with("::ffff:"))
            .collect();
        let mut c = Check::new(
            &id,
            Status::Pass,
            format!("{} port {} active ({})", p.hca, p.port, p.link_layer),
        );
        if !ib {
            c = match v2.first() {
                Some(g) => Check::new(
                    &id,
                    Status::Pass,
                    format!("{} port {} active (RoCE); NCCL_IB_GID_INDEX={} is its RoCE v2 IPv4 GID ({})", p.hca, p.port, g.0, g.1),
                ),
                None => Check::new(
                    &id,
                    Status::Warn,
                    format!("{} port {} active (RoCE) but no RoCE v2 IPv4 GID: no IP address on its interface?", p.hca, p.port),
                )
                .fix("give the port's netdev an IPv4 address; then pick the RoCE v2 GID index for NCCL_IB_GID_INDEX"),
            };
        }
        c
    } else if ib && p.state == "PORT_INIT" && (p.lid == "0" || p.sm_lid == "0") {
        Check::new(&id, Status::Fail, format!("{} port {} stuck in INIT with LID 0: no subnet manager on the fabric", p.hca, p.port))
            .fix("sudo apt install opensm && sudo systemctl start opensm (ports go Active within seconds)")
    } else if p.phys_state == "POLLING" || p.state == "PORT_DOWN" {
        let why = if active > 0 {
            "while other ports are Active: a physical-layer problem (cable, transceiver, seating)"
        } else {
            "no port is Active: check cables and the switch"
        };
        Check::new(
            &id,
            Status::Fail,
            format!("{} port {} {} / {} {why}", p.hca, p.port, p.state, p.phys_state),
        )
        .fix("reseat or replace the cable/transceiver; check the switch port")
    } else {
        Check::new(
            &id,
            Status::Warn,
            format!("{} port {} in state {} ({})", p.hca, p.port, p.state, p.phys_state),
        )
    }
}

/// The NVIDIA and uverbs device nodes are there.
fn device_nodes(d: &str, r: &mut Report, driver_here: bool) {
    let has = |n: &str| d.lines().any(|l| l.trim_end().ends_with(n));
    let mut missing: Vec<&str> =
        ["/dev/nvidiactl", "/dev/nvidia-uvm"].into_iter().filter(|n| !has(n)).collect();
    if !d.lines().any(|l| {
        l.contains("/dev/nvidia") && l.trim_end().chars().last().is_some_and(|c| c.is_ascii_digit())
    }) {
        missing.push("/dev/nvidiaN");
    }
    let uverbs = d.lines().any(|l| l.contains("uverbs"));
    if !missing.is_empty() && !driver_here {
        r.push(Check::new(
            "devices.nodes",
            Status::Info,
            format!("no NVIDIA device nodes ({}) and no NVIDIA module: not a GPU machine, or the driver is not loaded", missing.join(" ")),
        ));
    } else if !missing.is_empty() {
        r.push(
            Check::new("devices.nodes", Status::Fail, format!("missing device nodes: {}", missing.join(" ")))
                .fix("on the host: sudo nvidia-modprobe -u -c=0; in a container: --device for each /dev/nvidia* node"),
        );
    } else if !uverbs {
        r.push(
            Check::new("devices.nodes", Status::Warn, "NVIDIA nodes present, no /dev/infiniband/uverbs*: verbs cannot open the HCA here")
                .fix("in a container add --device /dev/infiniband/uverbsN (and rdma_cm), --cap-add=IPC_LOCK; on the host load ib_uverbs"),
        );
    } else {
        r.push(Check::new("devices.nodes", Status::Pass, "NVIDIA and uverbs device nodes present"));
    }
}

/// No Xid in the kernel log since boot.
fn kernel_xid(st: &State, r: &mut Report) {
    // a kernel log that could not be read is "could not check", never a pass
    match st.item("dmesg-nvidia") {
        Item::Missing => {}
        item => match item.ok() {
            Some(d) => match d.lines().find(|l| l.contains("Xid")) {
                Some(l) => r.push(
                    Check::new("kernel.xid", Status::Warn, "Xid errors in the kernel log since boot")
                        .evidence(l)
                        .fix("an Xid means the GPU faulted; look the number up before trusting this setup"),
                ),
                None => r.push(Check::new("kernel.xid", Status::Pass, "no Xid in the kernel log")),
            },
            None => r.push(
                Check::new("kernel.xid", Status::Warn, "could not check: the kernel log was not readable")
                    .evidence(item.why_not("dmesg"))
                    .fix("run the doctor as root, or read the log with `sudo journalctl -k | grep Xid`"),
            ),
        },
    }
}
