//! What the tests that load the real libgdrshim.so into child processes share: the shim built
//! once, a scratch folder of their own, and a command that must succeed.

pub mod fakedev;
pub mod fakes;
pub mod lab;
#[allow(dead_code)] // tests/integration.rs and tests/interpose.rs use it
pub mod player;
#[allow(dead_code)] // the tests that run programs of tests/c use it
pub mod rig;
#[allow(dead_code)] // the scripts' tests use it
pub mod scripts;
#[allow(dead_code)] // the layering tests use it
pub mod source;

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)] // the scripts' tests use only front_pair
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
    let core = root.join("target/knobs/release/libgdrshim.so");
    // GDRSHIM_TEST_VIA_FRONT=1: every test through the front, as the release ships the two
    let shim = if via_front() { front_pair(&core, true) } else { core };
    Env { dir, shim }
}

/// Whether the tests run through the front (GDRSHIM_TEST_VIA_FRONT=1).
#[allow(dead_code)]
pub fn via_front() -> bool {
    std::env::var_os("GDRSHIM_TEST_VIA_FRONT").is_some_and(|v| v == "1")
}

/// The core library with the test knobs, preloaded itself (what `build` makes).
#[allow(dead_code)]
pub fn knobs_core() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/knobs/release/libgdrshim.so")
}

/// The front library (src/front, a cargo workspace of its own) beside `core` as a release ships
/// them: `<target>/front-pair[-knobs]/libgdrshim.so` and `libgdrshim-core.so`. Returns the front.
#[allow(dead_code)]
pub fn front_pair(core: &Path, knobs: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (target, pair) = if knobs {
        ("target/knobs-front", "target/front-pair-knobs")
    } else {
        ("target/front", "target/front-pair")
    };
    let mut c = Command::new(env!("CARGO"));
    c.args(["build", "--release", "--locked", "--manifest-path", "src/front/Cargo.toml"])
        .env("CARGO_TARGET_DIR", root.join(target));
    if knobs {
        c.args(["--features", "knobs"]);
    }
    sh(c.current_dir(root));
    let pair = root.join(pair);
    std::fs::create_dir_all(&pair).unwrap();
    // each through a new name and a rename: a test of another binary may be loading them now
    let tmp = format!(".{}-{:?}", std::process::id(), std::thread::current().id());
    for (from, to) in [
        (root.join(target).join("release/libgdrshim_front.so"), "libgdrshim.so"),
        (core.to_path_buf(), "libgdrshim-core.so"),
    ] {
        // the same bytes already there stay: a running process of another test checks that the
        // file it was loaded from is still the one at its path (the front's own-file check)
        if std::fs::read(pair.join(to)).ok() == Some(std::fs::read(&from).unwrap()) {
            continue;
        }
        let t = pair.join(format!("{to}{tmp}"));
        std::fs::copy(&from, &t).unwrap();
        std::fs::rename(&t, pair.join(to)).unwrap();
    }
    pair.join("libgdrshim.so")
}

/// The release library as it ships (no knobs), built by `cargo build --release`.
#[allow(dead_code)]
pub fn shipped() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    sh(Command::new(env!("CARGO"))
        .args(["build", "--release", "--lib", "--locked"])
        .current_dir(root));
    root.join("target/release/libgdrshim.so")
}

/// `cc ARGS` in the scratch folder.
#[allow(dead_code)]
pub fn cc(env: &Env, args: &[&str]) {
    sh(Command::new("cc").args(args).current_dir(&env.dir));
}
