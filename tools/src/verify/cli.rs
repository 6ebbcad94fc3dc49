//! `gdrshim-tool verify-run`'s arguments and how its input files are read.

use super::{usable, verify, Inputs};
use std::path::PathBuf;

pub const AFTER_HELP: &str = "Exit codes:
  0  PASS: every check of the acceptance checklist passed
  1  FAIL: a check failed; each FAIL line prints the log line that decided it
  2  unusable input (a file that cannot be read, not a NCCL Tests log) or a usage error";

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
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8))]
    exit_code: Option<u8>,
    /// One JSON object instead of the text report
    #[arg(long)]
    json: bool,
}

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let mut inp = Inputs {
            nccl_log: read(&self.nccl_log)?,
            expect_gdr: self.expect_gdr,
            expect_p2p: self.expect_p2p,
            gpu_sm: self.gpu_sm,
            exit_code: self.exit_code.map(i32::from),
            ..Default::default()
        };
        for p in &self.shim_log {
            inp.shim_logs.push(read(p)?);
        }
        inp.perftest_log = self.perftest_log.as_deref().map(read).transpose()?;
        inp.kernel_log = self.kernel_log.as_deref().map(read).transpose()?;
        usable(&inp.nccl_log)?;
        let r = verify(&inp);
        print!("{}", if self.json { r.json() + "\n" } else { r.text() });
        if !self.json {
            println!("{}", if r.failed() { "RESULT: FAIL" } else { "RESULT: PASS" });
        }
        Ok(if r.failed() { 1 } else { 0 })
    }
}
