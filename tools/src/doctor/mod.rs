//! `doctor`: the preflight checks of docs/runbook.md (4090 P2P + GDR) and of DMA-BUF on Hopper,
//! judged from a saved state folder (`scripts/gdr-state-record save`; `scripts/doctor` saves one
//! of the live machine first). Reading only what is there: what could not be seen is INFO, with
//! the reason, never a PASS.

use crate::machine::{kernel_version, State};
use crate::report::{Check, Report, Status};
use std::path::PathBuf;

pub const AFTER_HELP: &str =
    "scripts/doctor records the live machine first (gdr-state-record save) and then runs this.
Recorded inside a container (no root needed), it also says what the runtime did not give:
container.devices, container.shim, container.privileged, and limits.memlock with its fix there.

Exit codes:
  0  ready: no check failed (WARN lines are worth reading)
  1  not ready: a check failed; each FAIL line says why and how to fix it
  2  could not check: no NVIDIA kernel module and no GPU in the state (nothing on the GPU side could
     be judged), FOLDER is not a saved state, or a usage error
A FAIL wins over could not check: on a machine without a GPU, a check that fails there (no RDMA
device, memlock too low…) makes it exit 1, not 2; the last line says what could not be checked.";

/// `gdrshim-tool doctor`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A saved state folder (scripts/gdr-state-record save; scripts/doctor records the live machine first)
    #[arg(long, value_name = "SAVED_STATE_FOLDER")]
    from: PathBuf,
    /// One JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let st = State::from_dir(&self.from).map_err(|e| e.to_string())?;
        let r = doctor(&st);
        Ok(r.print("doctor", self.json))
    }
}

mod container;
mod nccl;
mod platform;
mod software;
#[cfg(test)]
mod tests;

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
    container::container(st, &mut r);
    nccl::nccl(st, &mut r);
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
