//! The release as it ships and its .deb (issue 17): the release folder holds the replay tool, the
//! README and both licence texts, all in its SHA256SUMS, and no program in it but libgdrshim.so
//! exports a hook; the .deb is the same bytes when built twice, holds the release folder exactly
//! where scripts/deploy.sh installs it, and dpkg installs it into a scratch root (`dpkg --root`,
//! never this machine's /), where `current` is switched, `dpkg -S`, `dpkg --verify` and a hold
//! work, and removing it puts `current` back to the previous release and leaves nothing behind.
//!
//! dpkg runs as the caller (`--force-not-root`) and runs the maintainer scripts outside a chroot
//! (`--force-script-chrootless`, the scripts honour DPKG_ROOT), so this needs no root. Its
//! NCCL_NET_FORCE_FLUSH=1 line in the scratch root's /etc/nccl.conf is written on configure
//! where a GPU needs it, and removed, alone, with the package.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::scripts::{dist, manifest, write_exe};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd`: exit code and stdout+stderr.
fn run(cmd: &mut Command) -> (i32, String) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

fn ok(cmd: &mut Command) -> String {
    let (rc, out) = run(cmd);
    assert_eq!(rc, 0, "{cmd:?}: {out}");
    out
}

/// dpkg acting on the scratch root `r` only: its database, its files, its log.
fn dpkg(r: &Path) -> Command {
    assert!(
        r.starts_with(std::env::temp_dir()) && r.join("var/lib/dpkg/status").is_file(),
        "not a scratch root: {}",
        r.display()
    );
    let mut c = Command::new("dpkg");
    c.arg(format!("--root={}", r.display()))
        .arg(format!("--log={}", r.join("dpkg.log").display()))
        .args(["--force-not-root", "--force-script-chrootless"])
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    c
}

fn scratch_root(at: &Path) -> PathBuf {
    let r = at.to_path_buf();
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    r
}

fn link(p: &Path) -> Option<String> {
    std::fs::read_link(p).ok().map(|t| t.to_string_lossy().into_owned())
}

/// A second release, as deploy.sh installs it: the same files, another version.
fn other_release(dist: &Path, at: &Path) -> PathBuf {
    ok(Command::new("cp").arg("-a").arg(dist).arg(at));
    let info = std::fs::read_to_string(at.join("BUILD-INFO")).unwrap();
    std::fs::write(
        at.join("BUILD-INFO"),
        info.replacen(&format!("gdrshim {}", env!("CARGO_PKG_VERSION")), "gdrshim 0.0.1", 1),
    )
    .unwrap();
    ok(Command::new("sh")
        .arg("-c")
        .arg("find . -type f ! -name SHA256SUMS -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum > SHA256SUMS")
        .current_dir(at));
    at.to_path_buf()
}

#[test]
fn the_release_and_its_deb_install_verify_and_remove_in_a_scratch_root() {
    assert!(
        Command::new("dpkg-deb").arg("--version").output().is_ok(),
        "dpkg-deb is needed (Ubuntu: the dpkg package)"
    );
    let s = std::env::temp_dir().join(format!("gdrshim-release-deb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&s);
    std::fs::create_dir_all(&s).unwrap();
    let dist = s.join("dist");
    ok(Command::new("bash")
        .arg(root().join("scripts/dev/build-release.sh"))
        .arg("--out")
        .arg(&dist));

    // what the release holds, each file listed and intact
    ok(Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet", "SHA256SUMS"])
        .current_dir(&dist));
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let listed: Vec<&str> = sums.lines().map(|l| &l[66..]).collect();
    for f in [
        "bin/gdrshim-replay",
        "bin/gdrshim-tool",
        "lib/libgdrshim.so",
        "lib/libgdrshim-core.so",
        "README.md",
        "CHANGELOG.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "BUILD-INFO",
    ] {
        assert!(listed.contains(&f), "SHA256SUMS lacks {f}: {listed:?}");
    }
    // the release's front loads the release's core beside it (a query wakes it)
    let probe = s.join("probe");
    ok(Command::new("cc").arg("-o").arg(&probe).arg(root().join("tests/c/secure_probe.c")));
    let out = ok(Command::new(&probe)
        .env("LD_PRELOAD", dist.join("lib/libgdrshim.so"))
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_SUMMARY", "0"));
    assert!(
        out.starts_with("secure=0 loaded=1 mode=3\n"),
        "the front answered without its core: {out}"
    );
    for (f, text) in [
        ("LICENSE-MIT", "Copyright (c) the gdrshim developers"),
        ("LICENSE-APACHE", "Apache License"),
        ("README.md", "sha256sum -c --strict SHA256SUMS"),
        ("CHANGELOG.md", &format!("## {} (", env!("CARGO_PKG_VERSION"))),
    ] {
        assert!(std::fs::read_to_string(dist.join(f)).unwrap().contains(text), "{f}");
    }
    let readme = std::fs::read_to_string(dist.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("gdrshim_{}_amd64.deb", env!("CARGO_PKG_VERSION")))
            && !readme.contains("@VERSION@"),
        "{readme}"
    );
    let (rc, out) = run(Command::new(dist.join("bin/gdrshim-replay"))
        .arg("--quiet")
        .arg(root().join("tests/fixtures/alloc-probe.cap.gz")));
    assert!(
        rc == 0 && out.contains("mismatched=0"),
        "the shipped replay tool reads a shipped capture: {out}"
    );
    for bin in ["bin/gdrshim-replay", "bin/gdrshim-tool"] {
        let syms = ok(Command::new("nm").args(["-D", "--defined-only"]).arg(dist.join(bin)));
        for hook in [" ioctl", " open64", " dlsym", " close"] {
            assert!(!syms.lines().any(|l| l.ends_with(hook)), "{bin} exports{hook}: {syms}");
        }
    }

    // built again into the same folder: the old release is replaced, nothing else touched
    std::fs::write(s.join("neighbour"), "mine\n").unwrap();
    ok(Command::new("bash")
        .arg(root().join("scripts/dev/build-release.sh"))
        .arg("--out")
        .arg(&dist));
    assert_eq!(std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap(), sums, "reproducible");
    assert_eq!(std::fs::read_to_string(s.join("neighbour")).unwrap(), "mine\n");

    // the .deb, twice: the same bytes
    let build_deb = |out: &Path| {
        ok(Command::new("bash")
            .arg(root().join("scripts/dev/build-deb.sh"))
            .arg("--dist")
            .arg(&dist)
            .arg("--out")
            .arg(out));
        out.join(format!("gdrshim_{}_amd64.deb", env!("CARGO_PKG_VERSION")))
    };
    let deb = build_deb(&s.join("deb-a"));
    let again = build_deb(&s.join("deb-b"));
    assert!(
        std::fs::read(&deb).unwrap() == std::fs::read(&again).unwrap(),
        "two .debs of one release differ"
    );
    let (_, contents) = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    assert!(contents.lines().all(|l| l.contains(" root/root ")), "{contents}");
    // the maintainer scripts are clean POSIX sh
    let control = s.join("control");
    ok(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    if Command::new("shellcheck").arg("--version").output().is_ok() {
        ok(Command::new("shellcheck")
            .args(["-s", "sh"])
            .arg(control.join("postinst"))
            .arg(control.join("prerm"))
            .arg(control.join("postrm")));
    }

    // deploy.sh names the same release the same way
    let p2 = s.join("deployed");
    let cdi = s.join("cdi");
    let out = ok(Command::new("bash")
        .arg(root().join("scripts/deploy.sh"))
        .env("GDR_DEPLOY_NCCL_CONF", s.join("nccl.conf"))
        .arg("--prefix")
        .arg(&p2)
        .arg("--cdi-dir")
        .arg(&cdi)
        .arg(&dist));
    let name = link(&p2.join("current")).expect("deploy.sh made current");
    assert!(name.starts_with(&format!("releases/{}-", env!("CARGO_PKG_VERSION"))), "{name}");
    // and the CDI spec of it, by the release's own tool (issue 41)
    let spec = |at: &Path| std::fs::read_to_string(at.join("gdrshim.json")).unwrap_or_default();
    assert!(
        out.contains(&format!("deploy: {}/gdrshim.json written for containers", cdi.display())),
        "{out}"
    );
    assert!(
        spec(&cdi).contains(&format!(
            "\"hostPath\": \"{}/{name}\"",
            p2.canonicalize().unwrap().display()
        )),
        "{}",
        spec(&cdi)
    );
    let out = ok(Command::new("bash")
        .arg(root().join("scripts/deploy.sh"))
        .env("GDR_DEPLOY_NCCL_CONF", s.join("nccl.conf"))
        .arg("--prefix")
        .arg(&p2)
        .arg("--cdi-dir")
        .arg(&cdi)
        .arg("--uninstall"));
    assert!(!cdi.join("gdrshim.json").exists(), "removed with the releases: {out}");

    // a scratch root with an older release that deploy.sh installed: the .deb's becomes current,
    // that one previous
    let r = scratch_root(&s.join("root"));
    let prefix = r.join("opt/rtx4090-gdr");
    let old = other_release(&dist, &s.join("dist-old"));
    ok(Command::new("bash")
        .arg(root().join("scripts/deploy.sh"))
        .env("GDR_DEPLOY_NCCL_CONF", r.join("etc/nccl.conf"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--cdi-dir")
        .arg(r.join("etc/cdi"))
        .arg(&old));
    let old_name = link(&prefix.join("current")).unwrap();
    assert_ne!(old_name, name);
    let out = ok(dpkg(&r).arg("--force-depends").arg("-i").arg(&deb));
    assert!(out.contains("Setting up gdrshim"), "{out}");
    assert_eq!(link(&prefix.join("current")).as_deref(), Some(name.as_str()), "{out}");
    assert_eq!(link(&prefix.join("previous")).as_deref(), Some(old_name.as_str()));
    let in_spec =
        |rel: &str| format!("\"hostPath\": \"{}/{rel}\"", prefix.canonicalize().unwrap().display());
    assert!(
        spec(&r.join("etc/cdi")).contains(&in_spec(&name)),
        "the package's release in the CDI spec: {out}"
    );
    let installed = prefix.join(&name);
    ok(Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet", "SHA256SUMS"])
        .current_dir(&installed));
    let (rc, diff) = run(Command::new("diff").arg("-r").arg(&dist).arg(&installed));
    assert_eq!(rc, 0, "the installed release is the release folder: {diff}");
    let lib = format!("/opt/rtx4090-gdr/{name}/lib/libgdrshim.so");
    assert_eq!(ok(dpkg(&r).args(["-S", &lib])), format!("gdrshim: {lib}\n"));
    assert_eq!(ok(dpkg(&r).args(["--verify", "gdrshim"])), "", "every file as shipped");
    // --verify sees a changed file
    let readme_path = installed.join("README.md");
    std::fs::write(&readme_path, "changed\n").unwrap();
    let (_, v) = run(dpkg(&r).args(["--verify", "gdrshim"]));
    let changed = format!("/opt/rtx4090-gdr/{name}/README.md");
    assert!(v.lines().any(|l| l.starts_with("??5") && l.ends_with(&changed)), "{v}");
    std::fs::write(&readme_path, &readme).unwrap();
    assert_eq!(ok(dpkg(&r).args(["--verify", "gdrshim"])), "");
    // a hold, as apt-mark sets it (dpkg's selections; apt-mark itself where apt is installed)
    let status = r.join("var/lib/dpkg/status");
    let hold = Command::new("apt-mark")
        .arg("-o")
        .arg(format!("Dir::State::status={}", status.display()))
        .arg("-o")
        .arg(format!("DPkg::Options::=--root={}", r.display()))
        .args(["hold", "gdrshim"])
        .output();
    if !hold.is_ok_and(|o| o.status.success()) {
        let mut c = dpkg(&r);
        c.arg("--set-selections").stdin(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"gdrshim hold\n").unwrap();
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(
        ok(dpkg(&r).args(["--get-selections", "gdrshim"])).split_whitespace().collect::<Vec<_>>(),
        ["gdrshim", "hold"]
    );

    // removed: current back to the older release, the package's release gone, nothing else
    let out = ok(dpkg(&r).args(["-r", "gdrshim"]));
    assert_eq!(link(&prefix.join("current")).as_deref(), Some(old_name.as_str()), "{out}");
    assert!(link(&prefix.join("previous")).is_none(), "{out}");
    assert!(!installed.exists(), "{out}");
    assert!(
        spec(&r.join("etc/cdi")).contains(&in_spec(&old_name)),
        "the spec follows current back: {out}"
    );
    ok(Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet", "SHA256SUMS"])
        .current_dir(prefix.join(&old_name)));
    assert_ne!(run(dpkg(&r).args(["-S", &lib])).0, 0, "dpkg no longer knows the file");

    // alone in a fresh root, as an upgrade of an older .deb: current follows the package, the
    // older release goes with it (dpkg removes its files), no link is left naming it; purged,
    // the whole tree is gone
    ok(Command::new("bash")
        .arg(root().join("scripts/dev/build-deb.sh"))
        .arg("--dist")
        .arg(&old)
        .arg("--out")
        .arg(s.join("deb-old")));
    let old_deb = s.join("deb-old/gdrshim_0.0.1_amd64.deb");
    let r2 = scratch_root(&s.join("root2"));
    ok(dpkg(&r2).arg("--force-depends").arg("-i").arg(&old_deb));
    assert_eq!(link(&r2.join("opt/rtx4090-gdr/current")).as_deref(), Some(old_name.as_str()));
    // unpacked, not yet configured (the moment the older release's files are gone): current
    // already names the new release, never a removed one
    let out = ok(dpkg(&r2).arg("--force-depends").arg("--unpack").arg(&deb));
    assert!(
        out.contains(&format!("Unpacking gdrshim ({}) over (0.0.1)", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(!r2.join("opt/rtx4090-gdr").join(&old_name).exists(), "{out}");
    assert_eq!(link(&r2.join("opt/rtx4090-gdr/current")).as_deref(), Some(name.as_str()), "{out}");
    let out = ok(dpkg(&r2).args(["--force-depends", "--configure", "gdrshim"]));
    assert_eq!(link(&r2.join("opt/rtx4090-gdr/current")).as_deref(), Some(name.as_str()), "{out}");
    assert!(link(&r2.join("opt/rtx4090-gdr/previous")).is_none(), "{out}");
    assert!(!r2.join("opt/rtx4090-gdr").join(&old_name).exists(), "{out}");
    assert_eq!(ok(dpkg(&r2).args(["--verify", "gdrshim"])), "");
    assert!(r2.join("etc/cdi/gdrshim.json").exists(), "{out}");
    ok(dpkg(&r2).args(["--purge", "gdrshim"]));
    assert!(!r2.join("opt/rtx4090-gdr").exists(), "the tree is gone");
    assert!(!r2.join("etc/cdi/gdrshim.json").exists(), "no spec of a release that is gone");
    assert!(!r2.join("usr/share/doc/gdrshim").exists());
    std::fs::remove_dir_all(&s).unwrap();
}

#[test]
fn the_debs_nccl_line_is_written_on_configure_and_removed_with_the_package() {
    let s = std::env::temp_dir().join(format!("gdrshim-deb-nccl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&s);
    std::fs::create_dir_all(&s).unwrap();
    // a release whose tool answers gpu-facts as FAKE_GPU_FACTS says (this machine has no GPU)
    let d = dist(&s, "1.0.0");
    write_exe(
        &d.join("bin/gdrshim-tool"),
        "#!/bin/sh\n[ \"$1\" = gpu-facts ] || exit 2\nprintf 'INFO gpu.0 facts\\n     | %s\\n' \"$FAKE_GPU_FACTS\"\n",
    );
    manifest(&d);
    ok(Command::new("bash")
        .arg(root().join("scripts/dev/build-deb.sh"))
        .arg("--dist")
        .arg(&d)
        .arg("--out")
        .arg(s.join("deb")));
    let deb = s.join("deb/gdrshim_1.0.0_amd64.deb");
    let site = "# the site's\nNCCL_DEBUG=WARN\n";
    let ours = "# added by gdrshim 1.0.0: NCCL's receive flush forced for GPUDirect RDMA on GPUs sm_120 (118 = 0) (removed with gdrshim)\nNCCL_NET_FORCE_FLUSH=1\n";
    for (facts, written) in [
        ("sm=120 writes_ordering=0 needs_forced_flush=1", true),
        ("sm=89 writes_ordering=0 needs_forced_flush=0", false),
        ("sm=90 writes_ordering=100 needs_forced_flush=0", false),
    ] {
        let r = scratch_root(&s.join(format!("root-{}", &facts[..5])));
        let conf = r.join("etc/nccl.conf");
        std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
        std::fs::write(&conf, site).unwrap();
        let out =
            ok(dpkg(&r).arg("--force-depends").arg("-i").arg(&deb).env("FAKE_GPU_FACTS", facts));
        let want = if written { format!("{site}{ours}") } else { site.to_string() };
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), want, "{facts}: {out}");
        // the site adds a line after ours; removing the package takes ours alone
        let later = format!("{want}NCCL_SOCKET_IFNAME=eth0\n");
        std::fs::write(&conf, &later).unwrap();
        let out = ok(dpkg(&r).args(["-r", "gdrshim"]));
        assert_eq!(
            std::fs::read_to_string(&conf).unwrap(),
            format!("{site}NCCL_SOCKET_IFNAME=eth0\n"),
            "{facts}: {out}"
        );
    }
    // the site's own value is left alone, through install and removal
    let r = scratch_root(&s.join("root-site"));
    let conf = r.join("etc/nccl.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let own = "NCCL_NET_FORCE_FLUSH=0\n";
    std::fs::write(&conf, own).unwrap();
    let facts = ("FAKE_GPU_FACTS", "sm=120 writes_ordering=0 needs_forced_flush=1");
    let out = ok(dpkg(&r).arg("--force-depends").arg("-i").arg(&deb).env(facts.0, facts.1));
    assert!(out.contains("it sets NCCL_NET_FORCE_FLUSH itself"), "{out}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), own);
    ok(dpkg(&r).args(["--purge", "gdrshim"]));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), own);
    let _ = std::fs::remove_dir_all(&s);
}
