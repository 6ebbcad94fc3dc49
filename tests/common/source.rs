//! Reading Rust source for the layering tests (tests/layers.rs, tests/layers_tools.rs).

use std::path::{Path, PathBuf};

/// Every module named after `crate::` on a code line (a `use crate::{a, b::c}` group counts
/// each of its members; `crate::log_warn!` and friends are the `log` module's macros).
pub fn uses(line: &str) -> Vec<String> {
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
                let name: String =
                    item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
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

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The first names after `super::` on a line (`super::super::x` counts as `x`; a group counts each
/// member; a glob is `*`).
pub fn super_uses(line: &str) -> Vec<String> {
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
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*')
                    .collect();
                if !name.is_empty() && name != "self" {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String =
            rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}
