//! `cdi`: a Container Device Interface spec for this machine (or a saved state of one), so that
//! a container gets the RDMA NICs and the shim without `--privileged`: one device per RDMA NIC
//! (its `uverbsN` and `rdma_cm`, never `issm`/`umad`) and `all`, each with the release mounted
//! read-only and `LD_PRELOAD` set. GPUs are NVIDIA's own spec's (`nvidia.com/gpu`): nothing of
//! theirs is here, so the two compose. The spec uses only fields of CDI 0.3.0, the lowest
//! version there is, so every consumer that reads CDI reads it.

use crate::machine::{parse_uverbs, CharDev, State};
use crate::report::{Check, NoKeys, Report, Status};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const AFTER_HELP: &str = "Without --out the spec goes to stdout and this command's own lines and its RESULT line to
stderr; with --out they go to stdout. scripts/deploy.sh and the .deb write it to /etc/cdi/gdrshim.json
whenever the release changes; run this again when NICs change. Containers then take:
  --device nvidia.com/gpu=all --device gdrshim/rdma=all    (or =mlx5_0 for one NIC)
--json: the one JSON object, the spec in its key \"spec\".

Exit codes:
  0  the spec was written
  1  the release has no libgdrshim.so and libgdrshim-core.so: nothing written
  2  FOLDER is not a saved state, no release to mount (give --release), --out cannot be written,
     or a usage error";

/// The spec's kind: `--device gdrshim/rdma=NAME`.
pub const KIND: &str = "gdrshim/rdma";
/// Where a container finds the release: the same path as on the host's `current`, so what the
/// README says of `/opt/rtx4090-gdr/current/...` holds inside too.
pub const IN_CONTAINER: &str = "/opt/rtx4090-gdr/current";
/// The lowest CDI version with every field the spec uses (devices, deviceNodes with type and
/// numbers, mounts without a type, env).
pub const CDI_VERSION: &str = "0.3.0";

/// `gdrshim-tool cdi`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A saved state (scripts/gdr-state-record save) instead of this machine's /sys
    #[arg(long, value_name = "SAVED_STATE_FOLDER")]
    from: Option<PathBuf>,
    /// The release the containers get (default: the one this gdrshim-tool belongs to)
    #[arg(long, value_name = "DIR")]
    release: Option<PathBuf>,
    /// Write the spec to FILE (replaced whole, never half written) instead of stdout
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// One JSON object (the spec in its key "spec") instead of the text
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let devs = match &self.from {
            Some(dir) => {
                let st = State::from_dir(dir).map_err(|e| e.to_string())?;
                let text = st.item("uverbs").ok().ok_or_else(|| {
                    format!(
                        "{}: {} (a state saved before 0.3.0 has none)",
                        dir.display(),
                        st.item("uverbs").why_not("uverbs")
                    )
                })?;
                parse_uverbs(text)
            }
            None => parse_uverbs(&live_uverbs(Path::new("/sys"))),
        };
        let release = match &self.release {
            Some(r) => r.clone(),
            None => own_release().ok_or("this gdrshim-tool is not in a release (bin/ beside lib/libgdrshim.so): give --release DIR")?,
        };
        let release = std::fs::canonicalize(&release)
            .map_err(|e| format!("--release {}: {e}", release.display()))?;
        let (mut r, spec) = generate(&devs, &release);
        let Some(spec) = spec else {
            return Ok(r.print("cdi", self.json));
        };
        let text = spec.text();
        if let Some(out) = &self.out {
            crate::report::write_out(&mut r, "cdi", out, &text)?;
        }
        if self.json {
            println!("{}", r.json_with("cdi", |_| NoKeys {}, CdiKeys { spec }));
        } else if self.out.is_some() {
            print!("{}", r.text());
        } else {
            print!("{text}");
            eprint!("{}", r.text());
        }
        Ok(r.exit_code())
    }
}

/// The release this program belongs to: `bin/..`, where `lib/` holds the shim.
fn own_release() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    let top = exe.parent()?.parent()?;
    top.join("lib/libgdrshim.so").is_file().then(|| top.to_path_buf())
}

/// The `uverbs` item's lines, read from `sys` (`/sys`) as gdr-state-record reads them.
pub fn live_uverbs(sys: &Path) -> String {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let mut lines = Vec::new();
    if let Ok(dir) = std::fs::read_dir(sys.join("class/infiniband_verbs")) {
        let mut names: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        for d in names {
            if let (Some(ib), Some(dev)) = (read(d.join("ibdev")), read(d.join("dev"))) {
                lines.push(format!(
                    "{} {ib} {dev}",
                    d.file_name().unwrap_or_default().to_string_lossy()
                ));
            }
        }
    }
    if let Some(dev) = read(sys.join("class/misc/rdma_cm/dev")) {
        lines.push(format!("rdma_cm - {dev}"));
    }
    lines.join("\n")
}

/// A CDI device name: letters, digits, `_ - . :`, starting and ending with a letter or digit.
fn cdi_name(n: &str) -> bool {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    ends(n.chars().next())
        && ends(n.chars().last())
        && n.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
}

/// The checks and the spec for these character devices and this release (none when a check
/// failed).
pub fn generate(devs: &[CharDev], release: &Path) -> (Report, Option<Spec>) {
    let mut r = Report::default();
    let libs = ["lib/libgdrshim.so", "lib/libgdrshim-core.so"];
    let missing: Vec<&str> = libs.iter().copied().filter(|l| !release.join(l).is_file()).collect();
    if !missing.is_empty() {
        r.push(
            Check::new("cdi.release", Status::Fail, format!("{} lacks {}: nothing to mount", release.display(), missing.join(", ")))
                .fix("give --release a release folder (scripts/deploy.sh installs them under /opt/rtx4090-gdr/releases)"),
        );
        return (r, None);
    }
    let preload = format!("LD_PRELOAD={IN_CONTAINER}/lib/libgdrshim.so");
    r.push(Check::new(
        "cdi.release",
        Status::Pass,
        format!(
            "every device mounts {} read-only at {IN_CONTAINER} and sets {preload}",
            release.display()
        ),
    ));
    let cm = devs.iter().find(|d| d.name == "rdma_cm");
    let mut nics: Vec<&CharDev> = Vec::new();
    for d in devs.iter().filter(|d| d.name.starts_with("uverbs")) {
        match &d.ibdev {
            Some(ib) if cdi_name(ib) => nics.push(d),
            other => r.push(Check::new(
                "cdi.nic",
                Status::Warn,
                format!("{}: HCA name {other:?} is no CDI device name: left out", d.name),
            )),
        }
    }
    let names: Vec<String> =
        nics.iter().map(|d| format!("{} ({})", d.ibdev.as_deref().unwrap_or(""), d.name)).collect();
    r.push(if nics.is_empty() {
        Check::new(
            "cdi.nics",
            Status::Warn,
            "no RDMA NIC: one device, all, with the shim and no verbs device",
        )
        .fix("on a GPU node with an HCA: load ib_uverbs (modprobe ib_uverbs), then run this again")
    } else {
        Check::new(
            "cdi.nics",
            Status::Pass,
            format!("{} RDMA NIC(s), a device each and all: {}", nics.len(), names.join(", ")),
        )
    });
    r.push(match cm {
        Some(_) => Check::new("cdi.rdma_cm", Status::Pass, "/dev/infiniband/rdma_cm goes with every NIC (librdmacm's connections)"),
        None => Check::new(
            "cdi.rdma_cm",
            Status::Info,
            "no rdma_cm here (rdma_ucm not loaded): librdmacm cannot connect in the container; NCCL's IB transport does not use it",
        ),
    });
    r.push(Check::new(
        "cdi.left_out",
        Status::Info,
        "never given: issm* and umad* (a tenant could set ports' subnet-manager state or send management datagrams), /dev/nvidia* and NVIDIA's libraries (nvidia.com/gpu's spec gives them: --device nvidia.com/gpu=all)",
    ));
    r.push(Check::new(
        "cdi.version",
        Status::Info,
        format!("cdiVersion {CDI_VERSION}: the lowest with these fields (no device-node hostPath, mount type or annotations), so older consumers (Podman 4) read it too"),
    ));
    let mut devices: Vec<(String, Vec<&CharDev>)> =
        nics.iter().map(|d| (d.ibdev.clone().unwrap_or_default(), vec![*d])).collect();
    devices.push(("all".into(), nics.clone()));
    (r, Some(Spec::new(&devices, cm, release, &preload)))
}

/// `cdi`'s own key in its JSON: the spec.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct CdiKeys {
    pub spec: Spec,
}

/// A CDI spec with the fields of CDI 0.3.0 it uses, named and ordered as CDI's own JSON.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: Edits,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    pub env: Vec<String>,
    /// Left out where there is none (`all` on a machine without an RDMA NIC).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<Mount>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceNode {
    pub path: String,
    /// `c`: a character device.
    #[serde(rename = "type")]
    pub kind: String,
    pub major: u32,
    pub minor: u32,
    pub permissions: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

impl Spec {
    fn new(
        devices: &[(String, Vec<&CharDev>)],
        cm: Option<&CharDev>,
        release: &Path,
        preload: &str,
    ) -> Spec {
        let node = |path: String, d: &CharDev| DeviceNode {
            path,
            kind: "c".into(),
            major: d.major,
            minor: d.minor,
            permissions: "rw".into(),
        };
        let devices = devices
            .iter()
            .map(|(name, nodes)| {
                let mut list: Vec<DeviceNode> =
                    nodes.iter().map(|d| node(format!("/dev/infiniband/{}", d.name), d)).collect();
                if let (Some(c), false) = (cm, nodes.is_empty()) {
                    list.push(node("/dev/infiniband/rdma_cm".into(), c));
                }
                Device {
                    name: name.clone(),
                    container_edits: Edits {
                        env: vec![preload.to_string()],
                        device_nodes: list,
                        mounts: vec![Mount {
                            host_path: release.display().to_string(),
                            container_path: IN_CONTAINER.into(),
                            options: ["ro", "nosuid", "nodev", "rbind"].map(String::from).to_vec(),
                        }],
                    },
                }
            })
            .collect();
        Spec { cdi_version: CDI_VERSION.into(), kind: KIND.into(), devices }
    }

    /// The spec file: pretty JSON, one field a line.
    pub fn text(&self) -> String {
        // serde_json refuses only map keys that are not strings: the spec's are its field names
        serde_json::to_string_pretty(self).expect("a CDI spec has string keys only") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(
            cdi_name("mlx5_0") && cdi_name("bnxt_re0") && !cdi_name("mlx5_") && !cdi_name("a b")
        );
    }

    /// The spec in the file and in the JSON: CDI's field names in CDI's order, and both parse
    /// back into the model and are written again the same.
    #[test]
    fn the_spec_and_the_json_round_trip() {
        let dev = |name: &str, ib: Option<&str>, minor| CharDev {
            name: name.into(),
            ibdev: ib.map(String::from),
            major: 231,
            minor,
        };
        let devs = [dev("uverbs0", Some("mlx5_0"), 192), dev("rdma_cm", None, 255)];
        let dir = std::env::temp_dir().join(format!("gdrshim-cdi-unit-{}", std::process::id()));
        for f in ["lib/libgdrshim.so", "lib/libgdrshim-core.so"] {
            std::fs::create_dir_all(dir.join("lib")).unwrap();
            std::fs::write(dir.join(f), "").unwrap();
        }
        let (r, spec) = generate(&devs, &dir);
        let spec = spec.expect("a spec");
        let text = spec.text();
        assert!(text.starts_with("{\n  \"cdiVersion\": \"0.3.0\",\n  \"kind\": \"gdrshim/rdma\",\n  \"devices\": [\n"), "{text}");
        assert!(text.contains("\"name\": \"mlx5_0\",\n      \"containerEdits\": {\n        \"env\": [\n          \"LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so\"\n        ],\n        \"deviceNodes\": ["), "{text}");
        assert!(text.contains("\"path\": \"/dev/infiniband/rdma_cm\",\n            \"type\": \"c\",\n            \"major\": 231,\n            \"minor\": 255,\n            \"permissions\": \"rw\""), "{text}");
        assert_eq!(
            serde_json::to_string_pretty(&serde_json::from_str::<Spec>(&text).unwrap()).unwrap()
                + "\n",
            text
        );
        let line = r.json_with("cdi", |_| NoKeys {}, CdiKeys { spec });
        assert!(line.contains(r#","exit":0,"spec":{"cdiVersion":"0.3.0","kind":"gdrshim/rdma","devices":[{"name":"mlx5_0","containerEdits":{"env":["#), "{line}");
        assert_eq!(
            crate::json::round_trip::<crate::report::JsonReport<NoKeys, CdiKeys>>(&line),
            line
        );
        // without a NIC, `all` has no device nodes: the key is left out, as before
        let (_, spec) = generate(&[], &dir);
        let text = spec.unwrap().text();
        assert!(!text.contains("deviceNodes"), "{text}");
        assert_eq!(
            serde_json::to_string_pretty(&serde_json::from_str::<Spec>(&text).unwrap()).unwrap()
                + "\n",
            text
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
