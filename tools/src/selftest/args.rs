//! `gdrshim-tool selftest`'s arguments (what every step reads).

use core::ffi::c_int;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// HCA to use (as in /sys/class/infiniband; default: the first one libibverbs lists)
    #[arg(long, value_name = "NAME")]
    pub hca: Option<String>,
    /// HCA port
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub port: u8,
    /// GID index (RoCE: the RoCE v2 IPv4 GID the doctor names; IB: LID addressing is used)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gid_index: c_int,
    /// CUDA device ordinal
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: c_int,
    /// Largest transfer (bytes, or with K, M, G: 1K = 1024; a power of two, 64K … 1G); bandwidth
    /// runs 64 KiB … this
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20, value_parser = crate::size::parser(65536, 1 << 30, true))]
    pub size: usize,
    /// Route the shim must take (auto: whichever works here)
    #[arg(long, value_name = "R", default_value = "auto", value_parser = ["auto", "dmabuf", "nv503c"])]
    pub route: String,
    /// libgdrshim.so to run under when it is not preloaded already
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// A machine state saved by `scripts/gdr-state-record save` for step 1's route checks
    /// (default: record this machine now with the gdr-state-record next to this program)
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Skip the bandwidth step (step 5)
    #[arg(long)]
    pub no_bandwidth: bool,
    /// JSON on stdout instead of text
    #[arg(long)]
    pub json: bool,
}
