//! `gdrshim-tool fleet` across the lab's hosts (issue 39 on issue 37's lab, tests/lab): N tasks
//! started by Open MPI's `mpirun` (one app context per rank), each run as lab host <rank> (its
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

#[path = "../../tests/common/fakedev.rs"]
mod fakedev;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Lab {
    /// tests/lab/build.sh's output.
    dir: PathBuf,
    shim: PathBuf,
    /// the same library, its version string made 0.1.9: a node that installed another release
    old_shim: PathBuf,
    dev: PathBuf,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

fn lab() -> &'static Lab {
    static L: OnceLock<Lab> = OnceLock::new();
    L.get_or_init(|| {
        let root = root();
        // the cdylib's package (tools/tests/selftest.rs says why)
        sh(Command::new(env!("CARGO"))
            .args(["build", "--release", "--lib", "--locked", "--features", "knobs", "-p", "gdrshim-preload"])
            .env("CARGO_TARGET_DIR", root.join("target/knobs"))
            .current_dir(&root));
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-lab");
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("lab");
        sh(Command::new("bash").arg(root.join("tests/lab/build.sh")).arg(&dir));
        let shim = root.join("target/knobs/release/libgdrshim.so").canonicalize().unwrap();
        let bytes = std::fs::read(&shim).unwrap();
        let (now, then) = (b"0.2.0\0", b"0.1.9\0");
        let at: Vec<usize> = bytes.windows(now.len()).enumerate().filter(|(_, w)| w == now).map(|(i, _)| i).collect();
        assert_eq!(at.len(), 1, "gdrshim_version's string, once in {}", shim.display());
        let mut old = bytes.clone();
        old[at[0]..at[0] + then.len()].copy_from_slice(then);
        std::fs::create_dir_all(base.join("old")).unwrap();
        let old_shim = base.join("old/libgdrshim.so");
        std::fs::write(&old_shim, old).unwrap();
        let dev = base.join("dev");
        fakedev::fake_dev(&dev, &["nvidiactl", "nvidia-uvm", "nvidia0"], false);
        Lab { dir, shim, old_shim, dev }
    })
}

/// How one lab host differs from a good one (besides the wire's faults).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Host {
    Good,
    /// gdrshim not preloaded
    NoShim,
    /// gdrshim 0.1.9 preloaded
    OldShim,
    /// RLIMIT_MEMLOCK 64 KiB and no CAP_IPC_LOCK
    Memlock,
    /// its state's NIC sits across the CPU sockets from its GPU (rig-4090-sys)
    SysPath,
    /// NCCL_NET_GDR_LEVEL=LOC in its environment: its NCCL turns GDR off
    NcclLoc,
}

struct Out {
    code: i32,
    /// rank 0's report
    report: String,
    /// each rank's stderr
    stderr: Vec<String>,
    wall: f64,
    /// what mpirun itself said
    mpirun: String,
}

/// Each host's saved state: a fixture with the host's own HCA as the NIC of its GPU.
fn states(dir: &Path, hosts: &[Host]) -> PathBuf {
    let at = dir.join("state");
    for (r, h) in hosts.iter().enumerate() {
        let from = root().join("tests/fixtures/state").join(if *h == Host::SysPath { "rig-4090-sys" } else { "rig-4090-pix" });
        let to = at.join(format!("labhost{r}"));
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
        let paths = std::fs::read_to_string(from.join("pci-paths.txt")).unwrap();
        let mine: String =
            paths.lines().filter(|l| !l.contains("mlx5_1")).map(|l| l.replace("mlx5_0", &format!("fwroce_{r}")) + "\n").collect();
        std::fs::write(to.join("pci-paths.txt"), mine).unwrap();
    }
    at
}

/// One fleet of `hosts.len()` lab hosts under mpirun, with the wire's `faults`.
fn fleet(tag: &str, hosts: &[Host], faults: &str, extra: &[&str]) -> Out {
    // one fleet at a time: two on 2 cores would measure each other
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let l = lab();
    let dir = l.dir.parent().unwrap().join("runs").join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("faults"), faults).unwrap();
    let state = states(&dir, hosts);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let rdv = format!("127.0.0.1:{port}");
    let mut mpi = Command::new("mpirun");
    mpi.args(["--allow-run-as-root", "--oversubscribe", "--output-filename"]).arg(dir.join("out"));
    for (r, h) in hosts.iter().enumerate() {
        if r > 0 {
            mpi.arg(":");
        }
        mpi.args(["-np", "1"]);
        if *h == Host::Memlock {
            // (as root: CAP_IPC_LOCK leaves the bounding set, so the program has it no more)
            mpi.args(["setpriv", "--bounding-set", "-ipc_lock", "prlimit", "--memlock=65536:65536"]);
        }
        let shim = match h {
            Host::NoShim => String::new(),
            Host::OldShim => format!("{}:", l.old_shim.display()),
            _ => format!("{}:", l.shim.display()),
        };
        mpi.arg("env")
            .arg(format!("LD_PRELOAD={shim}{}", l.dir.join("fakerm.so").display()))
            .arg(format!("LD_LIBRARY_PATH={}", l.dir.join("labcuda").display()))
            .arg(format!("GDRSHIM_TEST_DEV_DIR={}", l.dev.display()))
            .arg(format!("FAKEWIRE_LAB={}", dir.display()))
            .arg("FAKEWIRE_RETRY_MS_MIN=2000")
            .arg(format!("GDRSHIM_FLEET_NCCL={}", l.dir.join("fakenccl/libnccl.so.2").display()))
            .arg(format!("NCCL_NET_GDR_LEVEL={}", if *h == Host::NcclLoc { "LOC" } else { "PHB" }))
            .arg(l.dir.join("host"))
            .arg(r.to_string())
            .arg(env!("CARGO_BIN_EXE_gdrshim-tool"))
            .args(["fleet", "--size", "1048576", "--gpu", "0", "--min-bw", "0", "--min-median", "10", "--timeout", "30"])
            .args(["--rendezvous", &rdv])
            .arg("--state")
            .arg(state.join("{node}"))
            .args(extra);
    }
    for k in ["LD_PRELOAD", "LD_LIBRARY_PATH", "FAKEWIRE_REPORT", "FAKEWIRE_RETRY_MS_MAX", "GDRSHIM_MODE", "GDRSHIM_ROUTE", "NCCL_DEBUG"] {
        mpi.env_remove(k);
    }
    let t0 = Instant::now();
    let log = std::fs::File::create(dir.join("mpirun.log")).unwrap();
    let mut kid =
        mpi.stdout(log.try_clone().unwrap()).stderr(log).spawn().expect("mpirun (Debian's openmpi-bin: scripts/dev/test.sh names it)");
    // every task ends within its --timeout; mpirun itself is given 60 s
    let status = loop {
        if let Some(s) = kid.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = kid.kill();
            let _ = kid.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = t0.elapsed().as_secs_f64();
    let file = |r: usize, f: &str| std::fs::read_to_string(dir.join("out/1").join(format!("rank.{r}")).join(f)).unwrap_or_default();
    let mpirun = std::fs::read_to_string(dir.join("mpirun.log")).unwrap_or_default();
    let stderr: Vec<String> = (0..hosts.len()).map(|r| file(r, "stderr")).collect();
    let status = status.unwrap_or_else(|| panic!("{tag}: mpirun still running after 60 s: {mpirun}{}", stderr.join("")));
    let out = Out { code: status.code().unwrap_or(-1), report: file(0, "stdout"), stderr, wall, mpirun };
    assert!(!out.report.is_empty(), "{tag}: no report from rank 0: mpirun {}: {}{}", out.code, out.mpirun, out.stderr[0]);
    out
}

/// The value of `key=` in a summary line.
fn field(line: &str, key: &str) -> u64 {
    let k = format!(" {key}=");
    let at = line.find(&k).unwrap_or_else(|| panic!("{key} in {line}")) + k.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn summary<'a>(stderr: &'a str, who: &str) -> &'a str {
    stderr.lines().find(|l| l.starts_with(&format!("{who}: summary"))).unwrap_or_else(|| panic!("no {who} summary in {stderr}"))
}

/// The culprits of the report: (kind, what the line names before its colon).
fn culprits(report: &str) -> Vec<(String, String)> {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .map(|l| {
            let (kind, rest) = l.split_once(' ').unwrap();
            (kind.to_string(), rest.trim_start().split(':').next().unwrap().to_string())
        })
        .collect()
}

fn pairs(n: usize) -> usize {
    n * (n - 1) / 2
}

#[test]
fn clean_fleets_of_2_4_and_8_hosts_name_no_culprit_in_n_minus_1_rounds() {
    for n in [2, 4, 8] {
        let o = fleet(&format!("clean{n}"), &vec![Host::Good; n], "", &[]);
        let r = &o.report;
        assert_eq!(o.code, 0, "{r}{}", o.mpirun);
        let head = format!("fleet: {n} node(s) × 1 rail(s), {} round(s), 1 MiB per transfer, launcher Open MPI", n - 1);
        assert!(r.starts_with(&head), "{r}");
        assert!(r.contains(&format!("PASS nodes        {n} of {n} nodes without a finding")), "{r}");
        let p = pairs(n);
        assert!(r.contains(&format!("PASS links        {p} of {p} links pass both ways, RDMA WRITE and READ GPU→GPU")), "{r}");
        assert!(r.ends_with(&format!("RESULT: PASS (0 culprit(s); {p} of {p} links pass)\n")), "{r}");
        assert!(culprits(r).is_empty(), "{r}");
        // each matrix: a row per host, every cell a figure
        for op in ["WRITE", "READ"] {
            let at = r.find(&format!("rail 0 {op} Gb/s")).unwrap_or_else(|| panic!("{op} matrix in {r}"));
            let rows: Vec<&str> = r[at..].lines().skip(2).take(n).collect();
            for (k, row) in rows.iter().enumerate() {
                let cells: Vec<&str> = row.split_whitespace().collect();
                assert_eq!(&cells[..2], [k.to_string().as_str(), &format!("labhost{k}")], "{row}");
                assert!(cells[2..].iter().all(|c| *c == "." || c.parse::<f64>().is_ok_and(|g| g > 0.0)), "{row}");
            }
        }
        // progress: one line per round, each with n/2 pairs
        assert_eq!(o.stderr[0].matches(" pair(s))").count(), n - 1, "{}", o.stderr[0]);
        assert_eq!(o.stderr[0].matches(&format!("({} pair(s))", n / 2)).count(), n - 1, "{}", o.stderr[0]);
        for (k, e) in o.stderr.iter().enumerate() {
            let w = summary(e, "fakewire");
            // GPU memory only as dma-buf MRs (the rig's two, the loopback's), none refused
            assert!(field(w, "gpu_dmabuf_mr") >= 2 && field(w, "gpu_plain_refused") + field(w, "dmabuf_refused") == 0, "{w}");
            assert_eq!(field(w, "wire_errors") + field(w, "dropped") + field(w, "corrupted") + field(w, "timeouts"), 0, "{w}");
            // each peer's WRITE into this host and this host's READ of it: 4 passes of 1 MiB each
            assert!(field(w, "bytes_g2g") >= ((n as u64 - 1) * 8) << 20, "{w}");
            let g = summary(e, "gdrshim");
            assert!(g.contains(&format!(" host=labhost{k} ")) && g.contains(" route=dmabuf "), "{g}");
            // gdrshim exported the GPU memory the wire took: its own dma-bufs, from its exact map
            assert!(field(g, "dmabuf_exports") >= 2 && field(g, "pass0_misses") + field(g, "rm_errors") == 0, "{g}");
        }
        eprintln!("clean fleet of {n} lab hosts: {} round(s), {} pair(s), mpirun {:.2} s", n - 1, pairs(n), o.wall);
    }
}

/// Four hosts, one fault: the report names exactly `want` (kind, subject), and nothing else.
fn named(tag: &str, hosts: [Host; 4], faults: &str, want: &[(&str, &str)]) -> String {
    let o = fleet(tag, &hosts, faults, &[]);
    let got = culprits(&o.report);
    let want: Vec<(String, String)> = want.iter().map(|(k, s)| (k.to_string(), s.to_string())).collect();
    assert_eq!(got, want, "{tag}: {}", o.report);
    assert_eq!(o.code, 1, "{tag}: every task exits 1: {}{}", o.report, o.mpirun);
    let n = want.len();
    assert!(o.report.lines().any(|l| l.starts_with(&format!("RESULT: FAIL ({n} culprit(s): "))), "{}", o.report);
    o.report
}

/// The lines of culprit `subject` (its evidence and fix).
fn detail(report: &str, subject: &str) -> String {
    let start = report.lines().position(|l| l.starts_with("FAIL ") && l.contains(subject)).unwrap();
    report.lines().skip(start).take_while(|l| !l.starts_with("PASS") && !l.starts_with("INFO")).collect::<Vec<_>>().join("\n")
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
    for leg in ["WRITE labhost1→labhost2: slow", "READ labhost1→labhost2: slow", "WRITE labhost2→labhost1: slow"] {
        assert!(d.contains(leg), "{leg} in {d}");
    }
    // each message's first data byte inverted on the way: one work request of 1 MiB a pass,
    // one wrong byte at its start, found by the check of every byte against the pattern, every
    // way: WRITE and READ, both directions
    let r = named("corrupt-link", g, "corrupt 2-3\n", &[("link", &link(2, 3))]);
    assert!(r.contains("the link labhost2 ↔ labhost3 on rail 0: corrupt"), "{r}");
    let d = detail(&r, &link(2, 3));
    assert_eq!(d.matches(": corrupt: 1 of 1048576 bytes differ, the first at 0x0 (").count(), 4, "{d}");
}

#[test]
fn each_fault_of_a_host_is_that_host() {
    let r = named("no-dmabuf", [Good; 4], "no-dmabuf 3\n", &[("dma-buf", "labhost3 rail 0")]);
    let d = detail(&r, "labhost3 rail 0");
    // gdrshim made the dma-buf, the host's kernel refused the MR (the wire's EOPNOTSUPP), and
    // the registration the fleet asked for fails: one culprit, the loopback's failure its evidence
    assert!(d.contains("gdrshim exported it as a dma-buf and the NIC refused the dma-buf MR"), "{d}");
    assert!(d.contains("(+1 for this MR) registered_bytes=0"), "{d}");
    assert!(d.contains("also: the self-test's loopback on rail 0 failed at reg.gpu"), "{d}");
    // its links cannot run: they are its, no link is named
    assert!(r.contains("INFO links        3 of 6 links pass"), "{r}");
    let r = named("no-shim", [Good, Good, NoShim, Good], "", &[("gdrshim", "labhost2")]);
    assert!(r.contains("FAIL gdrshim      labhost2: gdrshim is not loaded in this task"), "{r}");
    let r = named("old-shim", [Good, OldShim, Good, Good], "", &[("gdrshim", "labhost1")]);
    assert!(r.contains("labhost1: gdrshim 0.1.9 on labhost1, 0.2.0 on the 3 other node(s)"), "{r}");
    assert!(r.contains("PASS links        6 of 6 links pass"), "another version moves the bytes: {r}");
    let r = named("sys-path", [Good, Good, Good, SysPath], "", &[("pcie-path", "labhost3 rail 0")]);
    assert!(r.contains("GPU 0000:01:00.0 ↔ fwroce_3: SYS (across the link between CPU sockets)"), "{r}");
    let r = named("memlock", [Memlock, Good, Good, Good], "", &[("memlock", "labhost0")]);
    assert!(r.contains("labhost0: this task may lock 64 KiB of memory, and has no CAP_IPC_LOCK"), "{r}");
}

/// Rank 0's progress lines: each round's seconds and pairs.
fn rounds(stderr: &str) -> Vec<(f64, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("fleet: round "))
        .map(|l| {
            let secs = l.split(" done in ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
            let pairs = l.rsplit(" (").next().unwrap().split(' ').next().unwrap().parse().unwrap();
            (secs, pairs)
        })
        .collect()
}

#[test]
fn wall_time_grows_with_the_rounds_not_the_pairs() {
    // every link carries 50 MB/s: a round's time is its transfers' (1 MiB, four passes each way,
    // WRITE then READ), not the CPU's; the pairs of a round run at once
    let capped = |n: usize| (0..n).map(|h| format!("cap {h} 50\n")).collect::<String>();
    let mut per_round = Vec::new();
    for n in [2, 8] {
        let o = fleet(&format!("time{n}"), &vec![Host::Good; n], &capped(n), &[]);
        assert_eq!(o.code, 0, "{}{}", o.report, o.mpirun);
        let r = rounds(&o.stderr[0]);
        assert_eq!(r.len(), n - 1, "{}", o.stderr[0]);
        assert!(r.iter().all(|&(_, p)| p == n / 2), "{r:?}");
        let total: f64 = r.iter().map(|x| x.0).sum();
        eprintln!(
            "{n} lab hosts at 50 MB/s a link: {} round(s) of {} pair(s), {total:.2} s in rounds, mpirun {:.2} s",
            n - 1,
            n / 2,
            o.wall
        );
        per_round.push((n, total / r.len() as f64, total));
    }
    let (one_pair, eight) = (per_round[0].1, per_round[1]);
    // 8 hosts: 7 rounds of 4 pairs. Pair after pair it would take 28 pair-times; round after
    // round, 7 round-times of about one pair-time each
    assert!(eight.1 < 2.0 * one_pair, "a round of 4 pairs took {:.3} s, one pair {one_pair:.3} s", eight.1);
    assert!(eight.2 < 0.5 * 28.0 * one_pair, "28 pairs in {:.2} s, one pair {one_pair:.3} s", eight.2);
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
    assert_eq!(d.matches(": error: 2 of 2 network connections without GDRDMA: labhost2:").count(), 3, "{d}");
    assert!(o.report.contains("PASS links        6 of 6 links pass"), "RDMA through gdrshim still passes: {}", o.report);
    assert!(o.report.contains("INFO nccl         3 of 6 pairs"), "{}", o.report);
}
