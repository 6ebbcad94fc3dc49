//! The release scripts' command lines (issue 17): scripts/dev/build-release.sh, build-deb.sh and
//! check-release.sh answer `-h/--help` (stdout, 0) and `--version`, refuse an unknown option and
//! an option without its value (stderr, 2), and `build-release.sh --out` never deletes a folder it
//! did not build. None of these cases builds anything: each is decided before the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-release-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `bash scripts/dev/NAME ARGS`: exit code, stdout, stderr. `cargo` on its PATH is a stub that
/// says so and exits 97: a case that reached the build shows it instead of building.
fn run(name: &str, args: &[&str]) -> (i32, String, String) {
    let stub = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("release-stub-cargo-{}", std::process::id()));
    std::fs::create_dir_all(&stub).unwrap();
    let cargo = stub.join("cargo");
    if !cargo.exists() {
        let tmp = stub.join(format!("cargo.{:?}", std::thread::current().id()));
        std::fs::write(&tmp, "#!/bin/sh\necho \"stub cargo: $*\" >&2\nexit 97\n").unwrap();
        assert!(Command::new("chmod").arg("0755").arg(&tmp).status().unwrap().success());
        std::fs::rename(&tmp, &cargo).unwrap();
    }
    let path = format!("{}:{}", stub.display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new("bash")
        .arg(root().join("scripts/dev").join(name))
        .args(args)
        .env("PATH", path)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn release_scripts_answer_help_version_and_refuse_bad_arguments() {
    let version = env!("CARGO_PKG_VERSION");
    for (name, word) in [
        ("build-release.sh", "--out DIR"),
        ("build-deb.sh", "--dist DIR"),
        ("check-release.sh", "two .debs"),
    ] {
        for h in ["-h", "--help"] {
            let (rc, out, err) = run(name, &[h]);
            assert_eq!((rc, err.as_str()), (0, ""), "{name} {h}");
            assert!(out.contains(word) && out.contains("Exit status"), "{name} {h}: {out}");
        }
        let (rc, out, _) = run(name, &["--version"]);
        assert_eq!((rc, out), (0, format!("{name} (gdrshim) {version}\n")), "{name} --version");
        let (rc, out, err) = run(name, &["--frobnicate"]);
        assert_eq!((rc, out.as_str()), (2, ""), "{name}: {err}");
        // the one problem and a pointer to --help (issue 31: not the help again)
        assert_eq!(
            err,
            "".to_string()
                + name.trim_end_matches(".sh")
                + ": unknown argument --frobnicate (try --help)\n",
            "{name}"
        );
    }
    for (name, opt) in
        [("build-release.sh", "--out"), ("build-deb.sh", "--dist"), ("build-deb.sh", "--out")]
    {
        let (rc, out, err) = run(name, &[opt]);
        assert_eq!((rc, out.as_str()), (2, ""), "{name} {opt}: {err}");
        assert!(
            err.contains(&format!("{opt} needs a folder")) && !err.contains("unbound variable"),
            "{name} {opt}: {err}"
        );
    }
}

/// `--out` names a folder that holds something the script did not build: refused before the
/// build, with exit 1, and every file left as it was. A file is refused too.
#[test]
fn build_release_refuses_an_out_folder_it_did_not_build() {
    let s = scratch("out");
    let keep = s.join("mine");
    std::fs::create_dir_all(keep.join("sub")).unwrap();
    std::fs::write(keep.join("keepme"), "precious\n").unwrap();
    std::fs::write(keep.join("sub/also"), "precious too\n").unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", keep.to_str().unwrap()]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("not a release this script built") && err.contains("left untouched"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(keep.join("keepme")).unwrap(), "precious\n");
    assert_eq!(std::fs::read_to_string(keep.join("sub/also")).unwrap(), "precious too\n");

    // a release folder of the script with one file its SHA256SUMS does not list is not its own
    let old = s.join("old-release");
    std::fs::create_dir_all(old.join("lib")).unwrap();
    std::fs::write(old.join("BUILD-INFO"), "gdrshim 0.0.1\n").unwrap();
    std::fs::write(old.join("lib/libgdrshim.so"), "x").unwrap();
    let sums = Command::new("sha256sum")
        .args(["BUILD-INFO", "lib/libgdrshim.so"])
        .current_dir(&old)
        .output()
        .unwrap();
    std::fs::write(old.join("SHA256SUMS"), &sums.stdout).unwrap();
    std::fs::write(old.join("notes.txt"), "mine\n").unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", old.to_str().unwrap()]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        old.join("notes.txt").is_file()
            && old.join("lib/libgdrshim.so").is_file()
            && old.join("SHA256SUMS").is_file()
    );
    // an empty folder it does not list is not the script's either
    std::fs::remove_file(old.join("notes.txt")).unwrap();
    std::fs::create_dir(old.join("mine")).unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", old.to_str().unwrap()]);
    assert_eq!(rc, 1, "{err}");
    assert!(old.join("mine").is_dir());
    std::fs::remove_dir(old.join("mine")).unwrap();
    // without the extra file it is the script's own: accepted, so the build starts (the stub
    // cargo stops it) -- and the old release is all there until a new one is built
    // (a failed build is exit 1, whatever cargo's own status: issue 31)
    let (rc, _, err) = run("build-release.sh", &["--out", old.to_str().unwrap()]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("stub cargo: build --release --locked") && err.contains("(cargo exited 97;"),
        "{err}"
    );
    assert!(old.join("lib/libgdrshim.so").is_file() && old.join("SHA256SUMS").is_file());
    // so is an empty folder, and one that does not exist yet
    for fresh in [s.join("empty"), s.join("new/deeper")] {
        let _ = std::fs::create_dir(&fresh);
        let (rc, _, err) = run("build-release.sh", &["--out", fresh.to_str().unwrap()]);
        assert_eq!(rc, 1, "{}: {err}", fresh.display());
        assert!(err.contains("stub cargo: build"), "{}: {err}", fresh.display());
    }

    // what it would delete must lie inside the folder, be regular files and be as listed: a
    // manifest naming ../keep.txt, a lib/ that is a link to another folder, and an edited file
    // are each refused, and every file stays
    let outside = s.join("keep.txt");
    std::fs::write(&outside, "outside\n").unwrap();
    let victim = s.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("libgdrshim.so"), "x").unwrap();
    let planted = s.join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("BUILD-INFO"), "gdrshim 0.0.1\n").unwrap();
    std::os::unix::fs::symlink(&victim, planted.join("lib")).unwrap();
    let sums = Command::new("sh")
        .args(["-c", "sha256sum BUILD-INFO ../keep.txt lib/libgdrshim.so"])
        .current_dir(&planted)
        .output()
        .unwrap();
    std::fs::write(planted.join("SHA256SUMS"), &sums.stdout).unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", planted.to_str().unwrap()]);
    assert_eq!(rc, 1, "a manifest reaching outside, through a link: {err}");
    assert!(outside.is_file() && victim.join("libgdrshim.so").is_file());
    std::fs::write(old.join("lib/libgdrshim.so"), "edited").unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", old.to_str().unwrap()]);
    assert_eq!(rc, 1, "an old release with a file not as listed: {err}");
    assert_eq!(std::fs::read_to_string(old.join("lib/libgdrshim.so")).unwrap(), "edited");

    let file = s.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let (rc, _, err) = run("build-release.sh", &["--out", file.to_str().unwrap()]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("not a folder"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    std::fs::remove_dir_all(&s).unwrap();
}
