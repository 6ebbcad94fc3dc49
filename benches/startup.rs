//! The start-up benchmark (issue 16): `cargo bench --bench startup [-- N [ROUNDS]]`. Spawns
//! /bin/true N times per round (default 200, in 100 rounds), rounds timing no preload, a minimal C preload library
//! that wraps ioctl (tests/c/minimal_preload.c), libgdrshim.so as it ships (the front, src/front,
//! with the core beside it; then again with the core preloaded itself, as before the front) and
//! the same wrapper in Rust built as the core is
//! (tests/rust/floor_preload.rs: std, fat LTO, the static unwinder), and prints the per-spawn
//! ratios measured in this one run, as totals and as the median of the per-round ratios
//! (gdrshim's goal: ≤ 1.05× the minimal library). The Rust wrapper's ratio is what std alone
//! costs, which the front does without; with the core preloaded itself, gdrshim/floor is the
//! core's own share. With valgrind installed it also counts the
//! user-space instructions of one exec under each (callgrind), a figure that does not move, and
//! under a third yardstick, the wrapper without std (tests/rust/nostd_preload.rs).

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let n = args.first().cloned().unwrap_or_else(|| "200".into());
    let rounds = args.get(1).cloned().unwrap_or_else(|| "100".into());
    // the library as it ships (no test knobs), in a scratch folder of its own
    let dir = std::env::temp_dir().join(format!("gdrshim-startup-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // as a release ships them: the front (src/front) with the core beside it
    let core = common::shipped();
    let env = common::Env { dir, shim: common::front_pair(&core, false) };
    let c = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    common::cc(&env, &["-O2", "-o", "spawnbench", c.join("spawnbench.c").to_str().unwrap()]);
    common::cc(
        &env,
        &[
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            "libminimal.so",
            c.join("minimal_preload.c").to_str().unwrap(),
            "-ldl",
        ],
    );
    let floor = build_floor(&env.dir);
    for (what, lib) in [
        ("libgdrshim.so as it ships (the front)", &env.shim),
        ("the core preloaded itself (target/release/libgdrshim.so)", &core),
    ] {
        println!("gdrshim = {what}:");
        let out = std::process::Command::new(env.dir.join("spawnbench"))
            .args([
                &n,
                "/bin/true",
                env.dir.join("libminimal.so").to_str().unwrap(),
                lib.to_str().unwrap(),
                floor.to_str().unwrap(),
                &rounds,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    let nostd = build_nostd(&env.dir);
    instructions(
        &env.dir,
        &[
            ("none", None),
            ("minimal", Some(env.dir.join("libminimal.so"))),
            ("gdrshim", Some(env.shim.clone())),
            ("core", Some(core)),
            ("floor", Some(floor)),
            ("nostd", Some(nostd)),
        ],
    );
}

/// The user-space instructions of one exec of /bin/true under each library, counted by callgrind:
/// the same every run, unlike the times above, which a shared machine moves by several percent.
/// Most of a library's count is the loader's symbol lookups for it. Kernel work (mappings, page
/// faults) is not counted. Skipped, and said so, without valgrind.
fn instructions(dir: &std::path::Path, libs: &[(&str, Option<std::path::PathBuf>)]) {
    let out = dir.join("callgrind.out");
    let mut counts = Vec::new();
    for (name, lib) in libs {
        let mut c = std::process::Command::new("valgrind");
        c.args([
            "--tool=callgrind",
            &format!("--callgrind-out-file={}", out.display()),
            "/bin/true",
        ]);
        if let Some(l) = lib {
            c.env("LD_PRELOAD", l);
        }
        let Ok(o) = c.output() else {
            println!("instructions per exec: not counted (no valgrind)");
            return;
        };
        let err = String::from_utf8_lossy(&o.stderr);
        let n = err
            .lines()
            .find_map(|l| l.split("Collected :").nth(1))
            .and_then(|v| v.trim().parse::<u64>().ok());
        let Some(n) = n else { panic!("callgrind gave no count for {name}: {err}") };
        counts.push((*name, n));
    }
    let get = |k: &str| counts.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
    let none = get("none");
    println!("instructions per exec of /bin/true (callgrind, user space):");
    for (name, n) in &counts {
        println!("  {name:<8} {n:>8}  added {:>6}", n - none);
    }
    println!(
        "  gdrshim - minimal {} (the front's own)  core - floor {} (the core's own)  floor - minimal {} (std's)  nostd - minimal {} (a wrapper without std)",
        get("gdrshim") as i64 - get("minimal") as i64,
        get("core") as i64 - get("floor") as i64,
        get("floor") as i64 - get("minimal") as i64,
        get("nostd") as i64 - get("minimal") as i64
    );
}

/// tests/rust/nostd_preload.rs: no std, so panics abort (there is no unwinder to catch them with).
fn build_nostd(dir: &std::path::Path) -> std::path::PathBuf {
    rustc_cdylib(
        "nostd_preload",
        &dir.join("libnostd.so"),
        &["-C", "opt-level=3", "-C", "panic=abort"],
    )
}

/// Builds tests/rust/NAME.rs with rustc alone (no crates) as the cdylib `so`.
fn rustc_cdylib(name: &str, so: &std::path::Path, flags: &[&str]) -> std::path::PathBuf {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/rust/{name}.rs"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let st = std::process::Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", name])
        .args(flags)
        .arg("-o")
        .arg(so)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "rustc {}", src.display());
    so.to_path_buf()
}

/// tests/rust/floor_preload.rs as libgdrshim.so is built: the release profile's codegen, and
/// libgcc's static unwinder in place of libgcc_s.so.1 (build.rs's reason and method).
fn build_floor(dir: &std::path::Path) -> std::path::PathBuf {
    let unwind = dir.join("static-unwind");
    std::fs::create_dir_all(&unwind).unwrap();
    let eh = std::process::Command::new("cc").arg("-print-file-name=libgcc_eh.a").output().unwrap();
    let eh = std::path::PathBuf::from(String::from_utf8_lossy(&eh.stdout).trim());
    assert!(
        eh.is_absolute() && eh.is_file(),
        "no libgcc_eh.a: the floor would load libgcc_s.so.1, which libgdrshim.so does not"
    );
    std::fs::copy(&eh, unwind.join("libgcc_s.a")).unwrap();
    let native = format!("native={}", unwind.display());
    rustc_cdylib(
        "floor_preload",
        &dir.join("libfloor.so"),
        &[
            "-C",
            "opt-level=3",
            "-C",
            "codegen-units=1",
            "-C",
            "lto=fat",
            "-C",
            "panic=unwind",
            "-L",
            &native,
        ],
    )
}
