//! The conventions every command keeps (issue 17): `-h/--help` usage on stdout, exit 0;
//! `--version` on the top level and on each subcommand, exit 0; an unknown flag or a bad value is
//! a usage error on stderr, exit 2; the help documents the exit codes.

use std::process::Command;

struct Out {
    rc: i32,
    stdout: String,
    stderr: String,
}

fn tool(args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool")).args(args).output().unwrap();
    Out {
        rc: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const SUBCOMMANDS: &[&str] = &["doctor", "verify-run", "dmabuf-probe", "selftest"];

#[test]
fn help_is_usage_on_stdout_exit_0_with_the_exit_codes() {
    for flag in ["-h", "--help"] {
        let o = tool(&[flag]);
        assert_eq!(o.rc, 0, "{flag}: {}", o.stderr);
        assert!(o.stderr.is_empty(), "{flag}: {}", o.stderr);
        assert!(o.stdout.contains("Usage: gdrshim-tool <COMMAND>"), "{}", o.stdout);
        for sub in SUBCOMMANDS.iter().chain(&["version"]) {
            assert!(o.stdout.contains(&format!("  {sub} ")), "{sub} missing from the help: {}", o.stdout);
        }
        assert!(o.stdout.contains("Exit codes:") && o.stdout.contains("  2  could not check"), "{}", o.stdout);
        for sub in SUBCOMMANDS {
            let o = tool(&[sub, flag]);
            assert_eq!(o.rc, 0, "{sub} {flag}: {}", o.stderr);
            assert!(o.stderr.is_empty(), "{sub} {flag}: {}", o.stderr);
            assert!(o.stdout.contains(&format!("Usage: gdrshim-tool {sub}")), "{}", o.stdout);
            for code in ["  0  ", "  1  ", "  2  "] {
                assert!(o.stdout.contains(code), "{sub} {flag} does not document exit code{code}: {}", o.stdout);
            }
        }
    }
    // help on a subcommand runs nothing: verify-run would need --nccl-log, the doctor --from
    let o = tool(&["verify-run", "--help", "--nccl-log", "/nonexistent"]);
    assert_eq!(o.rc, 0, "{}", o.stderr);
    assert!(o.stdout.contains("--expect-gdr") && o.stdout.contains("--exit-code <N>"), "{}", o.stdout);
    // issue 31: where the user looks, the doctor says a FAIL wins over could not check
    let o = tool(&["doctor", "--help"]);
    assert!(o.stdout.contains("A FAIL wins over could not check: on a machine without a GPU"), "{}", o.stdout);
    // and --json is documented once, at the top
    let o = tool(&["--help"]);
    assert!(o.stdout.contains("--json (every command): one JSON object"), "{}", o.stdout);
    let o = tool(&["help", "doctor"]);
    assert_eq!(o.rc, 0);
    assert!(o.stdout.contains("--from <SAVED_STATE_FOLDER>"), "{}", o.stdout);
}

#[test]
fn version_everywhere() {
    let want = env!("CARGO_PKG_VERSION");
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let o = tool(args);
        assert_eq!(o.rc, 0, "{args:?}: {}", o.stderr);
        assert_eq!(o.stdout.trim(), format!("gdrshim-tool (gdrshim) {want}"), "{args:?}");
    }
    for sub in SUBCOMMANDS {
        let o = tool(&[sub, "--version"]);
        assert_eq!(o.rc, 0, "{sub}: {}", o.stderr);
        assert_eq!(o.stdout, format!("gdrshim-tool {sub} (gdrshim) {want}\n"), "{sub}");
    }
}

#[test]
fn usage_errors_exit_2_on_stderr() {
    let cases: &[&[&str]] = &[
        &[],
        &["--bogus"],
        &["no-such-command"],
        &["doctor", "--from", "tests/fixtures/state/rig-4090-ok", "--bogus"],
        &["doctor"],
        &["doctor", "--from"],
        &["verify-run", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-stock.log", "--bogus"],
        &["verify-run", "--expect-gdr"],
        &["verify-run", "--nccl-log", "x", "--exit-code", "300"],
        &["verify-run", "--nccl-log", "x", "--exit-code", "-1"],
        &["verify-run", "--nccl-log", "x", "--exit-code", "seven"],
        &["verify-run", "--nccl-log", "x", "--gpu-sm", "ada"],
        &["dmabuf-probe", "--bogus"],
        &["dmabuf-probe", "--size", "2M"],
        &["version", "--bogus"],
    ];
    for args in cases {
        let o = tool(args);
        assert_eq!(o.rc, 2, "{args:?}: {}{}", o.stdout, o.stderr);
        assert!(o.stdout.is_empty(), "{args:?}: usage errors print nothing on stdout: {}", o.stdout);
        assert!(o.stderr.contains("Usage: gdrshim-tool") || o.stderr.contains("--help"), "{args:?}: {}", o.stderr);
    }
    let o = tool(&["verify-run", "--nccl-log", "x", "--exit-code", "300"]);
    assert!(o.stderr.contains("300 is not in 0..=255"), "{}", o.stderr);
    let o = tool(&["doctor", "--bogus"]);
    assert!(o.stderr.contains("unexpected argument '--bogus'"), "{}", o.stderr);
    // the usage after an unknown flag shows what is required, not the flag clap suggests instead
    let o = tool(&["verify-run", "--nccl-log", "x", "--bogus"]);
    assert!(o.stderr.contains("Usage: gdrshim-tool verify-run --nccl-log <FILE> [OPTIONS]\n"), "{}", o.stderr);
    assert!(!o.stderr.contains("Usage: gdrshim-tool verify-run --nccl-log <FILE> --gpu-sm"), "{}", o.stderr);
}
