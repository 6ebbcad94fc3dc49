//! `gdrshim-tool cdi` (issue 41): the spec for a rig fixture with two RDMA NICs, for one with none,
//! and beside NVIDIA's `nvidia.com/gpu` spec, read by the `container-device-interface` crate as a
//! CDI consumer reads it: its JSON schema, its version rules (the declared cdiVersion must be the
//! lowest the fields need), its device names, and the injection of both specs' devices into one
//! OCI spec, which refuses conflicting edits.

mod common;

use common::J;
use container_device_interface as cdi;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gdrshim-cdi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes a test's scratch folder (the one `write_spec` made for it).
fn done(spec: &Path) {
    let _ = std::fs::remove_dir_all(spec.parent().unwrap().parent().unwrap());
}

/// A release folder as deploy.sh installs one (its two libraries; nothing is loaded from it).
fn release(at: &Path) -> PathBuf {
    let r = at.join("opt/rtx4090-gdr/releases/0.3.0-0123456789ab");
    std::fs::create_dir_all(r.join("lib")).unwrap();
    for f in ["lib/libgdrshim.so", "lib/libgdrshim-core.so"] {
        std::fs::write(r.join(f), f).unwrap();
    }
    r
}

/// `gdrshim-tool cdi --from FIXTURE --release R --out D/gdrshim.json`: the exit code, stdout
/// and the spec's path.
fn write_spec(tag: &str, fixture: &str) -> (i32, String, PathBuf, PathBuf) {
    let d = scratch(tag);
    let rel = release(&d);
    let specs = d.join("cdi");
    std::fs::create_dir_all(&specs).unwrap();
    let out = specs.join("gdrshim.json");
    let o = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .current_dir(root())
        .args(["cdi", "--from", &format!("tests/fixtures/state/{fixture}"), "--release"])
        .arg(&rel)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code().unwrap_or(-1), text, out, rel)
}

/// What a consumer reads: the schema, the version rules, the names. Returns the spec as JSON and
/// its device names.
fn load(path: &Path) -> (J, Vec<String>) {
    let spec = cdi::spec::read_spec(&path.to_path_buf(), 0)
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let raw = cdi::spec::parse_spec(&path.to_path_buf()).unwrap();
    let min = cdi::version::minimum_required_version(&raw).unwrap().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let j = common::parse(&text.split_whitespace().collect::<Vec<_>>().join(" "));
    assert_eq!(
        j.get("cdiVersion").unwrap().str(),
        min.trim_start_matches('v'),
        "cdiVersion is the lowest its fields need"
    );
    let mut names: Vec<String> = spec.get_devices().into_keys().collect();
    names.sort();
    (j, names)
}

/// One device injected into an empty OCI spec, as a runtime does: its device nodes, mounts
/// (destination, source, options) and environment.
fn injected(dir: &Path, devices: &[&str]) -> oci_spec::runtime::Spec {
    let cache = cdi::cache::new_cache(vec![
        cdi::spec_dirs::with_spec_dirs(&[dir.to_str().unwrap()]),
        cdi::cache::with_auto_refresh(false),
    ]);
    let mut c = cache.lock().unwrap();
    let mut oci = oci_spec::runtime::Spec::default();
    c.inject_devices(Some(&mut oci), devices.iter().map(|d| d.to_string()).collect())
        .unwrap_or_else(|e| panic!("{devices:?}: {e}"));
    oci
}

fn nodes(oci: &oci_spec::runtime::Spec) -> Vec<String> {
    oci.linux()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.path().display().to_string())
        .collect()
}

#[test]
fn a_rig_with_two_nics_gets_a_device_each_and_all() {
    let (rc, out, path, rel) = write_spec("two", "rig-4090-ok");
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains(&format!("PASS cdi.written                  written to {}", path.display())),
        "{out}"
    );
    let (j, names) = load(&path);
    assert_eq!(
        (j.get("kind").unwrap().str(), j.get("cdiVersion").unwrap().str()),
        ("gdrshim/rdma", "0.3.0")
    );
    assert_eq!(names, ["all", "mlx5_0", "mlx5_1"]);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("issm") && !text.contains("umad") && !text.contains("/dev/nvidia"),
        "{text}"
    );
    for (name, want) in [
        ("mlx5_0", vec!["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]),
        ("mlx5_1", vec!["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"]),
        (
            "all",
            vec!["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"],
        ),
    ] {
        let oci = injected(path.parent().unwrap(), &[&format!("gdrshim/rdma={name}")]);
        assert_eq!(nodes(&oci), want, "{name}");
        let env = oci.process().as_ref().unwrap().env().clone().unwrap_or_default();
        assert!(
            env.contains(&"LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so".to_string()),
            "{name}: {env:?}"
        );
        let m = oci
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination() == Path::new("/opt/rtx4090-gdr/current"))
            .expect("the release");
        assert_eq!(m.source().as_deref(), Some(rel.as_path()), "{name}");
        assert!(m.options().as_ref().unwrap().contains(&"ro".to_string()), "read-only: {m:?}");
    }
    done(&path);
}

#[test]
fn a_machine_without_nics_gets_the_shim_alone() {
    let (rc, out, path, _) = write_spec("none", "no-nic");
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("WARN cdi.nics") && out.contains("no RDMA NIC"), "{out}");
    let (_, names) = load(&path);
    assert_eq!(names, ["all"]);
    let oci = injected(path.parent().unwrap(), &["gdrshim/rdma=all"]);
    assert!(
        oci.linux().as_ref().unwrap().devices().as_ref().is_none_or(|d| d.is_empty()),
        "no device node: {oci:?}"
    );
    assert!(oci
        .process()
        .as_ref()
        .unwrap()
        .env()
        .as_ref()
        .unwrap()
        .iter()
        .any(|e| e.starts_with("LD_PRELOAD=")));
    done(&path);
    // a state recorded before the uverbs item: said, nothing written
    let (rc, out, path, _) = write_spec("old", "h200");
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("uverbs: not recorded") && !path.exists(), "{out}");
    done(&path);
}

#[test]
fn it_composes_with_nvidias_spec() {
    let (rc, out, path, _) = write_spec("nvidia", "rig-4090-ok");
    assert_eq!(rc, 0, "{out}");
    let dir = path.parent().unwrap();
    std::fs::copy(
        root().join("tests/fixtures/cdi/nvidia.com-gpu.json"),
        dir.join("nvidia.com-gpu.json"),
    )
    .unwrap();
    let cache = cdi::cache::new_cache(vec![
        cdi::spec_dirs::with_spec_dirs(&[dir.to_str().unwrap()]),
        cdi::cache::with_auto_refresh(false),
    ]);
    let mut listed = cache.lock().unwrap().list_devices();
    listed.sort();
    assert!(
        listed.contains(&"gdrshim/rdma=all".to_string())
            && listed.contains(&"nvidia.com/gpu=all".to_string()),
        "{listed:?}"
    );
    let oci = injected(dir, &["nvidia.com/gpu=all", "gdrshim/rdma=mlx5_1", "gdrshim/rdma=mlx5_0"]);
    let devices = nodes(&oci);
    for want in [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
    ] {
        assert!(devices.contains(&want.to_string()), "{want}: {devices:?}");
    }
    assert_eq!(
        devices.iter().filter(|d| *d == "/dev/infiniband/rdma_cm").count(),
        1,
        "one rdma_cm for two NICs: {devices:?}"
    );
    let mounts: Vec<String> = oci
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect();
    assert_eq!(mounts.iter().filter(|m| *m == "/opt/rtx4090-gdr/current").count(), 1, "{mounts:?}");
    assert!(mounts.iter().any(|m| m.contains("libcuda.so")), "NVIDIA's mounts kept: {mounts:?}");
    let env = oci.process().as_ref().unwrap().env().clone().unwrap_or_default();
    assert!(
        env.contains(&"LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so".to_string()),
        "{env:?}"
    );
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()), "{env:?}");
    done(&path);
}

#[test]
fn a_spec_is_refused_by_the_same_reader_when_it_is_wrong() {
    // the checks above can fail: the reader refuses a device named as CDI forbids, and a version
    // lower than the fields need
    let (_, _, path, _) = write_spec("wrong", "rig-4090-ok");
    let text = std::fs::read_to_string(&path).unwrap();
    for (what, bad) in [
        ("a name CDI forbids", text.replace("\"name\": \"mlx5_0\"", "\"name\": \"mlx5_0!\"")),
        (
            "a version too low for a device-node hostPath",
            text.replace(
                "\"path\": \"/dev/infiniband/uverbs0\"",
                "\"path\": \"/dev/infiniband/uverbs0\", \"hostPath\": \"/dev/infiniband/uverbs0\"",
            ),
        ),
    ] {
        std::fs::write(&path, &bad).unwrap();
        assert!(cdi::spec::read_spec(&path, 0).is_err(), "{what} was accepted");
    }
    done(&path);
}
