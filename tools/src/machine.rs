//! The machine record and its parsing, the bottom of the tools: a state folder saved by
//! `scripts/gdr-state-record` (one file per command it ran), the GPUs `nvidia-smi -q` lists, and
//! the parsers of the recorded outputs. It judges nothing; the checks above read it.

use crate::report::strip_ansi;
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
    pub fn parse(raw: &str) -> Item {
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
    pub fn why_not(&self, what: &str) -> String {
        match self {
            Item::Missing => format!("{what}: not recorded"),
            Item::NotRun(t) => format!("{what}: {t} is not installed here"),
            Item::Ran { text, status } => {
                format!("{what}: failed (exit {status}): {}", text.lines().next().unwrap_or(""))
            }
        }
    }
}

#[derive(Default, Debug)]
pub struct State {
    items: BTreeMap<String, Item>,
    /// The RECORD file: when and where it was saved.
    record: String,
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
        s.record = std::fs::read_to_string(dir.join("RECORD")).unwrap_or_default();
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if let (Some(stem), Some("txt")) =
                (p.file_stem().and_then(|s| s.to_str()), p.extension().and_then(|s| s.to_str()))
            {
                let raw = String::from_utf8_lossy(&std::fs::read(&p)?).into_owned();
                s.items.insert(stem.to_string(), Item::parse(&raw));
            }
        }
        Ok(s)
    }
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> State {
        State {
            items: pairs.iter().map(|(k, v)| (k.to_string(), Item::parse(v))).collect(),
            record: String::new(),
        }
    }
    /// RECORD's `saved` stamp.
    pub fn record_stamp(&self) -> Option<String> {
        self.record.lines().find_map(|l| l.strip_prefix("saved ")).map(str::to_string)
    }
    /// RECORD's `host` (the first word).
    pub fn record_host(&self) -> Option<String> {
        self.record
            .lines()
            .find_map(|l| l.strip_prefix("host "))
            .and_then(|h| h.split_whitespace().next())
            .map(str::to_string)
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
        self.brand.eq_ignore_ascii_case("GeForce")
            || self.name.contains("GeForce")
            || self.name.contains("TITAN")
    }
    pub fn is_hopper_or_newer_datacenter(&self) -> bool {
        !self.is_geforce() && (self.arch.contains("Hopper") || self.arch.contains("Blackwell"))
    }
}

/// The kernel module's version, from /proc/driver/nvidia/version.
pub fn kernel_version(st: &State) -> Option<String> {
    st.item("proc-driver-version").ok().and_then(|t| t.lines().next()).and_then(|l| {
        l.split_whitespace()
            .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .map(str::to_string)
    })
}

// --- parsers of the recorded command outputs ---------------------------------------------

pub fn value(line: &str) -> Option<(&str, &str)> {
    let (k, v) = line.split_once(':')?;
    Some((k.trim(), v.trim()))
}

/// The value of `key:` in `key: value` lines (modinfo's output).
pub fn field(text: &str, key: &str) -> Option<String> {
    text.lines().filter_map(value).find(|(k, _)| *k == key).map(|(_, v)| v.to_string())
}

pub fn mib(v: &str) -> Option<u64> {
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

pub fn p2p_code_meaning(code: &str) -> &'static str {
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
            ports.push(Port {
                hca: hca.clone(),
                port: v.parse().unwrap_or(0),
                ..Default::default()
            });
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
                let idx =
                    k.trim_start_matches("GID[").trim_end_matches(']').trim().parse().unwrap_or(0);
                let (addr, kind) = v
                    .split_once(',')
                    .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
                    .unwrap_or((v.to_string(), String::new()));
                p.gids.push((idx, addr, kind));
            }
            _ => {}
        }
    }
    ports
}

pub fn version_token(s: &str) -> Option<String> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| t.matches('.').count() >= 1 && t.split('.').all(|p| !p.is_empty()))
        .map(|t| t.to_string())
}

/// A GPU or an RDMA device as `pci-paths` records it: its sysfs device path, split at `/`
/// (`pci0000:40`, `0000:40:01.1`, … its own address last), and its NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDev {
    pub gpu: bool,
    /// The GPU's PCI address, or the RDMA device's name (mlx5_0).
    pub name: String,
    pub path: Vec<String>,
    pub numa: Option<i32>,
}

/// `gpu ADDRESS /sys/devices/pci…/ADDRESS numa=N` and `nic NAME /sys/devices/pci…/ADDRESS numa=N`.
pub fn parse_pci_paths(text: &str) -> Vec<PciDev> {
    text.lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            let gpu = match t.next()? {
                "gpu" => true,
                "nic" => false,
                _ => return None,
            };
            let name = t.next()?.to_string();
            let path: Vec<String> =
                t.next()?.strip_prefix("/sys/devices/")?.split('/').map(str::to_string).collect();
            let numa = t
                .next()
                .and_then(|n| n.strip_prefix("numa="))
                .and_then(|n| n.parse().ok())
                .filter(|n: &i32| *n >= 0);
            Some(PciDev { gpu, name, path, numa })
        })
        .collect()
}

/// The CPU as `/proc/cpuinfo` names it (the `cpu` item).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    pub vendor: String,
    pub model_name: String,
}

pub fn parse_cpu(text: &str) -> Cpu {
    let mut c = Cpu::default();
    for (k, v) in text.lines().filter_map(value) {
        match k {
            "vendor_id" if c.vendor.is_empty() => c.vendor = v.to_string(),
            "model name" if c.model_name.is_empty() => c.model_name = v.to_string(),
            _ => {}
        }
    }
    c
}

/// A character device the record names: `uverbs` lines `NAME IBDEV MAJOR:MINOR` (`IBDEV` `-` for
/// rdma_cm, which serves every HCA).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharDev {
    pub name: String,
    pub ibdev: Option<String>,
    pub major: u32,
    pub minor: u32,
}

/// The `uverbs` item (scripts/gdr-state-record; `cdi` reads the same lines from /sys itself).
pub fn parse_uverbs(text: &str) -> Vec<CharDev> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, ibdev, dev) = (w.next()?, w.next()?, w.next()?);
            let (major, minor) = dev.split_once(':')?;
            Some(CharDev {
                name: name.to_string(),
                ibdev: (ibdev != "-").then(|| ibdev.to_string()),
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
            })
        })
        .collect()
}
