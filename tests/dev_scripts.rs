//! The developer's suite (scripts/dev/test.sh) and release build (build-release.sh) as their
//! callers see them: every missing prerequisite named at once before any phase, and a failed phase
//! or build exits 1, as their help says.

use std::path::{Path, PathBuf};

mod common;
use common::scripts::{run, scratch, script, write_exe};

/// A folder of commands for a PATH of its own: links to the real `real` ones, and scripts `fakes`.
fn path_of(at: &Path, real: &[&str], fakes: &[(&str, &str)]) -> PathBuf {
    let bin = at.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in real {
        let found = std::env::var("PATH")
            .unwrap()
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} is not on this PATH"));
        std::os::unix::fs::symlink(found, bin.join(name)).unwrap();
    }
    for (name, body) in fakes {
        write_exe(&bin.join(name), &format!("#!/bin/bash\n{body}\n"));
    }
    bin
}

/// What test.sh runs before its first phase: a shell and the few tools of its prologue.
const SHELL_TOOLS: &[&str] = &["bash", "dirname", "sed", "head", "awk", "sort", "cat", "id"];

#[test]
fn the_suite_names_every_missing_prerequisite_at_once_before_any_phase() {
    // issue 31: without libibverbs-dev the suite failed after 5.5 minutes; without shellcheck a
    // phase said NOT RUN. Here: no shellcheck, no git, no rdma-core examples, no Open MPI or Slurm,
    // and a compiler that finds no verbs.h.
    let s = scratch("prereq");
    let shell: Vec<&str> = SHELL_TOOLS.iter().copied().filter(|t| *t != "id").collect();
    let bin = path_of(
        &s,
        &shell,
        &[
            // a user who is not root: the install command with sudo (issue 40: root has none)
            ("id", "[ \"$1\" = -u ] && echo \"${FAKE_UID:-1000}\""),
            ("cc", "for a in \"$@\"; do [ \"$a\" != -E ] || { echo 'fatal error: infiniband/verbs.h: No such file' >&2; exit 1; }; done"),
            ("c++", "exit 0"),
            ("objdump", "exit 0"),
            ("dpkg-deb", "exit 0"),
            (
                "cargo",
                "case \"$1\" in fmt|clippy) [ \"$2\" = --version ] && exit 0 ;; esac; touch \"$(dirname \"$0\")/../cargo-ran\"; exit 101",
            ),
            ("rustc", "echo 'rustc 1.95.0 (59807616e 2026-04-14)'"),
        ],
    );
    let env = [("PATH", bin.to_str().unwrap())];
    let t0 = std::time::Instant::now();
    let r = run(&script("scripts/dev/test.sh"), &[], &env);
    assert_eq!(r.rc, 2, "{}{}", r.out, r.err);
    assert_eq!(r.out, "", "no phase started");
    assert_eq!(
        r.err,
        "test.sh: missing: git shellcheck libibverbs-dev ibverbs-utils patchelf openmpi-bin slurmctld slurmd (sudo apt-get install git shellcheck libibverbs-dev ibverbs-utils patchelf openmpi-bin slurmctld slurmd); nothing run\n"
    );
    assert!(!s.join("cargo-ran").exists(), "nothing built");
    let r = run(&script("scripts/dev/test.sh"), &[], &[env[0], ("FAKE_UID", "0")]);
    assert_eq!(r.err, "test.sh: missing: git shellcheck libibverbs-dev ibverbs-utils patchelf openmpi-bin slurmctld slurmd (apt-get install git shellcheck libibverbs-dev ibverbs-utils patchelf openmpi-bin slurmctld slurmd); nothing run\n");
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "found at once: {:?}", t0.elapsed());
    // CI's list to install: the same names
    let r = run(&script("scripts/dev/test.sh"), &["--missing-packages"], &env);
    assert_eq!(
        (r.rc, r.out.as_str()),
        (0, "git shellcheck libibverbs-dev ibverbs-utils patchelf openmpi-bin slurmctld slurmd\n"),
        "{}",
        r.err
    );
    // Rust's own parts are named with their own command
    let s = scratch("prereq-rust");
    let mut fakes = vec![
        ("cc", "exit 0"),
        ("c++", "exit 0"),
        ("git", "exit 0"),
        ("objdump", "exit 0"),
        ("shellcheck", "exit 0"),
    ];
    for lab in ["ibv_rc_pingpong", "patchelf", "mpirun", "slurmctld", "slurmd", "srun"] {
        fakes.push((lab, "exit 0"));
    }
    fakes.extend([
        ("dpkg-deb", "exit 0"),
        ("cargo", "[ \"$1\" = fmt ] && exit 0; exit 1"),
        ("rustc", "exit 0"),
    ]);
    let bin = path_of(&s, SHELL_TOOLS, &fakes);
    let r = run(&script("scripts/dev/test.sh"), &[], &[("PATH", bin.to_str().unwrap())]);
    assert_eq!(
        (r.rc, r.err.as_str()),
        (2, "test.sh: missing: clippy (rustup component add clippy); nothing run\n"),
        "{}",
        r.out
    );
}

/// Every prerequisite there, and a cargo that fails as `cargo test` does (101) at `fmt`.
fn failing_toolchain(s: &Path, cargo: &str) -> PathBuf {
    let ok = "exit 0";
    path_of(
        s,
        SHELL_TOOLS,
        &[
            ("cc", ok),
            ("c++", ok),
            ("git", ok),
            ("objdump", ok),
            ("shellcheck", ok),
            ("dpkg-deb", ok),
            ("ibv_rc_pingpong", ok),
            ("patchelf", ok),
            ("mpirun", ok),
            ("slurmctld", ok),
            ("slurmd", ok),
            ("srun", ok),
            ("cargo", cargo),
            ("rustc", "echo 'rustc 1.95.0 (59807616e 2026-04-14)'"),
        ],
    )
}

#[test]
fn a_failing_phase_exits_1_as_the_help_says_not_with_cargos_101() {
    let s = scratch("phase101");
    let bin = failing_toolchain(&s, "case \"$*\" in *--version*) exit 0 ;; esac; echo \"cargo $*: 1 test failed\" >&2; exit 101");
    let r = run(&script("scripts/dev/test.sh"), &[], &[("PATH", bin.to_str().unwrap())]);
    assert_eq!(r.rc, 1, "{}{}", r.out, r.err);
    assert!(r.out.contains("test.sh: phase format\n"), "{}", r.out);
    assert!(
        r.err.contains("test.sh: phase format FAILED after ")
            && r.err.contains("(its command exited 101)"),
        "{}",
        r.err
    );
    let help = run(&script("scripts/dev/test.sh"), &["--help"], &[]).out;
    assert!(help.contains("1 a phase failed"), "{help}");
}

#[test]
fn a_failed_release_build_exits_1_and_says_so() {
    // issue 31: cargo's 101 came through, with only cargo's output
    let s = scratch("release101");
    let mut path = failing_toolchain(&s, "echo 'error[E0308]: mismatched types' >&2; exit 101")
        .display()
        .to_string();
    path.push(':');
    path.push_str(&std::env::var("PATH").unwrap());
    let out = s.join("dist");
    let r = run(
        &script("scripts/dev/build-release.sh"),
        &["--out", out.to_str().unwrap()],
        &[("PATH", path.as_str())],
    );
    assert_eq!(r.rc, 1, "{}{}", r.out, r.err);
    assert!(
        r.err.contains("build-release: building the library and the tools\n"),
        "progress first: {}",
        r.err
    );
    assert!(
        r.err.contains(
            "build-release: building the library and the tools failed (cargo exited 101; its messages are above): nothing written"
        ),
        "{}",
        r.err
    );
    assert!(!out.exists(), "nothing written");
}
