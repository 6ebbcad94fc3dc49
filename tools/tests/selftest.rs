//! `gdrshim-tool selftest` end to end under the real libgdrshim.so (the knobs build, as
//! tests/common builds it), with the live fake driver (tests/c/fakerm.c), a GeForce libcuda whose
//! memory is host pages (tests/c/selftestcuda.c) and a libibverbs stand-in that moves the bytes
//! between registered ranges (tests/c/selftestverbs.c). A clean run passes on both routes; each
//! injected fault ends as the FAIL of its step; no HCA is "could not check" (exit 2).

mod common;
#[path = "../../tests/common/fakedev.rs"]
mod fakedev;
#[path = "../../tests/common/fakes.rs"]
mod fakes;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

struct Env {
    dir: PathBuf,
    shim: PathBuf,
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        sh(Command::new(env!("CARGO"))
            // the cdylib's package: `-p gdrshim` alone builds only the rlib (the .so was there only
            // when the integration tests had built it first)
            .args([
                "build",
                "--release",
                "--lib",
                "--locked",
                "--features",
                "knobs",
                "-p",
                "gdrshim-preload",
            ])
            .env("CARGO_TARGET_DIR", root.join("target/knobs"))
            .current_dir(&root));
        // under target/ (one folder, rebuilt each run), not a new /tmp folder per run
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("selftest");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let c = root.join("tests/c");
        let src = |f: &str| c.join(f).display().to_string();
        let cc = |args: &[&str]| sh(Command::new("cc").args(args).current_dir(&dir));
        // a shared library: the flags all share, then its own, then the libraries it links
        let so = |out: &str, source: &str, own: &[&str], libs: &[&str]| {
            let mut args = vec!["-shared", "-fPIC", "-O1", "-Wall", "-Werror"];
            args.extend_from_slice(own);
            args.extend(["-o", out, source]);
            args.extend_from_slice(libs);
            cc(&args);
        };
        // a libibverbs.so.1 stand-in: its version map, where it goes, its source
        let verbs = |map: &Path, out: &str, source: &Path| {
            let map = format!("-Wl,--version-script={}", map.display());
            so(
                out,
                &source.display().to_string(),
                &[&map, "-Wl,-soname,libibverbs.so.1"],
                &["-ldl", "-lpthread"],
            );
        };
        verbs(&c.join("selftestverbs.map"), "libibverbs.so.1", &c.join("selftestverbs.c"));
        so(
            "libcuda.so.1",
            &src("selftestcuda.c"),
            &["-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1"],
            &["-ldl"],
        );
        fakes::Fakes { c: c.clone(), dir: &dir }.fakerm();
        // the GPU machine's stub NIC (tests/gpu/stubverbs.c), in a folder of its own
        std::fs::create_dir_all(dir.join("gpustub")).unwrap();
        let gpu = root.join("tests/gpu");
        verbs(&gpu.join("stubverbs.map"), "gpustub/libibverbs.so.1", &gpu.join("stubverbs.c"));
        Env { dir, shim: root.join("target/knobs/release/libgdrshim.so").canonicalize().unwrap() }
    })
}

struct Rig {
    peermem: bool,
    capable: bool,
}

const DMABUF: Rig = Rig { peermem: false, capable: true };

/// The saved rig state (tests/fixtures/state) that matches a fake machine: DMA-BUF capable
/// (rig-4090-ok), peer memory only (rig-4090-ofed), neither (rig-4090-bad).
fn state_of(rig: &Rig) -> PathBuf {
    let name = match (rig.capable, rig.peermem) {
        (true, _) => "rig-4090-ok",
        (false, true) => "rig-4090-ofed",
        (false, false) => "rig-4090-bad",
    };
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state").join(name)
}

/// Runs the self-test on a fresh fake machine; (exit code, stdout, stderr).
fn selftest(
    tag: &str,
    rig: &Rig,
    args: &[&str],
    extra: &[(&str, &str)],
    preload_shim: bool,
) -> (i32, String, String) {
    let e = env();
    let dev = e.dir.join(format!("dev-{tag}"));
    let _ = std::fs::remove_dir_all(&dev);
    fakedev::fake_dev(&dev, &["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"], rig.peermem);
    let fakerm = e.dir.join("libfakerm.so");
    let preload = if preload_shim {
        format!("{}:{}", e.shim.display(), fakerm.display())
    } else {
        fakerm.display().to_string()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"));
    cmd.arg("selftest");
    if !args.contains(&"--size") {
        cmd.args(["--size", "262144"]);
    }
    if !args.contains(&"--state") && !extra.iter().any(|(k, _)| *k == "SELFTEST_RECORD_HERE") {
        // step 1's route checks judge a saved rig that matches the fake machine
        cmd.arg("--state").arg(state_of(rig));
    }
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env("LD_LIBRARY_PATH", &e.dir)
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("FAKERM_DMABUF_CAPABLE", if rig.capable { "1" } else { "0" })
        .env_remove("GDRSHIM_ROUTE")
        .env_remove("GDRSHIM_SELFTEST_CHILD")
        .env_remove("SELFTESTVERBS_FAULT");
    if preload_shim {
        cmd.env("GDRSHIM_MODE", "register");
    } else {
        cmd.env_remove("GDRSHIM_MODE");
    }
    let out = cmd.envs(extra.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The report line of check `id`: "VERDICT step N id summary".
fn line<'a>(out: &'a str, id: &str) -> &'a str {
    // "VERDICT step N id summary", the verdict one word or COULD NOT CHECK
    let is = |l: &str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.iter().position(|x| *x == "step").and_then(|at| w.get(at + 2).copied()) == Some(id)
    };
    out.lines().find(|l| is(l)).unwrap_or_else(|| panic!("no check {id} in:\n{out}"))
}

/// The text after check `id`'s line up to the next check (its call and fix lines).
fn detail(out: &str, id: &str) -> String {
    let start = out.find(line(out, id)).unwrap();
    out[start..].lines().skip(1).take_while(|l| l.starts_with(' ')).collect::<Vec<_>>().join("\n")
}

fn verdict<'a>(out: &'a str, id: &str) -> &'a str {
    let l = line(out, id);
    if l.starts_with("COULD NOT CHECK") {
        return "COULD NOT CHECK";
    }
    l.split_whitespace().next().unwrap()
}

const DATA: [&str; 4] =
    ["rdma.write.gpu-gpu", "rdma.write.host-gpu", "rdma.write.gpu-host", "rdma.read.gpu-host"];

#[test]
fn a_clean_run_passes_on_the_dmabuf_route() {
    let (rc, out, err) = selftest("clean", &DMABUF, &[], &[], true);
    assert_eq!(rc, 0, "{out}\n{err}");
    for id in [
        "route.chosen",
        "gpu.alloc",
        "reg.export",
        "reg.gpu",
        "reg.dmabuf",
        "reg.host",
        "rdma.connect",
        "shim.counters",
    ] {
        assert_eq!(verdict(&out, id), "PASS", "{id}: {out}");
    }
    for id in DATA {
        assert_eq!(verdict(&out, id), "PASS", "{id}: {out}");
        assert!(line(&out, id).contains("262144 bytes, every byte as sent"), "{out}");
    }
    for id in DATA.map(|d| d.replacen("rdma.", "bw.", 1)) {
        assert_eq!(verdict(&out, &id), "PASS", "{id}: {out}");
    }
    assert!(line(&out, "route.chosen").contains("route dmabuf"), "{out}");
    assert!(
        line(&out, "reg.gpu").contains("pass0_hits=2: the shim made exactly this memory reachable"),
        "{out}"
    );
    // step 1 also carries the doctor's verdict on the route taken, over the saved rig
    assert_eq!(verdict(&out, "route.dmabuf"), "PASS", "{out}");
    assert!(detail(&out, "route.dmabuf").contains("rig-4090-ok"), "{out}");
    assert!(!out.contains("route.nv503c"), "the route not taken is not judged: {out}");
    assert!(
        out.ends_with(
            "RESULT: PASS (18 checks: 18 PASS, 0 WARN, 0 FAIL, 0 INFO, 0 COULD NOT CHECK)\n"
        ),
        "{out}"
    );
    // the shim really served it: its own exports, registered through ibv_reg_dmabuf_mr
    assert!(out.contains("pass0_hits=2 pass0_misses=0") && out.contains("rm_errors=0"), "{out}");
    let summary =
        err.lines().find(|l| l.starts_with("gdrshim: summary ")).unwrap_or_else(|| panic!("{err}"));
    assert!(
        summary.contains("dmabuf_served=1")
            && summary.contains("dmabuf_mrs=1")
            && summary.contains("dmabuf_live=0"),
        "{summary}"
    );
    // two runs, two patterns
    let (_, out2, _) = selftest("clean2", &DMABUF, &[], &[], true);
    let seed = |o: &str| {
        detail(o, "rdma.write.gpu-gpu")
            .split("seed ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_ne!(seed(&out), seed(&out2), "the pattern must change per run");
}

#[test]
fn a_clean_run_passes_on_the_nv503c_route_and_json_says_so() {
    let rig = Rig { peermem: true, capable: false };
    let (rc, out, err) =
        selftest("nv503c", &rig, &["--route", "nv503c", "--json", "--no-bandwidth"], &[], true);
    // --no-bandwidth leaves step 5 unchecked: exit 2, never 0
    assert_eq!(rc, 2, "{out}\n{err}");
    assert!(
        out.starts_with(
            "{\"tool\":\"selftest\",\"version\":\"0.3.0\",\"checks\":[{\"id\":\"route.chosen\""
        ),
        "{out}"
    );
    assert!(
        out.contains("\"could_not_check\":\"bandwidth: ")
            && out.contains("\"result\":\"COULD NOT CHECK\",\"exit\":2,\"bandwidth\":[]"),
        "{out}"
    );
    assert!(
        out.contains("\"id\":\"route.chosen\",\"status\":\"PASS\",\"summary\":\"gdrshim 0.3.0 registers GPU memory by route nv503c"),
        "{out}"
    );
    assert!(out.contains("\"id\":\"bandwidth\",\"status\":\"COULD NOT CHECK\""), "{out}");
    assert!(!out.contains("\"status\":\"FAIL\""), "{out}");
    assert!(!out.contains("reg.dmabuf"), "no DMA-BUF registration on the NV503C route: {out}");
    for id in DATA {
        assert!(out.contains(&format!("\"id\":\"{id}\",\"status\":\"PASS\"")), "{id}: {out}");
    }
    assert!(
        out.contains("\"registered\":2") && out.contains("\"route\":\"nv503c\""),
        "the shim's NV503C registrations: {out}"
    );
    // the keys of its own are the README's ("Every command": `step` on each check, then the rest)
    let j = common::check_shape("selftest", &out, rc);
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `selftest` | `scripts/selftest` |"))
        .expect("the README's selftest row");
    let said: Vec<&str> = row.rsplit('|').nth(1).unwrap().split('`').skip(1).step_by(2).collect();
    assert_eq!(said[0], "step", "{row}");
    assert_eq!(j.keys()[6..], said[1..], "{row}");
    let common::J::Arr(checks) = j.get("checks").unwrap() else { panic!("{out}") };
    assert!(checks.iter().all(|c| c.keys()[5..] == ["step"]), "{out}");
    // serde_json reads it too: the counters an object of numbers and the route's word
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["counters"]["registered"].as_u64(), v["counters"]["route"].as_str()),
        (Some(2), Some("nv503c")),
        "{out}"
    );
}

#[test]
fn efault_at_registration_fails_step_3() {
    let (rc, out, err) =
        selftest("efault", &DMABUF, &[], &[("SELFTESTVERBS_FAULT", "efault")], true);
    assert_eq!(rc, 1, "{out}\n{err}");
    assert_eq!(verdict(&out, "reg.gpu"), "FAIL", "{out}");
    let d = detail(&out, "reg.gpu");
    assert!(d.contains("errno 14") && d.contains("the NIC could not pin the GPU memory"), "{d}");
    assert_eq!(verdict(&out, "rdma.loopback"), "COULD NOT CHECK", "{out}");
    assert!(!out.contains("rdma.write"), "{out}");
}

#[test]
fn a_bad_completion_status_fails_step_4() {
    let (rc, out, err) =
        selftest("status", &DMABUF, &[], &[("SELFTESTVERBS_FAULT", "status")], true);
    assert_eq!(rc, 1, "{out}\n{err}");
    assert_eq!(verdict(&out, "rdma.write.gpu-gpu"), "FAIL", "{out}");
    let d = detail(&out, "rdma.write.gpu-gpu");
    assert!(
        d.contains("status IBV_WC_REM_ACCESS_ERR (10)") && d.contains("remote access error"),
        "{d}"
    );
    // the QP is in error after it: what follows is flushed, each transfer named
    assert!(detail(&out, "rdma.write.host-gpu").contains("IBV_WC_WR_FLUSH_ERR"), "{out}");
    assert_eq!(verdict(&out, "bandwidth"), "COULD NOT CHECK", "{out}");
}

#[test]
fn one_corrupted_byte_fails_step_4_with_its_offset() {
    let (rc, out, err) =
        selftest("corrupt", &DMABUF, &[], &[("SELFTESTVERBS_FAULT", "corrupt")], true);
    assert_eq!(rc, 1, "{out}\n{err}");
    let l = line(&out, "rdma.write.gpu-gpu");
    assert!(
        l.starts_with("FAIL")
            && l.contains("1 of 262144 bytes differ; the first at offset 0x3234 (4 KiB page 3)"),
        "{out}"
    );
    for id in &DATA[1..] {
        assert_eq!(verdict(&out, id), "PASS", "only the first transfer was corrupted: {out}");
    }
}

#[test]
fn a_wrong_gid_fails_the_connection() {
    let (rc, out, err) =
        selftest("gid", &DMABUF, &["--gid-index", "3"], &[("SELFTESTVERBS_FAULT", "gid")], true);
    assert_eq!(rc, 1, "{out}\n{err}");
    assert_eq!(verdict(&out, "rdma.connect"), "FAIL", "{out}");
    assert!(
        line(&out, "rdma.connect")
            .contains("INIT→RTR to itself (GID 0000:0000:0000:0000:0000:ffff:0a00:005b (index 3))"),
        "{out}"
    );
    let d = detail(&out, "rdma.connect");
    assert!(d.contains("errno 110") && d.contains("wrong --gid-index"), "{d}");
    // registration went fine before it
    assert_eq!(verdict(&out, "reg.gpu"), "PASS", "{out}");
}

#[test]
fn no_hca_is_could_not_check() {
    let (rc, out, err) = selftest("nohca", &DMABUF, &[], &[("SELFTESTVERBS_DEVICES", "0")], true);
    assert_eq!(rc, 2, "{out}\n{err}");
    assert_eq!(verdict(&out, "route.chosen"), "PASS", "{out}");
    assert_eq!(verdict(&out, "gpu.alloc"), "PASS", "{out}");
    assert_eq!(verdict(&out, "reg.export"), "PASS", "the export needs no HCA: {out}");
    assert_eq!(verdict(&out, "reg.gpu"), "COULD NOT CHECK", "{out}");
    assert!(line(&out, "reg.gpu").contains("no HCA"), "{out}");
    assert_eq!(verdict(&out, "rdma.loopback"), "COULD NOT CHECK", "{out}");
    assert!(!out.contains("FAIL "), "{out}");
}

#[test]
fn no_route_fails_step_1_and_the_registration() {
    let rig = Rig { peermem: false, capable: false };
    let (rc, out, err) = selftest("noroute", &rig, &[], &[], true);
    assert_eq!(rc, 1, "{out}\n{err}");
    assert_eq!(verdict(&out, "route.chosen"), "FAIL", "{out}");
    assert!(detail(&out, "route.chosen").contains("gdrshim_gdr_route()=0"), "{out}");
    assert_eq!(verdict(&out, "reg.gpu"), "FAIL", "{out}");
}

#[test]
fn a_slow_path_fails_step_5() {
    let (rc, out, err) = selftest(
        "slow",
        &DMABUF,
        &["--size", "65536"],
        &[("SELFTESTVERBS_DELAY_US", "1000")],
        true,
    );
    assert_eq!(rc, 1, "{out}\n{err}");
    for id in DATA {
        assert_eq!(verdict(&out, id), "PASS", "{out}");
    }
    let l = line(&out, "bw.write.gpu-gpu");
    assert!(l.starts_with("FAIL") && l.contains("of the 2.00 Gb/s link"), "{out}");
}

#[test]
fn it_reexecutes_itself_under_the_shim() {
    let shim = env().shim.display().to_string();
    let (rc, out, err) =
        selftest("reexec", &DMABUF, &["--shim", &shim, "--no-bandwidth"], &[], false);
    assert_eq!(rc, 2, "only step 5 unchecked: {out}\n{err}");
    assert_eq!(verdict(&out, "route.chosen"), "PASS", "{out}");
    assert!(detail(&out, "route.chosen").contains("gdrshim_mode()=3"), "register mode: {out}");
    let result = out.lines().last().unwrap();
    assert!(
        result.starts_with("RESULT: COULD NOT CHECK (")
            && result.contains(" 0 FAIL, ")
            && result.contains(" 1 COULD NOT CHECK)"),
        "{out}"
    );
    // without a shim to find, it says so (exit 2) instead of testing without it
    // (issue 31: it said "not found … give --shim PATH" though a path was given)
    let (rc, _, err) =
        selftest("noshim", &DMABUF, &["--shim", "/nonexistent/libgdrshim.so"], &[], false);
    assert_eq!(rc, 2);
    assert_eq!(err, "gdrshim-tool selftest: --shim /nonexistent/libgdrshim.so: No such file or directory (os error 2)\n");
    let (rc, _, err) = selftest("shimdir", &DMABUF, &["--shim", "/tmp"], &[], false);
    assert_eq!(rc, 2);
    assert!(err.contains("--shim /tmp: not a file"), "{err}");
}

#[test]
fn the_gpu_machines_stub_nic_moves_the_bytes_through_libcuda() {
    // tests/gpu/stubverbs.c as run-h200-selftest.sh uses it: its QP copies with libcuda's
    // cuMemcpy* chosen by cuPointerGetAttribute (here the fake's, over host pages). The NV503C
    // route: the stub checks a dma-buf as the kernel does (fdinfo exp_name), which the fake
    // driver's memfd buffers are not.
    let e = env();
    let nv = Rig { peermem: true, capable: false };
    let path = format!("{}:{}", e.dir.join("gpustub").display(), e.dir.display());
    let (rc, out, err) = selftest(
        "gpustub",
        &nv,
        &["--route", "nv503c"],
        &[("LD_LIBRARY_PATH", path.as_str())],
        true,
    );
    assert_eq!(rc, 0, "{out}\n{err}");
    for id in DATA {
        assert_eq!(verdict(&out, id), "PASS", "{id}: {out}");
    }
    assert!(out.contains("registered=2"), "the shim registered both GPU buffers: {out}");
    assert!(
        line(&out, "bw.write.gpu-gpu").contains("of the 25.00 Gb/s link"),
        "the stub's port is EDR 1x: {out}"
    );
    let (rc, out, err) = selftest(
        "gpustub-corrupt",
        &DMABUF,
        &["--no-bandwidth"],
        &[("LD_LIBRARY_PATH", path.as_str()), ("SELFTESTVERBS_FAULT", "corrupt")],
        true,
    );
    assert_eq!(rc, 1, "{out}\n{err}");
    assert!(
        line(&out, "rdma.write.gpu-gpu")
            .contains("1 of 262144 bytes differ; the first at offset 0x3234"),
        "{out}"
    );
}

#[test]
fn step_1_fails_when_the_doctor_finds_the_route_taken_cannot_work() {
    // the shim took DMA-BUF, but the machine state says the driver is 565 (no 570+ export ABI)
    let ofed = state_of(&Rig { peermem: true, capable: false });
    let (rc, out, err) = selftest(
        "doctor-no",
        &DMABUF,
        &["--state", ofed.to_str().unwrap(), "--no-bandwidth"],
        &[],
        true,
    );
    assert_eq!(rc, 1, "{out}\n{err}");
    assert_eq!(verdict(&out, "route.chosen"), "PASS", "{out}");
    let l = line(&out, "route.dmabuf");
    assert!(l.starts_with("FAIL") && l.contains("565"), "{out}");
    // a state that cannot be read is "could not check", never a pass
    let (rc, out, _) = selftest(
        "doctor-none",
        &DMABUF,
        &["--state", "/nonexistent/state", "--no-bandwidth"],
        &[],
        true,
    );
    assert_eq!(rc, 2, "{out}");
    assert_eq!(verdict(&out, "route.doctor"), "COULD NOT CHECK", "{out}");
}

#[test]
fn without_a_state_it_records_this_machine() {
    // scripts/gdr-state-record next to the tool (../../scripts from target/release) records the
    // machine the test runs on; its verdict depends on that machine, the judging does not
    let (_, out, err) =
        selftest("record", &DMABUF, &["--no-bandwidth"], &[("SELFTEST_RECORD_HERE", "1")], true);
    let l = line(&out, "route.dmabuf");
    assert!(l.starts_with("PASS") || l.starts_with("FAIL"), "{out}\n{err}");
    assert!(detail(&out, "route.dmabuf").contains("this machine, just recorded"), "{out}");
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("gdrshim-selftest-state-"))
        .collect();
    assert!(left.is_empty(), "the recorded state is removed: {left:?}");
}

#[test]
fn a_crash_under_the_shim_is_a_failure_and_sizes_are_checked() {
    // the re-executed child dies (the provider aborts): exit 1 with the signal, never 2
    let shim = env().shim.display().to_string();
    let (rc, out, err) = selftest(
        "abort",
        &DMABUF,
        &["--shim", &shim, "--no-bandwidth"],
        &[("SELFTESTVERBS_FAULT", "abort")],
        false,
    );
    assert_eq!(rc, 1, "{out}\n{err}");
    assert!(out.contains("killed by signal 6"), "{out}");
    // a size the transfers cannot move in equal work requests is a usage error, not a FAIL
    for size in ["6291456", "102400", "2147483648", "32768"] {
        let (rc, _, err) = selftest("size", &DMABUF, &["--size", size], &[], true);
        assert_eq!(rc, 2, "{size}: {err}");
        assert!(err.contains("power of two"), "{size}: {err}");
    }
}
