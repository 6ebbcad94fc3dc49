//! A fake NVIDIA machine's device folder (what `GDRSHIM_TEST_DEV_DIR` names): the device nodes as
//! empty files, the driver's version line, and, if asked, a loaded nvidia-peermem. Shared by the
//! tests of both packages (tools/tests include this file by its path).

use std::path::Path;

/// The open driver the fake machines claim to run.
#[allow(dead_code)]
pub const DRIVER_VERSION: &str =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n";

/// Makes `dev` (and its parents) with `nodes` as empty files and the version line; with
/// `peermem`, nvidia-peermem's module folder too (the NV503C route's reader is "loaded").
#[allow(dead_code)]
pub fn fake_dev(dev: &Path, nodes: &[&str], peermem: bool) {
    std::fs::create_dir_all(dev).unwrap();
    for f in nodes {
        std::fs::write(dev.join(f), b"").unwrap();
    }
    std::fs::write(dev.join("version"), DRIVER_VERSION).unwrap();
    if peermem {
        std::fs::create_dir_all(dev.join("sys/module/nvidia_peermem")).unwrap();
    }
}
