//! Under secure execution (AT_SECURE: a set-user-ID or setgid program) the shim is inert.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::scripts::{root, scratch};

/// Under AT_SECURE the shim is inert: a setgid program that preloads it (glibc allows that only
/// for a set-user-ID library in a system folder, named without a slash) gets a shim that reports
/// mode 0 and opens no file named by the environment. Needs root (CI runs as root): run with
/// `--include-ignored`, as scripts/dev/test.sh does when it is root.
#[test]
#[ignore = "needs root: installs a set-user-ID test copy of the shim into /usr/lib for the test's duration"]
fn inert_under_secure_execution() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let s = scratch("secure");
    let built = Command::new(env!("CARGO"))
        .args(["build", "--release", "--lib", "-q"])
        .current_dir(root())
        .status()
        .unwrap();
    assert!(built.success());
    let lib_dir = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .unwrap();
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    // the core preloaded itself, and the front with the core beside it (as a release ships them)
    let core = root().join("target/release/libgdrshim.so");
    let front = common::front_pair(&core, false);
    let beside = lib_dir.join("libgdrshim-core.so");
    assert!(!beside.exists(), "{} exists: not a machine to run this test on", beside.display());
    std::fs::copy(&core, &beside).unwrap();
    let _beside_cleanup = Cleanup(beside);
    let mut names = Vec::new();
    let mut cleanups = Vec::new();
    for (what, from) in [("core", &core), ("front", &front)] {
        let name = format!("libgdrshim-secure-test-{}-{what}.so", std::process::id());
        let lib = lib_dir.join(&name);
        std::fs::copy(from, &lib).unwrap();
        cleanups.push(Cleanup(lib.clone()));
        assert!(Command::new("chmod").arg("4755").arg(&lib).status().unwrap().success());
        names.push(name);
    }
    // a setgid bit only counts on a file system mounted without nosuid: the build tree's, not /tmp's
    let bin =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("secure_probe-{}", std::process::id()));
    let _bin_cleanup = Cleanup(bin.clone());
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(root().join("tests/c/secure_probe.c"))
        .status()
        .unwrap()
        .success());
    // setgid to a group the caller is not in: AT_SECURE even for root
    assert!(Command::new("chown").arg("root:65534").arg(&bin).status().unwrap().success());
    assert!(Command::new("chmod").arg("2755").arg(&bin).status().unwrap().success());
    let log = s.join("log.txt");
    let cap = s.join("cap.txt");
    let run = |preload: &str| {
        let out = Command::new(&bin)
            .env("LD_PRELOAD", preload)
            .env("GDRSHIM_MODE", "register")
            .env("GDRSHIM_LOG_LEVEL", "trace")
            .env("GDRSHIM_LOG_FILE", &log)
            .env("GDRSHIM_CAPTURE", &cap)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for name in &names {
        let (out, err) = run(name);
        assert_eq!(out, "secure=1 loaded=1 mode=0\n", "{name}: {err}");
        assert!(!err.contains("gdrshim"), "{name}: nothing said: {err}");
        assert!(
            !log.exists() && !cap.exists(),
            "{name}: no file named by the environment was created"
        );
    }
    // the same program made ordinary: the shim is live (the control of the experiment)
    assert!(Command::new("chmod").arg("0755").arg(&bin).status().unwrap().success());
    for name in &names {
        let (out, err) = run(name);
        assert_eq!(out, "secure=0 loaded=1 mode=3\n", "{name}: {err}");
    }
}
