//! A program probing whether CUDA or verbs is loaded (`dlsym(RTLD_DEFAULT, NAME)`, tests/c/
//! dlprobe.c) gets the answer it gets without gdrshim: none, with dlerror's "undefined symbol",
//! while no loaded object defines the name; the definition once the fake libcuda, libibverbs and
//! libmlx5 are loaded. On 9772aec every name answered gdrshim's own hook.

mod common;
use common::rig;
use std::process::Command;

#[test]
fn a_probe_for_cuda_or_verbs_answers_as_without_gdrshim() {
    let e = rig::build("dlprobe", &["dlprobe"]);
    let run = |preload: bool| {
        let mut c = Command::new(e.dir.join("dlprobe"));
        c.env("LD_LIBRARY_PATH", e.dir.join("verbs-new"))
            .env("FAKE_LIBCUDA", e.dir.join("libcuda.so.1"))
            .env("GDRSHIM_LOG_LEVEL", "warn");
        if preload {
            c.env("LD_PRELOAD", &e.shim);
        }
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let (without, with) = (run(false), run(true));
    let answers = |t: &str| -> Vec<String> {
        t.lines().map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect()
    };
    assert_eq!(answers(&with), answers(&without), "with gdrshim:\n{with}\nwithout:\n{without}");
    assert!(
        without.contains("cuMemAlloc_v2 before none")
            && without.contains("cuMemAlloc_v2 after found")
    );
    for l in with.lines().filter(|l| l.split(' ').nth(2) == Some("none")) {
        let name = l.split(' ').next().unwrap();
        assert!(l.ends_with(&format!("undefined symbol: {name}")), "dlerror as the loader's: {l}");
    }
}
