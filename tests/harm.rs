//! Do no harm (tests/c/harm.c under the real libgdrshim.so, on the fake machine): gdrshim never
//! closes, uses or hands out an fd number that is no longer its own; a forked child keeps no fd
//! of gdrshim's; an allocation's record ends when its memory ends, its context ends included; and
//! on the NV503C route a miss over GPU memory never reaches the NIC's driver. Each case is a
//! sequence that went wrong before. The DMA-BUF rig's registrations go through rdma-core's own
//! libibverbs (the fake NIC its provider, `rig::run_on_rdma_core`); the NV503C rig's libibverbs is
//! an rdma-core older than 34, without `ibv_reg_dmabuf_mr`, which rdma-core 44 cannot be: there the
//! fake NIC is the libibverbs itself (tests/c/fakeverbs.c).

use std::path::Path;
use std::sync::OnceLock;

mod common;
use common::rig::{self, Rig};
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = rig::build("harm", &["harm", "twocopies"]);
        // two copies of libibverbs with other private layouts, and a library linking each
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let src = |f: &str| c.join(f).to_str().unwrap().to_string();
        std::fs::create_dir_all(e.dir.join("copies")).unwrap();
        let map = format!("-Wl,--version-script={}", src("twoverbs.map"));
        for (copy, soname) in [(1, "libibverbs.so.1"), (2, "libibverbs-1a2b3c4d.so.1")] {
            let (def, so, out) = (
                format!("-DCOPY={copy}"),
                format!("-Wl,-soname,{soname}"),
                format!("copies/{soname}"),
            );
            common::cc(
                &e,
                &[
                    "-shared",
                    "-fPIC",
                    "-O1",
                    "-Wall",
                    "-Werror",
                    &def,
                    &map,
                    &so,
                    "-o",
                    &out,
                    &src("twoverbs.c"),
                    "-ldl",
                ],
            );
            let (user, lib) = (format!("copies/libuser{copy}.so"), format!("-l:{soname}"));
            common::cc(
                &e,
                &[
                    "-shared",
                    "-fPIC",
                    "-O1",
                    "-Wall",
                    "-Werror",
                    "-o",
                    &user,
                    &src("twouser.c"),
                    "-Lcopies",
                    &lib,
                ],
            );
        }
        e
    })
}

/// `harm ARGS` on a fresh fake machine: its "harm …" line (the test fails with stderr when the
/// program does), and stderr.
fn harm(tag: &str, rig: &Rig, args: &[&str], extra: &[(&str, &str)]) -> (String, String) {
    let e = env();
    let dev = rig::dev_dir(e, tag, rig);
    let (code, out, err) = rig::run_as_deployed(e, "harm", &dev, rig, args, extra);
    let line = out.lines().find(|l| l.starts_with("harm ")).unwrap_or_default().to_string();
    assert!(code == 0 && line.contains(" ok"), "harm {args:?} exited {code}: {out}\n{err}");
    (line, err)
}

/// The program closes gdrshim's kept dma-buf fd, by each way a program closes numbers, and has a
/// file of its own at that number: gdrshim's dereg and the free never close it, the number is
/// never used again, and the loss is said.
#[test]
fn a_kept_fd_the_program_closed_is_never_closed_or_used_again() {
    for how in ["close", "close_range", "closefrom", "dup2"] {
        let (line, err) = harm(&format!("closed-{how}"), &rig::DMABUF, &["closed", how], &[]);
        assert!(
            line.contains("new_exports=1"),
            "{how}: the next MR of the memory is a new export: {line}"
        );
        assert!(err.contains("was closed by the program"), "{how}: the loss is said: {err}");
    }
}

#[test]
fn a_gpu_node_fd_the_program_closed_is_opened_again_not_used() {
    let (line, _) = harm("gpunode", &rig::DMABUF, &["gpunode"], &[]);
    let old = line.split("old=").nth(1).and_then(|s| s.split(' ').next()).unwrap();
    let new = line.split("new=").nth(1).unwrap();
    assert_ne!(old, new, "a node fd of gdrshim's own at a new number: {line}");
}

#[test]
fn the_log_file_closed_by_the_program_gets_no_line_and_logging_goes_to_stderr() {
    let e = env();
    let log = e.dir.join(format!("harm-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let (_, err) =
        harm("logfile", &rig::DMABUF, &["logfile"], &[("GDRSHIM_LOG_FILE", log.to_str().unwrap())]);
    assert!(
        err.contains("the log file's fd") && err.contains("gdrshim logs to stderr from now on"),
        "{err}"
    );
    assert!(err.contains("pass0 miss"), "the lines after that on stderr: {err}");
    let before = std::fs::read_to_string(&log).unwrap();
    assert!(
        !before.contains("pass0 miss"),
        "the file had lines only until the program closed it: {before}"
    );
}

#[test]
fn a_forked_child_holds_no_fd_of_gdrshims() {
    let (line, _) = harm("fork", &rig::DMABUF, &["fork"], &[]);
    assert!(!line.contains("dmabuf") && !line.contains("=node"), "{line}");
}

/// A child forked while another thread deregisters an MR (gdrshim closing the MR's kept dma-buf
/// fd) holds no dma-buf of gdrshim's: the kernel copies the fd table before the memory, so a fork
/// must not meet a close of ours halfway (found by tests/stress.rs).
#[test]
fn a_child_forked_during_a_dereg_holds_no_dma_buf() {
    let (line, _) =
        harm("fork-race", &rig::DMABUF, &["fork-race"], &[("GDRSHIM_LOG_LEVEL", "warn")]);
    assert!(line.contains("forks=2000 leaks=0"), "{line}");
}

/// The same while an export for an MR is under way: the driver has made the buffer's fd and
/// gdrshim has not yet taken it as its own when another thread forks. Before the fork gate
/// (fdtable::forkgate) 825 of 2000 children kept it in the fake machine, where the export is a
/// large part of a registration; a fork now waits for exports in flight.
#[test]
fn a_child_forked_during_an_export_holds_no_dma_buf() {
    let (line, _) =
        harm("fork-export", &rig::DMABUF, &["fork-export"], &[("GDRSHIM_LOG_LEVEL", "warn")]);
    assert!(line.contains("forks=2000 leaks=0"), "{line}");
}

/// A record that outlived its memory let CUDA's own memory be registered: it ends with the
/// memory, here an RM free with no UVM unmap first.
#[test]
fn a_record_ends_when_rm_frees_its_memory() {
    harm("stale-free", &rig::DMABUF, &["stale-free"], &[]);
}

/// The same when one GPU unmaps the chunk first and CUDA maps its own memory there before the
/// other GPU unmaps it.
#[test]
fn a_record_ends_when_its_chunk_goes_one_gpu_at_a_time() {
    harm("stale-gpus", &rig::DMABUF, &["stale-gpus"], &[]);
}

/// A library's short-lived context (cuCtxCreate, an allocation freed, one kept, cuCtxDestroy,
/// whose end frees the kept one) ends only its own: the primary contexts' live memory is still
/// registered as a dma-buf MR, the destroyed context's is refused (issue 46 defect 5).
#[test]
fn a_librarys_short_lived_context_leaves_the_programs_live_memory_registrable() {
    let (line, err) = harm("ctx-library", &rig::DMABUF, &["ctx", "library"], &[]);
    assert!(line.contains("harm ctx library ok"), "{line}\n{err}");
    assert!(err.contains("a CUDA context ended"), "{err}");
}

/// The end of GPU 0's primary context (a reset, a release by its last holder) ends the records
/// of exactly the allocations made in it (and those whose context is unknown, on its GPU): GPU
/// 1's allocation peer-mapped on GPU 0 stays registrable; a release by one of two holders ends
/// nothing.
#[test]
fn a_context_end_ends_the_records_of_its_allocations() {
    for how in ["reset", "release", "release-held"] {
        let (_, err) = harm(&format!("ctx-{how}"), &rig::DMABUF, &["ctx", how], &[]);
        let said = err.contains("a CUDA context ended");
        assert_eq!(said, how != "release-held", "{how}: {err}");
    }
}

#[test]
fn an_nv503c_miss_over_gpu_memory_never_reaches_the_nic() {
    let (line, err) = harm("nv503c-miss", &rig::NV503C, &["nv503c-miss"], &[]);
    assert!(line.contains("reached=0"), "{line}");
    assert!(err.contains("fails with EFAULT"), "the miss says so: {err}");
}

/// Two copies of libibverbs in one process (the system's, a wheel's renamed one), whose objects
/// the other copy cannot read: every verbs call, direct or through `dlvsym`, host or GPU memory
/// (the conversion to `ibv_reg_dmabuf_mr` included), reaches the copy its caller reaches without
/// gdrshim, in both load orders and after the wheel's copy is unloaded and loaded again. Both
/// copies are fakeverbs.c: rdma-core's is never unloaded once its providers are open
/// (tests/lab_copies.rs runs two copies of rdma-core's own, loaded once).
#[test]
fn each_verbs_call_reaches_the_copy_that_made_its_objects() {
    let copies = env().dir.join("copies");
    for order in ["12", "21"] {
        let (code, out, err) = {
            let e = env();
            let dev = rig::dev_dir(e, &format!("copies-{order}"), &rig::DMABUF);
            rig::run(
                e,
                "twocopies",
                &dev,
                &rig::DMABUF,
                &[order],
                &[("LD_LIBRARY_PATH", copies.to_str().unwrap())],
            )
        };
        assert!(
            code == 0 && out.contains(&format!("twocopies {order} ok")),
            "order {order}: {out}\n{err}"
        );
        assert!(!err.contains("MIXED"), "order {order}: {err}");
    }
}

/// A deregistration that cannot take the core's lock in time, before the provider's call nor
/// after it (GDRSHIM_TEST_DEREG_QUEUED=1 and GDRSHIM_TEST_SETTLE_LATE=1 make every one so), is
/// settled by the lock's next holder: the MR's buffer stays open until then, and closes then; at
/// exit nothing is live or left.
#[test]
fn a_dereg_without_the_lock_is_settled_by_its_next_holder() {
    let knobs = [("GDRSHIM_TEST_DEREG_QUEUED", "1"), ("GDRSHIM_TEST_SETTLE_LATE", "1")];
    let (line, err) = harm("dereg-queued", &rig::DMABUF, &["dereg-queued"], &knobs);
    assert!(
        line.contains("owed=1 after=1"),
        "the first buffer open until taken in, then only the next one: {line}"
    );
    let summary =
        err.lines().find(|l| l.starts_with("gdrshim: summary ")).unwrap_or_else(|| panic!("{err}"));
    for kv in ["dmabuf_live=0", "dmabuf_buffers=0", "registered_bytes=0"] {
        assert!(summary.split_whitespace().any(|x| x == kv), "{kv} in {summary}");
    }
}
