//! The fake machine the end-to-end programs of tests/c run on (tests/routes.rs, tests/harm.rs,
//! tests/stress.rs): the live fake driver (`libfakerm.so`), the fake NIC as a libibverbs of
//! rdma-core 34 and later and one older than 34 (each with its stand-in libmlx5), a fake
//! libcuda, and the programs; built once per test binary into its scratch folder.

use super::fakes::{self, Fakes};
use super::Env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the fake machine has.
pub struct Rig {
    /// nvidia-peermem loaded (the NV503C route's reader).
    pub peermem: bool,
    /// RM says the GPU can export dma-bufs.
    pub capable: bool,
    /// libibverbs has `ibv_reg_dmabuf_mr` (rdma-core 34 and later).
    pub new_verbs: bool,
}

/// The DMA-BUF route's machine, and the NV503C route's (MLNX_OFED with nvidia-peermem, an old
/// rdma-core).
pub const DMABUF: Rig = Rig { peermem: false, capable: true, new_verbs: true };
pub const NV503C: Rig = Rig { peermem: true, capable: false, new_verbs: false };

fn src(f: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(f).to_str().unwrap().to_string()
}

/// Builds the fake machine and `programs` (each tests/c/NAME.c) in a new scratch folder `tag`.
pub fn build(tag: &str, programs: &[&str]) -> Env {
    let e = super::build(tag);
    let f = Fakes::in_dir(&e.dir);
    f.fakerm();
    for (dir, verbs) in [("verbs-new", fakes::NEW), ("verbs-old", fakes::OLD)] {
        f.fakeverbs(&format!("{dir}/libibverbs.so.1"), verbs);
        f.fakemlx5(&format!("{dir}/libmlx5.so.1"));
    }
    f.fakecuda();
    for p in programs {
        super::cc(&e, &["-O1", "-Wall", "-Werror", "-o", p, &src(&format!("{p}.c")), "-ldl", "-lpthread"]);
    }
    e
}

/// A fresh device folder `dev-TAG` for `rig` in `e`'s scratch folder.
pub fn dev_dir(e: &Env, tag: &str, rig: &Rig) -> PathBuf {
    let dev = e.dir.join(format!("dev-{tag}"));
    let _ = std::fs::remove_dir_all(&dev);
    super::fakedev::fake_dev(&dev, &["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"], rig.peermem);
    dev
}

/// `program ARGS` on the fake machine `dev` (see [`dev_dir`]) with gdrshim preloaded in register
/// mode at info level, `extra` last; returns (exit code, stdout, stderr).
pub fn run(e: &Env, program: &str, dev: &Path, rig: &Rig, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
    let verbs = e.dir.join(if rig.new_verbs { "verbs-new" } else { "verbs-old" });
    let out = Command::new(e.dir.join(program))
        .args(args)
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()))
        .env("LD_LIBRARY_PATH", &verbs)
        .env("GDRSHIM_TEST_DEV_DIR", dev)
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("FAKERM_DMABUF_CAPABLE", if rig.capable { "1" } else { "0" })
        .env("FAKE_LIBCUDA", e.dir.join("libcuda.so.1"))
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}
