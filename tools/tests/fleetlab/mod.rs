//! What tools/tests/fleet_lab.rs shares: the lab built once (tests/lab/build.sh, the knobs
//! build of gdrshim and a copy of it that says another version, a fake driver folder), each
//! host's saved state, one fleet started by mpirun or by srun, and the reading of its report.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../tests/common/fakedev.rs"]
mod fakedev;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct Lab {
    /// tests/lab/build.sh's output.
    pub dir: PathBuf,
    pub shim: PathBuf,
    /// the same library, its version string made [`OLD_VERSION`]: a node that installed another release
    pub old_shim: PathBuf,
    pub dev: PathBuf,
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The version another node runs in the lab: an earlier release's, as long as this one's (the
/// library's string is patched in place; asserted where it is).
pub const OLD_VERSION: &str = "0.2.0";

pub fn lab() -> &'static Lab {
    static L: OnceLock<Lab> = OnceLock::new();
    L.get_or_init(|| {
        let root = root();
        // the cdylib's package (tools/tests/selftest.rs says why)
        sh(Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--lib",
                "--locked",
                "--features",
                "knobs",
                "-p",
                "gdrshim-preload",
            ])
            .env("CARGO_TARGET_DIR", root.join("target/knobs"))
            .current_dir(&root));
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-lab");
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("lab");
        sh(Command::new("bash").arg(root.join("tests/lab/build.sh")).arg(&dir));
        let shim = root.join("target/knobs/release/libgdrshim.so").canonicalize().unwrap();
        let bytes = std::fs::read(&shim).unwrap();
        let (now, then) = (format!("{}\0", env!("CARGO_PKG_VERSION")), format!("{OLD_VERSION}\0"));
        let (now, then) = (now.as_bytes(), then.as_bytes());
        assert!(
            now.len() == then.len() && now != then,
            "{OLD_VERSION}: another version, the length of this one's"
        );
        let at: Vec<usize> = bytes
            .windows(now.len())
            .enumerate()
            .filter(|(_, w)| *w == now)
            .map(|(i, _)| i)
            .collect();
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
pub enum Host {
    Good,
    /// gdrshim not preloaded
    NoShim,
    /// gdrshim [`OLD_VERSION`] preloaded
    OldShim,
    /// RLIMIT_MEMLOCK 64 KiB and no CAP_IPC_LOCK
    Memlock,
    /// its state's NIC sits across the CPU sockets from its GPU (rig-4090-sys)
    SysPath,
    /// NCCL_NET_GDR_LEVEL=LOC in its environment: its NCCL turns GDR off
    NcclLoc,
}

pub struct Out {
    pub code: i32,
    /// rank 0's report
    pub report: String,
    /// each rank's stderr
    pub stderr: Vec<String>,
    pub wall: f64,
    /// what the launcher itself said
    pub mpirun: String,
}

/// Each host's saved state: a fixture with the host's own HCA as the NIC of its GPU.
pub fn states(dir: &Path, hosts: &[Host]) -> PathBuf {
    let at = dir.join("state");
    for (r, h) in hosts.iter().enumerate() {
        let from = root().join("tests/fixtures/state").join(if *h == Host::SysPath {
            "rig-4090-sys"
        } else {
            "rig-4090-pix"
        });
        let to = at.join(format!("labhost{r}"));
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
        let paths = std::fs::read_to_string(from.join("pci-paths.txt")).unwrap();
        let mine: String = paths
            .lines()
            .filter(|l| !l.contains("mlx5_1"))
            .map(|l| l.replace("mlx5_0", &format!("fwroce_{r}")) + "\n")
            .collect();
        std::fs::write(to.join("pci-paths.txt"), mine).unwrap();
    }
    at
}

/// A run's own folder: its fault file and lab state, each host's saved state.
fn prepare(tag: &str, hosts: &[Host], faults: &str) -> (PathBuf, PathBuf) {
    let dir = lab().dir.parent().unwrap().join("runs").join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("out")).unwrap();
    std::fs::write(dir.join("faults"), faults).unwrap();
    let state = states(&dir, hosts);
    (dir, state)
}

/// What runs one task as lab host `r` (`h`): the wrapper, `env` with its variables, DIR/host, the
/// tool and its arguments; `host` is the host's number as the command line gives it.
fn task(h: Host, host: &str, dir: &Path, state: &Path, extra: &[&str]) -> Vec<String> {
    let l = lab();
    let mut c: Vec<String> = Vec::new();
    if h == Host::Memlock {
        // (as root: CAP_IPC_LOCK leaves the bounding set, so the program has it no more)
        c.extend(
            ["setpriv", "--bounding-set", "-ipc_lock", "prlimit", "--memlock=65536:65536"]
                .map(String::from),
        );
    }
    let shim = match h {
        Host::NoShim => String::new(),
        Host::OldShim => format!("{}:", l.old_shim.display()),
        _ => format!("{}:", l.shim.display()),
    };
    c.push("env".into());
    c.push(format!("LD_PRELOAD={shim}{}", l.dir.join("fakerm.so").display()));
    c.push(format!("LD_LIBRARY_PATH={}", l.dir.join("labcuda").display()));
    c.push(format!("GDRSHIM_TEST_DEV_DIR={}", l.dev.display()));
    c.push(format!("FAKEWIRE_LAB={}", dir.display()));
    c.push("FAKEWIRE_RETRY_MS_MIN=2000".into());
    c.push(format!("GDRSHIM_FLEET_NCCL={}", l.dir.join("fakenccl/libnccl.so.2").display()));
    c.push(format!("NCCL_NET_GDR_LEVEL={}", if h == Host::NcclLoc { "LOC" } else { "PHB" }));
    c.push(l.dir.join("host").display().to_string());
    c.push(host.into());
    c.push(env!("CARGO_BIN_EXE_gdrshim-tool").into());
    c.extend(
        [
            "fleet",
            "--size",
            "1048576",
            "--gpu",
            "0",
            "--min-bw",
            "0",
            "--min-median",
            "10",
            "--timeout",
            "30",
        ]
        .map(String::from),
    );
    c.push("--state".into());
    c.push(state.join("{node}").display().to_string());
    c.extend(extra.iter().map(|s| s.to_string()));
    c
}

/// One fleet of `hosts.len()` lab hosts under mpirun (one app context per rank), with the wire's
/// `faults`.
pub fn fleet(tag: &str, hosts: &[Host], faults: &str, extra: &[&str]) -> Out {
    let (dir, state) = prepare(tag, hosts, faults);
    let rdv = format!("127.0.0.1:{}", common::listen_ports(1));
    let mut mpi = Command::new("mpirun");
    mpi.args(["--allow-run-as-root", "--oversubscribe", "--output-filename"]).arg(dir.join("out"));
    for (r, h) in hosts.iter().enumerate() {
        if r > 0 {
            mpi.arg(":");
        }
        mpi.args(["-np", "1"]).args(task(
            *h,
            &r.to_string(),
            &dir,
            &state,
            &[&["--rendezvous", &rdv][..], extra].concat(),
        ));
    }
    let file = |r: usize, f: &str| dir.join("out/1").join(format!("rank.{r}")).join(f);
    launch(tag, mpi, &dir, hosts.len(), &file)
}

/// One fleet of `n` good lab hosts as the tasks of one `srun` step of `slurm`, with `faults`:
/// each task the lab host of its SLURM_PROCID; the rendezvous Slurm's own (no flag).
pub fn fleet_srun(slurm: &Slurm, tag: &str, n: usize, faults: &str) -> Out {
    let (dir, state) = prepare(tag, &vec![Host::Good; n], faults);
    let mut c = task(Host::Good, "$SLURM_PROCID", &dir, &state, &[]);
    let host = c.iter().position(|a| a == "$SLURM_PROCID").unwrap();
    c[host] = "\"$SLURM_PROCID\"".into();
    let script = dir.join("task.sh");
    let quoted: Vec<String> = c
        .iter()
        .enumerate()
        .map(|(k, a)| if k == host { a.clone() } else { format!("'{a}'") })
        .collect();
    std::fs::write(&script, format!("#!/bin/sh\nexec {}\n", quoted.join(" "))).unwrap();
    let mut srun = Command::new("srun");
    srun.env("SLURM_CONF", &slurm.conf).args([
        "--overcommit",
        "-n",
        &n.to_string(),
        "--kill-on-bad-exit=0",
    ]);
    srun.arg(format!("--output={}/out/%t.stdout", dir.display()))
        .arg(format!("--error={}/out/%t.stderr", dir.display()));
    srun.args(["sh", &script.display().to_string()]);
    let file = |r: usize, f: &str| dir.join("out").join(format!("{r}.{f}"));
    launch(tag, srun, &dir, n, &file)
}

/// Runs the launcher (60 s at most) and reads what each rank said.
fn launch(
    tag: &str,
    mut cmd: Command,
    dir: &Path,
    n: usize,
    file: &dyn Fn(usize, &str) -> PathBuf,
) -> Out {
    // one fleet at a time: two on 2 cores would measure each other
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    for k in [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "FAKEWIRE_REPORT",
        "FAKEWIRE_RETRY_MS_MAX",
        "GDRSHIM_MODE",
        "GDRSHIM_ROUTE",
        "NCCL_DEBUG",
    ] {
        cmd.env_remove(k);
    }
    let t0 = Instant::now();
    let log = std::fs::File::create(dir.join("launcher.log")).unwrap();
    let what = format!("{:?}", cmd.get_program());
    let mut kid = cmd.stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap_or_else(|e| {
        panic!(
            "{what}: {e} (Debian's openmpi-bin, slurmd, slurmctld: scripts/dev/test.sh names them)"
        )
    });
    // every task ends within its --timeout; the launcher itself is given 60 s
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
    let read = |r: usize, f: &str| std::fs::read_to_string(file(r, f)).unwrap_or_default();
    let mpirun = std::fs::read_to_string(dir.join("launcher.log")).unwrap_or_default();
    let stderr: Vec<String> = (0..n).map(|r| read(r, "stderr")).collect();
    let status = status.unwrap_or_else(|| {
        panic!("{tag}: {what} still running after 60 s: {mpirun}{}", stderr.join(""))
    });
    let out =
        Out { code: status.code().unwrap_or(-1), report: read(0, "stdout"), stderr, wall, mpirun };
    assert!(
        !out.report.is_empty(),
        "{tag}: no report from rank 0: {what} {}: {}{}",
        out.code,
        out.mpirun,
        out.stderr[0]
    );
    // GDRSHIM_FLEETLAB_SHOW=1: rank 0's report as a user sees it, for the record
    if std::env::var_os("GDRSHIM_FLEETLAB_SHOW").is_some() {
        eprintln!("=== {tag} (exit {}, {:.1} s)\n{}", out.code, out.wall, out.report);
    }
    out
}

/// The value of `key=` in a summary line.
pub fn field(line: &str, key: &str) -> u64 {
    let k = format!(" {key}=");
    let at = line.find(&k).unwrap_or_else(|| panic!("{key} in {line}")) + k.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

pub fn summary<'a>(stderr: &'a str, who: &str) -> &'a str {
    stderr
        .lines()
        .find(|l| l.starts_with(&format!("{who}: summary")))
        .unwrap_or_else(|| panic!("no {who} summary in {stderr}"))
}

/// The culprits of the report: (kind, what the line names before its colon).
pub fn culprits(report: &str) -> Vec<(String, String)> {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .map(|l| {
            let (kind, rest) = l.split_once(' ').unwrap();
            (kind.to_string(), rest.trim_start().split(':').next().unwrap().to_string())
        })
        .collect()
}

/// A one-node Slurm of the test's own (slurmctld and slurmd in the foreground, a private
/// configuration, free ports, auth/none), stopped when dropped.
pub struct Slurm {
    pub conf: PathBuf,
    daemons: Vec<std::process::Child>,
}

impl Slurm {
    pub fn start(tag: &str) -> Slurm {
        let dir = lab().dir.parent().unwrap().join(tag);
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let port = || common::listen_ports(1);
        let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d = dir.display();
        let conf = format!(
            "ClusterName=fleetlab\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={}\nSlurmdPort={}\nAuthType=auth/none\n\
             CredType=cred/none\nSlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/d.pid\nSlurmctldLogFile={d}/log/ctld.log\n\
             SlurmdLogFile={d}/log/d.log\nProctrackType=proctrack/pgid\nTaskPlugin=task/none\nMpiDefault=none\n\
             ReturnToService=2\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
             PartitionName=lab Nodes={host} Default=YES MaxTime=10 State=UP\n",
            port(),
            port()
        );
        let path = dir.join("slurm.conf");
        std::fs::write(&path, conf).unwrap();
        let spawn = |prog: &str, args: &[&str]| {
            Command::new(prog)
                .args(args)
                .env("SLURM_CONF", &path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{prog}: {e}"))
        };
        let mut s =
            Slurm { conf: path.clone(), daemons: vec![spawn("slurmctld", &["-D", "-c", "-i"])] };
        s.daemons.push(spawn("slurmd", &["-D"]));
        // until the node is idle (20 s at most)
        let t0 = Instant::now();
        loop {
            let o = Command::new("sinfo")
                .args(["-h", "-o", "%T"])
                .env("SLURM_CONF", &path)
                .output()
                .unwrap();
            if String::from_utf8_lossy(&o.stdout).trim() == "idle" {
                break;
            }
            let logs = std::fs::read_to_string(dir.join("log/ctld.log")).unwrap_or_default();
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the one-node Slurm did not come up: {logs}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}
