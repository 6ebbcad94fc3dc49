//! What a user reads: the summary (culprits first, each with its evidence and fix), an N×N
//! matrix per rail and operation, the closing RESULT line; and the same in the tools' one JSON
//! object (the tools' one report, [`Fleet::checks`]: each culprit a FAIL check, then the fleet's own
//! keys).

use super::model::{Culprit, Leg, Op, Outcome, Rail, Task};
use crate::json::Ordered;
use crate::report::{result_word, Check, JsonReport, Report, Status};
use serde::{Deserialize, Serialize};
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
        crate::json::to_line(&self.json_model())
    }

    /// The fleet's JSON: the checks (each culprit with its kind, nodes and rail), then its own keys.
    pub fn json_model(&self) -> FleetJson {
        let culprit = |i: usize| {
            self.culprits.get(i).map(|c| CulpritKeys {
                kind: c.kind.word().to_string(),
                nodes: c.nodes.clone(),
                rail: c.rail,
            })
        };
        self.checks().json_model("fleet", culprit, self.json_keys())
    }

    fn json_keys(&self) -> FleetKeys {
        let nodes = self
            .nodes
            .iter()
            .map(|t| NodeJson {
                name: t.node.clone(),
                rails: t.rails.clone(),
                versions: Ordered(t.versions.clone()),
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
                let n = self.nodes.len();
                let rows = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                self.leg(r, op, i, j).map(|l| CellJson {
                                    outcome: l.outcome.word().to_string(),
                                    gbps: l.gbps,
                                    latency_us: l.lat_us,
                                    detail: l.detail.clone(),
                                })
                            })
                            .collect()
                    })
                    .collect();
                matrices.push(MatrixJson { rail: r, op: op.word().to_string(), rows });
            }
        }
        FleetKeys {
            launcher: self.launcher.clone(),
            bytes: self.bytes,
            rounds: self.round_secs.len(),
            round_seconds: self.round_secs.clone(),
            seconds: self.secs,
            nodes,
            matrices,
        }
    }
}

/// The fleet's JSON (the README's table of commands names its own keys).
pub type FleetJson = JsonReport<Option<CulpritKeys>, FleetKeys>;

/// What a culprit's check adds: its kind, the nodes and the rail it names (null: every rail).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct CulpritKeys {
    pub kind: String,
    pub nodes: Vec<String>,
    pub rail: Option<usize>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetKeys {
    pub launcher: String,
    pub bytes: usize,
    pub rounds: usize,
    pub round_seconds: Vec<f64>,
    pub seconds: f64,
    pub nodes: Vec<NodeJson>,
    pub matrices: Vec<MatrixJson>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeJson {
    pub name: String,
    /// each as the task gave it ([`Rail`]'s fields are the JSON's keys)
    pub rails: Vec<Rail>,
    /// gdrshim, driver, rdma-core, nccl, in the order the task gave them.
    pub versions: Ordered<String>,
}

/// One N×N matrix: row = where the bytes come from, column = where they land; null where no leg
/// ran (the diagonal).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct MatrixJson {
    pub rail: usize,
    pub op: String,
    pub rows: Vec<Vec<Option<CellJson>>>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct CellJson {
    pub outcome: String,
    pub gbps: Option<f64>,
    pub latency_us: Option<f64>,
    pub detail: String,
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
