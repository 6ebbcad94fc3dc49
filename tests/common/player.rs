//! The player rig of tests/integration.rs and tests/interpose.rs: tests/c/player.c replays a
//! capture of the H200 under the real libgdrshim.so, against the fake driver that answers from the
//! same capture (fakenv.c), a fake libcuda and the fake NIC; built once per test binary. Its NIC
//! is still fakeverbs.c as the libibverbs (its few verbs lines probe a registration with a null
//! PD): the registration tests proper (routes, harm, stress, fds, life, consumers, the lab, and
//! interpose.rs's errno and binding checks) run on rdma-core's own.

use super::{fakes, Env};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The rig in its scratch folder, built at the first call.
pub fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = super::build("it");
        let (root, dir) = (Path::new(env!("CARGO_MANIFEST_DIR")), e.dir.clone());
        let c = root.join("tests/c");
        let cc = |args: &[&str]| super::cc(&e, args);
        let f = fakes::Fakes::in_dir(&dir);
        f.fakenv();
        f.fakecuda();
        f.fakeverbs("libibverbs.so.1", fakes::NEW);
        cc(&[
            "-O1",
            "-o",
            "player",
            c.join("player.c").to_str().unwrap(),
            "-ldl",
            "-Wl,--no-as-needed",
            "-L.",
            "-l:libibverbs.so.1",
            "-Wl,-rpath,$ORIGIN",
        ]);
        cc(&["-shared", "-fPIC", "-o", "libnext_b.so", c.join("next_b.c").to_str().unwrap()]);
        cc(&[
            "-shared",
            "-fPIC",
            "-o",
            "libnext_a.so",
            c.join("next_a.c").to_str().unwrap(),
            "-ldl",
        ]);
        cc(&[
            "-o",
            "next_main",
            c.join("next_main.c").to_str().unwrap(),
            "-L.",
            "-Wl,--no-as-needed",
            "-lnext_a",
            "-lnext_b",
            "-Wl,-rpath,$ORIGIN",
        ]);
        for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
            std::fs::write(dir.join("dev").join(f), b"").unwrap();
        }
        e
    })
}

/// A capture of tests/fixtures, unpacked.
pub fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap()).read_to_string(&mut s).unwrap();
    s
}

/// The key=value words of gdrshim's summary line in `text`, if there is one.
pub fn summary(text: &str) -> Option<HashMap<String, String>> {
    let line = text.lines().find(|l| l.starts_with("gdrshim: summary "))?;
    Some(
        line["gdrshim: summary ".len()..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Runs the player over `capture` under the shim; returns (stdout, stderr).
pub fn run_player(capture: &str, version: &str, mode: &str, tag: &str) -> (String, String) {
    let (ok, o, e) = try_player(capture, version, mode, tag);
    assert!(ok, "player failed: {o}\n{e}");
    (o, e)
}

/// [`run_player`] on driver 580.159.04 with more environment.
pub fn run_player_env(
    capture: &str,
    mode: &str,
    tag: &str,
    extra: &[(&str, &str)],
) -> (String, String) {
    let (ok, o, e) = try_player_env(capture, "580.159.04", mode, tag, extra);
    assert!(ok, "player failed: {o}\n{e}");
    (o, e)
}

/// [`run_player`] that returns whether the player succeeded.
pub fn try_player(capture: &str, version: &str, mode: &str, tag: &str) -> (bool, String, String) {
    try_player_env(capture, version, mode, tag, &[])
}

/// [`try_player`] with more environment.
pub fn try_player_env(
    capture: &str,
    version: &str,
    mode: &str,
    tag: &str,
    extra: &[(&str, &str)],
) -> (bool, String, String) {
    try_player_peer(capture, version, mode, tag, extra, true)
}

/// `peermem`: whether the (fake) nvidia-peermem module is loaded.
pub fn try_player_peer(
    capture: &str,
    version: &str,
    mode: &str,
    tag: &str,
    extra: &[(&str, &str)],
    peermem: bool,
) -> (bool, String, String) {
    let e = env();
    let dev = e.dir.join(format!("dev-{tag}"));
    std::fs::create_dir_all(&dev).unwrap();
    for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
        std::fs::write(dev.join(f), b"").unwrap();
    }
    std::fs::write(
        dev.join("version"),
        format!(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n"
        ),
    )
    .unwrap();
    // the fake NIC (fakeverbs.c) plays nvidia-peermem too: its module is "loaded"
    let _ = std::fs::remove_dir_all(dev.join("sys"));
    if peermem {
        std::fs::create_dir_all(dev.join("sys/module/nvidia_peermem")).unwrap();
    }
    let cap = e.dir.join(format!("{tag}.cap"));
    std::fs::write(&cap, capture).unwrap();
    let out = Command::new(e.dir.join("player"))
        .arg(&cap)
        .arg(e.dir.join("libcuda.so.1"))
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakenv.so").display()))
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("FAKENV_CAPTURE", &cap)
        .env("GDRSHIM_MODE", mode)
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("GDRSHIM_ROUTE", "nv503c")
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
