//! The start-up benchmark (issue 16): `cargo bench --bench startup [-- N]`. Spawns /bin/true N
//! times per round (default 2000), rounds alternating no preload, a minimal C preload library
//! that wraps ioctl (tests/c/minimal_preload.c) and libgdrshim.so as it ships (the release
//! build, without the test knobs), and prints the per-spawn ratios measured in this one run
//! (gdrshim's goal: ≤ 1.05× the minimal library).

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let n = std::env::args().skip(1).find(|a| a != "--bench").unwrap_or_else(|| "2000".into());
    // the library as it ships (no test knobs), in a scratch folder of its own
    let dir = std::env::temp_dir().join(format!("gdrshim-startup-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env = common::Env { dir, shim: common::shipped() };
    let c = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    common::cc(&env, &["-O2", "-o", "spawnbench", c.join("spawnbench.c").to_str().unwrap()]);
    common::cc(&env, &["-shared", "-fPIC", "-O2", "-o", "libminimal.so", c.join("minimal_preload.c").to_str().unwrap(), "-ldl"]);
    let out = std::process::Command::new(env.dir.join("spawnbench"))
        .args([&n, "/bin/true", env.dir.join("libminimal.so").to_str().unwrap(), env.shim.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    print!("{}", String::from_utf8_lossy(&out.stdout));
}
