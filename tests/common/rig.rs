//! The fake machine the end-to-end programs of tests/c run on (tests/routes*.rs, tests/harm.rs,
//! tests/stress.rs): the live fake driver (`libfakerm.so`), the fake NIC as a provider of
//! rdma-core's own libibverbs (the machine's, rdma-core 44) and as a libibverbs itself where a test
//! needs what rdma-core 44 cannot be (one older than 34, or one with `ibv_reg_mr_ex`), the
//! stand-in libmlx5, a fake libcuda, and the programs; built once per test binary into its
//! scratch folder.

use super::fakes::{self, Fakes};
use super::Env;
use std::collections::HashMap;
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
    f.rdma_core_nic();
    // rdma-core's libmlx5 answers devx only on an mlx5 device (EOPNOTSUPP on any other, the fake
    // NIC's included): beside rdma-core's libibverbs, libmlx5 stays the stand-in, alone in its folder
    f.fakemlx5("rdma-core/mlx5/libmlx5.so.1");
    f.fakecuda();
    for p in programs {
        super::cc(
            &e,
            &["-O1", "-Wall", "-Werror", "-o", p, &src(&format!("{p}.c")), "-ldl", "-lpthread"],
        );
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
pub fn run(
    e: &Env,
    program: &str,
    dev: &Path,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    let verbs = e.dir.join(if rig.new_verbs { "verbs-new" } else { "verbs-old" });
    let mut c = Command::new(e.dir.join(program));
    c.env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()))
        .env("LD_LIBRARY_PATH", &verbs);
    finish(e, c, dev, rig, args, extra)
}

/// [`run`] on rdma-core's own libibverbs (the machine's), the fake NIC its provider
/// (`Fakes::rdma_core_nic`, built into `e`'s folder) with the lab's device, fwroce_0, its sysfs
/// tree in `dev`, and the stand-in libmlx5: for a rig whose libibverbs has `ibv_reg_dmabuf_mr`, as
/// rdma-core 44 has. `extra`'s LD_PRELOAD, if any, must keep [`rdma_core_preload`]'s first entry.
pub fn run_on_rdma_core(
    e: &Env,
    program: &str,
    dev: &Path,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    assert!(rig.new_verbs, "rdma-core 44 has ibv_reg_dmabuf_mr: an older one is fakeverbs.c's");
    let mut c = Command::new(e.dir.join(program));
    rdma_core_env(&mut c, e, dev)
        .env("LD_PRELOAD", rdma_core_preload(e, &[&e.shim, &e.dir.join("libfakerm.so")]));
    finish(e, c, dev, rig, args, extra)
}

/// `c`'s environment for rdma-core's own libibverbs with the fake NIC as its provider
/// (`Fakes::rdma_core_nic`, built into `e`'s folder), its sysfs tree in `dev`, and the stand-in
/// libmlx5; its LD_PRELOAD is the caller's, led by [`rdma_core_preload`]'s first entry.
pub fn rdma_core_env<'c>(c: &'c mut Command, e: &Env, dev: &Path) -> &'c mut Command {
    let (rc, sysfs) = (e.dir.join("rdma-core"), dev.join("sysfs"));
    c.env("RDMAV_DRIVERS", rc.join("librignic"))
        .env("FAKEWIRE_SYSFS", &sysfs)
        .env("SYSFS_PATH", sysfs.join("sys"))
        .env_remove("FAKEWIRE_HOST")
        .env_remove("FAKEWIRE_LAB")
        .env("LD_LIBRARY_PATH", rc.join("mlx5"))
}

/// LD_PRELOAD for [`run_on_rdma_core`]: the lab's fakesys (the NIC's sysfs tree and device file)
/// first, then `libs`.
pub fn rdma_core_preload(e: &Env, libs: &[&Path]) -> String {
    let mut all = vec![e.dir.join("rdma-core/fakesys.so").display().to_string()];
    all.extend(libs.iter().map(|l| l.display().to_string()));
    all.join(":")
}

/// `program ARGS` as users' processes run it: on rdma-core's libibverbs where `rig` has
/// `ibv_reg_dmabuf_mr` ([`run_on_rdma_core`]), else on the fake NIC as an rdma-core older than 34
/// ([`run`]).
pub fn run_as_deployed(
    e: &Env,
    program: &str,
    dev: &Path,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    if rig.new_verbs {
        run_on_rdma_core(e, program, dev, rig, args, extra)
    } else {
        run(e, program, dev, rig, args, extra)
    }
}

/// [`run`] on the fake NIC as the libibverbs itself, whatever `rig` says: for what rdma-core 44
/// cannot be: `ibv_reg_mr_ex` (IBVERBS_1.15, a later rdma-core's; 44 stops at IBVERBS_1.14).
pub fn run_on_fake_verbs(
    e: &Env,
    program: &str,
    dev: &Path,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    let mut c = Command::new(e.dir.join(program));
    c.env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()))
        .env("LD_LIBRARY_PATH", e.dir.join("verbs-new"));
    finish(e, c, dev, rig, args, extra)
}

fn finish(
    e: &Env,
    mut c: Command,
    dev: &Path,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    let out = c
        .args(args)
        .env("GDRSHIM_TEST_DEV_DIR", dev)
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("FAKERM_DMABUF_CAPABLE", if rig.capable { "1" } else { "0" })
        .env("FAKE_LIBCUDA", e.dir.join("libcuda.so.1"))
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `routes ARGS` (tests/c/routes.c, built by [`build`]) on a fresh fake machine `dev-TAG`, the
/// fake GPUs' PCI device (the fake's CARD_INFO: 0000:00:00.0) given the sysfs `resource` file if
/// any; on rdma-core's libibverbs where `rig` has `ibv_reg_dmabuf_mr` ([`run_on_rdma_core`]), else
/// on the fake NIC as an rdma-core older than 34; returns (exit code, stdout, stderr).
pub fn routes(
    e: &Env,
    tag: &str,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
    resource: Option<&str>,
) -> (i32, String, String) {
    let dev = dev_dir(e, tag, rig);
    if let Some(resource) = resource {
        let pci = dev.join("sys/bus/pci/devices/0000:00:00.0");
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("resource"), resource).unwrap();
    }
    run_as_deployed(e, "routes", &dev, rig, args, extra)
}

/// [`routes`] on the fake NIC as the libibverbs itself ([`run_on_fake_verbs`]).
pub fn routes_on_fake_verbs(
    e: &Env,
    tag: &str,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (i32, String, String) {
    let dev = dev_dir(e, tag, rig);
    run_on_fake_verbs(e, "routes", &dev, rig, args, extra)
}

/// The key=value words of the summary line in `text`.
pub fn summary(text: &str) -> HashMap<String, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("gdrshim: summary "))
        .unwrap_or_else(|| panic!("no summary in {text}"));
    line["gdrshim: summary ".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The value of `key=` among the words of `line`.
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// The line of `out` that starts with `prefix` (`err`: the run's stderr, shown when it is missing).
pub fn find_line<'a>(out: &'a str, err: &str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {out}\n{err}"))
}
