//! The real libgdrshim.so in a child process, with a fake NVIDIA driver (tests/c/fakenv.c,
//! preloaded after the shim) replaying traffic captured on the H200, and a fake libcuda reached
//! through dlopen + dlsym + cuGetProcAddress. The shim's exit summary must equal what the pure
//! replay of the same capture computes, and the oracle figures must hold.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{sh, Env};

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::build("it");
        let (root, dir) = (Path::new(env!("CARGO_MANIFEST_DIR")), e.dir.clone());
        let c = root.join("tests/c");
        let cc = |args: &[&str]| common::cc(&e, args);
        let f = common::fakes::Fakes::in_dir(&dir);
        f.fakenv();
        f.fakecuda();
        f.fakeverbs("libibverbs.so.1", common::fakes::NEW);
        cc(&[
            "-O1",
            "-o",
            "player",
            c.join("player.c").to_str().unwrap(),
            "-ldl",
            "-Wl,--no-as-needed",
            "-L.",
            "-l:libibverbs.so.1",
            "-Wl,-rpath,$ORIGIN",
        ]);
        cc(&["-shared", "-fPIC", "-o", "libnext_b.so", c.join("next_b.c").to_str().unwrap()]);
        cc(&["-shared", "-fPIC", "-o", "libnext_a.so", c.join("next_a.c").to_str().unwrap(), "-ldl"]);
        cc(&[
            "-o",
            "next_main",
            c.join("next_main.c").to_str().unwrap(),
            "-L.",
            "-Wl,--no-as-needed",
            "-lnext_a",
            "-lnext_b",
            "-Wl,-rpath,$ORIGIN",
        ]);
        for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
            std::fs::write(dir.join("dev").join(f), b"").unwrap();
        }
        e
    })
}

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap()).read_to_string(&mut s).unwrap();
    s
}

fn summary(text: &str) -> Option<HashMap<String, String>> {
    let line = text.lines().find(|l| l.starts_with("gdrshim: summary "))?;
    Some(
        line["gdrshim: summary ".len()..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Runs the player over `capture` under the shim; returns (stdout, stderr).
fn run_player(capture: &str, version: &str, mode: &str, tag: &str) -> (String, String) {
    let (ok, o, e) = try_player(capture, version, mode, tag);
    assert!(ok, "player failed: {o}\n{e}");
    (o, e)
}

fn run_player_env(capture: &str, mode: &str, tag: &str, extra: &[(&str, &str)]) -> (String, String) {
    let (ok, o, e) = try_player_env(capture, "580.159.04", mode, tag, extra);
    assert!(ok, "player failed: {o}\n{e}");
    (o, e)
}

fn try_player(capture: &str, version: &str, mode: &str, tag: &str) -> (bool, String, String) {
    try_player_env(capture, version, mode, tag, &[])
}

fn try_player_env(capture: &str, version: &str, mode: &str, tag: &str, extra: &[(&str, &str)]) -> (bool, String, String) {
    try_player_peer(capture, version, mode, tag, extra, true)
}

/// `peermem`: whether the (fake) nvidia-peermem module is loaded.
fn try_player_peer(capture: &str, version: &str, mode: &str, tag: &str, extra: &[(&str, &str)], peermem: bool) -> (bool, String, String) {
    let e = env();
    let dev = e.dir.join(format!("dev-{tag}"));
    std::fs::create_dir_all(&dev).unwrap();
    for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
        std::fs::write(dev.join(f), b"").unwrap();
    }
    std::fs::write(dev.join("version"), format!("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n"))
        .unwrap();
    // the fake NIC (fakeverbs.c) plays nvidia-peermem too: its module is "loaded"
    let _ = std::fs::remove_dir_all(dev.join("sys"));
    if peermem {
        std::fs::create_dir_all(dev.join("sys/module/nvidia_peermem")).unwrap();
    }
    let cap = e.dir.join(format!("{tag}.cap"));
    std::fs::write(&cap, capture).unwrap();
    let out = Command::new(e.dir.join("player"))
        .arg(&cap)
        .arg(e.dir.join("libcuda.so.1"))
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakenv.so").display()))
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("FAKENV_CAPTURE", &cap)
        .env("GDRSHIM_MODE", mode)
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("GDRSHIM_ROUTE", "nv503c")
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn live_equals_replay(name: &str) -> HashMap<String, String> {
    let text = fixture(name);
    let (out, err) = run_player(&text, "580.159.04", "shadow", name);
    let live = summary(&err).unwrap_or_else(|| panic!("no summary line in {err}"));
    let replay = gdrshim::capture::replay(&text);
    let want = summary(&format!("gdrshim: summary {}", gdrshim::capture::summary_fields(&replay))).unwrap();
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
        assert_eq!(live.get(k), want.get(k), "{name}: {k} live {:?} vs replay {:?}\n{err}", live.get(k), want.get(k));
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
    assert_eq!((s["native"].as_str(), s["matched"].as_str(), s["unpredicted"].as_str()), ("6", "6", "0"));
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
    assert_eq!((s["mismatched"].as_str(), s["uncovered"].as_str(), s["unpredicted"].as_str()), ("0", "0", "0"));
    assert_eq!(s["matched"], s["native"]);
}

#[test]
fn nccl_one_rank_through_the_real_shim() {
    let s = live_equals_replay("torch-nccl.cap.gz");
    assert_eq!((s["mismatched"].as_str(), s["uncovered"].as_str(), s["unpredicted"].as_str()), ("0", "0", "0"));
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

#[test]
fn rtld_next_answers_for_the_real_caller() {
    let e = env();
    let run = |preload: Option<&Path>| {
        let mut c = Command::new(e.dir.join("next_main"));
        if let Some(p) = preload {
            c.env("LD_PRELOAD", p);
        }
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    };
    assert_eq!(run(None), "next=B\n");
    assert_eq!(run(Some(&e.shim)), "next=B\n", "the shim's dlsym must not change whom RTLD_NEXT is relative to");
}

#[test]
fn errno_is_preserved_across_a_hooked_ioctl_on_an_nvidia_fd() {
    // The fake driver fails a request that does not match the capture with EINVAL; the shim must
    // hand that errno back untouched (the player checks rc; here we check errno via a tiny C probe).
    let e = env();
    let src = e.dir.join("errno_probe.c");
    std::fs::write(
        &src,
        r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
int main(void){ char p[4096]; snprintf(p,sizeof p,"%s/nvidiactl",getenv("GDRSHIM_TEST_DEV_DIR")); int fd=open(p,O_RDWR);
 unsigned char a[32]={0}; errno=12345; int r=ioctl(fd,0xC020462A,a); printf("r=%d errno=%d\n",r,errno); return 0;}"#,
    )
    .unwrap();
    sh(Command::new("cc").arg("-o").arg(e.dir.join("errno_probe")).arg(&src));
    let out = Command::new(e.dir.join("errno_probe"))
        .env("LD_PRELOAD", format!("{}:{}", e.shim.display(), e.dir.join("libfakenv.so").display()))
        .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
        .env("FAKENV_CAPTURE", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("r=-1 errno={}\n", libc::EINVAL));
}

/// The alloc-probe capture as a GeForce would produce it (libcuda's own 503C traffic removed),
/// with verbs registrations inserted after the marks that name each allocation.
fn geforce_scenario(keep_native: bool) -> String {
    let text = fixture("alloc-probe.cap.gz");
    let mut out = String::new();
    for line in text.lines() {
        if !keep_native {
            if let Some(gdrshim::capture::Record::Ioctl(io)) = gdrshim::capture::parse_line(line) {
                let w = |o: usize| io.arg.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
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
    assert!(out.contains("kernel_registrations_left=0") && out.contains("kernel_p2p_errors=0"), "{out}");
    assert_eq!(s["native"], "0");
    // the explicit interface shares the live registration of the 64M buffer, then lets go
    assert!(out.contains("explicit handle=1 lookup=0 offset=65536 unregister=0 again=-2"), "{out}");
    assert_eq!((s["rm_errors"].as_str(), s["live_registrations"].as_str(), s["p2p_objects"].as_str()), ("0", "0", "1"));
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
    let (out, err) = run_player(&geforce_scenario(false).replace(" ok\n", " any\n"), "580.159.04", "shadow", "geforce-shadow");
    let s = summary(&err).unwrap();
    assert!(out.contains("kernel_registrations_left=0"));
    assert_eq!((s["registered"].as_str(), s["p2p_objects"].as_str()), ("0", "0"));
    // the fake NIC refuses what nothing registered, so the two re-registrations never happen
    assert_eq!(s["pass0_hits"], "8");
    assert!(err.contains("would register"), "{err}");
    assert!(out.contains("explicit handle=-1 lookup=0"), "explicit registration is refused (EPERM) outside register mode: {out}");
}

#[test]
fn native_registration_present_means_the_shim_registers_nothing() {
    let (_, out, err) = try_player(&geforce_scenario(true).replace(" ok\n", " any\n"), "580.159.04", "register", "native");
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
    assert!(out.contains("verbs_unexpected=0") && out.contains("kernel_p2p_errors=0"), "{out}\n{err}");
    assert_eq!(s["rm_errors"], "0");
    // registered at allocation time: 64M, 3M, 4K chunk, VMM, VMM remap, pool (and the pitch chunk)
    assert!(s["registered"].parse::<u64>().unwrap() >= 6, "{err}");
    // what the shim believes is live is what the fake kernel holds
    let left: String = out.split("kernel_registrations_left=").nth(1).unwrap().chars().take_while(|c| c.is_ascii_digit()).collect();
    assert_eq!(s["live_registrations"], left);
}

#[test]
fn a_program_linked_against_libibverbs_binds_its_versioned_references_to_the_shim() {
    let e = env();
    let out = Command::new(e.dir.join("player"))
        .arg("/dev/null")
        .arg(e.dir.join("libcuda.so.1"))
        .env("LD_PRELOAD", &e.shim)
        .env("LD_DEBUG", "bindings")
        .env("LD_BIND_NOW", "1")
        .env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let bound = |sym: &str| {
        err.lines().any(|l| l.contains("binding file") && l.contains("player") && l.contains("libgdrshim.so") && l.contains(sym))
    };
    assert!(bound("`ibv_reg_mr' [IBVERBS_1.1]"), "ibv_reg_mr@IBVERBS_1.1 not bound to the shim");
}

/// The stock-NCCL route: NCCL's GPU-side gate (the driver attribute, reached through
/// cuGetProcAddress as cudart does) on a fake GeForce; its NIC-side peer-memory probe (`access` of
/// the nv_mem file) is the kernel's alone.
fn gdr_probe(mode: &str, tag: &str, extra: &[(&str, &str)]) -> (String, String) {
    let text = format!("{}G\n", fixture("alloc-probe.cap.gz"));
    let (out, err) = run_player_env(&text, mode, tag, extra);
    let line = out.lines().find(|l| l.starts_with("gdr_probe ")).unwrap_or_else(|| panic!("{out}")).to_string();
    (line, err)
}

#[test]
fn stock_nccl_probes_are_answered_while_registering_unless_turned_down() {
    // what the file system says of the peer-memory file, which gdrshim never changes
    let exists = Path::new("/sys/kernel/mm/memory_peers/nv_mem/version").exists();
    let access = format!("access={} errno_after={}", if exists { 0 } else { -1 }, if exists { 777 } else { libc::ENOENT });
    let (l, err) = gdr_probe("register", "adv-on", &[("GDRSHIM_ADVERTISE_GDR", "1")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=1 {access}"), "{err}");
    assert!(err.contains("cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED, device 0): driver says 0, answered 1"), "{err}");
    assert!(summary(&err).unwrap()["gdr_answers"] != "0");

    let (l, err) = gdr_probe("register", "adv-default", &[]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=1 {access}"), "advertised by default while registering: {err}");

    let (l, _) = gdr_probe("register", "adv-off", &[("GDRSHIM_ADVERTISE_GDR", "0")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=0 {access}"), "turned down: untouched");

    let (l, err) = gdr_probe("shadow", "adv-shadow", &[("GDRSHIM_ADVERTISE_GDR", "1")]);
    assert_eq!(l, format!("gdr_probe rc=0 attr=0 {access}"));
    assert!(err.contains("GPUDirect RDMA not advertised: gdrshim registers nothing here"), "{err}");

    let (l, err) = gdr_probe("register", "adv-noflush", &[("GDRSHIM_ADVERTISE_GDR", "1"), ("NCCL_GDR_FLUSH_DISABLE", "1")]);
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
    let line = o.lines().find(|l| l.starts_with("gdr_probe ")).unwrap_or_else(|| panic!("{o}\n{e}"));
    assert!(line.starts_with("gdr_probe rc=0 attr=0 "), "GDR not advertised without a route: {line}");
    assert_eq!(line.contains("access=0"), exists, "the nv_mem file is the kernel's: {line}");
    assert!(e.contains("no registration route works here") && e.contains("NV503C lacks nvidia-peermem"), "{e}");
    let s = summary(&e).unwrap();
    assert_eq!((s["registered"].as_str(), s["route"].as_str()), ("0", "none"), "{e}");
}

#[test]
fn the_c_header_compiles_and_works_with_and_without_the_shim() {
    let e = env();
    let bin = e.dir.join("header_use");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/header_use.c");
    sh(Command::new("cc").args(["-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE", "-o"]).arg(&bin).arg(&src).arg("-ldl"));
    sh(Command::new("c++")
        .args(["-x", "c++", "-fsyntax-only", "-Wall", "-Werror"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/gdrshim.h")));
    let run = |preload: bool, mode: &str| {
        let mut c = Command::new(&bin);
        c.env("GDRSHIM_TEST_DEV_DIR", e.dir.join("dev-header")).env("GDRSHIM_MODE", mode).env("GDRSHIM_SUMMARY", "0");
        c.env("GDRSHIM_ROUTE", "nv503c");
        if preload {
            c.env("LD_PRELOAD", &e.shim);
        }
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    };
    let dev = e.dir.join("dev-header");
    common::fakedev::fake_dev(&dev, &[], false);
    // without a peer-memory module the NV503C route cannot work: gdrshim says it is not active
    let _ = std::fs::remove_dir_all(dev.join("sys"));
    assert!(run(true, "register").contains(" active=0 "), "no route, no claim");
    std::fs::create_dir_all(dev.join("sys/module/nvidia_peermem")).unwrap();
    assert_eq!(run(false, "register"), "version=none mode=-38 active=0 lookup_host=-38 register_host=-38 register=0 unregister=0 unregister_again=0 counters=-38 registered=0 unregistered=0 abi=1\n");
    // loaded, register mode, known driver: host memory is refused with EINVAL, not registered
    assert_eq!(run(true, "register"), "version=0.3.0 mode=3 active=1 lookup_host=-2 register_host=-22 register=0 unregister=0 unregister_again=0 counters=176 registered=0 unregistered=0 abi=1\n");
    assert_eq!(run(true, "shadow"), "version=0.3.0 mode=2 active=0 lookup_host=-2 register_host=-1 register=0 unregister=0 unregister_again=0 counters=176 registered=0 unregistered=0 abi=1\n");
}

/// errno after every hooked call is what the real call left, and an injected panic in any hook
/// family changes nothing the program can see: the run is compared line by line with a run
/// without the shim.
#[test]
fn errno_and_results_are_the_real_ones_even_when_a_hook_panics() {
    let e = env();
    let bin = e.dir.join("errno_all");
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    sh(Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(c.join("errno_all.c"))
        .args(["-ldl", "-Wl,--no-as-needed", "-L"])
        .arg(&e.dir)
        .args(["-l:libibverbs.so.1", "-Wl,-rpath,$ORIGIN"]));
    let dev = e.dir.join("dev-errno");
    common::fakedev::fake_dev(&dev, &["nvidiactl"], false);
    let run = |preload: String, extra: &[(&str, &str)]| {
        let out = Command::new(&bin)
            .arg(e.dir.join("libcuda.so.1"))
            .env("LD_PRELOAD", preload)
            .env("GDRSHIM_TEST_DEV_DIR", &dev)
            .env("FAKENV_CAPTURE", "/nonexistent")
            .env("GDRSHIM_MODE", "register")
            .env("GDRSHIM_SUMMARY", "0")
            .envs(extra.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let fakenv = e.dir.join("libfakenv.so").display().to_string();
    let with = format!("{}:{fakenv}", e.shim.display());
    let (want, _) = run(fakenv.clone(), &[]);
    assert_eq!(want.lines().count(), 27, "{want}");
    assert!(want.contains(&format!("close bad              rc=-1 errno={}", libc::EBADF)), "{want}");
    assert!(want.contains("access ok              rc=0 errno=12345"), "{want}");
    let (got, err) = run(with.clone(), &[]);
    assert_eq!(got, want, "with the shim\n{err}");
    for site in ["ioctl", "hook", "dlsym"] {
        let (got, err) = run(with.clone(), &[("GDRSHIM_TEST_PANIC", site), ("GDRSHIM_LOG_LEVEL", "warn")]);
        assert_eq!(got, want, "panics injected at {site}\n{err}");
        assert!(err.contains("GDRSHIM_TEST_PANIC") || site == "dlsym", "{site}: the contained panic is reported: {err}");
    }
}

/// A log or capture path that is a symlink, in a folder that does not exist, or not writable:
/// not followed, one warning, logging goes to stderr, and the program runs as without the shim.
#[test]
fn hostile_log_and_capture_paths() {
    let e = env();
    let d = e.dir.join("paths");
    std::fs::create_dir_all(&d).unwrap();
    let victim = d.join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    let link = d.join("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let text = fixture("alloc-probe.cap.gz");
    for (tag, var, path, why) in [
        ("log-link", "GDRSHIM_LOG_FILE", link.clone(), "symbolic link"),
        ("log-nodir", "GDRSHIM_LOG_FILE", d.join("no/such/dir/log"), "does not exist"),
        ("log-dir", "GDRSHIM_LOG_FILE", d.clone(), "refused"),
        ("cap-link", "GDRSHIM_CAPTURE", link.clone(), "symbolic link"),
    ] {
        let (out, err) = run_player_env(&text, "shadow", tag, &[(var, path.to_str().unwrap())]);
        assert!(out.contains("rc_mismatch=0"), "{tag}: {out}");
        assert!(err.contains(var) && err.contains(why), "{tag}: one warning naming the variable and why: {err}");
        assert!(summary(&err).is_some(), "{tag}: logging fell back to stderr");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n", "{tag}: the symlink's target is untouched");
    }
}

/// fork() while other threads are inside the shim's core lock: no child hangs (the shim is inert
/// in a forked child, where CUDA cannot run either), and the parent's shim stays live.
#[test]
fn fork_while_other_threads_hold_the_shims_locks() {
    let e = env();
    let bin = e.dir.join("fork_locks");
    sh(Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fork_locks.c"))
        .args(["-ldl", "-lpthread"]));
    let dev = e.dir.join("dev-fork");
    common::fakedev::fake_dev(&dev, &[], false);
    // The first fork of each run races the shim's one-time initialisation in the spinning
    // threads (a child forked in the middle of it once waited on it forever): several runs.
    for run in 0..8 {
        let mut child = Command::new("timeout")
            .args(["60"])
            .arg(&bin)
            .arg("300")
            .env("LD_PRELOAD", &e.shim)
            .env("GDRSHIM_TEST_DEV_DIR", &dev)
            .env("GDRSHIM_MODE", "register")
            .env("GDRSHIM_SUMMARY", "0")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = child.wait().unwrap();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert_eq!(status.code(), Some(0), "run {run}: no child may hang (timeout exits 124): {out}");
        assert_eq!(out, "forks=300 children_ok=300 parent_counters=176 parent_lookup=-2\n", "run {run}");
    }
}

/// A root job and a file another user planted where its log or capture goes (`%p` names too):
/// refused, untouched, not read. Run by `scripts/dev/test.sh` as root (`--include-ignored`).
#[test]
#[ignore = "needs root: plants files owned by another uid"]
fn files_planted_by_another_user_are_refused() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let e = env();
    let d = e.dir.join("planted");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let text = fixture("alloc-probe.cap.gz");
    // the player's pid is not known in advance: plant one file, and name the log after it exactly
    for (tag, var) in [("planted-log", "GDRSHIM_LOG_FILE"), ("planted-cap", "GDRSHIM_CAPTURE")] {
        let f = d.join(tag);
        std::fs::write(&f, "theirs\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        let (out, err) = run_player_env(&text, "shadow", tag, &[(var, f.to_str().unwrap())]);
        assert!(out.contains("rc_mismatch=0"), "{tag}: {out}");
        assert!(err.contains(var) && err.contains("belongs to uid 65534"), "{tag}: {err}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "theirs\n", "{tag}: not written");
    }
}
