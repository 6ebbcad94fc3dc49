//! The deployment gate (scripts/deploy.sh) and the per-job env script (scripts/gdr-env.sh), on
//! release folders and prefixes of our own making.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-deploy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sh(script: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let cdi = std::env::temp_dir().join(format!("gdrshim-deploy-cdi-{}", std::process::id())); // not the machine's /etc/cdi
    let mut c = Command::new("bash");
    c.arg(root().join("scripts").join(script)).args(args).env("GDR_DEPLOY_CDI_DIR", cdi).envs(env.iter().copied());
    let out = c.output().unwrap();
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A release folder laid out as build-release.sh does, with `version` in BUILD-INFO.
fn dist(at: &Path, version: &str) -> PathBuf {
    dist_with(at, version, None)
}

/// The same, with a real library (so that LD_PRELOAD of it works).
fn dist_with(at: &Path, version: &str, lib: Option<&Path>) -> PathBuf {
    let d = at.join(format!("dist-{version}"));
    for (f, body) in [
        ("lib/libgdrshim.so", format!("shim {version}\n")),
        ("lib/libgdrshim-core.so", format!("core {version}\n")),
        ("bin/gdrshim-tool", "tool\n".into()),
        ("include/gdrshim.h", "/* h */\n".into()),
        ("BUILD-INFO", format!("gdrshim {version}\nrustc: test\n")),
    ] {
        let p = d.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, body).unwrap();
    }
    if let Some(core) = lib {
        // the front and the core, as a release ships them
        std::fs::copy(common::front_pair(core, false), d.join("lib/libgdrshim.so")).unwrap();
        std::fs::copy(core, d.join("lib/libgdrshim-core.so")).unwrap();
    }
    std::fs::create_dir_all(d.join("scripts")).unwrap();
    for f in ["gdr-env.sh", "gdrshim-version.sh"] {
        std::fs::copy(root().join("scripts").join(f), d.join("scripts").join(f)).unwrap();
    }
    manifest(&d);
    d
}

fn manifest(d: &Path) {
    let st = Command::new("bash")
        .arg("-c")
        .arg("find . -type f ! -name SHA256SUMS -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum > SHA256SUMS")
        .current_dir(d)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Every path under `p` with its link target or content hash: "exactly as it was".
fn snapshot(p: &Path) -> String {
    if !p.exists() {
        return "(absent)".into();
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg("find . -printf '%p %y %l\\n' | LC_ALL=C sort; find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")
        .current_dir(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn link(p: &Path) -> String {
    std::fs::read_link(p).map(|l| l.display().to_string()).unwrap_or_default()
}

#[test]
fn deploy_installs_switches_and_rolls_back() {
    let s = scratch("ok");
    let prefix = s.join("opt/rtx4090-gdr");
    let p = prefix.to_str().unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, dist(&s, "1.0.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    let first = link(&prefix.join("current"));
    assert!(first.starts_with("releases/1.0.0-"), "{first}");
    assert_eq!(std::fs::read_to_string(prefix.join("current/lib/libgdrshim.so")).unwrap(), "shim 1.0.0\n");
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
    assert_eq!((link(&prefix.join("current")), link(&prefix.join("previous"))), (first.clone(), second.clone()));
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--status"], &[]);
    assert_eq!(rc, 0);
    assert!(out.contains(&format!("current: {first}")) && out.contains(&format!("previous: {second}")), "{out}");
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
    assert!(out.contains("does not match its SHA256SUMS") && out.contains("lib/libgdrshim.so: FAILED"), "{out}");
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

    let (rc, out) = sh("deploy.sh", &["--prefix", "/usr", dist(&s, "3.0.0").to_str().unwrap()], &[]);
    assert_eq!(rc, 1);
    assert!(out.contains("system folder"), "{out}");
    // rollback with nothing to roll back to
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--rollback"], &[]);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(snapshot(&prefix), before);
}

/// A fake /sys/class/infiniband with mlx5_0 (port 1) and mlx5_1.
fn sysfs(at: &Path) -> PathBuf {
    let d = at.join("sys-ib");
    std::fs::create_dir_all(d.join("mlx5_0/ports/1")).unwrap();
    std::fs::create_dir_all(d.join("mlx5_1/ports/1")).unwrap();
    d
}

#[test]
fn env_script_sets_what_the_runbook_sets_and_refuses_bad_input() {
    let s = scratch("env");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    let built = Command::new(env!("CARGO")).args(["build", "--release", "--lib", "-q"]).current_dir(root()).status().unwrap();
    assert!(built.success());
    let real_lib = root().join("target/release/libgdrshim.so");
    assert_eq!(sh("deploy.sh", &["--prefix", p, dist_with(&s, "1.0.0", Some(&real_lib)).to_str().unwrap()], &[]).0, 0);
    let cur = prefix.join("current");
    let c = cur.to_str().unwrap();
    // the installed script names the release it came with (BUILD-INFO), not the source tree's version
    let v = Command::new("bash").arg(cur.join("scripts/gdr-env.sh")).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&v.stdout), "gdr-env.sh (gdrshim) 1.0.0\n");
    let sys = sysfs(&s);
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    let (rc, out) =
        sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0:1,mlx5_1", "--gid-index", "3", "--gdr-level", "PHB", "--print"], &env);
    assert_eq!(rc, 0, "{out}");
    let real_shim = std::fs::canonicalize(cur.join("lib/libgdrshim.so")).unwrap();
    for want in [
        format!("export LD_PRELOAD={}", real_shim.display()),
        "export GDRSHIM_MODE=register".into(),
        "export NCCL_IB_DISABLE=0".into(),
        "export NCCL_IB_HCA=mlx5_0:1,mlx5_1".into(),
        "export NCCL_IB_GID_INDEX=3".into(),
        "export NCCL_NET_GDR_LEVEL=PHB".into(),
        "export NCCL_P2P_LEVEL=SYS".into(),
        "export NCCL_LOCAL_REGISTER=0".into(),
        "export NCCL_GRAPH_REGISTER=0".into(),
        "export GDRSHIM_ROUTE=auto".into(),
        "export NCCL_NET_FORCE_FLUSH=1".into(),
    ] {
        assert!(out.lines().any(|l| l == want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("NCCL_DMABUF_ENABLE"), "the DMA-BUF route needs NCCL's DMA-BUF path: {out}");
    assert!(!out.contains("GDRSHIM_ADVERTISE_GDR"), "GDR is advertised by default: {out}");
    // the opt-out; the old opt-in changes nothing; the job's own forced flush kept; NCCL's flush off refused
    let g = |flag: &str, var: (&str, &str)| sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0", flag, "--print"], &[env[0], env[1], var]);
    let (rc, out) = g("--no-advertise", ("X", ""));
    assert!(rc == 0 && out.lines().any(|l| l == "export GDRSHIM_ADVERTISE_GDR=0"), "{out}");
    let (rc, out) = g("--advertise", ("NCCL_NET_FORCE_FLUSH", "0"));
    assert!(rc == 0 && !out.contains("GDRSHIM_ADVERTISE_GDR") && !out.contains("NCCL_NET_FORCE_FLUSH"), "{out}");
    let (rc, out) = g("--debug", ("NCCL_GDR_FLUSH_DISABLE", "1"));
    assert!(rc == 2 && out.contains("NCCL_GDR_FLUSH_DISABLE=1 is set") && out.contains("unset it"), "{out}");
    assert_eq!(g("--debug", ("NCCL_GDR_FLUSH_DISABLE", "0")).0, 0);
    let (rc, out) = g("--route=dmabuf", ("NCCL_DMABUF_ENABLE", "0"));
    assert_eq!(rc, 2, "NCCL_DMABUF_ENABLE=0 with the DMA-BUF route is refused: {out}");
    assert_eq!(sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0", "--route", "both", "--print"], &env).0, 2);
    // p2p mode: no shim at all
    let (rc, out) = sh("gdr-env.sh", &["--mode", "p2p", "--print"], &env);
    assert_eq!(rc, 0);
    assert_eq!(out, "export NCCL_P2P_LEVEL=SYS\nexport NCCL_LOCAL_REGISTER=0\nexport NCCL_GRAPH_REGISTER=0\n");
    assert!(sh("gdr-env.sh", &["--mode", "p2p", "--register-buffers", "--print"], &env).1 == "export NCCL_P2P_LEVEL=SYS\n");
    // wrapper mode runs the command with them
    let (rc, out) = sh(
        "gdr-env.sh",
        &["--prefix", c, "--hca", "mlx5_0", "--", "sh", "-c", "echo $NCCL_IB_HCA $GDRSHIM_MODE ${LD_PRELOAD##*/}"],
        &[env[0], ("LD_PRELOAD", ""), ("GDRSHIM_SUMMARY", "0")],
    );
    assert_eq!((rc, out.as_str()), (0, "mlx5_0 register libgdrshim.so\n"));
    // bad inputs
    for (args, why) in [
        (vec!["--prefix", c, "--hca", "mlx5_9"], "HCA 'mlx5_9' does not exist"),
        (vec!["--prefix", c, "--hca", "mlx5_0:7"], "has no port '7'"),
        (vec!["--prefix", c, "--hca", "mlx5_0;rm"], "bad HCA name"),
        (vec!["--prefix", c, "--hca", "mlx5_0", "--gid-index", "3x"], "--gid-index must be a number"),
        (vec!["--prefix", c, "--hca", "mlx5_0", "--gdr-level", "FAST"], "--gdr-level must be one of"),
        (vec!["--prefix", c], "no --hca given and 2 HCAs here (mlx5_0 mlx5_1); which is nearest each GPU is not known"),
        (vec!["--mode", "both"], "--mode must be p2p or gdr"),
        (vec!["--prefix", "/nonexistent", "--hca", "mlx5_0"], "no shim at"),
        (vec!["--prefix", c, "--hca", "mlx5_0", "--nccl-lib", "/nonexistent"], "no libnccl.so.2"),
    ] {
        let (rc, out) = sh("gdr-env.sh", &args, &env);
        assert_ne!(rc, 0, "{args:?}");
        assert!(out.contains(why), "{args:?}: {out}");
    }
    // a shim that does not match the installed SHA256SUMS is never preloaded
    let lib = prefix.join(link(&cur)).join("lib/libgdrshim.so");
    std::fs::write(&lib, b"tampered\n").unwrap();
    let (rc, out) = sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0", "--print"], &env);
    assert_eq!(rc, 1);
    assert!(out.contains("does not match") && !out.contains("LD_PRELOAD"), "{out}");
}

#[test]
fn env_script_when_sourced_sets_variables_and_never_exits_the_shell() {
    let script = root().join("scripts/gdr-env.sh");
    let cmd = format!(
        "add() {{ echo mine; }}; source {s} --mode p2p; echo \"p2p=$NCCL_P2P_LEVEL\"; source {s} --mode nonsense; echo \"rc=$? alive\"; \
         source {s} --prefix /nonexistent --hca nosuchhca 2>/dev/null; add; declare -F | grep -c _gdr_env || true",
        s = script.display()
    );
    let out = Command::new("bash").arg("-c").arg(&cmd).output().unwrap();
    let o = String::from_utf8_lossy(&out.stdout);
    // the caller's own functions survive (a failure half way through included), none of ours stays
    assert_eq!(o, "p2p=SYS\nrc=2 alive\nmine\n0\n", "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn state_record_saves_every_item_and_compares_what_matters() {
    let s = scratch("record");
    let (rc, out) = sh("gdr-state-record", &["save", s.to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    let a = PathBuf::from(out.trim());
    for item in
        ["nvidia-smi-q", "nvidia-smi-topo-p2p-r", "packages", "holds", "dkms-status", "kernel", "modinfo-nvidia", "proc-driver-version"]
    {
        let t = std::fs::read_to_string(a.join(format!("{item}.txt"))).unwrap_or_else(|_| panic!("{item} not saved"));
        // a tool that is missing here says so instead of leaving an empty file
        assert!(!t.is_empty() || item == "holds", "{item}: empty");
    }
    assert!(a.join("RECORD").exists());
    let b = s.join("copy");
    assert!(Command::new("cp").arg("-a").arg(&a).arg(&b).status().unwrap().success());
    // live readings of nvidia-smi -q are not a difference
    std::fs::write(a.join("nvidia-smi-q.txt"), "Timestamp : Mon\nDriver Version : 595.71.05\n    GPU Current Temp : 40 C\n").unwrap();
    std::fs::write(b.join("nvidia-smi-q.txt"), "Timestamp : Tue\nDriver Version : 595.71.05\n    GPU Current Temp : 55 C\n").unwrap();
    let (rc, out) = sh("gdr-state-record", &["compare", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("no difference"), "{out}");
    // a driver change is
    std::fs::write(b.join("nvidia-smi-q.txt"), "Timestamp : Tue\nDriver Version : 595.58.03\n").unwrap();
    std::fs::remove_file(b.join("holds.txt")).unwrap();
    let (rc, out) = sh("gdr-state-record", &["compare", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("== nvidia-smi-q changed:") && out.contains("> Driver Version : 595.58.03"), "{out}");
    assert!(out.contains("== holds: only in"), "{out}");
    assert_eq!(sh("gdr-state-record", &["compare", a.to_str().unwrap(), s.to_str().unwrap()], &[]).0, 2, "not a save");
}

/// Under AT_SECURE the shim is inert: a setgid program that preloads it (glibc allows that only
/// for a set-user-ID library in a system folder, named without a slash) gets a shim that reports
/// mode 0 and opens no file named by the environment. Needs root (CI runs as root): run with
/// `--include-ignored`, as scripts/dev/test.sh does when it is root.
#[test]
#[ignore = "needs root: installs a set-user-ID test copy of the shim into /usr/lib for the test's duration"]
fn inert_under_secure_execution() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let s = scratch("secure");
    let built = Command::new(env!("CARGO")).args(["build", "--release", "--lib", "-q"]).current_dir(root()).status().unwrap();
    assert!(built.success());
    let lib_dir = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"].into_iter().map(Path::new).find(|p| p.is_dir()).unwrap();
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    // the core preloaded itself, and the front with the core beside it (as a release ships them)
    let core = root().join("target/release/libgdrshim.so");
    let front = common::front_pair(&core, false);
    let beside = lib_dir.join("libgdrshim-core.so");
    assert!(!beside.exists(), "{} exists: not a machine to run this test on", beside.display());
    std::fs::copy(&core, &beside).unwrap();
    let _beside_cleanup = Cleanup(beside);
    let mut names = Vec::new();
    let mut cleanups = Vec::new();
    for (what, from) in [("core", &core), ("front", &front)] {
        let name = format!("libgdrshim-secure-test-{}-{what}.so", std::process::id());
        let lib = lib_dir.join(&name);
        std::fs::copy(from, &lib).unwrap();
        cleanups.push(Cleanup(lib.clone()));
        assert!(Command::new("chmod").arg("4755").arg(&lib).status().unwrap().success());
        names.push(name);
    }
    // a setgid bit only counts on a file system mounted without nosuid: the build tree's, not /tmp's
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("secure_probe-{}", std::process::id()));
    let _bin_cleanup = Cleanup(bin.clone());
    assert!(Command::new("cc").arg("-o").arg(&bin).arg(root().join("tests/c/secure_probe.c")).status().unwrap().success());
    // setgid to a group the caller is not in: AT_SECURE even for root
    assert!(Command::new("chown").arg("root:65534").arg(&bin).status().unwrap().success());
    assert!(Command::new("chmod").arg("2755").arg(&bin).status().unwrap().success());
    let log = s.join("log.txt");
    let cap = s.join("cap.txt");
    let run = |preload: &str| {
        let out = Command::new(&bin)
            .env("LD_PRELOAD", preload)
            .env("GDRSHIM_MODE", "register")
            .env("GDRSHIM_LOG_LEVEL", "trace")
            .env("GDRSHIM_LOG_FILE", &log)
            .env("GDRSHIM_CAPTURE", &cap)
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for name in &names {
        let (out, err) = run(name);
        assert_eq!(out, "secure=1 loaded=1 mode=0\n", "{name}: {err}");
        assert!(!err.contains("gdrshim"), "{name}: nothing said: {err}");
        assert!(!log.exists() && !cap.exists(), "{name}: no file named by the environment was created");
    }
    // the same program made ordinary: the shim is live (the control of the experiment)
    assert!(Command::new("chmod").arg("0755").arg(&bin).status().unwrap().success());
    for name in &names {
        let (out, err) = run(name);
        assert_eq!(out, "secure=0 loaded=1 mode=3\n", "{name}: {err}");
    }
}

fn release_named(prefix: &Path, version: &str) -> String {
    let mut v: Vec<String> = std::fs::read_dir(prefix.join("releases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{version}-")) && n.len() == version.len() + 13)
        .collect();
    assert_eq!(v.len(), 1, "{version}: {v:?}");
    v.pop().unwrap()
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
        assert!(!out.contains("parameter null") && !out.contains("unbound variable"), "no bash error: {out}");
    }
}

#[test]
fn deploy_lists_prunes_and_uninstalls_only_what_it_installed() {
    let s = scratch("prune");
    let prefix = s.join("prefix");
    let p = prefix.to_str().unwrap();
    let rel = prefix.join("releases");
    // 1.2.0's tool is a real program, so that a process can run (map) a file of that release
    let sleep = Command::new("sh").arg("-c").arg("command -v sleep").output().unwrap();
    let sleep = String::from_utf8(sleep.stdout).unwrap().trim().to_owned();
    for v in ["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0"] {
        let d = dist(&s, v);
        if v == "1.2.0" {
            std::fs::copy(&sleep, d.join("bin/gdrshim-tool")).unwrap();
            manifest(&d);
        }
        assert_eq!(sh("deploy.sh", &["--prefix", p, d.to_str().unwrap()], &[]).0, 0, "{v}");
    }
    let name = |v: &str| release_named(&prefix, v);
    let (r10, r11, r12, r13, r14) = (name("1.0.0"), name("1.1.0"), name("1.2.0"), name("1.3.0"), name("1.4.0"));
    // things deploy.sh did not install: a folder of the user's, a release copied under another
    // name, a release of ours that someone added a file to, a file, a file beside releases/
    std::fs::create_dir_all(rel.join("mine")).unwrap();
    std::fs::write(rel.join("mine/notes.txt"), "keep\n").unwrap();
    assert!(Command::new("cp").arg("-a").arg(rel.join(&r10)).arg(rel.join("1.0.0-000000000000")).status().unwrap().success());
    std::fs::write(rel.join(&r11).join("lib/extra.so"), "user's\n").unwrap();
    std::fs::write(rel.join("README"), "ours\n").unwrap();
    std::fs::write(prefix.join("site.conf"), "x=1\n").unwrap();
    let foreign = ["mine", "1.0.0-000000000000", r11.as_str(), "README"];
    let foreign_now = || -> Vec<String> {
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
    };
    let foreign_before = foreign_now();

    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--list"], &[]);
    assert_eq!(rc, 0, "{out}");
    let row = |n: &str| {
        out.lines().find(|l| l.trim_start().starts_with(&format!("{n} "))).unwrap_or_else(|| panic!("{n} listed: {out}")).to_owned()
    };
    assert!(row(&r14).ends_with("current") && row(&r13).ends_with("previous"), "{out}");
    assert_eq!(row(&r10).trim(), r10, "an old release of ours: no tag");
    for f in ["mine", "1.0.0-000000000000", r11.as_str(), "README"] {
        assert!(row(f).contains("not installed by deploy.sh"), "{f}: {out}");
    }

    // a release a process is using is kept by --prune and makes --uninstall refuse
    let mut user = Command::new(rel.join(&r12).join("bin/gdrshim-tool")).arg("60").spawn().unwrap();
    let exe = format!("/proc/{}/exe", user.id());
    for _ in 0..100 {
        if std::fs::read_link(&exe).map(|l| l.to_string_lossy().contains(&r12)).unwrap_or(false) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let before = snapshot(&prefix);
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &[]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains(&format!("releases/{r12} is in use by pid {}", user.id())), "{out}");
    assert_eq!(snapshot(&prefix), before, "a refused uninstall removes nothing");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains(&format!("removed releases/{r10}")), "{out}");
    assert!(out.contains(&format!("left in place: releases/{r12}: in use by pid {}", user.id())), "{out}");
    assert!(!rel.join(&r10).exists() && rel.join(&r12).exists());
    user.kill().unwrap();
    user.wait().unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains(&format!("removed releases/{r12}")) && out.contains("left in place: releases/mine"), "{out}");
    // current and previous stay, links untouched; everything foreign byte for byte
    assert_eq!((link(&prefix.join("current")), link(&prefix.join("previous"))), (format!("releases/{r14}"), format!("releases/{r13}")));
    assert!(rel.join(&r13).join("SHA256SUMS").exists() && rel.join(&r14).join("SHA256SUMS").exists());
    assert_eq!(foreign_now(), foreign_before);
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(rc == 0 && out.contains("no release to remove"), "{out}");
    // a removal cut short after its rename is finished by the next --prune; a user's folder
    // named like it but holding a link is not touched
    std::fs::create_dir_all(rel.join(".removing.9.9.9-0123456789ab/lib")).unwrap();
    std::fs::write(rel.join(".removing.9.9.9-0123456789ab/lib/libgdrshim.so"), "x").unwrap();
    std::os::unix::fs::symlink(&s, rel.join(".removing.link")).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(rc == 0 && out.contains("finished removing releases/9.9.9-0123456789ab"), "{out}");
    assert!(!rel.join(".removing.9.9.9-0123456789ab").exists() && rel.join(".removing.link").is_symlink() && s.is_dir());
    std::fs::remove_file(rel.join(".removing.link")).unwrap();
    // current written as an absolute link (by hand, or another tool) names the same release:
    // listed as current, never pruned
    let cur = prefix.join("current");
    std::fs::remove_file(&cur).unwrap();
    std::os::unix::fs::symlink(rel.join(&r14), &cur).unwrap();
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--list"], &[]);
    assert!(rc == 0 && !out.contains("missing"), "{out}");
    assert!(out.lines().any(|l| l.trim_start().starts_with(&format!("{r14} ")) && l.ends_with("current")), "{out}");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &[]);
    assert!(rc == 0 && out.contains("no release to remove") && rel.join(&r14).join("SHA256SUMS").exists(), "{out}");

    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        !prefix.join("current").exists() && !prefix.join("previous").exists() && !rel.join(&r13).exists() && !rel.join(&r14).exists(),
        "{out}"
    );
    assert_eq!(foreign_now(), foreign_before, "uninstall leaves what it did not install");
    assert_eq!(std::fs::read_to_string(prefix.join("site.conf")).unwrap(), "x=1\n");
    assert!(out.contains("stays"), "{out}");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--status"], &[]);
    assert!(rc == 0 && out.contains("current: none"), "{out}");

    // a prefix that holds only what deploy.sh made is gone after --uninstall
    let clean = s.join("clean");
    let c = clean.to_str().unwrap();
    assert_eq!(sh("deploy.sh", &["--prefix", c, dist(&s, "2.0.0").to_str().unwrap()], &[]).0, 0);
    assert_eq!(sh("deploy.sh", &["--prefix", c, dist(&s, "2.1.0").to_str().unwrap()], &[]).0, 0);
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
        assert_eq!(sh("deploy.sh", &["--prefix", p, dist(&s, v).to_str().unwrap()], &[]).0, 0, "{v}");
    }
    let (r10, r11, r12) = (release_named(&prefix, "1.0.0"), release_named(&prefix, "1.1.0"), release_named(&prefix, "1.2.0"));
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
    assert!(out.lines().any(|l| l.contains(&r10) && l.contains("installed by the package gdrshim")), "{out}");
    let packaged = (snapshot(&prefix.join("releases").join(&r10)), snapshot(&prefix.join("releases").join(&r12)));
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--prune"], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("no release to remove") && out.contains(&format!("left in place: releases/{r10}")), "{out}");
    let (rc, out) = sh("deploy.sh", &["--prefix", p, "--uninstall"], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains(&format!("removed releases/{r11}")) && out.contains(&format!("removed previous -> releases/{r11}")), "{out}");
    assert_eq!(link(&prefix.join("current")), format!("releases/{r12}"), "the package's current stays: {out}");
    assert_eq!((snapshot(&prefix.join("releases").join(&r10)), snapshot(&prefix.join("releases").join(&r12))), packaged);
}
