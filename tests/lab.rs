//! The consumer lab's fake wire (issue 28 item 6) in one process, without any consumer:
//! tests/lab/fakewire*.c built as a provider of rdma-core's own libibverbs.so.1
//! (tests/lab/fwprovider.c), its sysfs preload, and its own verbs client (tests/lab/wireclient.c)
//! run through rdma-core on lab host 0 with host memory and with a stand-in libcuda
//! (tests/lab/labcuda.c). The H200 runs the real consumers
//! over it (tests/gpu/run-h200-lab.sh); this proves the wire those runs stand on. Many hosts, one
//! process each: tests/lab_hosts.rs.

use std::process::Command;

mod common;
use common::lab::{field, lab};

/// Runs a client; returns its stdout and the fake's summary line (from FAKEWIRE_REPORT).
fn run(bin: &str, mode: &str, envs: &[(&str, &str)]) -> (String, String) {
    let report = lab().join(format!("report-{bin}-{mode}-{}", envs.len()));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(lab().join("host"))
        .arg("0")
        .arg(lab().join("bin").join(bin))
        .arg(mode)
        .env("FAKEWIRE_REPORT", &report)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{bin} {mode}: {so}{se}");
    (so, std::fs::read_to_string(&report).unwrap_or_default())
}

#[test]
fn the_wire_moves_bytes_and_refuses_what_an_hca_refuses() {
    let (out, sum) = run("wireclient", "host", &[]);
    assert!(out.contains("wireclient host: 108 checks passed"), "{out}");
    // registrations by entry point and kind, the probe, the refusals, the bytes (rdma-core's
    // ibv_reg_mr is a jump to its ibv_reg_mr_iova2: the provider sees every one as that)
    for (k, v) in [
        ("reg_mr", 0),
        ("reg_mr_iova2", 4),
        ("reg_dmabuf_mr", 3),
        ("dmabuf_probe", 2),
        ("dmabuf_refused", 1),
        ("bad_args", 1),
        ("host_mr", 3),
        ("dereg", 3),
    ] {
        assert_eq!(field(&sum, k), v, "{k} in {sum}");
    }
    assert_eq!(field(&sum, "gpu_dmabuf_mr") + field(&sum, "gpu_plain_refused"), 0, "{sum}");
    // WRITE 65536 + READ 65536 + SEND 4000 + inline 48 + WRITE_IMM 1024 + UD 100
    assert_eq!(field(&sum, "bytes_h2h"), 65536 * 2 + 4000 + 48 + 1024 + 100, "{sum}");
}

#[test]
fn a_plain_mr_over_gpu_memory_is_refused_without_peermem() {
    let (out, sum) = run("wireclient-gpu", "gpu", &[]);
    assert!(out.contains("2 checks passed"), "{out}");
    assert_eq!((field(&sum, "gpu_plain_refused"), field(&sum, "gpu_peermem_mr")), (1, 0), "{sum}");
}

#[test]
fn with_peermem_played_gpu_memory_moves_through_libcuda() {
    let (out, sum) = run("wireclient-gpu", "gpu", &[("FAKEWIRE_PEERMEM", "1")]);
    assert!(out.contains("13 checks passed"), "{out}");
    assert_eq!(
        (field(&sum, "gpu_peermem_mr"), field(&sum, "bytes_h2g"), field(&sum, "wire_errors")),
        (1, 65536, 0),
        "{sum}"
    );
}

#[test]
fn the_sysfs_tree_shows_a_roce_v2_port() {
    let root = lab().join("sys");
    let out = Command::new("cat")
        .args([
            "/sys/class/infiniband/fwroce_0/ports/1/gid_attrs/types/3",
            "/sys/class/infiniband/fwroce_0/ports/1/gid_attrs/ndevs/3",
            "/sys/class/infiniband/fwroce_0/device/class",
            "/sys/class/infiniband/fwroce_0/device/max_link_width",
        ])
        .env("LD_PRELOAD", lab().join("fakesys.so"))
        .env("FAKEWIRE_SYSFS", &root)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "RoCE v2\nfwnet0\n0x020000\n16\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !root.join("sys/kernel/mm/memory_peers").exists(),
        "no peermem unless FAKEWIRE_PEERMEM=1"
    );
}
