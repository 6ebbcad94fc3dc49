//! `scripts/gdr-env.sh --gdr-level auto` (issue 30): NCCL_NET_GDR_LEVEL from the doctor's record of
//! each GPU's PCIe path to its nearest NIC (the rig fixtures under tests/fixtures/state, judged by
//! the real gdrshim-tool), set only when asked, and never guessed where there is no record; and
//! without --hca (issue 40) the HCA that record names nearest each GPU, or the only one there is.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The doctor of this tree (built once).
fn tool() -> &'static Path {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        common::sh(
            Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "gdrshim-tools",
                    "--bin",
                    "gdrshim-tool",
                ])
                .current_dir(root()),
        );
        root().join("target/release/gdrshim-tool")
    })
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-gdr-level-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `gdr-env.sh --mode gdr --print ... ARGS` on a prefix of our own making (a release's layout,
/// its manifest checked) and a fake /sys/class/infiniband with mlx5_0 and mlx5_1; returns the
/// exit code, the NCCL_NET_GDR_LEVEL line printed (if any) and stderr.
fn gdr_env(tag: &str, args: &[&str], tool: Option<&Path>) -> (i32, Option<String>, String) {
    let (code, out, err) =
        gdr_env_on(tag, &["mlx5_0", "mlx5_1"], &[&["--hca", "mlx5"], args].concat(), tool);
    let level =
        out.lines().find_map(|l| l.strip_prefix("export NCCL_NET_GDR_LEVEL=")).map(str::to_string);
    (code, level, err)
}

/// `gdr-env.sh --mode gdr --print --prefix P ARGS` with these HCAs in its /sys/class/infiniband:
/// the exit code, stdout and stderr.
fn gdr_env_on(
    tag: &str,
    hcas: &[&str],
    args: &[&str],
    tool: Option<&Path>,
) -> (i32, String, String) {
    let d = scratch(tag);
    let prefix = d.join("prefix");
    for f in ["lib/libgdrshim.so", "lib/libgdrshim-core.so"] {
        std::fs::create_dir_all(prefix.join(f).parent().unwrap()).unwrap();
        std::fs::write(prefix.join(f), f).unwrap();
    }
    let st = Command::new("bash")
        .arg("-c")
        .arg("sha256sum lib/libgdrshim.so lib/libgdrshim-core.so > SHA256SUMS")
        .current_dir(&prefix)
        .status()
        .unwrap();
    assert!(st.success());
    let sysfs = d.join("infiniband");
    std::fs::create_dir_all(&sysfs).unwrap();
    for h in hcas {
        std::fs::create_dir_all(sysfs.join(h).join("ports/1")).unwrap();
    }
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/gdr-env.sh"))
        .args(["--mode", "gdr", "--print", "--prefix", prefix.to_str().unwrap()])
        .args(args)
        .env("GDR_ENV_SYSFS", &sysfs)
        // no tool given: one that is not there (the tree's own target/release is not looked at then)
        .env("GDR_ENV_TOOL", tool.map_or_else(|| d.join("no-tool"), Path::to_path_buf));
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&d);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn fixture(name: &str) -> String {
    root().join("tests/fixtures/state").join(name).to_str().unwrap().to_string()
}

#[test]
fn auto_takes_the_level_of_each_gpus_nearest_nic_from_the_doctors_record() {
    let t = Some(tool());
    for (rig, want) in [("rig-4090-pix", "PXB"), ("rig-4090-phb", "PHB"), ("rig-4090-sys", "SYS")] {
        let (code, level, err) =
            gdr_env(rig, &["--gdr-level", "auto", "--state", &fixture(rig)], t);
        assert_eq!((code, level.as_deref()), (0, Some(want)), "{rig}: {err}");
        assert!(
            err.contains(&format!(
                "NCCL_NET_GDR_LEVEL={want} lets GDR on for every GPU with its nearest NIC"
            )),
            "{rig}: {err}"
        );
        // each pair it covers is named
        assert_eq!(err.matches("gdr-env:   GPU ").count(), 2, "{rig}: {err}");
        assert!(!err.contains("differ"), "{rig}: {err}");
    }
    // the switch rig: each GPU's own NIC, at NCCL's default level (never below it)
    let (_, _, err) =
        gdr_env("pix-pairs", &["--gdr-level", "auto", "--state", &fixture("rig-4090-pix")], t);
    assert!(
        err.contains("GPU 0000:43:00.0 ↔ mlx5_1: PIX")
            && err.contains("GPU 0000:03:00.0 ↔ mlx5_0: PIX"),
        "{err}"
    );
    let (_, _, err) =
        gdr_env("sys-cost", &["--gdr-level", "auto", "--state", &fixture("rig-4090-sys")], t);
    assert!(err.contains("SYS: across the link between sockets"), "{err}");
}

#[test]
fn auto_with_paths_that_differ_per_gpu_takes_the_level_that_covers_them_all_and_says_so() {
    // the switch rig with its second GPU moved to a root port of its own: PIX for one, PHB (to
    // either NIC: the first of equals, as NCCL ranks them) for the other
    let d = scratch("mixed-state");
    let state = d.join("state");
    let st = Command::new("cp")
        .args(["-r", &fixture("rig-4090-pix"), state.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let paths = std::fs::read_to_string(state.join("pci-paths.txt")).unwrap();
    let moved = paths.replace(
        "pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.0/0000:43:00.0",
        "pci0000:40/0000:40:03.1/0000:43:00.0",
    );
    assert_ne!(moved, paths);
    std::fs::write(state.join("pci-paths.txt"), moved).unwrap();
    let (code, level, err) = gdr_env(
        "mixed",
        &["--gdr-level", "auto", "--state", state.to_str().unwrap()],
        Some(tool()),
    );
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!((code, level.as_deref()), (0, Some("PHB")), "{err}");
    assert!(err.contains("the paths differ per GPU (PHB PIX): NCCL_NET_GDR_LEVEL=PHB"), "{err}");
    assert!(
        err.contains("GPU 0000:03:00.0 ↔ mlx5_0: PIX")
            && err.contains("GPU 0000:43:00.0 ↔ mlx5_0: PHB"),
        "{err}"
    );
}

#[test]
fn auto_without_a_record_or_a_tool_sets_nothing_and_says_why() {
    // a record from before the paths were recorded
    let (code, level, err) = gdr_env(
        "old-record",
        &["--gdr-level", "auto", "--state", &fixture("rig-4090-ok")],
        Some(tool()),
    );
    assert_eq!((code, level), (0, None), "{err}");
    assert!(err.contains("no GPU↔NIC PCIe path in the doctor's record: NCCL_NET_GDR_LEVEL not set (NCCL's default PXB applies)"), "{err}");
    // no doctor to ask
    let (code, level, err) =
        gdr_env("no-tool", &["--gdr-level", "auto", "--state", &fixture("rig-4090-pix")], None);
    assert_eq!((code, level), (0, None), "{err}");
    assert!(err.contains("no gdrshim-tool") && err.contains("NCCL_NET_GDR_LEVEL not set"), "{err}");
    // only when asked: the default stays SYS and reads no record
    let (code, level, err) = gdr_env("default", &[], None);
    assert_eq!((code, level.as_deref()), (0, Some("SYS")), "{err}");
    assert!(!err.contains("auto"), "{err}");
    // --state belongs to auto, and must be a folder
    let (code, _, err) = gdr_env("state-alone", &["--state", &fixture("rig-4090-pix")], None);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) =
        gdr_env("state-missing", &["--gdr-level", "auto", "--state", "/nonexistent-state"], None);
    assert_eq!(code, 2, "{err}");
    // --help explains it
    let out =
        Command::new("bash").arg(root().join("scripts/gdr-env.sh")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("auto: from the doctor's record") && help.contains("--state DIR"),
        "{help}"
    );
}

#[test]
fn without_hca_the_one_nearest_each_gpu_or_the_only_one_or_a_clear_refusal() {
    let hca = |out: &str| {
        out.lines().find_map(|l| l.strip_prefix("export NCCL_IB_HCA=")).map(str::to_string)
    };
    // the switch rig: each GPU's own NIC, in NCCL's exact form (a prefix mlx5_1 would take mlx5_10 too)
    let (code, out, err) = gdr_env_on(
        "hca-pix",
        &["mlx5_0", "mlx5_1"],
        &["--state", &fixture("rig-4090-pix")],
        Some(tool()),
    );
    assert_eq!((code, hca(&out).as_deref()), (0, Some("'=mlx5_0,mlx5_1'")), "{err}");
    assert!(
        err.contains("no --hca given: the HCA nearest each GPU")
            && err.contains("GPU 0000:03:00.0 ↔ mlx5_0: PIX"),
        "{err}"
    );
    // the root-port rig: both GPUs nearest mlx5_0, so only it
    let (code, out, err) = gdr_env_on(
        "hca-phb",
        &["mlx5_0", "mlx5_1"],
        &["--state", &fixture("rig-4090-phb")],
        Some(tool()),
    );
    assert_eq!((code, hca(&out).as_deref()), (0, Some("'=mlx5_0'")), "{err}");
    // one HCA: that one, no record needed
    let (code, out, err) = gdr_env_on("hca-one", &["mlx5_3"], &[], None);
    assert_eq!((code, hca(&out).as_deref()), (0, Some("'=mlx5_3'")), "{err}");
    assert!(err.contains("no --hca given: mlx5_3, the only HCA here"), "{err}");
    // several and no record of which is nearest: refused, saying what to give
    let (code, out, err) = gdr_env_on("hca-none", &["mlx5_0", "mlx5_1"], &[], None);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("gdr-env: no --hca given and 2 HCAs here (mlx5_0 mlx5_1); which is nearest each GPU is not known (no gdrshim-tool"),
        "{err}"
    );
    assert!(err.trim_end().ends_with("give --hca LIST (try --help)"), "{err}");
    // no HCA at all
    let (code, _, err) = gdr_env_on("hca-zero", &[], &[], None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no --hca given and no HCA in ") && err.trim_end().ends_with("(try --help)"),
        "{err}"
    );
    // --state is read without --hca too, never with --hca and no auto level
    let (code, _, err) = gdr_env_on(
        "hca-state",
        &["mlx5_0"],
        &["--hca", "mlx5_0", "--state", &fixture("rig-4090-pix")],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--state is read only with --gdr-level auto or without --hca"), "{err}");
}
