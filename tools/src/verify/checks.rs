//! The acceptance checks of `verify-run` over the logs it was given (the module's note says what counts as proof).

use crate::report::{Check, Report, Status};

use super::exit::exit_check;

#[derive(Default, Debug, Clone)]
pub struct Inputs {
    pub nccl_log: String,
    pub shim_logs: Vec<String>,
    pub perftest_log: Option<String>,
    pub kernel_log: Option<String>,
    pub expect_gdr: bool,
    pub expect_p2p: bool,
    /// Compute capability ×10 (89 for an RTX 4090) when the log cannot tell.
    pub gpu_sm: Option<u32>,
    pub exit_code: Option<i32>,
}

/// The input is not a NCCL Tests log at all (exit 2), as opposed to a failing one (exit 1).
pub fn usable(nccl_log: &str) -> Result<(), String> {
    if nccl_log.trim().is_empty() {
        return Err("the NCCL log is empty".into());
    }
    if !nccl_log.lines().any(|l| {
        l.starts_with("# nccl-tests version")
            || l.starts_with("# Collective test starting")
            || l.contains("#wrong")
    }) {
        return Err("not a NCCL Tests log: no '# nccl-tests version', '# Collective test starting' or '#wrong' header line".into());
    }
    Ok(())
}

/// sm (×10) of a GPU by its marketing name, for the names our users run.
pub fn sm_of_gpu_name(name: &str) -> Option<u32> {
    let n = name.to_ascii_uppercase();
    let table: &[(&str, u32)] = &[
        ("RTX 50", 120),
        ("RTX PRO 6000 BLACKWELL", 120),
        ("B200", 100),
        ("B100", 100),
        ("GB200", 100),
        ("H100", 90),
        ("H200", 90),
        ("H800", 90),
        ("H20", 90),
        ("GH200", 90),
        ("RTX 40", 89),
        ("L40", 89),
        ("L4", 89),
        ("RTX 6000 ADA", 89),
        ("RTX 5000 ADA", 89),
        ("RTX 4000 ADA", 89),
        ("RTX 30", 86),
        ("A40", 86),
        ("A10", 86),
        ("RTX A6000", 86),
        ("A100", 80),
        ("A30", 80),
        ("A800", 80),
        ("RTX 20", 75),
        ("TITAN RTX", 75),
        ("T4", 75),
        ("V100", 70),
    ];
    // the longest matching name wins ("A100" before "A10")
    table.iter().filter(|(k, _)| n.contains(k)).max_by_key(|(k, _)| k.len()).map(|&(_, v)| v)
}

struct Row<'a> {
    line: &'a str,
    wrong: [Option<&'a str>; 2],
}

fn data_rows(log: &str) -> Vec<Row<'_>> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in log.lines() {
        if line.starts_with('#') && line.contains("#wrong") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 13 && t[0].parse::<u64>().is_ok() && t[1].parse::<u64>().is_ok() {
            out.push(Row { line, wrong: [Some(t[8]), Some(t[12])] });
        }
    }
    out
}

fn first(log: &str, pred: impl Fn(&str) -> bool) -> Option<&str> {
    log.lines().find(|l| pred(l))
}

/// `key=value` pairs of every `gdrshim: summary` line.
pub fn shim_summaries(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    text.lines()
        .filter_map(|l| {
            let at = l.find("gdrshim: summary ")?;
            let kv = l[at + "gdrshim: summary ".len()..]
                .split_whitespace()
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Some((l.to_string(), kv))
        })
        .collect()
}

/// The part of a summary line from `gdrshim: summary` on (a log prefix before it may differ).
fn summary_text(line: &str) -> &str {
    line.find("gdrshim: summary ").map_or(line, |at| &line[at..]).trim_end()
}

fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

/// Lines that fail a run wherever they appear, with why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("NCCL WARN", "NCCL warned"),
    (
        "illegal memory access",
        "a GPU kernel touched memory it must not (the signature of an MR on the wrong memory)",
    ),
    ("EFAULT", "a registration was refused with EFAULT"),
    (
        "Bad address",
        "a registration was refused with EFAULT (Bad address): GPU memory the NIC cannot pin",
    ),
    ("NV_ERR_STATE_IN_USE", "the driver refused a registration: state in use"),
    ("Call to ibv_reg", "a verbs registration failed"),
    ("[gdrshim] ERROR", "gdrshim reported an error"),
];

/// NCCL's network connections in its log (`Channel … via NET/…` lines): those via GDRDMA, and the
/// others. `GDR 1` proves nothing: NCCL prints it also when no network connection exists.
pub fn net_connections(log: &str) -> (Vec<&str>, Vec<&str>) {
    log.lines().filter(|l| l.contains(" via NET/")).partition(|l| l.contains("/GDRDMA"))
}

pub fn verify(inp: &Inputs) -> Report {
    let mut r = Report::default();
    let log = inp.nccl_log.as_str();
    run_finished(log, inp.exit_code, &mut r);
    every_size(log, &mut r);
    if inp.expect_gdr {
        gdr_connections(log, &mut r);
    }
    receive_flush(log, inp.gpu_sm, &mut r);
    if inp.expect_p2p {
        p2p_connections(log, &mut r);
    }
    shim_account(log, inp, &mut r);
    forbidden_lines(log, inp, &mut r);
    if let Some(k) = &inp.kernel_log {
        kernel_xid(k, &mut r);
    }
    if let Some(p) = &inp.perftest_log {
        perftest(p, &mut r);
    }
    r
}

/// The run finished: NCCL Tests' closing summary and its exit status.
fn run_finished(log: &str, exit_code: Option<i32>, r: &mut Report) {
    match first(log, |l| l.starts_with("# Collective test concluded")) {
        Some(l) => r.push(
            Check::new("nccl.finished", Status::Pass, "NCCL Tests printed its closing summary")
                .evidence(l),
        ),
        None => r.push(
            Check::new(
                "nccl.finished",
                Status::Fail,
                "the log ends before NCCL Tests' closing summary: the run was cut short or crashed",
            )
            .evidence(log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(empty)"))
            .fix("look at the end of the log and the job's exit status; rerun to completion"),
        ),
    }
    match exit_code {
        Some(0) => r.push(Check::new("nccl.exit", Status::Pass, "exit status 0")),
        Some(7) => r.push(Check::new(
            "nccl.exit",
            Status::Fail,
            "exit status 7: NCCL Tests found wrong data (or bandwidth under NCCL_TESTS_MIN_BW)",
        )),
        Some(c) => r.push(exit_check(c)),
        None => r.push(Check::new(
            "nccl.exit",
            Status::Info,
            "exit status not given (--exit-code): not judged",
        )),
    }
}

/// Every size, in place and out of place: `#wrong` 0, no rank's wrong elements, no out-of-bounds
/// values.
fn every_size(log: &str, r: &mut Report) {
    let rows = data_rows(log);
    if rows.is_empty() {
        r.push(
            Check::new(
                "nccl.wrong",
                Status::Fail,
                "no data rows under the '#wrong' header: nothing was measured",
            )
            .fix("the run failed before its first size; see the log"),
        );
    } else if let Some(row) = rows
        .iter()
        .find(|x| x.wrong.iter().any(|w| w.is_some_and(|w| w.eq_ignore_ascii_case("N/A"))))
    {
        r.push(
            Check::new("nccl.wrong", Status::Fail, "data check was off (-c 0): #wrong is N/A, the run proves nothing about correctness")
                .evidence(row.line)
                .fix("rerun without -c 0 (checking is NCCL Tests' default)"),
        );
    } else {
        let bad: Vec<&Row> =
            rows.iter().filter(|x| x.wrong.iter().any(|w| w.is_none_or(|w| w != "0"))).collect();
        match bad.first() {
            None => r.push(Check::new("nccl.wrong", Status::Pass, format!("{} sizes, #wrong 0 out of place and in place", rows.len())).evidence(rows.last().unwrap().line)),
            Some(b) => r.push(
                Check::new("nccl.wrong", Status::Fail, format!("{} of {} sizes have wrong elements: data corruption", bad.len(), rows.len()))
                    .evidence(b.line)
                    .fix("never use this setup for training; run with GDRSHIM_LOG_LEVEL=info and check the shim's pass0 lines and the flush settings"),
            ),
        }
    }
    if let Some(l) = first(log, |l| l.trim_start().starts_with("rank=") && l.contains("#wrong=")) {
        r.push(
            Check::new("nccl.rank_wrong", Status::Fail, "a rank reported wrong elements")
                .evidence(l),
        );
    }
    match first(log, |l| l.starts_with("# Out of bounds values")) {
        Some(l)
            if l.split(':')
                .nth(1)
                .is_some_and(|v| v.split_whitespace().collect::<Vec<_>>() == ["0", "OK"]) =>
        {
            r.push(
                Check::new("nccl.out_of_bounds", Status::Pass, "no out-of-bounds values")
                    .evidence(l),
            )
        }
        Some(l) => r.push(
            Check::new("nccl.out_of_bounds", Status::Fail, "out-of-bounds values reported")
                .evidence(l),
        ),
        None => r.push(Check::new(
            "nccl.out_of_bounds",
            Status::Fail,
            "no 'Out of bounds values' line (truncated log?)",
        )),
    }
}

/// GDR's proof: every network connection via GDRDMA.
fn gdr_connections(log: &str, r: &mut Report) {
    let (gdr, without) = net_connections(log);
    let net: Vec<&str> = gdr.iter().chain(&without).copied().collect();
    let without = without.first();
    if gdr.is_empty() {
        let mut c = Check::new(
            "nccl.gdr",
            Status::Fail,
            if net.is_empty() {
                "no network connection at all: this run cannot show GDR (one node? NCCL_IB_DISABLE?)"
            } else {
                "network connections without GDRDMA"
            },
        );
        // the line that decided it: a connection without GDRDMA; only when there is none, the
        // misleading 'GDR 1'
        if let Some(l) = net.first() {
            c = c.evidence(*l).fix(
                "check the patched NCCL's 'GPU Direct RDMA enabled … through gdrshim' line, GDRSHIM_MODE=register and NCCL_NET_GDR_LEVEL",
            );
        } else if let Some(l) = first(log, |l| l.contains("GDR 1")) {
            c = c
                .evidence(l)
                .fix("'GDR 1' is printed even when no network connection exists; the proof is 'Channel … via NET/IB/…/GDRDMA'");
        }
        r.push(c);
    } else if let Some(l) = without {
        r.push(
            Check::new(
                "nccl.gdr",
                Status::Fail,
                format!(
                    "{} connections use GDRDMA but {} do not",
                    gdr.len(),
                    net.len() - gdr.len()
                ),
            )
            .evidence(*l)
            .fix("raise NCCL_NET_GDR_LEVEL (PHB or SYS) for GPUs and NICs on different root ports"),
        );
    } else {
        r.push(
            Check::new(
                "nccl.gdr",
                Status::Pass,
                format!("{} network connections, all via GDRDMA", gdr.len()),
            )
            .evidence(gdr[0]),
        );
    }
}

/// The receive-side flush: GPUs before sm_90 need it.
fn receive_flush(log: &str, gpu_sm: Option<u32>, r: &mut Report) {
    let sm = gpu_sm.or_else(|| {
        log.lines()
            .filter(|l| l.starts_with("#  Rank"))
            .filter_map(|l| l.split(']').nth(1))
            .filter_map(|n| sm_of_gpu_name(n.trim()))
            .min()
    });
    let flush_off = first(log, |l| {
        l.contains("NCCL_GDR_FLUSH_DISABLE set by environment to")
            && l.rsplit(' ').next().is_some_and(|v| v.trim_end_matches('.').trim() != "0")
    })
    .or_else(|| first(log, |l| l.contains("[receive] via NET/") && l.contains("/flush=None")));
    match (flush_off, sm) {
        (None, _) => r.push(Check::new("nccl.flush", Status::Pass, "the GDR receive-side flush was not disabled")),
        (Some(l), Some(s)) if s >= 90 => {
            r.push(Check::new("nccl.flush", Status::Pass, format!("flush disabled, but sm_{s} needs none")).evidence(l))
        }
        (Some(l), s) => r.push(
            Check::new(
                "nccl.flush",
                Status::Fail,
                match s {
                    Some(s) => format!("the GDR receive-side flush is disabled on sm_{s}: received data can be stale"),
                    None => "the GDR receive-side flush is disabled and the GPU's sm is unknown (pass --gpu-sm)".to_string(),
                },
            )
            .evidence(l)
            .fix("unset NCCL_GDR_FLUSH_DISABLE"),
        ),
    }
}

/// P2P's proof (one node, several GPUs): NCCL's P2P flags and a direct path.
fn p2p_connections(log: &str, r: &mut Report) {
    let flag = |name: &str| -> Option<(String, bool)> {
        let l = first(log, |l| l.contains(&format!("{name} ")))?;
        let v = l.split(&format!("{name} ")).nth(1)?.split_whitespace().next()?;
        Some((l.to_string(), v == "1"))
    };
    for name in ["isAllCudaP2p", "isAllDirectP2p"] {
        match flag(name) {
            Some((l, true)) => r.push(Check::new(&format!("p2p.{name}"), Status::Pass, format!("{name} 1")).evidence(l)),
            Some((l, false)) => r.push(
                Check::new(&format!("p2p.{name}"), Status::Fail, format!("{name} is not 1: not every GPU pair reaches the other directly"))
                    .evidence(l)
                    .fix("check `nvidia-smi topo -p2p r` (doctor's p2p.matrix) and that the P2P-patched module is loaded"),
            ),
            None => r.push(Check::new(
                &format!("p2p.{name}"),
                Status::Fail,
                format!("no '{name}' in the log (NCCL_DEBUG=INFO with INIT; NCCL < 2.30 does not print isAllCudaP2p)"),
            )),
        }
    }
    let direct = first(log, |l| l.contains("via P2P/direct pointer"));
    let shm = first(log, |l| l.contains("via SHM/"));
    match (direct, shm) {
        (Some(d), None) => r.push(Check::new("p2p.path", Status::Pass, "connections via P2P/direct pointer").evidence(d)),
        (_, Some(s)) => r.push(
            Check::new("p2p.path", Status::Fail, "a connection went via shared host memory (SHM), not P2P")
                .evidence(s)
                .fix("set NCCL_P2P_LEVEL=SYS (GPUs under different host bridges) and check the P2P matrix"),
        ),
        (None, None) => {
            r.push(Check::new("p2p.path", Status::Fail, "no 'via P2P/direct pointer' connection line (NCCL_DEBUG_SUBSYS=INIT,P2P?)"))
        }
    }
}

/// The shim's own account: its summary lines, and that it registered in register mode.
fn shim_account(log: &str, inp: &Inputs, r: &mut Report) {
    let mut summaries = shim_summaries(log);
    for s in &inp.shim_logs {
        summaries.extend(shim_summaries(s));
    }
    // a summary carries host= and pid=: the same line in two logs (stderr in the NCCL log and
    // GDRSHIM_LOG_FILE) is one process, counted once
    let seen_lines = summaries.len();
    let mut seen = std::collections::HashSet::new();
    summaries.retain(|(l, _)| seen.insert(summary_text(l).to_string()));
    let repeated = seen_lines - summaries.len();
    if summaries.is_empty() {
        let st =
            if !inp.shim_logs.is_empty() || inp.expect_gdr { Status::Fail } else { Status::Info };
        r.push(Check::new("shim.summary", st, "no 'gdrshim: summary' line in the logs given").fix(
            "keep GDRSHIM_SUMMARY=1 and pass the shim's log (GDRSHIM_LOG_FILE) with --shim-log; a process killed by a signal prints none",
        ));
    } else {
        let bad = summaries.iter().find(|(_, kv)| {
            ["pass0_misses", "rm_errors", "mismatched"]
                .iter()
                .any(|k| get(kv, k).is_some_and(|v| v != "0"))
        });
        match bad {
            Some((l, kv)) => {
                let what: Vec<String> = ["pass0_misses", "rm_errors", "mismatched"]
                    .iter()
                    .filter_map(|k| get(kv, k).filter(|v| *v != "0").map(|v| format!("{k}={v}")))
                    .collect();
                r.push(
                    Check::new("shim.summary", Status::Fail, format!("gdrshim reports {}", what.join(" ")))
                        .evidence(l)
                        .fix("each miss and RM refusal is logged with its reason (GDRSHIM_LOG_LEVEL=info)"),
                );
            }
            None => r.push(
                Check::new(
                    "shim.summary",
                    Status::Pass,
                    format!(
                        "{} gdrshim summaries: pass0_misses=0 rm_errors=0 mismatched=0{}",
                        summaries.len(),
                        if repeated > 0 {
                            format!(" ({repeated} repeated line(s) counted once)")
                        } else {
                            String::new()
                        }
                    ),
                )
                .evidence(&summaries[0].0),
            ),
        }
        if inp.expect_gdr {
            let registering = summaries.iter().any(|(_, kv)| get(kv, "mode") == Some("register"));
            let hits: u64 = summaries
                .iter()
                .filter_map(|(_, kv)| get(kv, "pass0_hits")?.parse::<u64>().ok())
                .sum();
            let native: u64 = summaries
                .iter()
                .filter_map(|(_, kv)| get(kv, "stood_aside")?.parse::<u64>().ok())
                .sum();
            if !registering {
                r.push(
                    Check::new(
                        "shim.registering",
                        Status::Fail,
                        "no gdrshim process ran in register mode",
                    )
                    .fix("GDRSHIM_MODE=register (scripts/gdr-env.sh --mode gdr sets it)"),
                );
            } else if hits == 0 && native == 0 {
                r.push(Check::new(
                    "shim.registering",
                    Status::Fail,
                    "gdrshim registered nothing: no verbs registration of GPU memory reached it",
                ));
            } else {
                r.push(Check::new(
                    "shim.registering",
                    Status::Pass,
                    format!("register mode; {hits} exact (pass0) hits, {native} left to native registration"),
                ));
            }
        }
    }
}

/// Lines that fail a run wherever they are, in any log given.
fn forbidden_lines(log: &str, inp: &Inputs, r: &mut Report) {
    let mut texts: Vec<(&str, &str)> = vec![("NCCL log", log)];
    texts.extend(inp.shim_logs.iter().map(|s| ("shim log", s.as_str())));
    if let Some(p) = &inp.perftest_log {
        texts.push(("perftest log", p));
    }
    let mut clean = true;
    for (needle, why) in FORBIDDEN {
        for (name, t) in &texts {
            let hits: Vec<&str> = t.lines().filter(|l| l.contains(needle)).collect();
            if let Some(l) = hits.first() {
                clean = false;
                r.push(
                    Check::new(
                        &format!(
                            "forbidden.{}",
                            needle
                                .trim_start_matches('[')
                                .replace([' ', ']'], "_")
                                .to_ascii_lowercase()
                        ),
                        Status::Fail,
                        format!("{why}: {} line(s) in the {name}", hits.len()),
                    )
                    .evidence(*l),
                );
            }
        }
    }
    if clean {
        r.push(Check::new(
            "forbidden",
            Status::Pass,
            "none of NCCL WARN, illegal memory access, EFAULT, NV_ERR_STATE_IN_USE, failed ibv_reg calls",
        ));
    }
}

/// No Xid (nor a GPU fallen off the bus) in the kernel log, which must have entries.
fn kernel_xid(k: &str, r: &mut Report) {
    let xid: Vec<&str> =
        k.lines().filter(|l| l.contains("Xid") || l.contains("fallen off the bus")).collect();
    // journalctl's own lines ("-- No entries --", "-- Logs begin at …") are no kernel messages
    let entries = k.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("-- ")).count();
    match xid.first() {
        None if entries == 0 => {
            let why = "the kernel log given has no entries (journalctl printed none: another boot, no permission to read it?)";
            let mut c = Check::new("kernel.xid", Status::CouldNotCheck, why)
                .fix("give the kernel log of the boot the run was in: journalctl -k -b, as root or in group systemd-journal");
            if let Some(l) = k.lines().find(|l| !l.trim().is_empty()) {
                c = c.evidence(l);
            }
            r.push(c);
        }
        Some(l) => r.push(
            Check::new(
                "kernel.xid",
                Status::Fail,
                format!("{} Xid/GPU error line(s) in the kernel log", xid.len()),
            )
            .evidence(*l)
            .fix("an Xid during the run voids it; look up the Xid number in NVIDIA's Xid table"),
        ),
        None => r.push(Check::new(
            "kernel.xid",
            Status::Pass,
            format!("no Xid in {} kernel log lines", k.lines().count()),
        )),
    }
}

/// perftest completed its measurement without an error.
fn perftest(p: &str, r: &mut Report) {
    let header = p.lines().position(|l| l.contains("#bytes") && l.contains("BW"));
    let row = header.and_then(|h| {
        p.lines()
            .skip(h + 1)
            .find(|l| l.split_whitespace().next().is_some_and(|t| t.parse::<u64>().is_ok()))
    });
    let err = first(p, |l| {
        let l = l.to_ascii_lowercase();
        l.contains("couldn't")
            || l.contains("failed")
            || l.contains("error")
            || l.contains("timeout")
            || l.contains("retry exceeded")
    });
    match (row, err) {
        (_, Some(e)) => {
            r.push(Check::new("perftest", Status::Fail, "perftest reported an error").evidence(e))
        }
        (Some(row), None) => r.push(
            Check::new("perftest", Status::Pass, "perftest completed its measurement")
                .evidence(row),
        ),
        (None, None) => r.push(Check::new(
            "perftest",
            Status::Fail,
            "no perftest result row (#bytes … BW): the test did not complete",
        )),
    }
}
