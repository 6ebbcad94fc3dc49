//! The start-up benchmark (issue 16): `cargo bench --bench startup [-- N [ROUNDS]]`. Spawns
//! /bin/true N times per round (default 200, in 100 rounds), rounds timing no preload, a minimal C preload library
//! that wraps ioctl (tests/c/minimal_preload.c), libgdrshim.so as it ships (the release build,
//! without the test knobs) and the same wrapper in Rust built as libgdrshim.so is
//! (tests/rust/floor_preload.rs: std, fat LTO, the static unwinder), and prints the per-spawn
//! ratios measured in this one run, as totals and as the median of the per-round ratios
//! (gdrshim's goal: ≤ 1.05× the minimal library). The Rust wrapper's ratio is what std alone
//! costs; gdrshim/floor is gdrshim's own share.

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let n = args.first().cloned().unwrap_or_else(|| "200".into());
    let rounds = args.get(1).cloned().unwrap_or_else(|| "100".into());
    // the library as it ships (no test knobs), in a scratch folder of its own
    let dir = std::env::temp_dir().join(format!("gdrshim-startup-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env = common::Env { dir, shim: common::shipped() };
    let c = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    common::cc(&env, &["-O2", "-o", "spawnbench", c.join("spawnbench.c").to_str().unwrap()]);
    common::cc(&env, &["-shared", "-fPIC", "-O2", "-o", "libminimal.so", c.join("minimal_preload.c").to_str().unwrap(), "-ldl"]);
    let floor = build_floor(&env.dir);
    let out = std::process::Command::new(env.dir.join("spawnbench"))
        .args([
            &n,
            "/bin/true",
            env.dir.join("libminimal.so").to_str().unwrap(),
            env.shim.to_str().unwrap(),
            floor.to_str().unwrap(),
            &rounds,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

/// tests/rust/floor_preload.rs as libgdrshim.so is built: the release profile's codegen, and
/// libgcc's static unwinder in place of libgcc_s.so.1 (build.rs's reason and method).
fn build_floor(dir: &std::path::Path) -> std::path::PathBuf {
    let unwind = dir.join("static-unwind");
    std::fs::create_dir_all(&unwind).unwrap();
    let eh = std::process::Command::new("cc").arg("-print-file-name=libgcc_eh.a").output().unwrap();
    let eh = std::path::PathBuf::from(String::from_utf8_lossy(&eh.stdout).trim());
    assert!(eh.is_absolute() && eh.is_file(), "no libgcc_eh.a: the floor would load libgcc_s.so.1, which libgdrshim.so does not");
    std::fs::copy(&eh, unwind.join("libgcc_s.a")).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rust/floor_preload.rs");
    let so = dir.join("libfloor.so");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let st = std::process::Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", "floor_preload"])
        .args(["-C", "opt-level=3", "-C", "codegen-units=1", "-C", "lto=fat", "-C", "panic=unwind"])
        .arg("-L")
        .arg(format!("native={}", unwind.display()))
        .arg("-o")
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "rustc {}", src.display());
    so
}
