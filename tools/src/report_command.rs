//! The `report` command: one file about a rig that a user can attach to a question or a bug: the
//! doctor's verdict, the route and its prerequisites, the PCIe paths, what the machine is (driver,
//! kernel, GPUs, HCAs, CPU) and the self-test's figures when given. Nothing that names the machine
//! or its network (host name, IP addresses and GIDs, GUIDs, serial numbers, UUIDs) unless
//! `--private`.

use crate::doctor;
use crate::machine::{
    kernel_version, parse_cpu, parse_ibv_devinfo, parse_pci_paths, parse_smi_q, State,
};
use crate::report::{Check, Report, Status};
use std::fmt::Write as _;
use std::path::PathBuf;

pub const AFTER_HELP: &str = "scripts/report records the live machine first (gdr-state-record save), with --selftest runs the
self-test, and writes the report to a file (--out).

Without --out the Markdown goes to stdout and this command's own lines (the doctor's verdict, INFO:
a report judges nothing itself) and its RESULT line to stderr; with --out they go to stdout.
--json: the one JSON object, the Markdown in its key \"markdown\".

Exit codes:
  0  the report was written (whatever the verdict in it)
  2  FOLDER is not a saved state, a --selftest file cannot be read, --out cannot be written, or a
     usage error";

/// `gdrshim-tool report`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A saved state folder (scripts/gdr-state-record save)
    #[arg(long, value_name = "SAVED_STATE_FOLDER")]
    from: PathBuf,
    /// The self-test's output (scripts/selftest > FILE) to include
    #[arg(long, value_name = "FILE")]
    selftest: Option<PathBuf>,
    /// Keep what names the machine and its network (host name, addresses, GIDs, serials)
    #[arg(long)]
    private: bool,
    /// Write the report to FILE (replaced whole, never half written) instead of stdout
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// One JSON object (the report in its key "markdown") instead of the text
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let st = State::from_dir(&self.from).map_err(|e| e.to_string())?;
        let selftest = match &self.selftest {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read --selftest {}: {e}", p.display()))?,
            ),
            None => None,
        };
        let text = report(&st, selftest.as_deref(), self.private);
        let text = if self.private { text } else { scrub(&text, &host_names(&st)) };
        let mut r = Report::default();
        let verdict = doctor::doctor(&st).closing_line();
        r.push(Check::new(
            "report.doctor",
            Status::Info,
            format!("doctor: {}", verdict.trim_end().trim_start_matches("RESULT: ")),
        ));
        if let Some(out) = &self.out {
            crate::report::write_out(&mut r, "report", out, &text)?;
        }
        if self.json {
            println!(
                "{}",
                r.json_with("report", |_| crate::report::NoKeys {}, ReportKeys { markdown: text })
            );
        } else if self.out.is_some() {
            print!("{}", r.text());
        } else {
            print!("{text}");
            eprint!("{}", r.text());
        }
        Ok(r.exit_code())
    }
}

/// `report`'s own key in its JSON: the Markdown whole.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReportKeys {
    pub markdown: String,
}

/// The host's names as the record holds them (RECORD's `host`, uname's node name).
fn host_names(st: &State) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(k) = st.item("kernel").ok().and_then(|k| k.split_whitespace().nth(1)) {
        v.push(k.to_string());
    }
    if let Some(h) = st.record_host() {
        v.push(h);
    }
    v.retain(|h| h.len() > 1);
    v
}

/// Masks what names the machine or its network: the host names, IPv4 addresses (also inside
/// `::ffff:` GIDs), IPv6 addresses and GIDs, GUIDs, UUIDs and serial numbers.
pub fn scrub(text: &str, hosts: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut l = line.to_string();
        for h in hosts {
            l = replace_word(&l, h, "<host>");
        }
        let words: Vec<String> = l
            .split_inclusive(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
            .map(mask_word)
            .collect();
        out.push_str(&words.concat());
        out.push('\n');
    }
    out
}

fn replace_word(l: &str, w: &str, by: &str) -> String {
    let mut out = String::new();
    let mut rest = l;
    while let Some(at) = rest.find(w) {
        let before = rest[..at].chars().last();
        let after = rest[at + w.len()..].chars().next();
        let edge =
            |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'));
        out.push_str(&rest[..at]);
        out.push_str(if edge(before) && edge(after) { by } else { w });
        rest = &rest[at + w.len()..];
    }
    out.push_str(rest);
    out
}

/// One word (with its trailing separator): an address, GID, GUID or UUID becomes a placeholder.
fn mask_word(w: &str) -> String {
    let (core, tail) = w.split_at(
        w.trim_end_matches(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')').len(),
    );
    let hex_groups = |s: &str, sep: char| {
        let g: Vec<&str> = s.split(sep).collect();
        g.len() >= 3 && g.iter().all(|p| p.len() <= 8 && p.chars().all(|c| c.is_ascii_hexdigit()))
    };
    let ipv4 = |s: &str| {
        let p: Vec<&str> = s.split('.').collect();
        p.len() == 4
            && p.iter()
                .all(|x| !x.is_empty() && x.len() <= 3 && x.chars().all(|c| c.is_ascii_digit()))
    };
    let masked = if ipv4(core) || core.strip_prefix("::ffff:").is_some_and(ipv4) {
        "<address>"
    } else if core.contains(':')
        && hex_groups(core.trim_start_matches("::"), ':')
        && core.len() >= 14
    {
        "<gid>"
    } else if core.starts_with("GPU-") || (core.len() >= 32 && hex_groups(core, '-')) {
        "<uuid>"
    } else {
        return w.to_string();
    };
    format!("{masked}{tail}")
}

/// Checks whose evidence names what runs here (processes, containers): left out unless `--private`.
const PRIVATE_EVIDENCE: &[&str] = &["gpu.busy"];

fn line(s: &mut String, c: &Check, private: bool) {
    let _ = writeln!(s, "- {} `{}` {}", c.status.word(), c.id, c.summary);
    let shown: &[String] =
        if private || !PRIVATE_EVIDENCE.contains(&c.id.as_str()) { &c.evidence } else { &[] };
    for e in shown {
        let _ = writeln!(s, "  - {e}");
    }
    if !c.fix.is_empty() {
        let _ = writeln!(s, "  - fix: {}", c.fix);
    }
}

/// The report, before scrubbing.
pub fn report(st: &State, selftest: Option<&str>, private: bool) -> String {
    let r = doctor::doctor(st);
    let mut s = String::new();
    let _ = writeln!(s, "# gdrshim report\n");
    let _ = writeln!(
        s,
        "gdrshim-tool {}; state recorded {}\n",
        env!("CARGO_PKG_VERSION"),
        st.record_stamp().unwrap_or_else(|| "?".into())
    );
    let _ =
        writeln!(s, "## Verdict\n\ndoctor: {}", r.closing_line().trim_start_matches("RESULT: "));
    let section = |s: &mut String, title: &str, pick: &dyn Fn(&Check) -> bool| {
        let _ = writeln!(s, "## {title}\n");
        let mut any = false;
        for c in r.checks.iter().filter(|c| pick(c)) {
            line(s, c, private);
            any = true;
        }
        if !any {
            let _ = writeln!(s, "(none recorded)");
        }
        s.push('\n');
    };
    section(&mut s, "Route and its prerequisites", &|c| {
        c.id.starts_with("route.") || c.id == "rdma.kernel_config" || c.id == "rdma.modeset"
    });
    section(&mut s, "PCIe paths (NCCL's names)", &|c| {
        c.id.starts_with("topo.") || c.id.starts_with("p2p.")
    });
    let _ = writeln!(s, "## Machine\n");
    if let Some(v) = kernel_version(st) {
        let _ = writeln!(s, "- NVIDIA kernel module {v}");
    }
    if let Some(k) = st.item("kernel").ok().and_then(|k| k.split_whitespace().nth(2)) {
        let _ = writeln!(s, "- kernel {k}");
    }
    if let Some(os) = st
        .item("os-release")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")))
    {
        let _ = writeln!(s, "- {}", os.trim_matches('"'));
    }
    if let Some(c) = st.item("cpu").ok().map(parse_cpu).filter(|c| !c.model_name.is_empty()) {
        let _ = writeln!(s, "- CPU {}", c.model_name);
    }
    for g in st.item("nvidia-smi-q").ok().map(parse_smi_q).map(|(_, g)| g).unwrap_or_default() {
        let mib = |m: Option<u64>| m.map_or("?".to_string(), |v| format!("{v} MiB"));
        let _ = writeln!(
            s,
            "- GPU {} {} ({}), memory {}, BAR1 {}",
            g.bus,
            g.name,
            g.arch,
            mib(g.fb_mib),
            mib(g.bar1_mib)
        );
    }
    for p in st.item("ibv-devinfo").any().map(parse_ibv_devinfo).unwrap_or_default() {
        let _ = writeln!(s, "- HCA {} port {}: {} {}", p.hca, p.port, p.state, p.link_layer);
    }
    for d in st.item("pci-paths").ok().map(parse_pci_paths).unwrap_or_default() {
        let _ = writeln!(
            s,
            "- {} {} /sys/devices/{}",
            if d.gpu { "GPU" } else { "NIC" },
            d.name,
            d.path.join("/")
        );
    }
    s.push('\n');
    let _ = writeln!(s, "## Self-test\n");
    match selftest {
        Some(t) => {
            let _ = writeln!(s, "```");
            s.push_str(t.trim_end());
            let _ = writeln!(s, "\n```");
        }
        None => {
            let _ = writeln!(
                s,
                "(not run: scripts/report --selftest, or gdrshim-tool report --selftest FILE)"
            );
        }
    }
    s.push('\n');
    section(&mut s, "Every check of the doctor", &|_| true);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{JsonReport, NoKeys};

    /// The Markdown whole in the JSON's `markdown`, read back the same (its newlines, the
    /// self-test's tabs and quotes, non-ASCII).
    #[test]
    fn the_report_json_round_trips_with_its_markdown() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/state/rig-4090-ok");
        let st = State::from_dir(&dir).unwrap();
        let text = scrub(&report(&st, Some("step 1\troute.chosen \"ok\" ✓\n"), false), &[]);
        assert!(text.contains("## Verdict") && text.contains("\"ok\" ✓"), "{text}");
        let mut r = Report::default();
        r.push(Check::new("report.doctor", Status::Info, "doctor: PASS"));
        let line = r.json_with("report", |_| NoKeys {}, ReportKeys { markdown: text.clone() });
        assert_eq!(line.lines().count(), 1);
        assert_eq!(crate::json::round_trip::<JsonReport<NoKeys, ReportKeys>>(&line), line);
        let m: JsonReport<NoKeys, ReportKeys> = serde_json::from_str(&line).unwrap();
        assert_eq!(m.own.markdown, text);
    }
}
