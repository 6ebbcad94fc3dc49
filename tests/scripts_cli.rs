//! The shell tools' own behaviour (the contract every command keeps, --help, --version, --json, a
//! bad flag and no arguments, is tools/tests/cli_conventions.rs's): the doctor checks its
//! arguments before recording and passes the tool's exit code (0 ready, 1 not ready, 2 could not
//! check) through; the demo's sections, verdict table and `--verbose`; gdr-env.sh's forms.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Run {
    rc: i32,
    out: String,
    err: String,
}

fn run(script: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let o: Output = Command::new("bash").arg(script).args(args).envs(env.iter().copied()).output().unwrap();
    Run {
        rc: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn script(rel: &str) -> PathBuf {
    root().join(rel)
}

/// Written by a child process, not by this one: an fd of ours open for writing would be inherited
/// by a child another test thread forks meanwhile, and running the file then fails with ETXTBSY
/// (a fake `cc` that "cannot run" made the suite report libibverbs-dev missing).
fn write_exe(p: &Path, body: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let ok = Command::new("sh").args(["-c", "printf '%s' \"$1\" > \"$2\" && chmod 0755 \"$2\"", "sh", body]).arg(p).status().unwrap();
    assert!(ok.success(), "{}", p.display());
}

/// Every script's --help, --version, --json, bad flag and no-argument run, before and after the
/// tool is built, are tools/tests/cli_conventions.rs's (the one contract, issue 40); here what
/// one script says of its own.
#[test]
fn apply_patches_without_its_tree_says_what_it_needs() {
    // it printed only the help
    let r = run(&script("scripts/apply-nccl-patches.sh"), &[], &[]);
    assert_eq!((r.rc, r.out.as_str()), (2, ""));
    assert_eq!(
        r.err,
        "apply-nccl-patches: name the NCCL source tree to patch: apply-nccl-patches.sh [--check] NCCL_SOURCE_TREE (try --help)\n"
    );
    // each script's help names its own options
    for (rel, usage_word) in [
        ("scripts/gdr-env.sh", "--hca LIST"),
        ("scripts/deploy.sh", "--uninstall"),
        ("scripts/gdr-state-record", "compare OLD NEW"),
        ("scripts/doctor", "--from DIR"),
        ("scripts/report", "--selftest"),
        ("scripts/dev/demo.sh", "--verbose"),
        ("scripts/apply-nccl-patches.sh", "--patches DIR"),
        ("scripts/dev/test.sh", "--missing-packages"),
        ("scripts/dev/build-release.sh", "--update-manifest"),
        ("scripts/dev/check-release.sh", "SHA256SUMS"),
    ] {
        let r = run(&script(rel), &["--help"], &[]);
        assert!(r.rc == 0 && r.out.contains(usage_word), "{rel}: {}", r.out);
    }
}

#[test]
fn state_record_usage_errors_exit_2_with_a_message() {
    let p = script("scripts/gdr-state-record");
    let r = run(&p, &["compare", "A"], &[]);
    assert_eq!(r.rc, 2, "{}", r.err);
    assert!(r.err.contains("compare needs two saved folders"), "{}", r.err);
    assert!(!r.err.contains("parameter null or not set") && !r.err.contains("line "), "no bash error: {}", r.err);
    for args in [vec!["compare"], vec!["compare", "A", "B", "C"], vec!["save", "a", "b"], vec![], vec!["frobnicate"]] {
        let r = run(&p, &args, &[]);
        assert_eq!(r.rc, 2, "{args:?}: {}", r.err);
        assert!(r.err.contains("gdr-state-record:"), "{args:?}: {}", r.err);
    }
}

/// A release tree of our own making (scripts/ of the repository, a stub gdr-state-record and a
/// stub gdrshim-tool) in which the doctor's wrapper logic is observable.
fn doctor_tree(at: &Path, tool_rc: i32) -> PathBuf {
    let t = at.join("release");
    std::fs::create_dir_all(t.join("scripts")).unwrap();
    for f in ["doctor", "find-tool.sh", "gdrshim-version.sh"] {
        std::fs::copy(root().join("scripts").join(f), t.join("scripts").join(f)).unwrap();
    }
    std::fs::write(t.join("BUILD-INFO"), "gdrshim 9.8.7\nrustc: test\n").unwrap();
    let log = at.join("calls");
    write_exe(
        &t.join("scripts/gdr-state-record"),
        &format!(
            "#!/bin/sh\necho \"record $*\" >> {log}\n[ -z \"$RECORD_FAILS\" ] || exit 2\nmkdir -p \"$2/stamp\" && echo \"$2/stamp\"\n",
            log = log.display()
        ),
    );
    write_exe(&t.join("bin/gdrshim-tool"), &format!("#!/bin/sh\necho \"tool $*\" >> {}\nexit {tool_rc}\n", log.display()));
    t
}

fn calls(at: &Path) -> String {
    std::fs::read_to_string(at.join("calls")).unwrap_or_default()
}

#[test]
fn doctor_checks_arguments_before_recording_and_passes_the_exit_code_through() {
    for rc in [0, 1, 2] {
        let s = scratch(&format!("doctor{rc}"));
        let t = doctor_tree(&s, rc);
        let doctor = t.join("scripts/doctor");
        let r = run(&doctor, &["--json"], &[]);
        assert_eq!(r.rc, rc, "the tool's {rc} comes through: {}", r.err);
        let c = calls(&s);
        assert!(c.starts_with("record save "), "recorded first: {c}");
        assert!(c.contains("tool doctor --from ") && c.contains("/stamp --json"), "{c}");
        let r = run(&doctor, &["--from", "/saved/state"], &[]);
        assert_eq!(r.rc, rc);
        assert!(calls(&s).ends_with("tool doctor --from /saved/state\n"), "{}", calls(&s));
        assert_eq!(calls(&s).matches("record").count(), 1, "--from records nothing");
    }
    let s = scratch("doctor-args");
    let t = doctor_tree(&s, 0);
    let doctor = t.join("scripts/doctor");
    // version of the release it belongs to
    assert_eq!(run(&doctor, &["--version"], &[]).out, "doctor (gdrshim) 9.8.7\n");
    for args in
        [vec!["--help"], vec!["-h"], vec!["--version"], vec!["--bogus"], vec!["--json", "extra"], vec!["--from"], vec!["--keep", "--from"]]
    {
        let r = run(&doctor, &args, &[]);
        assert!(r.rc == 0 || r.rc == 2, "{args:?}: {}", r.rc);
        assert_eq!(r.rc == 0, args[0].starts_with("-h") || args[0] == "--help" || args[0] == "--version", "{args:?}");
        assert_eq!(calls(&s), "", "{args:?}: nothing recorded, the tool not run");
    }
    let r = run(&doctor, &["--from"], &[]);
    assert!(r.err.contains("--from needs a saved state folder"), "{}", r.err);
    // a machine whose state cannot be recorded could not be checked
    let r = run(&doctor, &[], &[("RECORD_FAILS", "1")]);
    assert_eq!(r.rc, 2, "{}", r.err);
    assert!(r.err.contains("could not record"), "{}", r.err);
    assert!(!calls(&s).contains("tool"), "the tool judges nothing unrecorded");
}

fn demo(args: &[&str], replay: &Path) -> Run {
    run(&script("scripts/dev/demo.sh"), args, &[("GDRSHIM_DEMO_REPLAY", replay.to_str().unwrap())])
}

const WORKLOADS: [&str; 5] = ["alloc-probe", "bar1-readback", "torch-alloc", "torch-exp", "torch-nccl"];

#[test]
fn demo_has_a_section_per_workload_a_verdict_table_and_says_what_it_proves() {
    let replay = PathBuf::from(env!("CARGO_BIN_EXE_gdrshim-replay"));
    let r = demo(&[], &replay);
    assert_eq!(r.rc, 0, "{}{}", r.out, r.err);
    let o = &r.out;
    for w in WORKLOADS {
        assert_eq!(
            o.matches(&format!("\n== {w}: ")).count() + usize::from(o.starts_with(&format!("== {w}: "))),
            1,
            "one section for {w}:\n{o}"
        );
    }
    assert!(!o.contains("/tmp") && !o.contains(".cap "), "no temporary paths: {o}");
    assert!(!o.contains("pass0 hit"), "the per-allocation lines only with --verbose");
    let lines: Vec<&str> = o.lines().collect();
    let head = lines.iter().position(|l| l.starts_with("workload ")).expect("a verdict table");
    let cols: Vec<&str> = lines[head].split('|').map(str::trim).collect();
    assert_eq!(cols, ["workload", "allocations", "libcuda registrations", "predicted", "mismatched"]);
    let mut rows = 0;
    for l in &lines[head + 2..] {
        let c: Vec<&str> = l.split('|').map(str::trim).collect();
        if c.len() != 5 {
            break;
        }
        let n: Vec<u64> = c[1..].iter().map(|x| x.parse().unwrap()).collect();
        assert!(n[0] > 0 && n[1] > 0, "{l}");
        assert_eq!((n[2], n[3]), (n[1], 0), "every registration libcuda made predicted, none different: {l}");
        rows += 1;
    }
    assert_eq!(rows, WORKLOADS.len() + 1, "a row per workload and the total:\n{o}");
    assert!(o.contains("allocation by allocation") && o.contains("H200"), "what it proves: {o}");
    assert!(o.contains("\"= native\"") && o.contains("is exactly the one libcuda made"), "what = native means: {o}");

    // --verbose: the lines of today, each program step's label before its lines
    let v = demo(&["--verbose"], &replay);
    assert_eq!(v.rc, 0, "{}", v.err);
    let hits = v.out.lines().filter(|l| l.contains("pass0 hit") && l.ends_with("= native")).count();
    assert!(hits > 300, "{hits} '= native' lines");
    let vl: Vec<&str> = v.out.lines().collect();
    let label = vl.iter().position(|l| l.trim() == "[cudaMalloc 64M]").expect("the step's label");
    assert!(
        vl[label + 1].contains("cuMemAlloc_v2") && vl[label + 1].contains(", +0x4000000)"),
        "the 64 MiB allocation follows its label: {}",
        vl[label + 1]
    );
    let label = vl.iter().position(|l| l.trim() == "[mallocAsync]").unwrap();
    assert!(vl[label + 1].contains("cuMemAllocAsync"), "{}", vl[label + 1]);
    assert!(!v.out.contains("/tmp"), "no temporary paths with --verbose either");
}

#[test]
fn demo_says_fail_when_a_prediction_differs_or_the_replay_breaks() {
    let s = scratch("demo-fail");
    // a replay that reports one mismatch in torch-exp (and exits 1, as gdrshim-replay does)
    let fake = s.join("replay");
    write_exe(
        &fake,
        "#!/bin/sh\ncase \"$1\" in *torch-exp*) m=1 ;; *) m=0 ;; esac\n\
         echo \"== $1 (driver 580.159.04)\"\n\
         echo \"gdrshim: summary replay=$1 ioctls=9 decoded=9 native=5 matched=$((5 - m)) mismatched=$m unpredicted=0 predicted_only=0 user_allocs=5 uncovered=0\"\n\
         exit $m\n",
    );
    let r = demo(&[], &fake);
    assert_eq!(r.rc, 1, "{}", r.out);
    assert!(r.out.contains("FAIL: torch-exp"), "{}", r.out);
    assert!(
        r.out.lines().any(|l| l.starts_with("torch-exp ") && l.split('|').map(str::trim).next_back() == Some("1")),
        "the table shows it: {}",
        r.out
    );
    assert!(!r.out.contains("What this shows"), "no claim on a failure");
    // a replay that dies without a summary
    let dead = s.join("dead");
    write_exe(&dead, "#!/bin/sh\necho 'gdrshim-replay: rejected: not a capture' >&2\nexit 2\n");
    let r = demo(&[], &dead);
    assert_eq!(r.rc, 1);
    assert!(r.out.contains("the replay gave no summary (exit 2)") && r.out.contains("not a capture"), "{}", r.out);
}

/// An installed-looking prefix (a shim file and its SHA256SUMS) and a fake /sys/class/infiniband
/// with mlx5_0 (port 1) and mlx5_1 (ports 1 and 2).
fn env_setup(s: &Path) -> (PathBuf, PathBuf) {
    let prefix = s.join("prefix");
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::write(prefix.join("lib/libgdrshim.so"), b"shim\n").unwrap();
    std::fs::write(prefix.join("lib/libgdrshim-core.so"), b"core\n").unwrap();
    let sums = Command::new("sh")
        .arg("-c")
        .arg("sha256sum lib/libgdrshim.so lib/libgdrshim-core.so > SHA256SUMS")
        .current_dir(&prefix)
        .status()
        .unwrap();
    assert!(sums.success());
    let sys = s.join("sys");
    for p in ["mlx5_0/ports/1", "mlx5_1/ports/1", "mlx5_1/ports/2"] {
        std::fs::create_dir_all(sys.join(p)).unwrap();
    }
    (prefix, sys)
}

#[test]
fn env_script_takes_every_form_nccl_takes_and_validates_as_nccl_would() {
    let s = scratch("env-forms");
    let (prefix, sys) = env_setup(&s);
    let p = script("scripts/gdr-env.sh");
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    let base = ["--prefix", prefix.to_str().unwrap(), "--print"];
    let with = |extra: &[&str]| run(&p, &[&base[..], extra].concat(), &env);
    for (hca, printed) in [
        ("mlx5_0", "mlx5_0"),
        ("=mlx5_0", "'=mlx5_0'"),                   // exact (a leading = is quoted: zsh would expand it)
        ("mlx5", "mlx5"),                           // a prefix of both
        ("mlx5_0:1,mlx5_1:2", "mlx5_0:1,mlx5_1:2"), // ports; the comma stays as it is
        ("mlx5:2", "mlx5:2"),                       // a prefix with a port that one of them has
        ("^mlx5_1", "'^mlx5_1'"),                   // all but mlx5_1
        ("^=mlx5_0", "'^=mlx5_0'"),
        ("^mlx5_1:2", "'^mlx5_1:2'"),
        ("^mlx5_0,mlx5_1:1", "'^mlx5_0,mlx5_1:1'"), // leaves mlx5_1 port 2
    ] {
        let r = with(&["--hca", hca]);
        assert_eq!(r.rc, 0, "{hca}: {}", r.err);
        assert!(r.out.lines().any(|l| l == format!("export NCCL_IB_HCA={printed}")), "{hca}: {}", r.out);
    }
    for (hca, why) in [
        ("=mlx5", "HCA 'mlx5' does not exist"),        // exact: no HCA is called mlx5
        ("mlx5_9", "no HCA's name starts with it"),    // a prefix that matches nothing
        ("=mlx5_0:2", "HCA 'mlx5_0' has no port '2'"), // exact with a port it lacks
        ("mlx5_0:x", "bad port in 'mlx5_0:x'"),
        ("^mlx5", "excludes every HCA port"), // NCCL would be left with no device
        ("^mlx5_0,mlx5_1", "excludes every HCA port"),
        ("^", "names no HCA"),
        (",", "names no HCA"),
        ("=^mlx5_0", "bad HCA name"), // NCCL reads ^ first, then =
        ("mlx5_0;reboot", "bad HCA name"),
    ] {
        let r = with(&["--hca", hca]);
        assert_eq!(r.rc, 2, "{hca}: {}", r.out);
        assert!(r.err.contains(why), "{hca}: {}", r.err);
        assert_eq!(r.out, "", "{hca}: nothing printed");
    }
    // an exclusion of an HCA that is not here is harmless: a warning, no refusal
    let r = with(&["--hca", "^mlx5_7"]);
    assert_eq!(r.rc, 0);
    assert!(r.err.contains("excludes 'mlx5_7', which matches no HCA here"), "{}", r.err);

    // levels: NCCL's names (upper case, as its strcmp) and old numbers; both variables
    for (flag, var) in [("--gdr-level", "NCCL_NET_GDR_LEVEL"), ("--p2p-level", "NCCL_P2P_LEVEL")] {
        for l in ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "0", "3", "4", "7"] {
            let r = with(&["--hca", "mlx5_0", flag, l]);
            assert_eq!(r.rc, 0, "{flag} {l}: {}", r.err);
            assert!(r.out.lines().any(|x| x == format!("export {var}={l}")), "{flag} {l}: {}", r.out);
        }
        for l in ["sys", "FAST", "-1", "010", "3x", ""] {
            let r = with(&["--hca", "mlx5_0", flag, l]);
            assert_eq!(r.rc, 2, "{flag} {l:?}: {}", r.out);
            assert!(r.err.contains(&format!("{flag} must be one of")), "{flag} {l:?}: {}", r.err);
        }
    }
    let r = with(&["--hca", "mlx5_0", "--gdr-level", "0"]);
    assert!(r.err.contains("NCCL_NET_GDR_LEVEL=0 means LOC") && r.err.contains("will not use GDR"), "{}", r.err);
    let r = with(&["--hca", "mlx5_0", "--gid-index", "-1"]);
    assert!(r.rc == 0 && r.out.contains("export NCCL_IB_GID_INDEX=-1\n"), "-1: NCCL chooses: {}", r.err);
    // an option at the end without its value, and the --opt=value form
    let r = run(&p, &["--mode", "p2p", "--p2p-level"], &env);
    assert_eq!(r.rc, 2);
    assert!(r.err.contains("--p2p-level needs a value"), "{}", r.err);
    let r = run(&p, &["--mode=p2p", "--p2p-level=PIX", "--print"], &env);
    assert_eq!((r.rc, r.out.lines().next()), (0, Some("export NCCL_P2P_LEVEL=PIX")), "{}", r.err);
}

#[test]
fn env_script_prints_copyable_exports_and_refuses_print_with_a_command() {
    let s = scratch("env-print");
    let (prefix, sys) = env_setup(&s);
    let p = script("scripts/gdr-env.sh");
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    let log = "/var/log/my jobs/it's $HOME %h-%p.log";
    let args = ["--prefix", prefix.to_str().unwrap(), "--hca", "^=mlx5_1,mlx5_0:7", "--shim-log", log, "--debug"];
    let printed = run(&p, &[&args[..], &["--print"]].concat(), &env);
    assert_eq!(printed.rc, 0, "{}", printed.err);
    assert!(printed.out.lines().any(|l| l == "export NCCL_DEBUG_SUBSYS=INIT,NET,P2P,ENV"), "commas bare: {}", printed.out);
    // what a shell gets from the printed lines is exactly what a command run through it gets
    let wanted = run(&p, &[&args[..], &["--", "env"]].concat(), &env);
    assert_eq!(wanted.rc, 0, "{}", wanted.err);
    let names: Vec<&str> = printed.out.lines().map(|l| l.strip_prefix("export ").unwrap().split('=').next().unwrap()).collect();
    assert!(names.contains(&"GDRSHIM_LOG_FILE") && names.contains(&"NCCL_IB_HCA"));
    for shell in ["bash", "sh"] {
        let file = s.join("exports");
        std::fs::write(&file, &printed.out).unwrap();
        let o = Command::new(shell).arg("-c").arg(format!(". {}; env", file.display())).env("HOME", "/home/x").output().unwrap();
        let got = String::from_utf8_lossy(&o.stdout);
        for n in &names {
            let line = |t: &str| t.lines().find(|l| l.starts_with(&format!("{n}="))).map(str::to_owned);
            assert_eq!(line(&got), line(&wanted.out), "{shell}: {n}");
        }
        assert!(got.contains(&format!("GDRSHIM_LOG_FILE={log}\n")), "{shell}: {got}");
    }
    // --print with a command: refused, the command not run
    let marker = s.join("ran");
    let cmd = format!("touch {}", marker.display());
    let r = run(&p, &[&args[..], &["--print", "--", "sh", "-c", &cmd]].concat(), &env);
    assert_eq!(r.rc, 2);
    assert!(r.err.contains("ambiguous") && r.out.is_empty(), "{}", r.err);
    let r = run(&p, &[&args[..], &["--", "sh", "-c", &cmd, "--print"]].concat(), &env);
    assert_eq!(r.rc, 0, "after -- everything is the command's: {}", r.err);
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    // sourced, it runs no command: it says so and returns 2, and the shell goes on
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} --mode p2p -- sh -c '{cmd}'; echo \"rc=$? ${{NCCL_P2P_LEVEL:-unset}}\"", p.display()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "rc=2 unset\n", "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!marker.exists());
}

/// A folder of commands for a PATH of its own: links to the real `real` ones, and scripts `fakes`.
fn path_of(at: &Path, real: &[&str], fakes: &[(&str, &str)]) -> PathBuf {
    let bin = at.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in real {
        let found = std::env::var("PATH")
            .unwrap()
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} is not on this PATH"));
        std::os::unix::fs::symlink(found, bin.join(name)).unwrap();
    }
    for (name, body) in fakes {
        write_exe(&bin.join(name), &format!("#!/bin/bash\n{body}\n"));
    }
    bin
}

/// What test.sh runs before its first phase: a shell and the few tools of its prologue.
const SHELL_TOOLS: &[&str] = &["bash", "dirname", "sed", "head", "awk", "sort", "cat", "id"];

#[test]
fn the_suite_names_every_missing_prerequisite_at_once_before_any_phase() {
    // issue 31: without libibverbs-dev the suite failed after 5.5 minutes; without shellcheck a
    // phase said NOT RUN. Here: no shellcheck, no git, no rdma-core examples, no Open MPI or Slurm,
    // and a compiler that finds no verbs.h.
    let s = scratch("prereq");
    let shell: Vec<&str> = SHELL_TOOLS.iter().copied().filter(|t| *t != "id").collect();
    let bin = path_of(
        &s,
        &shell,
        &[
            // a user who is not root: the install command with sudo (issue 40: root has none)
            ("id", "[ \"$1\" = -u ] && echo \"${FAKE_UID:-1000}\""),
            ("cc", "for a in \"$@\"; do [ \"$a\" != -E ] || { echo 'fatal error: infiniband/verbs.h: No such file' >&2; exit 1; }; done"),
            ("c++", "exit 0"),
            ("objdump", "exit 0"),
            ("dpkg-deb", "exit 0"),
            (
                "cargo",
                "case \"$1\" in fmt|clippy) [ \"$2\" = --version ] && exit 0 ;; esac; touch \"$(dirname \"$0\")/../cargo-ran\"; exit 101",
            ),
            ("rustc", "echo 'rustc 1.95.0 (59807616e 2026-04-14)'"),
        ],
    );
    let env = [("PATH", bin.to_str().unwrap())];
    let t0 = std::time::Instant::now();
    let r = run(&script("scripts/dev/test.sh"), &[], &env);
    assert_eq!(r.rc, 2, "{}{}", r.out, r.err);
    assert_eq!(r.out, "", "no phase started");
    assert_eq!(
        r.err,
        "test.sh: missing: git shellcheck libibverbs-dev ibverbs-utils openmpi-bin slurmctld slurmd (sudo apt-get install git shellcheck libibverbs-dev ibverbs-utils openmpi-bin slurmctld slurmd); nothing run\n"
    );
    assert!(!s.join("cargo-ran").exists(), "nothing built");
    let r = run(&script("scripts/dev/test.sh"), &[], &[env[0], ("FAKE_UID", "0")]);
    assert_eq!(r.err, "test.sh: missing: git shellcheck libibverbs-dev ibverbs-utils openmpi-bin slurmctld slurmd (apt-get install git shellcheck libibverbs-dev ibverbs-utils openmpi-bin slurmctld slurmd); nothing run\n");
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "found at once: {:?}", t0.elapsed());
    // CI's list to install: the same names
    let r = run(&script("scripts/dev/test.sh"), &["--missing-packages"], &env);
    assert_eq!((r.rc, r.out.as_str()), (0, "git shellcheck libibverbs-dev ibverbs-utils openmpi-bin slurmctld slurmd\n"), "{}", r.err);
    // Rust's own parts are named with their own command
    let s = scratch("prereq-rust");
    let mut fakes = vec![("cc", "exit 0"), ("c++", "exit 0"), ("git", "exit 0"), ("objdump", "exit 0"), ("shellcheck", "exit 0")];
    for lab in ["ibv_rc_pingpong", "mpirun", "slurmctld", "slurmd", "srun"] {
        fakes.push((lab, "exit 0"));
    }
    fakes.extend([("dpkg-deb", "exit 0"), ("cargo", "[ \"$1\" = fmt ] && exit 0; exit 1"), ("rustc", "exit 0")]);
    let bin = path_of(&s, SHELL_TOOLS, &fakes);
    let r = run(&script("scripts/dev/test.sh"), &[], &[("PATH", bin.to_str().unwrap())]);
    assert_eq!((r.rc, r.err.as_str()), (2, "test.sh: missing: clippy (rustup component add clippy); nothing run\n"), "{}", r.out);
}

/// Every prerequisite there, and a cargo that fails as `cargo test` does (101) at `fmt`.
fn failing_toolchain(s: &Path, cargo: &str) -> PathBuf {
    let ok = "exit 0";
    path_of(
        s,
        SHELL_TOOLS,
        &[
            ("cc", ok),
            ("c++", ok),
            ("git", ok),
            ("objdump", ok),
            ("shellcheck", ok),
            ("dpkg-deb", ok),
            ("ibv_rc_pingpong", ok),
            ("mpirun", ok),
            ("slurmctld", ok),
            ("slurmd", ok),
            ("srun", ok),
            ("cargo", cargo),
            ("rustc", "echo 'rustc 1.95.0 (59807616e 2026-04-14)'"),
        ],
    )
}

#[test]
fn a_failing_phase_exits_1_as_the_help_says_not_with_cargos_101() {
    let s = scratch("phase101");
    let bin = failing_toolchain(&s, "case \"$*\" in *--version*) exit 0 ;; esac; echo \"cargo $*: 1 test failed\" >&2; exit 101");
    let r = run(&script("scripts/dev/test.sh"), &[], &[("PATH", bin.to_str().unwrap())]);
    assert_eq!(r.rc, 1, "{}{}", r.out, r.err);
    assert!(r.out.contains("test.sh: phase format\n"), "{}", r.out);
    assert!(r.err.contains("test.sh: phase format FAILED after ") && r.err.contains("(its command exited 101)"), "{}", r.err);
    let help = run(&script("scripts/dev/test.sh"), &["--help"], &[]).out;
    assert!(help.contains("1 a phase failed"), "{help}");
}

#[test]
fn a_failed_release_build_exits_1_and_says_so() {
    // issue 31: cargo's 101 came through, with only cargo's output
    let s = scratch("release101");
    let mut path = failing_toolchain(&s, "echo 'error[E0308]: mismatched types' >&2; exit 101").display().to_string();
    path.push(':');
    path.push_str(&std::env::var("PATH").unwrap());
    let out = s.join("dist");
    let r = run(&script("scripts/dev/build-release.sh"), &["--out", out.to_str().unwrap()], &[("PATH", path.as_str())]);
    assert_eq!(r.rc, 1, "{}{}", r.out, r.err);
    assert!(r.err.contains("build-release: building the library and the tools\n"), "progress first: {}", r.err);
    assert!(
        r.err.contains(
            "build-release: building the library and the tools failed (cargo exited 101; its messages are above): nothing written"
        ),
        "{}",
        r.err
    );
    assert!(!out.exists(), "nothing written");
}
