//! The crate's layers: a module may use only modules of lower layers (and itself). The ranks
//! below are the architecture (docs/architecture.md); this test reads every `crate::` path in
//! src/ and fails on an arrow that points up or sideways, or on a module with no rank.

use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::source::{rust_files, super_uses, uses};

/// Lowest first. The pure core is the modules in PURE; the runtime (FFI) starts at `real`.
const LAYERS: &[&[&str]] = &[
    &["abi", "sys", "route", "fd", "testkit"],
    &["config", "decode", "vamap"],
    &["tracker", "advertise", "fresh"],
    &["registrar"],
    &["counters"],
    &["capture"],
    &["state"],
    &["model_test"],
    &["real"],
    &["fdtable"],
    &["files"],
    &["log"],
    &["activation"],
    &["rm"],
    &["pipeline"],
    &["shim"],
    &["hooks"],
];

/// Modules of the crate that are gdrshim-common's (src/common, which the front and the tools build
/// on too), re-exported at the crate's root: they have no file in src/ of their own.
const FROM_COMMON: &[&str] = &["config", "route"];

/// Modules that must stay free of `unsafe` (`#![forbid(unsafe_code)]` at their root).
const PURE: &[&str] = &[
    "testkit",
    "route",
    "fd",
    "config",
    "decode",
    "vamap",
    "tracker",
    "advertise",
    "fresh",
    "registrar",
    "counters",
    "capture",
    "state",
];

fn rank(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// The top-level module of a file under src/ (`None`: the crate root, a binary, `preload/`, the
/// package that builds the core library from this crate and names none of its modules, or
/// `front/`, the front library, a crate of its own).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs"
        || first == "bin"
        || first == "preload"
        || first == "front"
        || first == "common"
    {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
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
                    Some(ru) => wrong.push(format!(
                        "{}:{}: `{m}` (layer {r}) uses `{u}` (layer {ru})",
                        rel.display(),
                        n + 1
                    )),
                    None => wrong.push(format!(
                        "{}:{}: `{m}` uses `{u}`, which has no layer",
                        rel.display(),
                        n + 1
                    )),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that do not go down:\n{}", wrong.join("\n"));
    for l in LAYERS.iter().flat_map(|l| l.iter()).filter(|l| !FROM_COMMON.contains(l)) {
        assert!(seen.contains_key(*l), "layer module `{l}` has no file in src/");
    }
}

/// The layers inside each module folder of src/, lowest first: a file may use a lower sibling
/// (through `super::`), never its folder's `mod.rs` (the folder's face: its top object and
/// re-exports, above them all) nor a sibling at or above its own layer, and never its own folder
/// through `crate::`. Test files (`tests*.rs`) and a file's own tests are exempt.
const SRC_SUBLAYERS: &[(&str, &[&[&str]])] = &[
    ("abi", &[&["pod", "status", "verbs", "mlx5dv"], &["structs", "cuda", "dmabuf"]]),
    ("decode", &[&["types"], &["display", "uvm_calls"]]),
    ("fdtable", &[&["spin"], &["closegate", "forkgate"], &["own"]]),
    (
        "hooks",
        &[
            &["caller", "slots", "within"],
            &["front", "ioctl", "fd", "query", "cuda_ctx", "cuda_gdr", "decision"],
            &["cuda", "verbs"],
            &["mlx5dv"],
            &["dl"],
        ],
    ),
    ("pipeline", &[&["late"]]),
    ("real", &[&["dl"], &["next"], &["scope"]]),
    ("registrar", &[&["bar1", "miss"], &["types"], &["dmabuf", "nv503c", "outcome"]]),
    (
        "shim",
        &[
            &["answers", "route", "knob_stats"],
            &["types"],
            &["knobs", "registrations"],
            &["summary"],
        ],
    ),
    ("tracker", &[&["types", "contexts"], &["dmabuf"]]),
    (
        "vamap",
        &[
            &["touch"],
            &["granule", "types", "contexts"],
            &["mems"],
            &["entry"],
            &["cells"],
            &["gpu"],
            &["lookup", "owned"],
        ],
    ),
];

/// The arrows inside src/'s module folders that do not go down (see [`SRC_SUBLAYERS`]).
fn folder_arrows() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let rank = |folder: &str, sub: &str| {
        SRC_SUBLAYERS.iter().find(|(f, _)| *f == folder)?.1.iter().position(|l| l.contains(&sub))
    };
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        let [folder, file] = parts.as_slice() else { continue };
        // (model_test is a test of its own, as tests*.rs are)
        if ["front", "bin", "preload", "model_test", "common"].contains(folder)
            || *file == "mod.rs"
            || file.starts_with("tests")
        {
            continue;
        }
        let sub = file.trim_end_matches(".rs");
        let Some(own) = rank(folder, sub) else {
            wrong.push(format!(
                "{}: `{folder}::{sub}` has no layer in SRC_SUBLAYERS",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let mut nesting = Nesting::default();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("mod tests {") || t.starts_with("pub(crate) mod tests {") {
                break;
            }
            let inline = nesting.inline_modules();
            nesting.read(line);
            if t.starts_with("//") {
                continue;
            }
            let at = format!("{}:{}", rel.display(), n + 1);
            if uses(line).iter().any(|u| u == folder) {
                wrong.push(format!("{at}: `{folder}::{sub}` names its own folder through crate::; use a lower sibling"));
            }
            // (`super::` inside an inline `mod x { }` of the file names the file's own items)
            for u in folder_super_uses(line, inline.max(nesting.inline_modules())) {
                match rank(folder, &u) {
                    Some(ru) if ru < own => {}
                    Some(ru) => wrong.push(format!("{at}: `{folder}::{sub}` (layer {own}) uses `{folder}::{u}` (layer {ru})")),
                    None => wrong.push(format!("{at}: `{folder}::{sub}` uses its folder's `{u}`: move it into a lower sibling")),
                }
            }
        }
    }
    wrong
}

/// Inline modules (`mod x {` … `}`) open at a point of a file, from its braces outside strings,
/// chars and comments.
#[derive(Default)]
struct Nesting {
    depth: i32,
    modules: Vec<i32>,
}

impl Nesting {
    fn inline_modules(&self) -> usize {
        self.modules.len()
    }

    fn read(&mut self, line: &str) {
        let code = line.split("//").next().unwrap_or("");
        let words: Vec<&str> = code.split_whitespace().collect();
        let opens_module = words.windows(3).any(|w| w[0] == "mod" && w[2] == "{")
            || words.windows(2).any(|w| w[0] == "mod" && w[1].ends_with('{'));
        let (mut in_str, mut escaped, mut prev) = (false, false, ' ');
        for c in code.chars() {
            if in_str {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => in_str = false,
                    _ => escaped = false,
                }
                continue;
            }
            match c {
                '"' if prev != '\'' => in_str = true,
                '{' if prev != '\'' => {
                    if opens_module && self.modules.last() != Some(&self.depth) {
                        self.modules.push(self.depth);
                    }
                    self.depth += 1;
                }
                '}' if prev != '\'' => {
                    self.depth -= 1;
                    if self.modules.last() == Some(&self.depth) {
                        self.modules.pop();
                    }
                }
                _ => {}
            }
            prev = c;
        }
    }
}

/// The names a line takes from its folder through `super::`, inside `inline` inline modules of
/// its file: a path with no more `super::`s than that stays in the file.
fn folder_super_uses(line: &str, inline: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("super::") {
        let mut k = 0;
        rest = &rest[at..];
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            k += 1;
        }
        if k <= inline {
            continue;
        }
        out.extend(
            super_uses(&format!("super::{rest}")).into_iter().take(if rest.starts_with('{') {
                usize::MAX
            } else {
                1
            }),
        );
    }
    out
}

#[test]
fn inside_a_folder_arrows_only_go_down_too() {
    let wrong = folder_arrows();
    assert!(
        wrong.is_empty(),
        "arrows that do not go down inside src/'s folders ({}):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
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
            assert!(
                text.contains("#![forbid(unsafe_code)]"),
                "{}: a pure module without #![forbid(unsafe_code)]",
                rel.display()
            );
        }
    }
    for m in FROM_COMMON.iter().filter(|m| PURE.contains(m)) {
        let f = src.join("common/src").join(format!("{m}.rs"));
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            text.contains("#![forbid(unsafe_code)]"),
            "{}: a pure module without #![forbid(unsafe_code)]",
            f.display()
        );
    }
}

/// A hook's own work runs in one wrapper (src/sys.rs: `in_hook`, `contained`): the re-entry
/// mark, errno kept and a panic contained come together, so a new hook cannot forget one. Two
/// take the mark themselves and run their work in `contained`: the `ioctl` hook, across the real
/// call (on its hot path, one mark for the work before and after), and the helper thread, once
/// for its whole life.
#[test]
fn hooks_run_their_work_in_one_wrapper() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut by_hand = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        // the front and the shared crate are no_std, built with panic=abort
        if rel == "sys.rs" || rel.starts_with("front/") || rel.starts_with("common/") {
            continue;
        }
        for (i, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let thread_mark = (rel == "pipeline.rs"
                && code.contains("let _inside = Guard::enter();"))
                || (rel == "hooks/ioctl.rs"
                    && code.contains("let Some(_guard) = Guard::enter() else {"));
            if code.contains("catch_unwind") || (code.contains("Guard::enter") && !thread_mark) {
                by_hand.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        by_hand.is_empty(),
        "written by hand, not through sys::in_hook or sys::contained:\n{}",
        by_hand.join("\n")
    );
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "tools/src", "tools/tests", "tests", "benches"] {
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
