//! The process's first GPU touch, where the front hands over to the core (issue 29): as safe as
//! no shim. Each defect of the review has its test here; the ones of the hand-off itself use the
//! front (`common::front_pair`) whatever GDRSHIM_TEST_VIA_FRONT says, the others the shim the suite
//! runs (the core preloaded itself, or the front: scripts/dev/test.sh runs both).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::build("first-touch");
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let src = |f: &str| c.join(f).to_str().unwrap().to_string();
        let cc = |args: &[&str]| common::cc(&e, args);
        common::fakes::Fakes::in_dir(&e.dir).fakerm();
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "libparkdup.so",
            &src("parkdup.c"),
            "-ldl",
            "-lpthread",
        ]);
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "libctorthread.so",
            &src("ctorthread.c"),
            "-lpthread",
        ]);
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "libplanted.so",
            &src("planted.c"),
        ]);
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "libctorself.so",
            &src("ctorself.c"),
        ]);
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            "libctorbatch.so",
            &src("ctorbatch.c"),
            "-ldl",
        ]);
        // -rdynamic: the constructor of libctorbatch.so finds the program's firsttouch_batch_kick
        cc(&[
            "-O1",
            "-Wall",
            "-Werror",
            "-rdynamic",
            "-o",
            "firsttouch",
            &src("firsttouch.c"),
            "-ldl",
            "-lpthread",
        ]);
        common::fakedev::fake_dev(
            &e.dir.join("dev"),
            &["nvidiactl", "nvidia-uvm", "nvidia0"],
            false,
        );
        e
    })
}

struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// `firsttouch ARGS` with `preload` (then the fake driver), from folder `cwd`, killed after 30 s
/// (a hang is a failure).
fn run(preload: &[&str], args: &[&str], cwd: &Path, vars: &[(&str, &str)]) -> Run {
    let e = env();
    let mut p: Vec<String> = preload.iter().map(|s| s.to_string()).collect();
    p.push(e.dir.join("libfakerm.so").display().to_string());
    let dev = e.dir.join("dev");
    let mut all = vec![args[0], dev.to_str().unwrap()];
    all.extend_from_slice(&args[1..]);
    let mut child = Command::new(e.dir.join("firsttouch"))
        .args(&all)
        .current_dir(cwd)
        .env("LD_PRELOAD", p.join(":"))
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_LOG_LEVEL", "warn")
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "firsttouch {args:?} hung (30 s): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    // (the core's summary at exit is no message of the hand-off)
    let err = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("gdrshim: summary "))
        .map(|l| format!("{l}\n"))
        .collect();
    Run { code: out.status.code(), out: String::from_utf8_lossy(&out.stdout).into_owned(), err }
}

fn shim() -> String {
    env().shim.display().to_string()
}

fn ok(r: &Run, want: &str) {
    assert_eq!(r.code, Some(0), "exit status: {}{}", r.out, r.err);
    assert!(r.out.contains(want), "want {want:?}: {}{}", r.out, r.err);
}

/// Defect 8: programs built with -D_FORTIFY_SOURCE call glibc's __open_2 and friends; an NVIDIA
/// fd opened through them (on a number the table knew as something else) is seen.
#[test]
fn an_nvidia_fd_opened_by_a_fortified_open_is_seen() {
    let r = run(&[&shim()], &["fortify"], &env().dir, &[]);
    ok(&r, "fortify same_number=4 driver=40 seen=40");
}

/// Defect 4: a thread with a deferred cancellation pending makes the process's first NVIDIA call:
/// the shim's start-up (files opened, read, written) is no cancellation point; the thread is
/// cancelled at its own next one, and the process goes on.
#[test]
fn a_pending_cancellation_waits_for_the_programs_own_cancellation_point() {
    let r = run(&[&shim()], &["cancel"], &env().dir, &[]);
    ok(&r, "cancel cancelled=1 reached=2 after=1 seen=2");
}

/// Defect 7: a dup2 onto an fd that the core has just classified as something else, begun before
/// the core was loaded and finished after: the core's table has the new fd (the front's table is
/// the core's).
#[test]
fn a_dup2_straddling_the_cores_load_is_seen() {
    let park = env().dir.join("libparkdup.so");
    let r = run(&[&shim(), park.to_str().unwrap()], &["straddle"], &env().dir, &[]);
    ok(&r, "straddle first=1 driver=10 seen=10");
}

/// Defect 5 (a), the core preloaded itself: a library's constructor (run by dlopen, which holds
/// the loader's lock) starts a thread that makes the process's first NVIDIA call and joins it.
/// Nothing the core does at its start-up waits for the loader's lock. (Through the front, the
/// core's own dlopen must wait for it: docs/architecture.md, "the front".)
#[test]
fn a_constructors_thread_making_the_first_call_does_not_hang_the_core() {
    let lib = env().dir.join("libctorthread.so");
    let core = common::knobs_core();
    let r = run(&[core.to_str().unwrap()], &["ctor", lib.to_str().unwrap()], &env().dir, &[]);
    ok(&r, "ctor loaded=1 result=1 seen=1");
}

/// Defect 5 (a), through the front: the front's dlopen of the core must wait for the loader's
/// lock, which the constructor holds while it waits for the thread: the front waits a while
/// (shortened here), then loads no core, forwards every call and says so once. No hang.
#[test]
fn a_constructors_thread_making_the_first_call_through_the_front_fails_open() {
    let lib = env().dir.join("libctorthread.so");
    let front = common::front_pair(&common::knobs_core(), true);
    let r = run(
        &[front.to_str().unwrap()],
        &["ctor", lib.to_str().unwrap()],
        &env().dir,
        &[("GDRSHIM_TEST_LOADER_WAIT_MS", "300")],
    );
    ok(&r, "ctor loaded=1 result=1 seen=-1");
    assert_eq!(r.err.lines().count(), 1, "{}", r.err);
    assert!(
        r.err.contains("the loader's lock stayed held by another thread")
            && r.err.contains("its hooks only forward"),
        "{}",
        r.err
    );
}

/// The other side of defect 5 (a): a constructor's own first NVIDIA call (this thread holds the
/// loader's lock, in dlopen) loads the core at once, through the front too.
#[test]
fn a_constructors_own_first_call_loads_the_core_at_once() {
    let lib = env().dir.join("libctorself.so");
    let vars = [("GDRSHIM_TEST_LOADER_WAIT_MS", "60000")];
    let t0 = Instant::now();
    let r = run(&[&shim()], &["ctor", lib.to_str().unwrap()], &env().dir, &vars);
    ok(&r, "ctor loaded=1 result=1 seen=1");
    assert!(t0.elapsed() < Duration::from_secs(20), "no wait for this thread's own lock");
}

/// Defect 5 (b): a constructor's NVIDIA call while another thread fills the batch of 512 events,
/// which starts the helper thread: that start may wait for the loader's lock the constructor's
/// dlopen holds, and no lock of ours is held meanwhile. No 5 s stall, nothing dropped, every call
/// seen.
#[test]
fn a_constructors_call_while_the_batch_fills_does_not_stall() {
    let lib = env().dir.join("libctorbatch.so");
    let r = run(&[&shim()], &["batch", lib.to_str().unwrap()], &env().dir, &[]);
    ok(&r, "batch filler=512 ctor=1 ctor_fast=1 seen=513");
    assert!(!r.err.contains("dropped") && !r.err.contains("not available"), "{}", r.err);
}

/// Defect 9 (made rarer): the runtime starts at the `open` of an NVIDIA node (CUDA's
/// initialisation), not at the node's first ioctl, which a signal handler that interrupted
/// `malloc` may make. (How often a handler's first call still fails is measured, not tested:
/// tests/c/sigfirst.c.)
#[test]
fn the_runtime_starts_at_the_open_of_an_nvidia_node() {
    let r = run(&[&shim()], &["open"], &env().dir, &[("GDRSHIM_LOG_LEVEL", "info")]);
    ok(&r, "open fd_ok=1");
    assert!(r.err.contains("mode=register driver 580.159.04"), "started at the open: {}", r.err);
}

/// A release's lib/ folder with the front and, as its core, `core`: returns the folder.
fn release(at: &Path, core: &Path) -> PathBuf {
    let lib = at.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let front = common::front_pair(&common::knobs_core(), true);
    std::fs::copy(front, lib.join("libgdrshim.so")).unwrap();
    std::fs::copy(core, lib.join("libgdrshim-core.so")).unwrap();
    lib
}

fn fresh(name: &str) -> PathBuf {
    let d = env().dir.join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Defect 1: the front and its core both in LD_PRELOAD (`lib/*.so`), in either order: it works,
/// one line says what happened, no endless recursion.
#[test]
fn the_front_and_its_core_both_preloaded_work_in_either_order() {
    let lib = release(&fresh("both"), &common::knobs_core());
    let (front, core) = (lib.join("libgdrshim.so"), lib.join("libgdrshim-core.so"));
    let (front, core) = (front.to_str().unwrap(), core.to_str().unwrap());
    for order in [[front, core], [core, front]] {
        let r = run(&order, &["plain"], &env().dir, &[]);
        ok(&r, "plain driver=10 seen=10");
        assert!(r.err.lines().count() <= 1, "{order:?}: at most one line: {}", r.err);
    }
}

/// Defect 2: a front preloaded by a relative path (or a bare name found through a relative
/// LD_LIBRARY_PATH), then a chdir before the first GPU touch: the core beside the front's file is
/// loaded, never a libgdrshim-core.so the new folder holds.
#[test]
fn a_relative_front_path_never_loads_a_core_from_another_folder() {
    let e = env();
    let home = fresh("relative");
    release(&home, &common::knobs_core());
    let elsewhere = fresh("elsewhere");
    std::fs::create_dir_all(elsewhere.join("lib")).unwrap();
    std::fs::copy(e.dir.join("libplanted.so"), elsewhere.join("lib/libgdrshim-core.so")).unwrap();
    let mark = e.dir.join("planted-ran");
    let _ = std::fs::remove_file(&mark);
    let vars = [
        ("FIRSTTOUCH_CHDIR", elsewhere.to_str().unwrap()),
        ("PLANTED_MARK", mark.to_str().unwrap()),
    ];
    let r = run(&["./lib/libgdrshim.so"], &["plain"], &home, &vars);
    assert!(!mark.exists(), "the planted library ran: {}{}", r.out, r.err);
    ok(&r, "plain driver=10 seen=10");
    let mut vars = vars.to_vec();
    vars.push(("LD_LIBRARY_PATH", "lib"));
    let r = run(&["libgdrshim.so"], &["plain"], &home, &vars);
    assert!(!mark.exists(), "the planted library ran: {}{}", r.out, r.err);
    ok(&r, "plain driver=10 seen=10");
}

/// Defect 3: the core beside the front's file, not beside the path it was preloaded by: a symlink
/// to the front alone finds the core; a `current` link switched to another release between the
/// process's start and its first GPU touch keeps the release the process started with.
#[test]
fn the_core_is_the_one_beside_the_fronts_own_file() {
    let e = env();
    let lib = release(&fresh("linked"), &common::knobs_core());
    let alone = fresh("link-alone");
    std::os::unix::fs::symlink(lib.join("libgdrshim.so"), alone.join("libgdrshim.so")).unwrap();
    let r = run(&[alone.join("libgdrshim.so").to_str().unwrap()], &["plain"], &e.dir, &[]);
    ok(&r, "plain driver=10 seen=10");
    assert_eq!(r.err, "", "nothing to say");

    let prefix = fresh("prefix");
    release(&prefix.join("a"), &common::knobs_core());
    // release b's core is no gdrshim core: paired with it, the front would refuse it
    release(&prefix.join("b"), &e.dir.join("libplanted.so"));
    std::os::unix::fs::symlink("a", prefix.join("current")).unwrap();
    let preload = prefix.join("current/lib/libgdrshim.so");
    let link = prefix.join("current");
    let vars = [("FIRSTTOUCH_RELINK", link.to_str().unwrap()), ("FIRSTTOUCH_RELINK_TO", "b")];
    let r = run(&[preload.to_str().unwrap()], &["plain"], &e.dir, &vars);
    ok(&r, "plain driver=10 seen=10");
    assert_eq!(r.err, "", "the core of the release the process started with: {}", r.err);
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("b"), "the link was switched");
}

/// Defect 6: a truncated core (a copy cut short) is refused with the one line, and every call is
/// forwarded; the process is not killed by SIGBUS.
#[test]
fn a_truncated_core_is_refused_not_a_crash() {
    let core = std::fs::read(common::knobs_core()).unwrap();
    for cut in [2 << 10, 64 << 10, 600 << 10, core.len() - 1] {
        let dir = fresh(&format!("cut-{cut}"));
        let lib = release(&dir, &common::knobs_core());
        std::fs::write(lib.join("libgdrshim-core.so"), &core[..cut]).unwrap();
        let r = run(&[lib.join("libgdrshim.so").to_str().unwrap()], &["plain"], &env().dir, &[]);
        assert_eq!(r.code, Some(0), "cut at {cut}: {}{}", r.out, r.err);
        assert!(
            r.out.contains("plain driver=10 seen=-1"),
            "cut at {cut}: forwarded, no core: {}{}",
            r.out,
            r.err
        );
        assert_eq!(r.err.lines().count(), 1, "cut at {cut}: {}", r.err);
        assert!(
            r.err.contains("cannot load") && r.err.contains("not a whole"),
            "cut at {cut}: {}",
            r.err
        );
    }
}
