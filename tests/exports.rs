//! gdrshim's exported CUDA entry points, for programs linked against them.

use std::path::Path;
use std::process::Command;

mod common;

/// A program that calls gdrshim's exported cuMemAlloc_v2 while libcuda is loaded RTLD_LOCAL
/// reaches libcuda's own definition (found by name; RTLD_NEXT cannot see it).
#[test]
fn exported_cuda_entry_points_reach_a_locally_loaded_libcuda() {
    let e = common::build("exports");
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    // -Bsymbolic: like the real libcuda, its own function addresses are its own, not interposed.
    common::cc(
        &e,
        &[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wl,-Bsymbolic",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            "libcuda.so.1",
            c.join("fakecuda.c").to_str().unwrap(),
        ],
    );
    common::cc(&e, &["-O1", "-o", "cuda_export", c.join("cuda_export.c").to_str().unwrap(), "-ldl"]);
    let bin = e.dir.join("cuda_export");
    let out = Command::new(&bin).arg(e.dir.join("libcuda.so.1")).env("LD_PRELOAD", &e.shim).env("GDRSHIM_SUMMARY", "0").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rc=0 ptr=0x1234000\n");
    let without = Command::new(&bin).arg(e.dir.join("libcuda.so.1")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&without.stdout), "rc=-1 ptr=0\n", "without the shim nothing exports cuMemAlloc_v2 globally");
}

/// The library as it ships has none of the tests' and benchmarks' knobs: no `gdrshim_bench_pause`,
/// and their variables change nothing but a warning (a test build reads them).
#[test]
fn the_shipped_library_has_no_knobs() {
    let lib = common::shipped();
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("nm (binutils)");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(syms.contains(" gdrshim_counters") && syms.contains(" ioctl"), "{syms}");
    assert!(!syms.contains("gdrshim_bench_pause"), "a release build exports the benchmark pause");
    let knobs = common::build("exports-knobs");
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&knobs.shim).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("gdrshim_bench_pause"), "the knobs build has it");
}

/// The replay tool behaves like a command: help and version on stdout with 0, an unknown option
/// on stderr with 2.
#[test]
fn the_replay_tool_answers_help_version_and_unknown_options() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gdrshim-replay"));
    let run = |a: &str| Command::new(bin).arg(a).output().unwrap();
    let h = run("--help");
    assert_eq!(h.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&h.stdout).starts_with("usage: gdrshim-replay"));
    let v = run("--version");
    assert_eq!(
        (v.status.code(), String::from_utf8_lossy(&v.stdout).trim().to_string()),
        (Some(0), format!("gdrshim-replay {}", env!("CARGO_PKG_VERSION")))
    );
    let u = run("--frobnicate");
    assert_eq!(u.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&u.stderr).contains("unknown option --frobnicate"));
}
