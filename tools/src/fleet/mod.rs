//! `gdrshim-tool fleet`: GPUDirect RDMA proven across a whole fleet, started by the launcher the
//! job already uses (`torchrun --no-python`, `mpirun`/`mpiexec`, `srun`), one task per node or
//! per GPU; no SSH, no host file, no daemon. Each task:
//! 1. learns its rank, the job's size and the rendezvous from the launcher's environment
//!    (`launch`), and joins it (`wire`: TCP, rank 0 serves);
//! 2. gathers its node's facts (`node`): gdrshim loaded and its version, driver and rdma-core
//!    versions, the locked-memory limit, the doctor's checks over the node's recorded state, the
//!    self-test's loopback on its rail; registers its GPU buffers through gdrshim (`link`);
//! 3. runs the rounds (`schedule`): each round every node meets one other on every rail, both
//!    directions, RDMA WRITE and READ GPU→GPU with every byte checked (`run`);
//! 4. on rank 0: the culprits (`verdict`), the summary, matrices and JSON (`render`), the heat
//!    map (`svg`); every task exits with the fleet's one exit code.

mod args;
mod launch;
mod link;
mod model;
mod nccl;
mod node;
mod render;
mod round;
mod run;
mod schedule;
mod svg;
#[cfg(test)]
mod tests;
mod verdict;
mod wire;

pub use args::Args;

pub const AFTER_HELP: &str = "Start it as one task per node (or per GPU) with the launcher the job uses:
  torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --no-python gdrshim-tool fleet
  mpirun -np N --map-by ppr:1:node -x LD_PRELOAD gdrshim-tool fleet --rendezvous FIRST_HOST
  srun -N N --ntasks-per-node 1 gdrshim-tool fleet
Rank 0 serves the rendezvous: torchrun's MASTER_ADDR at MASTER_PORT+1 (its agent holds MASTER_PORT),
MASTER_ADDR:MASTER_PORT where a user sets them, Slurm's first node of the step at a port from the job
and step ids, else --rendezvous HOST[:PORT] (mpirun names no address every task knows).
Rank 0 prints the culprits first, PASS lines, an N×N matrix per rail and operation, and the RESULT.

Exit codes (every task exits with the fleet's):
  0  every node and link passes
  1  a culprit is named (each FAIL line: what, its evidence, what to do)
  2  could not check (no GPU or HCA to try), a rendezvous that failed, or a usage error";

impl Args {
    pub fn run(self) -> Result<u8, String> {
        if let Some(shim) = &self.shim {
            let st =
                crate::selftest::Args { shim: Some(shim.clone()), ..self.selftest_args(0, None) };
            if let Some(code) = st.reexec()? {
                return Ok(code);
            }
        }
        run::fleet(&self)
    }
}
