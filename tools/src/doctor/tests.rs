//! The doctor's judgements on saved states.

use super::*;
use crate::machine::*;
use crate::report::strip_ansi;
use std::path::Path;

fn fixture(name: &str) -> State {
    State::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state").join(name),
    )
    .unwrap()
}
fn status(r: &Report, id: &str) -> Status {
    r.get(id).unwrap_or_else(|| panic!("no check {id}:\n{}", r.text())).status
}

#[test]
fn the_real_h200_state() {
    let r = doctor(&fixture("h200"));
    assert!(!r.failed(), "{}", r.text());
    assert_eq!(status(&r, "driver.loaded"), Status::Pass);
    assert_eq!(status(&r, "driver.open"), Status::Pass);
    let model = r.get("gpu.model").unwrap();
    assert!(
        model.summary.contains("DMA-BUF") && model.summary.contains("no gdrshim"),
        "{}",
        model.summary
    );
    assert_eq!(status(&r, "gpu0.bar1"), Status::Pass);
    let p2p = r.get("p2p.matrix").unwrap();
    assert_eq!((p2p.status, p2p.summary.contains("one GPU")), (Status::Info, true));
    assert_eq!(status(&r, "driver.dkms"), Status::Info, "dkms is not installed there: not judged");
    assert_eq!(status(&r, "rdma.hca"), Status::Info);
}

#[test]
fn a_rig_set_up_by_the_runbook_passes() {
    let r = doctor(&fixture("rig-4090-ok"));
    assert!(!r.failed(), "{}", r.text());
    for id in [
        "driver.versions",
        "driver.dkms",
        "driver.modinfo",
        "driver.holds",
        "gpu0.bar1",
        "p2p.matrix",
        "p2p.acs",
        "p2p.iommu",
        "boot.secure_boot",
        "rdma.mlx5_0.1",
        "limits.memlock",
        "devices.nodes",
    ] {
        assert_eq!(status(&r, id), Status::Pass, "{id}\n{}", r.text());
    }
    assert!(r.get("rdma.mlx5_0.1").unwrap().summary.contains("NCCL_IB_GID_INDEX=3"));
    assert!(r.get("gpu.model").unwrap().summary.contains("gdrshim"));
    // the inbox stack: DMA-BUF works, NV503C cannot (no peer-memory module) and is not needed
    assert_eq!(status(&r, "route.dmabuf"), Status::Pass, "{}", r.text());
    let nv = r.get("route.nv503c").unwrap();
    assert_eq!(nv.status, Status::Warn, "{}", r.text());
    assert!(
        nv.summary.contains("ib_register_peer_memory_client") && nv.summary.contains("not needed"),
        "{}",
        nv.summary
    );
    assert!(r.get("route.choice").unwrap().summary.contains("takes DMA-BUF"));
}

#[test]
fn a_rig_with_mlnx_ofed_and_peermem_takes_nv503c() {
    let r = doctor(&fixture("rig-4090-ofed"));
    assert!(!r.failed(), "{}", r.text());
    assert_eq!(status(&r, "route.nv503c"), Status::Pass, "{}", r.text());
    let d = r.get("route.dmabuf").unwrap();
    assert_eq!(d.status, Status::Warn, "{}", r.text());
    assert!(d.summary.contains("570"), "{}", d.summary);
    assert!(r.get("route.choice").unwrap().summary.contains("takes NV503C"));
}

#[test]
fn every_known_fault_is_named_with_its_fix() {
    let r = doctor(&fixture("rig-4090-bad"));
    assert!(r.failed());
    let expect = [
        ("driver.versions", Status::Fail, "libcuda.so.595.58.03"),
        ("driver.dkms", Status::Fail, "nvidia-dkms-open"),
        ("driver.modinfo", Status::Fail, "reboot"),
        ("driver.holds", Status::Warn, "apt-mark hold"),
        ("gpu0.bar1", Status::Warn, "NCCL_LOCAL_REGISTER=0"),
        ("gpu.busy", Status::Warn, "stop the jobs"),
        ("p2p.matrix", Status::Fail, "GPU0-GPU2: NS"),
        ("p2p.acs", Status::Warn, "ReqRedir+"),
        ("p2p.iommu", Status::Warn, "iommu=pt"),
        ("boot.secure_boot", Status::Warn, "mokutil"),
        ("rdma.mlx5_0.1", Status::Fail, "opensm"),
        ("rdma.mlx5_1.1", Status::Fail, "cable"),
        ("limits.memlock", Status::Fail, "memlock=-1"),
        ("kernel.xid", Status::Warn, "Xid"),
        ("route.nv503c", Status::Fail, "ib_register_peer_memory_client"),
        ("route.dmabuf", Status::Fail, "rdma-core 34"),
        ("route.choice", Status::Fail, "no registration route works"),
    ];
    for (id, st, word) in expect {
        let c = r.get(id).unwrap_or_else(|| panic!("{id}"));
        assert_eq!(c.status, st, "{id}: {}", r.text());
        let all = format!("{} {} {}", c.summary, c.evidence.join(" "), c.fix);
        assert!(all.contains(word), "{id} should mention {word:?}: {all}");
    }
}

#[test]
fn a_machine_without_a_gpu_says_what_it_cannot_see_and_could_not_check() {
    let st = State::from_pairs(&[
        (
            "proc-driver-version",
            "cat: /proc/driver/nvidia/version: No such file or directory\n# exit status 1",
        ),
        ("nvidia-smi-q", "# not run: nvidia-smi is not installed"),
        ("nvidia-smi-topo-p2p-r", "# not run: nvidia-smi is not installed"),
        ("memlock", "8192"),
        (
            "dev-nodes",
            "ls: cannot access '/dev/nvidia*': No such file or directory\n# exit status 2",
        ),
        ("ibv-devinfo", "# not run: ibv_devinfo is not installed"),
    ]);
    let r = doctor(&st);
    assert!(!r.failed(), "{}", r.text());
    assert_eq!(status(&r, "driver.loaded"), Status::Info);
    assert!(r.get("gpu.model").unwrap().summary.contains("no GPU seen"));
    assert_eq!(status(&r, "limits.memlock"), Status::Warn);
    assert_eq!(status(&r, "devices.nodes"), Status::Info);
    // no FAIL, but nothing on the GPU side seen: could not check (2), never ready
    assert_eq!(r.exit_code(), 2, "{}", r.text());
    assert!(r.json("doctor").contains("\"result\":\"COULD NOT CHECK\""));
    // the same with the driver loaded is judged
    let st = State::from_pairs(&[
        (
            "proc-driver-version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build",
        ),
        ("nvidia-smi-q", "# not run: nvidia-smi is not installed"),
        ("memlock", "unlimited"),
    ]);
    let r = doctor(&st);
    assert_eq!(status(&r, "driver.loaded"), Status::Pass, "{}", r.text());
    assert_eq!(r.exit_code(), 0, "{}", r.text());
}

#[test]
fn an_unreadable_kernel_log_is_could_not_check_never_a_pass() {
    let st = State::from_pairs(&[(
        "dmesg-nvidia",
        "dmesg: read kernel buffer failed: Operation not permitted\n# exit status 1",
    )]);
    let r = doctor(&st);
    let c = r.get("kernel.xid").unwrap();
    assert_eq!(c.status, Status::Warn, "{}", r.text());
    assert!(c.summary.contains("could not check"), "{}", r.text());
    let st = State::from_pairs(&[("dmesg-nvidia", "[ 1.0] nvidia: loading out-of-tree module")]);
    assert_eq!(status(&doctor(&st), "kernel.xid"), Status::Pass);
}

#[test]
fn parsers() {
    let m2 = parse_p2p_matrix(&strip_ansi(
        " \t\u{1b}[4mGPU0\tGPU1\t\u{1b}[0m\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n",
    ));
    assert_eq!(
        m2,
        vec![
            ("GPU0".into(), "GPU1".into(), "GNS".into()),
            ("GPU1".into(), "GPU0".into(), "GNS".into())
        ]
    );
    // recorded items are stripped of escape codes when read
    assert_eq!(
        Item::parse(" \t\u{1b}[4mGPU0\tGPU1\t\u{1b}[0m\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n")
            .ok()
            .map(parse_p2p_matrix),
        Some(m2.clone())
    );
    let p = parse_ibv_devinfo("hca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tlink_layer:\t\tEthernet\n\t\t\tGID[  3]:\t\t::ffff:10.0.0.1, RoCE v2\n");
    assert_eq!(p[0].gids, vec![(3, "::ffff:10.0.0.1".into(), "RoCE v2".into())]);
    assert_eq!(Item::parse("x\n# exit status 3"), Item::Ran { text: "x".into(), status: 3 });
}

#[test]
fn a_kernel_without_infiniband_names_the_parent_option_not_its_children() {
    // issue 30: route.dmabuf said "lacks CONFIG_INFINIBAND_USER_MEM, CONFIG_INFINIBAND_ON_DEMAND_PAGING",
    // rdma.kernel_config "lacks CONFIG_HMM_MIRROR, …": the cause, CONFIG_INFINIBAND, was never named
    let r = doctor(&fixture("rig-4090-no-infiniband"));
    for id in ["route.dmabuf", "rdma.kernel_config"] {
        let c = r.get(id).unwrap();
        assert!(c.summary.contains("CONFIG_INFINIBAND is not set"), "{id}: {}", r.text());
        assert!(
            !c.summary.contains("USER_MEM")
                && !c.summary.contains("ON_DEMAND")
                && !c.summary.contains("HMM"),
            "{id}: {}",
            c.summary
        );
    }
    assert_eq!(status(&r, "route.dmabuf"), Status::Fail);
    // the source that shows it, cited
    let c = r.get("rdma.kernel_config").unwrap();
    assert_eq!(
        c.evidence,
        ["CONFIG_INFINIBAND: linux drivers/infiniband/Kconfig: menuconfig INFINIBAND; every option below sits inside `if INFINIBAND`"]
    );
    // a child missing under a parent that is there is the child
    let st = State::from_pairs(&[(
        "kernel-config",
        "CONFIG_DMA_SHARED_BUFFER=y\nCONFIG_INFINIBAND=m\nCONFIG_INFINIBAND_USER_ACCESS=m\nCONFIG_INFINIBAND_USER_MEM=y\n# CONFIG_INFINIBAND_ON_DEMAND_PAGING is not set\n",
    )]);
    let c = crate::routes::kernel_config_check(&st);
    assert_eq!(c.summary, "kernel: CONFIG_INFINIBAND_ON_DEMAND_PAGING is not set (mlx5's dma-buf MRs): the DMA-BUF route cannot work");
    // an older record lists only the children: a child set means its parents are
    let st = State::from_pairs(&[(
        "kernel-config",
        "CONFIG_DMA_SHARED_BUFFER=y\nCONFIG_INFINIBAND_USER_MEM=y\nCONFIG_INFINIBAND_ON_DEMAND_PAGING=y\n",
    )]);
    assert_eq!(crate::routes::kernel_config_check(&st).status, Status::Pass);
}

#[test]
fn nvidia_drm_is_no_prerequisite_of_dma_buf() {
    // issue 30: rdma.modeset said "DMA-BUF export of GPU memory is off" / "DMA-BUF needs nvidia_drm
    // modeset=1"; RM's export (nv-dmabuf.c) reads no modeset, and the H200 exports with no nvidia_drm
    let r = doctor(&fixture("rig-4090-no-nvidia-drm"));
    assert_eq!(r.exit_code(), 0, "{}", r.text());
    assert_eq!(status(&r, "route.dmabuf"), Status::Pass, "{}", r.text());
    let c = r.get("rdma.modeset").unwrap();
    assert_eq!(
        (c.status, c.summary.as_str()),
        (Status::Info, "nvidia_drm not loaded: not needed for DMA-BUF")
    );
    assert!(
        c.evidence[0].contains("nv-dmabuf.c") && c.evidence[0].contains("docs/nvidia-abi.md, S10"),
        "{:?}",
        c.evidence
    );
    for f in ["rig-4090-bad", "rig-4090-ok", "h200"] {
        let r = doctor(&fixture(f));
        let said = r.text();
        assert!(
            !said.contains("needs nvidia_drm modeset=1")
                && !said.contains("export of GPU memory is off"),
            "{f}: {said}"
        );
        assert_eq!(status(&r, "rdma.modeset"), Status::Info, "{f}");
    }
}

#[test]
fn the_readme_names_every_kernel_option_of_the_table() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let route_row =
        readme.lines().find(|l| l.starts_with("| **DMA-BUF**")).expect("the README's route table");
    for o in crate::routes::DMABUF_KERNEL_OPTIONS {
        assert!(
            route_row.contains(&format!("`{}`", o.name)),
            "the README's DMA-BUF row does not name {}",
            o.name
        );
    }
    assert!(
        !route_row.contains("HMM_MIRROR"),
        "HMM_MIRROR is selected by ODP, no prerequisite of its own"
    );
}

#[test]
fn each_gpu_gets_the_nic_nccl_takes_and_the_gdr_level_it_needs() {
    // issue 30: the PCIe path GPU↔NIC as NCCL names it, and the verdict at NCCL's default level (PXB)
    let cases = [
        ("rig-4090-pix", Status::Pass, "PIX (one PCIe switch between them): NCCL uses GDR at its default NCCL_NET_GDR_LEVEL (PXB)"),
        ("rig-4090-phb", Status::Warn, "PHB (through the CPU's PCIe root complex): NCCL turns GDR off at its default NCCL_NET_GDR_LEVEL (PXB); it needs NCCL_NET_GDR_LEVEL=PHB"),
        ("rig-4090-sys", Status::Warn, "SYS (across the link between CPU sockets): NCCL turns GDR off at its default NCCL_NET_GDR_LEVEL (PXB); it needs NCCL_NET_GDR_LEVEL=SYS"),
    ];
    for (f, want, says) in cases {
        let r = doctor(&fixture(f));
        let topo: Vec<&Check> = r.checks.iter().filter(|c| c.id.starts_with("topo.")).collect();
        assert_eq!(topo.len(), 2, "{f}: one per GPU: {}", r.text());
        for c in topo {
            assert_eq!(c.status, want, "{f}: {}", r.text());
            assert!(c.summary.ends_with(says), "{f}: {}", c.summary);
            assert!(
                c.evidence.iter().any(|e| e.starts_with("GPU ") && e.contains(" /sys/devices/pci")),
                "{f}: {:?}",
                c.evidence
            );
        }
        assert!(r.get("p2p.reads").is_none(), "{f}: no Intel client CPU");
        assert_ne!(r.exit_code(), 1, "{f}: a path is no FAIL");
    }
    // the switch fixture picks each GPU's own NIC
    let r = doctor(&fixture("rig-4090-pix"));
    assert!(
        r.get("topo.0000:43:00.0").unwrap().summary.starts_with("GPU 0000:43:00.0 ↔ mlx5_1: PIX"),
        "{}",
        r.text()
    );
    // a record of an older gdr-state-record has no paths: said, not judged
    let r = doctor(&fixture("rig-4090-ok"));
    assert_eq!(status(&r, "topo.paths"), Status::Info);
    // a 256 MiB BAR1 (no Resizable BAR) is a WARN with its fix, and the rig stays ready
    let r = doctor(&fixture("rig-4090-bar1-256"));
    assert_eq!((status(&r, "gpu0.bar1"), r.exit_code()), (Status::Warn, 0), "{}", r.text());
    let c = r.get("gpu0.bar1").unwrap();
    assert!(
        c.summary.starts_with("BAR1 256 MiB < memory 24564 MiB")
            && c.fix.contains("NCCL_LOCAL_REGISTER=0"),
        "{}",
        r.text()
    );
}

#[test]
fn nccls_path_types_from_sysfs_paths() {
    use crate::topology::{classify, PathType};
    let dev = |p: &str, numa: i32| PciDev {
        gpu: true,
        name: String::new(),
        path: p.split('/').map(str::to_string).collect(),
        numa: Some(numa),
    };
    let gpu = dev("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0);
    // one switch
    assert_eq!(
        classify(&gpu, &dev("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0)),
        PathType::Pix
    );
    // two switch levels
    assert_eq!(
        classify(&gpu, &dev("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0)),
        PathType::Pxb
    );
    // another root port of the same root complex
    assert_eq!(classify(&gpu, &dev("pci0000:00/0000:00:03.1/0000:08:00.0", 0)), PathType::Phb);
    // another root complex of the same NUMA node (nvidia-smi's NODE), and of the other socket
    assert_eq!(classify(&gpu, &dev("pci0000:40/0000:40:01.1/0000:41:00.0", 0)), PathType::Phb);
    assert_eq!(classify(&gpu, &dev("pci0000:80/0000:80:01.1/0000:81:00.0", 1)), PathType::Sys);
    assert_eq!(
        classify(&gpu, &PciDev { numa: None, ..dev("pci0000:80/0000:80:01.1/0000:81:00.0", 0) }),
        PathType::Sys
    );
}

#[test]
fn an_intel_client_platform_warns_that_p2p_reads_may_fail() {
    // issue 30: NVIDIA/open-gpu-kernel-modules#1253, reads through the CPU fail, writes work
    let r = doctor(&fixture("rig-4090-intel-client"));
    let c = r.get("p2p.reads").unwrap();
    assert_eq!(c.status, Status::Warn, "{}", r.text());
    assert!(c.summary.starts_with("P2P reads may fail: run the self-test"), "{}", c.summary);
    assert!(
        c.evidence.iter().any(|e| e.contains("#1253"))
            && c.evidence.iter().any(|e| e.contains("i9-13900K")),
        "{:?}",
        c.evidence
    );
    // the same CPU with GPU and NIC under one switch: the reads stay below the CPU
    let pix = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/state/rig-4090-pix/pci-paths.txt"),
    )
    .unwrap();
    let cpu = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/state/rig-4090-intel-client/cpu.txt"),
    )
    .unwrap();
    let st = State::from_pairs(&[("cpu", cpu.as_str()), ("pci-paths", pix.as_str())]);
    assert_eq!(crate::topology::p2p_reads_check(&st).unwrap().status, Status::Pass);
    // an AMD CPU is not in the table
    let st = State::from_pairs(&[(
        "cpu",
        "vendor_id\t: AuthenticAMD\nmodel name\t: AMD Ryzen 9 7950X\n",
    )]);
    assert!(crate::topology::p2p_reads_check(&st).is_none());
}
