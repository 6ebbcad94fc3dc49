//! The tool as users call it: exit codes 0 pass, 1 fail, 2 unusable input.

use std::path::Path;
use std::process::Command;

fn tool(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn verify_run_exit_codes() {
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        "tests/fixtures/nccl-logs/h200-allreduce-patched-shim.log",
    ]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("RESULT: PASS") && out.contains("PASS nccl.wrong"), "{out}");
    // --expect-gdr on a one-node run: no NET connection, so no proof
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        "tests/fixtures/nccl-logs/h200-allreduce-patched-shim.log",
        "--expect-gdr",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("FAIL nccl.gdr"), "{out}");
    let (rc, out) = tool(&["verify-run", "--nccl-log", "/nonexistent.log"]);
    assert_eq!(rc, 2, "{out}");
    let (rc, out) = tool(&["verify-run", "--nccl-log", "Cargo.toml"]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("not a NCCL Tests log"), "{out}");
    let (rc, _) = tool(&["verify-run", "--expect-gdr"]);
    assert_eq!(rc, 2);
    let (rc, out) = tool(&[
        "verify-run",
        "--nccl-log",
        "tests/fixtures/nccl-logs/h200-allreduce-stock.log",
        "--json",
    ]);
    assert_eq!(rc, 0);
    assert!(out.trim_end().ends_with("\"result\":\"PASS\",\"exit\":0}"), "{out}");
}

#[test]
fn doctor_exit_codes() {
    assert_eq!(tool(&["doctor", "--from", "tests/fixtures/state/rig-4090-ok"]).0, 0);
    assert_eq!(tool(&["doctor", "--from", "tests/fixtures/state/rig-4090-ofed"]).0, 0);
    // a GPU and a driver but no HCA (a datacenter GPU: P2P and the GPU side judged): ready
    let (rc, out) = tool(&["doctor", "--from", "tests/fixtures/state/h200"]);
    assert_eq!(rc, 0, "{out}");
    assert!(!out.contains("could not check here"), "{out}");
    let (rc, out) = tool(&["doctor", "--from", "tests/fixtures/state/rig-4090-bad", "--json"]);
    assert_eq!(rc, 1);
    assert!(out.contains("\"id\":\"p2p.matrix\",\"status\":\"FAIL\""), "{out}");
    assert!(out.trim_end().ends_with("\"result\":\"FAIL\",\"exit\":1}"), "{out}");
    assert_eq!(tool(&["doctor", "--from", "tests"]).0, 2, "not a saved state");
    assert_eq!(tool(&["doctor"]).0, 2);
}

/// A saved state in which nothing GPUDirect needs could be seen is "could not check" (2), never
/// ready (0): an empty state, and a machine with no driver, GPU or HCA.
#[test]
fn doctor_could_not_check() {
    let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-state", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("RECORD"), "saved 20261203T000000Z\nhost ci\n").unwrap();
    let (rc, out) = tool(&["doctor", "--from", empty.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("could not check here: no NVIDIA kernel module and no GPU"), "{out}");
    let (rc, out) = tool(&["doctor", "--from", empty.to_str().unwrap(), "--json"]);
    assert_eq!(rc, 2, "{out}");
    assert!(
        out.trim_end().ends_with("\"result\":\"COULD NOT CHECK\",\"exit\":2}")
            && out.contains("\"could_not_check\":\"no NVIDIA"),
        "{out}"
    );
    // a machine as gdr-state-record saves it where there is no driver, no GPU and no HCA (CI):
    // some things are judged (memlock, kernel config), but nothing about GPUs
    let bare = d.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    for (f, t) in [
        ("RECORD", "saved 20261203T000000Z\nhost ci\n"),
        (
            "proc-driver-version.txt",
            "cat: /proc/driver/nvidia/version: No such file or directory\n# exit status 1\n",
        ),
        ("nvidia-smi-q.txt", "# not run: nvidia-smi is not installed\n"),
        ("ibv-devinfo.txt", "# not run: ibv_devinfo is not installed\n"),
        ("memlock.txt", "unlimited\n"),
        ("dmesg-nvidia.txt", "\n"),
    ] {
        std::fs::write(bare.join(f), t).unwrap();
    }
    let (rc, out) = tool(&["doctor", "--from", bare.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("PASS limits.memlock") && out.contains("could not check here"), "{out}");
    // the same machine with a FAIL found is not ready (1), whatever could not be checked
    std::fs::write(
        bare.join("ibv-devinfo.txt"),
        "hca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tlink_layer:\t\tEthernet\n",
    )
    .unwrap();
    std::fs::write(bare.join("memlock.txt"), "64\n").unwrap();
    let (rc, out) = tool(&["doctor", "--from", bare.to_str().unwrap()]);
    assert_eq!(rc, 1, "{out}");
    // and it says what could not be checked, in the text as in the JSON (issue 40)
    assert!(out.contains("FAIL limits.memlock"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("RESULT: FAIL (")
            && last.contains("; could not check here: no NVIDIA kernel module"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(d);
}

/// `report` (issue 30): one file to attach, with the verdict, the route and its prerequisites, the
/// PCIe paths and the self-test's figures, and nothing that names the machine or its network
/// unless --private.
#[test]
fn report_is_one_file_to_share_with_nothing_private() {
    let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-report", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let selftest = d.join("selftest.txt");
    std::fs::write(
        &selftest,
        "PASS            step 4 rdma.write.gpu-gpu         16777216 bytes\nbandwidth (Gb/s; link 100.00 Gb/s): write.gpu-gpu 64K:40.10\n",
    )
    .unwrap();
    let (rc, out) = tool(&[
        "report",
        "--from",
        "tests/fixtures/state/rig-4090-bad",
        "--selftest",
        selftest.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "a report of a rig that is not ready is still a report: {out}");
    for section in [
        "# gdrshim report",
        "## Verdict",
        "doctor: FAIL (",
        "## Route and its prerequisites",
        "## PCIe paths",
        "## Machine",
        "## Self-test",
        "## Every check of the doctor",
    ] {
        assert!(out.contains(section), "{section}: {out}");
    }
    assert!(
        out.contains("- FAIL `route.dmabuf`") && out.contains("write.gpu-gpu 64K:40.10"),
        "{out}"
    );
    assert!(out.contains("- GPU 00000000:01:00.0 NVIDIA GeForce RTX 4090 (Ada Lovelace), memory 24564 MiB, BAR1 256 MiB"), "{out}");
    // what names the machine, its network or what runs on it stays out
    let state = std::fs::read_to_string("../tests/fixtures/state/rig-4090-bad/kernel.txt").unwrap();
    let host = state.split_whitespace().nth(1).unwrap().to_string();
    let (_, private) =
        tool(&["report", "--from", "tests/fixtures/state/rig-4090-bad", "--private"]);
    for secret in [format!(" {host} "), "10.100.".into(), "python3".into(), "nvcr.io".into()] {
        assert!(!out.contains(&secret), "{secret:?} in the shared report:\n{out}");
    }
    assert!(private.contains("python3"), "--private keeps it: {private}");
    // the GIDs of an active RoCE port carry its IP address
    let (_, ok) = tool(&["report", "--from", "tests/fixtures/state/rig-4090-ok"]);
    let (_, ok_private) =
        tool(&["report", "--from", "tests/fixtures/state/rig-4090-ok", "--private"]);
    assert!(ok_private.contains("::ffff:10.100.100.1"), "{ok_private}");
    assert!(!ok.contains("10.100.100.1") && ok.contains("<address>"), "{ok}");
    let (rc, _) = tool(&["report", "--from", "tests"]);
    assert_eq!(rc, 2, "not a saved state");
}

/// `env` (issue 40): the shim's verdict on a job's variables, before the job, on a machine with no
/// GPU: the library's own parser, what it does not see (a typo'd name, LD_PRELOAD), exit 1 on a
/// value the shim would refuse.
#[test]
fn env_says_what_the_shim_would_do_with_the_variables() {
    let env = |vars: &[(&str, &str)], args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"));
        c.arg("env").args(args).env_clear().envs(vars.iter().copied());
        let o = c.output().unwrap();
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (rc, out) = env(&[], &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("PASS env.mode") && out.contains("register: at each verbs registration"),
        "{out}"
    );
    assert!(out.contains("INFO env.preload") && out.contains("does not load the shim"), "{out}");
    // what a job would be refused or warned about, named with the shim's own words
    let (rc, out) = env(
        &[("GDRSHIM_MODE", "Register!"), ("GDRSHIM_LOGLEVEL", "debug")],
        &["GDRSHIM_ROUTE=peermem"],
    );
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("FAIL env.mode") && out.contains("using shadow (registers nothing)"),
        "{out}"
    );
    assert!(
        out.contains("PASS env.route") && out.contains("route nv503c"),
        "the parser's own alias: {out}"
    );
    assert!(out.contains("WARN env.unknown.GDRSHIM_LOGLEVEL"), "{out}");
    assert!(out.lines().last().unwrap().starts_with("RESULT: FAIL ("), "{out}");
    // the shim's own files: the release layout, the core beside the front
    let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-env", std::process::id()));
    std::fs::create_dir_all(d.join("lib")).unwrap();
    std::fs::write(d.join("lib/libgdrshim.so"), "front").unwrap();
    let front = d.join("lib/libgdrshim.so").display().to_string();
    let (rc, out) = env(&[], &[&format!("LD_PRELOAD={front}")]);
    assert!(rc == 1 && out.contains("but not ") && out.contains("libgdrshim-core.so"), "{out}");
    std::fs::write(d.join("lib/libgdrshim-core.so"), "core").unwrap();
    let (rc, out) = env(&[], &[&format!("LD_PRELOAD={front}")]);
    assert!(rc == 0 && out.contains("PASS env.preload"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
    let (rc, out) = env(&[("NCCL_GDR_FLUSH_DISABLE", "1")], &["--json"]);
    assert_eq!(rc, 1);
    assert!(
        out.contains("\"id\":\"env.advertise\",\"status\":\"FAIL\"")
            && out.trim_end().ends_with("\"result\":\"FAIL\",\"exit\":1}"),
        "{out}"
    );
}

/// The doctor inside a container (issue 41): what the runtime did not give, on the container rig
/// fixture and copies of it with one item changed.
#[test]
fn the_doctor_says_what_a_container_runtime_did_not_give() {
    let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-container", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let variant = |name: &str, file: &str, text: &str| {
        let at = d.join(name);
        std::fs::create_dir_all(&at).unwrap();
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state/container-rig");
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, at.join(p.file_name().unwrap())).unwrap();
        }
        std::fs::write(at.join(file), text).unwrap();
        at.to_str().unwrap().to_string()
    };
    let line = |out: &str, id: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(id))
            .unwrap_or_default()
            .to_string()
    };
    // as the CDI spec gives it: nothing missing
    let (rc, out) = tool(&["doctor", "--from", "tests/fixtures/state/container-rig"]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        line(&out, "container.runtime").starts_with("INFO")
            && out.contains("inside a container (docker)"),
        "{out}"
    );
    for id in ["container.devices", "container.shim", "limits.memlock"] {
        assert!(line(&out, id).starts_with("PASS"), "{id}: {out}");
    }
    assert!(!out.contains("container.privileged"), "{out}");
    // no device nodes
    let nodes =
        "crw-rw-rw- 1 root root 195,   0 Dec  5 09:00 /dev/nvidia0\nls: cannot access '/dev/infiniband': No such file or directory\n";
    let (rc, out) = tool(&["doctor", "--from", &variant("no-nodes", "dev-nodes.txt", nodes)]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        line(&out, "container.devices").starts_with("FAIL")
            && out.contains("lacks uverbs0 uverbs1"),
        "{out}"
    );
    assert!(out.contains("--device gdrshim/rdma=all"), "the fix names the CDI device: {out}");
    // no LD_PRELOAD
    let (rc, out) =
        tool(&["doctor", "--from", &variant("no-preload", "preload.txt", "LD_PRELOAD=\n")]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        line(&out, "container.shim").starts_with("FAIL")
            && out.contains("does not name libgdrshim.so"),
        "{out}"
    );
    // LD_PRELOAD set, the release not mounted
    let gone = "LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so\nls: cannot access '/opt/rtx4090-gdr/current/lib/libgdrshim.so': No such file or directory\n";
    let (_, out) = tool(&["doctor", "--from", &variant("not-mounted", "preload.txt", gone)]);
    assert!(
        line(&out, "container.shim").starts_with("FAIL")
            && out.contains("files are not in the container"),
        "{out}"
    );
    // an 8 MiB and a 64 KiB memlock limit: ENOMEM predicted, with what counts and Docker's fix
    for (kib, what) in [
        ("8192", "the self-test's reg.host (2 x 16 MiB) fails"),
        ("64", "the self-test's reg.host (2 x 16 MiB) fails"),
    ] {
        let (rc, out) = tool(&[
            "doctor",
            "--from",
            &variant(&format!("memlock-{kib}"), "memlock.txt", &format!("{kib}\n")),
        ]);
        assert_eq!(rc, 1, "{out}");
        let l = line(&out, "limits.memlock");
        assert!(
            l.starts_with("FAIL")
                && l.contains(&format!("{kib} KiB"))
                && l.contains("ENOMEM")
                && l.contains(what),
            "{out}"
        );
        assert!(out.contains("not charged: dma-buf MRs, ib_umem_dmabuf_get"), "{out}");
        assert!(out.contains("fix: docker run --ulimit memlock=-1"), "{out}");
    }
    // Kubernetes: the runtime's limit, or CAP_IPC_LOCK
    let k8s = variant(
        "k8s",
        "container.txt",
        "env KUBERNETES_SERVICE_HOST\ncgroup 0::/kubepods/burstable/pod1/c0ffee\n",
    );
    std::fs::write(Path::new(&k8s).join("memlock.txt"), "64\n").unwrap();
    let (_, out) = tool(&["doctor", "--from", &k8s]);
    assert!(
        out.contains("(kubernetes)")
            && out.contains("LimitMEMLOCK=infinity")
            && out.contains("IPC_LOCK"),
        "{out}"
    );
    // a container given all of /dev/infiniband
    let all = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/state/rig-4090-ok/dev-nodes.txt"),
    )
    .unwrap();
    let (_, out) = tool(&["doctor", "--from", &variant("privileged", "dev-nodes.txt", &all)]);
    assert!(
        line(&out, "container.privileged").starts_with("WARN") && out.contains("issm0 umad0"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
