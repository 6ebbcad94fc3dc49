//! What a user reads: the summary (culprits first, each with its evidence and fix), an N×N
//! matrix per rail and operation, the closing RESULT line; and the same in the tools' one JSON
//! object (the tools' one report, [`Fleet::checks`]: each culprit a FAIL check, then the fleet's own
//! keys).

use super::model::{Culprit, Leg, Op, Outcome, Task};
use crate::report::{json_str, result_word, Check, Report, Status};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Everything the run found, on rank 0.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    pub nodes: Vec<Task>,
    pub legs: Vec<Leg>,
    pub culprits: Vec<Culprit>,
    pub launcher: String,
    pub bytes: usize,
    pub round_secs: Vec<f64>,
    pub secs: f64,
    /// Why nothing could be judged (no leg ran and nothing failed), if so.
    pub unchecked: Option<String>,
}

impl Fleet {
    pub fn rails(&self) -> Vec<usize> {
        let r: BTreeSet<usize> =
            self.legs.iter().filter(|l| l.op != Op::Nccl).map(|l| l.rail).collect();
        r.into_iter().collect()
    }
    /// The fleet's checks in the tools' one report: each culprit a FAIL, then what was checked;
    /// what could not be checked only where nothing failed.
    pub fn checks(&self) -> Report {
        let mut checks: Vec<Check> = self.culprits.iter().map(|c| c.check.clone()).collect();
        checks.extend(self.passes());
        Report {
            checks,
            unchecked: if self.culprits.is_empty() { self.unchecked.clone() } else { None },
        }
    }
    pub fn exit_code(&self) -> u8 {
        self.checks().exit_code()
    }
    fn pairs(&self, op: Option<Op>) -> (usize, usize) {
        let mut all: BTreeSet<(usize, usize, usize)> = BTreeSet::new();
        let mut bad = BTreeSet::new();
        for l in self
            .legs
            .iter()
            .filter(|l| op.is_none_or(|o| o == l.op) && (op.is_some() || l.op != Op::Nccl))
        {
            let k = (l.rail, l.src.min(l.dst), l.src.max(l.dst));
            all.insert(k);
            if l.outcome != Outcome::Ok {
                bad.insert(k);
            }
        }
        (all.len(), all.len() - bad.len())
    }
    /// What was checked: PASS where all of it held, else INFO with the count (the culprits say why).
    fn passes(&self) -> Vec<Check> {
        let mut v = Vec::new();
        let status = |all: bool| if all { Status::Pass } else { Status::Info };
        let n = self.nodes.len();
        let rails: usize = self.nodes.iter().map(|t| t.rails.len()).sum();
        let fine = self.nodes.iter().filter(|t| t.facts.is_empty()).count();
        let what = format!(
            "{fine} of {n} nodes without a finding ({rails} GPU↔NIC rails, loopback self-tested)"
        );
        v.push(Check::new("nodes", status(fine == n), what));
        let (all, ok) = self.pairs(None);
        if all > 0 {
            let what = format!(
                "{ok} of {all} links pass both ways, RDMA WRITE and READ GPU→GPU, {} per transfer, every byte checked",
                crate::size::human(self.bytes as u64)
            );
            v.push(Check::new("links", status(ok == all), what));
        }
        let (all, ok) = self.pairs(Some(Op::Nccl));
        if all > 0 {
            let what = format!("{ok} of {all} pairs: every inter-node channel of NCCL's send/recv via NET/…/GDRDMA");
            v.push(Check::new("nccl", status(ok == all), what));
        }
        v
    }

    pub fn text(&self, matrices: bool) -> String {
        let mut s = String::new();
        let rails = self.rails();
        let _ = writeln!(
            s,
            "fleet: {} node(s) × {} rail(s), {} round(s), {} per transfer, launcher {}, {:.1} s",
            self.nodes.len(),
            rails.len().max(1),
            self.round_secs.len(),
            crate::size::human(self.bytes as u64),
            self.launcher,
            self.secs
        );
        for c in &self.culprits {
            s.push_str(&culprit_lines(c));
        }
        for c in self.passes() {
            let _ = writeln!(s, "{} {:<12} {}", c.status.word(), c.id, c.summary);
        }
        if matrices {
            for &r in &rails {
                for op in [Op::Write, Op::Read] {
                    s.push_str(&self.matrix(r, op));
                }
            }
        }
        if let (Some(why), 0) = (&self.unchecked, self.culprits.len()) {
            let _ = writeln!(s, "could not check here: {why}");
        }
        let kinds: BTreeSet<&str> = self.culprits.iter().map(|c| c.kind.word()).collect();
        let (all, ok) = self.pairs(None);
        let _ = writeln!(
            s,
            "RESULT: {} ({} culprit(s){}{}; {ok} of {all} links pass)",
            result_word(self.exit_code()),
            self.culprits.len(),
            if kinds.is_empty() { "" } else { ": " },
            kinds.into_iter().collect::<Vec<_>>().join(", ")
        );
        s
    }

    /// One N×N table: row = where the bytes come from, column = where they land.
    pub fn matrix(&self, rail: usize, op: Op) -> String {
        let n = self.nodes.len();
        let w = 7;
        let mut s = format!(
            "rail {rail} {} Gb/s (row: from, column: to; x error, ! corrupt, ~ slow, - not run; {}):\n",
            op.word(),
            if n > 0 { "columns numbered as the rows" } else { "no node" }
        );
        let name_w = self.nodes.iter().map(|t| t.node.len()).max().unwrap_or(4).min(24) + 4;
        let _ = write!(s, "{:name_w$}", "");
        for j in 0..n {
            let _ = write!(s, "{j:>w$}");
        }
        s.push('\n');
        for (i, t) in self.nodes.iter().enumerate() {
            let label: String = format!("{i:>2} {}", t.node).chars().take(name_w).collect();
            let _ = write!(s, "{label:name_w$}");
            for j in 0..n {
                let _ = write!(s, "{:>w$}", self.cell(rail, op, i, j));
            }
            s.push('\n');
        }
        s
    }

    pub fn leg(&self, rail: usize, op: Op, src: usize, dst: usize) -> Option<&Leg> {
        self.legs.iter().find(|l| l.rail == rail && l.op == op && l.src == src && l.dst == dst)
    }

    fn cell(&self, rail: usize, op: Op, i: usize, j: usize) -> String {
        if i == j {
            return ".".into();
        }
        let Some(l) = self.leg(rail, op, i, j) else { return "".into() };
        let g = l.gbps.map_or(String::new(), |g| format!("{g:.1}"));
        match l.outcome {
            Outcome::Ok => g,
            Outcome::Slow => format!("~{g}"),
            Outcome::Corrupt => "!".into(),
            Outcome::Error => "x".into(),
            Outcome::NotRun => "-".into(),
        }
    }

    pub fn json(&self) -> String {
        let culprit = |i: usize| match self.culprits.get(i) {
            Some(c) => {
                let nodes: Vec<String> = c.nodes.iter().map(|n| json_str(n)).collect();
                format!(
                    ",\"kind\":{},\"nodes\":[{}],\"rail\":{}",
                    json_str(c.kind.word()),
                    nodes.join(","),
                    c.rail.map_or("null".into(), |r| r.to_string())
                )
            }
            None => String::new(),
        };
        self.checks().json_with("fleet", culprit, &self.json_extra())
    }

    fn json_extra(&self) -> String {
        let f = |v: Option<f64>| v.map_or("null".to_string(), |x| format!("{x:.3}"));
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|t| {
                let rails: Vec<String> = t
                    .rails
                    .iter()
                    .map(|r| {
                        format!(
                            "{{\"rail\":{},\"gpu\":{},\"nic\":{},\"port_gbps\":{},\"path\":{},\"loopback\":{}}}",
                            r.rail,
                            json_str(&r.gpu),
                            json_str(&r.nic),
                            f(r.port_gbps),
                            json_str(&r.path),
                            json_str(&r.loopback)
                        )
                    })
                    .collect();
                let vs: Vec<String> = t.versions.iter().map(|(k, v)| format!("{}:{}", json_str(k), json_str(v))).collect();
                format!("{{\"name\":{},\"rails\":[{}],\"versions\":{{{}}}}}", json_str(&t.node), rails.join(","), vs.join(","))
            })
            .collect();
        let mut matrices = Vec::new();
        let mut ops = vec![Op::Write, Op::Read];
        if self.legs.iter().any(|l| l.op == Op::Nccl) {
            ops.push(Op::Nccl);
        }
        for &r in &self.rails() {
            for &op in &ops {
                if op == Op::Nccl && r != 0 {
                    continue;
                }
                let rows: Vec<String> = (0..self.nodes.len())
                    .map(|i| {
                        let cells: Vec<String> = (0..self.nodes.len())
                            .map(|j| match self.leg(r, op, i, j) {
                                None => "null".into(),
                                Some(l) => format!(
                                    "{{\"outcome\":{},\"gbps\":{},\"latency_us\":{},\"detail\":{}}}",
                                    json_str(l.outcome.word()),
                                    f(l.gbps),
                                    f(l.lat_us),
                                    json_str(&l.detail)
                                ),
                            })
                            .collect();
                        format!("[{}]", cells.join(","))
                    })
                    .collect();
                matrices.push(format!(
                    "{{\"rail\":{r},\"op\":{},\"rows\":[{}]}}",
                    json_str(op.word()),
                    rows.join(",")
                ));
            }
        }
        let secs: Vec<String> = self.round_secs.iter().map(|s| format!("{s:.3}")).collect();
        format!(
            ",\"launcher\":{},\"bytes\":{},\"rounds\":{},\"round_seconds\":[{}],\"seconds\":{:.3},\"nodes\":[{}],\"matrices\":[{}]",
            json_str(&self.launcher),
            self.bytes,
            self.round_secs.len(),
            secs.join(","),
            self.secs,
            nodes.join(","),
            matrices.join(",")
        )
    }
}

/// A culprit's lines: `FAIL KIND NODES[ rail R]: summary`, its first 8 lines of evidence, its fix.
fn culprit_lines(c: &Culprit) -> String {
    let mut s = String::new();
    let rail = c.rail.map_or(String::new(), |r| format!(" rail {r}"));
    let ev = &c.check.evidence;
    let _ = writeln!(
        s,
        "{} {:<12} {}{rail}: {}",
        c.check.status.word(),
        c.kind.word(),
        c.nodes.join(" ↔ "),
        c.check.summary
    );
    for e in ev.iter().take(8) {
        let _ = writeln!(s, "     {:<12} | {e}", "");
    }
    if ev.len() > 8 {
        let _ = writeln!(s, "     {:<12} | … {} more (--json has them all)", "", ev.len() - 8);
    }
    if !c.check.fix.is_empty() {
        let _ = writeln!(s, "     {:<12} fix: {}", "", c.check.fix);
    }
    s
}
