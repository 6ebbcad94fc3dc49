//! What the fleet check learns and says: each task's facts about its node and rails, each leg of
//! each link (one direction, one operation, one rail), and the culprits. Every type travels
//! through the rendezvous as lines of tab-separated fields (`to_line`/`from_line`).

use crate::report::{Check, Status};

/// What a culprit (or a node's fact) names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// gdrshim missing, or another version than the fleet's.
    Shim,
    /// No GDR route on the node: dma-buf MRs refused, no route the shim can take.
    DmaBuf,
    Memlock,
    Iommu,
    /// The GPU↔NIC PCIe path (PHB/SYS, ACS redirecting peer traffic).
    PciePath,
    /// Driver, rdma-core or NCCL versions that differ across the fleet.
    VersionSkew,
    /// The node itself: every link of it bad on every rail, or a check of the node failed.
    Node,
    /// One NIC or port of one node: every link of that rail bad, or the port's own state.
    NicPort,
    /// One pair of nodes on one rail.
    Link,
    /// NCCL's choice on a pair: an inter-node channel without GDRDMA.
    Nccl,
    /// Every link of every node failed: what they share (fabric, switch, the network chosen).
    Fleet,
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::Shim,
        Kind::DmaBuf,
        Kind::Memlock,
        Kind::Iommu,
        Kind::PciePath,
        Kind::VersionSkew,
        Kind::Node,
        Kind::NicPort,
        Kind::Link,
        Kind::Nccl,
        Kind::Fleet,
    ];
    pub fn word(self) -> &'static str {
        match self {
            Kind::Shim => "gdrshim",
            Kind::DmaBuf => "dma-buf",
            Kind::Memlock => "memlock",
            Kind::Iommu => "iommu",
            Kind::PciePath => "pcie-path",
            Kind::VersionSkew => "version-skew",
            Kind::Node => "node",
            Kind::NicPort => "nic-port",
            Kind::Link => "link",
            Kind::Nccl => "nccl",
            Kind::Fleet => "fleet",
        }
    }
    pub fn from_word(w: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.word() == w)
    }
    /// The report's check of a culprit of this kind: `culprit.KIND`, FAIL, its evidence whole.
    pub fn check(
        self,
        summary: impl Into<String>,
        evidence: Vec<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            evidence,
            ..Check::new(&format!("culprit.{}", self.word()), Status::Fail, summary).fix(fix)
        }
    }
}

/// A leg's outcome, the worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Ok,
    /// Bytes right, bandwidth below the floor.
    Slow,
    /// Completed, but the bytes that arrived differ from those sent.
    Corrupt,
    /// A completion error (retries exhausted, access error…) or a timeout.
    Error,
    /// Not run: an end could not take part (its registration or QP failed).
    NotRun,
}

impl Outcome {
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Slow => "slow",
            Outcome::Corrupt => "corrupt",
            Outcome::Error => "error",
            Outcome::NotRun => "not-run",
        }
    }
    fn from_word(w: &str) -> Option<Outcome> {
        [Outcome::Ok, Outcome::Slow, Outcome::Corrupt, Outcome::Error, Outcome::NotRun]
            .into_iter()
            .find(|o| o.word() == w)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Write,
    Read,
    /// NCCL's send/recv (`--nccl`).
    Nccl,
}

impl Op {
    pub fn word(self) -> &'static str {
        match self {
            Op::Write => "WRITE",
            Op::Read => "READ",
            Op::Nccl => "NCCL",
        }
    }
    fn from_word(w: &str) -> Option<Op> {
        [Op::Write, Op::Read, Op::Nccl].into_iter().find(|o| o.word() == w)
    }
}

/// Something found on one node (a failure or a warning; what passed is not a fact): the rail it
/// concerns and whether it blocks, and the check that names the node when the verdict makes it a
/// culprit ([`Kind::check`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    pub kind: Kind,
    /// The rail it concerns; None: the whole node.
    pub rail: Option<usize>,
    /// The node cannot move bytes on that rail (or any) because of it.
    pub blocks: bool,
    pub check: Check,
}

impl Fact {
    pub fn new(
        kind: Kind,
        rail: Option<usize>,
        blocks: bool,
        summary: String,
        evidence: Vec<String>,
        fix: String,
    ) -> Fact {
        Fact { kind, rail, blocks, check: kind.check(summary, evidence, fix) }
    }
}

/// One rail of one task: its GPU, its NIC port and what the self-test found there. The fleet's
/// JSON prints it as it is (render.rs, `NodeJson`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rail {
    pub rail: usize,
    pub gpu: String,
    pub nic: String,
    pub port_gbps: Option<f64>,
    /// How GPU memory was registered, from gdrshim's counters: dmabuf, nv503c, native, none.
    pub path: String,
    /// The per-node loopback: PASS, FAIL or COULD NOT CHECK.
    pub loopback: String,
}

/// What one task says about itself.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Task {
    pub rank: usize,
    pub node: String,
    pub rails: Vec<Rail>,
    pub facts: Vec<Fact>,
    /// (what, version): gdrshim, driver, rdma-core, nccl; "missing" where absent.
    pub versions: Vec<(String, String)>,
}

/// One direction of one operation on one rail between two nodes (indices into the node list).
#[derive(Clone, Debug, PartialEq)]
pub struct Leg {
    pub rail: usize,
    /// Where the bytes come from and where they land.
    pub src: usize,
    pub dst: usize,
    pub op: Op,
    pub outcome: Outcome,
    pub gbps: Option<f64>,
    pub lat_us: Option<f64>,
    pub detail: String,
}

/// What the verdict names: a FAIL check of the report ([`Kind::check`]) and the nodes and rail it
/// concerns.
#[derive(Clone, Debug, PartialEq)]
pub struct Culprit {
    pub kind: Kind,
    pub nodes: Vec<String>,
    pub rail: Option<usize>,
    pub check: Check,
}

impl Culprit {
    pub fn new(
        kind: Kind,
        nodes: Vec<String>,
        rail: Option<usize>,
        summary: String,
        evidence: Vec<String>,
        fix: String,
    ) -> Culprit {
        Culprit { kind, nodes, rail, check: kind.check(summary, evidence, fix) }
    }
}

// ---- lines: fields split by tabs; a field escapes \ tab and newline; a list inside one field
// is split by the unit separator (removed from its items)

pub fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\t', "\\t").replace('\n', "\\n")
}

pub fn unesc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            o.push(c);
            continue;
        }
        match it.next() {
            Some('t') => o.push('\t'),
            Some('n') => o.push('\n'),
            Some(c) => o.push(c),
            None => {}
        }
    }
    o
}

const US: char = '\u{1f}';

fn list(v: &[String]) -> String {
    v.iter().map(|s| s.replace(US, " ")).collect::<Vec<_>>().join(&US.to_string())
}

fn unlist(s: &str) -> Vec<String> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(US).map(str::to_string).collect()
    }
}

fn opt_f(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.6}"))
}

fn un_opt_f(s: &str) -> Option<f64> {
    s.parse().ok()
}

fn line(fields: &[String]) -> String {
    fields.iter().map(|f| esc(f)).collect::<Vec<_>>().join("\t")
}

fn fields(l: &str) -> Vec<String> {
    l.split('\t').map(unesc).collect()
}

fn bad(what: &str, l: &str) -> String {
    format!("a {what} line the rendezvous cannot read: {}", l.chars().take(120).collect::<String>())
}

impl Task {
    pub fn to_lines(&self) -> String {
        let mut out = vec![line(&["task".into(), self.rank.to_string(), self.node.clone()])];
        for r in &self.rails {
            out.push(line(&[
                "rail".into(),
                r.rail.to_string(),
                r.gpu.clone(),
                r.nic.clone(),
                opt_f(r.port_gbps),
                r.path.clone(),
                r.loopback.clone(),
            ]));
        }
        for f in &self.facts {
            out.push(line(&[
                "fact".into(),
                f.kind.word().into(),
                f.rail.map_or("-".into(), |r| r.to_string()),
                (f.blocks as u8).to_string(),
                f.check.summary.clone(),
                list(&f.check.evidence),
                f.check.fix.clone(),
            ]));
        }
        for (what, v) in &self.versions {
            out.push(line(&["version".into(), what.clone(), v.clone()]));
        }
        out.join("\n")
    }

    pub fn from_lines(text: &str) -> Result<Task, String> {
        let mut t = Task::default();
        for l in text.lines() {
            let f = fields(l);
            match (f[0].as_str(), f.len()) {
                ("task", 3) => {
                    t.rank = f[1].parse().map_err(|_| bad("task", l))?;
                    t.node = f[2].clone();
                }
                ("rail", 7) => t.rails.push(Rail {
                    rail: f[1].parse().map_err(|_| bad("rail", l))?,
                    gpu: f[2].clone(),
                    nic: f[3].clone(),
                    port_gbps: un_opt_f(&f[4]),
                    path: f[5].clone(),
                    loopback: f[6].clone(),
                }),
                ("fact", 7) => t.facts.push(Fact::new(
                    Kind::from_word(&f[1]).ok_or_else(|| bad("fact", l))?,
                    f[2].parse().ok(),
                    f[3] == "1",
                    f[4].clone(),
                    unlist(&f[5]),
                    f[6].clone(),
                )),
                ("version", 3) => t.versions.push((f[1].clone(), f[2].clone())),
                _ => return Err(bad("task", l)),
            }
        }
        Ok(t)
    }
}

impl Leg {
    pub fn to_line(&self) -> String {
        line(&[
            "leg".into(),
            self.rail.to_string(),
            self.src.to_string(),
            self.dst.to_string(),
            self.op.word().into(),
            self.outcome.word().into(),
            opt_f(self.gbps),
            opt_f(self.lat_us),
            self.detail.clone(),
        ])
    }
    pub fn from_line(l: &str) -> Result<Leg, String> {
        let f = fields(l);
        let n = |i: usize| f[i].parse::<usize>().map_err(|_| bad("leg", l));
        if f.len() != 9 || f[0] != "leg" {
            return Err(bad("leg", l));
        }
        Ok(Leg {
            rail: n(1)?,
            src: n(2)?,
            dst: n(3)?,
            op: Op::from_word(&f[4]).ok_or_else(|| bad("leg", l))?,
            outcome: Outcome::from_word(&f[5]).ok_or_else(|| bad("leg", l))?,
            gbps: un_opt_f(&f[6]),
            lat_us: un_opt_f(&f[7]),
            detail: f[8].clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_and_legs_survive_the_wire() {
        let t = Task {
            rank: 7,
            node: "node\t7".into(),
            rails: vec![Rail {
                rail: 1,
                gpu: "GPU 1 (NVIDIA GeForce RTX 4090)".into(),
                nic: "mlx5_1 port 1".into(),
                port_gbps: Some(200.0),
                path: "dmabuf".into(),
                loopback: "PASS".into(),
            }],
            facts: vec![Fact::new(
                Kind::Memlock,
                None,
                true,
                "memlock 64 KiB\nsecond line".into(),
                vec!["getrlimit(RLIMIT_MEMLOCK) -> 65536".into(), "back\\slash".into()],
                "ulimit -l unlimited".into(),
            )],
            versions: vec![("gdrshim".into(), "0.2.0".into()), ("nccl".into(), "missing".into())],
        };
        assert_eq!(Task::from_lines(&t.to_lines()).unwrap(), t);
        let leg = Leg {
            rail: 0,
            src: 2,
            dst: 3,
            op: Op::Read,
            outcome: Outcome::Corrupt,
            gbps: Some(91.25),
            lat_us: None,
            detail: "12 of 4096 bytes differ".into(),
        };
        assert_eq!(Leg::from_line(&leg.to_line()).unwrap(), leg);
        assert!(Leg::from_line("leg\t0\t1").is_err());
        assert!(Task::from_lines("fact\tnot-a-kind\t-\t1\ts\t\t").is_err());
        for k in Kind::ALL {
            assert_eq!(Kind::from_word(k.word()), Some(k));
        }
    }
}
