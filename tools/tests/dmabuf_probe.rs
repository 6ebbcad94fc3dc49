//! `dmabuf-probe`'s verdicts: 2 "could not check here" when libcuda cannot be loaded (or finds no
//! GPU, or step 3 has no HCA), 1 when a step fails where it could run, 0 when every step works.
//! The CI machine has no GPU: the GPU side is played by a stand-in libcuda (fake-libcuda.c,
//! built here with cc), passed with --libcuda.

mod common;

use std::path::Path;
use std::process::Command;

fn probe(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .arg("dmabuf-probe")
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

fn line_of<'a>(out: &'a str, id: &str) -> &'a str {
    // "STATUS id summary", the status one word or COULD NOT CHECK
    let is = |l: &str| {
        ["COULD NOT CHECK", "PASS", "WARN", "FAIL", "INFO"]
            .iter()
            .any(|w| l.strip_prefix(w).is_some_and(|r| r.split_whitespace().next() == Some(id)))
    };
    out.lines().find(|l| is(l)).unwrap_or_else(|| panic!("no {id} line: {out}"))
}

/// Whether this machine has an RDMA device, which would make step 3 run for real.
fn hca_here() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn no_libcuda_is_could_not_check_exit_2() {
    let (rc, out) = probe(&["--libcuda", "/nonexistent/libcuda.so.1"], &[]);
    assert_eq!(rc, 2, "{out}");
    assert!(
        line_of(&out, "dmabuf.libcuda").starts_with("COULD NOT CHECK")
            && out.contains("/nonexistent/libcuda.so.1 cannot be loaded"),
        "{out}"
    );
    assert!(out.contains("could not check here: libcuda"), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("PASS") || l.starts_with("FAIL")), "{out}");
    // a bare name the dynamic loader searches for (as the default libcuda.so.1) and finds nowhere
    let (rc, out) = probe(&["--libcuda", "libcuda-gdrshim-test-none.so.1"], &[]);
    assert_eq!(rc, 2, "{out}");
    assert!(
        out.contains("libcuda-gdrshim-test-none.so.1 cannot be loaded")
            && out.contains("could not check here: libcuda"),
        "{out}"
    );
}

#[test]
fn no_gpu_or_no_such_device_is_could_not_check() {
    let lib = common::fake_libcuda("fakecuda").to_str().unwrap();
    let (rc, out) = probe(&["--libcuda", lib], &[("FAKE_CUDA", "nodevice")]);
    assert_eq!(rc, 2, "{out}");
    assert!(
        line_of(&out, "dmabuf.init").contains("CUDA_ERROR_NO_DEVICE")
            && out.contains("could not check here: libcuda finds no GPU"),
        "{out}"
    );
    let (rc, out) = probe(&["--libcuda", lib, "--device", "3"], &[("FAKE_CUDA", "ok")]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("could not check here: no CUDA device 3"), "{out}");
}

#[test]
fn a_failing_step_is_exit_1() {
    let lib = common::fake_libcuda("fakecuda").to_str().unwrap();
    // a GeForce: the driver will not export a dma-buf
    let (rc, out) = probe(&["--libcuda", lib], &[("FAKE_CUDA", "geforce")]);
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "dmabuf.attribute").starts_with("WARN"), "{out}");
    let l = line_of(&out, "dmabuf.export");
    assert!(l.starts_with("FAIL") && l.contains("CUDA_ERROR_NOT_SUPPORTED (801)"), "{out}");
    assert!(!out.contains("could not check"), "{out}");
    let (rc, out) = probe(&["--libcuda", lib], &[("FAKE_CUDA", "oomgpu")]);
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "dmabuf.alloc").starts_with("FAIL"), "{out}");
    // a libcuda without the driver API (too old, or not libcuda at all)
    let (rc, out) = probe(&["--libcuda", "libc.so.6"], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        line_of(&out, "dmabuf.libcuda").starts_with("FAIL") && out.contains("lacks cuInit"),
        "{out}"
    );
}

#[test]
fn the_gpu_steps_pass_and_step_3_needs_an_hca() {
    let lib = common::fake_libcuda("fakecuda").to_str().unwrap();
    // step 3 must never hand the stand-in's /dev/null "dma-buf" to a real HCA: where there is
    // one, the verbs library is one that cannot be loaded
    let mut args = vec!["--libcuda", lib, "--size", "4096"];
    if hca_here() {
        args.extend(["--libibverbs", "/nonexistent/libibverbs.so.1"]);
    }
    let (rc, out) = probe(&args, &[("FAKE_CUDA", "ok")]);
    for id in ["dmabuf.libcuda", "dmabuf.attribute", "dmabuf.alloc", "dmabuf.export"] {
        assert!(line_of(&out, id).starts_with("PASS"), "{id}: {out}");
    }
    assert!(line_of(&out, "dmabuf.alloc").contains("4096 bytes"), "{out}");
    // no HCA here: GPU steps passing is not "GPUDirect RDMA works"
    assert_eq!(rc, 2, "{out}");
    assert!(line_of(&out, "dmabuf.verbs").starts_with("COULD NOT CHECK"), "{out}");
    assert!(
        out.contains("could not check here:")
            && out.contains("step 3 (ibv_reg_dmabuf_mr) could not run"),
        "{out}"
    );
    // and a verbs library that cannot be loaded says so (any machine)
    let (rc, out) = probe(
        &["--libcuda", lib, "--size", "4096", "--libibverbs", "/nonexistent/libibverbs.so.1"],
        &[("FAKE_CUDA", "ok")],
    );
    assert_eq!(rc, 2, "{out}");
    assert!(
        line_of(&out, "dmabuf.verbs").contains("/nonexistent/libibverbs.so.1 cannot be loaded"),
        "{out}"
    );
}

/// On a GPU machine the real libcuda is probed; the exit code follows what was found.
#[test]
#[ignore = "needs the NVIDIA driver and libcuda: run on the GPU machine with --ignored"]
fn the_real_libcuda_where_there_is_one() {
    assert!(
        Path::new("/proc/driver/nvidia/version").exists(),
        "no NVIDIA driver here: this test is for the GPU machine"
    );
    let (rc, out) = probe(&[], &[]);
    assert!(line_of(&out, "dmabuf.libcuda").starts_with("PASS"), "{out}");
    let want = if out.lines().any(|l| l.starts_with("FAIL")) {
        1
    } else if out.contains("could not check here:") {
        2
    } else {
        0
    };
    assert_eq!(rc, want, "{out}");
}
