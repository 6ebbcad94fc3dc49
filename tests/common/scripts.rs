//! What the tests of the shell scripts share: a scratch folder, a script's run, a command written
//! for a test, and release folders laid out as build-release.sh lays them out (scripts/deploy.sh's
//! and gdr-env.sh's tests).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch folder `$TMP/gdrshim-scripts-TAG-<pid>`.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-scripts-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A script's exit code, stdout and stderr.
pub struct Run {
    pub rc: i32,
    pub out: String,
    pub err: String,
}

/// `bash SCRIPT ARGS` with `env` added.
pub fn run(script: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let o: Output =
        Command::new("bash").arg(script).args(args).envs(env.iter().copied()).output().unwrap();
    Run {
        rc: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A path of the repository.
pub fn script(rel: &str) -> PathBuf {
    root().join(rel)
}

/// Written by a child process, not by this one: an fd of ours open for writing would be inherited
/// by a child another test thread forks meanwhile, and running the file then fails with ETXTBSY
/// (a fake `cc` that "cannot run" made the suite report libibverbs-dev missing).
pub fn write_exe(p: &Path, body: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let ok = Command::new("sh")
        .args(["-c", "printf '%s' \"$1\" > \"$2\" && chmod 0755 \"$2\"", "sh", body])
        .arg(p)
        .status()
        .unwrap();
    assert!(ok.success(), "{}", p.display());
}

/// `bash scripts/SCRIPT ARGS` with `env` added, its CDI folder and its nccl.conf scratch ones:
/// exit code, stdout and stderr together.
pub fn sh(script: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let cdi = std::env::temp_dir().join(format!("gdrshim-deploy-cdi-{}", std::process::id())); // not the machine's /etc/cdi
                                                                                               // nor its /etc/nccl.conf (a test that looks at the file names its own)
    let nccl =
        std::env::temp_dir().join(format!("gdrshim-deploy-nccl-{}.conf", std::process::id()));
    let mut c = Command::new("bash");
    c.arg(root().join("scripts").join(script))
        .args(args)
        .env("GDR_DEPLOY_CDI_DIR", cdi)
        .env("GDR_DEPLOY_NCCL_CONF", nccl)
        .envs(env.iter().copied());
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

/// A release folder laid out as build-release.sh does, with `version` in BUILD-INFO.
pub fn dist(at: &Path, version: &str) -> PathBuf {
    dist_with(at, version, None)
}

/// The same, with a real library (so that LD_PRELOAD of it works).
pub fn dist_with(at: &Path, version: &str, lib: Option<&Path>) -> PathBuf {
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
        std::fs::copy(super::front_pair(core, false), d.join("lib/libgdrshim.so")).unwrap();
        std::fs::copy(core, d.join("lib/libgdrshim-core.so")).unwrap();
    }
    std::fs::create_dir_all(d.join("scripts")).unwrap();
    for f in ["gdr-env.sh", "gdrshim-version.sh"] {
        std::fs::copy(root().join("scripts").join(f), d.join("scripts").join(f)).unwrap();
    }
    manifest(&d);
    d
}

pub fn manifest(d: &Path) {
    let st = Command::new("bash")
        .arg("-c")
        .arg("find . -type f ! -name SHA256SUMS -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum > SHA256SUMS")
        .current_dir(d)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Every path under `p` with its link target or content hash: "exactly as it was".
pub fn snapshot(p: &Path) -> String {
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

/// Where the link `p` points, or "" when it is none.
pub fn link(p: &Path) -> String {
    std::fs::read_link(p).map(|l| l.display().to_string()).unwrap_or_default()
}

/// The one release folder of `version` under `prefix`/releases (VERSION-<12 hex digits>).
pub fn release_named(prefix: &Path, version: &str) -> String {
    let mut v: Vec<String> = std::fs::read_dir(prefix.join("releases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{version}-")) && n.len() == version.len() + 13)
        .collect();
    assert_eq!(v.len(), 1, "{version}: {v:?}");
    v.pop().unwrap()
}
