//! Real CPython starts children (`subprocess.run`, which `vfork`s and closes with `close_range`
//! in the child; `os.posix_spawn`; `multiprocessing` with fork) inside a process that holds
//! gdrshim's fds (tests/c/pysub.py, the fake machine through ctypes, tests/c/pyrig.c), on both
//! routes: no child holds a dma-buf, node or log fd of gdrshim's, the parent's stay its own
//! (closed at the dereg), and the log keeps its file.

mod common;
use common::rig::{self, Rig};
use std::path::Path;
use std::process::Command;

/// `held`: how many fds of gdrshim's the parent holds (the log, and on the DMA-BUF route the
/// GPU node and the MR's dma-buf too).
fn pysub(tag: &str, rig: &Rig, held: usize) {
    let e = rig::build(tag, &[]);
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let so = e.dir.join("pyrig.so");
    common::cc(
        &e,
        &[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            so.to_str().unwrap(),
            c.join("pyrig.c").to_str().unwrap(),
            "-ldl",
            "-lpthread",
        ],
    );
    let dev = rig::dev_dir(&e, tag, rig);
    let log = e.dir.join(format!("{tag}.log"));
    let verbs = e.dir.join(if rig.new_verbs { "verbs-new" } else { "verbs-old" });
    let out = Command::new("python3")
        .arg(c.join("pysub.py"))
        .arg(&so)
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()))
        .env("LD_LIBRARY_PATH", &verbs)
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("GDRSHIM_LOG_FILE", &log)
        .env("FAKERM_DMABUF_CAPABLE", if rig.capable { "1" } else { "0" })
        .env("FAKE_LIBCUDA", e.dir.join("libcuda.so.1"))
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("pysub ok"),
        "{tag}: {stdout}\n{stderr}\nlog: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(stdout.contains(&format!("held={held} ")), "{tag}: {stdout}");
    assert!(!stderr.contains("gdrshim logs to stderr from now on"), "{tag}: {stderr}");
}

#[test]
fn cpython_children_on_the_dmabuf_route_keep_nothing_of_ours() {
    pysub("py-dmabuf", &rig::DMABUF, 3);
}

#[test]
fn cpython_children_on_the_nv503c_route_keep_nothing_of_ours() {
    pysub("py-nv503c", &rig::NV503C, 1);
}
