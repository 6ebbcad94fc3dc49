//! The front library (src/front), which ships as libgdrshim.so: what the loader sees of it, that
//! it hooks exactly what the core hooks, and what it does without a core. The rest of its
//! behaviour is the whole suite run through it (GDRSHIM_TEST_VIA_FRONT=1, scripts/dev/test.sh).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

mod common;

fn dynamic_symbols(file: &Path, defined: bool) -> BTreeSet<String> {
    let flag = if defined { "--defined-only" } else { "--undefined-only" };
    let out = Command::new("nm").args(["-D", flag]).arg(file).output().expect("nm (binutils)");
    assert!(out.status.success(), "nm {}", file.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|s| s.split('@').next().unwrap().to_string())
        .collect()
}

fn readelf_dynamic(file: &Path) -> String {
    let out = Command::new("readelf").arg("-d").arg(file).output().expect("readelf (binutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_front_exports_every_hook_of_the_core_and_nothing_else() {
    let core = common::shipped();
    let front = common::front_pair(&core, false);
    let mut want = dynamic_symbols(&core, true);
    assert!(want.remove("gdrshim_core_attach"), "the core exports its attach function");
    let have = dynamic_symbols(&front, true);
    assert_eq!(have, want, "the front's exports against the core's");
    assert!(
        have.contains("ioctl")
            && have.contains("ibv_reg_mr")
            && have.contains("cuGetProcAddress_v2")
            && have.contains("dlsym")
    );
}

/// What every process of a job pays for the front (issue 16's start-up): libc only, and a handful
/// of names for the loader to look up (each lookup is about 700 instructions per exec).
#[test]
fn the_front_is_small_and_needs_only_libc() {
    let front = common::front_pair(&common::shipped(), false);
    let dynamic = readelf_dynamic(&front);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert_eq!(needed.len(), 1, "{dynamic}");
    assert!(needed[0].contains("[libc.so.6]"), "{dynamic}");
    let imports = dynamic_symbols(&front, false);
    let strong: Vec<_> = imports
        .iter()
        .filter(|s| !s.starts_with("_ITM") && *s != "__gmon_start__" && *s != "__cxa_finalize")
        .collect();
    assert!(strong.len() <= 16, "{} imports: {strong:?}", strong.len());
    assert!(
        !imports.iter().any(|s| s.contains("pthread") || s.starts_with("_Unwind")),
        "no std runtime: {imports:?}"
    );
    let size = std::fs::metadata(&front).unwrap().len();
    assert!(size < 100_000, "{size} bytes");
}

#[test]
fn the_front_and_the_core_are_one_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let front = std::fs::read_to_string(root.join("src/front/Cargo.toml")).unwrap();
    let line = front.lines().find(|l| l.starts_with("version = ")).unwrap();
    assert_eq!(
        line,
        format!("version = \"{}\"", env!("CARGO_PKG_VERSION")),
        "src/front/Cargo.toml"
    );
}

/// A front whose core is missing (a partial copy) forwards every call, says so once on stderr
/// when the process first touches a GPU, and stays silent in a process that never does.
#[test]
fn without_its_core_the_front_forwards_and_says_so_once() {
    let e = common::build("front-alone");
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let src = |f: &str| c.join(f).to_str().unwrap().to_string();
    common::cc(
        &e,
        &["-shared", "-fPIC", "-O1", "-o", "libcountstat.so", &src("countstat.c"), "-ldl"],
    );
    common::fakes::Fakes::in_dir(&e.dir).fakerm();
    common::cc(&e, &["-O1", "-o", "quiet", &src("quiet.c"), "-ldl"]);
    let dev = e.dir.join("dev");
    for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
        std::fs::write(dev.join(f), b"").unwrap();
    }
    let alone = e.dir.join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(common::front_pair(&common::knobs_core(), true), alone.join("libgdrshim.so"))
        .unwrap();
    let run = |args: &[&str]| {
        let preload = format!(
            "{}:{}:{}",
            alone.join("libgdrshim.so").display(),
            e.dir.join("libcountstat.so").display(),
            e.dir.join("libfakerm.so").display()
        );
        let out = Command::new(e.dir.join("quiet"))
            .args(args)
            .env("LD_PRELOAD", preload)
            .env("GDRSHIM_TEST_DEV_DIR", &dev)
            .env("GDRSHIM_MODE", "register")
            .output()
            .unwrap();
        let (o, err) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{o}{err}");
        (o, err)
    };
    let (o, err) = run(&["nvidia", dev.to_str().unwrap()]);
    assert!(
        o.contains("quiet nvidia ok=1000 ") && o.contains(" core=0"),
        "every ioctl forwarded to the driver: {o}"
    );
    assert!(
        o.contains(" errno_kept=1000"),
        "the failed load of the core left errno as it was: {o}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("gdrshim: cannot load ")
            && err.contains("libgdrshim-core.so")
            && err.contains("its hooks only forward"),
        "{err}"
    );
    let (o, err) = run(&["plain"]);
    assert!(o.contains("quiet plain ") && o.contains(" core=0"), "{o}");
    assert_eq!(err, "", "no GPU touched, nothing said");
}

/// test.sh runs the integration tests through the front a second time, leaving out the files it
/// lists as never loading gdrshim through tests/common's `build()` (where GDRSHIM_TEST_VIA_FRONT
/// is read): each of them must exist and name none of what reaches `build()`.
#[test]
fn the_second_pass_leaves_out_only_tests_that_the_front_cannot_change() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suite = std::fs::read_to_string(root.join("scripts/dev/test.sh")).unwrap();
    let at = suite.find("front_independent=(").expect("test.sh lists front_independent");
    let list = &suite[at + "front_independent=(".len()..];
    let list: Vec<&str> = list[..list.find(')').unwrap()].split_whitespace().collect();
    assert!(list.len() > 5 && list.contains(&"release_deb"), "{list:?}");
    let reaches_build =
        ["common::build", "build(\"", "rig::", "player::", "via_front", "GDRSHIM_TEST_VIA_FRONT"];
    for t in &list {
        let text = std::fs::read_to_string(root.join(format!("tests/{t}.rs")))
            .unwrap_or_else(|e| panic!("tests/{t}.rs: {e}"));
        for r in reaches_build {
            assert!(!text.contains(r), "tests/{t}.rs names `{r}`: it runs through the front, so test.sh must not leave it out");
        }
    }
    // and the check itself sees a file that does
    let routes = std::fs::read_to_string(root.join("tests/routes.rs")).unwrap();
    assert!(
        reaches_build.iter().any(|r| routes.contains(r)),
        "tests/routes.rs loads gdrshim through build()"
    );
}
