//! `gpu-facts`: each GPU's compute capability and GPU_DIRECT_RDMA_WRITES_ORDERING as libcuda
//! answers them, the line scripts read (scripts/deploy.sh, the .deb), and the verdict on NCCL's
//! forced flush. The CI machine has no GPU: a stand-in libcuda (fake-libcuda.c, built here with
//! cc) answers the attributes FAKE_CUDA_ATTRS names, passed with --libcuda.

mod common;

use std::path::Path;
use std::process::Command;

fn facts(attrs: Option<&str>, libcuda: &Path) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"));
    c.args(["gpu-facts", "--libcuda"]).arg(libcuda).env_remove("FAKE_CUDA_ATTRS");
    if let Some(a) = attrs {
        c.env("FAKE_CUDA_ATTRS", a);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn an_sm_120_gpu_below_owner_needs_the_forced_flush_and_says_so() {
    let (rc, out) = facts(Some("75=12,76=0,118=0"), common::fake_libcuda("factscuda"));
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("| sm=120 writes_ordering=0 needs_forced_flush=1"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("WARN") && l.contains("gpu.forced-flush")), "{out}");
    assert!(out.contains("/etc/nccl.conf (deploy.sh writes it)"), "{out}");
}

#[test]
fn below_sm_90_or_at_owner_nothing_is_needed() {
    for (attrs, line) in [
        ("75=8,76=9,118=0", "sm=89 writes_ordering=0 needs_forced_flush=0"),
        ("75=9,76=0,118=100", "sm=90 writes_ordering=100 needs_forced_flush=0"),
    ] {
        let (rc, out) = facts(Some(attrs), common::fake_libcuda("factscuda"));
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains(line), "{out}");
        assert!(
            out.lines().any(|l| l.starts_with("PASS") && l.contains("gpu.forced-flush")),
            "{out}"
        );
    }
}

#[test]
fn facts_that_cannot_be_read_are_could_not_check() {
    // libcuda does not answer 118: nothing is taken as needed
    let (rc, out) = facts(Some("75=12,76=0"), common::fake_libcuda("factscuda"));
    assert_eq!(rc, 2, "{out}");
    assert!(
        out.contains("needs_forced_flush=unknown") && !out.contains("needs_forced_flush=1"),
        "{out}"
    );
    let (rc, out) = facts(None, Path::new("/nonexistent/libcuda.so.1"));
    assert_eq!(rc, 2, "{out}");
    assert!(!out.contains("needs_forced_flush"), "{out}");
}
