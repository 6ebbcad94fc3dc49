//! gdrshim's exported CUDA entry points, for programs linked against them.

use std::path::Path;
use std::process::Command;

mod common;

/// A program that calls gdrshim's exported cuMemAlloc_v2 while libcuda is loaded RTLD_LOCAL
/// reaches libcuda's own definition (found by name; RTLD_NEXT cannot see it).
#[test]
fn exported_cuda_entry_points_reach_a_locally_loaded_libcuda() {
    let e = common::build("exports");
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    common::fakes::Fakes::in_dir(&e.dir).fakecuda();
    common::cc(
        &e,
        &["-O1", "-o", "cuda_export", c.join("cuda_export.c").to_str().unwrap(), "-ldl"],
    );
    let bin = e.dir.join("cuda_export");
    let out = Command::new(&bin)
        .arg(e.dir.join("libcuda.so.1"))
        .env("LD_PRELOAD", &e.shim)
        .env("GDRSHIM_SUMMARY", "0")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rc=0 ptr=0x1234000\n");
    let without = Command::new(&bin).arg(e.dir.join("libcuda.so.1")).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&without.stdout),
        "rc=-1 ptr=0\n",
        "without the shim nothing exports cuMemAlloc_v2 globally"
    );
}

/// The library as it ships has none of the tests' and benchmarks' knobs: no `gdrshim_bench_pause`,
/// and their variables change nothing but a warning (a test build reads them).
#[test]
fn the_shipped_library_has_no_knobs() {
    let lib = common::shipped();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils)");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(syms.contains(" gdrshim_counters") && syms.contains(" ioctl"), "{syms}");
    assert!(!syms.contains("gdrshim_bench_pause"), "a release build exports the benchmark pause");
    assert!(!syms.contains("gdrshim_test_touches"), "a release build exports the touch count");
    let knobs = common::build("exports-knobs");
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&knobs.shim).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("gdrshim_bench_pause"),
        "the knobs build has it"
    );
}

/// What the loader does for libgdrshim.so in every process of a job, GPU or not (issue 16's
/// start-up cost): no library beyond libc's, few relocations to write (whole-program LTO keeps calls
/// and data out of the GOT: 1 364 relative relocations without it, about 580 with it), and no
/// `.bss` that needs a mapping of its own (the fd table is mapped when first used).
#[test]
fn the_shipped_library_is_cheap_to_load() {
    let lib = common::shipped();
    let readelf = |flags: &str| {
        let out =
            Command::new("readelf").arg(flags).arg(&lib).output().expect("readelf (binutils)");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dynamic = readelf("-dW");
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(
        needed.iter().all(|l| l.contains("[libc.so.6]") || l.contains("[ld-linux-x86-64.so.2]")),
        "libraries beyond libc's: {needed:?}"
    );
    let relative = readelf("-rW").lines().filter(|l| l.contains("R_X86_64_RELATIVE")).count();
    assert!(relative < 800, "{relative} relative relocations: is libgdrshim.so built without LTO?");
    // the last writable LOAD segment: its zero-filled tail must end inside its last file page
    let loads: Vec<Vec<u64>> = readelf("-lW")
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD") && l.contains("RW"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(5)
                .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap())
                .collect()
        })
        .collect();
    // each writable segment starts on a page of its own (src/preload/build.rs): the pages the
    // loader's relocations dirty are as few as their bytes allow
    for l in &loads {
        assert_eq!(
            l[1] % 4096,
            0,
            "a writable segment at {:#x}, inside a page: -z separate-loadable-segments?",
            l[1]
        );
    }
    let last = loads.last().expect("a writable LOAD segment");
    let (vaddr, filesz, memsz) = (last[1], last[3], last[4]);
    let file_page_end = (vaddr + filesz).div_ceil(4096) * 4096;
    assert!(
        vaddr + memsz <= file_page_end,
        "a .bss of {} bytes past the file's last page needs a mapping of its own",
        vaddr + memsz - file_page_end
    );
}

/// The replay tool behaves like a command: help (with its exit codes) and version on stdout with
/// 0, an unknown option or no capture on stderr with 2.
#[test]
fn the_replay_tool_answers_help_version_and_unknown_options() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gdrshim-replay"));
    let run = |a: &[&str]| Command::new(bin).args(a).output().unwrap();
    for h in [run(&["--help"]), run(&["-h"])] {
        assert_eq!(h.status.code(), Some(0));
        let out = String::from_utf8_lossy(&h.stdout);
        assert!(
            out.contains("Usage: gdrshim-replay")
                && out.contains("Exit codes:")
                && out.contains("not a capture"),
            "{out}"
        );
    }
    let v = run(&["--version"]);
    assert_eq!(
        (v.status.code(), String::from_utf8_lossy(&v.stdout).trim().to_string()),
        (Some(0), format!("gdrshim-replay (gdrshim) {}", env!("CARGO_PKG_VERSION")))
    );
    let u = run(&["--frobnicate", "x.cap"]);
    assert_eq!(u.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&u.stderr).contains("unexpected argument '--frobnicate'"),
        "{}",
        String::from_utf8_lossy(&u.stderr)
    );
    assert!(u.stdout.is_empty());
    let none = run(&["--quiet"]);
    assert_eq!(none.status.code(), Some(2), "no capture named");
    assert!(String::from_utf8_lossy(&none.stderr).contains("<CAPTURE>"));
}

/// The names src/hooks exports (`#[no_mangle]` functions, written out or made by a macro whose
/// body has one), read from the source, so a new hook is covered without editing this test.
fn hook_names() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/hooks");
    let ident = |s: &str| {
        s.trim()
            .trim_start_matches("super::")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // written out: `fn NAME(` within the two lines after `no_mangle`
        for (i, _) in lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.contains("no_mangle)") || l.trim() == "#[no_mangle]")
        {
            for next in &lines[i + 1..(i + 3).min(lines.len())] {
                if let Some(rest) = next.split_once(" fn ").map(|(_, r)| r) {
                    let n = ident(rest);
                    if !n.is_empty() {
                        names.push(n);
                    }
                    break;
                }
            }
        }
        // made by a macro: the argument in the place of the metavariable its `fn $x(` uses
        for (start, _) in text.match_indices("macro_rules! ") {
            let name = ident(&text[start + 13..]);
            let body_end = text[start..].find("\n}\n").map_or(text.len(), |e| start + e);
            let body = &text[start..body_end];
            // (a macro whose export is a `with_caller!` stub names it there)
            let var = match body.split_once("with_caller!($") {
                Some((_, r)) => ident(r),
                None if body.contains("no_mangle") => match body.split_once("fn $") {
                    Some((_, r)) => ident(r),
                    None => continue,
                },
                None => continue,
            };
            let matcher = &body[body.find('(').unwrap() + 1..];
            let Some(pos) = matcher.split(',').position(|a| a.trim() == format!("${var}:ident"))
            else {
                continue;
            };
            for (at, _) in text.match_indices(&format!("\n{name}!(")) {
                let args = &text[at + name.len() + 3..];
                names.push(ident(args.split(',').nth(pos).unwrap()));
            }
        }
    }
    // the stubs of the hooks that need their caller (`with_caller!(NAME, …)`, hooks/caller.rs),
    // and the `dlsym`/`dlvsym` stubs gdrshim-common writes out for the core and the front
    for e in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for (at, _) in text.match_indices("\nwith_caller!(") {
            names.push(ident(&text[at + "\nwith_caller!(".len()..]));
        }
        if text.contains("gdrshim_common::dl_stubs!(") {
            names.extend(["dlsym".to_string(), "dlvsym".to_string()]);
        }
    }
    names.sort();
    names.dedup();
    names
}

/// `nm -D --defined-only FILE`: the names of its defined dynamic symbols.
fn dynamic_exports(file: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(file)
        .output()
        .expect("nm (binutils)");
    assert!(
        out.status.success(),
        "nm {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|s| s.split('@').next().unwrap().to_string())
        .collect()
}

/// Only libgdrshim.so carries the hooks in its dynamic symbol table. The programs link the rlib,
/// and GNU ld would export their definitions of `open`, `ioctl`, `dlsym`… (names libc defines
/// too); build.rs makes every symbol of the programs local. The library still exports each hook.
#[test]
fn only_the_library_exports_the_hooks() {
    let hooks = hook_names();
    for must in [
        "dlsym",
        "dlvsym",
        "ioctl",
        "open",
        "openat64",
        "close",
        "ibv_reg_mr",
        "ibv_reg_dmabuf_mr",
        "cuMemAlloc_v2",
        "cuGetProcAddress_v2",
        "gdrshim_version",
    ] {
        assert!(
            hooks.iter().any(|h| h == must),
            "the hook list read from src/hooks lacks {must}: {hooks:?}"
        );
    }
    assert!(hooks.len() >= 40, "{hooks:?}");
    let lib = common::shipped();
    let lib_syms = dynamic_exports(&lib);
    // the benchmark pause and the touch count are knobs-build hooks
    // (the_shipped_library_has_no_knobs)
    for h in hooks
        .iter()
        .filter(|h| !["gdrshim_bench_pause", "gdrshim_test_touches"].contains(&h.as_str()))
    {
        assert!(lib_syms.contains(h), "libgdrshim.so does not export {h}");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::sh(
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--locked",
                "-p",
                "gdrshim-tools",
                "--bin",
                "gdrshim-tool",
            ])
            .current_dir(root),
    );
    for bin in [
        Path::new(env!("CARGO_BIN_EXE_gdrshim-replay")).to_path_buf(),
        root.join("target/release/gdrshim-tool"),
    ] {
        let syms = dynamic_exports(&bin);
        let leaked: Vec<&String> = hooks.iter().filter(|h| syms.contains(h)).collect();
        assert!(leaked.is_empty(), "{} exports the shim's hooks {leaked:?}", bin.display());
    }
}
