//! The consumer lab's fake wire (issue 28 item 6), without any consumer: tests/lab/fakewire*.c
//! built as a libibverbs.so.1 with rdma-core's symbol versions, its stand-in libmlx5 and sysfs
//! preload, and its own verbs client (tests/lab/wireclient.c) run against it with host memory and
//! with a stand-in libcuda (tests/lab/labcuda.c). The H200 runs the real consumers over it
//! (tests/gpu/run-h200-lab.sh); this proves the wire those runs stand on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn lab() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab");
        let s = |f: &str| src.join(f).to_str().unwrap().to_string();
        let dir = std::env::temp_dir().join(format!("gdrshim-lab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cc = |args: &[&str]| {
            let out = Command::new("cc").args(["-O1", "-Wall", "-Wextra", "-Werror"]).args(args).current_dir(&dir).output().unwrap();
            assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let vmap = format!("-Wl,--version-script={}", s("fakewire.map"));
        cc(&[
            "-shared",
            "-fPIC",
            &vmap,
            "-Wl,-soname,libibverbs.so.1",
            "-o",
            "libibverbs.so.1",
            &s("fakewire.c"),
            &s("fakewire_qp.c"),
            &s("fakewire_data.c"),
            "-ldl",
            "-lpthread",
        ]);
        let mmap = format!("-Wl,--version-script={}", s("fakemlx5.map"));
        cc(&["-shared", "-fPIC", &mmap, "-Wl,-soname,libmlx5.so.1", "-o", "libmlx5.so.1", &s("fakemlx5.c")]);
        cc(&["-shared", "-fPIC", "-o", "fakesys.so", &s("fakesys.c"), "-ldl"]);
        cc(&["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", "libcuda.so.1", &s("labcuda.c")]);
        let inc = format!("-I{}", src.display());
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        cc(&[&inc, "-o", "wireclient", &s("wireclient.c"), "-L.", "-l:libibverbs.so.1", &rpath]);
        cc(&[
            &inc,
            "-o",
            "wireclient-gpu",
            &s("wireclient.c"),
            "-Wl,--no-as-needed",
            "-L.",
            "-l:libibverbs.so.1",
            "-l:libcuda.so.1",
            &rpath,
        ]);
        dir
    })
}

/// Runs a client; returns its stdout and the fake's summary line (from FAKEWIRE_REPORT).
fn run(bin: &str, mode: &str, envs: &[(&str, &str)]) -> (String, String) {
    let report = lab().join(format!("report-{bin}-{mode}-{}", envs.len()));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(lab().join(bin)).arg(mode).env("FAKEWIRE_REPORT", &report).envs(envs.iter().copied()).output().unwrap();
    let (so, se) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "{bin} {mode}: {so}{se}");
    (so, std::fs::read_to_string(&report).unwrap_or_default())
}
fn field(summary: &str, key: &str) -> u64 {
    let k = format!(" {key}=");
    let at = summary.find(&k).unwrap_or_else(|| panic!("{key} in {summary}")) + k.len();
    summary[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn the_wire_moves_bytes_and_refuses_what_an_hca_refuses() {
    let (out, sum) = run("wireclient", "host", &[]);
    assert!(out.contains("wireclient host: 98 checks passed"), "{out}");
    // registrations by entry point and kind, the probe, the refusals, the bytes
    for (k, v) in [
        ("reg_mr", 3),
        ("reg_mr_iova2", 1),
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
    assert_eq!((field(&sum, "gpu_peermem_mr"), field(&sum, "bytes_h2g"), field(&sum, "wire_errors")), (1, 65536, 0), "{sum}");
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
    assert_eq!(String::from_utf8_lossy(&out.stdout), "RoCE v2\nfwnet0\n0x020000\n16\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!root.join("sys/kernel/mm/memory_peers").exists(), "no peermem unless FAKEWIRE_PEERMEM=1");
}
