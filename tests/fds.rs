//! gdrshim's own fds and the program's closes (tests/c/fdharm.c under the real libgdrshim.so, on
//! the fake machine): a close in a table our marks do not describe (a `vfork` child's, a thread's
//! unshared one) changes no mark; a close that fails changes none; a program's close of its own
//! fds never erases a fresh mark; and no fd is made for gdrshim while a program close runs, so
//! gdrshim never adopts the program's file. Each failed on 9772aec.

mod common;
use common::rig;
use common::Env;
use std::sync::OnceLock;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| rig::build("fds", &["fdharm"]))
}

/// `fdharm ARGS` on a fresh fake machine (DMA-BUF route, rdma-core's own libibverbs): its
/// "fdharm …" line.
fn fdharm(args: &[&str], extra: &[(&str, &str)]) -> String {
    let e = env();
    let dev = rig::dev_dir(e, &args.join("-"), &rig::DMABUF);
    let mut env = vec![("GDRSHIM_LOG_LEVEL", "warn")];
    env.extend_from_slice(extra);
    let (code, out, err) = rig::run_as_deployed(e, "fdharm", &dev, &rig::DMABUF, args, &env);
    let line = out.lines().find(|l| l.starts_with("fdharm ")).unwrap_or_default().to_string();
    assert!(code == 0 && line.contains(" ok"), "fdharm {args:?} exited {code}: {out}\n{err}");
    line
}

/// CPython's `subprocess` child closes with `close_range(3, 3)` and `close_range(5, ~0U)`
/// before its exec, in memory shared with the parent; others `dup2` over our number or
/// `closefrom`. On 9772aec the parent's marks went: a child forked later kept the dma-buf, and
/// the dereg left it open (`kept=5 child=1 left=1`).
#[test]
fn a_vfork_childs_closes_leave_the_parents_fds_ours() {
    let line = fdharm(&["vfork"], &[]);
    assert!(line.contains("child=0 left=0"), "{line}");
}

/// A thread's `close_range(.., CLOSE_RANGE_UNSHARE)` closes its own copy of the table only.
#[test]
fn an_unshared_close_range_leaves_our_fds_ours() {
    let line = fdharm(&["unshare"], &[]);
    assert!(line.contains("child=0 left=0"), "{line}");
}

/// `close_range` with a bad flag (`EINVAL`), `dup2` from a bad fd (`EBADF`) and `dup2(n, n)`
/// close nothing: the number stays ours.
#[test]
fn a_close_that_fails_or_changes_nothing_leaves_our_fd_ours() {
    let line = fdharm(&["failed"], &[]);
    assert!(line.contains("child=0 left=0"), "{line}");
}

/// One thread's `close_range(f, f, 0)` of its own `/dev/null` fd while others register: on
/// 9772aec the range was forgotten after the call, outside the lock, and took the mark of the
/// dma-buf gdrshim had just made at `f` (dma-bufs left open with no MR).
#[test]
fn a_program_closing_its_own_fds_never_erases_a_fresh_mark() {
    let line = fdharm(&["range-race", "3"], &[]);
    assert!(line.contains("left=0"), "{line}");
}

/// One thread closes every number from the first free one up and opens a file of its own,
/// while others register: on 9772aec the close met an export between the driver's making the
/// dma-buf's fd and gdrshim's adopting it, gdrshim adopted the program's file at that number,
/// and closed it at the dereg.
#[test]
fn gdrshim_never_adopts_the_programs_file_made_at_a_fresh_number() {
    // (each export's ioctl returns 200 us after the driver made the fd: a preempted thread)
    let line = fdharm(&["window", "3"], &[("FAKERM_EXPORT_DELAY_US", "200")]);
    assert!(line.contains("left=0 lost=0"), "{line}");
}

/// One thread closes gdrshim's numbers (`close_range`, `dup2` of `/dev/null` onto them) and
/// makes files of its own at them (memfds, its own opens of the GPU node), while others
/// register, some over a kept buffer: on e8577f8 gdrshim checked a number under its lock and
/// used it after, so the NIC was handed the program's file in place of gdrshim's buffer
/// (`foreign=392`), and exports were asked on the program's files (`elsewhere=7015`) and its own
/// node (`on_program_nodes=309`). Each 300 us between check and use stands for a thread
/// preempted there.
#[test]
fn gdrshim_never_uses_a_number_the_program_took_back() {
    let line =
        fdharm(&["use", "3"], &[("GDRSHIM_TEST_FD_USE_DELAY_US", "300"), ("FAKERM_FD_CACHE", "0")]);
    println!("{line}");
    for zero in ["foreign=0", "wrong=0", "elsewhere=0", "on_program_nodes=0", "left=0"] {
        assert!(line.contains(zero), "{zero}: {line}");
    }
}

/// A fork's prepare handlers run while gdrshim holds its fd lock (from its own prepare handler
/// to its parent handler); a thread that logs meanwhile may be inside libcuda, holding a lock that
/// a later handler (libcuda's own) waits for. The log's line is dropped then, never waited for:
/// the program's later handler sees the line logged (before: the logger waited for the fork and
/// the fork for the logger, 5 s here, for ever with libcuda).
#[test]
fn a_log_line_never_waits_for_a_fork() {
    let dir = std::env::temp_dir().join(format!("gdrshim-forklog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let line = fdharm(&["forklog"], &[("GDRSHIM_LOG_FILE", log.to_str().unwrap())]);
    assert!(line.contains("logged_in_prepare=1"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
