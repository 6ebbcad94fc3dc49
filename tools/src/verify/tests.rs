//! verify-run's verdicts on recorded runs.

use super::checks::*;
use crate::report::{Report, Status};

fn real(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/nccl-logs")
            .join(name),
    )
    .unwrap()
}
fn run(log: &str, f: impl FnOnce(&mut Inputs)) -> Report {
    let mut i = Inputs { nccl_log: log.to_string(), exit_code: Some(0), ..Default::default() };
    f(&mut i);
    verify(&i)
}
fn st(r: &Report, id: &str) -> Status {
    r.get(id).unwrap_or_else(|| panic!("no {id}: {}", r.text())).status
}

/// A two-node GDR run, derived from the real H200 log by adding the connection lines a
/// NET/IB run prints (the H200 has no HCA).
fn gdr_log(suffix: &str) -> String {
    let log = real("h200-allreduce-patched-shim.log");
    let at = log.find("#\n#  ").expect("the table header");
    format!(
        "{}vm:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA{suffix}\nvm:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n{}",
        &log[..at],
        &log[at..]
    )
}

#[test]
fn real_logs_pass() {
    for name in ["h200-allreduce-patched-shim.log", "h200-allreduce-stock.log"] {
        let log = real(name);
        usable(&log).unwrap();
        let r = run(&log, |_| {});
        assert!(!r.failed(), "{name}: {}", r.text());
        assert_eq!(st(&r, "nccl.wrong"), Status::Pass);
        assert!(r.get("nccl.wrong").unwrap().summary.starts_with("12 sizes"));
        assert_eq!(st(&r, "nccl.out_of_bounds"), Status::Pass);
    }
    // the shim's summary line inside the NCCL log is judged
    let r = run(&real("h200-allreduce-patched-shim.log"), |_| {});
    assert_eq!(st(&r, "shim.summary"), Status::Pass);
    assert_eq!(st(&run(&real("h200-allreduce-stock.log"), |_| {}), "shim.summary"), Status::Info);
}

#[test]
fn derived_failures_fail_for_the_right_reason() {
    let good = real("h200-allreduce-patched-shim.log");
    // one wrong element in one size
    let row = good.lines().find(|l| l.trim_start().starts_with("8388608")).unwrap().to_string();
    let bad_row = format!("{} 3", row.trim_end().strip_suffix('0').unwrap());
    let r = run(&good.replace(&row, &bad_row), |i| i.exit_code = Some(7));
    assert_eq!(st(&r, "nccl.wrong"), Status::Fail);
    assert_eq!(r.get("nccl.wrong").unwrap().evidence[0], bad_row.trim_end());
    assert_eq!(st(&r, "nccl.exit"), Status::Fail);
    // truncated after the third size
    let cut: String = good
        .lines()
        .take_while(|l| !l.trim_start().starts_with("2048 "))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = run(&cut, |_| {});
    assert_eq!(st(&r, "nccl.finished"), Status::Fail);
    assert_eq!(st(&r, "nccl.out_of_bounds"), Status::Fail);
    // data check off
    let na = good
        .lines()
        .map(|l| {
            if l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains("float") {
                let mut t: Vec<&str> = l.split_whitespace().collect();
                t[8] = "N/A";
                t[12] = "N/A";
                t.join(" ")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(run(&na, |_| {}).get("nccl.wrong").unwrap().summary.contains("-c 0"));
    // out of bounds
    let r = run(
        &good.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 2 FAILED"),
        |_| {},
    );
    assert_eq!(st(&r, "nccl.out_of_bounds"), Status::Fail);
    // forbidden lines
    for (line, id) in [
        ("vm:1:1 [0] NCCL WARN Call to ibv_reg_mr_iova2 failed with error Bad address", "forbidden.nccl_warn"),
        (
            "vm:1:1 [0] include/alloc.h:99 NCCL WARN Cuda failure 700 'an illegal memory access was encountered'",
            "forbidden.illegal_memory_access",
        ),
        ("vm:1:1 [gdrshim] WARN NV503C REGISTER_VIDMEM refused: NV_ERR_STATE_IN_USE", "forbidden.nv_err_state_in_use"),
    ] {
        let r = run(&format!("{good}{line}\n"), |_| {});
        assert_eq!(st(&r, id), Status::Fail, "{line}");
        assert!(r.get("forbidden").is_none());
    }
    // the shim's account
    let miss = good.replace("pass0_misses=0", "pass0_misses=2");
    assert!(good.contains("pass0_misses=0"));
    let r = run(&miss, |_| {});
    assert_eq!(st(&r, "shim.summary"), Status::Fail);
    assert!(r.get("shim.summary").unwrap().summary.contains("pass0_misses=2"));
    // a shim log given but without summary (killed process)
    let r = run(&real("h200-allreduce-stock.log"), |i| {
        i.shim_logs.push("vm:1:1 [gdrshim] INFO mode=register\n".into())
    });
    assert_eq!(st(&r, "shim.summary"), Status::Fail);
}

#[test]
fn gdr_is_proven_by_connection_lines_never_by_gdr_1() {
    // single node: no NET connection; "GDR 1" alone is not proof
    let one = real("h200-allreduce-patched-shim.log")
        + "vm:1:1 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1\n";
    let r = run(&one, |i| i.expect_gdr = true);
    assert_eq!(st(&r, "nccl.gdr"), Status::Fail);
    assert!(r.get("nccl.gdr").unwrap().fix.contains("'GDR 1' is printed even"));
    let r = run(&gdr_log(""), |i| i.expect_gdr = true);
    assert_eq!(st(&r, "nccl.gdr"), Status::Pass, "{}", r.text());
    // one connection without GDR
    let mixed =
        gdr_log("") + "vm:1:1 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/0\n";
    assert_eq!(st(&run(&mixed, |i| i.expect_gdr = true), "nccl.gdr"), Status::Fail);
}

#[test]
fn a_failed_gdr_check_quotes_the_connection_line_that_decided_it() {
    // issue 31: GDRDMA gone from every Channel line, the FAIL quoted "… GDR 1" instead
    let log = real("derived-2node-gdr.nccl.log").replace("/GDRDMA", "");
    let r = run(&log, |i| i.expect_gdr = true);
    let c = r.get("nccl.gdr").unwrap();
    assert_eq!(c.status, Status::Fail, "{}", r.text());
    assert_eq!(
        c.evidence,
        ["vm:15162:15162 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0"],
        "{}",
        r.text()
    );
    assert!(!c.fix.contains("'GDR 1'"), "{}", c.fix);
}

#[test]
fn an_empty_kernel_log_could_not_be_checked() {
    // issue 31: "-- No entries --" counted as a clean kernel log
    let log = gdr_log("");
    for empty in [
        "-- No entries --\n",
        "",
        "-- Journal begins at Mon 2026-11-30 08:00:01 UTC. --\n-- No entries --\n",
    ] {
        let r = run(&log, |i| i.kernel_log = Some(empty.into()));
        let c = r.get("kernel.xid").unwrap();
        assert_eq!(c.status, Status::CouldNotCheck, "{empty:?}: {}", r.text());
        assert!(c.summary.starts_with("the kernel log given has no entries"), "{}", c.summary);
        assert_eq!(r.exit_code(), 2, "{empty:?}: {}", r.text());
        assert!(r.text().ends_with("; could not check here: kernel.xid: the kernel log given has no entries (journalctl printed none: another boot, no permission to read it?)\n"), "{}", r.text());
    }
    // a FAIL elsewhere still wins
    let r = run(&log, |i| {
        i.kernel_log = Some("-- No entries --\n".into());
        i.exit_code = Some(1);
    });
    assert_eq!(r.exit_code(), 1, "{}", r.text());
    // one real line is a log that can be judged
    let r = run(&log, |i| {
        i.kernel_log = Some(
            "-- Journal begins at x. --\n[    5.3] NVRM: loading NVIDIA UNIX Open Kernel Module\n"
                .into(),
        )
    });
    assert_eq!((st(&r, "kernel.xid"), r.exit_code()), (Status::Pass, 0), "{}", r.text());
}

#[test]
fn a_disabled_flush_fails_before_sm_90() {
    let log =
        gdr_log("") + "vm:1:1 [0] NCCL INFO NCCL_GDR_FLUSH_DISABLE set by environment to 1.\n";
    // the H200 (sm_90) needs no flush
    assert_eq!(st(&run(&log, |_| {}), "nccl.flush"), Status::Pass);
    let on_4090 = log.replace("NVIDIA H200", "NVIDIA GeForce RTX 4090");
    let r = run(&on_4090, |_| {});
    assert_eq!(st(&r, "nccl.flush"), Status::Fail);
    assert!(r.get("nccl.flush").unwrap().summary.contains("sm_89"));
    assert_eq!(st(&run(&log, |i| i.gpu_sm = Some(89)), "nccl.flush"), Status::Fail);
    // NCCL 2.31 prints the flush mode on the receive line
    let r = run(&gdr_log("/flush=None").replace("NVIDIA H200", "NVIDIA GeForce RTX 4090"), |_| {});
    assert_eq!(st(&r, "nccl.flush"), Status::Fail);
    assert_eq!(
        st(
            &run(
                &real("h200-allreduce-patched-shim.log")
                    .replace("NVIDIA H200", "NVIDIA GeForce RTX 4090"),
                |_| {}
            ),
            "nccl.flush"
        ),
        Status::Pass
    );
}

#[test]
fn p2p_verdict() {
    // NCCL 2.28.9 prints both flags; one GPU has no P2P connection to show
    let base = real("h200-allreduce-stock.log");
    assert!(base.contains("isAllDirectP2p 1 directMode 0 isAllCudaP2p 1"));
    let r = run(&base, |i| i.expect_p2p = true);
    assert_eq!(
        (st(&r, "p2p.isAllCudaP2p"), st(&r, "p2p.isAllDirectP2p"), st(&r, "p2p.path")),
        (Status::Pass, Status::Pass, Status::Fail)
    );
    let p2p =
        base.clone() + "vm:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer\n";
    let r = run(&p2p, |i| i.expect_p2p = true);
    assert!(!r.failed(), "{}", r.text());
    let shm = p2p.replace("via P2P/direct pointer", "via SHM/direct/direct");
    let r = run(&shm, |i| i.expect_p2p = true);
    assert_eq!(st(&r, "p2p.path"), Status::Fail);
    assert!(r.get("p2p.path").unwrap().summary.contains("SHM"));
    // NCCL 2.28.3: isAllDirectP2p 0, and no isAllCudaP2p at all
    let r = run(&real("h200-allreduce-patched-shim.log"), |i| i.expect_p2p = true);
    assert_eq!(st(&r, "p2p.isAllDirectP2p"), Status::Fail);
    assert!(r.get("p2p.isAllCudaP2p").unwrap().summary.contains("NCCL < 2.30"));
    // an Xid in the kernel log voids a run
    let r = run(&p2p, |i| {
        i.expect_p2p = true;
        i.kernel_log = Some(
            "[  812.4] NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus.\n".into(),
        )
    });
    assert_eq!(st(&r, "kernel.xid"), Status::Fail);
    let r = run(&p2p, |i| {
        i.kernel_log = Some("[    5.3] NVRM: loading NVIDIA UNIX Open Kernel Module\n".into())
    });
    assert_eq!(st(&r, "kernel.xid"), Status::Pass);
}

#[test]
fn perftest_log() {
    // the layout of perftest's ib_write_bw report (derived: no HCA on our machines)
    let ok = "---------------------------------------------------------------------------------------\n                    RDMA_Write BW Test\n Dual-port       : OFF\t\tDevice         : mlx5_0\n Using CUDA device 0: NVIDIA GeForce RTX 4090\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 16777216   100              69.41              69.35              0.000517\n---------------------------------------------------------------------------------------\n";
    let good = real("h200-allreduce-stock.log");
    let r = run(&good, |i| i.perftest_log = Some(ok.into()));
    assert_eq!(st(&r, "perftest"), Status::Pass, "{}", r.text());
    let err = ok.replace(
        " 16777216   100              69.41              69.35              0.000517\n",
        " Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\n",
    );
    let r = run(&good, |i| i.perftest_log = Some(err));
    assert_eq!(st(&r, "perftest"), Status::Fail);
    let cut: String = ok.lines().take(4).map(|l| format!("{l}\n")).collect();
    assert_eq!(st(&run(&good, |i| i.perftest_log = Some(cut)), "perftest"), Status::Fail);
}

#[test]
fn unusable_input_is_not_a_failure() {
    assert!(usable("").is_err());
    assert!(usable("hello\nworld\n").is_err());
    assert!(usable("# nccl-tests version 2.19.6\n").is_ok());
}

#[test]
fn gpu_names() {
    assert_eq!(sm_of_gpu_name("NVIDIA GeForce RTX 4090"), Some(89));
    assert_eq!(sm_of_gpu_name("NVIDIA H200"), Some(90));
    assert_eq!(sm_of_gpu_name("NVIDIA GeForce RTX 5090"), Some(120));
    assert_eq!(sm_of_gpu_name("NVIDIA A100-SXM4-80GB"), Some(80));
    assert_eq!(sm_of_gpu_name("Something"), None);
}
