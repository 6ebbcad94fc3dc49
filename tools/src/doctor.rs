//! `doctor`: the preflight checks of both seed runbooks (4090 P2P + GDR, and DMA-BUF on Hopper),
//! judged from a saved state folder (`scripts/gdr-state-record save`; `scripts/doctor` saves one
//! of the live machine first). Reading only what is there: what could not be seen is INFO, with
//! the reason, never a PASS.

use crate::report::{strip_ansi, Check, Report, Status};
use std::collections::BTreeMap;
use std::path::Path;

/// One recorded item: the output of one command of the record script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// Not in the folder at all (older record).
    Missing,
    /// The command is not installed there.
    NotRun(String),
    /// The command ran; its output and exit status.
    Ran { text: String, status: i32 },
}

impl Item {
    fn parse(raw: &str) -> Item {
        if let Some(rest) = raw.strip_prefix("# not run: ") {
            return Item::NotRun(rest.split_whitespace().next().unwrap_or("").to_string());
        }
        let mut status = 0;
        let mut lines: Vec<&str> = raw.lines().collect();
        if let Some(last) = lines.last() {
            if let Some(n) = last.strip_prefix("# exit status ") {
                status = n.trim().parse().unwrap_or(1);
                lines.pop();
            }
        }
        Item::Ran { text: strip_ansi(&lines.join("\n")), status }
    }
    /// The output of a command that succeeded.
    pub fn ok(&self) -> Option<&str> {
        match self {
            Item::Ran { text, status: 0 } => Some(text),
            _ => None,
        }
    }
    /// The output whatever the status (some tools exit non-zero with useful output).
    pub fn any(&self) -> Option<&str> {
        match self {
            Item::Ran { text, .. } => Some(text),
            _ => None,
        }
    }
    pub(crate) fn why_not(&self, what: &str) -> String {
        match self {
            Item::Missing => format!("{what}: not recorded"),
            Item::NotRun(t) => format!("{what}: {t} is not installed here"),
            Item::Ran { text, status } => format!("{what}: failed (exit {status}): {}", text.lines().next().unwrap_or("")),
        }
    }
}

#[derive(Default, Debug)]
pub struct State {
    items: BTreeMap<String, Item>,
}

impl State {
    pub fn from_dir(dir: &Path) -> std::io::Result<State> {
        let mut s = State::default();
        if !dir.join("RECORD").exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a saved state (no RECORD file)", dir.display()),
            ));
        }
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if let (Some(stem), Some("txt")) = (p.file_stem().and_then(|s| s.to_str()), p.extension().and_then(|s| s.to_str())) {
                let raw = String::from_utf8_lossy(&std::fs::read(&p)?).into_owned();
                s.items.insert(stem.to_string(), Item::parse(&raw));
            }
        }
        Ok(s)
    }
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> State {
        State { items: pairs.iter().map(|(k, v)| (k.to_string(), Item::parse(v))).collect() }
    }
    pub fn item(&self, name: &str) -> &Item {
        static MISSING: Item = Item::Missing;
        self.items.get(name).unwrap_or(&MISSING)
    }
}

/// One GPU as `nvidia-smi -q` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gpu {
    pub bus: String,
    pub name: String,
    pub brand: String,
    pub arch: String,
    pub fb_mib: Option<u64>,
    pub bar1_mib: Option<u64>,
}

impl Gpu {
    pub fn is_geforce(&self) -> bool {
        self.brand.eq_ignore_ascii_case("GeForce") || self.name.contains("GeForce") || self.name.contains("TITAN")
    }
    pub fn is_hopper_or_newer_datacenter(&self) -> bool {
        !self.is_geforce() && (self.arch.contains("Hopper") || self.arch.contains("Blackwell"))
    }
}

fn value(line: &str) -> Option<(&str, &str)> {
    let (k, v) = line.split_once(':')?;
    Some((k.trim(), v.trim()))
}

/// The value of `key:` in `key: value` lines (modinfo's output).
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().filter_map(value).find(|(k, _)| *k == key).map(|(_, v)| v.to_string())
}

fn mib(v: &str) -> Option<u64> {
    let mut t = v.split_whitespace();
    let n: u64 = t.next()?.parse().ok()?;
    match t.next() {
        Some("MiB") => Some(n),
        Some("GiB") => Some(n * 1024),
        Some("KiB") => Some(n / 1024),
        _ => None,
    }
}

pub fn parse_smi_q(text: &str) -> (Option<String>, Vec<Gpu>) {
    let mut driver = None;
    let mut gpus: Vec<Gpu> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        if line.starts_with("GPU ") && !line.contains(':') || line.starts_with("GPU 0000") {
            gpus.push(Gpu { bus: line[4..].trim().to_string(), ..Default::default() });
            continue;
        }
        match value(line) {
            Some((k, v)) if !v.is_empty() => {
                if k == "Driver Version" && indent == 0 {
                    driver = Some(v.to_string());
                }
                let Some(g) = gpus.last_mut() else { continue };
                match (k, section.as_str()) {
                    ("Product Name", _) => g.name = v.to_string(),
                    ("Product Brand", _) => g.brand = v.to_string(),
                    ("Product Architecture", _) => g.arch = v.to_string(),
                    ("Total", "FB Memory Usage") => g.fb_mib = mib(v),
                    ("Total", "BAR1 Memory Usage") => g.bar1_mib = mib(v),
                    _ => {}
                }
            }
            _ => {
                if indent > 0 {
                    section = line.trim().trim_end_matches(':').trim().to_string();
                }
            }
        }
    }
    (driver, gpus)
}

/// `nvidia-smi topo -p2p r`: (row GPU, column GPU, code) for every pair.
pub fn parse_p2p_matrix(text: &str) -> Vec<(String, String, String)> {
    let mut header: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("Legend") {
            break;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.is_empty() {
            continue;
        }
        if header.is_empty() {
            if t.iter().all(|x| x.starts_with("GPU")) {
                header = t.iter().map(|s| s.to_string()).collect();
            }
            continue;
        }
        if t[0].starts_with("GPU") {
            for (i, code) in t[1..].iter().enumerate() {
                if let Some(col) = header.get(i) {
                    if col != t[0] {
                        out.push((t[0].to_string(), col.clone(), code.to_string()));
                    }
                }
            }
        }
    }
    out
}

fn p2p_code_meaning(code: &str) -> &'static str {
    match code {
        "OK" => "OK",
        "CNS" => "chipset not supported",
        "GNS" => "GPU not supported (the stock driver on GeForce, or the patched module is not the one loaded)",
        "TNS" => "topology not supported",
        "NS" => "not supported",
        _ => "unknown",
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Port {
    pub hca: String,
    pub port: u32,
    pub state: String,
    pub phys_state: String,
    pub link_layer: String,
    pub lid: String,
    pub sm_lid: String,
    pub gids: Vec<(u32, String, String)>,
}

pub fn parse_ibv_devinfo(text: &str) -> Vec<Port> {
    let mut ports: Vec<Port> = Vec::new();
    let mut hca = String::new();
    for line in text.lines() {
        let Some((k, v)) = value(line) else { continue };
        if k == "hca_id" {
            hca = v.to_string();
            continue;
        }
        if k == "port" {
            ports.push(Port { hca: hca.clone(), port: v.parse().unwrap_or(0), ..Default::default() });
            continue;
        }
        let Some(p) = ports.last_mut() else { continue };
        let first = v.split_whitespace().next().unwrap_or("").to_string();
        match k {
            "state" => p.state = first,
            "phys_state" => p.phys_state = first,
            "link_layer" => p.link_layer = first,
            "port_lid" => p.lid = first,
            "sm_lid" => p.sm_lid = first,
            _ if k.starts_with("GID[") => {
                let idx = k.trim_start_matches("GID[").trim_end_matches(']').trim().parse().unwrap_or(0);
                let (addr, kind) =
                    v.split_once(',').map(|(a, b)| (a.trim().to_string(), b.trim().to_string())).unwrap_or((v.to_string(), String::new()));
                p.gids.push((idx, addr, kind));
            }
            _ => {}
        }
    }
    ports
}

fn version_token(s: &str) -> Option<String> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| t.matches('.').count() >= 1 && t.split('.').all(|p| !p.is_empty()))
        .map(|t| t.to_string())
}

/// Packages the runbook holds so an upgrade cannot replace the patched module or split versions.
const HOLD: &[&str] = &[
    "nvidia-open-p2p-dkms",
    "nvidia-firmware",
    "nvidia-kernel-common",
    "nvidia-modprobe",
    "libnvidia-compute",
    "libnvidia-cfg1",
    "nvidia-persistenced",
];

pub fn doctor(st: &State) -> Report {
    let mut r = Report::default();
    let proc_version = st.item("proc-driver-version");
    let kernel_version = proc_version.ok().and_then(|t| t.lines().next()).and_then(|l| {
        l.split_whitespace().find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.')).map(str::to_string)
    });

    // --- driver -----------------------------------------------------------------------------
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
                Check::new("driver.open", Status::Pass, "the open kernel module (needed for the P2P patch and for DMA-BUF)")
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

    // one version everywhere: kernel module, modinfo, user-space libraries, firmware, packages
    if let Some(kv) = &kernel_version {
        let mut differ: Vec<String> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        if let Some(m) = st.item("modinfo-nvidia").ok() {
            if let Some(v) = field(m, "version") {
                seen.push(format!("modinfo {v}"));
                if &v != kv {
                    differ.push(format!("modinfo nvidia says {v} (the module the next boot loads)"));
                }
            }
        }
        if let Some(u) = st.item("user-libs").any() {
            for l in u.lines() {
                if let Some(v) = l.rsplit(".so.").next().filter(|v| v.contains('.') && l.contains(".so.")) {
                    if l.contains("libcuda.so") || l.contains("libnvidia-ml.so") {
                        seen.push(format!("{} {v}", l.rsplit('/').next().unwrap_or(l).split(".so").next().unwrap_or("")));
                        if v != kv {
                            differ.push(l.to_string());
                        }
                    }
                }
            }
        }
        if let Some(f) = st.item("firmware").any() {
            let vs: Vec<String> = f.lines().filter_map(|l| l.trim_end_matches('/').rsplit('/').next().map(str::to_string)).collect();
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
                if t.len() >= 3 && l.ends_with("install ok installed") && (t[0].starts_with("nvidia-") || t[0].starts_with("libnvidia-")) {
                    if let Some(pv) = version_token(t[1]) {
                        if pv.split('.').next() == Some(major) && &pv != kv {
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

    let dkms = st.item("dkms-status");
    match dkms.any() {
        Some(t) => {
            let nv: Vec<&str> = t.lines().filter(|l| l.starts_with("nvidia")).collect();
            let installed: Vec<&&str> = nv.iter().filter(|l| l.contains("installed")).collect();
            let providers: std::collections::BTreeSet<&str> = installed.iter().filter_map(|l| l.split('/').next()).collect();
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
                        format!("the P2P-patched DKMS build provides nvidia ({})", providers.iter().next().unwrap()),
                    )
                    .evidence(*installed[0]),
                );
            } else if let Some(l) = installed.first() {
                r.push(Check::new("driver.dkms", Status::Warn, "the official DKMS build provides nvidia, not a P2P-patched one: GeForce P2P and gdrshim's registrations need the patched module").evidence(**l).fix("install the patched package (for example nvidia-open-p2p-dkms) if this is a GeForce rig"));
            } else {
                r.push(
                    Check::new("driver.dkms", Status::Info, "no DKMS build of nvidia installed (driver from another source?)")
                        .evidence(t.lines().next().unwrap_or("(empty)")),
                );
            }
        }
        None => r.push(Check::new("driver.dkms", Status::Info, dkms.why_not("dkms status"))),
    }
    if let (Some(m), Some(kv)) = (st.item("modinfo-nvidia").ok(), &kernel_version) {
        let file = field(m, "filename").unwrap_or_default();
        let ver = field(m, "version").unwrap_or_default();
        if &ver == kv {
            r.push(Check::new("driver.modinfo", Status::Pass, format!("modinfo and the loaded module agree ({ver}, {file})")));
        } else {
            r.push(
                Check::new("driver.modinfo", Status::Fail, format!("modinfo says {ver} but {kv} is loaded: a reboot will switch modules"))
                    .evidence(file)
                    .fix("reboot into the module you installed, or reinstall the one you mean to run"),
            );
        }
    }
    if let Some(holds) = st.item("holds").ok() {
        let installed: Vec<&str> = st
            .item("packages")
            .any()
            .map(|p| p.lines().filter(|l| l.ends_with("install ok installed")).filter_map(|l| l.split_whitespace().next()).collect())
            .unwrap_or_default();
        let unheld: Vec<&str> = HOLD.iter().copied().filter(|p| installed.contains(p) && !holds.lines().any(|h| h.trim() == *p)).collect();
        let relevant = HOLD.iter().filter(|p| installed.contains(*p)).count();
        if relevant == 0 {
            r.push(Check::new(
                "driver.holds",
                Status::Info,
                "none of the driver packages the runbook holds is installed (driver from another source?)",
            ));
        } else if unheld.is_empty() {
            r.push(Check::new(
                "driver.holds",
                Status::Pass,
                format!("all {relevant} installed driver packages the runbook holds are held"),
            ));
        } else {
            r.push(
                Check::new("driver.holds", Status::Warn, format!("installed but not held: {}", unheld.join(" ")))
                    .fix(format!("sudo apt-mark hold {}", unheld.join(" "))),
            );
        }
    }

    // --- GPUs -------------------------------------------------------------------------------
    let smi = st.item("nvidia-smi-q");
    let (_, gpus) = smi.ok().map(parse_smi_q).unwrap_or_default();
    if gpus.is_empty() {
        r.push(
            Check::new("gpu.model", Status::Info, "no GPU seen: model, BAR1 and P2P cannot be judged")
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
                        "{} GeForce GPU(s): GDR needs gdrshim in register mode by a route that works here (route.* below) and NCCL's GPU-side gate answered (patch 0001 or GDRSHIM_ADVERTISE_GDR=1); the P2P-patched module is for GPU-to-GPU P2P",
                        geforce
                    ),
                )
                .evidence(names.join("; ")),
            );
        } else if gpus.iter().all(|g| g.is_hopper_or_newer_datacenter()) {
            r.push(Check::new("gpu.model", Status::Info, "datacenter Hopper/Blackwell GPUs: libcuda registers natively; use DMA-BUF GPUDirect RDMA (open module + nvidia_drm modeset=1 + inbox rdma-core), no gdrshim and no MLNX_OFED needed").evidence(names.join("; ")));
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
        let containers: Vec<&str> =
            st.item("docker-ps").ok().map(|d| d.lines().filter(|l| !l.trim().is_empty()).collect()).unwrap_or_default();
        if busy.is_empty() && containers.is_empty() {
            r.push(Check::new("gpu.busy", Status::Pass, "no compute process on the GPUs and no running container"));
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

    // --- P2P --------------------------------------------------------------------------------
    match st.item("nvidia-smi-topo-p2p-r").ok() {
        Some(t) => {
            let pairs = parse_p2p_matrix(t);
            if gpus.len() == 1 || (pairs.is_empty() && t.contains("GPU0")) {
                r.push(Check::new("p2p.matrix", Status::Info, "one GPU: P2P between GPUs cannot be judged here"));
            } else if pairs.is_empty() {
                r.push(Check::new("p2p.matrix", Status::Info, "no P2P matrix in nvidia-smi topo -p2p r"));
            } else {
                let bad: Vec<&(String, String, String)> = pairs.iter().filter(|p| p.2 != "OK").collect();
                let table: Vec<String> = pairs.iter().map(|(a, b, c)| format!("{a}-{b} {c}")).collect();
                if bad.is_empty() {
                    r.push(
                        Check::new("p2p.matrix", Status::Pass, format!("all {} GPU pairs OK for P2P reads", pairs.len()))
                            .evidence(table.join(", ")),
                    );
                } else {
                    let mut c = Check::new("p2p.matrix", Status::Fail, format!("{} of {} GPU pairs cannot do P2P", bad.len(), pairs.len()));
                    for (a, b, code) in bad.iter().take(6) {
                        c = c.evidence(format!("{a}-{b}: {code} ({})", p2p_code_meaning(code)));
                    }
                    r.push(c.fix(
                        "load the P2P-patched open module (doctor's driver.dkms), enable Above 4G Decoding/ReBAR, and check IOMMU/ACS",
                    ));
                }
            }
        }
        None => r.push(Check::new("p2p.matrix", Status::Info, st.item("nvidia-smi-topo-p2p-r").why_not("nvidia-smi topo -p2p r"))),
    }
    let cmdline = st.item("cmdline").ok().unwrap_or("");
    let iommu_on = cmdline.split_whitespace().any(|w| w == "intel_iommu=on" || w == "amd_iommu=on" || w == "iommu=force");
    let passthrough = cmdline.split_whitespace().any(|w| w == "iommu=pt");
    let acs_redirect: Vec<&str> = st
        .item("acs")
        .any()
        .map(|a| a.lines().filter(|l| l.contains("ACSCtl") && (l.contains("ReqRedir+") || l.contains("CmpltRedir+"))).collect())
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
        r.push(Check::new("p2p.acs", Status::Pass, "no ACS request redirection seen on PCIe bridges"));
    } else {
        r.push(Check::new("p2p.acs", Status::Info, st.item("acs").why_not("lspci -vvv (ACS)")));
    }
    if iommu_on && !passthrough {
        r.push(
            Check::new("p2p.iommu", Status::Warn, "the IOMMU translates DMA (no iommu=pt): peer traffic may be remapped or blocked")
                .evidence(cmdline)
                .fix("add iommu=pt to the kernel command line, or turn the IOMMU off for these devices"),
        );
    } else if !cmdline.is_empty() {
        r.push(Check::new(
            "p2p.iommu",
            Status::Pass,
            if passthrough { "IOMMU in pass-through mode" } else { "IOMMU not forced on in the kernel command line" },
        ));
    }
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
    let driver_here = kernel_version.is_some();
    if let Some(h) = st.item("headers").any() {
        if !driver_here {
            r.push(Check::new("kernel.headers", Status::Info, "no NVIDIA module here: kernel headers (for DKMS) not judged"));
        } else if h.contains("install ok installed") {
            r.push(Check::new("kernel.headers", Status::Pass, "headers for the running kernel are installed (DKMS can build)"));
        } else {
            r.push(
                Check::new("kernel.headers", Status::Warn, "no headers for the running kernel: DKMS cannot build the module for it")
                    .evidence(h.lines().find(|l| !l.trim().is_empty()).unwrap_or("dpkg -s linux-headers-$(uname -r): not installed"))
                    .fix("sudo apt-get install linux-headers-$(uname -r)"),
            );
        }
    }

    // --- RDMA -------------------------------------------------------------------------------
    let params = st.item("module-params").any().unwrap_or("");
    let param = |p: &str| params.lines().find(|l| l.starts_with(p)).and_then(|l| l.split_once(": ")).map(|(_, v)| v.trim().to_string());
    let geforce = gpus.iter().any(|g| g.is_geforce());
    for c in crate::routes::checks(st, kernel_version.as_deref(), &gpus) {
        r.push(c);
    }
    match param("/sys/module/nvidia_drm/parameters/modeset").as_deref() {
        Some("Y") => r.push(Check::new("rdma.modeset", Status::Pass, "nvidia_drm modeset=1 (DMA-BUF export on)")),
        Some("N") => r.push(
            Check::new(
                "rdma.modeset",
                if geforce { Status::Info } else { Status::Warn },
                "nvidia_drm modeset=0: DMA-BUF export of GPU memory is off",
            )
            .fix("sudo modprobe -r nvidia_drm && sudo modprobe nvidia_drm modeset=1 (and options nvidia-drm modeset=1 in /etc/modprobe.d)"),
        ),
        _ => r.push(Check::new(
            "rdma.modeset",
            Status::Info,
            "nvidia_drm not loaded: modeset cannot be read (DMA-BUF needs nvidia_drm modeset=1)",
        )),
    }
    match st.item("kernel-config").ok() {
        Some(t) => {
            let want = ["CONFIG_DMA_SHARED_BUFFER", "CONFIG_HMM_MIRROR", "CONFIG_INFINIBAND_ON_DEMAND_PAGING"];
            let missing: Vec<&str> = want
                .iter()
                .copied()
                .filter(|k| !t.lines().any(|l| l.starts_with(&format!("{k}=y")) || l.starts_with(&format!("{k}=m"))))
                .collect();
            if missing.is_empty() {
                r.push(Check::new(
                    "rdma.kernel_config",
                    Status::Pass,
                    "kernel has DMA_SHARED_BUFFER, HMM_MIRROR, INFINIBAND_ON_DEMAND_PAGING",
                ));
            } else {
                r.push(
                    Check::new(
                        "rdma.kernel_config",
                        Status::Warn,
                        format!("kernel lacks {}: the DMA-BUF route cannot work", missing.join(", ")),
                    )
                    .fix("use a distribution kernel built with them (Ubuntu 22.04/24.04 generic kernels are)"),
                );
            }
        }
        None => r.push(Check::new("rdma.kernel_config", Status::Info, st.item("kernel-config").why_not("kernel config"))),
    }
    let devinfo = st.item("ibv-devinfo");
    match devinfo.any() {
        Some(t) if t.contains("No IB devices found") || parse_ibv_devinfo(t).is_empty() => r.push(
            Check::new("rdma.hca", Status::Info, "no RDMA device (HCA) seen: ports and GIDs cannot be judged")
                .evidence(t.lines().next().unwrap_or("")),
        ),
        Some(t) => {
            let ports = parse_ibv_devinfo(t);
            let hcas: std::collections::BTreeSet<&str> = ports.iter().map(|p| p.hca.as_str()).collect();
            r.push(Check::new(
                "rdma.hca",
                Status::Pass,
                format!("{} HCA(s), {} port(s): {}", hcas.len(), ports.len(), hcas.iter().copied().collect::<Vec<_>>().join(" ")),
            ));
            let active = ports.iter().filter(|p| p.state == "PORT_ACTIVE").count();
            for p in &ports {
                let id = format!("rdma.{}.{}", p.hca, p.port);
                let ib = p.link_layer == "InfiniBand";
                if p.state == "PORT_ACTIVE" {
                    let v2: Vec<&(u32, String, String)> =
                        p.gids.iter().filter(|g| g.2.contains("RoCE v2") && g.1.starts_with("::ffff:")).collect();
                    let mut c = Check::new(&id, Status::Pass, format!("{} port {} active ({})", p.hca, p.port, p.link_layer));
                    if !ib {
                        c = match v2.first() {
                            Some(g) => Check::new(
                                &id,
                                Status::Pass,
                                format!(
                                    "{} port {} active (RoCE); NCCL_IB_GID_INDEX={} is its RoCE v2 IPv4 GID ({})",
                                    p.hca, p.port, g.0, g.1
                                ),
                            ),
                            None => Check::new(
                                &id,
                                Status::Warn,
                                format!("{} port {} active (RoCE) but no RoCE v2 IPv4 GID: no IP address on its interface?", p.hca, p.port),
                            )
                            .fix("give the port's netdev an IPv4 address; then pick the RoCE v2 GID index for NCCL_IB_GID_INDEX"),
                        };
                    }
                    r.push(c);
                } else if ib && p.state == "PORT_INIT" && (p.lid == "0" || p.sm_lid == "0") {
                    r.push(
                        Check::new(
                            &id,
                            Status::Fail,
                            format!("{} port {} stuck in INIT with LID 0: no subnet manager on the fabric", p.hca, p.port),
                        )
                        .fix("sudo apt install opensm && sudo systemctl start opensm (ports go Active within seconds)"),
                    );
                } else if p.phys_state == "POLLING" || p.state == "PORT_DOWN" {
                    let why = if active > 0 {
                        "while other ports are Active: a physical-layer problem (cable, transceiver, seating)"
                    } else {
                        "no port is Active: check cables and the switch"
                    };
                    r.push(
                        Check::new(&id, Status::Fail, format!("{} port {} {} / {} {why}", p.hca, p.port, p.state, p.phys_state))
                            .fix("reseat or replace the cable/transceiver; check the switch port"),
                    );
                } else {
                    r.push(Check::new(&id, Status::Warn, format!("{} port {} in state {} ({})", p.hca, p.port, p.state, p.phys_state)));
                }
            }
        }
        None => r.push(Check::new("rdma.hca", Status::Info, devinfo.why_not("ibv_devinfo"))),
    }
    let hca_here = devinfo.any().is_some_and(|t| !parse_ibv_devinfo(t).is_empty());
    match st.item("memlock").ok().map(str::trim) {
        Some("unlimited") => r.push(Check::new("limits.memlock", Status::Pass, "locked-memory limit unlimited")),
        Some(v) => match v.parse::<u64>() {
            Ok(kib) if kib >= 64 << 20 => r.push(Check::new("limits.memlock", Status::Pass, format!("locked-memory limit {kib} KiB"))),
            _ => r.push(
                Check::new(
                    "limits.memlock",
                    if driver_here || hca_here { Status::Fail } else { Status::Warn },
                    format!("locked-memory limit {v} KiB: verbs registrations of GPU buffers will fail"),
                )
                .fix("ulimit -l unlimited (limits.conf: * - memlock unlimited; docker run --ulimit memlock=-1)"),
            ),
        },
        None => r.push(Check::new("limits.memlock", Status::Info, st.item("memlock").why_not("ulimit -l"))),
    }
    if let Some(d) = st.item("dev-nodes").any() {
        let has = |n: &str| d.lines().any(|l| l.trim_end().ends_with(n));
        let mut missing: Vec<&str> = ["/dev/nvidiactl", "/dev/nvidia-uvm"].into_iter().filter(|n| !has(n)).collect();
        if !d.lines().any(|l| l.contains("/dev/nvidia") && l.trim_end().chars().last().is_some_and(|c| c.is_ascii_digit())) {
            missing.push("/dev/nvidiaN");
        }
        let uverbs = d.lines().any(|l| l.contains("uverbs"));
        if !missing.is_empty() && !driver_here {
            r.push(Check::new(
                "devices.nodes",
                Status::Info,
                format!(
                    "no NVIDIA device nodes ({}) and no NVIDIA module: not a GPU machine, or the driver is not loaded",
                    missing.join(" ")
                ),
            ));
        } else if !missing.is_empty() {
            r.push(
                Check::new("devices.nodes", Status::Fail, format!("missing device nodes: {}", missing.join(" ")))
                    .fix("on the host: sudo nvidia-modprobe -u -c=0; in a container: --device for each /dev/nvidia* node"),
            );
        } else if !uverbs {
            r.push(
                Check::new(
                    "devices.nodes",
                    Status::Warn,
                    "NVIDIA nodes present, no /dev/infiniband/uverbs*: verbs cannot open the HCA here",
                )
                .fix("in a container add --device /dev/infiniband/uverbsN (and rdma_cm), --cap-add=IPC_LOCK; on the host load ib_uverbs"),
            );
        } else {
            r.push(Check::new("devices.nodes", Status::Pass, "NVIDIA and uverbs device nodes present"));
        }
    }
    if let Some(d) = st.item("dmesg-nvidia").any() {
        match d.lines().find(|l| l.contains("Xid")) {
            Some(l) => r.push(
                Check::new("kernel.xid", Status::Warn, "Xid errors in the kernel log since boot")
                    .evidence(l)
                    .fix("an Xid means the GPU faulted; look the number up before trusting this setup"),
            ),
            None => r.push(Check::new("kernel.xid", Status::Pass, "no Xid in the kernel log")),
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> State {
        State::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state").join(name)).unwrap()
    }
    fn status(r: &Report, id: &str) -> Status {
        r.get(id).unwrap_or_else(|| panic!("no check {id}:\n{}", r.text())).status
    }

    #[test]
    fn the_real_h200_state() {
        let r = doctor(&fixture("h200"));
        assert!(!r.failed(), "{}", r.text());
        assert_eq!(status(&r, "driver.loaded"), Status::Pass);
        assert_eq!(status(&r, "driver.open"), Status::Pass);
        let model = r.get("gpu.model").unwrap();
        assert!(model.summary.contains("DMA-BUF") && model.summary.contains("no gdrshim"), "{}", model.summary);
        assert_eq!(status(&r, "gpu0.bar1"), Status::Pass);
        let p2p = r.get("p2p.matrix").unwrap();
        assert_eq!((p2p.status, p2p.summary.contains("one GPU")), (Status::Info, true));
        assert_eq!(status(&r, "driver.dkms"), Status::Info, "dkms is not installed there: not judged");
        assert_eq!(status(&r, "rdma.hca"), Status::Info);
    }

    #[test]
    fn a_rig_set_up_by_the_runbook_passes() {
        let r = doctor(&fixture("rig-4090-ok"));
        assert!(!r.failed(), "{}", r.text());
        for id in [
            "driver.versions",
            "driver.dkms",
            "driver.modinfo",
            "driver.holds",
            "gpu0.bar1",
            "p2p.matrix",
            "p2p.acs",
            "p2p.iommu",
            "boot.secure_boot",
            "rdma.mlx5_0.1",
            "limits.memlock",
            "devices.nodes",
        ] {
            assert_eq!(status(&r, id), Status::Pass, "{id}\n{}", r.text());
        }
        assert!(r.get("rdma.mlx5_0.1").unwrap().summary.contains("NCCL_IB_GID_INDEX=3"));
        assert!(r.get("gpu.model").unwrap().summary.contains("gdrshim"));
        // the inbox stack: DMA-BUF works, NV503C cannot (no peer-memory module) and is not needed
        assert_eq!(status(&r, "route.dmabuf"), Status::Pass, "{}", r.text());
        let nv = r.get("route.nv503c").unwrap();
        assert_eq!(nv.status, Status::Warn, "{}", r.text());
        assert!(nv.summary.contains("ib_register_peer_memory_client") && nv.summary.contains("not needed"), "{}", nv.summary);
        assert!(r.get("route.choice").unwrap().summary.contains("takes DMA-BUF"));
    }

    #[test]
    fn a_rig_with_mlnx_ofed_and_peermem_takes_nv503c() {
        let r = doctor(&fixture("rig-4090-ofed"));
        assert!(!r.failed(), "{}", r.text());
        assert_eq!(status(&r, "route.nv503c"), Status::Pass, "{}", r.text());
        let d = r.get("route.dmabuf").unwrap();
        assert_eq!(d.status, Status::Warn, "{}", r.text());
        assert!(d.summary.contains("570"), "{}", d.summary);
        assert!(r.get("route.choice").unwrap().summary.contains("takes NV503C"));
    }

    #[test]
    fn every_known_fault_is_named_with_its_fix() {
        let r = doctor(&fixture("rig-4090-bad"));
        assert!(r.failed());
        let expect = [
            ("driver.versions", Status::Fail, "libcuda.so.595.58.03"),
            ("driver.dkms", Status::Fail, "nvidia-dkms-open"),
            ("driver.modinfo", Status::Fail, "reboot"),
            ("driver.holds", Status::Warn, "apt-mark hold"),
            ("gpu0.bar1", Status::Warn, "NCCL_LOCAL_REGISTER=0"),
            ("gpu.busy", Status::Warn, "stop the jobs"),
            ("p2p.matrix", Status::Fail, "GPU0-GPU2: NS"),
            ("p2p.acs", Status::Warn, "ReqRedir+"),
            ("p2p.iommu", Status::Warn, "iommu=pt"),
            ("boot.secure_boot", Status::Warn, "mokutil"),
            ("rdma.mlx5_0.1", Status::Fail, "opensm"),
            ("rdma.mlx5_1.1", Status::Fail, "cable"),
            ("limits.memlock", Status::Fail, "memlock=-1"),
            ("kernel.xid", Status::Warn, "Xid"),
            ("route.nv503c", Status::Fail, "ib_register_peer_memory_client"),
            ("route.dmabuf", Status::Fail, "rdma-core 34"),
            ("route.choice", Status::Fail, "no registration route works"),
        ];
        for (id, st, word) in expect {
            let c = r.get(id).unwrap_or_else(|| panic!("{id}"));
            assert_eq!(c.status, st, "{id}: {}", r.text());
            let all = format!("{} {} {}", c.summary, c.evidence.join(" "), c.fix);
            assert!(all.contains(word), "{id} should mention {word:?}: {all}");
        }
    }

    #[test]
    fn a_machine_without_a_gpu_says_what_it_cannot_see_and_passes() {
        let st = State::from_pairs(&[
            ("proc-driver-version", "cat: /proc/driver/nvidia/version: No such file or directory\n# exit status 1"),
            ("nvidia-smi-q", "# not run: nvidia-smi is not installed"),
            ("nvidia-smi-topo-p2p-r", "# not run: nvidia-smi is not installed"),
            ("memlock", "8192"),
            ("dev-nodes", "ls: cannot access '/dev/nvidia*': No such file or directory\n# exit status 2"),
            ("ibv-devinfo", "# not run: ibv_devinfo is not installed"),
        ]);
        let r = doctor(&st);
        assert!(!r.failed(), "{}", r.text());
        assert_eq!(status(&r, "driver.loaded"), Status::Info);
        assert!(r.get("gpu.model").unwrap().summary.contains("no GPU seen"));
        assert_eq!(status(&r, "limits.memlock"), Status::Warn);
        assert_eq!(status(&r, "devices.nodes"), Status::Info);
        assert!(r.json().contains("\"result\":\"PASS\""));
    }

    #[test]
    fn parsers() {
        let m2 = parse_p2p_matrix(&strip_ansi(" \t\u{1b}[4mGPU0\tGPU1\t\u{1b}[0m\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n"));
        assert_eq!(m2, vec![("GPU0".into(), "GPU1".into(), "GNS".into()), ("GPU1".into(), "GPU0".into(), "GNS".into())]);
        // recorded items are stripped of escape codes when read
        assert_eq!(
            Item::parse(" \t\u{1b}[4mGPU0\tGPU1\t\u{1b}[0m\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n").ok().map(parse_p2p_matrix),
            Some(m2.clone())
        );
        let p = parse_ibv_devinfo("hca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tlink_layer:\t\tEthernet\n\t\t\tGID[  3]:\t\t::ffff:10.0.0.1, RoCE v2\n");
        assert_eq!(p[0].gids, vec![(3, "::ffff:10.0.0.1".into(), "RoCE v2".into())]);
        assert_eq!(Item::parse("x\n# exit status 3"), Item::Ran { text: "x".into(), status: 3 });
    }
}
