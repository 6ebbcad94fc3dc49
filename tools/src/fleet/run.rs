//! One task of the fleet check from start to exit: the launcher's environment, the rendezvous,
//! this task's facts, the rounds, and on rank 0 the verdict and the report. Every task takes
//! part in every exchange (with "no" where it has nothing), so a task that cannot move bytes
//! never stalls the others; every task exits with the code rank 0 decides.

use super::args::Args;
use super::link::Rig;
use super::model::{Fact, Kind, Leg, Outcome, Rail, Task};
use super::render::Fleet;
use super::round::{self, gather, tag};
use super::wire::Group;
use super::{launch, nccl, node, verdict};
use crate::report::COULD_NOT_CHECK;
use crate::selftest::cuda::Cuda;
use crate::selftest::ffi::Verbs;
use crate::selftest::shim::AllCounters;
use std::time::{Duration, Instant};

/// The node's name: GDRSHIM_FLEET_NODE where the host name does not tell nodes apart (containers
/// with one name), else the host name.
fn hostname() -> String {
    if let Some(n) = std::env::var("GDRSHIM_FLEET_NODE").ok().filter(|n| !n.is_empty()) {
        return n;
    }
    let mut b = [0u8; 256];
    // SAFETY: a writable buffer of the length given; gethostname NUL-terminates what fits.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len() - 1) };
    let end = b.iter().position(|&c| c == 0).unwrap_or(0);
    if rc == 0 && end > 0 {
        String::from_utf8_lossy(&b[..end]).into_owned()
    } else {
        "localhost".into()
    }
}

pub fn fleet(a: &Args) -> Result<u8, String> {
    let t0 = Instant::now();
    let l = launch::from_env(&|k| std::env::var(k).ok(), a.rendezvous.as_deref())?;
    let timeout = Duration::from_secs(a.timeout);
    // NCCL reads its log's place once, when loaded: set before any thread starts
    let nccl_log = a.nccl.then(|| nccl::log_to(&std::env::temp_dir()));
    let mut group = match l.size {
        1 => None,
        _ => Some(Group::join(&l.rendezvous.clone()?, l.rank, l.size, &l.job, timeout, timeout)?),
    };
    let name = hostname();
    let (seed, me) = agree(&mut group, a, &name)?;
    let gpu = a.gpu.unwrap_or(l.local_rank as i32);
    let mut cu = Cuda::load();
    let cu = match cu.as_mut() {
        Ok(c) => c
            .open(gpu)
            .map(|_| &*c)
            .map_err(|(call, st)| format!("no CUDA context on GPU {gpu}: {call} -> {st}")),
        Err(e) => Err(e.to_string()),
    };
    let verbs = Verbs::load();
    let cuda = cu.as_ref().ok().copied();
    let (mut task, rig) = setup(a, &l, name, gpu, cu, verbs.as_ref().map_err(|e| e.clone()));
    let mut nccl = nccl_log.clone().map(|log| load_nccl(a, log, cuda, &mut task));
    let rail = gpu.max(0) as usize;
    let (mine, mut rig) = facts_to_send(&mut task, rig, |r| r.fill_src(seed, tag(me, rail)), rail);
    if l.rank == 0 {
        eprintln!("fleet: {} task(s) ({}), gathering each node's facts", l.size, l.launcher);
    }
    let parts = gather(&mut group, &mine)?;
    let tasks: Vec<Task> = parts.iter().map(|p| Task::from_lines(p)).collect::<Result<_, _>>()?;
    let nodes = merge(&tasks);
    if let (Some(Some(n)), Some(cu)) = (nccl.as_mut(), cuda) {
        if let Err(e) = n.fill(cu, seed, tag(me, rail)) {
            eprintln!("fleet: rank {}: NCCL's buffer: {e}", l.rank);
            nccl = Some(None);
        }
    }
    let n = nccl.as_mut().map(|n| n.as_mut().zip(cuda));
    let (legs, round_secs) = round::run(
        &mut group,
        l.rank,
        &nodes,
        &tasks,
        me,
        gpu.max(0) as usize,
        rig.as_mut(),
        seed,
        n,
    )?;
    drop(rig);
    if let (Some(Some(n)), Some(cu)) = (nccl.as_mut(), cuda) {
        n.free(cu);
    }
    drop(nccl);
    if let Some(f) = nccl_log {
        let _ = std::fs::remove_file(f); // ours: NCCL_DEBUG_FILE of this task
    }
    let code = if l.rank == 0 {
        let f = judge(a, &l, nodes, legs, round_secs, t0);
        report(a, &f)?;
        f.exit_code()
    } else {
        0
    };
    let codes = gather(&mut group, &code.to_string())?;
    if let Some(g) = group {
        g.finish()?;
    }
    Ok(codes[0].parse().unwrap_or(2))
}

/// What every task agrees on in the first exchange: the seed every task moves its bytes with,
/// rank 0's (every task must have been started with the same --size and --nccl), and the index of
/// this task's node `node` among the job's nodes, which tags the bytes it sends.
fn agree(group: &mut Option<Group>, a: &Args, node: &str) -> Result<(u64, usize), String> {
    let seed = crate::selftest::rdma::run_seed();
    let cfg = gather(group, &format!("{} {seed:x} {} {node}", a.size, a.nccl as u8))?;
    // size, seed, --nccl, and the node's name (which may hold spaces)
    let cfg: Vec<Vec<&str>> = cfg.iter().map(|c| c.splitn(4, ' ').collect()).collect();
    if cfg.iter().any(|c| c.first() != Some(&a.size.to_string().as_str())) {
        let said: Vec<String> = cfg.iter().map(|c| c[..c.len().min(3)].join(" ")).collect();
        return Err(format!("the tasks were started with different --size: {}", said.join(", ")));
    }
    if cfg.iter().any(|c| c.get(2) != Some(&if a.nccl { "1" } else { "0" })) {
        return Err("the tasks were started with and without --nccl".into());
    }
    let seed = u64::from_str_radix(cfg[0].get(1).unwrap_or(&"0"), 16).unwrap_or(seed);
    let names: Vec<&str> = cfg.iter().map(|c| c.get(3).copied().unwrap_or_default()).collect();
    Ok((seed, node_index(&names, node)))
}

/// The index of node `node` among the nodes of the tasks named `names` (one a rank), in the order
/// their first task came: as `merge` orders them.
pub fn node_index(names: &[&str], node: &str) -> usize {
    let mut nodes: Vec<&str> = Vec::new();
    for n in names {
        if !nodes.contains(n) {
            nodes.push(n);
        }
    }
    nodes.iter().position(|n| *n == node).expect("this task's node is in the list")
}

/// What this task sends rank 0 about itself (its facts, versions and rails), taken once its
/// source buffer is filled with `fill`: a fill that fails is one of those facts, and the rig is
/// gone (this rail moves no bytes); the rig where it was filled.
pub fn facts_to_send<R>(
    task: &mut Task,
    rig: Option<R>,
    fill: impl FnOnce(&R) -> Result<(), String>,
    rail: usize,
) -> (String, Option<R>) {
    let rig = rig.and_then(|r| match fill(&r) {
        Ok(()) => Some(r),
        Err(e) => {
            task.facts.push(Fact::new(
                Kind::Node,
                Some(rail),
                true,
                format!("this rail's GPU buffer could not be filled: {e}"),
                vec![],
                "the NVIDIA driver on this node (nvidia-smi; dmesg for an Xid)".into(),
            ));
            None
        }
    });
    (task.to_lines(), rig)
}

/// NCCL for --nccl, its version among the task's; where it cannot be loaded, a fact.
fn load_nccl(
    a: &Args,
    log: std::path::PathBuf,
    cuda: Option<&Cuda>,
    task: &mut Task,
) -> Option<nccl::Nccl> {
    let n = match cuda {
        Some(cu) => nccl::Nccl::load(log, cu, a.size),
        None => Err("no CUDA context for NCCL's buffers".into()),
    };
    match &n {
        Ok(n) => task.versions.push(("nccl".into(), n.version.clone())),
        Err(e) => task.facts.push(Fact::new(
            Kind::Nccl,
            None,
            false,
            format!("--nccl: {e}"),
            vec![],
            "install NCCL on this node (libnccl2), or name it: GDRSHIM_FLEET_NCCL=/path/libnccl.so.2".into(),
        )),
    }
    n.ok()
}

/// This task's facts, versions and rail, and its buffers on the wire where it has them.
fn setup<'v>(
    a: &Args,
    l: &launch::Launch,
    node: String,
    gpu: i32,
    cu: Result<&'v Cuda, String>,
    v: Result<&'v Verbs, String>,
) -> (Task, Option<Rig<'v>>) {
    let rail_no = gpu.max(0) as usize;
    let mut t = Task { rank: l.rank, node, ..Default::default() };
    let (facts, version) = node::shim_facts();
    t.facts.extend(facts);
    t.versions.push(("gdrshim".into(), version));
    t.versions.push(("driver".into(), node::driver_version()));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    t.facts.extend(node::memlock_fact(&status, node::memlock_soft()));
    let hca = doctor_and_loopback(a, gpu, &mut t);
    t.rails[0].nic =
        format!("{} port {}", hca.clone().unwrap_or_else(|| "the first HCA".into()), a.port);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    t.versions.push(("rdma-core".into(), node::rdma_core_version(&maps)));
    let blocked = |t: &mut Task, kind: Kind, summary: String, fix: &str| {
        t.facts.push(Fact::new(kind, Some(rail_no), true, summary, vec![], fix.into()));
    };
    let (cu, v) = match (cu, v) {
        (Ok(cu), Ok(v)) => (cu, v),
        (Err(e), _) => {
            blocked(
                &mut t,
                Kind::Node,
                e,
                "the NVIDIA driver on this node (nvidia-smi; dmesg for an Xid)",
            );
            return (t, None);
        }
        (_, Err(e)) => {
            blocked(
                &mut t,
                Kind::NicPort,
                e,
                "install rdma-core (libibverbs1, ibverbs-providers) on this node",
            );
            return (t, None);
        }
    };
    let mut rig_args = a.selftest_args(gpu, hca);
    rig_args.size = a.size;
    match Rig::new(&rig_args, cu, v, a.size) {
        Err(unfit) => {
            t.facts.push(Fact { rail: Some(rail_no), ..*unfit });
            (t, None)
        }
        Ok(mut rig) => {
            rail_as_registered(a, &mut rig, &mut t, rail_no);
            (t, Some(rig))
        }
    }
}

/// The doctor's facts over the node's state and the self-test's loopback on this task's rail,
/// which it adds; the HCA of the rail (--hca, else the state's nearest to the GPU).
fn doctor_and_loopback(a: &Args, gpu: i32, t: &mut Task) -> Option<String> {
    let rail_no = gpu.max(0) as usize;
    let mut hca = a.hca.clone();
    let mut st_args = a.selftest_args(gpu, None);
    let rail = |loopback: String| Rail {
        rail: rail_no,
        gpu: format!("GPU {gpu}"),
        nic: String::new(),
        port_gbps: None,
        path: String::new(),
        loopback,
    };
    match node::state(a.state.as_deref(), &t.node) {
        Ok((st, dir, own)) => {
            let topo = node::topology(&st);
            let addr = topo.get(rail_no).map(|(g, _)| g.clone());
            if hca.is_none() {
                hca = topo.get(rail_no).and_then(|(_, n)| n.clone());
            }
            t.facts.extend(node::doctor_facts(&st, &[(rail_no, addr)]));
            st_args.state = Some(dir);
            st_args.hca = hca.clone();
            let (word, fact) = node::loopback(&st_args, rail_no);
            t.rails.push(rail(word));
            t.facts.extend(fact);
            if let Some(root) = own {
                let _ = std::fs::remove_dir_all(root); // ours: recorded by node::state
            }
        }
        Err(e) => {
            eprintln!("fleet: rank {} on {}: no doctor's checks: {e}", t.rank, t.node);
            t.rails.push(rail(COULD_NOT_CHECK.into()));
        }
    }
    hca
}

/// The rail as its GPU buffers were registered: the path gdrshim made (a fallback without it is a
/// fact), the NIC's name and its port's rate.
fn rail_as_registered(a: &Args, rig: &mut Rig, t: &mut Task, rail_no: usize) {
    t.rails[0].path = path(&rig.registered);
    if t.rails[0].path == "none" && crate::selftest::shim::shim_loaded() {
        let ev = rig.registered.1.map(|c| {
            let n = |k| crate::selftest::shim::all_counter(&c, k);
            format!(
                "gdrshim_counters(): registered={} registered_bytes={} pass0_hits={} stood_aside={}",
                n("registered"),
                n("registered_bytes"),
                n("pass0_hits"),
                n("stood_aside")
            )
        });
        t.facts.push(Fact::new(
            Kind::DmaBuf,
            Some(rail_no),
            false,
            "the NIC took this rail's GPU buffers, but not through gdrshim: no GDR registration was made (a fallback)".into(),
            ev.into_iter().collect(),
            "the shim's log says why it delegated (GDRSHIM_LOG_LEVEL=info): a dma-buf the HCA refused, no route".into(),
        ));
    }
    t.rails[0].nic = format!("{} port {}", rig.nic(), a.port);
    if rig.open().is_ok() {
        t.rails[0].port_gbps = rig.port_gbps();
    }
    rig.close();
}

/// How the GPU memory was registered, from gdrshim's counters before and after: bytes of GPU
/// memory in its dma-buf MRs (DMA-BUF), NV503C registrations, or libcuda's own (native).
fn path(c: &(Option<AllCounters>, Option<AllCounters>)) -> String {
    use crate::selftest::shim::all_counter;
    let (Some(b), Some(e)) = c else { return "none".into() };
    let d = |k| all_counter(e, k).saturating_sub(all_counter(b, k));
    if d("stood_aside") > 0 {
        "native".into()
    } else if d("registered_bytes") > 0 {
        "dmabuf".into()
    } else if d("registered") > 0 {
        "nv503c".into()
    } else {
        // the NIC took the memory, but not through gdrshim: not a GDR path it made
        "none".into()
    }
}

/// The nodes in the order their first task came, each with all its tasks' rails and facts.
pub fn merge(tasks: &[Task]) -> Vec<Task> {
    let mut out: Vec<Task> = Vec::new();
    for t in tasks {
        match out.iter_mut().find(|n| n.node == t.node) {
            Some(n) => {
                n.rails.extend(t.rails.iter().cloned());
                for f in &t.facts {
                    if !n.facts.contains(f) {
                        n.facts.push(f.clone());
                    }
                }
            }
            None => out.push(t.clone()),
        }
    }
    out
}

/// Rank 0's verdict: slow legs marked against the ports' rates and the rail's median, the ports
/// that trained below their rail's others, the path each leg's ends registered by, the culprits.
fn judge(
    a: &Args,
    l: &launch::Launch,
    mut nodes: Vec<Task>,
    mut legs: Vec<Leg>,
    round_secs: Vec<f64>,
    t0: Instant,
) -> Fleet {
    let rate = |n: usize, rail: usize| {
        nodes[n].rails.iter().find(|r| r.rail == rail).and_then(|r| r.port_gbps)
    };
    verdict::mark_slow(&mut legs, rate, a.min_bw, a.min_median);
    port_facts(&mut nodes);
    for leg in legs.iter_mut().filter(|l| l.outcome == Outcome::Ok) {
        let p = |n: usize| {
            nodes[n]
                .rails
                .iter()
                .find(|r| r.rail == leg.rail)
                .map_or("?".to_string(), |r| r.path.clone())
        };
        leg.detail = format!("registered by {} → {}", p(leg.src), p(leg.dst));
    }
    let culprits = verdict::culprits(&nodes, &legs);
    let ran = legs.iter().any(|l| l.outcome != Outcome::NotRun);
    let unchecked = match (l.size, ran) {
        (_, true) => None,
        (1, _) => Some(
            "one task: no other node to reach (start one task per node with the launcher)"
                .to_string(),
        ),
        _ => {
            Some("no link could be tried: no node could register GPU memory on its NIC".to_string())
        }
    };
    Fleet {
        nodes,
        legs,
        culprits,
        launcher: l.launcher.into(),
        bytes: a.size,
        round_secs,
        secs: t0.elapsed().as_secs_f64(),
        unchecked,
    }
}

/// A port whose active rate is below its rail's most common one: that NIC or port trained low.
fn port_facts(nodes: &mut [Task]) {
    let mut rates: std::collections::BTreeMap<usize, Vec<u64>> = std::collections::BTreeMap::new();
    for n in nodes.iter() {
        for r in &n.rails {
            if let Some(g) = r.port_gbps {
                rates.entry(r.rail).or_default().push(g as u64);
            }
        }
    }
    for n in nodes.iter_mut() {
        let mut add = Vec::new();
        for r in &n.rails {
            let (Some(g), Some(all)) = (r.port_gbps, rates.get(&r.rail)) else { continue };
            let common =
                *all.iter().max_by_key(|x| all.iter().filter(|y| y == x).count()).unwrap_or(&0);
            if all.len() >= 3 && (g as u64) < common {
                add.push(Fact::new(
                    Kind::NicPort,
                    Some(r.rail),
                    false,
                    format!("{} is active at {g:.0} Gb/s, {common} Gb/s on this rail's other ports", r.nic),
                    vec![format!("ibv_query_port: active_speed × active_width = {g:.0} Gb/s")],
                    "the port trained below its rate: cable, transceiver, switch port (ibstat / ethtool: width and speed)".into(),
                ));
            }
        }
        n.facts.extend(add);
    }
}

fn report(a: &Args, f: &Fleet) -> Result<(), String> {
    if let Some(p) = &a.svg {
        std::fs::write(p, super::svg::svg(f)).map_err(|e| format!("--svg {}: {e}", p.display()))?;
    }
    if a.json {
        println!("{}", f.json());
    } else {
        print!("{}", f.text(!a.no_matrix));
    }
    Ok(())
}
