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
