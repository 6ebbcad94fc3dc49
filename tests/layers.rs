//! The crate's layers: a module may use only modules of lower layers (and itself). The ranks
//! below are the architecture (docs/architecture.md); this test reads every `crate::` path in
//! src/ and fails on an arrow that points up or sideways, or on a module with no rank.

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. The pure core is layers 0 to 4; the runtime (FFI) starts at `real`.
const LAYERS: &[&[&str]] = &[
    &["abi", "sys", "route", "testkit"],
    &["config", "decode", "vamap"],
    &["tracker", "advertise", "born"],
    &["registrar"],
    &["counters"],
    &["capture", "model_test"],
    &["real"],
    &["files", "fdtable"],
    &["log"],
    &["gate"],
    &["rm"],
    &["pipeline"],
    &["shim"],
    &["hooks"],
];

/// Modules that must stay free of `unsafe` (`#![forbid(unsafe_code)]` at their root).
const PURE: &[&str] =
    &["testkit", "route", "config", "decode", "vamap", "tracker", "advertise", "born", "registrar", "counters", "capture"];

fn rank(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// The top-level module of a file under src/ (`None`: the crate root, a binary, `preload/`, the
/// package that builds the core library from this crate and names none of its modules, or
/// `front/`, the front library, a crate of its own).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" || first == "bin" || first == "preload" || first == "front" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// Every module named after `crate::` on a code line (a `use crate::{a, b::c}` group counts
/// each of its members; `crate::log_warn!` and friends are the `log` module's macros).
fn uses(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = &rest[..at];
        rest = &rest[at + "crate::".len()..];
        if before.ends_with('$') {
            continue; // $crate:: inside a macro definition
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != "self" {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.starts_with("log_") && rest[name.len()..].starts_with('!') {
            out.push("log".into());
        } else if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn arrows_only_go_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong: Vec<String> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let Some(m) = module_of(rel) else { continue };
        let Some(r) = rank(&m) else {
            wrong.push(format!("{}: module `{m}` has no layer in tests/layers.rs", rel.display()));
            continue;
        };
        *seen.entry(m.clone()).or_default() += 1;
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for u in uses(line) {
                if u == m {
                    continue;
                }
                match rank(&u) {
                    Some(ru) if ru < r => {}
                    Some(ru) => wrong.push(format!("{}:{}: `{m}` (layer {r}) uses `{u}` (layer {ru})", rel.display(), n + 1)),
                    None => wrong.push(format!("{}:{}: `{m}` uses `{u}`, which has no layer", rel.display(), n + 1)),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that do not go down:\n{}", wrong.join("\n"));
    for l in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(seen.contains_key(*l), "layer module `{l}` has no file in src/");
    }
}

#[test]
fn the_pure_core_forbids_unsafe_code() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let Some(m) = module_of(rel) else { continue };
        // the attribute at a module's root covers its submodules
        let root = rel.components().count() == 1 || rel.file_name().is_some_and(|n| n == "mod.rs");
        if root && PURE.contains(&m.as_str()) {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(text.contains("#![forbid(unsafe_code)]"), "{}: a pure module without #![forbid(unsafe_code)]", rel.display());
        }
    }
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "tools/src", "tests", "benches"] {
        if root.join(d).is_dir() {
            rust_files(&root.join(d), &mut files);
        }
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 600).then(|| format!("{}: {n} lines", f.strip_prefix(root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 600 lines:\n{}", long.join("\n"));
}

#[test]
fn the_checker_sees_what_it_should() {
    assert_eq!(uses("use crate::{abi, decode::Event, log};"), ["abi", "decode", "log"]);
    assert_eq!(uses("    crate::log_warn!(\"x {}\", crate::shim::get());"), ["log", "shim"]);
    assert_eq!(uses("macro_rules! m { () => { $crate::log::emit() } }"), Vec::<String>::new());
    assert_eq!(module_of(Path::new("hooks/fd.rs")).as_deref(), Some("hooks"));
    assert_eq!(module_of(Path::new("lib.rs")), None);
}
