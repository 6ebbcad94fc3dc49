//! Both registration routes through the real libgdrshim.so, with the live fake driver (RM, UVM
//! and NV_ESC_EXPORT_TO_DMABUF_FD with nv-dmabuf.c's checks, each buffer a memfd) and the fake NIC
//! (`ibv_reg_dmabuf_mr` accepts only a buffer whose memory is, page by page, the process's memory
//! at the MR's addresses): which route the machine gets, and what each gives the NIC.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::rig::Rig;
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::rig::build("routes", &["routes"]);
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        common::cc(&e, &["-O1", "-Wall", "-Werror", "-o", "dlopened", c.join("dlopened.c").to_str().unwrap(), "-ldl"]);
        // the same library under another name: a second copy
        // (the core's own check: a second front is never called, so it has nothing to say)
        std::fs::copy(common::knobs_core(), e.dir.join("libgdrshim-copy.so")).unwrap();
        e
    })
}

/// `routes ARGS` on a fresh fake machine; returns (exit code, stdout, stderr).
fn routes(tag: &str, rig: &Rig, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
    routes_with_sysfs(tag, rig, args, extra, None)
}

/// The same, with the fake GPUs' PCI device (the fake's CARD_INFO: 0000:00:00.0) given a sysfs
/// `resource` file.
fn routes_with_sysfs(tag: &str, rig: &Rig, args: &[&str], extra: &[(&str, &str)], sysfs: Option<(&str, &str)>) -> (i32, String, String) {
    let e = env();
    let dev = common::rig::dev_dir(e, tag, rig);
    if let Some((_, resource)) = sysfs {
        let pci = dev.join("sys/bus/pci/devices/0000:00:00.0");
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("resource"), resource).unwrap();
    }
    common::rig::run(e, "routes", &dev, rig, args, extra)
}

fn summary(text: &str) -> HashMap<String, String> {
    let line = text.lines().find(|l| l.starts_with("gdrshim: summary ")).unwrap_or_else(|| panic!("no summary in {text}"));
    line["gdrshim: summary ".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn the_route_matrix() {
    for peermem in [false, true] {
        for capable in [false, true] {
            for new_verbs in [false, true] {
                let rig = Rig { peermem, capable, new_verbs };
                let tag = format!("m{}{}{}", peermem as u8, capable as u8, new_verbs as u8);
                let (code, out, err) = routes(&tag, &rig, &["matrix"], &[]);
                assert_eq!(code, 0, "{out}\n{err}");
                let line = find_line(&out, &err, "routes matrix ok");
                let s = summary(&err);
                let (route, reg) = (field(line, "route"), field(line, "registered"));
                let what = format!("peermem={peermem} capable={capable} ibv_reg_dmabuf_mr={new_verbs}: {line}\n{err}");
                if capable && new_verbs {
                    assert_eq!((route, reg, s["route"].as_str()), ("1", "yes", "dmabuf"), "{what}");
                    assert_eq!(s["dmabuf_exports"], "1", "{what}");
                    assert_eq!(s["registered"], "0", "no NV503C registration on the DMA-BUF route: {what}");
                } else if peermem {
                    assert_eq!((route, reg, s["route"].as_str()), ("2", "yes", "nv503c"), "{what}");
                    assert_eq!((s["registered"].as_str(), s["dmabuf_exports"].as_str()), ("1", "0"), "{what}");
                } else {
                    // no route: the call fails exactly as without gdrshim, and the log says why
                    assert_eq!((route, reg, field(line, "errno"), field(line, "active")), ("0", "no", "14", "0"), "{what}");
                    assert!(err.contains("no registration route works here") && err.contains("NV503C lacks nvidia-peermem"), "{what}");
                    assert_eq!(err.contains("ibv_reg_dmabuf_mr in libibverbs"), !new_verbs, "{what}");
                    assert_eq!(err.contains("dma-buf capability (RM says no"), !capable, "{what}");
                    assert_eq!(s["route"], "none", "{what}");
                }
                assert_eq!(s["rm_errors"], "0", "{what}");
            }
        }
    }
}

/// A route asked before the program has a GPU RM can answer for (its device without a subdevice
/// yet) is not decided then: the first GPU registration decides it on what RM says by then.
#[test]
fn a_route_asked_too_early_is_decided_later() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("early", &rig, &["early"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes early ok");
    assert_eq!((field(line, "before"), field(line, "route"), field(line, "registered")), ("0", "1", "yes"), "{line}\n{err}");
    assert_eq!(summary(&err)["route"], "dmabuf", "{err}");
}

/// gdrshim_register as the process's first registration on a DMA-BUF rig decides the route, and is
/// refused (a dma-buf has no registration to hold) without leaving a buffer open.
#[test]
fn an_explicit_registration_that_decides_dmabuf_leaves_no_buffer_open() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("explicit", &rig, &["explicit"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes explicit ok");
    let got = (field(line, "handle"), field(line, "route"), field(line, "buffers_left"));
    assert_eq!(got, ("-95", "1", "0"), "{line}\n{err}");
    assert_eq!(summary(&err)["dmabuf_exports"], "0", "decided before anything was exported: {err}");
}

#[test]
fn the_dmabuf_route_gives_the_nic_exactly_the_mapped_memory() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("dmabuf", &rig, &["dmabuf", "10000"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("routes dmabuf ok cycles=10000 buffers_left=0 failures=0"), "{out}\n{err}");
    let s = summary(&err);
    assert_eq!(s["route"], "dmabuf");
    // 6 MRs and 10 000 cycles, each one export; the two-GPU, ODP and unmapped ones are misses
    assert_eq!(s["dmabuf_exports"], "10006", "{err}");
    assert_eq!((s["rm_errors"].as_str(), s["dmabuf_refused"].as_str(), s["dmabuf_live"].as_str()), ("0", "0", "0"));
    assert!(s["odp_mrs"] != "0", "{err}");
    assert!(err.contains("addr=0x7f00005f0000 len=0x20000 pass0 miss"), "across two GPUs: {err}");
    assert!(err.contains("IBV_ACCESS_ON_DEMAND on GPU memory"), "{err}");
    // the memory freed under a live MR is named: the dma-buf keeps it until the dereg
    assert!(err.contains("verbs MR(s) still use it") && err.contains("the dma-buf holds it"), "{err}");
    assert!(err.contains("exported 2 piece(s)"), "an MR over two memory objects: {err}");
}

/// Issue 30: one dma-buf per piece set, shared by every MR over it and closed with the last;
/// never reused for memory freed and allocated again, never a caller's fd, never in a fork child.
#[test]
fn mrs_over_one_buffer_share_one_export_closed_with_the_last() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("shared", &rig, &["shared"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes shared");
    assert_eq!(
        line,
        "routes shared ok exports_for_4=1 open_while_used=1 exports_caller=1 child_ok=1 open_before_last=1 open_after_last=0 \
         exports_new=1 left=0",
        "{err}"
    );
    let s = summary(&err);
    // 4 + twin over one buffer (one export, four reuses), the caller's, old and new memory
    assert_eq!((s["dmabuf_exports"].as_str(), s["dmabuf_reused"].as_str()), ("4", "4"), "{err}");
    assert_eq!((s["rm_errors"].as_str(), s["dmabuf_refused"].as_str(), s["dmabuf_live"].as_str()), ("0", "0", "0"), "{err}");
    // 5 MRs of 4 MiB at once over one buffer; later the old memory's buffer (held by its MR) and
    // the new one's: two buffers at once
    let bytes: Vec<&str> = ["registered_bytes", "registered_peak_bytes", "exported_bytes", "exported_peak_bytes", "dmabuf_buffers"]
        .iter()
        .map(|k| s[*k].as_str())
        .collect();
    assert_eq!(bytes, ["0", "20971520", "0", "8388608", "0"], "{err}");
}

/// Issue 30 (the review): what a registration's call came to always reaches gdrshim. A thread
/// with a cancellation pending, whose provider passes a cancellation point inside the call, gets
/// its MR and is cancelled after the call; the buffer (DMA-BUF) or the registration (NV503C) the
/// MR uses is held while it lives; the dereg, made the same way, completes and gives it back:
/// nothing kept until exit. The same for a devx umem (libmlx5).
#[test]
fn a_cancellation_inside_the_providers_call_waits_and_the_mr_is_settled() {
    for (peermem, want) in [
        (false, "routes cancel ok cancelled=4 made=2 held=2 bufs_while_used=1 held_after=0 left=0"),
        (true, "routes cancel ok cancelled=4 made=2 held=2 bufs_while_used=0 held_after=0 left=0"),
    ] {
        // with nvidia-peermem, and a GPU RM refuses dma-bufs for: the NV503C route
        let rig = Rig { peermem, capable: !peermem, new_verbs: true };
        let (code, out, err) = routes(&format!("cancel-{peermem}"), &rig, &["cancel"], &[]);
        let line = find_line(&out, &err, "routes cancel");
        assert_eq!((code, line), (0, want), "peermem={peermem}\n{err}");
    }
}

/// Issue 30 (the review): an outcome the core's lock was not free for (another thread held it
/// past the hooks' wait; GDRSHIM_TEST_SETTLE_LATE=1 makes every outcome so) is kept and taken in
/// by the lock's next holder, in order: a deregistration finds its MR, the shared buffer closes
/// once the last MR's deregistration is taken in (here by the next registration, so one buffer is
/// still open right after the last dereg), the counts end where they do without the knob.
#[test]
fn outcomes_the_core_had_no_time_for_are_taken_in_by_its_next_holder() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let late = [("GDRSHIM_TEST_SETTLE_LATE", "1")];
    let (code, out, err) = routes("shared-late", &rig, &["shared"], &late);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes shared");
    assert_eq!(
        line,
        "routes shared ok exports_for_4=1 open_while_used=1 exports_caller=1 child_ok=1 open_before_last=1 open_after_last=1 \
         exports_new=1 left=0",
        "{err}"
    );
    let s = summary(&err);
    let counts: Vec<&str> =
        ["dmabuf_exports", "dmabuf_reused", "dmabuf_live", "dmabuf_buffers", "registered_bytes", "registered_peak_bytes"]
            .iter()
            .map(|k| s[*k].as_str())
            .collect();
    assert_eq!(counts, ["4", "4", "0", "0", "0", "20971520"], "{err}");
    // a dereg right after its registration finds the MR whose outcome is still kept; a release
    // sees an MR whose outcome is still kept (its warning); both settle by the end
    for knob in [&late[..], &[]] {
        let (code, out, err) = routes("quick-late", &rig, &["quick"], knob);
        let line = find_line(&out, &err, "routes quick");
        assert_eq!((code, line), (0, "routes quick ok left=0 dmabuf_buffers=0 registered_bytes=0 exports=2"), "{knob:?}\n{err}");
        assert!(err.contains("still use it"), "the release saw the MR ({knob:?}): {err}");
    }
    for peermem in [false, true] {
        let rig = Rig { peermem, capable: !peermem, new_verbs: true };
        let (code, out, err) = routes(&format!("cancel-late-{peermem}"), &rig, &["cancel"], &late);
        let line = find_line(&out, &err, "routes cancel");
        assert!(
            code == 0 && line.contains(" made=2 held=2 ") && line.ends_with(" held_after=0 left=0"),
            "peermem={peermem}: {line}\n{err}"
        );
    }
}

/// BAR1 as a budget (issue 30): asked once per GPU at its first export, in the summary, and one
/// warning before our live buffers would not fit a BAR1 that is not static; never a guess.
#[test]
fn bar1_is_asked_at_the_first_export_and_warned_of_once_when_not_static() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    const WARNING: &str = "registrations would exceed its BAR1";
    let run = |tag: &str, mib: &str, kind: &str, resource: Option<&str>| {
        let extra = vec![("FAKERM_BAR1_MIB", mib), ("FAKERM_BAR1_STATIC", kind)];
        let sysfs = resource.map(|r| (tag, r));
        let (code, out, err) = routes_with_sysfs(tag, &rig, &["bar1"], &extra, sysfs);
        assert_eq!(code, 0, "{out}\n{err}");
        // none before the first export, two (static BAR1, BAR1 size) at it, none after
        assert_eq!(out.lines().find(|l| l.starts_with("routes bar1")), Some("routes bar1 ok queries=0002,2"), "{out}\n{err}");
        let s = summary(&err);
        // 6 buffers (12 MRs) of 64 MiB at once: exports 6, reused 6 + 1 later
        assert_eq!((s["dmabuf_exports"].as_str(), s["dmabuf_reused"].as_str()), ("7", "6"), "{err}");
        (err.matches(WARNING).count(), s["bar1_bytes"].clone(), s["bar1_static"].clone(), err)
    };
    let mib256 = (256u64 << 20).to_string();
    let (warnings, bytes, is_static, err) = run("bar1-small", "256", "0", None);
    assert_eq!((warnings, bytes.as_str(), is_static.as_str()), (1, mib256.as_str(), "0"), "{err}");
    let w = err.lines().find(|l| l.contains(WARNING)).unwrap();
    for part in ["BAR1 256 MiB (RM, not static)", "live 256 MiB", "this buffer 64 MiB", "Resizable BAR", "shares one dma-buf"] {
        assert!(w.contains(part), "{part}: {w}");
    }
    assert!(err.contains("BAR1 256 MiB (RM), not static"), "the answer is logged: {err}");
    let (warnings, bytes, is_static, err) = run("bar1-static", "256", "1", None);
    assert_eq!((warnings, bytes.as_str(), is_static.as_str()), (0, mib256.as_str(), "1"), "{err}");
    // RM cannot say whether it is static: no warning, and unknown, not a guess
    let unknown = u64::MAX.to_string();
    let (warnings, _, is_static, err) = run("bar1-refused", "256", "refuse", None);
    assert_eq!((warnings, is_static.as_str()), (0, unknown.as_str()), "{err}");
    // RM cannot tell the size: the PCI device's BAR 1 from sysfs, else unknown
    let resource = "0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n0x000000f800000000 0x000000f80fffffff 0x000000000014220c\n";
    let (warnings, bytes, _, err) = run("bar1-sysfs", "0", "0", Some(resource));
    assert_eq!((warnings, bytes.as_str()), (1, mib256.as_str()), "{err}");
    assert!(err.contains("BAR1 256 MiB (sysfs, not static)"), "{err}");
    let (warnings, bytes, _, err) = run("bar1-unknown", "0", "0", None);
    assert_eq!((warnings, bytes.as_str()), (0, unknown.as_str()), "{err}");
}

#[test]
fn cuda_callers_get_a_dmabuf_where_libcuda_refuses() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("cuda", &rig, &["cuda"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes cuda");
    assert_eq!(line, "routes cuda ok attr124=1 r=0 size=524288 r_unaligned=1 r_unmapped=1 export=fd", "{err}");
    let s = summary(&err);
    // one for CUDA's caller, one for gdrshim_export_dmabuf
    assert_eq!((s["dmabuf_served"].as_str(), s["dmabuf_exports"].as_str()), ("2", "2"), "{err}");
    assert!(err.contains("not host-page aligned"), "{err}");
    // without the DMA-BUF route, CUDA's answers stand
    let nv = Rig { peermem: true, capable: false, new_verbs: true };
    let (_, out, err) = routes("cuda-nv", &nv, &["cuda"], &[]);
    assert!(out.contains("attr124=0 r=801"), "{out}\n{err}");
}

/// CUDA's own memory beside the program's: never registered or exported on any path, while two
/// allocations side by side are (libcuda's rule, issue 29 A).
#[test]
fn only_the_programs_own_memory_is_registered_or_exported() {
    let dmabuf = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("owned", &dmabuf, &["owned"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("routes owned ok route=1 both=mr r_both=0 r_cuda=1 r_past=1 export_cuda=-13 export_both=fd"), "{out}\n{err}");
    let s = summary(&err);
    assert_eq!((s["pass0_hits"].as_str(), s["pass0_misses"].as_str(), s["dmabuf_served"].as_str()), ("1", "2", "2"), "{err}");
    assert!(err.contains("is not in any allocation this program made through CUDA"), "{err}");
    assert!(err.contains("answering CUDA_ERROR_INVALID_VALUE"), "{err}");
    // the NV503C route: the same MRs, and nothing of CUDA's memory registered with RM
    let nv = Rig { peermem: true, capable: false, new_verbs: true };
    let (code, out, err) = routes("owned-nv", &nv, &["owned"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("routes owned ok route=2 both=mr r_both=801 r_cuda=801 r_past=801 export_cuda=-1 export_both=none"),
        "{out}\n{err}"
    );
    let s = summary(&err);
    assert_eq!((s["pass0_hits"].as_str(), s["pass0_misses"].as_str()), ("1", "2"), "{err}");
    assert_eq!(s["live_registrations"], "0", "{err}");
}

#[test]
fn a_refused_export_leaves_the_call_as_it_was() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("refused", &rig, &["refused"], &[("FAKEVERBS_DMABUF_FAIL", "95")]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("routes refused ok buffers_left=0"), "{out}\n{err}");
    assert_eq!(summary(&err)["dmabuf_refused"], "1");
    assert!(err.contains("ibv_reg_dmabuf_mr refused the export") && err.contains("delegating the original call"), "{err}");
}

#[test]
fn shadow_mode_says_what_it_would_export_and_exports_nothing() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("shadow", &rig, &["matrix"], &[("GDRSHIM_MODE", "shadow")]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("registered=no errno=14"), "{out}\n{err}");
    assert!(err.contains("would export 1 piece(s)"), "{err}");
    assert_eq!(summary(&err)["dmabuf_exports"], "0");
}

#[test]
fn two_copies_make_one_registration_one_warning_one_summary() {
    let e = env();
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let copy = e.dir.join("libgdrshim-copy.so");
    let preload = format!("{}:{}:{}", common::knobs_core().display(), copy.display(), e.dir.join("libfakerm.so").display());
    let (code, out, err) = routes("twocopies", &rig, &["matrix"], &[("LD_PRELOAD", preload.as_str())]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("route=1 active=1 registered=yes"), "{out}\n{err}");
    assert_eq!(err.matches("gdrshim: summary").count(), 1, "one summary: {err}");
    assert_eq!(err.matches("another copy of gdrshim").count(), 1, "one warning: {err}");
    assert!(err.contains("libgdrshim-copy.so") && err.contains("stays inert"), "{err}");
    assert_eq!(summary(&err)["dmabuf_exports"], "1", "registered once: {err}");
}

#[test]
fn a_dlopened_copy_never_claims_to_register() {
    let e = env();
    let dev = e.dir.join("dev-dlopened");
    common::fakedev::fake_dev(&dev, &[], true);
    for global in [false, true] {
        let mut c = Command::new(e.dir.join("dlopened"));
        c.arg(&e.shim).env("GDRSHIM_TEST_DEV_DIR", &dev).env("GDRSHIM_MODE", "register").env("GDRSHIM_ROUTE", "nv503c");
        if global {
            c.arg("global");
        }
        let out = c.output().unwrap();
        let (o, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(o.contains("dlopened mode=3 gdr_active=0"), "RTLD_GLOBAL={global}: {o}\n{err}");
        assert!(err.contains("not preloaded"), "RTLD_GLOBAL={global}: {err}");
    }
}

/// The line of `out` that starts with `prefix`.
/// The line of `out` that starts with `prefix` (`err`: the run's stderr, shown when it is missing).
fn find_line<'a>(out: &'a str, err: &str, prefix: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in {out}\n{err}"))
}

/// mlx5dv_devx_umem_reg/_reg_ex on GPU memory, DMA-BUF route: the fake libmlx5 is asked
/// reg_ex with MLX5DV_UMEM_MASK_DMABUF and a buffer that is exactly that memory (checked page by
/// page), the caller's page sizes kept; while it lives the umem's own reference to the buffer
/// and gdrshim's one fd of it (kept for every MR over the same pieces) are open, none after. Host memory, a miss, an unknown mask bit and the program's own
/// dma-buf pass through untouched; errno is the caller's.
#[test]
fn devx_umems_on_the_dmabuf_route_are_dmabuf_umems_of_exactly_the_memory() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("umem-dmabuf", &rig, &["umem"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let what = format!("{out}\n{err}");
    assert_eq!(
        find_line(&out, &err, "umem1 ok"),
        "umem1 ok=1 errno=4242 legacy=0 ex=1 mask=0x1 pgsz=0xfffffffffffff000 regs=0 bufs=2",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem1 after"), "umem1 after regs=0 bufs=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem2"), "umem2 ok=1 errno=4242 mask=0x1 pgsz=0xffffffffffff0000 regs=0 caller_mask=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem host"), "umem host ok=1 legacy=1 ex=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem miss"), "umem miss ok=0 errno=14 ex=0 regs=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem unknown"), "umem unknown ok=0 errno=95 mask=0x20", "{what}");
    assert_eq!(find_line(&out, &err, "umem own"), "umem own ok=0 errno=9", "{what}");
    assert!(out.contains("routes umem ok buffers_left=0 failures=0"), "{what}");
    assert!(err.contains("mlx5dv_devx_umem_reg addr=0x7f0000010000 len=0x40000 pass0 hit: exported 1 piece(s)"), "{what}");
    assert_eq!(err.matches("comp_mask bits 0x20 unknown to gdrshim").count(), 1, "one line names it: {what}");
    let s = summary(&err);
    assert_eq!((s["dmabuf_exports"].as_str(), s["dmabuf_live"].as_str(), s["rm_errors"].as_str()), ("2", "0", "0"), "{what}");
}

/// The same calls on the NV503C route: the memory is registered with RM before the provider's
/// call (the fake NIC finds it) and unregistered at mlx5dv_devx_umem_dereg.
#[test]
fn devx_umems_on_the_nv503c_route_hold_a_registration_until_dereg() {
    let rig = Rig { peermem: true, capable: false, new_verbs: true };
    let (code, out, err) = routes("umem-nv", &rig, &["umem"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let what = format!("{out}\n{err}");
    assert_eq!(find_line(&out, &err, "umem1 ok"), "umem1 ok=1 errno=4242 legacy=1 ex=0 mask=0 pgsz=0 regs=1 bufs=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem1 after"), "umem1 after regs=0 bufs=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem2"), "umem2 ok=1 errno=4242 mask=0 pgsz=0xffffffffffff0000 regs=1 caller_mask=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem host"), "umem host ok=1 legacy=1 ex=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem miss"), "umem miss ok=0 errno=14 ex=0 regs=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem unknown"), "umem unknown ok=0 errno=95 mask=0x20", "{what}");
    assert!(out.contains("routes umem ok buffers_left=0 failures=0"), "{what}");
    let s = summary(&err);
    assert_eq!((s["registered"].as_str(), s["unregistered"].as_str(), s["live_registrations"].as_str()), ("2", "2", "0"), "{what}");
}

/// A provider that refuses the dma-buf umem: the original call is delegated untouched and fails
/// as without gdrshim, errno the provider's, no buffer left.
#[test]
fn a_refused_dmabuf_umem_leaves_the_call_as_it_was() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("umem-refused", &rig, &["umem"], &[("FAKEMLX5_DMABUF_FAIL", "95")]);
    let what = format!("{out}\n{err}");
    assert_eq!(code, 0, "{what}");
    assert_eq!(
        find_line(&out, &err, "umem1 ok"),
        "umem1 ok=0 errno=14 legacy=1 ex=1 mask=0x1 pgsz=0xfffffffffffff000 regs=0 bufs=0",
        "{what}"
    );
    assert!(out.contains("routes umem ok buffers_left=0"), "{what}");
    assert!(err.contains("mlx5dv_devx_umem_reg_ex refused the export") && err.contains("delegating the original call"), "{what}");
}

/// ibv_reg_mr_ex of GPU memory on the DMA-BUF route stays ibv_reg_mr_ex: the address becomes the
/// buffer (FD, FD_OFFSET, IOVA) and the DMA handle goes with it; a mask bit gdrshim does not
/// know leaves the call untouched, with one line naming it.
#[test]
fn reg_mr_ex_keeps_every_mask_bit_it_does_not_convert() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("mrex", &rig, &["mrex"], &[]);
    let what = format!("{out}\n{err}");
    assert_eq!(code, 0, "{what}");
    assert_eq!(find_line(&out, &err, "mrex dmah"), "mrex dmah ok=1 errno=4242 addr_shown=1 mask=0x1d dmah=0xd0a4", "{what}");
    assert_eq!(find_line(&out, &err, "mrex unknown"), "mrex unknown ok=0 errno=95 mask=0x42", "{what}");
    assert!(out.contains("routes mrex ok buffers_left=0 failures=0"), "{what}");
    assert_eq!(err.matches("comp_mask bits 0x40 unknown to gdrshim").count(), 1, "{what}");
}
