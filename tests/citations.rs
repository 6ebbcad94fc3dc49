//! Everything a user or a contributor is pointed to is in the clone (issue 40 item 5): no file
//! points into the workspace's shared folder (its facts are brought in, in our words: the
//! runbook is docs/runbook.md, the driver's interface docs/nvidia-abi.md), and every
//! `docs/…` path named anywhere exists.

use std::path::Path;
use std::process::Command;

fn tracked() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("git").args(["ls-files"]).current_dir(root).output().unwrap();
    assert!(out.status.success(), "git ls-files");
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// Each `docs/…` path in `text` (letters, digits and `_./+-`, ending in a letter or digit).
fn docs_paths(text: &str) -> Vec<&str> {
    let mut v = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/") {
        let before = rest[..at].chars().last();
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_./+-".contains(c)))
            .unwrap_or(tail.len());
        let p = tail[..len].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        // not a folder of another project's (…/docs/), nor a word that ends in docs
        if before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '/' || c == '_' || c == '-'))
            && p.len() > "docs/".len()
        {
            v.push(p);
        }
        rest = &tail[len.max(5)..];
    }
    v
}

#[test]
fn nothing_points_outside_the_clone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for f in tracked() {
        // what runs recorded (logs, captures) is kept as it was
        if f.starts_with("docs/results/") && !f.ends_with(".md") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&f)) else { continue };
        for (n, line) in text.lines().enumerate() {
            // (the patterns in pieces, so that this file does not name them)
            let shared = ["shared", "/"].concat();
            if [format!("../{shared}"), format!("{shared}docs"), format!("{shared}seeds")]
                .iter()
                .any(|p| line.contains(p.as_str()))
            {
                wrong.push(format!("{f}:{}: points into the shared folder: {line}", n + 1));
            }
            for p in docs_paths(line) {
                if !root.join(p).exists() {
                    wrong.push(format!("{f}:{}: {p} is not in the clone", n + 1));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "pointers to what a clone lacks:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_paths_in_prose() {
    assert_eq!(
        docs_paths("see `docs/nvidia-abi.md`, S10; (docs/results/h200-run7)."),
        ["docs/nvidia-abi.md", "docs/results/h200-run7"]
    );
    assert_eq!(docs_paths("kernel/Documentation/docs/x and mydocs/y"), Vec::<&str>::new());
}
