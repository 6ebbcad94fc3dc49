//! `doctor`: the preflight checks of both seed runbooks (4090 P2P + GDR, and DMA-BUF on Hopper),
//! judged from a saved state folder (`scripts/gdr-state-record save`; `scripts/doctor` saves one
//! of the live machine first). Reading only what is there: what could not be seen is INFO, with
//! the reason, never a PASS.

use crate::report::{strip_ansi, Check, Report, Status};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const AFTER_HELP: &str = "scripts/doctor records the live machine first (gdr-state-record save) and then runs this.

Exit codes:
  0  ready: no check failed (WARN lines are worth reading)
  1  not ready: a check failed; each FAIL line says why and how to fix it
  2  could not check: no NVIDIA kernel module and no GPU in the state (nothing on the GPU side could
     be judged), FOLDER is not a saved state, or a usage error";

/// `gdrshim-tool doctor`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A saved state folder (scripts/gdr-state-record save; scripts/doctor records the live machine first)
    #[arg(long, value_name = "SAVED_STATE_FOLDER")]
    from: PathBuf,
    /// One JSON object instead of the text report
    #[arg(long)]
    json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let st = State::from_dir(&self.from).map_err(|e| e.to_string())?;
        let r = doctor(&st);
        print!("{}", if self.json { r.json() + "\n" } else { r.text() });
        Ok(r.exit_code())
    }
}

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

mod parse;
mod platform;
mod software;
#[cfg(test)]
mod tests;
pub use parse::*;

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

/// The kernel module's version, from /proc/driver/nvidia/version.
fn kernel_version(st: &State) -> Option<String> {
    st.item("proc-driver-version").ok().and_then(|t| t.lines().next()).and_then(|l| {
        l.split_whitespace().find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.')).map(str::to_string)
    })
}

/// Only the route checks of the doctor (`route.dmabuf`, `route.nv503c`, `route.choice`), for the
/// self-test's step 1.
pub fn route_checks(st: &State) -> Vec<Check> {
    let kernel_version = kernel_version(st);
    let gpus = software::gpus(st, &mut Report::default());
    crate::routes::checks(st, kernel_version.as_deref(), &gpus)
}

pub fn doctor(st: &State) -> Report {
    let mut r = Report::default();
    let kernel_version = kernel_version(st);
    software::driver(st, &mut r, &kernel_version);
    let gpus = software::gpus(st, &mut r);
    platform::p2p_and_boot(st, &mut r, &gpus, &kernel_version);
    platform::rdma(st, &mut r, &gpus, &kernel_version);
    if kernel_version.is_none() && gpus.is_empty() {
        r.could_not_check(
            "no NVIDIA kernel module and no GPU in this state: nothing GPUDirect needs on the GPU side could be judged \
             (record it on a GPU node with the driver loaded)",
        );
    } else if r.checks.iter().all(|c| c.status == Status::Info) {
        r.could_not_check("every check is INFO: nothing in this state could be judged");
    }
    r
}
