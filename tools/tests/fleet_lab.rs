//! `gdrshim-tool fleet` across the lab's hosts (issue 39 on issue 37's lab, tests/lab): N tasks
//! started by Open MPI's `mpirun` (one app context per rank) or, as root, by `srun` in a one-node
//! Slurm the test starts (fleetlab::Slurm), each run as lab host <rank> (its
//! own HCA `fwroce_<rank>`, GIDs, PCI path and host name on the fake wire across processes), with
//! gdrshim preloaded (the knobs build, as tests/lab_hosts.rs preloads it), the fake NVIDIA driver
//! after it and the lab's stand-in libcuda: gdrshim maps the stand-in's allocations from the
//! driver's traffic and turns the fleet's `ibv_reg_mr` over them into its own dma-buf MRs, and the
//! wire moves every byte GPU to GPU between the processes, as the HCAs of two nodes would.
//! Checked: clean fleets of 2, 4 and 8 hosts name no culprit and run N-1 rounds; each fault of
//! issue 39 is named exactly, and nothing else is; wall time grows with the rounds, not the pairs.
//! Every host's node facts come from a saved state made from tests/fixtures/state, with its own
//! HCA as the NIC nearest its GPU. The lab's processes share the machine's few cores, so its
//! figures are noisier than a fleet's: 1 MiB per transfer (64 KiB transfers varied tenfold with
//! a task descheduled), a link slow below 10% of its rail's median (the slow link is capped a
//! hundred times below it), and a retry time of 2 s at least (FAKEWIRE_RETRY_MS_MIN: a busy
//! peer is not a dead one). The fleet's own noise rules are tested in its unit tests.

mod fleetlab;

use fleetlab::{culprits, field, fleet, fleet_srun, summary, Host, Slurm};

fn pairs(n: usize) -> usize {
    n * (n - 1) / 2
}

#[test]
fn clean_fleets_of_2_4_and_8_hosts_name_no_culprit_in_n_minus_1_rounds() {
    for n in [2, 4, 8] {
        let o = fleet(&format!("clean{n}"), &vec![Host::Good; n], "", &[]);
        let r = &o.report;
        assert_eq!(o.code, 0, "{r}{}", o.mpirun);
        let head = format!(
            "fleet: {n} node(s) × 1 rail(s), {} round(s), 1 MiB per transfer, launcher Open MPI",
            n - 1
        );
        assert!(r.starts_with(&head), "{r}");
        assert!(
            r.contains(&format!("PASS nodes        {n} of {n} nodes without a finding")),
            "{r}"
        );
        let p = pairs(n);
        assert!(
            r.contains(&format!(
                "PASS links        {p} of {p} links pass both ways, RDMA WRITE and READ GPU→GPU"
            )),
            "{r}"
        );
        assert!(
            r.ends_with(&format!("RESULT: PASS (0 culprit(s); {p} of {p} links pass)\n")),
            "{r}"
        );
        assert!(culprits(r).is_empty(), "{r}");
        // each matrix: a row per host, every cell a figure
        for op in ["WRITE", "READ"] {
            let at = r
                .find(&format!("rail 0 {op} Gb/s"))
                .unwrap_or_else(|| panic!("{op} matrix in {r}"));
            let rows: Vec<&str> = r[at..].lines().skip(2).take(n).collect();
            for (k, row) in rows.iter().enumerate() {
                let cells: Vec<&str> = row.split_whitespace().collect();
                assert_eq!(&cells[..2], [k.to_string().as_str(), &format!("labhost{k}")], "{row}");
                assert!(
                    cells[2..].iter().all(|c| *c == "." || c.parse::<f64>().is_ok_and(|g| g > 0.0)),
                    "{row}"
                );
            }
        }
        // progress: one line per round, each with n/2 pairs
        assert_eq!(o.stderr[0].matches(" pair(s))").count(), n - 1, "{}", o.stderr[0]);
        assert_eq!(
            o.stderr[0].matches(&format!("({} pair(s))", n / 2)).count(),
            n - 1,
            "{}",
            o.stderr[0]
        );
        for (k, e) in o.stderr.iter().enumerate() {
            let w = summary(e, "fakewire");
            // GPU memory only as dma-buf MRs (the rig's two, the loopback's), none refused
            assert!(
                field(w, "gpu_dmabuf_mr") >= 2
                    && field(w, "gpu_plain_refused") + field(w, "dmabuf_refused") == 0,
                "{w}"
            );
            assert_eq!(
                field(w, "wire_errors")
                    + field(w, "dropped")
                    + field(w, "corrupted")
                    + field(w, "timeouts"),
                0,
                "{w}"
            );
            // each peer's WRITE into this host and this host's READ of it: 4 passes of 1 MiB each
            assert!(field(w, "bytes_g2g") >= ((n as u64 - 1) * 8) << 20, "{w}");
            // every GPU copy by the host's copier (its own process and context), none in the program
            assert!(field(w, "copier_copies") > 0 && field(w, "copier_fallbacks") == 0, "{w}");
            let g = summary(e, "gdrshim");
            assert!(
                g.contains(&format!(" host=labhost{k} ")) && g.contains(" route=dmabuf "),
                "{g}"
            );
            // gdrshim exported the GPU memory the wire took: its own dma-bufs, from its exact map
            assert!(
                field(g, "dmabuf_exports") >= 2
                    && field(g, "pass0_misses") + field(g, "rm_errors") == 0,
                "{g}"
            );
        }
        eprintln!(
            "clean fleet of {n} lab hosts: {} round(s), {} pair(s), mpirun {:.2} s",
            n - 1,
            pairs(n),
            o.wall
        );
    }
}

/// Four hosts, one fault: the report names exactly `want` (kind, subject), and nothing else.
fn named(tag: &str, hosts: [Host; 4], faults: &str, want: &[(&str, &str)]) -> String {
    let o = fleet(tag, &hosts, faults, &[]);
    let got = culprits(&o.report);
    let want: Vec<(String, String)> =
        want.iter().map(|(k, s)| (k.to_string(), s.to_string())).collect();
    assert_eq!(got, want, "{tag}: {}", o.report);
    assert_eq!(o.code, 1, "{tag}: every task exits 1: {}{}", o.report, o.mpirun);
    let n = want.len();
    assert!(
        o.report.lines().any(|l| l.starts_with(&format!("RESULT: FAIL ({n} culprit(s): "))),
        "{}",
        o.report
    );
    o.report
}

/// The lines of culprit `subject` (its evidence and fix).
fn detail(report: &str, subject: &str) -> String {
    let start = report.lines().position(|l| l.starts_with("FAIL ") && l.contains(subject)).unwrap();
    report
        .lines()
        .skip(start)
        .take_while(|l| !l.starts_with("PASS") && !l.starts_with("INFO"))
        .collect::<Vec<_>>()
        .join("\n")
}

use Host::{Good, Memlock, NcclLoc, NoShim, OldShim, SysPath};

#[test]
fn each_fault_of_the_wire_is_the_link_it_is_on() {
    let link = |a: usize, b: usize| format!("labhost{a} ↔ labhost{b} rail 0");
    let g = [Good; 4];
    let r = named("dead-link", g, "down 0-1\n", &[("link", &link(0, 1))]);
    assert!(r.contains("the link labhost0 ↔ labhost1 on rail 0: error"), "{r}");
    assert!(detail(&r, &link(0, 1)).contains("IBV_WC_RETRY_EXC_ERR"), "{r}");
    // 10 MB/s where the others move a few Gb/s: both directions, WRITE and READ
    let r = named("slow-link", g, "cap 1-2 10\n", &[("link", &link(1, 2))]);
    assert!(r.contains("the link labhost1 ↔ labhost2 on rail 0: slow"), "{r}");
    let d = detail(&r, &link(1, 2));
    for leg in [
        "WRITE labhost1→labhost2: slow",
        "READ labhost1→labhost2: slow",
        "WRITE labhost2→labhost1: slow",
    ] {
        assert!(d.contains(leg), "{leg} in {d}");
    }
    // each message's first data byte inverted on the way: one work request of 1 MiB a pass,
    // one wrong byte at its start, found by the check of every byte against the pattern, every
    // way: WRITE and READ, both directions
    let r = named("corrupt-link", g, "corrupt 2-3\n", &[("link", &link(2, 3))]);
    assert!(r.contains("the link labhost2 ↔ labhost3 on rail 0: corrupt"), "{r}");
    let d = detail(&r, &link(2, 3));
    assert_eq!(
        d.matches(": corrupt: 1 of 1048576 bytes differ, the first at 0x0 (").count(),
        4,
        "{d}"
    );
}

#[test]
fn each_fault_of_a_host_is_that_host() {
    let r = named("no-dmabuf", [Good; 4], "no-dmabuf 3\n", &[("dma-buf", "labhost3 rail 0")]);
    let d = detail(&r, "labhost3 rail 0");
    // gdrshim made the dma-buf, the host's kernel refused the MR (the wire's EOPNOTSUPP), and
    // the registration the fleet asked for fails: one culprit, the loopback's failure its evidence
    assert!(
        d.contains("gdrshim exported it as a dma-buf and the NIC refused the dma-buf MR"),
        "{d}"
    );
    assert!(d.contains("(+1 for this MR) registered_bytes=0"), "{d}");
    assert!(d.contains("also: the self-test's loopback on rail 0 failed at reg.gpu"), "{d}");
    // its links cannot run: they are its, no link is named
    assert!(r.contains("INFO links        3 of 6 links pass"), "{r}");
    let r = named("no-shim", [Good, Good, NoShim, Good], "", &[("gdrshim", "labhost2")]);
    assert!(r.contains("FAIL gdrshim      labhost2: gdrshim is not loaded in this task"), "{r}");
    let r = named("old-shim", [Good, OldShim, Good, Good], "", &[("gdrshim", "labhost1")]);
    let want = format!(
        "labhost1: gdrshim {} on labhost1, {} on the 3 other node(s)",
        fleetlab::OLD_VERSION,
        env!("CARGO_PKG_VERSION")
    );
    assert!(r.contains(&want), "{r}");
    assert!(
        r.contains("PASS links        6 of 6 links pass"),
        "another version moves the bytes: {r}"
    );
    let r = named("sys-path", [Good, Good, Good, SysPath], "", &[("pcie-path", "labhost3 rail 0")]);
    assert!(
        r.contains("GPU 0000:01:00.0 ↔ fwroce_3: SYS (across the link between CPU sockets)"),
        "{r}"
    );
    let r = named("memlock", [Memlock, Good, Good, Good], "", &[("memlock", "labhost0")]);
    assert!(
        r.contains("labhost0: this task may lock 64 KiB of memory, and has no CAP_IPC_LOCK"),
        "{r}"
    );
}

/// Rank 0's progress lines: each round's seconds and pairs.
fn rounds(stderr: &str) -> Vec<(f64, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("fleet: round "))
        .map(|l| {
            let secs =
                l.split(" done in ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
            let pairs = l.rsplit(" (").next().unwrap().split(' ').next().unwrap().parse().unwrap();
            (secs, pairs)
        })
        .collect()
}

/// Each host's QPs that passed the lab's gate and that waited it out (its wire's summary).
fn gate_counts(o: &fleetlab::Out) -> Vec<(u64, u64)> {
    o.stderr
        .iter()
        .map(|e| {
            let w = summary(e, "fakewire");
            (field(w, "gate_passed"), field(w, "gate_timeouts"))
        })
        .collect()
}

#[test]
fn the_pairs_of_a_round_run_at_once_as_the_lab_gate_counts() {
    // "gate N": each QP's first request waits until N QPs of the lab have made theirs. A round of
    // n hosts opens n QPs (one a host), as does each node's self-test loopback before the rounds,
    // so pairs that run at once fill the gate each round, and pairs run one after another would
    // each wait it out: a count, not a clock, says which
    let capped = |n: usize| (0..n).map(|h| format!("cap {h} 50\n")).collect::<String>();
    for n in [2, 8] {
        let o = fleet(
            &format!("gate{n}"),
            &vec![Host::Good; n],
            &format!("{}gate {n}\n", capped(n)),
            &[],
        );
        assert_eq!(o.code, 0, "{}{}", o.report, o.mpirun);
        let r = rounds(&o.stderr[0]);
        assert_eq!(r.len(), n - 1, "{}", o.stderr[0]);
        assert!(r.iter().all(|&(_, p)| p == n / 2), "{r:?}");
        let gate = gate_counts(&o);
        // the loopback's QP, then one a round
        let want = (1 + n as u64 - 1, 0);
        assert!(gate.iter().all(|&g| g == want), "(passed, waited out) per host: {gate:?}");
        // the time, for the reader (CI asserts the counts above)
        let total: f64 = r.iter().map(|x| x.0).sum();
        eprintln!(
            "{n} lab hosts at 50 MB/s a link: {} round(s) of {} pair(s), {total:.2} s in rounds, mpirun {:.2} s",
            n - 1,
            n / 2,
            o.wall
        );
    }
    // the gate can fail: one QP more than the loopbacks open is not there until they end, so
    // each of them waits it out (its 300 ms), though the fleet itself still passes
    let o = fleet("gate-unfilled", &[Host::Good; 4], "gate 5 300\n", &[]);
    assert_eq!(o.code, 0, "{}{}", o.report, o.mpirun);
    let gate = gate_counts(&o);
    let waited: u64 = gate.iter().map(|g| g.1).sum();
    assert!(waited >= 4, "(passed, waited out) per host: {gate:?}");
}

#[test]
fn nccl_that_takes_no_gdrdma_on_a_host_is_named_while_its_rdma_passes() {
    // --nccl: per pair a send/recv through NCCL (the lab's stand-in, tests/lab/fakenccl.c, which
    // decides GDRDMA as NCCL does from what gdrshim, the NIC and NCCL_NET_GDR_LEVEL answer)
    let o = fleet("nccl-clean", &[Good; 4], "", &["--nccl"]);
    assert_eq!(o.code, 0, "{}{}", o.report, o.mpirun);
    assert!(
        o.report.contains("PASS nccl         6 of 6 pairs: every inter-node channel of NCCL's send/recv via NET/…/GDRDMA"),
        "{}",
        o.report
    );
    let o = fleet("nccl-loc", &[Good, Good, NcclLoc, Good], "", &["--nccl"]);
    assert_eq!(culprits(&o.report), [("nccl".to_string(), "labhost2".to_string())], "{}", o.report);
    assert_eq!(o.code, 1, "{}{}", o.report, o.mpirun);
    let d = detail(&o.report, "labhost2");
    assert_eq!(
        d.matches(": error: 2 of 2 network connections without GDRDMA: labhost2:").count(),
        3,
        "{d}"
    );
    assert!(
        o.report.contains("PASS links        6 of 6 links pass"),
        "RDMA through gdrshim still passes: {}",
        o.report
    );
    assert!(o.report.contains("INFO nccl         3 of 6 pairs"), "{}", o.report);
}

#[test]
#[ignore = "root: starts a one-node Slurm (slurmctld and slurmd, as root) of its own"]
fn srun_tasks_meet_at_slurms_own_rendezvous_and_a_dead_link_is_named() {
    let slurm = Slurm::start("slurm");
    // srun gives rank, size and the step's first node: no flag, no address
    let o = fleet_srun(&slurm, "srun-clean", 4, "");
    assert_eq!(o.code, 0, "{}{}", o.report, o.mpirun);
    assert!(
        o.report.starts_with(
            "fleet: 4 node(s) × 1 rail(s), 3 round(s), 1 MiB per transfer, launcher Slurm"
        ),
        "{}",
        o.report
    );
    assert!(o.report.ends_with("RESULT: PASS (0 culprit(s); 6 of 6 links pass)\n"), "{}", o.report);
    for (k, e) in o.stderr.iter().enumerate() {
        let w = summary(e, "fakewire");
        assert!(field(w, "bytes_g2g") >= 24 << 20 && field(w, "wire_errors") == 0, "host {k}: {w}");
    }
    let o = fleet_srun(&slurm, "srun-dead-link", 4, "down 2-3\n");
    assert_eq!(
        culprits(&o.report),
        [("link".to_string(), "labhost2 ↔ labhost3 rail 0".to_string())],
        "{}",
        o.report
    );
    assert_ne!(o.code, 0, "{}", o.report);
}
