//! Many hosts on one machine (issue 37 A): the lab's wire across processes. `tests/lab/build.sh`
//! builds the lab; `DIR/host N CMD` runs a program as lab host N with an HCA of its own. Checked
//! here: rdma-core's example programs (Debian's ibverbs-utils) run unchanged between two hosts;
//! 2 and 4 hosts move bytes every way the wire knows, in host memory and in the stand-in libcuda's
//! memory registered as dma-buf MRs on both ends (tests/lab/labpair.c checks every byte); each
//! refusal and fault is seen with the status a real HCA reports. With gdrshim preloaded (the
//! knobs build, a fake driver folder) and without.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::lab::{field, lab};

/// gdrshim preloaded (a fake NVIDIA driver folder beside it), or not.
#[derive(Clone, Copy, PartialEq)]
enum Shim {
    With,
    Without,
}

fn shim() -> &'static (PathBuf, PathBuf) {
    static S: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let e = common::build("lab-hosts");
        let dev = e.dir.join("dev");
        common::fakedev::fake_dev(&dev, &["nvidiactl", "nvidia-uvm", "nvidia0"], false);
        (e.shim, dev)
    })
}

/// One lab of its own (its state and fault file, the hosts' rendezvous folder) on the one build.
struct Net {
    state: PathBuf,
    rdv: PathBuf,
    shim: Shim,
    /// FAKEWIRE_TRACE's prefix where the wire's trace is asked for
    trace: Option<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
}

impl Net {
    fn new(tag: &str, faults: &str, shim: Shim) -> Net {
        let state = lab()
            .join("labs")
            .join(format!("{tag}-{}", if shim == Shim::With { "with" } else { "without" }));
        let _ = std::fs::remove_dir_all(&state);
        let rdv = state.join("rdv");
        std::fs::create_dir_all(&rdv).unwrap();
        std::fs::write(state.join("faults"), faults).unwrap();
        Net { state, rdv, shim, trace: None, env: Vec::new() }
    }

    /// `DIR/host N ARGS...` in this lab.
    fn host(&self, n: usize, args: &[&str]) -> Command {
        let mut c = Command::new(lab().join("host"));
        c.arg(n.to_string())
            .args(args)
            .env("FAKEWIRE_LAB", &self.state)
            .env_remove("LD_PRELOAD")
            .env_remove("FAKEWIRE_REPORT")
            .env_remove("FAKEWIRE_TRACE");
        if let Some(t) = &self.trace {
            c.env("FAKEWIRE_TRACE", t);
        }
        c.env_remove("FAKEWIRE_COPIER").envs(self.env.iter().copied());
        if self.shim == Shim::With {
            let (lib, dev) = shim();
            c.env("LD_PRELOAD", lib).env("GDRSHIM_TEST_DEV_DIR", dev);
            if common::via_front() {
                c.env("GDRSHIM_TEST_VIA_FRONT", "1");
            }
        }
        c
    }

    /// `labpair SCENARIO` on hosts 0..n at once: each host's output.
    fn labpair(&self, scenario: &str, n: usize, gpu: bool) -> Vec<Out> {
        let bin = lab().join("bin").join(if gpu { "labpair-gpu" } else { "labpair" });
        let rdv = self.rdv.to_str().unwrap();
        let kids: Vec<Child> = (0..n)
            .map(|i| {
                let args = [
                    bin.to_str().unwrap(),
                    scenario,
                    rdv,
                    &i.to_string(),
                    &n.to_string(),
                    if gpu { "gpu" } else { "host" },
                ];
                spawn(self.host(i, &args))
            })
            .collect();
        kids.into_iter().map(finish).collect()
    }
}

struct Out {
    ok: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl Out {
    /// The fake wire's summary line of this process.
    fn wire(&self) -> &str {
        self.stderr
            .lines()
            .find(|l| l.starts_with("fakewire: summary"))
            .unwrap_or_else(|| panic!("no summary in {}", self.stderr))
    }
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' in {}{}", self.stdout, self.stderr))
    }
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn")
}

/// Waits for a child (30 s at most: then it is killed and the test fails).
fn finish(mut k: Child) -> Out {
    let end = Instant::now() + Duration::from_secs(30);
    let (mut so, mut se) = (k.stdout.take().unwrap(), k.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = k.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = k.kill();
            let _ = k.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (stdout, stderr) = (t_out.join().unwrap(), t_err.join().unwrap());
    assert!(status.is_some(), "killed after 30 s: {stdout}{stderr}");
    let status = status.unwrap();
    Out { ok: status.success(), status: format!("{status:?}"), stdout, stderr }
}

fn all_pass(outs: &[Out], scenario: &str) {
    for (i, o) in outs.iter().enumerate() {
        let done = format!("labpair {scenario} host {i}: ");
        assert!(
            o.ok && o.stdout.lines().any(|l| l.starts_with(&done) && l.ends_with("checks passed")),
            "host {i}: {}{}",
            o.stdout,
            o.stderr
        );
    }
}

/// A TCP port of its own for a pingpong pair, and the wait until its server listens there.
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[1].ends_with(&format!(":{port:04X}")) && w[3] == "0A"
        })
    })
}

fn pingpong(net: &Net, prog: &[&str], port: u16) -> (Out, Out) {
    let p = port.to_string();
    let server = spawn(net.host(0, &[prog, &["-n", "200", "-p", &p]].concat()));
    let end = Instant::now() + Duration::from_secs(10);
    while !listening(port) {
        assert!(Instant::now() < end, "{prog:?} never listened on {port}");
        std::thread::sleep(Duration::from_millis(2));
    }
    let client =
        finish(spawn(net.host(1, &[prog, &["-n", "200", "-p", &p, "127.0.0.1"]].concat())));
    (finish(server), client)
}

fn rdma_core_programs(shim: Shim, port: u16) {
    let net = Net::new("ibverbs-utils", "", shim);
    let info = finish(spawn(net.host(2, &["ibv_devinfo", "-v"])));
    assert!(info.ok, "{}{}", info.stdout, info.stderr);
    for want in [
        "hca_id:\tfwroce_2",
        "node_guid:\t\t\t0211:22ff:fe33:4457",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "::ffff:10.0.0.3, RoCE v2",
    ] {
        assert!(info.stdout.contains(want), "{want:?} in {}", info.stdout);
    }
    for (i, prog) in [
        &["ibv_rc_pingpong", "-g", "3", "-c"][..],
        &["ibv_ud_pingpong", "-g", "3"],
        &["ibv_srq_pingpong", "-g", "3"],
    ]
    .iter()
    .enumerate()
    {
        let (s, c) = pingpong(&net, prog, port + i as u16);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(
                o.ok && o.stdout.contains("200 iters in"),
                "{prog:?} {who}: {} {}{}",
                o.status,
                o.stdout,
                o.stderr
            );
            assert_eq!(field(o.wire(), "gdrshim"), (shim == Shim::With) as u64, "{}", o.wire());
            assert_eq!(
                field(o.wire(), "wire_errors") + field(o.wire(), "timeouts"),
                0,
                "{}",
                o.wire()
            );
        }
        // each side names the other's GID: a host of its own
        assert!(
            s.stdout.contains("remote address: LID 0x0000")
                && s.stdout.contains("GID ::ffff:10.0.0.2"),
            "{}",
            s.stdout
        );
        assert!(c.stdout.contains("GID ::ffff:10.0.0.1"), "{}", c.stdout);
    }
}

#[test]
fn rdma_core_examples_run_unchanged_between_two_hosts() {
    let base = 20000 + (std::process::id() % 4000) as u16 * 8;
    rdma_core_programs(Shim::Without, base);
    rdma_core_programs(Shim::With, base + 4);
}

/// Every pair of n hosts: WRITE, WRITE_IMM, READ, SEND into an SRQ, UD (labpair checks the bytes).
fn mesh(n: usize, gpu: bool, shim: Shim) {
    let net = Net::new(&format!("mesh{n}-{}", if gpu { "gpu" } else { "host" }), "", shim);
    let outs = net.labpair("mesh", n, gpu);
    all_pass(&outs, "mesh");
    // per peer: WRITE 65536 + SEND 4096 + WRITE_IMM 1024 + READ 65536 in the buffer's memory, a
    // 256-byte UD message in host memory; counted where the bytes land
    let (rc, ud) = (136192 * (n as u64 - 1), 256 * (n as u64 - 1));
    for o in &outs {
        let w = o.wire();
        let (g2g, h2h) = (field(w, "bytes_g2g"), field(w, "bytes_h2h"));
        assert_eq!((g2g, h2h), if gpu { (rc, ud) } else { (0, rc + ud) }, "{w}");
        assert_eq!(
            (field(w, "gpu_dmabuf_mr"), field(w, "gpu_plain_refused")),
            (gpu as u64, 0),
            "{w}"
        );
        assert_eq!(field(w, "wire_errors") + field(w, "dropped") + field(w, "timeouts"), 0, "{w}");
        assert_eq!(field(w, "gdrshim"), (shim == Shim::With) as u64, "{w}");
        // every GPU copy (WRITE, READ, SEND in and out) by the host's copier, none in the program
        assert_eq!(field(w, "copier_fallbacks"), 0, "{w}");
        assert_eq!(field(w, "copier_copies") > 0, gpu, "{w}");
        if shim == Shim::With && gpu {
            // gdrshim (started by the program's first CUDA call) saw its dma-buf MR on the way
            let g = o
                .stderr
                .lines()
                .find(|l| l.starts_with("gdrshim: summary"))
                .unwrap_or_else(|| panic!("{}", o.stderr));
            assert_eq!((field(g, "dmabuf_mrs"), field(g, "rm_errors")), (gpu as u64, 0), "{g}");
            assert!(g.contains(" host=labhost"), "{g}");
        }
    }
}

#[test]
fn two_and_four_hosts_move_every_byte() {
    for (n, gpu) in [(2, false), (4, false), (2, true), (4, true)] {
        mesh(n, gpu, Shim::Without);
    }
    for gpu in [false, true] {
        mesh(4, gpu, Shim::With);
    }
}

/// The shape that stalled NCCL on the GPU machine (issue 47; docs/results/h200-run30-hosts): a
/// program thread blocked in libcuda, in a pageable copy that waits for bytes the wire must write
/// into its GPU memory. The stand-in libcuda stages pageable copies through one buffer held for
/// the whole copy, as libcuda does; the wire's own copies go through pinned memory of its own, so
/// the WRITEs land while the thread is blocked and its copy reads every byte.
#[test]
fn the_wire_writes_gpu_memory_while_the_program_is_blocked_in_libcuda() {
    for shim in [Shim::Without, Shim::With] {
        let outs = Net::new("blocked", "", shim).labpair("blocked", 2, true);
        all_pass(&outs, "blocked");
        let l = outs[0].line("labpair blocked host 0:");
        assert_eq!(field(l, "wrong_bytes"), 0, "{l}");
        let w = outs[0].wire();
        assert_eq!((field(w, "bytes_g2g"), field(w, "timeouts")), (65540, 0), "{w}");
        // host 0's GPU memory was written by its copier, in a process and a context of its own
        assert_eq!((field(w, "copier_copies"), field(w, "copier_fallbacks")), (2, 0), "{w}");
    }
}

/// The stand-in libcuda holds a process as the GPU does while a thread of it is blocked in a
/// copy behind a wait (tests/gpu/blocked_copy.cu): with the copier off (`FAKEWIRE_COPIER=0`) the
/// wire copies in the program's process, through its pinned buffer on its own stream, and that
/// copy waits for the blocked one, which times out: the stall NCCL met on the GPU.
#[test]
fn without_its_copier_the_wire_stalls_while_the_program_is_blocked_in_libcuda() {
    let mut net = Net::new("blocked-in-process", "", Shim::Without);
    net.env.push(("FAKEWIRE_COPIER", "0"));
    // the stall shows in 3 s as well as in the stand-in's default 20
    net.env.push(("LABCUDA_SYNC_TIMEOUT_MS", "3000"));
    let outs = net.labpair("blocked", 2, true);
    let o = &outs[0];
    let text = format!("{}{}", o.stdout, o.stderr);
    assert!(
        !o.ok && text.contains("the pageable copy never got its bytes (CUDA error 702"),
        "{text}"
    );
    let w = o.wire();
    assert_eq!((field(w, "copier_copies"), field(w, "copier_fallbacks")), (0, 1), "{w}");
}

/// The wire's trace (FAKEWIRE_TRACE, what a stalled run on the GPU machine is read by): each
/// request a host wrote was received by its peer and answered there, its answer came back, and
/// every GPU copy that began ended, successfully.
#[test]
fn the_trace_follows_every_request_and_gpu_copy_to_its_end() {
    let mut net = Net::new("trace2-gpu", "", Shim::With);
    net.trace = Some(net.state.join("trace"));
    let outs = net.labpair("mesh", 2, true);
    all_pass(&outs, "mesh");
    let pid = |o: &Out| field(o.wire(), "pid");
    let traces: Vec<String> = outs
        .iter()
        .enumerate()
        .map(|(h, o)| {
            let f = net.state.join(format!("trace.{h}.{}", pid(o)));
            std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect();
    // "... REQ op=O qpn A->B seq=S ..." without its timestamp, thread and verb
    let key =
        |l: &str| l.split(" REQ ").nth(1).and_then(|r| r.split(" len=").next()).map(str::to_owned);
    for (h, t) in traces.iter().enumerate() {
        let peer = &traces[1 - h];
        let written: Vec<String> =
            t.lines().filter(|l| l.contains(" written REQ ")).filter_map(key).collect();
        // per peer: WRITE, SEND, WRITE_IMM, READ on RC, and a UD SEND (no answer is owed)
        assert_eq!(written.len(), 5, "host {h}:\n{t}");
        for k in &written {
            let (_, qpns) = k.split_once(" qpn ").unwrap();
            let (dst, seq) = qpns.split_once("->").unwrap().1.split_once(' ').unwrap();
            assert!(
                peer.lines().any(|l| l.contains(" received REQ ") && key(l).as_deref() == Some(k)),
                "host {h}'s request {k} never reached host {}:\n{peer}",
                1 - h
            );
            if k.starts_with("op=2 ") && seq == "seq=0" {
                continue; // the UD SEND
            }
            let answered = format!(" answer qpn {dst} {seq} status=0");
            assert!(peer.contains(&answered), "no '{answered}' for {k} on host {}:\n{peer}", 1 - h);
            assert!(
                t.lines().any(|l| l.contains(" received RSP ")
                    && l.contains(&format!("->{dst} {seq} "))
                    && l.contains(" status=0 ")),
                "host {h} never got the answer to {k}:\n{t}"
            );
        }
        let begun = t.matches(" copy begin ").count();
        let ended: Vec<&str> = t.lines().filter(|l| l.contains(" copy end ")).collect();
        assert!(begun >= 4, "host {h}: {begun} GPU copies:\n{t}");
        assert_eq!(ended.len(), begun, "host {h}:\n{t}");
        assert!(ended.iter().all(|l| l.contains(" rc=0 ")), "host {h}:\n{t}");
        // the peer's WRITEs land in this host's GPU memory: host to GPU copies here
        assert!(ended.iter().any(|l| l.contains(" copy end h2g ")), "host {h}:\n{t}");
    }
}

#[test]
fn refusals_complete_with_the_hcas_statuses_at_both_ends() {
    for shim in [Shim::Without, Shim::With] {
        let outs = Net::new("errors", "", shim).labpair("errors", 2, true);
        all_pass(&outs, "errors");
        // the requester's own refusal (a wrong lkey); the responder's five (rkey, bounds, QP access,
        // MR access, receive length)
        assert_eq!(field(outs[0].wire(), "wire_errors"), 1, "{}", outs[0].wire());
        assert_eq!(field(outs[1].wire(), "wire_errors"), 5, "{}", outs[1].wire());
    }
}

/// The retry time labpair's QP asks (timeout 12, retry_cnt 7), and what host 0 measured.
fn retry_elapsed(outs: &[Out]) -> u64 {
    let l = outs[0].line("labpair retry host 0:");
    assert_eq!(field(l, "retry_ms"), 134, "{l}");
    field(l, "elapsed_ms")
}

#[test]
fn a_peer_gone_or_cut_off_completes_retry_exc_err_in_the_retry_time() {
    for (tag, faults, scenario) in [
        ("gone", "", "retry"),
        ("link", "down 0-1\n", "retry-alive"),
        ("port", "down 1\n", "retry-alive"),
    ] {
        let outs = Net::new(tag, faults, Shim::Without).labpair(scenario, 2, false);
        all_pass(&outs, scenario);
        let t = retry_elapsed(&outs);
        assert!((120..2000).contains(&t), "{tag}: RETRY_EXC_ERR after {t} ms, not the QP's 134");
        assert_eq!(field(outs[0].wire(), "timeouts"), 1, "{}", outs[0].wire());
    }
    // the port that is down says so, where a link fault leaves both ports up
    let net = Net::new("port-state", "down 1\n", Shim::Without);
    let regs: Vec<Out> = (0..2)
        .map(|i| {
            finish(spawn(net.host(
                i,
                &[lab().join("bin/labpair").to_str().unwrap(), "regs", "-", &i.to_string(), "1"],
            )))
        })
        .collect();
    assert!(regs[0].line("labpair regs host 0:").contains("port=active"), "{}", regs[0].stdout);
    assert!(regs[1].line("labpair regs host 1:").contains("port=down"), "{}", regs[1].stdout);
}

/// 8 MiB WRITTEN from host 0 to host 1 under `faults`: (elapsed ms, wrong bytes, first wrong).
fn stream(tag: &str, faults: &str, gpu: bool) -> (u64, u64, i64) {
    let outs = Net::new(tag, faults, Shim::Without).labpair("stream", 2, gpu);
    all_pass(&outs, "stream");
    let (a, b) = (outs[0].line("labpair stream host 0:"), outs[1].line("labpair stream host 1:"));
    let first: i64 = b.rsplit("first_wrong=").next().unwrap().trim().parse().unwrap();
    (field(a, "elapsed_ms"), field(b, "wrong_bytes"), first)
}

#[test]
fn a_link_capped_or_corrupting_is_seen_on_that_link_only() {
    // faults on the other links of both hosts: this link is clean
    assert_eq!(stream("clean", "corrupt 1-2\ncap 0-3 1\ndown 0-2\n", true).1, 0);
    // 8 MiB at 50 MB/s: at least 168 ms
    let (t, wrong, _) = stream("cap", "cap 0-1 50\n", false);
    assert!(t >= 160 && wrong == 0, "capped at 50 MB/s: {t} ms, {wrong} wrong");
    let (t, _, _) = stream("cap-host", "cap 1 100 # MB/s, every link of host 1\n", true);
    assert!(t >= 80, "host capped at 100 MB/s: {t} ms");
    // each message's first byte inverted on the way: eight 1 MiB WRITEs, eight wrong bytes
    let (_, wrong, first) = stream("corrupt", "corrupt 0-1\n", true);
    assert_eq!((wrong, first), (8, 0), "a corrupting link");
}

/// Each host's `labpair regs` line with `faults`, in the stand-in libcuda's memory, and its
/// wire's summary.
fn regs(faults: &str, hosts: usize) -> Vec<(String, String)> {
    let net = Net::new("regs", faults, Shim::Without);
    let bin = lab().join("bin/labpair-gpu");
    (0..hosts)
        .map(|i| {
            let o = finish(spawn(
                net.host(i, &[bin.to_str().unwrap(), "regs", "-", &i.to_string(), "1", "gpu"]),
            ));
            assert!(o.ok, "{}{}", o.stdout, o.stderr);
            (o.line(&format!("labpair regs host {i}:")).to_string(), o.wire().to_string())
        })
        .collect()
}

#[test]
fn a_host_without_dmabuf_and_a_host_with_peermem() {
    let (r, wire): (Vec<String>, Vec<String>) =
        regs("no-dmabuf 0\npeermem 1\n", 3).into_iter().unzip();
    // the wire counts host 0's refusals as its kernel's answer, not as wrong registrations
    // (the GPU runs' verdict reads dmabuf_refused as "wrong_regs")
    let (unsupported, refused) =
        (field(&wire[0], "dmabuf_unsupported"), field(&wire[0], "dmabuf_refused"));
    assert_eq!((unsupported, refused), (2, 0), "{}", wire[0]);
    assert!(wire[1..].iter().all(|w| field(w, "dmabuf_unsupported") == 0), "{wire:?}");
    // host 0: a kernel without dma-buf MRs (NCCL's probe reads EOPNOTSUPP as "no"), no peermem
    assert!(
        r[0].contains("dmabuf_probe=Operation not supported dmabuf_mr=Operation not supported plain_gpu_mr=Bad address peermem_sysfs=0"),
        "{}",
        r[0]
    );
    // host 1: nvidia-peermem loaded: a plain MR over GPU memory pins, its sysfs file is there
    assert!(
        r[1].contains(
            "dmabuf_probe=Bad file descriptor dmabuf_mr=ok plain_gpu_mr=ok peermem_sysfs=1"
        ),
        "{}",
        r[1]
    );
    // host 2: an inbox kernel: dma-buf MRs only
    assert!(r[2].contains("dmabuf_probe=Bad file descriptor dmabuf_mr=ok plain_gpu_mr=Bad address peermem_sysfs=0"), "{}", r[2]);
    for (i, l) in r.iter().enumerate() {
        assert!(
            l.contains(&format!(
                "uname=labhost{i} gethostname=labhost{i} device=fwroce_{i} port=active"
            )),
            "{l}"
        );
    }
}

#[test]
fn each_host_has_its_own_sysfs_and_name() {
    let net = Net::new("sysfs", "", Shim::Without);
    let script = "cat /sys/class/infiniband/fwroce_2/ports/1/gid_attrs/ndevs/3 /sys/class/infiniband/fwroce_2/ports/1/gids/3 \
                  /sys/bus/pci/devices/0000:42:00.0/class; ls /sys/class/infiniband; ls /sys/class/infiniband/fwroce_2/device/net; uname -n";
    let o = finish(spawn(net.host(2, &["sh", "-c", script])));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        "fwnet2\n0000:0000:0000:0000:0000:ffff:0a00:0003\n0x020000\nfwroce_2\nfwnet2\nlabhost2\n"
    );
}
