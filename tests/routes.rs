//! Both registration routes through the real libgdrshim.so, with the live fake driver (RM, UVM
//! and NV_ESC_EXPORT_TO_DMABUF_FD with nv-dmabuf.c's checks, each buffer a memfd) and the fake NIC
//! (`ibv_reg_dmabuf_mr` accepts only a buffer whose memory is, page by page, the process's memory
//! at the MR's addresses): which route the machine gets, and what each gives the NIC. The shared
//! dma-buf's life is tests/routes_buffers.rs's, devx umems and ibv_reg_mr_ex tests/routes_devx.rs's.
//! A rig with `ibv_reg_dmabuf_mr` registers through rdma-core's own libibverbs, the fake NIC its
//! provider (`rig::routes`); one without is an rdma-core older than 34, which rdma-core 44 cannot
//! be: there the fake NIC is the libibverbs itself (tests/c/fakeverbs.c).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::rig::{self, field, find_line, summary, Rig};
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = rig::build("routes", &["routes"]);
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        common::cc(
            &e,
            &[
                "-O1",
                "-Wall",
                "-Werror",
                "-o",
                "dlopened",
                c.join("dlopened.c").to_str().unwrap(),
                "-ldl",
            ],
        );
        // the same library under another name: a second copy
        // (the core's own check: a second front is never called, so it has nothing to say)
        std::fs::copy(common::knobs_core(), e.dir.join("libgdrshim-copy.so")).unwrap();
        e
    })
}

/// `routes ARGS` on a fresh fake machine; returns (exit code, stdout, stderr).
fn routes(tag: &str, rig: &Rig, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
    rig::routes(env(), tag, rig, args, extra, None)
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
                    assert_eq!(
                        s["registered"], "0",
                        "no NV503C registration on the DMA-BUF route: {what}"
                    );
                } else if peermem {
                    assert_eq!((route, reg, s["route"].as_str()), ("2", "yes", "nv503c"), "{what}");
                    assert_eq!(
                        (s["registered"].as_str(), s["dmabuf_exports"].as_str()),
                        ("1", "0"),
                        "{what}"
                    );
                } else {
                    // no route: the call fails exactly as without gdrshim, and the log says why
                    assert_eq!(
                        (route, reg, field(line, "errno"), field(line, "active")),
                        ("0", "no", "14", "0"),
                        "{what}"
                    );
                    assert!(
                        err.contains("no registration route works here")
                            && err.contains("NV503C lacks nvidia-peermem"),
                        "{what}"
                    );
                    assert_eq!(
                        err.contains("ibv_reg_dmabuf_mr in libibverbs"),
                        !new_verbs,
                        "{what}"
                    );
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
    assert_eq!(
        (field(line, "before"), field(line, "route"), field(line, "registered")),
        ("0", "1", "yes"),
        "{line}\n{err}"
    );
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
    assert!(
        out.contains("routes dmabuf ok cycles=10000 buffers_left=0 failures=0"),
        "{out}\n{err}"
    );
    let s = summary(&err);
    assert_eq!(s["route"], "dmabuf");
    // 6 MRs and 10 000 cycles, each one export; the two-GPU, ODP and unmapped ones are misses
    assert_eq!(s["dmabuf_exports"], "10006", "{err}");
    assert_eq!(
        (s["rm_errors"].as_str(), s["dmabuf_refused"].as_str(), s["dmabuf_live"].as_str()),
        ("0", "0", "0")
    );
    assert!(s["odp_mrs"] != "0", "{err}");
    assert!(err.contains("addr=0x7f00005f0000 len=0x20000 pass0 miss"), "across two GPUs: {err}");
    assert!(err.contains("IBV_ACCESS_ON_DEMAND on GPU memory"), "{err}");
    // the memory freed under a live MR is named: the dma-buf keeps it until the dereg
    assert!(
        err.contains("verbs MR(s) still use it") && err.contains("the dma-buf holds it"),
        "{err}"
    );
    assert!(err.contains("exported 2 piece(s)"), "an MR over two memory objects: {err}");
}

#[test]
fn cuda_callers_get_a_dmabuf_where_libcuda_refuses() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("cuda", &rig, &["cuda"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = find_line(&out, &err, "routes cuda");
    assert_eq!(
        line, "routes cuda ok attr124=1 r=0 size=524288 r_unaligned=1 r_unmapped=1 export=fd",
        "{err}"
    );
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
    assert!(out.contains("routes owned ok route=1 both=mr r_both=0 r_cuda=1 r_past=1 export_cuda=-13 export_both=fd pinned=2"), "{out}\n{err}");
    let s = summary(&err);
    assert_eq!(
        (s["pass0_hits"].as_str(), s["pass0_misses"].as_str(), s["dmabuf_served"].as_str()),
        ("1", "2", "2"),
        "{err}"
    );
    assert!(err.contains("is not in any allocation this program made through CUDA"), "{err}");
    assert!(err.contains("answering CUDA_ERROR_INVALID_VALUE"), "{err}");
    // the NV503C route: the same MRs, and nothing of CUDA's memory registered with RM
    let nv = Rig { peermem: true, capable: false, new_verbs: true };
    let (code, out, err) = routes("owned-nv", &nv, &["owned"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("routes owned ok route=2 both=mr r_both=801 r_cuda=801 r_past=801 export_cuda=-1 export_both=none pinned=2"),
        "{out}\n{err}"
    );
    let s = summary(&err);
    assert_eq!((s["pass0_hits"].as_str(), s["pass0_misses"].as_str()), ("1", "2"), "{err}");
    assert_eq!(s["live_registrations"], "0", "{err}");
}

#[test]
fn a_refused_export_leaves_the_call_as_it_was() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) =
        routes("refused", &rig, &["refused"], &[("FAKEVERBS_DMABUF_FAIL", "95")]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("routes refused ok buffers_left=0"), "{out}\n{err}");
    assert_eq!(summary(&err)["dmabuf_refused"], "1");
    assert!(
        err.contains("ibv_reg_dmabuf_mr refused the export")
            && err.contains("delegating the original call"),
        "{err}"
    );
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
    let preload =
        rig::rdma_core_preload(e, &[&common::knobs_core(), &copy, &e.dir.join("libfakerm.so")]);
    let (code, out, err) =
        routes("twocopies", &rig, &["matrix"], &[("LD_PRELOAD", preload.as_str())]);
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
        c.arg(&e.shim)
            .env("GDRSHIM_TEST_DEV_DIR", &dev)
            .env("GDRSHIM_MODE", "register")
            .env("GDRSHIM_ROUTE", "nv503c");
        if global {
            c.arg("global");
        }
        let out = c.output().unwrap();
        let (o, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(o.contains("dlopened mode=3 gdr_active=0"), "RTLD_GLOBAL={global}: {o}\n{err}");
        assert!(err.contains("not preloaded"), "RTLD_GLOBAL={global}: {err}");
    }
}
