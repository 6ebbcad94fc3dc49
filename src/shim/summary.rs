//! Every count of the runtime in one [`Snapshot`]: the exit summary line and `gdrshim_counters`
//! are both read from it.

use super::types::Shim;
use crate::counters::{GdrshimCounters, Snapshot};
use core::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

impl Shim {
    /// Every NVIDIA call seen: each ends in exactly one of these counts.
    fn nv_ioctls(&self, decoded: u64) -> u64 {
        let s = &self.stats;
        [&s.passthrough, &s.failed, &s.not_decoded, &s.malformed, &s.dropped]
            .iter()
            .map(|c| c.load(Relaxed))
            .sum::<u64>()
            + decoded
    }

    /// All counts now. `at_exit`: the core's lock is waited for only briefly and warnings are
    /// written as plain lines (thread-locals may be gone), and libcuda's registrations still
    /// live are reported; otherwise the core is read as any reader does.
    pub fn snapshot(&self, at_exit: bool) -> Snapshot {
        let mut raw = |l: &str| crate::log::raw_line("WARN", l);
        let lent = if at_exit {
            self.pipeline.lend(Duration::from_millis(200), &mut raw)
        } else {
            self.pipeline
                .lend(Duration::from_secs(1), &mut crate::pipeline::map_notice)
                .filter(|l| l.complete)
        };
        let mut core_counts = Snapshot::new();
        let mut decoded = 0;
        let (mut live, mut p2p_live, mut dmabuf_live) = (u64::MAX, u64::MAX, u64::MAX);
        let mut bytes = [u64::MAX; 5];
        let mut bar1 = [u64::MAX; 2];
        if let Some(mut lent) = lent {
            let c = &mut *lent.core;
            decoded = c.decoded;
            if at_exit {
                for left in c.tracker.finish() {
                    crate::log::raw_line(
                        "INFO",
                        &format!("native registration never predicted, still live at exit: {left}"),
                    );
                }
            }
            core_counts.counts(c.tracker.counts.pairs());
            core_counts.counts([
                ("map_entries", c.tracker.map.entries() as u64),
                ("rm_objects", c.tracker.objects() as u64),
            ]);
            core_counts.counts(c.registrar.counts.pairs());
            live = c.registrar.live_registrations() as u64;
            p2p_live = c.registrar.p2p_objects() as u64;
            dmabuf_live = c.registrar.dmabuf_mrs() as u64;
            let (reg, reg_peak, exp, exp_peak) = c.registrar.dmabuf_bytes();
            bytes = [c.registrar.dmabuf_buffers().0 as u64, reg, reg_peak, exp, exp_peak];
            let (size, is_static) = c.registrar.bar1();
            bar1 = [size.unwrap_or(u64::MAX), is_static.map_or(u64::MAX, u64::from)];
        } else {
            // the core's lock was not had: every count of it is unknown, not zero
            let unknown = |pairs: &[(&'static str, u64)]| {
                pairs.iter().map(|&(n, _)| (n, u64::MAX)).collect::<Vec<_>>()
            };
            core_counts.counts(unknown(&crate::tracker::ShadowCounts::default().pairs()));
            core_counts.counts([("map_entries", u64::MAX), ("rm_objects", u64::MAX)]);
            core_counts.counts(unknown(&crate::registrar::RegCounts::default().pairs()));
        }
        let route = match self.route_choice.decided() {
            None => "undecided",
            Some(_) => self.route().map_or("none", |r| r.name()),
        };
        let s = &self.stats;
        let mut snap = Snapshot::new();
        snap.add("host", crate::log::host_name())
            // SAFETY: getpid has no preconditions.
            .add("pid", unsafe { libc::getpid() } as u64)
            .add("version", env!("CARGO_PKG_VERSION"))
            .add("mode", self.cfg.mode.name())
            .add("driver", self.version.map_or("unknown".to_string(), |v| v.to_string()))
            .add("abi", self.line.table.map_or("none", |t| t.since))
            .add("route", route)
            .counts([
                ("nv_ioctls", self.nv_ioctls(decoded)),
                ("decoded", decoded),
                ("failed", s.failed.load(Relaxed)),
                ("malformed", s.malformed.load(Relaxed)),
                ("not_decoded", s.not_decoded.load(Relaxed)),
                ("passthrough", s.passthrough.load(Relaxed)),
            ]);
        for (n, v) in core_counts.pairs() {
            snap.add(n, v.clone());
        }
        snap.counts([
            ("live_registrations", live),
            ("p2p_live", p2p_live),
            ("dmabuf_live", dmabuf_live),
            ("dmabuf_buffers", bytes[0]),
            ("registered_bytes", bytes[1]),
            ("registered_peak_bytes", bytes[2]),
            ("exported_bytes", bytes[3]),
            ("exported_peak_bytes", bytes[4]),
            ("bar1_bytes", bar1[0]),
            ("bar1_static", bar1[1]),
            ("wrapped", s.wrapped.load(Relaxed)),
            ("unwrapped", s.unwrapped.load(Relaxed)),
            ("cuda_frees", self.line.cuda_frees.load(Relaxed)),
            ("dmabuf_mrs", s.dmabuf_mrs.load(Relaxed)),
            ("dmabuf_served", s.dmabuf_served.load(Relaxed)),
            ("dmabuf_refused", s.dmabuf_refused.load(Relaxed)),
            ("gdr_answers", s.gdr_answers.load(Relaxed)),
            ("lines_held", crate::log::held()),
            ("helper_batches", self.pipeline.helper_batches.load(Relaxed)),
        ]);
        if self.cfg.knobs.hide_dmabuf {
            snap.counts([
                ("export_oracle_agree", s.export_oracle_agree.load(Relaxed)),
                ("export_oracle_disagree", s.export_oracle_disagree.load(Relaxed)),
            ]);
        }
        #[cfg(feature = "knobs")]
        {
            if self.cfg.knobs.timing {
                for (n, v) in self.timing_pairs(self.nv_ioctls(decoded)) {
                    snap.add(n, v);
                }
            }
            match s.knobs.bench_pauses.load(Relaxed) {
                0 => {}
                n => {
                    snap.add("bench_pauses", n);
                }
            }
        }
        snap
    }

    /// The counters of `gdrshim_counters`.
    pub fn counters(&self) -> GdrshimCounters {
        GdrshimCounters::from_snapshot(&self.snapshot(false))
    }
}
