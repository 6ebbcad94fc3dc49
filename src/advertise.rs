//! What gdrshim answers when a program asks CUDA whether GPUDirect RDMA works. Where libcuda
//! answers yes itself (datacenter GPUs) nothing is ever changed: gdrshim stands aside.
//!
//! - `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124): 1 while gdrshim serves dma-bufs (the DMA-BUF
//!   route in register mode), since `cuMemGetHandleForAddressRange` then works: gdrshim serves
//!   what libcuda refuses. NCCL asks it before it uses its own DMA-BUF path.
//! - `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` (110): 1 while a route registers
//!   GPU memory here (gdrshim registers `cuMemCreate` memory like any other). A program may then
//!   ask `cuMemCreate` for `gpuDirectRDMACapable`; where libcuda refuses only that flag, the hook
//!   retries once without it ([`flag_retry`]).
//! - `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (116): NCCL's GPU-side gate, asked through
//!   cudart. 1 by default while a route registers GPU memory here (`GDRSHIM_ADVERTISE_GDR=0` turns
//!   it down), but never where NCCL would skip the flush of received data that the GPU needs:
//!   with `NCCL_GDR_FLUSH_DISABLE` set, and on a GPU of sm_90 or later (NCCL flushes only below
//!   sm_90, `ncclTopoNeedFlush`) whose libcuda does not order remote writes for their owner
//!   (`GPU_DIRECT_RDMA_WRITES_ORDERING` below `OWNER`), unless `NCCL_NET_FORCE_FLUSH=1`, in the
//!   environment or in the configuration files every NCCL version reads (`ncclconf`).
//!
//! gdrshim never claims a peer-memory client: NCCL's nv_mem probe is left to the kernel.
#![forbid(unsafe_code)]

use crate::abi::cuda::{attr, flush_options, result, writes_ordering};
use crate::route::Route;
use std::fmt;

pub use crate::abi::cuda::attr::{
    DMA_BUF_SUPPORTED as ATTR_DMA_BUF_SUPPORTED,
    GPU_DIRECT_RDMA_SUPPORTED as ATTR_GPU_DIRECT_RDMA_SUPPORTED,
    GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED as ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
};

/// The attributes gdrshim may answer (every other passes untouched, without a look).
pub fn answers(attrib: i32) -> bool {
    matches!(
        attrib,
        ATTR_GPU_DIRECT_RDMA_SUPPORTED
            | ATTR_DMA_BUF_SUPPORTED
            | ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    )
}

/// The attribute's short name, for the log.
pub fn name(attrib: i32) -> &'static str {
    match attrib {
        ATTR_DMA_BUF_SUPPORTED => "DMA_BUF_SUPPORTED",
        ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED => "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED",
        _ => "GPU_DIRECT_RDMA_SUPPORTED",
    }
}

/// What libcuda says of one GPU that decides whether received GDR data needs NCCL's flush:
/// compute capability (75/76), `GPU_DIRECT_RDMA_WRITES_ORDERING` (118) and
/// `GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS` (117). `None`: libcuda did not answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFacts {
    pub compute_capability: Option<(i32, i32)>,
    pub writes_ordering: Option<i32>,
    pub flush_options: Option<i32>,
}

/// The attributes [`GpuFacts`] is read from.
pub const GPU_FACT_ATTRIBUTES: [i32; 4] = [
    attr::COMPUTE_CAPABILITY_MAJOR,
    attr::COMPUTE_CAPABILITY_MINOR,
    attr::GPU_DIRECT_RDMA_WRITES_ORDERING,
    attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
];

impl GpuFacts {
    /// From libcuda's answers for [`GPU_FACT_ATTRIBUTES`].
    pub fn read(ask: impl Fn(i32) -> Option<i32>) -> GpuFacts {
        let major = ask(attr::COMPUTE_CAPABILITY_MAJOR);
        let minor = ask(attr::COMPUTE_CAPABILITY_MINOR);
        GpuFacts {
            compute_capability: major.zip(minor),
            writes_ordering: ask(attr::GPU_DIRECT_RDMA_WRITES_ORDERING),
            flush_options: ask(attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS),
        }
    }

    /// NCCL skips its receive-side flush on this GPU unless forced: sm_90 and later
    /// (`ncclTopoNeedFlush`); an unknown capability counts as such (the safe side).
    fn nccl_skips_flush(&self) -> bool {
        self.compute_capability.is_none_or(|(major, _)| major >= 9)
    }

    /// The GPU consumes remote writes to its memory consistently without a flush.
    fn orders_writes(&self) -> bool {
        self.writes_ordering.is_some_and(|o| o >= writes_ordering::OWNER)
    }
}

impl fmt::Display for GpuFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.compute_capability {
            Some((major, minor)) => write!(f, "sm_{major}{minor}")?,
            None => f.write_str("compute capability unknown")?,
        }
        match self.writes_ordering {
            Some(o) => {
                let what = match o {
                    writes_ordering::NONE => "NONE",
                    writes_ordering::OWNER => "OWNER",
                    writes_ordering::ALL_DEVICES => "ALL_DEVICES",
                    _ => "unknown",
                };
                write!(f, ", GPU_DIRECT_RDMA_WRITES_ORDERING {o} ({what})")?
            }
            None => f.write_str(", GPU_DIRECT_RDMA_WRITES_ORDERING unknown")?,
        }
        match self.flush_options {
            Some(o) => {
                let host = if o & flush_options::HOST != 0 { " HOST" } else { "" };
                let memops = if o & flush_options::MEMOPS != 0 { " MEMOPS" } else { "" };
                write!(f, ", FLUSH_WRITES_OPTIONS {o:#x}{host}{memops}")
            }
            None => f.write_str(", FLUSH_WRITES_OPTIONS unknown"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `GDRSHIM_ADVERTISE_GDR`, on unless 0.
    pub advertise: bool,
    /// `GDRSHIM_ADVERTISE_GDR=1` was set: a missing route is then worth a line.
    pub advertise_asked: bool,
    /// `GDRSHIM_TEST_HIDE_GDR=1`: answer 0 for attribute 116, so a datacenter GPU looks like a
    /// GeForce to NCCL (how the patched gate is exercised on the H200).
    pub hide_gdr_for_test: bool,
    /// `GDRSHIM_TEST_HIDE_DMABUF=1`: libcuda's dma-buf support is hidden (attribute 124 reads 0
    /// unless gdrshim serves), as on a GeForce.
    pub hide_dmabuf_for_test: bool,
    /// The route gdrshim registers GPU memory by here: register mode, a known driver ABI, hooks in
    /// place, and a route the machine supports.
    pub route: Option<Route>,
    /// `NCCL_GDR_FLUSH_DISABLE` is set to a non-zero value.
    pub flush_disabled: bool,
    /// `NCCL_NET_FORCE_FLUSH` is a non-zero integer for every NCCL version (the environment's,
    /// else NCCL's configuration files').
    pub force_flush: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            advertise: true,
            advertise_asked: false,
            hide_gdr_for_test: false,
            hide_dmabuf_for_test: false,
            route: None,
            flush_disabled: false,
            force_flush: false,
        }
    }
}

/// Why GDR is not advertised although gdrshim would; each says what fixes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No route registers here (only said when `GDRSHIM_ADVERTISE_GDR=1` asked for it).
    NoRoute,
    /// `NCCL_GDR_FLUSH_DISABLE` is set.
    FlushDisabled,
    /// sm_90 or later without native write ordering, and no forced flush.
    Ordering(GpuFacts),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoRoute => f.write_str(
                "gdrshim registers nothing here (GDRSHIM_MODE is not register, the driver ABI is unknown, or no route works: scripts/doctor says which)",
            ),
            Refusal::FlushDisabled => f.write_str(
                "NCCL_GDR_FLUSH_DISABLE is set: without NCCL's flush a GeForce GPU can read received data stale; unset NCCL_GDR_FLUSH_DISABLE to get GPUDirect RDMA",
            ),
            Refusal::Ordering(g) => write!(
                f,
                "{g}: NCCL flushes received data only below sm_90 and this GPU does not order remote writes (below OWNER, 100), so it could read them stale; to get GPUDirect RDMA, set NCCL_NET_FORCE_FLUSH=1 in the job (gdr-env.sh does) or a line NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf (deploy.sh writes it)"
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The driver's value goes back untouched.
    Unchanged,
    /// This value goes back instead, for this reason.
    Replaced(i32, &'static str),
    /// Not advertised although gdrshim registers (or was asked to), for this reason (one line).
    Refused(Refusal),
}

impl Policy {
    /// Whether the answer for `attrib` (driver value `real`) depends on the GPU's facts: the
    /// hook reads them only then.
    pub fn needs_gpu_facts(&self, attrib: i32, real: i32) -> bool {
        attrib == ATTR_GPU_DIRECT_RDMA_SUPPORTED
            && (real == 0 || self.hide_gdr_for_test)
            && self.advertise
            && self.route.is_some()
            && !self.flush_disabled
            && !self.force_flush
    }

    /// The value to return for `cuDeviceGetAttribute(attrib)` whose driver answer was `real`, on
    /// a GPU of which libcuda says `gpu` (read where [`Policy::needs_gpu_facts`]).
    pub fn device_attribute(&self, attrib: i32, real: i32, gpu: &GpuFacts) -> Answer {
        match attrib {
            ATTR_GPU_DIRECT_RDMA_SUPPORTED => self.gdr_attribute(real, gpu),
            ATTR_DMA_BUF_SUPPORTED => self.dmabuf_attribute(real),
            ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED => self.vmm_attribute(real),
            _ => Answer::Unchanged,
        }
    }

    fn refusal(&self, gpu: &GpuFacts) -> Option<Refusal> {
        if self.route.is_none() {
            Some(Refusal::NoRoute)
        } else if self.flush_disabled {
            Some(Refusal::FlushDisabled)
        } else if gpu.nccl_skips_flush() && !gpu.orders_writes() && !self.force_flush {
            Some(Refusal::Ordering(*gpu))
        } else {
            None
        }
    }

    fn gdr_attribute(&self, real: i32, gpu: &GpuFacts) -> Answer {
        let driver = if self.hide_gdr_for_test { 0 } else { real };
        if driver != 0 || !self.advertise {
            return if driver != real {
                Answer::Replaced(driver, "GDRSHIM_TEST_HIDE_GDR=1 (test only)")
            } else {
                Answer::Unchanged
            };
        }
        match self.refusal(gpu) {
            None => Answer::Replaced(1, "gdrshim registers GPU memory for verbs here (GDRSHIM_ADVERTISE_GDR=0 turns this answer off)"),
            Some(_) if driver != real => Answer::Replaced(driver, "GDRSHIM_TEST_HIDE_GDR=1 (test only); not advertised"),
            // the default asked for nothing: a process with no route (shadow mode, or no route
            // works here, which the route decision said) keeps libcuda's answer without a line
            Some(Refusal::NoRoute) if !self.advertise_asked => Answer::Unchanged,
            Some(r) => Answer::Refused(r),
        }
    }

    fn dmabuf_attribute(&self, real: i32) -> Answer {
        let driver = if self.hide_dmabuf_for_test { 0 } else { real };
        if driver != 0 {
            return Answer::Unchanged;
        }
        if self.route == Some(Route::Dmabuf) {
            return Answer::Replaced(
                1,
                "gdrshim exports dma-bufs of this process's GPU memory (route dmabuf)",
            );
        }
        if driver != real {
            Answer::Replaced(0, "GDRSHIM_TEST_HIDE_DMABUF=1 (test only)")
        } else {
            Answer::Unchanged
        }
    }

    fn vmm_attribute(&self, real: i32) -> Answer {
        // (a GeForce answers 0 here as it does for 116: the emulation hides both)
        let driver = if self.hide_gdr_for_test { 0 } else { real };
        if driver != 0 {
            return Answer::Unchanged;
        }
        if self.route.is_none() {
            return if driver != real {
                Answer::Replaced(0, "GDRSHIM_TEST_HIDE_GDR=1 (test only)")
            } else {
                Answer::Unchanged
            };
        }
        Answer::Replaced(
            1,
            "gdrshim registers cuMemCreate memory for verbs here; a cuMemCreate that libcuda refuses only for gpuDirectRDMACapable is retried once without it",
        )
    }
}

/// What the `cuMemCreate` hook does with a call that asked for `gpuDirectRDMACapable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagRetry {
    /// Nothing: libcuda's result stands.
    No,
    /// Call once more with a copy of the properties without the flag; only that call's success
    /// replaces the first result (any other result: the first one stands).
    WithoutFlag,
    /// A flag value gdrshim does not understand: the result stands, worth one line.
    NotUnderstood(u8),
}

/// The retry rule: only a first call that failed as libcuda fails an unsupported flag (invalid
/// value, not supported), with the flag set to 1, in a process to which gdrshim answered
/// `GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` = 1. Never any other failure.
pub fn flag_retry(first: i32, flag: u8, answered_vmm: bool) -> FlagRetry {
    if first == result::SUCCESS || !answered_vmm || flag == 0 {
        return FlagRetry::No;
    }
    if flag != 1 {
        return FlagRetry::NotUnderstood(flag);
    }
    if matches!(first, result::INVALID_VALUE | result::NOT_SUPPORTED) {
        FlagRetry::WithoutFlag
    } else {
        FlagRetry::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const ON: Policy = Policy {
        advertise: true,
        advertise_asked: false,
        hide_gdr_for_test: false,
        hide_dmabuf_for_test: false,
        route: Some(Route::Nv503c),
        flush_disabled: false,
        force_flush: false,
    };
    /// An RTX 4090 as its libcuda describes it: sm_89, no native ordering, no flush option.
    const SM89: GpuFacts = GpuFacts {
        compute_capability: Some((8, 9)),
        writes_ordering: Some(0),
        flush_options: Some(0),
    };
    /// An RTX 5090 whose libcuda reports no ordering.
    const SM120: GpuFacts = GpuFacts {
        compute_capability: Some((12, 0)),
        writes_ordering: Some(0),
        flush_options: Some(0),
    };

    #[test]
    fn advertised_by_default_while_registering() {
        assert_eq!(
            Policy::default().device_attribute(116, 0, &SM89),
            Answer::Unchanged,
            "no route: untouched, silently"
        );
        assert!(matches!(ON.device_attribute(116, 0, &SM89), Answer::Replaced(1, _)));
        assert!(matches!(
            Policy { route: Some(Route::Dmabuf), ..ON }.device_attribute(116, 0, &SM89),
            Answer::Replaced(1, _)
        ));
        assert_eq!(
            ON.device_attribute(116, 1, &SM89),
            Answer::Unchanged,
            "native support is left alone"
        );
        assert_eq!(
            ON.device_attribute(117, 0, &SM89),
            Answer::Unchanged,
            "only the GDR, VMM and DMA-BUF attributes"
        );
        assert_eq!(
            Policy { advertise: false, ..ON }.device_attribute(116, 0, &SM89),
            Answer::Unchanged,
            "GDRSHIM_ADVERTISE_GDR=0"
        );
        let asked_none = Policy { route: None, advertise_asked: true, ..ON };
        assert_eq!(asked_none.device_attribute(116, 0, &SM89), Answer::Refused(Refusal::NoRoute));
        assert!(Refusal::NoRoute.to_string().contains("GDRSHIM_MODE"));
        assert!(answers(116) && answers(110) && answers(124) && !answers(118) && !answers(75));
    }

    #[test]
    fn never_with_the_flush_disabled() {
        let p = Policy { flush_disabled: true, ..ON };
        assert_eq!(p.device_attribute(116, 0, &SM89), Answer::Refused(Refusal::FlushDisabled));
        assert_eq!(
            Policy { force_flush: true, ..p }.device_attribute(116, 0, &SM89),
            Answer::Refused(Refusal::FlushDisabled)
        );
        assert!(Refusal::FlushDisabled.to_string().contains("unset NCCL_GDR_FLUSH_DISABLE"));
        assert!(!p.needs_gpu_facts(116, 0));
    }

    #[test]
    fn sm90_and_later_need_native_ordering_or_a_forced_flush() {
        // sm_89: NCCL flushes itself, whatever the ordering
        assert!(matches!(ON.device_attribute(116, 0, &SM89), Answer::Replaced(1, _)));
        // sm_120 with ordering NONE: refused, with the fix named
        let r = ON.device_attribute(116, 0, &SM120);
        assert_eq!(r, Answer::Refused(Refusal::Ordering(SM120)));
        let Answer::Refused(why) = r else { unreachable!() };
        let line = why.to_string();
        assert!(
            line.contains("sm_120")
                && line.contains("ORDERING 0 (NONE)")
                && line.contains("NCCL_NET_FORCE_FLUSH=1 in the job")
                && line.contains(
                    "a line NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf (deploy.sh writes it)"
                ),
            "{line}"
        );
        // ... unless the job forces NCCL's flush
        assert!(matches!(
            Policy { force_flush: true, ..ON }.device_attribute(116, 0, &SM120),
            Answer::Replaced(1, _)
        ));
        // OWNER (100) or ALL_DEVICES (200): the GPU orders the writes itself
        for o in [100, 200] {
            let g = GpuFacts { writes_ordering: Some(o), ..SM120 };
            assert!(matches!(ON.device_attribute(116, 0, &g), Answer::Replaced(1, _)), "{o}");
        }
        let below = GpuFacts { writes_ordering: Some(99), ..SM120 };
        assert!(matches!(ON.device_attribute(116, 0, &below), Answer::Refused(_)));
        // sm_90 exactly counts as "from sm_90 on"
        let sm90 = GpuFacts { compute_capability: Some((9, 0)), ..SM120 };
        assert!(matches!(ON.device_attribute(116, 0, &sm90), Answer::Refused(_)));
        // nothing known: the safe side
        assert!(matches!(ON.device_attribute(116, 0, &GpuFacts::default()), Answer::Refused(_)));
        let unknown_order = GpuFacts { writes_ordering: None, ..SM120 };
        assert!(matches!(ON.device_attribute(116, 0, &unknown_order), Answer::Refused(_)));
        // facts are read only where they decide
        assert!(ON.needs_gpu_facts(116, 0));
        assert!(
            !ON.needs_gpu_facts(116, 1)
                && !ON.needs_gpu_facts(110, 0)
                && !ON.needs_gpu_facts(124, 0)
        );
        assert!(!Policy { force_flush: true, ..ON }.needs_gpu_facts(116, 0));
        assert!(!Policy { route: None, ..ON }.needs_gpu_facts(116, 0));
    }

    #[test]
    fn facts_are_read_from_libcuda_answers() {
        let g = GpuFacts::read(|a| match a {
            75 => Some(12),
            76 => Some(0),
            118 => Some(100),
            117 => Some(3),
            _ => None,
        });
        assert_eq!(
            g,
            GpuFacts {
                compute_capability: Some((12, 0)),
                writes_ordering: Some(100),
                flush_options: Some(3)
            }
        );
        assert_eq!(g.to_string(), "sm_120, GPU_DIRECT_RDMA_WRITES_ORDERING 100 (OWNER), FLUSH_WRITES_OPTIONS 0x3 HOST MEMOPS");
        let half = GpuFacts::read(|a| (a == 75).then_some(9));
        assert_eq!(half.compute_capability, None, "a major without a minor is not a capability");
    }

    #[test]
    fn vmm_gdr_only_while_a_route_registers() {
        for route in [Route::Nv503c, Route::Dmabuf] {
            let p = Policy { route: Some(route), advertise: false, ..ON };
            assert!(
                matches!(p.device_attribute(110, 0, &SM89), Answer::Replaced(1, _)),
                "{route:?}"
            );
            assert_eq!(
                p.device_attribute(110, 1, &SM89),
                Answer::Unchanged,
                "libcuda's own yes stays"
            );
        }
        assert_eq!(Policy { route: None, ..ON }.device_attribute(110, 0, &SM89), Answer::Unchanged);
        // the GeForce emulation hides libcuda's 1 (the H200's) and answers as on a GeForce
        let hidden = Policy { hide_gdr_for_test: true, ..ON };
        assert!(matches!(hidden.device_attribute(110, 1, &SM89), Answer::Replaced(1, _)));
        assert!(matches!(
            Policy { route: None, ..hidden }.device_attribute(110, 1, &SM89),
            Answer::Replaced(0, _)
        ));
        // the ordering rule is the GDR gate's alone
        assert!(matches!(ON.device_attribute(110, 0, &SM120), Answer::Replaced(1, _)));
    }

    #[test]
    fn the_flag_retry_never_hides_another_failure() {
        assert_eq!(flag_retry(801, 1, true), FlagRetry::WithoutFlag);
        assert_eq!(flag_retry(1, 1, true), FlagRetry::WithoutFlag);
        assert_eq!(flag_retry(0, 1, true), FlagRetry::No, "libcuda accepted: unchanged");
        assert_eq!(flag_retry(2, 1, true), FlagRetry::No, "out of memory is a real failure");
        assert_eq!(flag_retry(101, 1, true), FlagRetry::No, "invalid device is a real failure");
        assert_eq!(flag_retry(801, 0, true), FlagRetry::No, "the flag was not asked for");
        assert_eq!(flag_retry(801, 1, false), FlagRetry::No, "gdrshim did not answer 110 = 1 here");
        assert_eq!(flag_retry(801, 2, true), FlagRetry::NotUnderstood(2));
        assert_eq!(flag_retry(0, 2, true), FlagRetry::No);
    }

    #[test]
    fn dmabuf_supported_only_while_gdrshim_serves_dmabufs() {
        let dmabuf = Policy { advertise: false, route: Some(Route::Dmabuf), ..ON };
        assert!(matches!(dmabuf.device_attribute(124, 0, &SM89), Answer::Replaced(1, _)));
        assert_eq!(
            dmabuf.device_attribute(124, 1, &SM89),
            Answer::Unchanged,
            "libcuda's own yes stays"
        );
        assert_eq!(
            ON.device_attribute(124, 0, &SM89),
            Answer::Unchanged,
            "the NV503C route serves no dma-buf"
        );
        assert_eq!(
            Policy { route: None, ..dmabuf }.device_attribute(124, 0, &SM89),
            Answer::Unchanged
        );
        // GeForce emulation: libcuda's yes hidden; gdrshim's own answer decides
        let hide = Policy { hide_dmabuf_for_test: true, ..dmabuf };
        assert!(matches!(hide.device_attribute(124, 1, &SM89), Answer::Replaced(1, _)));
        assert!(matches!(
            Policy { route: None, ..hide }.device_attribute(124, 1, &SM89),
            Answer::Replaced(0, _)
        ));
    }

    #[test]
    fn test_hiding() {
        let hide = Policy { hide_gdr_for_test: true, advertise: false, ..ON };
        assert!(matches!(hide.device_attribute(116, 1, &SM89), Answer::Replaced(0, _)));
        assert!(matches!(
            Policy { hide_gdr_for_test: true, ..ON }.device_attribute(116, 1, &SM89),
            Answer::Replaced(1, _)
        ));
        let hide_shadow = Policy { hide_gdr_for_test: true, route: None, ..ON };
        assert!(matches!(hide_shadow.device_attribute(116, 1, &SM89), Answer::Replaced(0, _)));
        // an H200 (sm_90, OWNER) seen as a GeForce: advertised on the ordering it has
        let h200 = GpuFacts {
            compute_capability: Some((9, 0)),
            writes_ordering: Some(100),
            flush_options: Some(1),
        };
        assert!(matches!(
            Policy { hide_gdr_for_test: true, ..ON }.device_attribute(116, 1, &h200),
            Answer::Replaced(1, _)
        ));
        assert!(Policy { hide_gdr_for_test: true, ..ON }.needs_gpu_facts(116, 1));
    }
}
