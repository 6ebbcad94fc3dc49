//! `gdrshim-tool fleet` as N processes on this machine, started the way each launcher starts
//! its tasks (the environment torchrun's agent writes for each worker, Open MPI's), with no GPU
//! stack: the launcher's environment, the rendezvous, the facts each task gathers, the rounds
//! and rank 0's report, end to end. Every node lacks gdrshim and libcuda here, so each is named
//! for both and no link can run. The links themselves need the lab's wire across processes
//! (issue 37): those tests come with it.

mod common;

use common::listen_ports;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn state() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/state/rig-4090-ok")
        .display()
        .to_string()
}

/// One task: `env` its launcher's variables, `node` its node's name.
fn task(env: &[(String, String)], node: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .arg("fleet")
        .args(["--size", "65536", "--state", &state()])
        .args(if args.contains(&"--timeout") { &[][..] } else { &["--timeout", "15"][..] })
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GDRSHIM_FLEET_NODE", node)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn torchrun_env(rank: usize, size: usize, port: u16) -> Vec<(String, String)> {
    let v = [
        ("LOCAL_RANK", "0".to_string()),
        ("RANK", rank.to_string()),
        ("GROUP_RANK", rank.to_string()),
        ("ROLE_RANK", rank.to_string()),
        ("ROLE_NAME", "default".into()),
        ("LOCAL_WORLD_SIZE", "1".into()),
        ("WORLD_SIZE", size.to_string()),
        ("GROUP_WORLD_SIZE", size.to_string()),
        ("ROLE_WORLD_SIZE", size.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", "0".into()),
        ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
        ("TORCHELASTIC_RUN_ID", format!("fleet-test-{port}")),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".into()),
    ];
    v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn ompi_env(rank: usize, size: usize) -> Vec<(String, String)> {
    [
        ("OMPI_COMM_WORLD_RANK", rank.to_string()),
        ("OMPI_COMM_WORLD_SIZE", size.to_string()),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0".into()),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1".into()),
        ("OMPI_MCA_ess_base_jobid", "4242".into()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect()
}

/// Every task's (exit code, stdout, stderr), in rank order.
fn wait(children: Vec<Child>) -> Vec<(i32, String, String)> {
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into(),
                String::from_utf8_lossy(&o.stderr).into(),
            )
        })
        .collect()
}

fn check_fleet(out: &[(i32, String, String)], n: usize, launcher: &str) {
    // one verdict for the job: every task exits with rank 0's code
    for (r, (code, so, se)) in out.iter().enumerate() {
        assert_eq!(*code, 1, "rank {r}: {so}{se}");
        if r > 0 {
            assert!(so.is_empty(), "only rank 0 reports: rank {r} said {so}");
        }
    }
    let text = &out[0].1;
    let rounds = if n.is_multiple_of(2) { n - 1 } else { n };
    let head = format!("fleet: {n} node(s) × 1 rail(s), {rounds} round(s), 64 KiB per transfer, launcher {launcher}");
    assert!(text.starts_with(&head), "{text}");
    for k in 0..n {
        assert!(
            text.contains(&format!(
                "FAIL gdrshim      host{k}: gdrshim is not loaded in this task"
            )),
            "host{k}: {text}"
        );
        assert!(
            text.contains(&format!(
                "FAIL node         host{k} rail 0: libcuda.so.1 cannot be loaded"
            )),
            "host{k}: {text}"
        );
    }
    let pairs = n * (n - 1) / 2;
    assert!(
        text.ends_with(&format!(
            "RESULT: FAIL ({} culprit(s): gdrshim, node; 0 of {pairs} links pass)\n",
            2 * n
        )),
        "{text}"
    );
    // the progress line, once per round
    assert_eq!(out[0].2.matches("fleet: round ").count(), rounds, "{}", out[0].2);
}

#[test]
fn torchrun_tasks_meet_after_the_agents_store_and_report_once() {
    for n in [2, 4, 8] {
        // torchrun's agent holds MASTER_PORT with its own store: the fleet serves on the next
        let port = listen_ports(2);
        let agent = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let t0 = Instant::now();
        let kids =
            (0..n).map(|r| task(&torchrun_env(r, n, port), &format!("host{r}"), &[])).collect();
        let out = wait(kids);
        drop(agent);
        check_fleet(&out, n, "torchrun");
        eprintln!("torchrun, {n} tasks: {:.2} s", t0.elapsed().as_secs_f64());
    }
}

#[test]
fn open_mpi_tasks_meet_at_the_flag_and_json_says_the_same() {
    for n in [2, 4, 8] {
        let rdv = format!("127.0.0.1:{}", listen_ports(1));
        let t0 = Instant::now();
        let kids = (0..n)
            .map(|r| task(&ompi_env(r, n), &format!("host{r}"), &["--rendezvous", &rdv, "--json"]))
            .collect();
        let out = wait(kids);
        let j = &out[0].1;
        for want in [
            "{\"tool\":\"fleet\",".to_string(),
            "\"result\":\"FAIL\",\"exit\":1,\"launcher\":\"Open MPI\"".to_string(),
            format!("\"rounds\":{}", if n.is_multiple_of(2) { n - 1 } else { n }),
            "\"nodes\":[{\"name\":\"host0\",".to_string(),
            "\"id\":\"culprit.gdrshim\",\"status\":\"FAIL\"".to_string(),
        ] {
            assert!(j.contains(&want), "{want} in {j}");
        }
        assert_eq!(j.matches("\"name\":\"host").count(), n, "{j}");
        assert!(out.iter().all(|(c, _, _)| *c == 1), "{out:?}");
        eprintln!("mpirun, {n} tasks: {:.2} s", t0.elapsed().as_secs_f64());
    }
}

#[test]
fn a_task_that_never_comes_ends_the_run_in_bounded_time() {
    let rdv = format!("127.0.0.1:{}", listen_ports(1));
    let t0 = Instant::now();
    // three tasks announced, two started
    let kids = (0..2)
        .map(|r| {
            task(&ompi_env(r, 3), &format!("host{r}"), &["--rendezvous", &rdv, "--timeout", "2"])
        })
        .collect();
    let out = wait(kids);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    for (r, (code, _, se)) in out.iter().enumerate() {
        assert_eq!(*code, 2, "rank {r}: {se}");
        assert!(se.contains("rank(s) 2 did not come within 2 s"), "rank {r}: {se}");
    }
    // mpirun names no rendezvous: without the flag, a usage answer, not a hang
    let out = wait(vec![task(&ompi_env(1, 2), "host1", &[])]);
    assert_eq!(out[0].0, 2);
    assert!(
        out[0]
            .2
            .contains("Open MPI names no address every task knows: give --rendezvous HOST[:PORT]"),
        "{}",
        out[0].2
    );
}
