//! The NCCL patch series in `nccl-patches/`: each is a well-formed `git format-patch` series
//! whose diffs touch exactly the files its diffstat claims, and the apply script's logic on a
//! throwaway NCCL-like tree of our own making.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn series_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("nccl-patches"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn patches(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    v.sort();
    v
}

/// Checks one patch file; returns the files it touches.
fn check_patch(path: &Path, index: usize, total: usize) -> BTreeSet<String> {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(name.starts_with(&format!("{index:04}-")), "{name}: numbered {index}");
    assert!(
        lines[0].starts_with("From ") && lines[0].ends_with(" Mon Sep 17 00:00:00 2001"),
        "{name}: mbox From line"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("From: gdrshim developers")),
        "{name}: our authorship"
    );
    let subject = lines
        .iter()
        .find(|l| l.starts_with("Subject: "))
        .unwrap_or_else(|| panic!("{name}: no Subject"));
    assert!(
        subject.starts_with(&format!("Subject: [PATCH {index}/{total}] ")),
        "{name}: {subject}"
    );
    // the diffstat between "---" and the blank line before the first diff
    let sep = lines
        .iter()
        .position(|l| *l == "---")
        .unwrap_or_else(|| panic!("{name}: no --- separator"));
    let mut claimed = BTreeSet::new();
    let mut i = sep + 1;
    while i < lines.len() && lines[i].contains('|') {
        claimed.insert(lines[i].split('|').next().unwrap().trim().to_string());
        i += 1;
    }
    assert!(lines[i].contains("changed"), "{name}: diffstat summary line, got {:?}", lines[i]);
    assert!(!claimed.is_empty(), "{name}: empty diffstat");
    // the diffs
    let mut touched = BTreeSet::new();
    let mut j = i;
    while j < lines.len() {
        let l = lines[j];
        if let Some(rest) = l.strip_prefix("diff --git a/") {
            let (a, b) = rest.split_once(" b/").unwrap_or_else(|| panic!("{name}: {l}"));
            assert_eq!(a, b, "{name}: no renames");
            touched.insert(a.to_string());
            j += 1;
            continue;
        }
        if let Some(h) = l.strip_prefix("@@ -") {
            let nums: Vec<&str> = h
                .split(" @@")
                .next()
                .unwrap()
                .split([' ', '+', ','])
                .filter(|s| !s.is_empty())
                .collect();
            let count = |k: usize| nums.get(k).map_or(1, |s| s.parse::<usize>().unwrap());
            let (old, new) = if nums.len() == 4 {
                (count(1), count(3))
            } else {
                panic!("{name}: hunk header {l}")
            };
            let (mut o, mut n) = (0, 0);
            j += 1;
            while o < old || n < new {
                let hl = lines.get(j).unwrap_or_else(|| panic!("{name}: hunk {l} cut short"));
                match hl.chars().next() {
                    Some(' ') | None => {
                        o += 1;
                        n += 1
                    }
                    Some('-') => o += 1,
                    Some('+') => n += 1,
                    Some('\\') => {}
                    _ => panic!("{name}: bad hunk line {hl:?} in {l}"),
                }
                j += 1;
            }
            assert_eq!((o, n), (old, new), "{name}: hunk {l} line counts");
            continue;
        }
        j += 1;
    }
    assert_eq!(claimed, touched, "{name}: the diffs touch exactly the files the diffstat claims");
    for f in &touched {
        assert!(f.starts_with("src/") && !f.contains(".."), "{name}: {f} is a NCCL source file");
    }
    touched
}

#[test]
fn every_series_is_well_formed_and_touches_only_what_it_claims() {
    let dirs = series_dirs();
    let names: Vec<String> =
        dirs.iter().map(|d| d.file_name().unwrap().to_string_lossy().to_string()).collect();
    for want in ["2.28.3", "2.30.7", "2.31.0a7"] {
        assert!(names.iter().any(|n| n == want), "a series for NCCL {want}: {names:?}");
    }
    for d in &dirs {
        let ps = patches(d);
        assert!(!ps.is_empty(), "{d:?}: empty series folder");
        let mut all = BTreeSet::new();
        for (k, p) in ps.iter().enumerate() {
            all.extend(check_patch(p, k + 1, ps.len()));
        }
        // the gate asks the shim by the exported names the library really has
        let text: String = ps.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect();
        for sym in ["gdrshim_gdr_active", "gdrshim_version", "gdrshim_gdr_route"] {
            assert!(text.contains(&format!("\"{sym}\"")), "{d:?} asks for {sym}");
            assert!(
                root().join("src/hooks/query.rs").exists()
                    && std::fs::read_to_string(root().join("src/hooks/query.rs"))
                        .unwrap()
                        .contains(&format!("fn {sym}()")),
                "the shim exports {sym}"
            );
        }
        assert!(
            text.contains("NCCL_GDR_FLUSH_DISABLE") && text.contains("major < 9"),
            "{d:?}: the flush refusal"
        );
        assert!(all.contains("src/plugin/net.cc"), "{d:?}: the GPU-side gate");
        // the NIC side is NCCL's own (peer memory or DMA-BUF): no patch may claim a peer-memory
        // client the kernel does not have
        assert!(
            !all.iter().any(|f| f.starts_with("src/transport/net_ib")),
            "{d:?} touches the NIC-side gate"
        );
        assert!(!text.contains("ncclIbGdrModuleLoaded = 1"), "{d:?} claims a peer-memory module");
        assert!(text.contains("route %s"), "{d:?}: the INFO line names the route");
    }
}

// ---- the apply script, on a tree of our own -------------------------------------------------

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

/// A NCCL-like tree at `version` with two source files, and a two-patch series for it made with
/// `git format-patch` in a scratch clone.
fn scratch(tag: &str, suffix: &str) -> (PathBuf, PathBuf) {
    let base = std::env::temp_dir().join(format!("gdrshim-apply-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let tree = base.join("nccl");
    write(
        &tree.join("makefiles/version.mk"),
        &format!("##### version\nNCCL_MAJOR   := 2\nNCCL_MINOR   := 99\nNCCL_PATCH   := 1\nNCCL_SUFFIX  := {suffix}\nPKG_REVISION := 1\n"),
    );
    write(&tree.join("src/gate.cc"), "int gate() {\n  int attr = 0;\n  return attr;\n}\n");
    write(&tree.join("src/ib.cc"), "int ib() {\n  return 0;\n}\n");
    git(&tree, &["init", "-q"]);
    git(&tree, &["add", "-A"]);
    git(&tree, &["commit", "-q", "-m", "upstream"]);
    let work = base.join("work");
    git(&base, &["clone", "-q", tree.to_str().unwrap(), work.to_str().unwrap()]);
    write(
        &work.join("src/gate.cc"),
        "int gate() {\n  int attr = 0;\n  if (attr == 0) attr = 1;\n  return attr;\n}\n",
    );
    git(&work, &["commit", "-q", "-am", "gate"]);
    write(&work.join("src/ib.cc"), "int ib() {\n  return 1;\n}\n");
    write(&work.join("src/new.h"), "#define SHIM 1\n");
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "ib"]);
    let patches = base.join("patches");
    let series = patches.join(format!("2.99.1{suffix}"));
    git(&work, &["format-patch", "-q", "-n", "-2", "-o", series.to_str().unwrap()]);
    (tree, patches)
}

fn apply(tree: &Path, patches: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new("bash")
        .arg(root().join("scripts/apply-nccl-patches.sh"))
        .args(extra)
        .arg("--patches")
        .arg(patches)
        .arg(tree)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

fn snapshot(tree: &Path) -> String {
    git(tree, &["status", "--porcelain", "--untracked-files=all"]) + &git(tree, &["diff"])
}

#[test]
fn apply_script_applies_once_and_is_idempotent() {
    let (tree, patches) = scratch("ok", "a3");
    let (rc, out) = apply(&tree, &patches, &["--check"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("NCCL 2.99.1a3") && out.contains("apply cleanly"), "{out}");
    assert_eq!(snapshot(&tree), "", "--check changes nothing");
    let (rc, out) = apply(&tree, &patches, &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("applied the 2 patches of"), "{out}");
    assert!(std::fs::read_to_string(tree.join("src/gate.cc")).unwrap().contains("attr = 1"));
    assert_eq!(std::fs::read_to_string(tree.join("src/new.h")).unwrap(), "#define SHIM 1\n");
    let after = snapshot(&tree);
    let (rc, out) = apply(&tree, &patches, &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("already patched"), "{out}");
    assert_eq!(snapshot(&tree), after, "a second run changes nothing");
}

#[test]
fn apply_script_refuses_and_leaves_the_tree_untouched() {
    // a local change inside a patched hunk
    let (tree, patches) = scratch("conflict", "");
    write(&tree.join("src/ib.cc"), "int ib() {\n  return 7;\n}\n");
    let before = snapshot(&tree);
    let (rc, out) = apply(&tree, &patches, &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("does not apply cleanly") && out.contains("tree left untouched"), "{out}");
    assert_eq!(
        snapshot(&tree),
        before,
        "nothing written, not even the files the first patch touches"
    );
    assert!(!tree.join("src/new.h").exists());

    // a partly patched tree (first patch only) is neither applicable nor already patched
    let (tree, patches) = scratch("partial", "");
    let first = std::fs::read_dir(patches.join("2.99.1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("0001-"))
        .unwrap();
    git(&tree, &["apply", first.to_str().unwrap()]);
    let before = snapshot(&tree);
    let (rc, out) = apply(&tree, &patches, &[]);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(snapshot(&tree), before);

    // an unknown version
    let (tree, patches) = scratch("unknown", "");
    write(
        &tree.join("makefiles/version.mk"),
        "NCCL_MAJOR   := 2\nNCCL_MINOR   := 98\nNCCL_PATCH   := 0\nNCCL_SUFFIX  :=\n",
    );
    let before = snapshot(&tree);
    let (rc, out) = apply(&tree, &patches, &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("NCCL 2.98.0 has no gdrshim patch series (there are series for 2.99.1); tree left untouched"), "{out}");
    assert_eq!(snapshot(&tree), before);

    // not a NCCL tree at all
    let (rc, out) = apply(&tree.join("src"), &patches, &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("not a NCCL source tree"), "{out}");
}

#[test]
fn apply_script_knows_the_shipped_series() {
    // an unknown version against the real folder names every series we ship
    let (tree, _) = scratch("shipped", "");
    let (rc, out) = apply(&tree, &root().join("nccl-patches"), &[]);
    assert_eq!(rc, 1);
    // (issue 31: "(series for: 2.28.3 2.30.7 2.31.0a7 )")
    assert!(
        out.contains("(there are series for 2.28.3, 2.30.7, 2.31.0a7); tree left untouched"),
        "{out}"
    );
}
