//! `verify-run` on the derived two-node example (tests/fixtures/nccl-logs/README.md says how it
//! was derived), on variants of it, and the input rules: a file given twice is read once,
//! `--exit-code` 0..=255, 128+N named as signal N.

use std::path::{Path, PathBuf};
use std::process::Command;

const DIR: &str = "tests/fixtures/nccl-logs";
const NCCL: &str = "tests/fixtures/nccl-logs/derived-2node-gdr.nccl.log";
const SHIM: &str = "tests/fixtures/nccl-logs/derived-2node-gdr.shim.log";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tool(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

fn fixture(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap()
}

/// A scratch folder of this test process, emptied first.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn line_of<'a>(out: &'a str, id: &str) -> &'a str {
    // "STATUS id summary", the status one word or COULD NOT CHECK
    let is = |l: &str| {
        ["COULD NOT CHECK", "PASS", "WARN", "FAIL", "INFO"]
            .iter()
            .any(|w| l.strip_prefix(w).is_some_and(|r| r.split_whitespace().next() == Some(id)))
    };
    out.lines().find(|l| is(l)).unwrap_or_else(|| panic!("no {id} line: {out}"))
}

#[test]
fn the_derived_example_passes_expect_gdr() {
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        NCCL,
        "--shim-log",
        SHIM,
        "--expect-gdr",
        "--exit-code",
        "0",
    ]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.lines().last().unwrap().starts_with("RESULT: PASS (")
            && !out.contains("could not check"),
        "{out}"
    );
    assert!(
        line_of(&out, "nccl.gdr").starts_with("PASS")
            && line_of(&out, "nccl.gdr").contains("4 network connections"),
        "{out}"
    );
    assert!(line_of(&out, "shim.registering").contains("5 exact (pass0) hits"), "{out}");
    assert!(
        !out.lines().any(|l| l.starts_with("FAIL") || l.starts_with("WARN"))
            && !out.contains("input.read_once"),
        "{out}"
    );
    // without the shim's log the same NCCL log is no proof: no summary, nothing registered
    let (rc, out) = tool(&["verify-run", "--nccl-log", NCCL, "--expect-gdr", "--exit-code", "0"]);
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "shim.summary").starts_with("FAIL"), "{out}");
}

#[test]
fn a_shim_log_without_the_registrations_fails() {
    let shim = fixture(SHIM);
    let d = scratch("noreg");
    // the same process, had NCCL never registered GPU memory through it: no pass0 lines, and the
    // summary's registration counters 0
    let noreg: String = shim
        .lines()
        .filter(|l| !l.contains("pass0 hit"))
        .map(|l| {
            l.replace(" pass0_hits=5 ", " pass0_hits=0 ")
                .replace(" registered=5 unregistered=5 ", " registered=0 unregistered=0 ")
                + "\n"
        })
        .collect();
    assert!(
        noreg.contains(" pass0_hits=0 ") && noreg.lines().count() == 3,
        "the fixture changed: {noreg}"
    );
    std::fs::write(d.join("noreg.log"), &noreg).unwrap();
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        NCCL,
        "--shim-log",
        d.join("noreg.log").to_str().unwrap(),
        "--expect-gdr",
        "--exit-code",
        "0",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.lines().last().unwrap().starts_with("RESULT: FAIL ("), "{out}");
    assert!(
        line_of(&out, "shim.registering").starts_with("FAIL")
            && line_of(&out, "shim.registering").contains("registered nothing"),
        "{out}"
    );
    // a shim log cut before its summary (a process killed by a signal prints none)
    let cut: String = shim
        .lines()
        .filter(|l| !l.starts_with("gdrshim: summary"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(d.join("cut.log"), &cut).unwrap();
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        NCCL,
        "--shim-log",
        d.join("cut.log").to_str().unwrap(),
        "--expect-gdr",
        "--exit-code",
        "0",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "shim.summary").starts_with("FAIL"), "{out}");
    // a miss in the summary
    std::fs::write(d.join("miss.log"), shim.replace(" pass0_misses=0 ", " pass0_misses=1 "))
        .unwrap();
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        NCCL,
        "--shim-log",
        d.join("miss.log").to_str().unwrap(),
        "--expect-gdr",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "shim.summary").contains("pass0_misses=1"), "{out}");
    let _ = std::fs::remove_dir_all(d);
}

/// The derived NCCL log is the real one with exactly the edits its README lists.
#[test]
fn the_derived_nccl_log_is_the_real_one_with_the_documented_edits() {
    let real = fixture(&format!("{DIR}/h200-allreduce-patched-shim.log"));
    let p = "vm:15162:15162 [0] NCCL INFO ";
    // 1. the shim's lines go to its own log
    let mut s: String = real
        .lines()
        .filter(|l| !l.contains("[gdrshim]") && !l.starts_with("gdrshim: summary"))
        .map(|l| format!("{l}\n"))
        .collect();
    s = s.trim_end_matches('\n').to_string() + "\n";
    // 2. a RoCE HCA instead of the socket fallback
    let fallback = [
        "NET/IB : No device found.",
        "NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>",
        "Failed to initialize NET plugin IB",
        "NET/Socket : Using [0]eth0:192.0.2.2<0>",
        "Initialized NET plugin Socket",
        "Assigned NET plugin Socket to comm",
        "Using network Socket",
    ];
    let ib = [
        "NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:192.0.2.2<0>",
        "Initialized NET plugin IB",
        "Assigned NET plugin IB to comm",
        "Using network IB",
    ];
    let block = |ls: &[&str]| ls.iter().map(|l| format!("{p}{l}\n")).collect::<String>();
    assert!(s.contains(&block(&fallback)));
    s = s.replace(&block(&fallback), &block(&ib));
    // 3. the connection lines of a two-rank ring over the network, after "Init timings"
    let conn = [
        "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "Connected all rings, use ring PXN 0 GDR 1",
    ];
    let at = s.find(&format!("{p}Init timings")).unwrap();
    let at = at + s[at..].find('\n').unwrap() + 1;
    s.insert_str(at, &block(&conn));
    assert!(
        s == fixture(NCCL),
        "derived-2node-gdr.nccl.log is no longer the real log with the README's edits"
    );
    // and the shim log is one process, the NCCL run's pid
    let shim = fixture(SHIM);
    assert!(
        shim.lines().all(|l| l.starts_with("vm:15162:15162 [gdrshim] ")
            || l.starts_with("gdrshim: summary host=vm pid=15162 ")),
        "{shim}"
    );
    assert!(fixture(&format!("{DIR}/README.md")).contains("**derived**"));
}

#[test]
fn a_file_given_twice_is_read_once() {
    let d = scratch("twice");
    // a NCCL log whose shim lines went to stderr (no GDRSHIM_LOG_FILE), with one NCCL WARN
    let nccl = fixture(NCCL).replace(
        "# Out of bounds values",
        "vm:15162:15162 [0] NCCL WARN NET/IB : something\n# Out of bounds values",
    ) + &fixture(SHIM);
    let log = d.join("all.log");
    std::fs::write(&log, &nccl).unwrap();
    std::os::unix::fs::symlink(&log, d.join("link.log")).unwrap();
    let log = log.to_str().unwrap();
    let link = d.join("link.log");
    let link = link.to_str().unwrap();
    for args in [
        &["--nccl-log", log, "--shim-log", log][..],
        &["--nccl-log", log, "--shim-log", link],
        &["--nccl-log", log, "--shim-log", link, "--shim-log", log, "--shim-log", link],
    ] {
        let mut a = vec!["verify-run", "--expect-gdr"];
        a.extend_from_slice(args);
        let (rc, out) = tool(&a);
        assert_eq!(rc, 1, "{args:?}: {out}");
        // the WARN is reported once, for the NCCL log, never again "in the shim log"
        let warns: Vec<&str> = out.lines().filter(|l| l.contains("forbidden.nccl_warn")).collect();
        assert_eq!(warns.len(), 1, "{args:?}: {out}");
        assert!(warns[0].contains("1 line(s) in the NCCL log"), "{out}");
        assert!(line_of(&out, "shim.summary").contains(" 1 gdrshim summaries"), "{out}");
        assert!(line_of(&out, "shim.registering").contains(" 5 exact (pass0) hits"), "{out}");
        assert_eq!(
            out.lines().filter(|l| l.contains("INFO input.read_once")).count(),
            args.len() / 2 - 1,
            "{args:?}: {out}"
        );
    }
    // the same summary in two different files (stderr in the NCCL log, and GDRSHIM_LOG_FILE) is
    // one process: counted once
    let (rc, out) = tool(&["verify-run", "--expect-gdr", "--nccl-log", log, "--shim-log", SHIM]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        line_of(&out, "shim.summary").contains(" 1 gdrshim summaries")
            && out.contains("1 repeated line(s) counted once"),
        "{out}"
    );
    assert!(line_of(&out, "shim.registering").contains(" 5 exact (pass0) hits"), "{out}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn exit_codes_are_checked_and_signals_named() {
    let run = |code: &str| {
        tool(&[
            "verify-run",
            "--nccl-log",
            NCCL,
            "--shim-log",
            SHIM,
            "--expect-gdr",
            "--exit-code",
            code,
        ])
    };
    let (rc, out) = run("137");
    assert_eq!(rc, 1, "{out}");
    let l = line_of(&out, "nccl.exit");
    assert!(
        l.starts_with("FAIL")
            && l.contains("killed by signal 9 (SIGKILL)")
            && !l.contains("CUDA error,"),
        "{out}"
    );
    let (_, out) = run("143");
    assert!(line_of(&out, "nccl.exit").contains("killed by signal 15 (SIGTERM)"), "{out}");
    let (_, out) = run("134");
    assert!(line_of(&out, "nccl.exit").contains("killed by signal 6 (SIGABRT)"), "{out}");
    let (_, out) = run("2");
    assert!(
        line_of(&out, "nccl.exit").contains("a CUDA error") && !out.contains("signal"),
        "{out}"
    );
    let (rc, out) = run("255");
    assert_eq!(rc, 1, "{out}");
    assert!(line_of(&out, "nccl.exit").contains("exit status 255"), "{out}");
    let (rc, out) = run("0");
    assert_eq!(rc, 0, "{out}");
    for bad in ["256", "300", "-9", "1.5", ""] {
        let (rc, out) = run(bad);
        assert_eq!(rc, 2, "--exit-code {bad:?}: {out}");
        assert!(out.contains("--exit-code") && !out.contains("RESULT"), "{out}");
    }
}
