//! gdrshim-tool's layers (tools/src): a module may use only modules of lower layers, and inside a
//! module folder a file only lower siblings, never its parent's items.

use std::path::Path;

mod common;
use common::source::{rust_files, super_uses, uses};

/// gdrshim-tool's layers (tools/src), lowest first: how JSON is written and sizes are read, the
/// report's form, the machine record and its parsing, the route prerequisites, the checks of each
/// command, the self-test (which runs the doctor's route checks). `main.rs` sits on top.
const TOOL_LAYERS: &[&[&str]] = &[
    &["json", "size"],
    &["report", "usage", "config", "ncclconf"],
    &["machine"],
    &["routes", "topology", "gpu_facts"],
    &["doctor", "verify", "dmabuf", "env", "cdi"],
    &["selftest", "report_command"],
    &["fleet"],
];

/// The layers inside a module folder, lowest first; its `mod.rs` (the command) is above them all
/// and `tests.rs` is exempt. A submodule may use a lower sibling, never its parent's items.
const TOOL_SUBLAYERS: &[(&str, &[&[&str]])] = &[
    ("doctor", &[&["software", "container", "nccl"], &["platform"]]),
    ("verify", &[&["exit"], &["checks"], &["cli"]]),
    (
        "selftest",
        &[
            &["args", "ffi", "findings", "shim"],
            &["cuda", "host", "layout"],
            &["conn"],
            &["qp", "route_doctor"],
            &["rdma"],
        ],
    ),
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
                        wrong.push(format!(
                            "{}: `{m}::{s}` has no layer in TOOL_SUBLAYERS",
                            rel.display()
                        ));
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
                    _ if u == m => wrong.push(format!(
                        "{at}: `{m}` names itself through crate::; use a lower sibling"
                    )),
                    Some(ru) => {
                        wrong.push(format!("{at}: `{m}` (layer {r}) uses `{u}` (layer {ru})"))
                    }
                    None => wrong.push(format!("{at}: `{m}` uses `{u}`, which has no layer")),
                }
            }
            for u in super_uses(line) {
                match (sub, sub_rank(m, &u)) {
                    (Some((_, own)), Some(ru)) if ru < own => {}
                    (Some((s, own)), Some(ru)) => wrong.push(format!(
                        "{at}: `{m}::{s}` (layer {own}) uses `{m}::{u}` (layer {ru})"
                    )),
                    (Some((s, _)), None) => wrong.push(format!(
                        "{at}: `{m}::{s}` uses its parent's `{u}`: move it into a lower sibling"
                    )),
                    (None, _) => wrong.push(format!("{at}: `{m}` uses `super::{u}` above it")),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that do not go down in tools/src:\n{}", wrong.join("\n"));
}

#[test]
fn the_tools_checker_sees_the_old_circles() {
    // two circles tools/src once had, as their lines read: each is refused
    assert_eq!(
        super_uses("use super::rdma::{compare, fill, wait_completions, HostBuf, Region, Regions};"),
        ["rdma"]
    );
    assert_eq!(sub_rank("selftest", "qp").unwrap(), sub_rank("selftest", "route_doctor").unwrap());
    assert!(
        sub_rank("selftest", "rdma").unwrap() > sub_rank("selftest", "qp").unwrap(),
        "qp may not use rdma"
    );
    assert_eq!(
        super_uses("use super::{errno, errno_text, Args};"),
        ["errno", "errno_text", "Args"]
    );
    assert_eq!(super_uses("let rust = super::super::ffi::layout_lines();"), ["ffi"]);
    assert_eq!(super_uses("use super::*;"), ["*"]);
    assert_eq!(uses("use crate::doctor::{Gpu, State};"), ["doctor"]);
    let rank = |m: &str| TOOL_LAYERS.iter().position(|l| l.contains(&m)).unwrap();
    assert!(
        rank("routes") < rank("doctor"),
        "routes.rs taking Gpu/State from doctor is an arrow up"
    );
}
