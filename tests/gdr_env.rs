//! The per-job env script (scripts/gdr-env.sh): what it sets for the runbook and what it refuses,
//! every form of NCCL_IB_HCA and level NCCL takes, exports a shell can copy, and sourced, a shell
//! it never exits; on prefixes of our own making.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::scripts::{dist_with, link, root, run, scratch, script, sh};

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
    let built = Command::new(env!("CARGO"))
        .args(["build", "--release", "--lib", "-q"])
        .current_dir(root())
        .status()
        .unwrap();
    assert!(built.success());
    let real_lib = root().join("target/release/libgdrshim.so");
    assert_eq!(
        sh(
            "deploy.sh",
            &["--prefix", p, dist_with(&s, "1.0.0", Some(&real_lib)).to_str().unwrap()],
            &[]
        )
        .0,
        0
    );
    let cur = prefix.join("current");
    let c = cur.to_str().unwrap();
    // the installed script names the release it came with (BUILD-INFO), not the source tree's version
    let v =
        Command::new("bash").arg(cur.join("scripts/gdr-env.sh")).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&v.stdout), "gdr-env.sh (gdrshim) 1.0.0\n");
    let sys = sysfs(&s);
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    runbook_exports(&cur, env);
    advertise_and_flush_switches(c, env);
    p2p_and_wrapper_modes(c, env);
    bad_input_is_refused(c, env);
    // a shim that does not match the installed SHA256SUMS is never preloaded
    let lib = prefix.join(link(&cur)).join("lib/libgdrshim.so");
    std::fs::write(&lib, b"tampered\n").unwrap();
    let (rc, out) = sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0", "--print"], &env);
    assert_eq!(rc, 1);
    assert!(out.contains("does not match") && !out.contains("LD_PRELOAD"), "{out}");
}

/// The runbook's flags on the release installed at `cur`: the exports it prints.
fn runbook_exports(cur: &Path, env: [(&str, &str); 2]) {
    let c = cur.to_str().unwrap();
    let (rc, out) = sh(
        "gdr-env.sh",
        &[
            "--prefix",
            c,
            "--hca",
            "mlx5_0:1,mlx5_1",
            "--gid-index",
            "3",
            "--gdr-level",
            "PHB",
            "--print",
        ],
        &env,
    );
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
    assert!(
        !out.contains("NCCL_DMABUF_ENABLE"),
        "the DMA-BUF route needs NCCL's DMA-BUF path: {out}"
    );
    assert!(!out.contains("GDRSHIM_ADVERTISE_GDR"), "GDR is advertised by default: {out}");
}

/// GDR advertised unless turned down, and NCCL's flush kept.
fn advertise_and_flush_switches(c: &str, env: [(&str, &str); 2]) {
    // the opt-out; the old opt-in changes nothing; the job's own forced flush kept; NCCL's flush off refused
    let g = |flag: &str, var: (&str, &str)| {
        sh(
            "gdr-env.sh",
            &["--prefix", c, "--hca", "mlx5_0", flag, "--print"],
            &[env[0], env[1], var],
        )
    };
    let (rc, out) = g("--no-advertise", ("X", ""));
    assert!(rc == 0 && out.lines().any(|l| l == "export GDRSHIM_ADVERTISE_GDR=0"), "{out}");
    let (rc, out) = g("--advertise", ("NCCL_NET_FORCE_FLUSH", "0"));
    assert!(
        rc == 0 && !out.contains("GDRSHIM_ADVERTISE_GDR") && !out.contains("NCCL_NET_FORCE_FLUSH"),
        "{out}"
    );
    let (rc, out) = g("--debug", ("NCCL_GDR_FLUSH_DISABLE", "1"));
    assert!(
        rc == 2 && out.contains("NCCL_GDR_FLUSH_DISABLE=1 is set") && out.contains("unset it"),
        "{out}"
    );
    assert_eq!(g("--debug", ("NCCL_GDR_FLUSH_DISABLE", "0")).0, 0);
    let (rc, out) = g("--route=dmabuf", ("NCCL_DMABUF_ENABLE", "0"));
    assert_eq!(rc, 2, "NCCL_DMABUF_ENABLE=0 with the DMA-BUF route is refused: {out}");
    assert_eq!(
        sh("gdr-env.sh", &["--prefix", c, "--hca", "mlx5_0", "--route", "both", "--print"], &env).0,
        2
    );
}

/// p2p mode sets no shim; wrapper mode runs the command with the variables.
fn p2p_and_wrapper_modes(c: &str, env: [(&str, &str); 2]) {
    // p2p mode: no shim at all
    let (rc, out) = sh("gdr-env.sh", &["--mode", "p2p", "--print"], &env);
    assert_eq!(rc, 0);
    assert_eq!(
        out,
        "export NCCL_P2P_LEVEL=SYS\nexport NCCL_LOCAL_REGISTER=0\nexport NCCL_GRAPH_REGISTER=0\n"
    );
    assert!(
        sh("gdr-env.sh", &["--mode", "p2p", "--register-buffers", "--print"], &env).1
            == "export NCCL_P2P_LEVEL=SYS\n"
    );
    // wrapper mode runs the command with them
    let (rc, out) = sh(
        "gdr-env.sh",
        &[
            "--prefix",
            c,
            "--hca",
            "mlx5_0",
            "--",
            "sh",
            "-c",
            "echo $NCCL_IB_HCA $GDRSHIM_MODE ${LD_PRELOAD##*/}",
        ],
        &[env[0], ("LD_PRELOAD", ""), ("GDRSHIM_SUMMARY", "0")],
    );
    assert_eq!((rc, out.as_str()), (0, "mlx5_0 register libgdrshim.so\n"));
}

/// Each bad input, named in the refusal.
fn bad_input_is_refused(c: &str, env: [(&str, &str); 2]) {
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

/// An installed-looking prefix (a shim file and its SHA256SUMS) and a fake /sys/class/infiniband
/// with mlx5_0 (port 1) and mlx5_1 (ports 1 and 2).
fn env_setup(s: &Path) -> (PathBuf, PathBuf) {
    let prefix = s.join("prefix");
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::write(prefix.join("lib/libgdrshim.so"), b"shim\n").unwrap();
    std::fs::write(prefix.join("lib/libgdrshim-core.so"), b"core\n").unwrap();
    let sums = Command::new("sh")
        .arg("-c")
        .arg("sha256sum lib/libgdrshim.so lib/libgdrshim-core.so > SHA256SUMS")
        .current_dir(&prefix)
        .status()
        .unwrap();
    assert!(sums.success());
    let sys = s.join("sys");
    for p in ["mlx5_0/ports/1", "mlx5_1/ports/1", "mlx5_1/ports/2"] {
        std::fs::create_dir_all(sys.join(p)).unwrap();
    }
    (prefix, sys)
}

#[test]
fn env_script_takes_every_form_nccl_takes_and_validates_as_nccl_would() {
    let s = scratch("env-forms");
    let (prefix, sys) = env_setup(&s);
    let p = script("scripts/gdr-env.sh");
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    let base = ["--prefix", prefix.to_str().unwrap(), "--print"];
    let with = |extra: &[&str]| run(&p, &[&base[..], extra].concat(), &env);
    for (hca, printed) in [
        ("mlx5_0", "mlx5_0"),
        ("=mlx5_0", "'=mlx5_0'"), // exact (a leading = is quoted: zsh would expand it)
        ("mlx5", "mlx5"),         // a prefix of both
        ("mlx5_0:1,mlx5_1:2", "mlx5_0:1,mlx5_1:2"), // ports; the comma stays as it is
        ("mlx5:2", "mlx5:2"),     // a prefix with a port that one of them has
        ("^mlx5_1", "'^mlx5_1'"), // all but mlx5_1
        ("^=mlx5_0", "'^=mlx5_0'"),
        ("^mlx5_1:2", "'^mlx5_1:2'"),
        ("^mlx5_0,mlx5_1:1", "'^mlx5_0,mlx5_1:1'"), // leaves mlx5_1 port 2
    ] {
        let r = with(&["--hca", hca]);
        assert_eq!(r.rc, 0, "{hca}: {}", r.err);
        assert!(
            r.out.lines().any(|l| l == format!("export NCCL_IB_HCA={printed}")),
            "{hca}: {}",
            r.out
        );
    }
    for (hca, why) in [
        ("=mlx5", "HCA 'mlx5' does not exist"), // exact: no HCA is called mlx5
        ("mlx5_9", "no HCA's name starts with it"), // a prefix that matches nothing
        ("=mlx5_0:2", "HCA 'mlx5_0' has no port '2'"), // exact with a port it lacks
        ("mlx5_0:x", "bad port in 'mlx5_0:x'"),
        ("^mlx5", "excludes every HCA port"), // NCCL would be left with no device
        ("^mlx5_0,mlx5_1", "excludes every HCA port"),
        ("^", "names no HCA"),
        (",", "names no HCA"),
        ("=^mlx5_0", "bad HCA name"), // NCCL reads ^ first, then =
        ("mlx5_0;reboot", "bad HCA name"),
    ] {
        let r = with(&["--hca", hca]);
        assert_eq!(r.rc, 2, "{hca}: {}", r.out);
        assert!(r.err.contains(why), "{hca}: {}", r.err);
        assert_eq!(r.out, "", "{hca}: nothing printed");
    }
    // an exclusion of an HCA that is not here is harmless: a warning, no refusal
    let r = with(&["--hca", "^mlx5_7"]);
    assert_eq!(r.rc, 0);
    assert!(r.err.contains("excludes 'mlx5_7', which matches no HCA here"), "{}", r.err);

    // levels: NCCL's names (upper case, as its strcmp) and old numbers; both variables
    for (flag, var) in [("--gdr-level", "NCCL_NET_GDR_LEVEL"), ("--p2p-level", "NCCL_P2P_LEVEL")] {
        for l in [
            "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "0", "3", "4",
            "7",
        ] {
            let r = with(&["--hca", "mlx5_0", flag, l]);
            assert_eq!(r.rc, 0, "{flag} {l}: {}", r.err);
            assert!(
                r.out.lines().any(|x| x == format!("export {var}={l}")),
                "{flag} {l}: {}",
                r.out
            );
        }
        for l in ["sys", "FAST", "-1", "010", "3x", ""] {
            let r = with(&["--hca", "mlx5_0", flag, l]);
            assert_eq!(r.rc, 2, "{flag} {l:?}: {}", r.out);
            assert!(r.err.contains(&format!("{flag} must be one of")), "{flag} {l:?}: {}", r.err);
        }
    }
    let r = with(&["--hca", "mlx5_0", "--gdr-level", "0"]);
    assert!(
        r.err.contains("NCCL_NET_GDR_LEVEL=0 means LOC") && r.err.contains("will not use GDR"),
        "{}",
        r.err
    );
    let r = with(&["--hca", "mlx5_0", "--gid-index", "-1"]);
    assert!(
        r.rc == 0 && r.out.contains("export NCCL_IB_GID_INDEX=-1\n"),
        "-1: NCCL chooses: {}",
        r.err
    );
    // an option at the end without its value, and the --opt=value form
    let r = run(&p, &["--mode", "p2p", "--p2p-level"], &env);
    assert_eq!(r.rc, 2);
    assert!(r.err.contains("--p2p-level needs a value"), "{}", r.err);
    let r = run(&p, &["--mode=p2p", "--p2p-level=PIX", "--print"], &env);
    assert_eq!((r.rc, r.out.lines().next()), (0, Some("export NCCL_P2P_LEVEL=PIX")), "{}", r.err);
}

#[test]
fn env_script_prints_copyable_exports_and_refuses_print_with_a_command() {
    let s = scratch("env-print");
    let (prefix, sys) = env_setup(&s);
    let p = script("scripts/gdr-env.sh");
    let env = [("GDR_ENV_SYSFS", sys.to_str().unwrap()), ("LD_PRELOAD", "")];
    let log = "/var/log/my jobs/it's $HOME %h-%p.log";
    let args = [
        "--prefix",
        prefix.to_str().unwrap(),
        "--hca",
        "^=mlx5_1,mlx5_0:7",
        "--shim-log",
        log,
        "--debug",
    ];
    let printed = run(&p, &[&args[..], &["--print"]].concat(), &env);
    assert_eq!(printed.rc, 0, "{}", printed.err);
    assert!(
        printed.out.lines().any(|l| l == "export NCCL_DEBUG_SUBSYS=INIT,NET,P2P,ENV"),
        "commas bare: {}",
        printed.out
    );
    // what a shell gets from the printed lines is exactly what a command run through it gets
    let wanted = run(&p, &[&args[..], &["--", "env"]].concat(), &env);
    assert_eq!(wanted.rc, 0, "{}", wanted.err);
    let names: Vec<&str> = printed
        .out
        .lines()
        .map(|l| l.strip_prefix("export ").unwrap().split('=').next().unwrap())
        .collect();
    assert!(names.contains(&"GDRSHIM_LOG_FILE") && names.contains(&"NCCL_IB_HCA"));
    for shell in ["bash", "sh"] {
        let file = s.join("exports");
        std::fs::write(&file, &printed.out).unwrap();
        let o = Command::new(shell)
            .arg("-c")
            .arg(format!(". {}; env", file.display()))
            .env("HOME", "/home/x")
            .output()
            .unwrap();
        let got = String::from_utf8_lossy(&o.stdout);
        for n in &names {
            let line =
                |t: &str| t.lines().find(|l| l.starts_with(&format!("{n}="))).map(str::to_owned);
            assert_eq!(line(&got), line(&wanted.out), "{shell}: {n}");
        }
        assert!(got.contains(&format!("GDRSHIM_LOG_FILE={log}\n")), "{shell}: {got}");
    }
    // --print with a command: refused, the command not run
    let marker = s.join("ran");
    let cmd = format!("touch {}", marker.display());
    let r = run(&p, &[&args[..], &["--print", "--", "sh", "-c", &cmd]].concat(), &env);
    assert_eq!(r.rc, 2);
    assert!(r.err.contains("ambiguous") && r.out.is_empty(), "{}", r.err);
    let r = run(&p, &[&args[..], &["--", "sh", "-c", &cmd, "--print"]].concat(), &env);
    assert_eq!(r.rc, 0, "after -- everything is the command's: {}", r.err);
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    // sourced, it runs no command: it says so and returns 2, and the shell goes on
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} --mode p2p -- sh -c '{cmd}'; echo \"rc=$? ${{NCCL_P2P_LEVEL:-unset}}\"",
            p.display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "rc=2 unset\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!marker.exists());
}
