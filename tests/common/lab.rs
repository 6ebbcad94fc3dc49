//! The consumer lab (tests/lab), built once per test binary by `bash tests/lab/build.sh DIR`
//! into `$TMP/gdrshim-lab-<pid>`: DIR/provider (the fake HCA as rdma-core's provider), DIR/lib
//! (stand-in libmlx5 and libefa), DIR/fakesys.so,
//! DIR/labcuda (the stand-in libcuda), DIR/bin (the lab's own verbs programs), DIR/host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[allow(dead_code)] // each test binary uses its part of common
pub fn lab() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gdrshim-lab-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/build.sh");
        let out = Command::new("bash").arg(script).arg(&dir).output().expect("bash");
        assert!(
            out.status.success(),
            "build.sh: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// The value of `key=` in a line of `key=value` words (the fake wire's summary).
#[allow(dead_code)]
pub fn field(line: &str, key: &str) -> u64 {
    let k = format!(" {key}=");
    let at = line.find(&k).unwrap_or_else(|| panic!("{key} in {line}")) + k.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}
