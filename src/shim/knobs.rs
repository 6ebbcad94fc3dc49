//! The tests' and benchmarks' knobs in the runtime (the `knobs` feature; a release build has
//! none of this): GDRSHIM_TIMING's per-request clock, `gdrshim_bench_pause`, injected panics.

use super::knob_stats::PerRequest;
use super::types::Shim;
use crate::activation::{ACTIVE, HOOK, PAUSED};
use core::sync::atomic::Ordering::Relaxed;

/// GDRSHIM_BENCH_PAUSE=1 in shadow mode: `pause` makes every hook inert (as in off mode) until
/// it is called again with `false`. Between the two the map sees nothing: the benchmark pauses
/// only between whole alloc/free iterations. `false` when not allowed here.
pub fn bench_pause(s: &Shim, pause: bool) -> bool {
    if !s.cfg.knobs.bench_pause || s.cfg.mode != crate::config::Mode::Shadow {
        return false;
    }
    let (from, to) = if pause { (ACTIVE, PAUSED) } else { (PAUSED, ACTIVE) };
    let ok = HOOK.active.compare_exchange(from, to, Relaxed, Relaxed).is_ok();
    if ok && pause {
        s.stats.knobs.bench_pauses.fetch_add(1, Relaxed);
    }
    ok || HOOK.active.load(Relaxed) == to
}

impl Shim {
    /// `GDRSHIM_TEST_PANIC=<site>`: panics here, to prove the hook contains it.
    #[inline]
    pub fn test_panic(&self, site: &str) {
        if self.cfg.knobs.panic.as_deref() == Some(site) {
            panic!("GDRSHIM_TEST_PANIC={site}: injected panic");
        }
    }

    /// Whether the ioctl hook panics on purpose (GDRSHIM_TEST_PANIC=ioctl).
    pub(crate) fn panics_in_ioctl(&self) -> bool {
        self.line.panic_in_ioctl
    }

    /// The GDRSHIM_TIMING keys: the average, the five most expensive request kinds in total
    /// (`kind:nr:ns_per_call*calls`), the CUDA allocation hooks and the helper thread's batches.
    pub(crate) fn timing_pairs(&self, nv_ioctls: u64) -> Vec<(&'static str, String)> {
        let s = &self.stats.knobs;
        let mut top: Vec<(u64, usize, u64)> = (0..768)
            .map(|i| (s.hook_ns_by_req[i].load(Relaxed), i, s.hook_calls_by_req[i].load(Relaxed)))
            .filter(|t| t.2 > 0)
            .collect();
        top.sort_unstable_by_key(|t| core::cmp::Reverse(t.0));
        // the counters hold clock ticks: nanoseconds per tick over this run
        let k = crate::sys::Clock::ns_per_tick(self.clock_mark);
        let top: Vec<String> = top
            .iter()
            .take(5)
            .map(|&(ticks, i, n)| {
                format!("{}:{:.0}*{n}", PerRequest::label(i), ticks as f64 * k / n as f64)
            })
            .collect();
        let p = &self.pipeline;
        vec![
            (
                "hook_ns_per_nv_ioctl",
                format!("{:.0}", s.hook_ns.load(Relaxed) as f64 * k / nv_ioctls.max(1) as f64),
            ),
            ("hook_top", top.join(",")),
            (
                "alloc_hook_ns_per_call",
                format!(
                    "{:.0}",
                    s.alloc_hook_ns.load(Relaxed) as f64 * k
                        / s.alloc_hook_calls.load(Relaxed).max(1) as f64
                ),
            ),
            (
                "helper_ns_per_batch",
                format!(
                    "{:.0}",
                    p.helper_ticks.load(Relaxed) as f64 * k
                        / p.helper_batches.load(Relaxed).max(1) as f64
                ),
            ),
        ]
    }
}
