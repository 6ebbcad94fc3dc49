//! The shell tools' own behaviour (the contract every command keeps, --help, --version, --json, a
//! bad flag and no arguments, is tools/tests/cli_conventions.rs's): the doctor checks its
//! arguments before recording and passes the tool's exit code (0 ready, 1 not ready, 2 could not
//! check) through; gdr-state-record saves and compares; the demo's sections, verdict table and
//! `--verbose`. gdr-env.sh's are tests/gdr_env.rs's, the developer's suite's tests/dev_scripts.rs's.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::scripts::{root, run, scratch, script, sh, write_exe, Run};

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
    assert!(
        !r.err.contains("parameter null or not set") && !r.err.contains("line "),
        "no bash error: {}",
        r.err
    );
    for args in [
        vec!["compare"],
        vec!["compare", "A", "B", "C"],
        vec!["save", "a", "b"],
        vec![],
        vec!["frobnicate"],
    ] {
        let r = run(&p, &args, &[]);
        assert_eq!(r.rc, 2, "{args:?}: {}", r.err);
        assert!(r.err.contains("gdr-state-record:"), "{args:?}: {}", r.err);
    }
}

#[test]
fn state_record_keeps_nccls_files_byte_for_byte() {
    let s = scratch("record-nccl");
    let conf = s.join("my nccl.conf");
    std::fs::write(&conf, "NCCL_NET_FORCE_FLUSH=1\r\n# x\n").unwrap();
    let hex = |b: &[u8]| b.iter().map(|c| format!("{c:02x}")).collect::<String>();
    let conf_s = conf.to_str().unwrap();
    let (rc, out) = sh(
        "gdr-state-record",
        &["save", s.to_str().unwrap()],
        &[("NCCL_CONF_FILE", conf_s), ("NCCL_NET_FORCE_FLUSH", "")],
    );
    assert_eq!(rc, 0, "{out}");
    let t = std::fs::read_to_string(PathBuf::from(out.trim()).join("nccl-conf.txt")).unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert!(
        lines.contains(&format!("env NCCL_CONF_FILE {}", hex(conf_s.as_bytes())).as_str()),
        "{t}"
    );
    assert!(lines.contains(&"env NCCL_NET_FORCE_FLUSH "), "set and empty is recorded: {t}");
    assert!(
        lines.contains(
            &format!("file {} {}", hex(conf_s.as_bytes()), hex(b"NCCL_NET_FORCE_FLUSH=1\r\n# x\n"))
                .as_str()
        ),
        "{t}"
    );
    // NCCL_CONF_FILE replaces the home's file; /etc/nccl.conf is always read
    let files: Vec<&&str> = lines.iter().filter(|l| l.starts_with("file ")).collect();
    assert_eq!(files.len(), 2, "{t}");
    assert!(files[1].starts_with(&format!("file {} ", hex(b"/etc/nccl.conf"))), "{t}");
}

#[test]
fn state_record_saves_every_item_and_compares_what_matters() {
    let s = scratch("record");
    let (rc, out) = sh("gdr-state-record", &["save", s.to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    let a = PathBuf::from(out.trim());
    for item in [
        "nvidia-smi-q",
        "nvidia-smi-topo-p2p-r",
        "packages",
        "holds",
        "dkms-status",
        "kernel",
        "modinfo-nvidia",
        "proc-driver-version",
    ] {
        let t = std::fs::read_to_string(a.join(format!("{item}.txt")))
            .unwrap_or_else(|_| panic!("{item} not saved"));
        // a tool that is missing here says so instead of leaving an empty file
        assert!(!t.is_empty() || item == "holds", "{item}: empty");
    }
    assert!(a.join("RECORD").exists());
    let b = s.join("copy");
    assert!(Command::new("cp").arg("-a").arg(&a).arg(&b).status().unwrap().success());
    // live readings of nvidia-smi -q are not a difference
    std::fs::write(
        a.join("nvidia-smi-q.txt"),
        "Timestamp : Mon\nDriver Version : 595.71.05\n    GPU Current Temp : 40 C\n",
    )
    .unwrap();
    std::fs::write(
        b.join("nvidia-smi-q.txt"),
        "Timestamp : Tue\nDriver Version : 595.71.05\n    GPU Current Temp : 55 C\n",
    )
    .unwrap();
    let (rc, out) =
        sh("gdr-state-record", &["compare", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("no difference"), "{out}");
    // a driver change is
    std::fs::write(b.join("nvidia-smi-q.txt"), "Timestamp : Tue\nDriver Version : 595.58.03\n")
        .unwrap();
    std::fs::remove_file(b.join("holds.txt")).unwrap();
    let (rc, out) =
        sh("gdr-state-record", &["compare", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("== nvidia-smi-q changed:") && out.contains("> Driver Version : 595.58.03"),
        "{out}"
    );
    assert!(out.contains("== holds: only in"), "{out}");
    assert_eq!(
        sh("gdr-state-record", &["compare", a.to_str().unwrap(), s.to_str().unwrap()], &[]).0,
        2,
        "not a save"
    );
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
    write_exe(
        &t.join("bin/gdrshim-tool"),
        &format!("#!/bin/sh\necho \"tool $*\" >> {}\nexit {tool_rc}\n", log.display()),
    );
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
    for args in [
        vec!["--help"],
        vec!["-h"],
        vec!["--version"],
        vec!["--bogus"],
        vec!["--json", "extra"],
        vec!["--from"],
        vec!["--keep", "--from"],
    ] {
        let r = run(&doctor, &args, &[]);
        assert!(r.rc == 0 || r.rc == 2, "{args:?}: {}", r.rc);
        assert_eq!(
            r.rc == 0,
            args[0].starts_with("-h") || args[0] == "--help" || args[0] == "--version",
            "{args:?}"
        );
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

const WORKLOADS: [&str; 5] =
    ["alloc-probe", "bar1-readback", "torch-alloc", "torch-exp", "torch-nccl"];

#[test]
fn demo_has_a_section_per_workload_a_verdict_table_and_says_what_it_proves() {
    let replay = PathBuf::from(env!("CARGO_BIN_EXE_gdrshim-replay"));
    let r = demo(&[], &replay);
    assert_eq!(r.rc, 0, "{}{}", r.out, r.err);
    let o = &r.out;
    for w in WORKLOADS {
        assert_eq!(
            o.matches(&format!("\n== {w}: ")).count()
                + usize::from(o.starts_with(&format!("== {w}: "))),
            1,
            "one section for {w}:\n{o}"
        );
    }
    assert!(!o.contains("/tmp") && !o.contains(".cap "), "no temporary paths: {o}");
    assert!(!o.contains("pass0 hit"), "the per-allocation lines only with --verbose");
    let lines: Vec<&str> = o.lines().collect();
    let head = lines.iter().position(|l| l.starts_with("workload ")).expect("a verdict table");
    let cols: Vec<&str> = lines[head].split('|').map(str::trim).collect();
    assert_eq!(
        cols,
        [
            "workload",
            "allocations",
            "libcuda registrations",
            "predicted",
            "mismatched",
            "dma-buf exports"
        ]
    );
    let mut rows = 0;
    for l in &lines[head + 2..] {
        let c: Vec<&str> = l.split('|').map(str::trim).collect();
        if c.len() != 6 {
            break;
        }
        let n: Vec<u64> = c[1..].iter().map(|x| x.parse().unwrap()).collect();
        assert!(n[0] > 0 && n[1] > 0, "{l}");
        assert_eq!(
            (n[2], n[3]),
            (n[1], 0),
            "every registration libcuda made predicted, none different: {l}"
        );
        assert_eq!(n[4], n[0], "the DMA-BUF route exports every allocation: {l}");
        rows += 1;
    }
    assert_eq!(rows, WORKLOADS.len() + 1, "a row per workload and the total:\n{o}");
    assert!(o.contains("allocation by allocation") && o.contains("H200"), "what it proves: {o}");
    assert!(
        o.contains("\"= native\"") && o.contains("is exactly the one libcuda made"),
        "what = native means: {o}"
    );

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
    // a replay that reports one mismatch in torch-exp (and exits 1, as gdrshim-replay does) and
    // one allocation of torch-alloc the DMA-BUF route would not export
    let fake = s.join("replay");
    write_exe(
        &fake,
        "#!/bin/sh\ncase \"$1\" in *torch-exp*) m=1 ;; *) m=0 ;; esac\n\
         case \"$1\" in *torch-alloc*) u=1 ;; *) u=0 ;; esac\n\
         echo \"== $1 (driver 580.159.04)\"\n\
         echo \"gdrshim: summary replay=$1 ioctls=9 decoded=9 native=5 matched=$((5 - m)) mismatched=$m unpredicted=0 predicted_only=0 user_allocs=5 uncovered=0 dmabuf_planned=$((5 - u)) dmabuf_unplanned=$u\"\n\
         exit $m\n",
    );
    let r = demo(&[], &fake);
    assert_eq!(r.rc, 1, "{}", r.out);
    assert!(r.out.contains("FAIL: torch-alloc torch-exp"), "{}", r.out);
    let row = |w: &str| -> Vec<String> {
        let l = r.out.lines().find(|l| l.starts_with(&format!("{w} "))).unwrap();
        l.split('|').map(|c| c.trim().to_string()).collect()
    };
    assert_eq!(row("torch-exp")[4], "1", "the table shows the mismatch: {}", r.out);
    assert_eq!(row("torch-alloc")[5], "4", "and the export refused: {}", r.out);
    assert!(r
        .out
        .contains("DMA-BUF route: 4 of 5 allocations would be exported exactly (1 refused)"));
    assert!(!r.out.contains("What this shows"), "no claim on a failure");
    // a replay that dies without a summary
    let dead = s.join("dead");
    write_exe(&dead, "#!/bin/sh\necho 'gdrshim-replay: rejected: not a capture' >&2\nexit 2\n");
    let r = demo(&[], &dead);
    assert_eq!(r.rc, 1);
    assert!(
        r.out.contains("the replay gave no summary (exit 2)") && r.out.contains("not a capture"),
        "{}",
        r.out
    );
}
