//! What the tests that load the real libgdrshim.so into child processes share: the shim built
//! once, a scratch folder of their own, and a command that must succeed.

pub mod fakedev;

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Env {
    pub dir: PathBuf,
    pub shim: PathBuf,
}

/// Runs `cmd`; fails the test with its stderr unless it succeeds.
pub fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Builds the release library with the test knobs (`--features knobs`, in target/knobs: the
/// fake driver's device folder, injected panics, the benchmark pause) and makes
/// `$TMP/gdrshim-<tag>-<pid>/dev`.
#[allow(dead_code)] // every test uses it; the start-up benchmark measures the shipped library
pub fn build(tag: &str) -> Env {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    sh(Command::new(env!("CARGO"))
        .args(["build", "--release", "--lib", "--locked", "--features", "knobs"])
        .env("CARGO_TARGET_DIR", root.join("target/knobs"))
        .current_dir(root));
    let dir = std::env::temp_dir().join(format!("gdrshim-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    Env { dir, shim: root.join("target/knobs/release/libgdrshim.so") }
}

/// The release library as it ships (no knobs), built by `cargo build --release`.
#[allow(dead_code)]
pub fn shipped() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    sh(Command::new(env!("CARGO")).args(["build", "--release", "--lib", "--locked"]).current_dir(root));
    root.join("target/release/libgdrshim.so")
}

/// `cc ARGS` in the scratch folder.
pub fn cc(env: &Env, args: &[&str]) {
    sh(Command::new("cc").args(args).current_dir(&env.dir));
}
