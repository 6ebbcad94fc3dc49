//! The real libgdrshim.so in a child process, with a fake NVIDIA driver (tests/c/fakenv.c,
//! preloaded after the shim) replaying traffic captured on the H200, and a fake libcuda reached
//! through dlopen + dlsym + cuGetProcAddress. The shim's exit summary must equal what the pure
//! replay of the same capture computes, and the oracle figures must hold; each mode, and the
//! registrations of a GeForce-style driver. The shim among the program's calls and libraries is
//! tests/interpose.rs's.

use std::collections::HashMap;
use std::path::Path;

mod common;
use common::player::{fixture, run_player, run_player_env, summary, try_player, try_player_peer};

fn live_equals_replay(name: &str) -> HashMap<String, String> {
    let text = fixture(name);
    let (out, err) = run_player(&text, "580.159.04", "shadow", name);
    let live = summary(&err).unwrap_or_else(|| panic!("no summary line in {err}"));
    let replay = gdrshim::capture::replay(&text);
    let want = summary(&format!("gdrshim: summary {}", gdrshim::capture::summary_fields(&replay)))
        .unwrap();
    assert!(out.contains("rc_mismatch=0"), "{out}");
    for k in [
        "native",
        "matched",
        "mismatched",
        "unpredicted",
        "predicted_only",
        "user_allocs",
        "uncovered",
        "decoded",
        "malformed",
        "map_entries",
    ] {
        assert_eq!(
            live.get(k),
            want.get(k),
            "{name}: {k} live {:?} vs replay {:?}\n{err}",
            live.get(k),
            want.get(k)
        );
    }
    assert_eq!(live["nv_ioctls"], want["ioctls"], "{name}: every replayed ioctl reached the shim");
    assert_eq!(live["driver"], "580.159.04");
    live
}

#[test]
fn alloc_probe_through_the_real_shim() {
    let s = live_equals_replay("alloc-probe.cap.gz");
    assert_eq!(s["mismatched"], "0");
    assert_eq!(s["uncovered"], "0");
    // cudaMalloc, cuMemAlloc 3M, the 4K sub-allocations' chunk, the VMM map and its remap.
    assert_eq!(
        (s["native"].as_str(), s["matched"].as_str(), s["unpredicted"].as_str()),
        ("6", "6", "0")
    );
    // cudaMallocAsync's pool is the one user allocation libcuda does not register.
    assert_eq!(s["predicted_only"], "1");
    assert!(s["wrapped"].parse::<u64>().unwrap() >= 3);
}

#[test]
fn torch_caching_allocator_through_the_real_shim() {
    let s = live_equals_replay("torch-alloc.cap.gz");
    assert_eq!((s["mismatched"].as_str(), s["uncovered"].as_str()), ("0", "0"));
    assert_eq!(s["matched"], s["native"]);
    assert_eq!(s["unpredicted"], "0");
    assert!(s["native"].parse::<u64>().unwrap() > 10);
}

#[test]
fn torch_expandable_segments_through_the_real_shim() {
    let s = live_equals_replay("torch-exp.cap.gz");
    assert_eq!(
        (s["mismatched"].as_str(), s["uncovered"].as_str(), s["unpredicted"].as_str()),
        ("0", "0", "0")
    );
    assert_eq!(s["matched"], s["native"]);
}

#[test]
fn nccl_one_rank_through_the_real_shim() {
    let s = live_equals_replay("torch-nccl.cap.gz");
    assert_eq!(
        (s["mismatched"].as_str(), s["uncovered"].as_str(), s["unpredicted"].as_str()),
        ("0", "0", "0")
    );
    assert_eq!(s["matched"], s["native"]);
}

#[test]
fn unknown_driver_is_pure_pass_through_with_one_warning() {
    let text = fixture("alloc-probe.cap.gz");
    let (_, err) = run_player(&text, "600.10.01", "shadow", "unknown");
    let s = summary(&err).unwrap();
    assert_eq!(s["decoded"], "0");
    assert_eq!(s["abi"], "none");
    assert_eq!(s["passthrough"], s["nv_ioctls"]);
    assert_eq!(err.matches("no verified ABI table").count(), 1, "{err}");
}

#[test]
fn off_mode_is_silent() {
    let text = fixture("alloc-probe.cap.gz");
    let (out, err) = run_player(&text, "580.159.04", "off", "off");
    assert!(summary(&err).is_none(), "{err}");
    assert!(!err.contains("[gdrshim]"), "{err}");
    assert!(out.contains("rc_mismatch=0"));
}

/// The alloc-probe capture as a GeForce would produce it (libcuda's own 503C traffic removed),
/// with verbs registrations inserted after the marks that name each allocation.
fn geforce_scenario(keep_native: bool) -> String {
    let text = fixture("alloc-probe.cap.gz");
    let mut out = String::new();
    for line in text.lines() {
        if !keep_native {
            if let Some(gdrshim::capture::Record::Ioctl(io)) = gdrshim::capture::parse_line(line) {
                let w = |o: usize| {
                    io.arg
                        .get(o..o + 4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0)
                };
                let nr = io.request & 0xff;
                if (nr == 0x2b && w(12) == 0x503c) || (nr == 0x2a && w(8) >> 16 == 0x503c) {
                    continue;
                }
            }
        }
        out.push_str(line);
        out.push('\n');
        let mut add = |s: &str| out.push_str(s);
        match line {
            "M cudaMalloc 64M" => add("R 0 iova2 7f63d6000000 4000000 ok\nR 1 direct 7f63d6001000 1000 ok\nD 1\nP 7f63d6010000 10000\n"),
            // a MR moved by ibv_rereg_mr from the 3M buffer to the 64M one, then back
            "M cuMemAlloc 3M" => add("R 9 iova2 7f63f8800000 300000 ok\nE 9 7f63d6100000 10000 ok\nE 9 7f63f8800000 1000 ok\nD 9\n"),
            "M cuMemAlloc 4K x2" => add("R 2 dlsym 7f63f3e00000 1000 ok\nR 3 dlsym 7f63f3e01000 1000 ok\nD 2\nD 3\n"),
            "M vmm map" => add("R 4 iova2 7f63f8c00000 800000 ok\n"),
            "M vmm remap" => add("D 4\nR 5 iova2 7f63f9400000 800000 ok\nD 5\nR 6 host 0 1000 ok\nD 6\n"),
            "M frees" => add("R 7 iova2 7f63d6000000 1000 any\nD 0\nD 7\nX dmabuf\n"),
            "M mallocAsync" => add("R 8 iova2 302000000 800000 ok\nD 8\n"),
            _ => {}
        }
    }
    out
}

#[test]
fn registration_path_on_a_geforce_style_driver() {
    let (out, err) = run_player(&geforce_scenario(false), "580.159.04", "register", "geforce");
    let s = summary(&err).unwrap_or_else(|| panic!("no summary: {err}"));
    // every registration the fake NIC checked was exact (EFAULT otherwise: player would fail)
    assert!(out.contains("verbs_unexpected=0"), "{out}\n{err}");
    assert!(
        out.contains("kernel_registrations_left=0") && out.contains("kernel_p2p_errors=0"),
        "{out}"
    );
    assert_eq!(s["native"], "0");
    // the explicit interface shares the live registration of the 64M buffer, then lets go
    assert!(out.contains("explicit handle=1 lookup=0 offset=65536 unregister=0 again=-2"), "{out}");
    assert_eq!(
        (s["rm_errors"].as_str(), s["live_registrations"].as_str(), s["p2p_objects"].as_str()),
        ("0", "0", "1")
    );
    assert_eq!(s["registered"], s["unregistered"]);
    // 64M, 3M, 4K chunk, VMM, VMM remap, mallocAsync pool, and 3M again after the rereg moved
    // its only MR away and back: seven registrations; shared ones count once
    assert_eq!(s["registered"], "7", "{err}");
    assert_eq!(s["pass0_hits"], "11");
    assert_eq!(s["pass0_misses"], "1", "the freed buffer is a miss: {err}");
    assert_eq!((s["host_mrs"].as_str(), s["dmabuf_mrs"].as_str()), ("1", "1"));
    assert!(err.contains("pass0 miss: freed"), "{err}");
}

#[test]
fn shadow_mode_decides_but_never_calls_rm() {
    let (out, err) = run_player(
        &geforce_scenario(false).replace(" ok\n", " any\n"),
        "580.159.04",
        "shadow",
        "geforce-shadow",
    );
    let s = summary(&err).unwrap();
    assert!(out.contains("kernel_registrations_left=0"));
    assert_eq!((s["registered"].as_str(), s["p2p_objects"].as_str()), ("0", "0"));
    // the fake NIC refuses what nothing registered, so the two re-registrations never happen
    assert_eq!(s["pass0_hits"], "8");
    assert!(err.contains("would register"), "{err}");
    assert!(
        out.contains("explicit handle=-1 lookup=0"),
        "explicit registration is refused (EPERM) outside register mode: {out}"
    );
}

#[test]
fn native_registration_present_means_the_shim_registers_nothing() {
    let (_, out, err) = try_player(
        &geforce_scenario(true).replace(" ok\n", " any\n"),
        "580.159.04",
        "register",
        "native",
    );
    let s = summary(&err).unwrap_or_else(|| panic!("{out}{err}"));
    assert_eq!((s["registered"].as_str(), s["p2p_objects"].as_str()), ("0", "0"));
    // eight verbs registrations and one explicit one: libcuda registered them all natively
    assert_eq!(s["stood_aside"], "9");
    assert!(out.contains("explicit handle=0 lookup=0 offset=65536 unregister=0 again=0"), "{out}");
    assert_eq!(err.matches("native registration present (libcuda").count(), 1, "{err}");
}

#[test]
fn eager_mode_registers_every_user_allocation_at_map_time() {
    let text = geforce_scenario(false);
    let (out, err) = run_player_env(&text, "register", "eager", &[("GDRSHIM_EAGER", "1")]);
    let s = summary(&err).unwrap();
    assert!(
        out.contains("verbs_unexpected=0") && out.contains("kernel_p2p_errors=0"),
        "{out}\n{err}"
    );
    assert_eq!(s["rm_errors"], "0");
    // registered at allocation time: 64M, 3M, 4K chunk, VMM, VMM remap, pool (and the pitch chunk)
    assert!(s["registered"].parse::<u64>().unwrap() >= 6, "{err}");
    // what the shim believes is live is what the fake kernel holds
    let left: String = out
        .split("kernel_registrations_left=")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    assert_eq!(s["live_registrations"], left);
}

/// The stock-NCCL route: NCCL's GPU-side gate (the driver attribute, reached through
/// cuGetProcAddress as cudart does) on a fake GeForce; its NIC-side peer-memory probe (`access` of
/// the nv_mem file) is the kernel's alone.
fn gdr_probe(mode: &str, tag: &str, extra: &[(&str, &str)]) -> (String, String) {
    let text = format!("{}G\n", fixture("alloc-probe.cap.gz"));
    let (out, err) = run_player_env(&text, mode, tag, extra);
    let line = out
        .lines()
        .find(|l| l.starts_with("gdr_probe "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    (line, err)
}

#[test]
fn stock_nccl_probes_are_answered_while_registering_unless_turned_down() {
    // what the file system says of the peer-memory file, which gdrshim never changes
    let exists = Path::new("/sys/kernel/mm/memory_peers/nv_mem/version").exists();
    let access = format!(
        "access={} errno_after={}",
        if exists { 0 } else { -1 },
        if exists { 777 } else { libc::ENOENT }
    );
    let (l, err) = gdr_probe("register", "adv-on", &[("GDRSHIM_ADVERTISE_GDR", "1")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=1 {access}"), "{err}");
    assert!(
        err.contains(
            "cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED, device 0): driver says 0, answered 1"
        ),
        "{err}"
    );
    assert!(summary(&err).unwrap()["gdr_answers"] != "0");

    let (l, err) = gdr_probe("register", "adv-default", &[]);
    assert_eq!(
        l,
        format!("gdr_probe rc=0 attr=1 {access}"),
        "advertised by default while registering: {err}"
    );

    let (l, _) = gdr_probe("register", "adv-off", &[("GDRSHIM_ADVERTISE_GDR", "0")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=0 {access}"), "turned down: untouched");

    let (l, err) = gdr_probe("shadow", "adv-shadow", &[("GDRSHIM_ADVERTISE_GDR", "1")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=0 {access}"));
    assert!(err.contains("GPUDirect RDMA not advertised: gdrshim registers nothing here"), "{err}");

    let (l, err) = gdr_probe(
        "register",
        "adv-noflush",
        &[("GDRSHIM_ADVERTISE_GDR", "1"), ("NCCL_GDR_FLUSH_DISABLE", "1")],
    );
    assert_eq!(l, format!("gdr_probe rc=0 attr=0 {access}"));
    assert!(err.contains("NCCL_GDR_FLUSH_DISABLE is set"), "{err}");
}

#[test]
fn with_no_peer_memory_module_no_route_is_claimed() {
    // no nvidia-peermem and no dma-buf route (this replay's fake driver knows no capability
    // query): nothing registered, nothing advertised, and the peer-memory file is never faked
    let text = format!("{}G\n", fixture("alloc-probe.cap.gz"));
    let extra = [("GDRSHIM_ADVERTISE_GDR", "1"), ("GDRSHIM_ROUTE", "nv503c")];
    let (ok, o, e) = try_player_peer(&text, "580.159.04", "register", "nopeer", &extra, false);
    assert!(ok, "{o}\n{e}");
    let exists = Path::new("/sys/kernel/mm/memory_peers/nv_mem/version").exists();
    let line =
        o.lines().find(|l| l.starts_with("gdr_probe ")).unwrap_or_else(|| panic!("{o}\n{e}"));
    assert!(
        line.starts_with("gdr_probe rc=0 attr=0 "),
        "GDR not advertised without a route: {line}"
    );
    assert_eq!(line.contains("access=0"), exists, "the nv_mem file is the kernel's: {line}");
    assert!(
        e.contains("no registration route works here") && e.contains("NV503C lacks nvidia-peermem"),
        "{e}"
    );
    let s = summary(&e).unwrap();
    assert_eq!((s["registered"].as_str(), s["route"].as_str()), ("0", "none"), "{e}");
}
