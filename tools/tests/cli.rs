//! The tool as users call it: exit codes 0 pass, 1 fail, 2 unusable input.

use std::path::Path;
use std::process::Command;

fn tool(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn verify_run_exit_codes() {
    let (rc, out) = tool(&["verify-run", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-patched-shim.log"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("RESULT: PASS") && out.contains("PASS nccl.wrong"), "{out}");
    // --expect-gdr on a one-node run: no NET connection, so no proof
    let (rc, out) = tool(&["verify-run", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-patched-shim.log", "--expect-gdr"]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("FAIL nccl.gdr"), "{out}");
    let (rc, out) = tool(&["verify-run", "--nccl-log", "/nonexistent.log"]);
    assert_eq!(rc, 2, "{out}");
    let (rc, out) = tool(&["verify-run", "--nccl-log", "Cargo.toml"]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("not a NCCL Tests log"), "{out}");
    let (rc, _) = tool(&["verify-run", "--expect-gdr"]);
    assert_eq!(rc, 2);
    let (rc, out) = tool(&["verify-run", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-stock.log", "--json"]);
    assert_eq!(rc, 0);
    assert!(out.trim_end().ends_with("\"result\":\"PASS\"}"), "{out}");
}

#[test]
fn doctor_exit_codes() {
    assert_eq!(tool(&["doctor", "--from", "tests/fixtures/state/rig-4090-ok"]).0, 0);
    let (rc, out) = tool(&["doctor", "--from", "tests/fixtures/state/rig-4090-bad", "--json"]);
    assert_eq!(rc, 1);
    assert!(out.contains("\"id\":\"p2p.matrix\",\"status\":\"FAIL\""), "{out}");
    assert_eq!(tool(&["doctor", "--from", "tests"]).0, 2, "not a saved state");
    assert_eq!(tool(&["doctor"]).0, 2);
}

#[test]
fn dmabuf_probe_says_what_it_cannot_do() {
    let (rc, out) = tool(&["dmabuf-probe"]);
    if Path::new("/proc/driver/nvidia/version").exists() {
        // a GPU machine: the two GPU steps run for real
        assert!(out.contains("PASS dmabuf.alloc"), "{out}");
        return;
    }
    // no NVIDIA driver (CI): the probe says so and does not fail
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("INFO dmabuf.libcuda") && out.contains("cannot be loaded"), "{out}");
}
