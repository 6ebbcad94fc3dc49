//! The tests' and benchmarks' counters (the `knobs` feature): GDRSHIM_TIMING's clock per
//! request kind, the allocation hooks' time, the benchmark's pauses.

use crate::decode::DevKind;
use core::sync::atomic::AtomicU64;

/// One counter per (device kind, request number): ctl 0..256, uvm 256..512, gpu 512..768.
pub struct PerRequest(pub [AtomicU64; 768]);
impl Default for PerRequest {
    fn default() -> Self {
        PerRequest([const { AtomicU64::new(0) }; 768])
    }
}
impl PerRequest {
    const KINDS: [&'static str; 3] = ["ctl", "uvm", "gpu"];
    /// The counter of one request on one kind of NVIDIA device.
    pub fn slot(dev: DevKind, request: u64) -> usize {
        let kind = match dev {
            DevKind::Ctl => 0,
            DevKind::Uvm => 1,
            DevKind::Gpu(_) => 2,
        };
        kind * 256 + (request as usize & 0xff)
    }
    /// `kind:nr` of a counter, as the summary prints it.
    pub fn label(i: usize) -> String {
        format!("{}:{:#x}", Self::KINDS[i / 256], i % 256)
    }
}
impl core::ops::Index<usize> for PerRequest {
    type Output = AtomicU64;
    fn index(&self, i: usize) -> &AtomicU64 {
        &self.0[i]
    }
}

#[derive(Default)]
pub struct Stats {
    /// Clock ticks spent in the ioctl hook outside the real call (nanoseconds in the summary).
    pub hook_ns: AtomicU64,
    /// Hook time and calls per (device kind, request number), and in the CUDA allocation hooks,
    /// to find where the time goes.
    pub hook_ns_by_req: PerRequest,
    pub hook_calls_by_req: PerRequest,
    pub alloc_hook_ns: AtomicU64,
    pub alloc_hook_calls: AtomicU64,
    /// Times `gdrshim_bench_pause` made the hooks inert.
    pub bench_pauses: AtomicU64,
}
