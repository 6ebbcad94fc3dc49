//! The self-test's report: one line per step check (PASS, FAIL or COULD NOT CHECK) with the call
//! that decided it, its errno or CUDA status, and the likely cause; the shim's counters; the
//! bandwidth table. Text or JSON; the exit code: 0 all passed, 1 a step failed, 2 could not
//! check here.

use crate::report::{json_object, json_str, COULD_NOT_CHECK};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Pass,
    NotChecked,
    Fail,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::NotChecked => COULD_NOT_CHECK,
            Verdict::Fail => "FAIL",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Item {
    pub step: u8,
    pub id: String,
    pub verdict: Verdict,
    pub summary: String,
    /// The call that decided it, with its result (errno, CUDA status, completion status).
    pub call: String,
    /// The likely cause (empty on PASS).
    pub cause: String,
}

#[derive(Clone, Debug)]
pub struct Bw {
    pub direction: &'static str,
    pub size: usize,
    pub gbps: f64,
}

#[derive(Default, Debug)]
pub struct Report {
    pub items: Vec<Item>,
    pub counters: Vec<(&'static str, String)>,
    pub bandwidth: Vec<Bw>,
    pub link_gbps: Option<f64>,
}

impl Report {
    pub fn add(
        &mut self,
        step: u8,
        id: &str,
        verdict: Verdict,
        summary: impl Into<String>,
        call: impl Into<String>,
        cause: impl Into<String>,
    ) {
        self.items.push(Item { step, id: id.into(), verdict, summary: summary.into(), call: call.into(), cause: cause.into() });
    }
    pub fn pass(&mut self, step: u8, id: &str, summary: impl Into<String>, call: impl Into<String>) {
        self.add(step, id, Verdict::Pass, summary, call, "");
    }
    pub fn fail(&mut self, step: u8, id: &str, summary: impl Into<String>, call: impl Into<String>, cause: impl Into<String>) {
        self.add(step, id, Verdict::Fail, summary, call, cause);
    }
    pub fn not_checked(&mut self, step: u8, id: &str, summary: impl Into<String>, cause: impl Into<String>) {
        self.add(step, id, Verdict::NotChecked, summary, "", cause);
    }
    pub fn verdict(&self) -> Verdict {
        self.items.iter().map(|i| i.verdict).max().unwrap_or(Verdict::NotChecked)
    }
    pub fn exit_code(&self) -> u8 {
        match self.verdict() {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::NotChecked => 2,
        }
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        for i in &self.items {
            let _ = writeln!(s, "{:<15} step {} {:<22} {}", i.verdict.word(), i.step, i.id, i.summary);
            if !i.call.is_empty() {
                let _ = writeln!(s, "{:<15} {:<29} call: {}", "", "", i.call);
            }
            if !i.cause.is_empty() {
                let _ = writeln!(s, "{:<15} {:<29} likely cause: {}", "", "", i.cause);
            }
        }
        if !self.bandwidth.is_empty() {
            let link = self.link_gbps.map_or("link rate unknown".to_string(), |l| format!("link {l:.2} Gb/s"));
            let _ = writeln!(s, "bandwidth (Gb/s; {link}; the runbook's reference: 69.35 Gb/s on a 100 Gb/s ConnectX-6):");
            let mut dirs: Vec<&str> = self.bandwidth.iter().map(|b| b.direction).collect();
            dirs.dedup();
            for d in dirs {
                let row: Vec<String> =
                    self.bandwidth.iter().filter(|b| b.direction == d).map(|b| format!("{}K:{:.2}", b.size >> 10, b.gbps)).collect();
                let _ = writeln!(s, "  {d:<16} {}", row.join(" "));
            }
        }
        if !self.counters.is_empty() {
            let c: Vec<String> = self.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "shim counters: {}", c.join(" "));
        }
        let n = |v| self.items.iter().filter(|i| i.verdict == v).count();
        let _ = writeln!(
            s,
            "RESULT: {} ({} PASS, {} FAIL, {} COULD NOT CHECK)",
            self.verdict().word(),
            n(Verdict::Pass),
            n(Verdict::Fail),
            n(Verdict::NotChecked)
        );
        s
    }

    /// The tools' one JSON object: each step a check (its call the evidence, `step` and `cause`
    /// its own keys), then `bandwidth`, `link_gbps` and `counters`.
    pub fn json(&self) -> String {
        let checks: Vec<String> = self
            .items
            .iter()
            .map(|i| {
                let evidence: Vec<String> = if i.call.is_empty() { vec![] } else { vec![json_str(&i.call)] };
                format!(
                    "{{\"id\":{},\"status\":{},\"summary\":{},\"evidence\":[{}],\"fix\":\"\",\"step\":{},\"cause\":{}}}",
                    json_str(&i.id),
                    json_str(i.verdict.word()),
                    json_str(&i.summary),
                    evidence.join(","),
                    i.step,
                    json_str(&i.cause)
                )
            })
            .collect();
        let mut extra = String::from(",\"bandwidth\":[");
        for (k, b) in self.bandwidth.iter().enumerate() {
            if k > 0 {
                extra.push(',');
            }
            let _ = write!(extra, "{{\"direction\":{},\"size\":{},\"gbps\":{:.3}}}", json_str(b.direction), b.size, b.gbps);
        }
        let _ = write!(extra, "],\"link_gbps\":{},\"counters\":{{", self.link_gbps.map_or("null".into(), |l| format!("{l:.3}")));
        for (k, (n, v)) in self.counters.iter().enumerate() {
            if k > 0 {
                extra.push(',');
            }
            let val = if v.parse::<u64>().is_ok() { v.clone() } else { json_str(v) };
            let _ = write!(extra, "{}:{val}", json_str(n));
        }
        extra.push('}');
        let why = (self.verdict() == Verdict::NotChecked).then(|| {
            self.items
                .iter()
                .find(|i| i.verdict == Verdict::NotChecked)
                .map_or("no step ran".to_string(), |i| format!("{}: {}", i.id, i.summary))
        });
        json_object("selftest", &checks, why.as_deref(), self.exit_code(), &extra)
    }
}
