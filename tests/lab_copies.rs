//! Two copies of rdma-core's own libibverbs in one process (issue 46, defect 3): the system's
//! `libibverbs.so.1` and a wheel's renamed copy (another file name and soname, made here with
//! `patchelf` as auditwheel makes it), each with a lab provider of its own (the lab's, and a copy
//! of it whose NEEDED names the renamed copy; both named in RDMAV_DRIVERS, each registers with
//! its own copy). A library of each copy (tests/lab/copyuser.c, loaded RTLD_LOCAL) registers host
//! and GPU memory through `ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2` and
//! `ibv_reg_dmabuf_mr` (tests/lab/copies.c) under gdrshim, with the fake driver and the lab's
//! stand-in libcuda. rdma-core 44's `ibv_reg_mr` and `ibv_reg_mr_iova` jump to
//! `ibv_reg_mr_iova2@plt`, which enters gdrshim's hook again from inside gdrshim's own call: each
//! call must still reach its caller's copy (a provider called by the other copy says MIXED and
//! refuses) and each MR be decided once (gdrshim's summary: `host_mrs` and `pass0_hits`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::lab::{field, lab};

const WHEEL: &str = "libibverbs-1a2b3c4d.so.1";

/// The folder with the renamed copy, its provider, the two libraries and the program; and the
/// gdrshim build (with the test knobs) and its fake driver folder.
fn copies() -> &'static (PathBuf, common::Env) {
    static C: OnceLock<(PathBuf, common::Env)> = OnceLock::new();
    C.get_or_init(|| {
        let e = common::build("lab-copies");
        let dir = lab().join("copies");
        std::fs::create_dir_all(&dir).unwrap();
        let system =
            std::fs::canonicalize(Path::new(&cc_output(&["-print-file-name=libibverbs.so.1"])))
                .expect("rdma-core's libibverbs.so.1 (libibverbs1)");
        // the wheel's copy: the same library under another name and soname
        std::fs::copy(&system, dir.join(WHEEL)).unwrap();
        patchelf(&["--set-soname", WHEEL, dir.join(WHEEL).to_str().unwrap()]);
        // its provider: the lab's, its NEEDED the renamed copy, found beside it
        let wheel_provider = dir.join("libfwrocewheel-rdmav34.so");
        std::fs::copy(lab().join("provider/libfwroce-rdmav34.so"), &wheel_provider).unwrap();
        let p = wheel_provider.to_str().unwrap();
        patchelf(&["--replace-needed", "libibverbs.so.1", WHEEL, p]);
        patchelf(&["--set-rpath", dir.to_str().unwrap(), p]);
        let src = |f: &str| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/lab")
                .join(f)
                .to_str()
                .unwrap()
                .to_string()
        };
        let out = |f: &str| dir.join(f).to_str().unwrap().to_string();
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        let user = src("copyuser.c");
        cc(&["-shared", "-fPIC", "-o", &out("libcopyuser1.so"), &user, "-l:libibverbs.so.1"]);
        cc(&[
            "-shared",
            "-fPIC",
            "-o",
            &out("libcopyuser2.so"),
            &user,
            &format!("-L{}", dir.display()),
            &format!("-l:{WHEEL}"),
            &rpath,
        ]);
        cc(&["-o", &out("copies"), &src("copies.c"), "-ldl"]);
        (dir, e)
    })
}

fn cc_output(args: &[&str]) -> String {
    let o = Command::new(std::env::var("CC").unwrap_or("cc".into())).args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn cc(args: &[&str]) {
    let mut all = vec!["-O1", "-Wall", "-Wextra", "-Werror"];
    all.extend_from_slice(args);
    common::sh(Command::new(std::env::var("CC").unwrap_or("cc".into())).args(&all));
}

fn patchelf(args: &[&str]) {
    let out = Command::new("patchelf").args(args).output().unwrap_or_else(|e| {
        panic!("patchelf (bash scripts/dev/test.sh --missing-packages names it): {e}")
    });
    assert!(out.status.success(), "patchelf {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `copies ORDER 2` as lab host 0 under gdrshim on `route`: (stdout's line, gdrshim's summary,
/// stderr).
fn run(order: &str, route: &str) -> (String, String, String) {
    let (dir, e) = copies();
    let state = lab().join("labs").join(format!("copies-{route}-{order}"));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    // the NV503C route pins GPU memory by address: the host has nvidia-peermem
    let nv503c = route == "nv503c";
    std::fs::write(state.join("faults"), if nv503c { "peermem 0\n" } else { "" }).unwrap();
    let dev = e.dir.join(format!("dev-{route}-{order}"));
    let _ = std::fs::remove_dir_all(&dev);
    common::fakedev::fake_dev(&dev, &["nvidiactl", "nvidia-uvm", "nvidia0"], nv503c);
    let out = Command::new(lab().join("host"))
        .args(["0", dir.join("copies").to_str().unwrap(), order, "2"])
        .current_dir(dir)
        .env("FAKEWIRE_LAB", &state)
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), lab().join("fakerm.so").display()))
        .env("LD_LIBRARY_PATH", format!("{}:{}", dir.display(), lab().join("labcuda").display()))
        .env("RDMAV_DRIVERS", dir.join("libfwrocewheel"))
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_ROUTE", route)
        .env("FAKERM_DMABUF_CAPABLE", if nv503c { "0" } else { "1" })
        .env_remove("FAKEWIRE_REPORT")
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let line = so.lines().find(|l| l.starts_with("copies ")).unwrap_or_default().to_string();
    assert!(out.status.success() && line.ends_with(" ok"), "copies {order} on {route}: {so}\n{se}");
    assert!(
        !se.contains("MIXED"),
        "copies {order} on {route}: a call reached the other copy:\n{se}"
    );
    let summary = se
        .lines()
        .find(|l| l.starts_with("gdrshim: summary "))
        .unwrap_or_else(|| panic!("no gdrshim summary: {se}"))
        .to_string();
    (line, summary, se)
}

#[test]
fn each_copy_is_reached_by_its_own_callers_and_each_mr_is_decided_once() {
    for order in ["12", "21"] {
        // DMA-BUF route: GPU memory by address becomes gdrshim's dma-buf MR; the program's own
        // ibv_reg_dmabuf_mr of gdrshim's export goes through
        let (line, sum, _) = run(order, "dmabuf");
        // 2 rounds x 2 copies x 3 entry points, and one ibv_reg_dmabuf_mr per round and copy
        assert!(line.contains("host_mrs=12 gpu_mrs=12 dmabuf_mrs=4"), "{line}");
        assert_eq!(field(&sum, "host_mrs"), 12, "each host MR decided once: {sum}");
        assert_eq!(field(&sum, "pass0_hits"), 12, "each GPU MR decided once: {sum}");
        assert_eq!(field(&sum, "dmabuf_mrs"), 4, "the program's own dma-buf MRs: {sum}");
        // NV503C route: the call goes on unchanged to the copy (and its tail call with it)
        let (line, sum, _) = run(order, "nv503c");
        assert!(line.contains("host_mrs=12 gpu_mrs=12 dmabuf_mrs=0"), "{line}");
        assert_eq!(field(&sum, "host_mrs"), 12, "each host MR decided once: {sum}");
        assert_eq!(field(&sum, "pass0_hits"), 12, "each GPU MR decided once: {sum}");
    }
}
