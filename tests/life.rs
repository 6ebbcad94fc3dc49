//! Process life and concurrency: the real libgdrshim.so in register mode, with the live fake
//! driver (tests/c/fakerm.c) and the fake NIC + peermem (tests/c/fakeverbs.c) as the provider of
//! rdma-core's own libibverbs (tests/c/rigprovider.c), in the scenarios of tests/c/life.c. Only
//! the unload scenario keeps fakeverbs.c as the libibverbs: rdma-core's, once a device is listed,
//! is never unloaded (the providers it opened need it and stay open). Every scenario runs in a
//! child with a deadline: a hang is a failure. `GDRSHIM_LIFE_THREADS` and `GDRSHIM_LIFE_ITERS`
//! set the size of the concurrency run (default 64 threads × 1000 allocation lives each).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::fakes::{self, Fakes};
use common::Env;

/// A wheel's copy of rdma-core's libibverbs as auditwheel renames it (file name and soname).
const WHEEL: &str = "libibverbs-1a2b3c4d.so.1.14.0";

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::build("life");
        let (root, dir) = (Path::new(env!("CARGO_MANIFEST_DIR")), e.dir.clone());
        let c = root.join("tests/c");
        let src = |f: &str| c.join(f).to_str().unwrap().to_string();
        let cc = |args: &[&str]| common::cc(&e, args);
        let f = Fakes::in_dir(&dir);
        f.fakerm();
        f.rdma_core_nic();
        let plug = |out: &str, lib: &str| {
            let lib = format!("-l:{lib}");
            let out = out.to_string();
            cc(&[
                "-shared",
                "-fPIC",
                "-O1",
                "-o",
                &out,
                &src("plug.c"),
                "-L.",
                &lib,
                "-Wl,-rpath,$ORIGIN",
            ]);
        };
        plug("libplug.so", "libibverbs.so.1");
        // a Python wheel's copy of rdma-core's libibverbs, renamed as auditwheel renames it, its
        // own provider (the rig's, its NEEDED the copy), and a plugin linked to it
        let system = cc_output(&["-print-file-name=libibverbs.so.1"]);
        std::fs::copy(std::fs::canonicalize(system).unwrap(), dir.join(WHEEL)).unwrap();
        patchelf(&["--set-soname", WHEEL, dir.join(WHEEL).to_str().unwrap()]);
        let wheel_provider = dir.join("librignicwheel-rdmav34.so");
        std::fs::copy(dir.join("rdma-core/librignic-rdmav34.so"), &wheel_provider).unwrap();
        let p = wheel_provider.to_str().unwrap();
        patchelf(&["--replace-needed", "libibverbs.so.1", WHEEL, p]);
        patchelf(&["--set-rpath", dir.to_str().unwrap(), p]);
        plug("libplugwheel.so", WHEEL);
        // the unload scenario's libibverbs (fakeverbs.c) and its plugin, in a folder of their own
        f.fakeverbs("fake-verbs/libibverbs.so.1", fakes::NEW);
        plug("fake-verbs/libplug.so", "fake-verbs/libibverbs.so.1");
        cc(&["-shared", "-fPIC", "-O1", "-o", "libinterpose.so", &src("interpose.c"), "-ldl"]);
        f.fakecuda();
        cc(&["-O1", "-Wall", "-Werror", "-o", "allocbench", &src("allocbench.c"), "-ldl"]);
        // not linked against libibverbs: it must be able to unload it
        cc(&[
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "life",
            &src("life.c"),
            "-ldl",
            "-lpthread",
            "-Wl,-rpath,$ORIGIN",
        ]);
        // the fake NIC (fakeverbs.c) plays nvidia-peermem too: its module is "loaded"
        common::fakedev::fake_dev(
            &dir.join("dev"),
            &["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"],
            true,
        );
        e
    })
}

fn cc_output(args: &[&str]) -> String {
    let o = Command::new("cc").args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn patchelf(args: &[&str]) {
    let out = Command::new("patchelf").args(args).output().unwrap_or_else(|e| {
        panic!("patchelf (bash scripts/dev/test.sh --missing-packages names it): {e}")
    });
    assert!(out.status.success(), "patchelf {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Which libibverbs a scenario runs on.
#[derive(Clone, Copy)]
enum Verbs {
    /// rdma-core's, the rig's provider named in RDMAV_DRIVERS (`rdma-core/librignic`, or the
    /// wheel copy's `librignicwheel`), its device in a sysfs tree of the run's own.
    RdmaCore(&'static str),
    /// fakeverbs.c as the libibverbs (`fake-verbs/`).
    Fake,
}
const RDMA_CORE: Verbs = Verbs::RdmaCore("rdma-core/librignic");

struct Run {
    code: Option<i32>,
    out: String,
    err: String,
    secs: f64,
}

/// `life ARGS` under the shim (and `extra_preload` between the shim and the fake driver) on
/// rdma-core's libibverbs, killed after `deadline`.
fn life(args: &[&str], extra_preload: Option<&str>, deadline: Duration) -> Run {
    life_with(args, extra_preload, &[], deadline)
}

/// [`life`] with more environment (which overrides the defaults).
fn life_with(
    args: &[&str],
    extra_preload: Option<&str>,
    vars: &[(&str, &str)],
    deadline: Duration,
) -> Run {
    life_on(RDMA_CORE, args, extra_preload, vars, deadline)
}

/// [`life_with`] on `verbs`.
fn life_on(
    verbs: Verbs,
    args: &[&str],
    extra_preload: Option<&str>,
    vars: &[(&str, &str)],
    deadline: Duration,
) -> Run {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let e = env();
    let mut preload = vec![e.shim.clone()];
    if let Some(x) = extra_preload {
        preload.push(e.dir.join(x));
    }
    preload.push(e.dir.join("libfakerm.so"));
    let mut c = Command::new(e.dir.join("life"));
    match verbs {
        Verbs::RdmaCore(provider) => {
            // fakesys makes the NIC's tree at start-up: one for each run, none shared half-made
            let sysfs = e.dir.join(format!("sysfs-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
            let libs: Vec<&Path> = preload.iter().map(PathBuf::as_path).collect();
            c.env("LD_PRELOAD", common::rig::rdma_core_preload(e, &libs))
                .env("RDMAV_DRIVERS", e.dir.join(provider))
                .env("SYSFS_PATH", sysfs.join("sys"))
                .env("FAKEWIRE_SYSFS", sysfs);
        }
        Verbs::Fake => {
            let libs: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
            c.env("LD_PRELOAD", libs.join(":")).env("LD_LIBRARY_PATH", e.dir.join("fake-verbs"));
        }
    }
    let t0 = Instant::now();
    let mut child = c
        .args(args)
        .current_dir(&e.dir)
        .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_ROUTE", "nv503c")
        .env("GDRSHIM_LOG_LEVEL", "warn")
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let o = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let r = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("life {args:?} did not finish within {deadline:?}: hung (deadlock?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code(),
        out: o.join().unwrap(),
        err: r.join().unwrap(),
        secs: t0.elapsed().as_secs_f64(),
    }
}

fn assert_ok(r: &Run, mode: &str) {
    assert_eq!(r.code, Some(0), "life {mode}: {}\n{}", r.out, r.err);
    assert!(r.out.contains(&format!("life {mode} ok ")), "{}\n{}", r.out, r.err);
    assert!(!r.err.contains("FAIL"), "{}", r.err);
    assert!(r.err.contains("gdrshim: summary"), "the summary line is printed at exit: {}", r.err);
}

fn num(text: &str, key: &str) -> u64 {
    let at = text.rfind(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key}= in {text}"));
    text[at + key.len() + 2..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn capture_reads_nothing_rm_refused() {
    // the capture used to read the parameters of a call RM refused (rc 0, error status): SIGSEGV
    let e = env();
    let cap = e.dir.join("badparams.cap");
    let out = Command::new(e.dir.join("life"))
        .arg("badparams")
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()))
        .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
        .env("GDRSHIM_MODE", "shadow")
        .env("GDRSHIM_CAPTURE", &cap)
        .output()
        .unwrap();
    let (o, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{o}\n{err}");
    assert!(
        o.contains("life badparams ok control rc=0 status=0x1e alloc rc=0 status=0x1e"),
        "{o}\n{err}"
    );
    let text = std::fs::read_to_string(&cap).unwrap();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("I c ") && (l.contains(" c020462a ") || l.contains(" c030462b ")))
        .collect();
    assert!(refused.len() >= 2, "{text}");
    assert!(
        refused.iter().rev().take(2).all(|l| !l.contains(" P ")),
        "no parameters recorded for refused calls: {refused:?}"
    );
}

#[test]
fn many_threads_register_and_release_at_once() {
    let threads = std::env::var("GDRSHIM_LIFE_THREADS").unwrap_or_else(|_| "64".into());
    let iters = std::env::var("GDRSHIM_LIFE_ITERS").unwrap_or_else(|_| "1000".into());
    let r = life(&["threads", &threads, &iters], None, Duration::from_secs(300));
    assert_ok(&r, "threads");
    // every MR the fake NIC accepted was exactly registered, and nothing is left
    let (reg, unreg) = (num(&r.out, "registered"), num(&r.out, "unregistered"));
    assert!(reg > 1000 && reg == unreg, "{}", r.out);
    assert_eq!(num(&r.out, "kernel_registrations"), 0);
    eprintln!(
        "{threads} threads × {iters}: {} ({:.2} s)",
        r.out.lines().next().unwrap_or(""),
        r.secs
    );
}

/// A free holds the release gate across its driver call: a registration on another thread waits
/// for it and then finds the memory gone, on both routes (the fake driver counts a registration or
/// export of memory it is freeing).
#[test]
fn no_registration_of_memory_the_driver_is_freeing() {
    for route in ["nv503c", "dmabuf"] {
        let r = life_with(
            &["racefree", "30"],
            None,
            &[("GDRSHIM_ROUTE", route), ("FAKERM_FREE_DELAY_US", "3000")],
            Duration::from_secs(120),
        );
        assert_ok(&r, "racefree");
        assert_eq!(num(&r.out, "race_violations"), 0, "{route}: {}", r.out);
        assert!(
            num(&r.out, "mrs") >= 30,
            "{route}: the racer registered before each free: {}",
            r.out
        );
        assert!(r.err.contains(&format!("route={route}")), "{route}: {}", r.err);
    }
}

/// UVM_MAP_EXTERNAL_SPARSE over registered memory unmaps it first: the registration is taken
/// down before the driver call, and a later MR over the now sparse VA registers nothing.
#[test]
fn a_sparse_map_over_registered_memory_takes_the_registration_down() {
    let r = life(&["sparse"], None, Duration::from_secs(60));
    assert_ok(&r, "sparse");
    assert_eq!(num(&r.out, "registered"), 1, "{}", r.out);
    assert_eq!(num(&r.out, "pass0_misses"), 1, "the MR over sparse VA: {}", r.out);
}

/// A program that keeps registering memory it freed gets the first few miss lines, then one a
/// second with a count; the summary totals them.
#[test]
fn repeated_misses_are_rate_limited() {
    let n = 20000;
    let r = life(&["misses", &n.to_string()], None, Duration::from_secs(120));
    assert_ok(&r, "misses");
    assert_eq!(num(&r.out, "pass0_misses"), n, "{}", r.out);
    let lines = r.err.lines().filter(|l| l.contains("pass0 miss")).count() as u64;
    let allowed = gdrshim::log::LIMIT_FIRST + r.secs.ceil() as u64 + 1;
    assert!(
        lines >= gdrshim::log::LIMIT_FIRST && lines <= allowed,
        "{lines} miss lines in {:.2} s: {}",
        r.secs,
        r.err
    );
    let summary = r.err.lines().find(|l| l.starts_with("gdrshim: summary")).unwrap();
    assert!(num(summary, "lines_held") >= n - allowed, "{summary}");
}

#[test]
fn signals_arriving_inside_the_hooks() {
    let r = life(&["signals", "300"], None, Duration::from_secs(120));
    assert_ok(&r, "signals");
    assert!(num(&r.out, "handled") >= 200, "{}", r.out);
}

#[test]
fn fork_and_exec_while_registered() {
    let r = life(&["forkexec"], None, Duration::from_secs(60));
    assert_ok(&r, "forkexec");
    assert!(
        r.out.contains("life child ok registered=1"),
        "the exec'd child has a shim of its own: {}",
        r.out
    );
    assert_eq!(r.err.matches("gdrshim: summary").count(), 2, "one summary each: {}", r.err);
}

#[test]
fn exit_with_live_registrations_and_a_thread_in_the_hooks() {
    let r = life(&["exitlive"], None, Duration::from_secs(60));
    assert_eq!(r.code, Some(3), "the program's own exit code: {}\n{}", r.out, r.err);
    assert!(r.out.contains("life exitlive ok registered=3"), "{}", r.out);
    // the summary still comes, naming what is live; RM frees it with libcuda's client at exit
    let line = r
        .err
        .lines()
        .find(|l| l.starts_with("gdrshim: summary"))
        .unwrap_or_else(|| panic!("{}", r.err));
    assert!(num(line, "live_registrations") >= 3, "{line}");
}

#[test]
fn a_thread_ending_inside_a_registration_or_cancelled_in_a_hook() {
    let r = life(&["threadexit"], None, Duration::from_secs(60));
    assert_ok(&r, "threadexit");
}

#[test]
fn libibverbs_unloaded_and_loaded_again_elsewhere() {
    // fakeverbs.c as the libibverbs: rdma-core's stays loaded once its providers are
    let dir = env().dir.join("fake-verbs").display().to_string();
    let r = life_on(Verbs::Fake, &["dlclose", &dir], None, &[], Duration::from_secs(60));
    assert_ok(&r, "dlclose");
    assert!(r.out.contains("rounds=3 moved=2"), "{}", r.out);
}

/// NIXL's and other wheels' UCX: a plugin loaded RTLD_LOCAL whose libibverbs is a renamed copy
/// of rdma-core's (`libibverbs-<hash>.so.1…`, auditwheel), with a provider of its own. Its
/// ibv_reg_mr binds to gdrshim's export, and the real one is in no scope RTLD_NEXT sees: found by
/// the copy's name, not ENOSYS (which UCX retried forever on the H200).
#[test]
fn a_wheels_renamed_libibverbs_is_reached() {
    let dir = env().dir.display().to_string();
    let wheel = Verbs::RdmaCore("librignicwheel");
    let r = life_on(wheel, &["wheel", &dir], None, &[], Duration::from_secs(60));
    assert_ok(&r, "wheel");
    assert!(r.out.contains("life wheel mr=yes errno=0"), "{}{}", r.out, r.err);
}

#[test]
fn another_interposer_finding_its_next_with_rtld_next() {
    let r = life(&["interpose"], Some("libinterpose.so"), Duration::from_secs(60));
    assert_ok(&r, "interpose");
    assert!(r.out.contains("interposer_calls=1"), "{}", r.out);
}

/// The alloc-loop benchmark's traffic (tests/c/allocbench.c) with the shim paused for every
/// other batch, as the H200 benchmark times "with" and "without" in one process: the map sees
/// exactly the batches that were not paused, and every libcuda registration among them is matched.
/// The pause is refused outside shadow mode (it would leave registrations over freed memory).
#[test]
fn the_benchmark_pause_hides_exactly_the_paused_batches() {
    let e = env();
    let run = |mode: &str| {
        let out = Command::new(e.dir.join("allocbench"))
            .args([e.dir.join("libcuda.so.1").to_str().unwrap(), "200", "ab"])
            .env(
                "LD_PRELOAD",
                format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()),
            )
            .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
            .env("GDRSHIM_MODE", mode)
            .env("GDRSHIM_BENCH_PAUSE", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (out, err) = run("shadow");
    assert!(out.starts_with("allocbench ab shim_ns_per_iter="), "{out}\n{err}");
    let line =
        err.lines().find(|l| l.starts_with("gdrshim: summary")).unwrap_or_else(|| panic!("{err}"));
    // 200 warm-up iterations and 5 working batches of 200; 5 paused batches unseen
    assert_eq!(num(line, "native"), 1200, "{line}");
    assert_eq!(num(line, "matched"), 1200, "{line}");
    assert_eq!(num(line, "user_allocs"), 1200, "{line}");
    assert_eq!(
        num(line, "mismatched") + num(line, "unpredicted") + num(line, "uncovered"),
        0,
        "{line}"
    );
    assert_eq!(num(line, "bench_pauses"), 5, "{line}");
    assert_eq!(num(line, "map_entries"), 0, "{line}");
    let (out, err) = run("register");
    assert_eq!(out, format!("allocbench ab pause_rc={}\n", -libc::EPERM), "{err}");
    assert!(err.contains("GDRSHIM_BENCH_PAUSE=1 is for shadow mode only"), "{err}");
}

/// Full batches of the hooks' work go to the helper thread (GDRSHIM_APPLY_THREAD, on by
/// default) while the program's thread goes on filling the next: the map must end up exactly as
/// when every batch is applied by the thread that filled it. The alloc-loop traffic, 10 × 300
/// iterations of 8 work items (≈ 47 batches of 512), in shadow mode, each driver call slowed by
/// 64 KiB of cache thrashing (so that batches come a few milliseconds apart, as on the H200 and
/// unlike a bare fake, where a batch is full before the helper looks again and the filling thread
/// applies it): every libcuda registration is matched either way, and the counts are the same.
#[test]
fn the_helper_thread_applies_full_batches_and_changes_nothing() {
    let e = env();
    let run = |apply_thread: &str| {
        let out = Command::new(e.dir.join("allocbench"))
            .args([e.dir.join("libcuda.so.1").to_str().unwrap(), "300"])
            .env(
                "LD_PRELOAD",
                format!("{}:{}", e.shim.display(), e.dir.join("libfakerm.so").display()),
            )
            .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
            .env("GDRSHIM_MODE", "shadow")
            .env("GDRSHIM_APPLY_THREAD", apply_thread)
            .env("FAKERM_THRASH_KB", "64")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.lines()
            .find(|l| l.starts_with("gdrshim: summary"))
            .unwrap_or_else(|| panic!("{err}"))
            .to_string()
    };
    let (threaded, inline) = (run("1"), run("0"));
    for line in [&threaded, &inline] {
        assert_eq!(num(line, "native"), 3000, "{line}");
        assert_eq!(num(line, "matched"), 3000, "{line}");
        assert_eq!(
            num(line, "mismatched") + num(line, "unpredicted") + num(line, "uncovered"),
            0,
            "{line}"
        );
    }
    for key in [
        "nv_ioctls",
        "decoded",
        "native",
        "matched",
        "user_allocs",
        "map_entries",
        "rm_objects",
        "cuda_frees",
    ] {
        assert_eq!(num(&threaded, key), num(&inline, key), "{key}:\n{threaded}\n{inline}");
    }
    // the batches were applied on the helper thread, and only there
    assert!(num(&threaded, "helper_batches") >= 10, "{threaded}");
    assert_eq!(num(&inline, "helper_batches"), 0, "{inline}");
}
