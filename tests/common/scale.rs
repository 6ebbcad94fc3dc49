//! The scale rig shared by benches/scale.rs and tests/scale.rs: tests/c/scalebench.c against the
//! stateless fake driver (tests/c/scalefake.c) and the fake NIC, with and without the real shim.

use crate::common::fakes::{self, Fakes, Verbs};
use crate::common::{cc, Env};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Builds the rig in `env`'s folder.
pub fn build(env: &Env) {
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let src = |f: &str| c.join(f).to_str().unwrap().to_string();
    cc(env, &["-O2", "-Wall", "-Werror", "-o", "scalebench", &src("scalebench.c"), "-ldl"]);
    let f = Fakes::in_dir(&env.dir);
    f.scalefake();
    f.fakeverbs("libibverbs.so.1", Verbs { opt: "-O2", ..fakes::NEW });
    crate::common::fakedev::fake_dev(
        &env.dir.join("dev"),
        &["nvidiactl", "nvidia-uvm", "nvidia0"],
        true,
    );
}

/// `scalebench ARGS` with the shim (register mode, NV503C route) or without; its `scale` lines.
pub fn run(env: &Env, shim: bool, args: &[String]) -> Vec<String> {
    run_with(env, shim, args, &[])
}

/// [`run`] with more variables set.
pub fn run_with(env: &Env, shim: bool, args: &[String], vars: &[(&str, &str)]) -> Vec<String> {
    let fake = env.dir.join("libscalefake.so");
    let preload = if shim {
        format!("{}:{}", env.shim.display(), fake.display())
    } else {
        fake.display().to_string()
    };
    let out = Command::new(env.dir.join("scalebench"))
        .args(args)
        .current_dir(&env.dir)
        .env("LD_LIBRARY_PATH", &env.dir)
        .env("LD_PRELOAD", preload)
        .env("GDRSHIM_TEST_DEV_DIR", env.dir.join("dev"))
        .env("GDRSHIM_MODE", "register")
        .env("GDRSHIM_ROUTE", "nv503c")
        .env("GDRSHIM_LOG_LEVEL", "warn")
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "scalebench {args:?} (shim: {shim}): {o}{e}");
    if shim {
        let summary = e
            .lines()
            .find(|l| l.starts_with("gdrshim: summary"))
            .unwrap_or_else(|| panic!("no summary: {e}"));
        for key in ["rm_errors=0 ", "pass0_misses=0 ", "live_registrations=0 "] {
            assert!(summary.contains(key), "{key}: {summary}");
        }
    }
    o.lines().filter(|l| l.starts_with("scale ")).map(str::to_string).collect()
}

fn field(line: &str, key: &str) -> u64 {
    let at = line.find(&format!("{key}=")).unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len() + 1..]
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// (N, op) → (p50, p99) in ns.
pub type Times = BTreeMap<(u64, String), (u64, u64)>;

pub fn times(lines: &[String]) -> Times {
    lines
        .iter()
        .filter(|l| l.contains(" op="))
        .map(|l| {
            let op = l.split(" op=").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
            ((field(l, "N"), op), (field(l, "p50"), field(l, "p99")))
        })
        .collect()
}

/// N → heap bytes in use.
pub fn heap(lines: &[String]) -> BTreeMap<u64, u64> {
    lines
        .iter()
        .filter(|l| l.contains(" heap="))
        .map(|l| (field(l, "N"), field(l, "heap")))
        .collect()
}
