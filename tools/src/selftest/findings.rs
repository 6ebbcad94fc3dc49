//! What the self-test found: its checks in the tools' one report form (`crate::report`), each
//! with its step (1 to 6) and the call that decided it as its evidence (with its errno, CUDA status
//! or completion status), the advice in `fix`; then the bandwidth table and the shim's counters.
//! The exit code: 0 all passed, 1 a step failed, 2 could not check here.

use crate::report::{json_str, Check, Report, Status};
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
    /// `counters`.
    pub fn json(&self) -> String {
        let mut extra = String::from(",\"bandwidth\":[");
        for (k, b) in self.bandwidth.iter().enumerate() {
            if k > 0 {
                extra.push(',');
            }
            let _ = write!(
                extra,
                "{{\"direction\":{},\"size\":{},\"gbps\":{:.3}}}",
                json_str(b.direction),
                b.size,
                b.gbps
            );
        }
        let _ = write!(
            extra,
            "],\"link_gbps\":{},\"counters\":{{",
            self.link_gbps.map_or("null".into(), |l| format!("{l:.3}"))
        );
        for (k, (n, v)) in self.counters.iter().enumerate() {
            if k > 0 {
                extra.push(',');
            }
            let val = if v.parse::<u64>().is_ok() { v.clone() } else { json_str(v) };
            let _ = write!(extra, "{}:{val}", json_str(n));
        }
        extra.push('}');
        self.checks.json_with("selftest", |i| format!(",\"step\":{}", self.steps[i]), &extra)
    }
}
