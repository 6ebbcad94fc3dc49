//! `gdrshim-tool verify-run`'s arguments and how its input files are read.

use super::checks::{usable, verify, Inputs};
use crate::report::{Check, Status};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const AFTER_HELP: &str = "Exit codes:
  0  PASS: every check of the acceptance checklist passed
  1  FAIL: a check failed; each FAIL line prints the log line that decided it
  2  unusable input (a file that cannot be read, not a NCCL Tests log), a check that could not be
     made (a --kernel-log with no entries), or a usage error. A FAIL wins over could not check";

/// `gdrshim-tool verify-run`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// NCCL Tests' output (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,P2P,ENV)
    #[arg(long, value_name = "FILE")]
    nccl_log: PathBuf,
    /// The shim's log (GDRSHIM_LOG_FILE); repeat for several; a file given twice is read once
    #[arg(long, value_name = "FILE")]
    shim_log: Vec<PathBuf>,
    /// ib_write_bw (perftest) output with --use_cuda
    #[arg(long, value_name = "FILE")]
    perftest_log: Option<PathBuf>,
    /// The kernel log of the run (e.g. <(journalctl -k -b)); any Xid fails the run
    #[arg(long, value_name = "FILE")]
    kernel_log: Option<PathBuf>,
    /// Require GDR: every network connection via NET/…/GDRDMA and the shim registering
    #[arg(long)]
    expect_gdr: bool,
    /// Require single-node P2P: isAllCudaP2p 1, isAllDirectP2p 1, via P2P/direct pointer
    #[arg(long)]
    expect_p2p: bool,
    /// The GPU's compute capability ×10 (89 for an RTX 4090) when the log does not name the GPU
    #[arg(long, value_name = "N")]
    gpu_sm: Option<u32>,
    /// The run's exit status (0..=255; 128+N is death by signal N)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8), allow_negative_numbers = true)]
    exit_code: Option<u8>,
    /// One JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

/// Reads each input file once: a file is known by its device and inode, so the same file under
/// two names (a path and a symlink or hard link, `/dev/fd/N` of one pipe) is one file. A pipe
/// (`<(journalctl -k)`) can only be read once anyway.
#[derive(Default)]
struct Files {
    read: Vec<((u64, u64), String, String)>,
    notes: Vec<String>,
}

enum Got {
    New(String),
    /// Already read under the given role.
    Again(String, String),
}

impl Files {
    fn get(&mut self, role: &str, path: &Path) -> Result<Got, String> {
        let cannot = |e: std::io::Error| format!("cannot read {role} {}: {e}", path.display());
        let m = std::fs::metadata(path).map_err(cannot)?;
        let id = (m.dev(), m.ino());
        if let Some((_, first, text)) = self.read.iter().find(|(i, _, _)| *i == id) {
            return Ok(Got::Again(first.clone(), text.clone()));
        }
        let text = std::fs::read(path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(cannot)?;
        self.read.push((id, format!("{role} {}", path.display()), text.clone()));
        Ok(Got::New(text))
    }
    /// A file's text, the same file given before (in another role) being read once.
    fn text(&mut self, role: &str, path: &Path) -> Result<String, String> {
        Ok(match self.get(role, path)? {
            Got::New(t) => t,
            Got::Again(first, t) => {
                self.notes.push(format!(
                    "{role} {} is the file given as {first}: read once",
                    path.display()
                ));
                t
            }
        })
    }
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let mut files = Files::default();
        let mut inp = Inputs {
            nccl_log: files.text("--nccl-log", &self.nccl_log)?,
            expect_gdr: self.expect_gdr,
            expect_p2p: self.expect_p2p,
            gpu_sm: self.gpu_sm,
            exit_code: self.exit_code.map(i32::from),
            ..Default::default()
        };
        for p in &self.shim_log {
            // the same lines twice would count each summary twice: a file given again is skipped
            match files.get("--shim-log", p)? {
                Got::New(t) => inp.shim_logs.push(t),
                Got::Again(first, _) => files.notes.push(format!(
                    "--shim-log {} is the file given as {first}: read once, its lines counted once",
                    p.display()
                )),
            }
        }
        if let Some(p) = &self.perftest_log {
            inp.perftest_log = Some(files.text("--perftest-log", p)?);
        }
        if let Some(p) = &self.kernel_log {
            inp.kernel_log = Some(files.text("--kernel-log", p)?);
        }
        usable(&inp.nccl_log)?;
        let mut r = verify(&inp);
        let notes = files.notes.into_iter().map(|n| Check::new("input.read_once", Status::Info, n));
        r.checks.splice(0..0, notes);
        Ok(r.print("verify-run", self.json))
    }
}
