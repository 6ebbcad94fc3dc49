//! The deployment gate (scripts/deploy.sh) on release folders and prefixes of our own making:
//! install, switch and roll back; refuse a bad release or ambiguous arguments and change nothing;
//! list, prune and uninstall only what it installed, and leave the .deb's releases to dpkg; write
//! NCCL_NET_FORCE_FLUSH=1 into nccl.conf only where a GPU needs it, and remove only that line.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

mod common;
use common::scripts::{dist, link, manifest, release_named, scratch, sh, snapshot, write_exe};

#[test]
fn deploy_installs_switches_and_rolls_back() {
    let s = scratch("ok");
    let prefix = s.join("opt/rtx4090-gdr");
    let p = prefix.to_str().unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, dist(&s, "1.0.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    let first = link(&prefix.join("current"));
    assert!(first.starts_with("releases/1.0.0-"), "{first}");
    assert_eq!(
        std::fs::read_to_string(prefix.join("current/lib/libgdrshim.so")).unwrap(),
        "shim 1.0.0\n"
    );
    assert!(!prefix.join("previous").exists());
    let old_lib = prefix.join(&first).join("lib/libgdrshim.so");
    let old_inode = std::fs::metadata(&old_lib).unwrap().ino();

    let (rc, out) = sh("deploy.sh", &["--prefix", p, dist(&s, "1.1.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    let second = link(&prefix.join("current"));
    assert!(second.starts_with("releases/1.1.0-"));
    assert_eq!(link(&prefix.join("previous")), first);
    // a process that mapped the old library keeps exactly that file
    assert_eq!(std::fs::metadata(&old_lib).unwrap().ino(), old_inode);
    assert_eq!(std::fs::read_to_string(&old_lib).unwrap(), "shim 1.0.0\n");

    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--rollback"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        (link(&prefix.join("current")), link(&prefix.join("previous"))),
        (first.clone(), second.clone())
    );
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--status"], &[]);
    assert_eq!(rc, 0);
    assert!(
        out.contains(&format!("current: {first}")) && out.contains(&format!("previous: {second}")),
        "{out}"
    );
    // installing what is already there switches without copying
    let (rc, out) = sh("deploy.sh", &["--prefix", p, dist(&s, "1.1.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("already installed"), "{out}");
    assert_eq!(link(&prefix.join("current")), second);
}

#[test]
fn deploy_refuses_a_bad_release_and_leaves_the_prefix_as_it_was() {
    let s = scratch("bad");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    // a prefix that does not exist yet is not created by a refused install
    let flipped = dist(&s, "2.0.0");
    let lib = flipped.join("lib/libgdrshim.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&lib, bytes).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, flipped.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("does not match its SHA256SUMS") && out.contains("lib/libgdrshim.so: FAILED"),
        "{out}"
    );
    assert!(!prefix.exists(), "nothing created");

    // with a release installed, every kind of bad release leaves it byte for byte
    assert_eq!(sh("deploy.sh", &["--prefix", p, dist(&s, "1.0.0").to_str().unwrap()], &[]).0, 0);
    let before = snapshot(&prefix);
    let (rc, out) = sh("deploy.sh", &["--prefix", p, flipped.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(snapshot(&prefix), before);

    let missing = dist(&s, "2.0.1");
    std::fs::remove_file(missing.join("include/gdrshim.h")).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, missing.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("include/gdrshim.h"), "{out}");
    assert_eq!(snapshot(&prefix), before);

    let extra = dist(&s, "2.0.2");
    std::fs::write(extra.join("lib/libevil.so"), b"x").unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, extra.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("extra: lib/libevil.so"), "{out}");
    assert_eq!(snapshot(&prefix), before);

    let no_manifest = dist(&s, "2.0.3");
    std::fs::remove_file(no_manifest.join("SHA256SUMS")).unwrap();
    assert_eq!(sh("deploy.sh", &["--prefix", p, no_manifest.to_str().unwrap()], &[]).0, 1);
    assert_eq!(snapshot(&prefix), before);

    let (rc, out) =
        sh("deploy.sh", &["--prefix", "/usr", dist(&s, "3.0.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 1);
    assert!(out.contains("system folder"), "{out}");
    // rollback with nothing to roll back to
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--rollback"], &[]);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(snapshot(&prefix), before);
}

#[test]
fn deploy_refuses_ambiguous_arguments_with_exit_2_and_changes_nothing() {
    let s = scratch("ambiguous");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    let (a, b) = (dist(&s, "1.0.0"), dist(&s, "1.1.0"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    // two release folders: not "the last one wins"; nothing installed, the prefix not even made
    let (rc, out) = sh("deploy.sh", &["--prefix", p, a, b], &[]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("two release folders"), "{out}");
    assert!(!prefix.exists());
    assert_eq!(sh("deploy.sh", &["--prefix", p, a], &[]).0, 0);
    assert_eq!(sh("deploy.sh", &["--prefix", p, b], &[]).0, 0);
    let before = snapshot(&prefix);
    for args in [
        vec!["--status", "--rollback"],
        vec!["--rollback", "--status"],
        vec!["--list", "--prune"],
        vec!["--prune", "--uninstall"],
        vec!["--uninstall", a],
        vec![a, "--rollback"],
        vec!["--", a, b],
        vec!["--frobnicate"],
        vec![],
    ] {
        let (rc, out) = sh("deploy.sh", &[&["--prefix", p][..], &args].concat(), &[]);
        assert_eq!(rc, 2, "{args:?}: {out}");
        assert!(out.contains("deploy: "), "{args:?}: a message: {out}");
        assert_eq!(snapshot(&prefix), before, "{args:?} changed the prefix");
    }
    let (rc, out) = sh("deploy.sh", &["--status", "--rollback"], &[]);
    assert!(rc == 2 && out.contains("ambiguous"), "{out}");
    for args in [vec!["--prefix"], vec!["--status", "--prefix"], vec!["--prefix="]] {
        let (rc, out) = sh("deploy.sh", &args, &[]);
        assert_eq!(rc, 2, "{args:?}: {out}");
        assert!(out.contains("--prefix needs a folder"), "{args:?}: {out}");
        assert!(
            !out.contains("parameter null") && !out.contains("unbound variable"),
            "no bash error: {out}"
        );
    }
}

#[test]
fn deploy_lists_prunes_and_uninstalls_only_what_it_installed() {
    let s = scratch("prune");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    let rel = prefix.join("releases");
    let [r10, r11, r12, r13, r14] = five_releases(&s, &prefix);
    // things deploy.sh did not install: a folder of the user's, a release copied under another
    // name, a release of ours that someone added a file to, a file, a file beside releases/
    std::fs::create_dir_all(rel.join("mine")).unwrap();
    std::fs::write(rel.join("mine/notes.txt"), "keep\n").unwrap();
    assert!(Command::new("cp")
        .arg("-a")
        .arg(rel.join(&r10))
        .arg(rel.join("1.0.0-000000000000"))
        .status()
        .unwrap()
        .success());
    std::fs::write(rel.join(&r11).join("lib/extra.so"), "user's\n").unwrap();
    std::fs::write(rel.join("README"), "ours\n").unwrap();
    std::fs::write(prefix.join("site.conf"), "x=1\n").unwrap();
    let foreign = ["mine", "1.0.0-000000000000", r11.as_str(), "README"];
    let foreign_before = foreign_now(&rel, &foreign);

    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--list"], &[]);
    assert_eq!(rc, 0, "{out}");
    let row = |n: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("{n} ")))
            .unwrap_or_else(|| panic!("{n} listed: {out}"))
            .to_owned()
    };
    assert!(row(&r14).ends_with("current") && row(&r13).ends_with("previous"), "{out}");
    assert_eq!(row(&r10).trim(), r10, "an old release of ours: no tag");
    for f in ["mine", "1.0.0-000000000000", r11.as_str(), "README"] {
        assert!(row(f).contains("not installed by deploy.sh"), "{f}: {out}");
    }

    a_release_in_use_is_kept(&prefix, &r10, &r12);
    // current and previous stay, links untouched; everything foreign byte for byte
    assert_eq!(
        (link(&prefix.join("current")), link(&prefix.join("previous"))),
        (format!("releases/{r14}"), format!("releases/{r13}"))
    );
    assert!(
        rel.join(&r13).join("SHA256SUMS").exists() && rel.join(&r14).join("SHA256SUMS").exists()
    );
    assert_eq!(foreign_now(&rel, &foreign), foreign_before);
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(rc == 0 && out.contains("no release to remove"), "{out}");
    prune_finishes_a_cut_short_removal_and_keeps_an_absolute_current(&s, &prefix, &r14);

    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        !prefix.join("current").exists()
            && !prefix.join("previous").exists()
            && !rel.join(&r13).exists()
            && !rel.join(&r14).exists(),
        "{out}"
    );
    assert_eq!(
        foreign_now(&rel, &foreign),
        foreign_before,
        "uninstall leaves what it did not install"
    );
    assert_eq!(std::fs::read_to_string(prefix.join("site.conf")).unwrap(), "x=1\n");
    assert!(out.contains("stays"), "{out}");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--status"], &[]);
    assert!(rc == 0 && out.contains("current: none"), "{out}");

    a_prefix_of_only_its_own_is_gone_after_uninstall(&s);
}

/// Releases 1.0.0 to 1.4.0 installed in turn under `prefix`; their folders' names.
fn five_releases(s: &Path, prefix: &Path) -> [String; 5] {
    let p = prefix.to_str().unwrap();
    // 1.2.0's tool is a real program, so that a process can run (map) a file of that release
    let sleep = Command::new("sh").arg("-c").arg("command -v sleep").output().unwrap();
    let sleep = String::from_utf8(sleep.stdout).unwrap().trim().to_owned();
    for v in ["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0"] {
        let d = dist(s, v);
        if v == "1.2.0" {
            std::fs::copy(&sleep, d.join("bin/gdrshim-tool")).unwrap();
            manifest(&d);
        }
        assert_eq!(sh("deploy.sh", &["--prefix", p, d.to_str().unwrap()], &[]).0, 0, "{v}");
    }
    let name = |v: &str| release_named(prefix, v);
    [name("1.0.0"), name("1.1.0"), name("1.2.0"), name("1.3.0"), name("1.4.0")]
}

/// Each of `foreign` under `rel` as it is now: a folder's snapshot, a file's content.
fn foreign_now(rel: &Path, foreign: &[&str]) -> Vec<String> {
    foreign
        .iter()
        .map(|f| {
            let q = rel.join(f);
            if q.is_dir() {
                snapshot(&q)
            } else {
                std::fs::read_to_string(&q).unwrap_or_default()
            }
        })
        .collect()
}

/// A release a process is using (`r12`'s tool runs) is kept by --prune and makes --uninstall
/// refuse; once the process has ended, --prune removes it.
fn a_release_in_use_is_kept(prefix: &Path, r10: &str, r12: &str) {
    let (p, rel) = (prefix.to_str().unwrap(), prefix.join("releases"));
    let mut user = Command::new(rel.join(r12).join("bin/gdrshim-tool")).arg("60").spawn().unwrap();
    let exe = format!("/proc/{}/exe", user.id());
    for _ in 0..100 {
        if std::fs::read_link(&exe).map(|l| l.to_string_lossy().contains(r12)).unwrap_or(false) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let before = snapshot(prefix);
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains(&format!("releases/{r12} is in use by pid {}", user.id())), "{out}");
    assert_eq!(snapshot(prefix), before, "a refused uninstall removes nothing");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains(&format!("removed releases/{r10}")), "{out}");
    assert!(
        out.contains(&format!("left in place: releases/{r12}: in use by pid {}", user.id())),
        "{out}"
    );
    assert!(!rel.join(r10).exists() && rel.join(r12).exists());
    user.kill().unwrap();
    user.wait().unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains(&format!("removed releases/{r12}"))
            && out.contains("left in place: releases/mine"),
        "{out}"
    );
}

fn prune_finishes_a_cut_short_removal_and_keeps_an_absolute_current(
    s: &Path,
    prefix: &Path,
    r14: &str,
) {
    let (p, rel) = (prefix.to_str().unwrap(), prefix.join("releases"));
    // a removal cut short after its rename is finished by the next --prune; a user's folder
    // named like it but holding a link is not touched
    std::fs::create_dir_all(rel.join(".removing.9.9.9-0123456789ab/lib")).unwrap();
    std::fs::write(rel.join(".removing.9.9.9-0123456789ab/lib/libgdrshim.so"), "x").unwrap();
    std::os::unix::fs::symlink(s, rel.join(".removing.link")).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(rc == 0 && out.contains("finished removing releases/9.9.9-0123456789ab"), "{out}");
    assert!(
        !rel.join(".removing.9.9.9-0123456789ab").exists()
            && rel.join(".removing.link").is_symlink()
            && s.is_dir()
    );
    std::fs::remove_file(rel.join(".removing.link")).unwrap();
    // current written as an absolute link (by hand, or another tool) names the same release:
    // listed as current, never pruned
    let cur = prefix.join("current");
    std::fs::remove_file(&cur).unwrap();
    std::os::unix::fs::symlink(rel.join(r14), &cur).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--list"], &[]);
    assert!(rc == 0 && !out.contains("missing"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with(&format!("{r14} ")) && l.ends_with("current")),
        "{out}"
    );
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(
        rc == 0
            && out.contains("no release to remove")
            && rel.join(r14).join("SHA256SUMS").exists(),
        "{out}"
    );
}

/// A prefix that holds only what deploy.sh made is gone after --uninstall.
fn a_prefix_of_only_its_own_is_gone_after_uninstall(s: &Path) {
    let clean = s.join("clean");
    let c = clean.to_str().unwrap();
    assert_eq!(sh("deploy.sh", &["--prefix", c, dist(s, "2.0.0").to_str().unwrap()], &[]).0, 0);
    assert_eq!(sh("deploy.sh", &["--prefix", c, dist(s, "2.1.0").to_str().unwrap()], &[]).0, 0);
    let (rc, out) = sh("deploy.sh", &["--prefix", c, "--uninstall"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(!clean.exists(), "{out}");
    let (rc, out) = sh("deploy.sh", &["--prefix", c, "--list"], &[]);
    assert!(rc == 0 && out.contains("no releases"), "{out}");
}

/// The .deb lays out the same release folders; dpkg owns those, so --prune and --uninstall leave
/// them (and the links to them) to apt/dpkg. dpkg-query is a stub here that claims two releases.
#[test]
fn deploy_leaves_releases_of_the_deb_package_to_dpkg() {
    let s = scratch("dpkg");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    for v in ["1.0.0", "1.1.0", "1.2.0"] {
        assert_eq!(
            sh("deploy.sh", &["--prefix", p, dist(&s, v).to_str().unwrap()], &[]).0,
            0,
            "{v}"
        );
    }
    let (r10, r11, r12) = (
        release_named(&prefix, "1.0.0"),
        release_named(&prefix, "1.1.0"),
        release_named(&prefix, "1.2.0"),
    );
    let stub = s.join("bin");
    std::fs::create_dir_all(&stub).unwrap();
    let q = stub.join("dpkg-query");
    std::fs::write(
        &q,
        "#!/bin/sh\n[ \"$1\" = -S ] || exit 2\nfor r in $OWNED; do case \"$3\" in */releases/$r/SHA256SUMS) echo \"gdrshim: $3\"; exit 0 ;; esac; done\n\
         echo \"dpkg-query: no path found matching pattern $3\" >&2\nexit 1\n",
    )
    .unwrap();
    assert!(Command::new("chmod").arg("0755").arg(&q).status().unwrap().success());
    let path = format!("{}:{}", stub.display(), std::env::var("PATH").unwrap());
    let owned = format!("{r10} {r12}");
    let env = [("PATH", path.as_str()), ("OWNED", owned.as_str())];
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--list"], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.lines().any(|l| l.contains(&r10) && l.contains("installed by the package gdrshim")),
        "{out}"
    );
    let packaged = (
        snapshot(&prefix.join("releases").join(&r10)),
        snapshot(&prefix.join("releases").join(&r12)),
    );
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("no release to remove")
            && out.contains(&format!("left in place: releases/{r10}")),
        "{out}"
    );
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains(&format!("removed releases/{r11}"))
            && out.contains(&format!("removed previous -> releases/{r11}")),
        "{out}"
    );
    assert_eq!(
        link(&prefix.join("current")),
        format!("releases/{r12}"),
        "the package's current stays: {out}"
    );
    assert_eq!(
        (
            snapshot(&prefix.join("releases").join(&r10)),
            snapshot(&prefix.join("releases").join(&r12))
        ),
        packaged
    );
}

/// A release whose gdrshim-tool answers `gpu-facts` with FAKE_GPU_FACTS (and exit status
/// FAKE_GPU_FACTS_RC): this machine has no GPU.
fn dist_with_facts(at: &Path, version: &str) -> std::path::PathBuf {
    let d = dist(at, version);
    write_exe(
        &d.join("bin/gdrshim-tool"),
        "#!/bin/sh\n[ \"$1\" = gpu-facts ] || exit 2\nprintf 'INFO gpu.0 facts\\n     | %s\\n' \"$FAKE_GPU_FACTS\"\nexit \"${FAKE_GPU_FACTS_RC:-0}\"\n",
    );
    manifest(&d);
    d
}

const SM120: &str = "sm=120 writes_ordering=0 needs_forced_flush=1";
const SITE: &str = "# the site's\nNCCL_DEBUG=WARN\nNCCL_IB_HCA==mlx5_0\n\n";

/// deploy.sh with its nccl.conf at `conf` and the GPU facts `facts`.
fn deploy(conf: &Path, facts: &str, args: &[&str]) -> (i32, String) {
    sh(
        "deploy.sh",
        args,
        &[("GDR_DEPLOY_NCCL_CONF", conf.to_str().unwrap()), ("FAKE_GPU_FACTS", facts)],
    )
}

#[test]
fn the_nccl_line_is_written_where_a_gpu_needs_it_and_removed_with_the_last_release() {
    let s = scratch("nccl");
    let p = s.join("prefix");
    let p = p.to_str().unwrap();
    let conf = s.join("etc/nccl.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, SITE).unwrap();
    let (rc, out) =
        deploy(&conf, SM120, &["--prefix", p, dist_with_facts(&s, "1.0.0").to_str().unwrap()]);
    assert_eq!(rc, 0, "{out}");
    let after = std::fs::read_to_string(&conf).unwrap();
    assert!(after.starts_with(SITE), "every earlier line byte for byte: {after:?}");
    let ours = &after[SITE.len()..];
    assert_eq!(
        ours,
        "# added by gdrshim 1.0.0: NCCL's receive flush forced for GPUDirect RDMA on GPUs sm_120 (118 = 0) (removed with gdrshim)\nNCCL_NET_FORCE_FLUSH=1\n"
    );
    assert!(out.contains("NCCL_NET_FORCE_FLUSH=1 added"), "{out}");
    // a second release: the line is there once
    let (rc, out) =
        deploy(&conf, SM120, &["--prefix", p, dist_with_facts(&s, "1.1.0").to_str().unwrap()]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("already has gdrshim's NCCL_NET_FORCE_FLUSH=1"), "{out}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), after);
    // the site adds a line after ours; pruning keeps the current release and our line
    let later = format!("{after}NCCL_SOCKET_IFNAME=eth0\n");
    std::fs::write(&conf, &later).unwrap();
    assert_eq!(deploy(&conf, SM120, &["--prefix", p, "--prune"]).0, 0);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), later);
    // the last release goes: our two lines go, and nothing else
    let (rc, out) = deploy(&conf, SM120, &["--prefix", p, "--uninstall"]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("gdrshim's NCCL_NET_FORCE_FLUSH=1 removed; every other line kept"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), format!("{SITE}NCCL_SOCKET_IFNAME=eth0\n"));

    // no file before: made for our line, and removed with it
    std::fs::remove_file(&conf).unwrap();
    assert_eq!(
        deploy(&conf, SM120, &["--prefix", p, dist_with_facts(&s, "1.0.0").to_str().unwrap()]).0,
        0
    );
    let made = std::fs::read_to_string(&conf).unwrap();
    assert!(
        made.starts_with("# added by gdrshim 1.0.0 (new file): ")
            && made.ends_with("\nNCCL_NET_FORCE_FLUSH=1\n"),
        "{made:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777, 0o644);
    let (rc, out) = deploy(&conf, SM120, &["--prefix", p, "--uninstall"]);
    assert_eq!(rc, 0, "{out}");
    assert!(!conf.exists(), "{out}");

    // a last line without its end keeps its bytes (a line end is added before ours)
    std::fs::write(&conf, "NCCL_DEBUG=WARN").unwrap();
    assert_eq!(
        deploy(&conf, SM120, &["--prefix", p, dist_with_facts(&s, "1.0.0").to_str().unwrap()]).0,
        0
    );
    assert!(std::fs::read_to_string(&conf)
        .unwrap()
        .starts_with("NCCL_DEBUG=WARN\n# added by gdrshim 1.0.0: "));
    assert_eq!(deploy(&conf, SM120, &["--prefix", p, "--uninstall"]).0, 0);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "NCCL_DEBUG=WARN\n");
}

#[test]
fn the_nccl_line_is_not_written_where_no_gpu_needs_it_or_the_site_set_it() {
    let s = scratch("nccl-not");
    let p = s.join("prefix");
    let p = p.to_str().unwrap();
    let conf = s.join("nccl.conf");
    std::fs::write(&conf, SITE).unwrap();
    let d = dist_with_facts(&s, "1.0.0");
    let d = d.to_str().unwrap();
    for (facts, said) in [
        ("sm=89 writes_ordering=0 needs_forced_flush=0", "no GPU here needs NCCL's flush forced"),
        ("sm=90 writes_ordering=100 needs_forced_flush=0", "no GPU here needs NCCL's flush forced"),
        ("sm=120 writes_ordering=unknown needs_forced_flush=unknown", "no GPU here needs"),
    ] {
        let (rc, out) = deploy(&conf, facts, &["--prefix", p, d]);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains(said), "{facts}: {out}");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), SITE, "{facts}");
    }
    // the facts cannot be read (no GPU, no driver): nothing written
    let (rc, out) = sh(
        "deploy.sh",
        &["--prefix", p, d],
        &[
            ("GDR_DEPLOY_NCCL_CONF", conf.to_str().unwrap()),
            ("FAKE_GPU_FACTS", SM120),
            ("FAKE_GPU_FACTS_RC", "2"),
        ],
    );
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("the GPU facts cannot be read here"), "{out}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), SITE);
    // the site's own value (0 too), and a lookalike of our mark over it, are left alone
    for site in [
        format!("{SITE}NCCL_NET_FORCE_FLUSH=0\n"),
        format!("NCCL_NET_FORCE_FLUSH=1\n{SITE}"),
        format!("{SITE}# added by gdrshim 0.1: a site's copy\nNCCL_NET_FORCE_FLUSH=0\n"),
    ] {
        std::fs::write(&conf, &site).unwrap();
        let (rc, out) = deploy(&conf, SM120, &["--prefix", p, d]);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains("it sets NCCL_NET_FORCE_FLUSH itself"), "{out}");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), site);
        let (rc, out) = deploy(&conf, SM120, &["--prefix", p, "--uninstall"]);
        assert_eq!(rc, 0, "{out}");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), site, "not ours: kept");
    }
    // the tool of an ordinary test release cannot run: nothing written
    std::fs::write(&conf, SITE).unwrap();
    let (rc, out) = deploy(&conf, SM120, &["--prefix", p, dist(&s, "2.0.0").to_str().unwrap()]);
    assert_eq!(rc, 0, "{out}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), SITE);
}
