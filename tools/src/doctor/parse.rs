//! Parsers of the recorded command outputs.

use super::*;

pub(super) fn value(line: &str) -> Option<(&str, &str)> {
    let (k, v) = line.split_once(':')?;
    Some((k.trim(), v.trim()))
}

/// The value of `key:` in `key: value` lines (modinfo's output).
pub(super) fn field(text: &str, key: &str) -> Option<String> {
    text.lines().filter_map(value).find(|(k, _)| *k == key).map(|(_, v)| v.to_string())
}

pub(super) fn mib(v: &str) -> Option<u64> {
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

pub(super) fn p2p_code_meaning(code: &str) -> &'static str {
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

pub(super) fn version_token(s: &str) -> Option<String> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| t.matches('.').count() >= 1 && t.split('.').all(|p| !p.is_empty()))
        .map(|t| t.to_string())
}
