//! What the self-test found: its checks in the tools' one report form (`crate::report`), each
//! with its step (1 to 6) and the call that decided it as its evidence (with its errno, CUDA status
//! or completion status), the advice in `fix`; then the bandwidth table and the shim's counters.
//! The exit code: 0 all passed, 1 a step failed, 2 could not check here.

use crate::json::Ordered;
use crate::report::{Check, JsonReport, Report, Status};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Every check the self-test can report, by step: the README's table of steps lists the same
/// (`selftest::tests` holds the three together: this list, the README, the ids in the code).
pub const CHECKS: [(u8, &str); 27] = [
    (1, "route.shim"),
    (1, "route.chosen"),
    (1, "route.doctor"),
    (1, "route.dmabuf"),
    (1, "route.nv503c"),
    (1, "route.choice"),
    (2, "gpu.context"),
    (2, "gpu.alloc"),
    (3, "reg.export"),
    (3, "reg.gpu"),
    (3, "reg.dmabuf"),
    (3, "reg.host"),
    (4, "rdma.loopback"),
    (4, "rdma.port"),
    (4, "rdma.gid"),
    (4, "rdma.qp"),
    (4, "rdma.connect"),
    (4, "rdma.write.gpu-gpu"),
    (4, "rdma.write.host-gpu"),
    (4, "rdma.write.gpu-host"),
    (4, "rdma.read.gpu-host"),
    (5, "bandwidth"),
    (5, "bw.write.gpu-gpu"),
    (5, "bw.write.host-gpu"),
    (5, "bw.write.gpu-host"),
    (5, "bw.read.gpu-host"),
    (6, "shim.counters"),
];

#[derive(Clone, Debug)]
pub struct Bw {
    pub direction: &'static str,
    pub size: usize,
    pub gbps: f64,
}

#[derive(Default, Debug)]
pub struct Findings {
    pub checks: Report,
    /// The step of each check, in the order of `checks.checks`.
    pub steps: Vec<u8>,
    pub counters: Vec<(&'static str, String)>,
    pub bandwidth: Vec<Bw>,
    pub link_gbps: Option<f64>,
}

impl Findings {
    pub fn add(
        &mut self,
        step: u8,
        id: &str,
        status: Status,
        summary: impl Into<String>,
        call: impl Into<String>,
        fix: impl Into<String>,
    ) {
        debug_assert!(CHECKS.contains(&(step, id)), "step {step} {id} is not in CHECKS");
        let call: String = call.into();
        let mut c = Check::new(id, status, summary).fix(fix);
        if !call.is_empty() {
            c = c.evidence(call);
        }
        self.checks.push(c);
        self.steps.push(step);
    }
    pub fn pass(
        &mut self,
        step: u8,
        id: &str,
        summary: impl Into<String>,
        call: impl Into<String>,
    ) {
        self.add(step, id, Status::Pass, summary, call, "");
    }
    pub fn fail(
        &mut self,
        step: u8,
        id: &str,
        summary: impl Into<String>,
        call: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.add(step, id, Status::Fail, summary, call, fix);
    }
    pub fn not_checked(
        &mut self,
        step: u8,
        id: &str,
        summary: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.add(step, id, Status::CouldNotCheck, summary, "", fix);
    }
    pub fn items(&self) -> &[Check] {
        &self.checks.checks
    }
    pub fn item_mut(&mut self, id: &str) -> Option<&mut Check> {
        self.checks.checks.iter_mut().find(|c| c.id == id)
    }
    pub fn exit_code(&self) -> u8 {
        self.checks.exit_code()
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        for (c, step) in self.items().iter().zip(&self.steps) {
            self.checks.check_lines(&mut s, c, &format!("step {step} {}", c.id));
        }
        if !self.bandwidth.is_empty() {
            let link = self
                .link_gbps
                .map_or("link rate unknown".to_string(), |l| format!("link {l:.2} Gb/s"));
            let _ = writeln!(s, "bandwidth (Gb/s; {link}; a reference: 69.35 Gb/s measured on a 100 Gb/s ConnectX-6):");
            let mut dirs: Vec<&str> = self.bandwidth.iter().map(|b| b.direction).collect();
            dirs.dedup();
            for d in dirs {
                let row: Vec<String> = self
                    .bandwidth
                    .iter()
                    .filter(|b| b.direction == d)
                    .map(|b| format!("{}K:{:.2}", b.size >> 10, b.gbps))
                    .collect();
                let _ = writeln!(s, "  {d:<16} {}", row.join(" "));
            }
        }
        if !self.counters.is_empty() {
            let c: Vec<String> = self.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "shim counters: {}", c.join(" "));
        }
        s + &self.checks.closing_line()
    }

    /// The tools' one JSON object: each check with its `step`, then `bandwidth`, `link_gbps` and
    /// `counters` ([`SelftestJson`]).
    pub fn json(&self) -> String {
        crate::json::to_line(&self.json_model())
    }

    pub fn json_model(&self) -> SelftestJson {
        let bandwidth = self
            .bandwidth
            .iter()
            .map(|b| BwJson { direction: b.direction.to_string(), size: b.size, gbps: b.gbps })
            .collect();
        let counters = self
            .counters
            .iter()
            .map(|(n, v)| {
                let v = v.parse::<u64>().map_or_else(|_| Counter::Word(v.clone()), Counter::Count);
                (n.to_string(), v)
            })
            .collect();
        let own =
            SelftestKeys { bandwidth, link_gbps: self.link_gbps, counters: Ordered(counters) };
        self.checks.json_model("selftest", |i| Step { step: self.steps[i] }, own)
    }
}

/// The self-test's JSON: each check with its step, then the bandwidth table, the link's rate and
/// the shim's counters (the README's table of commands names these keys).
pub type SelftestJson = JsonReport<Step, SelftestKeys>;

/// The key the self-test adds to each check.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub step: u8,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct SelftestKeys {
    pub bandwidth: Vec<BwJson>,
    pub link_gbps: Option<f64>,
    /// The shim's counters in its order: a count as a number, anything else (the route) a string.
    pub counters: Ordered<Counter>,
}

/// One bandwidth measurement: a direction, a transfer size, Gb/s.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct BwJson {
    pub direction: String,
    pub size: usize,
    pub gbps: f64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Counter {
    Count(u64),
    Word(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key the self-test's JSON has, filled: the line parses back into the model and is
    /// written again the same, numbers with three decimals as before.
    #[test]
    fn the_selftest_json_round_trips() {
        let mut f = Findings::default();
        f.pass(1, "route.chosen", "gdrshim registers by route nv503c", "gdrshim_counters()");
        f.fail(4, "rdma.write.gpu-gpu", "bytes differ at 4096", "ibv_post_send", "report it");
        f.not_checked(5, "bandwidth", "--no-bandwidth", "run without it");
        f.bandwidth = vec![
            Bw { direction: "write.gpu-gpu", size: 65536, gbps: 12.3456 },
            Bw { direction: "write.gpu-gpu", size: 1 << 20, gbps: 90.0 },
        ];
        f.link_gbps = Some(100.0);
        f.counters =
            vec![("registered", "2".into()), ("route", "nv503c".into()), ("errors", "0".into())];
        let line = f.json();
        assert!(
            line.contains(r#""evidence":["ibv_post_send"],"fix":"report it","step":4}"#),
            "{line}"
        );
        assert!(
            line.ends_with(r#""exit":1,"bandwidth":[{"direction":"write.gpu-gpu","size":65536,"gbps":12.346},{"direction":"write.gpu-gpu","size":1048576,"gbps":90.000}],"link_gbps":100.000,"counters":{"registered":2,"route":"nv503c","errors":0}}"#),
            "{line}"
        );
        assert_eq!(crate::json::round_trip::<SelftestJson>(&line), line);
        let m: SelftestJson = serde_json::from_str(&line).unwrap();
        assert_eq!(m.checks.iter().map(|c| c.own.step).collect::<Vec<_>>(), [1, 4, 5]);
        assert_eq!(m.own.counters.0[1], ("route".to_string(), Counter::Word("nv503c".into())));
        // no link rate, no bandwidth: null and []
        f.link_gbps = None;
        f.bandwidth.clear();
        let line = f.json();
        assert!(line.contains(r#""bandwidth":[],"link_gbps":null,"counters":{"#), "{line}");
        assert_eq!(crate::json::round_trip::<SelftestJson>(&line), line);
    }
}
