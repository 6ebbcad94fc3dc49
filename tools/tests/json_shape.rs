//! One JSON shape and one vocabulary for every command's `--json` (issue 31; the README's "The
//! tools' JSON"): `{"tool","version","checks":[{"id","status","summary","evidence":[…],"fix"…}…],
//! "could_not_check","result","exit"…}`, statuses PASS WARN FAIL INFO COULD NOT CHECK, results
//! PASS FAIL COULD NOT CHECK, and `exit` the process's own exit code. An error that stops a
//! command is that object too.

mod common;

use common::{check_shape, parse, J};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn tool(args: &[&str]) -> (i32, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .current_dir(root)
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn every_command_prints_one_shape_and_one_vocabulary() {
    let mut seen: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    let runs: &[(&str, &[&str])] = &[
        ("doctor", &["doctor", "--json", "--from", "tests/fixtures/state/rig-4090-ok"]),
        ("doctor", &["doctor", "--json", "--from", "tests/fixtures/state/rig-4090-bad"]),
        (
            "verify-run",
            &[
                "verify-run",
                "--json",
                "--nccl-log",
                "tests/fixtures/nccl-logs/h200-allreduce-stock.log",
            ],
        ),
        (
            "verify-run",
            &[
                "verify-run",
                "--json",
                "--expect-gdr",
                "--nccl-log",
                "tests/fixtures/nccl-logs/h200-allreduce-stock.log",
            ],
        ),
        // no libcuda: could not check, with the reason
        ("dmabuf-probe", &["dmabuf-probe", "--json", "--libcuda", "/nonexistent/libcuda.so.1"]),
        // an error that stops a command is the object too
        ("selftest", &["selftest", "--json", "--shim", "/nonexistent/libgdrshim.so"]),
        ("doctor", &["doctor", "--json", "--from", "/nonexistent/state"]),
    ];
    for (name, args) in runs {
        let (rc, out, err) = tool(args);
        assert!((0..=2).contains(&rc), "{args:?}: {err}");
        let j = check_shape(name, &out, rc);
        seen.entry(name).or_default().push(rc);
        if rc == 2 {
            assert!(matches!(j.get("could_not_check"), Some(J::Str(_))), "{args:?}: {out}");
        }
    }
    assert_eq!(seen["verify-run"], [0, 1], "a pass and a fail");
    assert_eq!(seen["doctor"], [0, 1, 2], "ready, not ready, not a state");
    assert_eq!(seen["dmabuf-probe"], [2]);
    let (_, out, _) = tool(&["selftest", "--json", "--shim", "/nonexistent/libgdrshim.so"]);
    let j = parse(&out);
    assert!(
        j.get("could_not_check").unwrap().str().starts_with("--shim /nonexistent/libgdrshim.so: "),
        "{out}"
    );
}

#[test]
fn the_text_says_the_same_words() {
    // a check the probe could not make is COULD NOT CHECK in the text as in the JSON
    let (rc, out, _) = tool(&["dmabuf-probe", "--libcuda", "/nonexistent/libcuda.so.1"]);
    assert_eq!(rc, 2);
    assert!(out.contains("could not check here: "), "{out}");
    assert!(!out.contains("COULD-NOT-CHECK") && !out.contains("could_not_check"), "{out}");
}
