//! The one contract every command keeps (issues 17, 31, 40; README "Every command"): every script
//! in scripts/ and scripts/dev/ and every `gdrshim-tool` subcommand, run with `--help`,
//! `--version`, `--json`, a bad flag and no arguments, in a fresh clone (no tool built) and in a
//! tree with the tool built:
//! - `--help`: usage on stdout with the exit codes, nothing on stderr, exit 0, nothing done;
//! - `--version`: `NAME (gdrshim) VERSION`, exit 0;
//! - a bad flag: one line on stderr, `NAME: … (try --help)`, nothing on stdout, exit 2;
//! - `--json`, where the command's help offers it: one JSON object of the one shape, its `result`
//!   and `exit` the process's (or, where a required argument is missing, the usage error: a usage
//!   error is never JSON); where the help does not offer it: the usage error above;
//! - no arguments: a usage error as above, or the command's work, whose text ends with the RESULT
//!   line (on stderr where stdout carries what the command makes: a report, a CDI spec), its word
//!   the exit code's. The scripts that are no checks (deploy.sh, gdr-env.sh, gdr-state-record,
//!   apply-nccl-patches.sh, the dev scripts) have no RESULT line: their output is made to be
//!   pasted or read (`export` lines, a release), and their exit codes are in their help.

mod common;

use common::{check_shape, result_word};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Out {
    rc: i32,
    stdout: String,
    stderr: String,
}

fn out(o: std::process::Output) -> Out {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Out { rc: o.status.code().unwrap_or(-1), stdout: text(&o.stdout), stderr: text(&o.stderr) }
}

fn tool(args: &[&str]) -> Out {
    out(Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .args(args)
        .env_remove("GDRSHIM_TOOL_AS")
        .output()
        .unwrap())
}

/// Scripts that check something (they run a gdrshim-tool command) and offer --json.
const CHECKERS: [&str; 5] = ["doctor", "verify-run", "dmabuf-probe", "selftest", "report"];
/// Commands whose text goes to stdout only with --out: without it stdout carries what they make
/// and the RESULT line goes to stderr.
const MAKERS: [&str; 2] = ["report", "cdi"];
/// Scripts whose work with no arguments is a build or the whole suite (minutes, and the tree's
/// own target/): their no-argument run is the suite's and the release check's, not this test's.
const BUILDS: [&str; 4] = ["test.sh", "build-release.sh", "check-release.sh", "build-deb.sh"];

/// A copy of the repository's scripts (and Cargo.toml, which names the version) in a scratch
/// folder; with `built`, the tool beside them in bin/ as a release has it.
fn tree(tag: &str, built: bool) -> PathBuf {
    let t = std::env::temp_dir().join(format!("gdrshim-contract-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    std::fs::create_dir_all(t.join("scripts/dev")).unwrap();
    std::fs::copy(root().join("Cargo.toml"), t.join("Cargo.toml")).unwrap();
    for dir in ["scripts", "scripts/dev"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, t.join(dir).join(p.file_name().unwrap())).unwrap();
            }
        }
    }
    if built {
        std::fs::create_dir_all(t.join("bin")).unwrap();
        std::fs::copy(env!("CARGO_BIN_EXE_gdrshim-tool"), t.join("bin/gdrshim-tool")).unwrap();
    }
    for d in ["tmp", "work", "sysfs"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    t
}

/// Every command of a tree: its scripts (a file that starts with `#!`; the sourced helpers do
/// not) by path, and with a tool, `gdrshim-tool` itself and each subcommand its help lists.
fn commands(t: &Path, built: bool) -> Vec<(String, Vec<String>)> {
    let mut v = Vec::new();
    for dir in ["scripts", "scripts/dev"] {
        let mut names: Vec<PathBuf> =
            std::fs::read_dir(t.join(dir)).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for p in names {
            if p.is_file() && std::fs::read_to_string(&p).unwrap().starts_with("#!") {
                let name = p.file_name().unwrap().to_str().unwrap().to_string();
                v.push((name, vec!["bash".to_string(), p.to_str().unwrap().to_string()]));
            }
        }
    }
    if built {
        let bin = t.join("bin/gdrshim-tool").to_str().unwrap().to_string();
        v.push(("gdrshim-tool".into(), vec![bin.clone()]));
        for sub in subcommands() {
            v.push((format!("gdrshim-tool {sub}"), vec![bin.clone(), sub]));
        }
    }
    v
}

/// The subcommands `gdrshim-tool --help` lists (`help` aside).
fn subcommands() -> Vec<String> {
    let help = tool(&["--help"]).stdout;
    let list = help.split("Commands:\n").nth(1).unwrap().split("\n\n").next().unwrap();
    list.lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|s| s != "help")
        .collect()
}

fn run(t: &Path, argv: &[String], args: &[&str]) -> Out {
    let fake_replay = t.join("fake-replay");
    out(Command::new(&argv[0])
        .args(&argv[1..])
        .args(args)
        .current_dir(t.join("work"))
        .env("TMPDIR", t.join("tmp"))
        .env("GDRSHIM_DEMO_REPLAY", &fake_replay)
        .env("GDR_ENV_SYSFS", t.join("sysfs"))
        .env("GDR_ENV_TOOL", t.join("no-tool"))
        .env_remove("GDRSHIM_TOOL_AS")
        .output()
        .unwrap())
}

/// A usage error: one line on stderr starting with the command's name, ending in "(try --help)".
fn usage_error(name: &str, o: &Out, what: &str) {
    let stem = name.trim_end_matches(".sh");
    assert_eq!(o.rc, 2, "{name} {what}: {} {}", o.stdout, o.stderr);
    assert_eq!(o.stdout, "", "{name} {what}: nothing on stdout");
    assert_eq!(o.stderr.lines().count(), 1, "{name} {what}: one line: {}", o.stderr);
    assert!(
        o.stderr.starts_with(&format!("{stem}: ")) || o.stderr.starts_with(&format!("{name}: ")),
        "{name} {what}: names itself: {}",
        o.stderr
    );
    assert!(o.stderr.trim_end().ends_with("(try --help)"), "{name} {what}: {}", o.stderr);
}

/// The command's closing RESULT line, its word that of the exit code.
fn result_line(name: &str, o: &Out) {
    let maker = MAKERS.iter().any(|m| name.ends_with(m)) && o.rc == 0;
    let text = if maker && !o.stdout.trim_end().ends_with(')') { &o.stderr } else { &o.stdout };
    let last = text.lines().last().unwrap_or_else(|| panic!("{name}: no output: {}", o.stderr));
    assert!(
        last.starts_with(&format!("RESULT: {} (", result_word(o.rc))),
        "{name} (exit {}): {last}\n{}",
        o.rc,
        o.stderr
    );
}

fn contract(t: &Path, built: bool) {
    let version = env!("CARGO_PKG_VERSION");
    let cmds = commands(t, built);
    assert!(cmds.len() >= if built { 21 } else { 14 }, "{cmds:?}");
    for (name, argv) in &cmds {
        let checker = CHECKERS.contains(&name.as_str()) || name.starts_with("gdrshim-tool ");
        for h in ["-h", "--help"] {
            let o = run(t, argv, &[h]);
            assert_eq!((o.rc, o.stderr.as_str()), (0, ""), "{name} {h}: {}", o.stdout);
            assert!(
                o.stdout.contains("Exit") && o.stdout.contains(name.as_str()),
                "{name} {h}: its usage and exit codes: {}",
                o.stdout
            );
            // the help says whether the command takes --json, and it is the checkers that do
            if h == "--help" && name != "gdrshim-tool" {
                assert_eq!(
                    o.stdout.contains("--json"),
                    checker,
                    "{name}: --json in its help: {}",
                    o.stdout
                );
            }
        }
        let o = run(t, argv, &["--version"]);
        assert_eq!(
            (o.rc, o.stdout.clone()),
            (0, format!("{name} (gdrshim) {version}\n")),
            "{name}: {}",
            o.stderr
        );
        usage_error(name, &run(t, argv, &["--no-such-option"]), "--no-such-option");
        let o = run(t, argv, &["--json"]);
        if checker && o.rc == 2 && o.stdout.is_empty() {
            // a usage error is never JSON (verify-run without --nccl-log, the tool's doctor without --from)
            usage_error(name, &o, "--json");
        } else if checker {
            assert!((0..=2).contains(&o.rc), "{name} --json: {}", o.stderr);
            let sub = name.strip_prefix("gdrshim-tool ").unwrap_or(name);
            check_shape(sub, &o.stdout, o.rc);
        } else {
            usage_error(name, &o, "--json");
        }
        // none of these did any work: the demo replayed nothing, nothing was left in TMPDIR
        assert!(!t.join("replayed").exists(), "{name}: the demo replayed");
        assert_eq!(
            std::fs::read_dir(t.join("tmp")).unwrap().count(),
            0,
            "{name}: left something in TMPDIR"
        );
        if BUILDS.contains(&name.as_str()) {
            continue;
        }
        let o = run(t, argv, &[]);
        if name == "gdrshim-tool version" {
            assert_eq!(
                (o.rc, o.stdout),
                (0, format!("gdrshim-tool (gdrshim) {version}\n")),
                "its text is --version's line"
            );
        } else if o.rc == 2 && o.stdout.is_empty() {
            usage_error(name, &o, "(no arguments)");
        } else if checker {
            result_line(name, &o);
            if !built {
                assert!(
                    o.stderr.contains("gdrshim-tool is not built")
                        && o.stderr.contains("cargo build --release"),
                    "{name}: {}",
                    o.stderr
                );
            }
        } else {
            assert!((0..=1).contains(&o.rc), "{name} (no arguments): {} {}", o.stdout, o.stderr);
        }
    }
}

#[test]
fn every_command_keeps_one_contract_before_and_after_the_build() {
    for built in [false, true] {
        let t = tree(if built { "built" } else { "fresh" }, built);
        std::fs::write(
            t.join("fake-replay"),
            format!("#!/bin/sh\ntouch {}\n", t.join("replayed").display()),
        )
        .unwrap();
        contract(&t, built);
        let _ = std::fs::remove_dir_all(&t);
    }
}

/// What the wrappers check before the tool runs is the tool's own option list.
#[test]
fn the_wrappers_know_the_tools_options() {
    for (script, sub) in
        [("verify-run", "verify-run"), ("dmabuf-probe", "dmabuf-probe"), ("selftest", "selftest")]
    {
        let text = std::fs::read_to_string(root().join("scripts").join(script)).unwrap();
        let opts = text
            .lines()
            .find_map(|l| l.strip_prefix("opts=\""))
            .unwrap_or_else(|| panic!("{script}: no opts line"));
        let mut theirs: Vec<String> =
            opts.trim_end_matches('"').split_whitespace().map(str::to_string).collect();
        let help = tool(&[sub, "--help"]).stdout;
        let options = help.split("Options:\n").nth(1).unwrap().split("\n\n").next().unwrap();
        let mut ours: Vec<String> = options
            .lines()
            .map(|l| {
                l.trim()
                    .split_once(", ")
                    .filter(|(short, _)| short.len() == 2)
                    .map_or(l.trim(), |(_, long)| long)
            })
            .filter(|l| l.starts_with("--"))
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let flag = w.next()?;
                (flag != "--help" && flag != "--version").then(|| {
                    format!(
                        "{flag}{}",
                        if w.next().is_some_and(|v| v.starts_with('<')) { "=" } else { "" }
                    )
                })
            })
            .collect();
        theirs.sort();
        ours.sort();
        assert_eq!(theirs, ours, "scripts/{script}'s opts and gdrshim-tool {sub} --help");
    }
}

#[test]
fn the_tools_help_lists_every_command_and_runs_nothing() {
    let o = tool(&["--help"]);
    assert!(o.stdout.contains("Usage: gdrshim-tool <COMMAND>"), "{}", o.stdout);
    for sub in ["doctor", "verify-run", "dmabuf-probe", "selftest", "report", "version"] {
        assert!(
            subcommands().iter().any(|s| s == sub),
            "{sub} missing from the help: {}",
            o.stdout
        );
    }
    // help on a subcommand runs nothing: verify-run would need --nccl-log, the doctor --from
    let o = tool(&["verify-run", "--help", "--nccl-log", "/nonexistent"]);
    assert_eq!(o.rc, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("--expect-gdr") && o.stdout.contains("--exit-code <N>"),
        "{}",
        o.stdout
    );
    // issue 31: where the user looks, the doctor says a FAIL wins over could not check
    let o = tool(&["doctor", "--help"]);
    assert!(
        o.stdout.contains("A FAIL wins over could not check: on a machine without a GPU"),
        "{}",
        o.stdout
    );
    let o = tool(&["help", "doctor"]);
    assert_eq!(o.rc, 0);
    assert!(o.stdout.contains("--from <SAVED_STATE_FOLDER>"), "{}", o.stdout);
    assert_eq!(
        tool(&["-V"]).stdout,
        format!("gdrshim-tool (gdrshim) {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        tool(&["version"]).stdout,
        format!("gdrshim-tool (gdrshim) {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// Bad values are usage errors too, each one line that says what is wrong.
#[test]
fn bad_values_are_one_line_usage_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "gdrshim-tool: unexpected argument '--bogus' found (try --help)"),
        (&["no-such-command"], "gdrshim-tool: unrecognized subcommand 'no-such-command' (try --help)"),
        (&["doctor"], "gdrshim-tool doctor: the following required arguments were not provided: --from <SAVED_STATE_FOLDER> (try --help)"),
        (&["doctor", "--from"], "gdrshim-tool doctor: a value is required for '--from <SAVED_STATE_FOLDER>' but none was supplied (try --help)"),
        (&["verify-run", "--expect-gdr"], "gdrshim-tool verify-run: the following required arguments were not provided: --nccl-log <FILE> (try --help)"),
        (&["verify-run", "--nccl-log", "x", "--exit-code", "300"], "gdrshim-tool verify-run: invalid value '300' for '--exit-code <N>': 300 is not in 0..=255 (try --help)"),
        (&["verify-run", "--nccl-log", "x", "--exit-code", "-1"], "gdrshim-tool verify-run: invalid value '-1' for '--exit-code <N>': -1 is not in 0..=255 (try --help)"),
        (&["verify-run", "--nccl-log", "x", "--gpu-sm", "ada"], "gdrshim-tool verify-run: invalid value 'ada' for '--gpu-sm <N>': invalid digit found in string (try --help)"),
        (&["dmabuf-probe", "--size", "2MB"], "gdrshim-tool dmabuf-probe: invalid value '2MB' for '--size <BYTES>': MB is a power of ten in SI: write 2M or 2MiB (binary, 1K = 1024) (try --help)"),
        (&["selftest", "--size", "1000000"], "gdrshim-tool selftest: invalid value '1000000' for '--size <BYTES>': a power of two from 65536 to 1073741824 (1 GiB) (try --help)"),
        (&["version", "--bogus"], "gdrshim-tool version: unexpected argument '--bogus' found (try --help)"),
    ];
    for (args, want) in cases {
        let o = tool(args);
        assert_eq!(
            (o.rc, o.stdout.as_str(), o.stderr.as_str()),
            (2, "", format!("{want}\n").as_str()),
            "{args:?}"
        );
    }
    // run by a wrapper, the message names the script
    let o = out(Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .args(["selftest", "--size", "7"])
        .env("GDRSHIM_TOOL_AS", "selftest")
        .output()
        .unwrap());
    assert!(
        o.stderr.starts_with("selftest: invalid value '7' for '--size <BYTES>'"),
        "{}",
        o.stderr
    );
}

/// The README's table of commands (its section "Every command"): (tool command, script, keys of
/// its own JSON) per row, "" where a column is empty.
fn readme_commands() -> Vec<(String, String, String)> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table = readme
        .split("| `gdrshim-tool` | script | what | `--json`: keys of its own |\n")
        .nth(1)
        .expect("the README's table of commands");
    let cell = |c: &str| c.trim().trim_matches('`').to_string();
    table
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let c: Vec<&str> = row.split('|').collect();
            (
                cell(c[1]),
                cell(c[2]).trim_start_matches("scripts/").to_string(),
                c[c.len() - 2].trim().to_string(),
            )
        })
        .collect()
}

/// The README lists every command there is, and the keys each adds to its JSON are the ones it says.
#[test]
fn the_readmes_table_of_commands_is_true() {
    let rows = readme_commands();
    let mut tools: Vec<String> =
        rows.iter().map(|r| r.0.clone()).filter(|c| !c.is_empty()).collect();
    let mut want = subcommands();
    tools.sort();
    want.sort();
    assert_eq!(tools, want, "the README's gdrshim-tool commands and the tool's --help");
    let t = tree("readme", false);
    let mut scripts: Vec<String> =
        rows.iter().map(|r| r.1.clone()).filter(|c| !c.is_empty()).collect();
    let mut there: Vec<String> = commands(&t, false)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !std::path::Path::new(&t.join("scripts/dev").join(n)).exists())
        .collect();
    let _ = std::fs::remove_dir_all(&t);
    scripts.sort();
    there.sort();
    assert_eq!(scripts, there, "the README's scripts and scripts/");
    // the release's README names every command and script it ships
    let release = std::fs::read_to_string(root().join("docs/release-README.md")).unwrap();
    let row = |start: &str| {
        release
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start} row"))
            .to_string()
    };
    let (tool_row, scripts_row) = (row("| `bin/gdrshim-tool` |"), row("| `scripts/` |"));
    for c in &want {
        assert!(
            tool_row.contains(&format!("`{c}`")),
            "the release README's gdrshim-tool row lacks {c}: {tool_row}"
        );
    }
    for s in &there {
        assert!(
            scripts_row.contains(&format!("`{s}`")),
            "the release README's scripts row lacks {s}: {scripts_row}"
        );
    }
    // a run of each command, and the keys after the six every object has
    let rel = std::env::temp_dir().join(format!("gdrshim-contract-release-{}", std::process::id()));
    std::fs::create_dir_all(rel.join("lib")).unwrap();
    for f in ["lib/libgdrshim.so", "lib/libgdrshim-core.so"] {
        std::fs::write(rel.join(f), f).unwrap();
    }
    let rel_s = rel.to_str().unwrap().to_string();
    let runs: &[(&str, &[&str])] = &[
        ("cdi", &["--from", "tests/fixtures/state/rig-4090-ok", "--release", &rel_s]),
        ("doctor", &["--from", "tests/fixtures/state/rig-4090-ok"]),
        ("verify-run", &["--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-stock.log"]),
        ("dmabuf-probe", &["--libcuda", "/nonexistent/libcuda.so.1"]),
        ("gpu-facts", &["--libcuda", "/nonexistent/libcuda.so.1"]),
        ("report", &["--from", "tests/fixtures/state/rig-4090-ok"]),
        ("env", &[]),
        ("version", &[]),
        // no launcher: a fleet of this one task, which judges itself
        ("fleet", &["--size", "65536"]),
    ];
    for (cmd, script, keys) in &rows {
        if cmd.is_empty() {
            assert_eq!(keys, "no `--json`", "{script}: the contract test shows it refuses --json");
            continue;
        }
        if cmd == "selftest" {
            continue; // a real run's keys: tools/tests/selftest.rs, against its fake NIC
        }
        let args =
            runs.iter().find(|(c, _)| c == cmd).unwrap_or_else(|| panic!("no run of {cmd} here")).1;
        let o = out(Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
            .current_dir(root())
            .arg(cmd)
            .args(args)
            .arg("--json")
            .output()
            .unwrap());
        let j = check_shape(cmd, &o.stdout, o.rc);
        let own: Vec<&str> = j.keys()[6..].to_vec();
        let said: Vec<&str> =
            if keys == "none" { vec![] } else { keys.split('`').skip(1).step_by(2).collect() };
        assert_eq!(own, said, "{cmd}: its own keys, and the README's");
    }
    let _ = std::fs::remove_dir_all(&rel);
}
