//! The driver and GPU checks.

use crate::machine::*;
use crate::report::{Check, Report, Status};

/// Packages a rig holds (docs/runbook.md, P5) so an upgrade cannot replace the patched module or
/// split versions.
const HOLD: &[&str] = &[
    "nvidia-open-p2p-dkms",
    "nvidia-firmware",
    "nvidia-kernel-common",
    "nvidia-modprobe",
    "libnvidia-compute",
    "libnvidia-cfg1",
    "nvidia-persistenced",
];

/// One driver version everywhere, the right build of it, and its modules.
pub(super) fn driver(st: &State, r: &mut Report, kernel_version: &Option<String>) {
    loaded(st, r, kernel_version);
    if let Some(kv) = kernel_version {
        versions(st, r, kv);
    }
    dkms(st, r);
    if let (Some(m), Some(kv)) = (st.item("modinfo-nvidia").ok(), kernel_version) {
        modinfo(m, r, kv);
    }
    if let Some(holds) = st.item("holds").ok() {
        held(st, r, holds);
    }
}

/// The NVIDIA kernel module is loaded, and it is the open one.
fn loaded(st: &State, r: &mut Report, kernel_version: &Option<String>) {
    let proc_version = st.item("proc-driver-version");
    match (proc_version.ok(), &kernel_version) {
        (Some(t), Some(v)) => r.push(
            Check::new("driver.loaded", Status::Pass, format!("NVIDIA kernel module {v} loaded")).evidence(t.lines().next().unwrap_or("")),
        ),
        _ => r.push(
            Check::new(
                "driver.loaded",
                Status::Info,
                "no NVIDIA kernel module seen (no /proc/driver/nvidia/version): driver checks cannot be judged",
            )
            .evidence(proc_version.why_not("/proc/driver/nvidia/version")),
        ),
    }
    if let Some(t) = proc_version.ok() {
        let first = t.lines().next().unwrap_or("");
        if first.contains("Open Kernel Module") {
            r.push(
                Check::new(
                    "driver.open",
                    Status::Pass,
                    "the open kernel module (needed for the P2P patch and for DMA-BUF)",
                )
                .evidence(first),
            );
        } else {
            r.push(
                Check::new(
                    "driver.open",
                    Status::Fail,
                    "the proprietary kernel module is loaded: the P2P patch and DMA-BUF GDR need the open one",
                )
                .evidence(first)
                .fix("install the open module (for a GeForce: the P2P-patched open DKMS package)"),
            );
        }
    }
}

/// One version everywhere: kernel module, modinfo, user-space libraries, firmware, packages.
fn versions(st: &State, r: &mut Report, kv: &str) {
    let mut differ: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    if let Some(m) = st.item("modinfo-nvidia").ok() {
        if let Some(v) = field(m, "version") {
            seen.push(format!("modinfo {v}"));
            if v != kv {
                differ.push(format!("modinfo nvidia says {v} (the module the next boot loads)"));
            }
        }
    }
    if let Some(u) = st.item("user-libs").any() {
        for l in u.lines() {
            if let Some(v) =
                l.rsplit(".so.").next().filter(|v| v.contains('.') && l.contains(".so."))
            {
                if l.contains("libcuda.so") || l.contains("libnvidia-ml.so") {
                    seen.push(format!(
                        "{} {v}",
                        l.rsplit('/').next().unwrap_or(l).split(".so").next().unwrap_or("")
                    ));
                    if v != kv {
                        differ.push(l.to_string());
                    }
                }
            }
        }
    }
    if let Some(f) = st.item("firmware").any() {
        let vs: Vec<String> = f
            .lines()
            .filter_map(|l| l.trim_end_matches('/').rsplit('/').next().map(str::to_string))
            .collect();
        if !vs.is_empty() {
            seen.push(format!("firmware {}", vs.join(",")));
            if !vs.iter().any(|v| v == kv) {
                differ.push(format!("firmware folders {} (none is {kv})", vs.join(", ")));
            }
        }
    }
    if let Some(p) = st.item("packages").any() {
        let major = kv.split('.').next().unwrap_or("");
        for l in p.lines() {
            let t: Vec<&str> = l.split_whitespace().collect();
            if t.len() >= 3
                && l.ends_with("install ok installed")
                && (t[0].starts_with("nvidia-") || t[0].starts_with("libnvidia-"))
            {
                if let Some(pv) = version_token(t[1]) {
                    if pv.split('.').next() == Some(major) && pv != kv {
                        differ.push(format!("package {} {}", t[0], t[1]));
                    } else if pv.split('.').next() == Some(major) {
                        seen.push(format!("{} {}", t[0], t[1]));
                    }
                }
            }
        }
    }
    let st_ = if differ.is_empty() { Status::Pass } else { Status::Fail };
    let mut c = Check::new(
        "driver.versions",
        st_,
        if differ.is_empty() {
            format!("kernel module, user-space driver, firmware and packages agree on {kv} ({} sources)", seen.len() + 1)
        } else {
            format!("{} component(s) differ from the loaded module {kv}", differ.len())
        },
    );
    for d in differ.iter().take(8) {
        c = c.evidence(d.clone());
    }
    if !differ.is_empty() {
        c = c.fix(format!("install every NVIDIA component at exactly {kv} (module, libnvidia-compute, firmware); never mix branches"));
    }
    r.push(c);
}

/// One DKMS package builds nvidia.ko, and it is the P2P-patched one.
fn dkms(st: &State, r: &mut Report) {
    let dkms = st.item("dkms-status");
    match dkms.any() {
        Some(t) => {
            let nv: Vec<&str> = t.lines().filter(|l| l.starts_with("nvidia")).collect();
            let installed: Vec<&&str> = nv.iter().filter(|l| l.contains("installed")).collect();
            let providers: std::collections::BTreeSet<&str> =
                installed.iter().filter_map(|l| l.split('/').next()).collect();
            let patched = providers.iter().any(|p| p.contains("p2p"));
            if providers.len() > 1 {
                let mut c = Check::new("driver.dkms", Status::Fail, format!("{} DKMS packages build nvidia.ko: {}", providers.len(), providers.iter().copied().collect::<Vec<_>>().join(", "))).fix("remove the official nvidia-dkms-open (apt-get remove nvidia-dkms-open nvidia-kernel-source-open) so only one module exists");
                for l in &installed {
                    c = c.evidence(**l);
                }
                r.push(c);
            } else if patched {
                r.push(
                    Check::new(
                        "driver.dkms",
                        Status::Pass,
                        format!(
                            "the P2P-patched DKMS build provides nvidia ({})",
                            providers.iter().next().unwrap()
                        ),
                    )
                    .evidence(*installed[0]),
                );
            } else if let Some(l) = installed.first() {
                r.push(Check::new("driver.dkms", Status::Warn, "the official DKMS build provides nvidia, not a P2P-patched one: GeForce P2P and gdrshim's registrations need the patched module").evidence(**l).fix("install the patched package (for example nvidia-open-p2p-dkms) if this is a GeForce rig"));
            } else {
                r.push(
                    Check::new(
                        "driver.dkms",
                        Status::Info,
                        "no DKMS build of nvidia installed (driver from another source?)",
                    )
                    .evidence(t.lines().next().unwrap_or("(empty)")),
                );
            }
        }
        None => r.push(Check::new("driver.dkms", Status::Info, dkms.why_not("dkms status"))),
    }
}

/// The module the next boot loads is the one loaded.
fn modinfo(m: &str, r: &mut Report, kv: &str) {
    let file = field(m, "filename").unwrap_or_default();
    let ver = field(m, "version").unwrap_or_default();
    if ver == kv {
        r.push(Check::new(
            "driver.modinfo",
            Status::Pass,
            format!("modinfo and the loaded module agree ({ver}, {file})"),
        ));
    } else {
        r.push(
            Check::new(
                "driver.modinfo",
                Status::Fail,
                format!("modinfo says {ver} but {kv} is loaded: a reboot will switch modules"),
            )
            .evidence(file)
            .fix("reboot into the module you installed, or reinstall the one you mean to run"),
        );
    }
}

/// The driver packages a patched-driver rig holds are held.
fn held(st: &State, r: &mut Report, holds: &str) {
    let installed: Vec<&str> = st
        .item("packages")
        .any()
        .map(|p| {
            p.lines()
                .filter(|l| l.ends_with("install ok installed"))
                .filter_map(|l| l.split_whitespace().next())
                .collect()
        })
        .unwrap_or_default();
    let unheld: Vec<&str> = HOLD
        .iter()
        .copied()
        .filter(|p| installed.contains(p) && !holds.lines().any(|h| h.trim() == *p))
        .collect();
    let relevant = HOLD.iter().filter(|p| installed.contains(*p)).count();
    if relevant == 0 {
        r.push(Check::new(
            "driver.holds",
            Status::Info,
            "none of the driver packages a patched-driver rig holds is installed (driver from another source?)",
        ));
    } else if unheld.is_empty() {
        r.push(Check::new(
            "driver.holds",
            Status::Pass,
            format!("all {relevant} installed driver packages a patched-driver rig holds are held"),
        ));
    } else {
        r.push(
            Check::new(
                "driver.holds",
                Status::Warn,
                format!("installed but not held: {}", unheld.join(" ")),
            )
            .fix(format!("sudo apt-mark hold {}", unheld.join(" "))),
        );
    }
}

/// The GPUs: model, BAR1, whether they are busy. Returns them for the checks that follow.
pub(super) fn gpus(st: &State, r: &mut Report) -> Vec<Gpu> {
    let smi = st.item("nvidia-smi-q");
    let (_, gpus) = smi.ok().map(parse_smi_q).unwrap_or_default();
    if gpus.is_empty() {
        r.push(
            Check::new(
                "gpu.model",
                Status::Info,
                "no GPU seen: model, BAR1 and P2P cannot be judged",
            )
            .evidence(smi.why_not("nvidia-smi -q")),
        );
    } else {
        let geforce = gpus.iter().filter(|g| g.is_geforce()).count();
        let names: Vec<String> = gpus.iter().map(|g| format!("{} ({})", g.name, g.arch)).collect();
        if geforce > 0 {
            r.push(
                Check::new(
                    "gpu.model",
                    Status::Info,
                    format!(
                        "{} GeForce GPU(s): GDR needs gdrshim preloaded (register mode, its default) by a route that works here (route.* below); it answers stock NCCL's GPU-side gate itself (GDRSHIM_ADVERTISE_GDR=0 turns that off; or patch 0001), on sm_90 and later only with NCCL_NET_FORCE_FLUSH=1 (gdr-env.sh sets it); the P2P-patched module is for GPU-to-GPU P2P",
                        geforce
                    ),
                )
                .evidence(names.join("; ")),
            );
        } else if gpus.iter().all(|g| g.is_hopper_or_newer_datacenter()) {
            r.push(Check::new("gpu.model", Status::Info, "datacenter Hopper/Blackwell GPUs: libcuda registers natively; use DMA-BUF GPUDirect RDMA (the open module, a kernel with the options rdma.kernel_config checks, inbox rdma-core; no nvidia_drm needed), no gdrshim and no MLNX_OFED needed").evidence(names.join("; ")));
        } else {
            r.push(Check::new("gpu.model", Status::Info, "datacenter GPUs: GPUDirect RDMA is native (nvidia_peermem with MLNX_OFED, or DMA-BUF with the open module); gdrshim is not needed").evidence(names.join("; ")));
        }
        for (i, g) in gpus.iter().enumerate() {
            match (g.bar1_mib, g.fb_mib) {
                (Some(b), Some(f)) if b >= f => r.push(Check::new(&format!("gpu{i}.bar1"), Status::Pass, format!("BAR1 {b} MiB ≥ memory {f} MiB: Resizable BAR is on"))),
                (Some(b), Some(f)) => r.push(
                    Check::new(&format!("gpu{i}.bar1"), Status::Warn, format!("BAR1 {b} MiB < memory {f} MiB: Resizable BAR is off or limited"))
                        .fix("enable Above 4G Decoding and Resizable BAR in the BIOS; until then keep NCCL_LOCAL_REGISTER=0 and NCCL_GRAPH_REGISTER=0 (gdr-env.sh does) so registrations do not exhaust BAR1"),
                ),
                _ => r.push(Check::new(&format!("gpu{i}.bar1"), Status::Info, "BAR1 size not in nvidia-smi -q")),
            }
        }
    }
    let apps = st.item("nvidia-smi-apps");
    if let Some(a) = apps.ok() {
        let busy: Vec<&str> = a.lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
        let containers: Vec<&str> = st
            .item("docker-ps")
            .ok()
            .map(|d| d.lines().filter(|l| !l.trim().is_empty()).collect())
            .unwrap_or_default();
        if busy.is_empty() && containers.is_empty() {
            r.push(Check::new(
                "gpu.busy",
                Status::Pass,
                "no compute process on the GPUs and no running container",
            ));
        } else {
            let mut c = Check::new(
                "gpu.busy",
                Status::Warn,
                format!("{} GPU process(es), {} container(s) running: stop them before any driver change", busy.len(), containers.len()),
            )
            .fix("stop the jobs through their own managers; never unload the module under a running job");
            for l in busy.iter().chain(containers.iter()).take(5) {
                c = c.evidence(*l);
            }
            r.push(c);
        }
    }
    gpus
}
