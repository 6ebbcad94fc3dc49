//! The crate's layers: a module may use only modules of lower layers (and itself). The ranks
//! below are the architecture (docs/architecture.md); this test reads every `crate::` path in
//! src/ and fails on an arrow that points up or sideways, or on a module with no rank.

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. The pure core is layers 0 to 4; the runtime (FFI) starts at `real`.
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
const PURE: &[&str] =
    &["testkit", "route", "fd", "config", "decode", "vamap", "tracker", "advertise", "fresh", "registrar", "counters", "capture", "state"];

fn rank(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// The top-level module of a file under src/ (`None`: the crate root, a binary, `preload/`, the
/// package that builds the core library from this crate and names none of its modules, or
/// `front/`, the front library, a crate of its own).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" || first == "bin" || first == "preload" || first == "front" || first == "common" {
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
    ("fdtable", &[&["forkgate"], &["own"]]),
    (
        "hooks",
        &[&["caller", "slots"], &["front", "ioctl", "fd", "query", "cuda_ctx", "cuda_gdr"], &["cuda", "verbs"], &["mlx5dv"], &["dl"]],
    ),
    ("pipeline", &[&["late"]]),
    ("real", &[&["dl"], &["next"], &["scope"]]),
    ("registrar", &[&["bar1", "miss"], &["types"], &["dmabuf", "nv503c", "outcome"]]),
    ("shim", &[&["answers", "route", "knob_stats"], &["types"], &["knobs", "registrations"], &["summary"]]),
    ("tracker", &[&["types"], &["dmabuf"]]),
    ("vamap", &[&["granule", "types"], &["entry"], &["cells"], &["gpu"], &["lookup", "owned"]]),
];

/// The arrows inside src/'s module folders that do not go down (see [`SRC_SUBLAYERS`]).
fn folder_arrows() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let rank = |folder: &str, sub: &str| SRC_SUBLAYERS.iter().find(|(f, _)| *f == folder)?.1.iter().position(|l| l.contains(&sub));
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        let [folder, file] = parts.as_slice() else { continue };
        // (model_test is a test of its own, as tests*.rs are)
        if ["front", "bin", "preload", "model_test", "common"].contains(folder) || *file == "mod.rs" || file.starts_with("tests") {
            continue;
        }
        let sub = file.trim_end_matches(".rs");
        let Some(own) = rank(folder, sub) else {
            wrong.push(format!("{}: `{folder}::{sub}` has no layer in SRC_SUBLAYERS", rel.display()));
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
        let opens_module =
            words.windows(3).any(|w| w[0] == "mod" && w[2] == "{") || words.windows(2).any(|w| w[0] == "mod" && w[1].ends_with('{'));
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
        out.extend(super_uses(&format!("super::{rest}")).into_iter().take(if rest.starts_with('{') { usize::MAX } else { 1 }));
    }
    out
}

#[test]
fn inside_a_folder_arrows_only_go_down_too() {
    let wrong = folder_arrows();
    assert!(wrong.is_empty(), "arrows that do not go down inside src/'s folders ({}):\n{}", wrong.len(), wrong.join("\n"));
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
    for m in FROM_COMMON.iter().filter(|m| PURE.contains(m)) {
        let f = src.join("common/src").join(format!("{m}.rs"));
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("#![forbid(unsafe_code)]"), "{}: a pure module without #![forbid(unsafe_code)]", f.display());
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
            let thread_mark = (rel == "pipeline.rs" && code.contains("let _inside = Guard::enter();"))
                || (rel == "hooks/ioctl.rs" && code.contains("let Some(_guard) = Guard::enter() else {"));
            if code.contains("catch_unwind") || (code.contains("Guard::enter") && !thread_mark) {
                by_hand.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(by_hand.is_empty(), "written by hand, not through sys::in_hook or sys::contained:\n{}", by_hand.join("\n"));
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

/// gdrshim-tool's layers (tools/src), lowest first: the report's form, the machine record and its
/// parsing, the route prerequisites, the checks of each command, the self-test (which runs the
/// doctor's route checks). `main.rs` sits on top.
const TOOL_LAYERS: &[&[&str]] = &[
    &["report", "usage", "config", "route"],
    &["machine"],
    &["routes", "topology"],
    &["doctor", "verify", "dmabuf", "env", "cdi"],
    &["selftest", "report_command"],
    &["fleet"],
];

/// The layers inside a module folder, lowest first; its `mod.rs` (the command) is above them all
/// and `tests.rs` is exempt. A submodule may use a lower sibling, never its parent's items.
const TOOL_SUBLAYERS: &[(&str, &[&[&str]])] = &[
    ("doctor", &[&["software", "container"], &["platform"]]),
    ("verify", &[&["exit"], &["checks"], &["cli"]]),
    ("selftest", &[&["args", "ffi", "findings", "shim"], &["cuda", "host", "layout"], &["conn"], &["qp", "route_doctor"], &["rdma"]]),
    (
        "fleet",
        &[
            &["args", "model", "launch", "schedule"],
            &["verdict", "wire"],
            &["render"],
            &["svg", "node", "link"],
            &["nccl"],
            &["round"],
            &["run"],
        ],
    ),
];

/// The first names after `super::` on a line (`super::super::x` counts as `x`; a group counts each
/// member; a glob is `*`).
fn super_uses(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("super::") {
        rest = &rest[at + "super::".len()..];
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
                if !name.is_empty() && name != "self" {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

fn sub_rank(module: &str, sub: &str) -> Option<usize> {
    TOOL_SUBLAYERS.iter().find(|(m, _)| *m == module)?.1.iter().position(|l| l.contains(&sub))
}

#[test]
fn the_tools_arrows_only_go_down_too() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let top_rank = |m: &str| TOOL_LAYERS.iter().position(|l| l.contains(&m));
    let mut wrong: Vec<String> = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        if parts == ["main.rs"] {
            continue;
        }
        let m = parts[0].trim_end_matches(".rs");
        let Some(r) = top_rank(m) else {
            wrong.push(format!("{}: module `{m}` has no layer in TOOL_LAYERS", rel.display()));
            continue;
        };
        // (module, own sub-layer) for a file inside a module folder other than mod.rs
        let sub = match parts.as_slice() {
            [_, "mod.rs"] | [_] => None,
            [_, "tests.rs"] => continue,
            [_, file] => {
                let s = file.trim_end_matches(".rs");
                match sub_rank(m, s) {
                    Some(sr) => Some((s, sr)),
                    None => {
                        wrong.push(format!("{}: `{m}::{s}` has no layer in TOOL_SUBLAYERS", rel.display()));
                        continue;
                    }
                }
            }
            _ => {
                wrong.push(format!("{}: nested deeper than one module folder", rel.display()));
                continue;
            }
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("mod tests {") {
                break; // a file's own tests sit above it
            }
            if t.starts_with("//") {
                continue;
            }
            let at = format!("{}:{}", rel.display(), n + 1);
            for u in uses(line) {
                match top_rank(&u) {
                    Some(ru) if ru < r => {}
                    _ if u == m => wrong.push(format!("{at}: `{m}` names itself through crate::; use a lower sibling")),
                    Some(ru) => wrong.push(format!("{at}: `{m}` (layer {r}) uses `{u}` (layer {ru})")),
                    None => wrong.push(format!("{at}: `{m}` uses `{u}`, which has no layer")),
                }
            }
            for u in super_uses(line) {
                match (sub, sub_rank(m, &u)) {
                    (Some((_, own)), Some(ru)) if ru < own => {}
                    (Some((s, own)), Some(ru)) => wrong.push(format!("{at}: `{m}::{s}` (layer {own}) uses `{m}::{u}` (layer {ru})")),
                    (Some((s, _)), None) => wrong.push(format!("{at}: `{m}::{s}` uses its parent's `{u}`: move it into a lower sibling")),
                    (None, _) => wrong.push(format!("{at}: `{m}` uses `super::{u}` above it")),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that do not go down in tools/src:\n{}", wrong.join("\n"));
}

#[test]
fn the_tools_checker_sees_the_old_circles() {
    // issue 31's two circles, as their lines read: each is refused
    assert_eq!(super_uses("use super::rdma::{compare, fill, wait_completions, HostBuf, Region, Regions};"), ["rdma"]);
    assert_eq!(sub_rank("selftest", "qp").unwrap(), sub_rank("selftest", "route_doctor").unwrap());
    assert!(sub_rank("selftest", "rdma").unwrap() > sub_rank("selftest", "qp").unwrap(), "qp may not use rdma");
    assert_eq!(super_uses("use super::{errno, errno_text, Args};"), ["errno", "errno_text", "Args"]);
    assert_eq!(super_uses("let rust = super::super::ffi::layout_lines();"), ["ffi"]);
    assert_eq!(super_uses("use super::*;"), ["*"]);
    assert_eq!(uses("use crate::doctor::{Gpu, State};"), ["doctor"]);
    let rank = |m: &str| TOOL_LAYERS.iter().position(|l| l.contains(&m)).unwrap();
    assert!(rank("routes") < rank("doctor"), "routes.rs taking Gpu/State from doctor is an arrow up");
}
