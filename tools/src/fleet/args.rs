//! `gdrshim-tool fleet`'s arguments (what every part reads).

use std::path::PathBuf;

/// `gdrshim-tool fleet`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Bytes per transfer (or with K, M, G: 1K = 1024; a power of two from 4K to 4G)
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30, value_parser = crate::size::parser(4096, 1 << 32, true))]
    pub size: usize,
    /// Rank 0's node (and port, default 29500) where the launcher's environment names none
    #[arg(long, value_name = "HOST[:PORT]")]
    pub rendezvous: Option<String>,
    /// CUDA device of this task's rail (default: its local rank)
    #[arg(long, value_name = "N")]
    pub gpu: Option<i32>,
    /// HCA of this task's rail (default: the one nearest its GPU in the node's PCIe paths, else the first)
    #[arg(long, value_name = "NAME")]
    pub hca: Option<String>,
    /// HCA port
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub port: u8,
    /// GID index (RoCE: the RoCE v2 IPv4 GID the doctor names)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gid_index: i32,
    /// A saved state per node for the doctor's checks (`{node}` is replaced by the host name);
    /// default: record this machine now with gdr-state-record
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Re-execute under this libgdrshim.so where it is not preloaded (default: judge the task as started)
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// A link is slow below this share of the slower port's active rate, READ half of it (percent; 0: off)
    #[arg(long, value_name = "PCT", default_value_t = 50)]
    pub min_bw: u32,
    /// A link is slow below this share of its rail's median bandwidth for the operation (percent; 0: off)
    #[arg(long, value_name = "PCT", default_value_t = 25)]
    pub min_median: u32,
    /// How long the tasks may take to come, and one exchange once they are there (seconds)
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub timeout: u64,
    /// Write the heat map (SVG) here (rank 0)
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Leave the matrices out of the text
    #[arg(long)]
    pub no_matrix: bool,
    /// JSON on stdout instead of text (rank 0)
    #[arg(long)]
    pub json: bool,
    /// Per pair, a send/recv through NCCL too (libnccl.so.2; GDRSHIM_FLEET_NCCL names another):
    /// it fails unless every network connection NCCL makes is via NET/…/GDRDMA
    #[arg(long)]
    pub nccl: bool,
}

impl Args {
    /// The self-test's arguments for one rail (its checks and QP code read them).
    pub fn selftest_args(&self, gpu: i32, hca: Option<String>) -> crate::selftest::Args {
        crate::selftest::Args {
            hca,
            port: self.port,
            gid_index: self.gid_index,
            gpu,
            size: self.size.clamp(65536, 16 << 20),
            route: "auto".into(),
            shim: None,
            state: None,
            no_bandwidth: true,
            json: false,
        }
    }
}
