//! Who this task is in the job, from the launcher's environment alone: rank, size, local rank,
//! and where rank 0 serves the rendezvous. Pure: it reads variables through a lookup function
//! (the process's environment in use, a map in the tests).
//!
//! The launchers, in the order they are believed (a launcher started under another keeps the
//! outer one's variables, so the innermost wins):
//! - torch's env:// (`torchrun`): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//!   MASTER_PORT. Where the agent's own store holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True,
//!   torchrun's static and c10d rendezvous), rank 0 serves on MASTER_PORT + 1.
//! - Open MPI (`mpirun`): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; it names no
//!   address every task knows, so the rendezvous is `--rendezvous` or MASTER_ADDR/MASTER_PORT.
//! - MVAPICH: MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK.
//! - PMI (MPICH's and Intel MPI's `mpiexec`, `srun --mpi=pmi2`): PMI_RANK, PMI_SIZE,
//!   MPI_LOCALRANKID, MPI_LOCALNRANKS.
//! - Slurm (`srun`): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the rendezvous is the step's first
//!   node (where task 0 runs under srun's block and cyclic distributions) at a port derived from
//!   the job and step ids, so every task computes the same one.

/// A port where none is given: torch's default MASTER_PORT.
pub const DEFAULT_PORT: u16 = 29500;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
    /// Where it came from, for the messages.
    pub how: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: Option<usize>,
    /// "torchrun", "env://", "Open MPI", "MVAPICH", "PMI", "Slurm" or "none".
    pub launcher: &'static str,
    /// The rendezvous, or why there is none (only a job of one task needs none).
    pub rendezvous: Result<Rendezvous, String>,
    /// A word every task of one job shares and another job's tasks do not: the rendezvous
    /// refuses a task that brings another.
    pub job: String,
}

type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

fn num(get: Get, var: &str) -> Result<Option<usize>, String> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| format!("{var}={v} is not a number")),
    }
}

/// (launcher, rank var, size var, local rank var, local size var)
const SOURCES: [(&str, &str, &str, &str, &str); 5] = [
    ("env://", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    (
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        "MVAPICH",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
];

/// This task in its job. `flag`: `--rendezvous HOST[:PORT]`, which wins over the environment.
pub fn from_env(get: Get, flag: Option<&str>) -> Result<Launch, String> {
    let mut found = None;
    for (name, r, s, lr, ls) in SOURCES {
        let (Some(rank), Some(size)) = (num(get, r)?, num(get, s)?) else { continue };
        let local_rank = num(get, lr)?.unwrap_or(0);
        // Slurm's per-node count may read "2(x3)": only a plain number is taken
        let local_size = get(ls).and_then(|v| v.trim().parse().ok());
        found = Some((name, rank, size, local_rank, local_size, r, s));
        break;
    }
    let Some((mut launcher, rank, size, local_rank, local_size, rv, sv)) = found else {
        let rdv = match flag {
            Some(f) => parse_flag(f),
            None => Err("no launcher: a job of one task".into()),
        };
        return Ok(Launch {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: Some(1),
            launcher: "none",
            rendezvous: rdv,
            job: String::new(),
        });
    };
    if size == 0 || rank >= size {
        return Err(format!("{rv}={rank} is not below {sv}={size}"));
    }
    if let Some(ls) = local_size.filter(|&ls| local_rank >= ls) {
        return Err(format!("the local rank {local_rank} is not below the local size {ls}"));
    }
    if launcher == "env://" && get("TORCHELASTIC_RUN_ID").is_some() {
        launcher = "torchrun";
    }
    let rendezvous = match flag {
        Some(f) => parse_flag(f),
        None => from_launcher(get, launcher),
    };
    Ok(Launch {
        rank,
        size,
        local_rank,
        local_size,
        launcher,
        rendezvous,
        job: job_word(get, launcher),
    })
}

/// `HOST[:PORT]` (an IPv6 address in brackets: `[::1]:29500`).
pub fn parse_flag(f: &str) -> Result<Rendezvous, String> {
    let bad = || format!("--rendezvous {f}: give HOST or HOST:PORT (rank 0's node)");
    let (host, port) = if let Some(rest) = f.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(bad)?;
        (h, tail.strip_prefix(':'))
    } else {
        match f.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (f, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
        None => DEFAULT_PORT,
    };
    Ok(Rendezvous { host: host.to_string(), port, how: format!("--rendezvous {f}") })
}

fn from_launcher(get: Get, launcher: &str) -> Result<Rendezvous, String> {
    if let (Some(host), Some(p)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        let port: u16 = p.trim().parse().map_err(|_| format!("MASTER_PORT={p} is not a port"))?;
        // torchrun's agent serves its own store on MASTER_PORT: the next port is ours
        if get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            let port = port
                .checked_add(1)
                .ok_or("MASTER_PORT=65535 leaves no port after the agent's store")?;
            return Ok(Rendezvous {
                host,
                port,
                how: format!("MASTER_ADDR, MASTER_PORT+1 = {port} (the agent's store holds {p})"),
            });
        }
        return Ok(Rendezvous { host, port, how: "MASTER_ADDR:MASTER_PORT".into() });
    }
    if launcher == "Slurm" {
        let list = get("SLURM_STEP_NODELIST")
            .or_else(|| get("SLURM_JOB_NODELIST"))
            .or_else(|| get("SLURM_NODELIST"));
        let (Some(list), Some(job)) = (list, get("SLURM_JOB_ID")) else {
            return Err("Slurm names no node list or job id: give --rendezvous HOST[:PORT]".into());
        };
        let host = first_host(&list).ok_or_else(|| format!("cannot read the node list {list}"))?;
        let step: u64 = get("SLURM_STEP_ID").and_then(|s| s.parse().ok()).unwrap_or(0);
        let job: u64 =
            job.trim().parse().map_err(|_| format!("SLURM_JOB_ID={job} is not a number"))?;
        let port = slurm_port(job, step);
        return Ok(Rendezvous {
            host,
            port,
            how: format!("the step's first node, port {port} from job {job} step {step}"),
        });
    }
    Err(format!(
        "{launcher} names no address every task knows: give --rendezvous HOST[:PORT] (rank 0's node), \
         or pass MASTER_ADDR and MASTER_PORT to every task"
    ))
}

/// A port in 20000..32000 that every task of one Slurm step computes alike: below Linux's
/// ephemeral ports (32768 and up by default), so that no outgoing connection on the node holds
/// it by chance (job 1 step 0 was 37884, once taken so while the suite ran).
pub fn slurm_port(job: u64, step: u64) -> u16 {
    let h = job.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ step.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    20000 + ((h >> 33) % 12000) as u16
}

/// The first host of a Slurm host list: `node[01-04,07],gpu5` → `node01`; `a[1-2]b[3,4]` → `a1b3`.
pub fn first_host(list: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let inner: String = chars.by_ref().take_while(|&c| c != ']').collect();
                let first = inner.split(',').next()?.split('-').next()?;
                if first.is_empty() || !first.chars().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                out.push_str(first);
            }
            c => out.push(c),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The job's shared word: what each launcher gives every task of one run alike.
fn job_word(get: Get, launcher: &str) -> String {
    let vars: &[&str] = match launcher {
        "torchrun" => &["TORCHELASTIC_RUN_ID"],
        "Open MPI" => &["OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"],
        "PMI" => &["PMI_JOBID", "PMIX_NAMESPACE"],
        "Slurm" => &["SLURM_JOB_ID", "SLURM_STEP_ID"],
        _ => &[],
    };
    let parts: Vec<String> = vars.iter().filter_map(|v| get(v)).collect();
    format!("{launcher}:{}", parts.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)], flag: Option<&str>) -> Result<Launch, String> {
        let m: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_env(&|k| m.get(k).cloned(), flag)
    }

    /// torchrun's worker environment, as its local elastic agent writes it for each worker.
    fn torchrun(
        rank: usize,
        size: usize,
        local: usize,
        port: &str,
        agent_store: &str,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("LOCAL_RANK", local.to_string()),
            ("RANK", rank.to_string()),
            ("GROUP_RANK", (rank / 2).to_string()),
            ("ROLE_RANK", rank.to_string()),
            ("ROLE_NAME", "default".into()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("WORLD_SIZE", size.to_string()),
            ("GROUP_WORLD_SIZE", (size / 2).to_string()),
            ("ROLE_WORLD_SIZE", size.to_string()),
            ("MASTER_ADDR", "node01".into()),
            ("MASTER_PORT", port.into()),
            ("TORCHELASTIC_RESTART_COUNT", "0".into()),
            ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
            ("TORCHELASTIC_RUN_ID", "fleet42".into()),
            ("TORCHELASTIC_USE_AGENT_STORE", agent_store.into()),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".into()),
        ]
    }

    fn refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        v.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    #[test]
    fn torchrun_gives_rank_size_local_rank_and_the_port_after_its_agents_store() {
        let env = torchrun(3, 4, 1, "29500", "True");
        let l = launch(&refs(&env), None).unwrap();
        assert_eq!(
            (l.rank, l.size, l.local_rank, l.local_size, l.launcher),
            (3, 4, 1, Some(2), "torchrun")
        );
        let r = l.rendezvous.unwrap();
        assert_eq!((r.host.as_str(), r.port), ("node01", 29501), "{}", r.how);
        assert_eq!(l.job, "torchrun:fleet42");
        // without the agent's store (older torch, or a port the agent only picked): MASTER_PORT itself
        let env = torchrun(0, 4, 0, "29400", "False");
        assert_eq!(launch(&refs(&env), None).unwrap().rendezvous.unwrap().port, 29400);
        // the flag wins
        let l = launch(&refs(&env), Some("10.0.0.7:31000")).unwrap();
        assert_eq!(
            l.rendezvous.unwrap(),
            Rendezvous {
                host: "10.0.0.7".into(),
                port: 31000,
                how: "--rendezvous 10.0.0.7:31000".into()
            }
        );
        // plain env:// (a user's own variables, no agent)
        let l = launch(
            &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "5")],
            None,
        )
        .unwrap();
        assert_eq!((l.launcher, l.local_rank, l.local_size), ("env://", 0, None));
        let env = torchrun(0, 4, 0, "65535", "True");
        assert!(launch(&refs(&env), None).unwrap().rendezvous.unwrap_err().contains("65535"));
    }

    #[test]
    fn open_mpi_needs_the_flag_or_master_addr() {
        let base = [
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "12345"),
        ];
        let l = launch(&base, None).unwrap();
        assert_eq!(
            (l.rank, l.size, l.local_rank, l.local_size, l.launcher),
            (5, 8, 1, Some(2), "Open MPI")
        );
        let e = l.rendezvous.unwrap_err();
        assert!(e.contains("--rendezvous HOST[:PORT]") && e.contains("Open MPI"), "{e}");
        assert_eq!(l.job, "Open MPI:12345");
        let l = launch(&base, Some("head")).unwrap();
        assert_eq!(l.rendezvous.unwrap().port, DEFAULT_PORT);
        let mut with = base.to_vec();
        with.extend([("MASTER_ADDR", "head"), ("MASTER_PORT", "4000")]);
        assert_eq!(launch(&with, None).unwrap().rendezvous.unwrap().port, 4000);
    }

    #[test]
    fn the_innermost_launcher_wins_and_mpich_is_pmi() {
        // mpirun inside an sbatch allocation: Slurm's variables are the outer job's
        let l = launch(
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("OMPI_COMM_WORLD_RANK", "3"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
            ],
            None,
        )
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.size), ("Open MPI", 3, 4));
        let l = launch(
            &[
                ("PMI_RANK", "2"),
                ("PMI_SIZE", "3"),
                ("MPI_LOCALRANKID", "0"),
                ("MPI_LOCALNRANKS", "1"),
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
            ],
            None,
        )
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.size, l.local_size), ("PMI", 2, 3, Some(1)));
        let l =
            launch(&[("MV2_COMM_WORLD_RANK", "1"), ("MV2_COMM_WORLD_SIZE", "2")], None).unwrap();
        assert_eq!(l.launcher, "MVAPICH");
    }

    #[test]
    fn slurm_rendezvous_is_the_first_node_and_a_port_from_the_ids() {
        let vars = [
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("SLURM_STEP_NODELIST", "gpu[07-09,12],login1"),
            ("SLURM_JOB_NODELIST", "other[1-9]"),
            ("SLURM_JOB_ID", "4711"),
            ("SLURM_STEP_ID", "3"),
        ];
        let l = launch(&vars, None).unwrap();
        let r = l.rendezvous.unwrap();
        assert_eq!((l.rank, l.size, r.host.as_str()), (6, 8, "gpu07"));
        assert_eq!(r.port, slurm_port(4711, 3));
        assert!((20000..32000).contains(&r.port));
        assert_ne!(slurm_port(4711, 3), slurm_port(4711, 4), "two steps of one job get two ports");
        assert_eq!(l.job, "Slurm:4711.3");
        // a per-node count Slurm writes compressed is no number: left unknown, not misread
        let l = launch(
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3"), ("SLURM_NTASKS_PER_NODE", "2(x3)")],
            None,
        )
        .unwrap();
        assert_eq!(l.local_size, None);
        assert!(l.rendezvous.unwrap_err().contains("--rendezvous"));
    }

    #[test]
    fn host_lists_and_flags() {
        assert_eq!(first_host("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(first_host("a[1-2]b[3,4]").as_deref(), Some("a1b3"));
        assert_eq!(first_host("single").as_deref(), Some("single"));
        assert_eq!(first_host("rack1-n[3-5]-eth").as_deref(), Some("rack1-n3-eth"));
        assert_eq!(first_host("n[x-y]"), None);
        assert_eq!(first_host(""), None);
        assert_eq!(parse_flag("[::1]:7").unwrap().host, "::1");
        assert_eq!(parse_flag("[fe80::2]").unwrap().port, DEFAULT_PORT);
        assert_eq!(
            parse_flag("fe80::2").unwrap().host,
            "fe80::2",
            "a bare IPv6 address has no port"
        );
        for bad in ["", ":5", "h:0", "h:70000", "h:x", "[::1"] {
            assert!(parse_flag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_launcher_is_one_task_and_nonsense_is_refused() {
        let l = launch(&[], None).unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (0, 1, "none"));
        assert!(l.rendezvous.is_err());
        assert!(launch(&[("RANK", "4"), ("WORLD_SIZE", "4")], None)
            .unwrap_err()
            .contains("RANK=4 is not below WORLD_SIZE=4"));
        assert!(launch(&[("RANK", "x"), ("WORLD_SIZE", "4")], None)
            .unwrap_err()
            .contains("RANK=x"));
        assert!(launch(
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")],
            None
        )
        .is_err());
        // a rank without a size is not a launcher
        assert_eq!(launch(&[("RANK", "3")], None).unwrap().launcher, "none");
    }
}
