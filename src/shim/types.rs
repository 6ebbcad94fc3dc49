//! The runtime's state: what the hooks read on every call (`ShimHotState`), the counts of the exit
//! summary (`Stats`), and the runtime itself (`Shim`), whose parts the files of this folder run.

use super::answers::Answers;
use super::route::RouteChoice;
use crate::abi::{AbiTable, DriverVersion};
use crate::config::{Config, Mode};
use crate::pipeline::Pipeline;
use core::sync::atomic::{AtomicI32, AtomicU64};
use parking_lot::Mutex;

#[derive(Default)]
pub struct Stats {
    pub failed: AtomicU64,
    /// Decoded, but the core's lock was not free within 5 s.
    pub dropped: AtomicU64,
    pub malformed: AtomicU64,
    pub not_decoded: AtomicU64,
    pub passthrough: AtomicU64,
    pub wrapped: AtomicU64,
    pub unwrapped: AtomicU64,
    pub dmabuf_mrs: AtomicU64,
    /// GDR probes answered differently from the driver (`advertise`).
    pub gdr_answers: AtomicU64,
    /// dma-bufs handed to CUDA's callers where libcuda refused (DMA-BUF route).
    pub dmabuf_served: AtomicU64,
    /// Exports `ibv_reg_dmabuf_mr` refused (the original call was delegated).
    pub dmabuf_refused: AtomicU64,
    /// GeForce emulation (`GDRSHIM_TEST_HIDE_DMABUF`): dma-buf requests whose outcome under
    /// gdrshim was libcuda's own (exported by both, or refused by both with the same code), or not.
    pub export_oracle_agree: AtomicU64,
    pub export_oracle_disagree: AtomicU64,
    /// Knobs builds: GDRSHIM_TIMING's clock and the benchmark's pauses.
    #[cfg(feature = "knobs")]
    pub knobs: super::knob_stats::Stats,
}

/// What the hooks read on every NVIDIA call (and the CUDA hooks' one count), in one cache line
/// (see [`HookHotState`]); the queue of their work follows in the next.
#[repr(C, align(64))]
pub struct ShimHotState {
    /// The ABI table of this driver; `None`: every call passes through undecoded.
    pub table: Option<&'static AbiTable>,
    pub(crate) capture_fd: AtomicI32,
    /// `cfg.mode`.
    pub mode: Mode,
    /// GDRSHIM_TIMING, GDRSHIM_TEST_PANIC=ioctl, =hook (knobs builds).
    #[cfg(feature = "knobs")]
    pub timing: bool,
    #[cfg(feature = "knobs")]
    pub(crate) panic_in_ioctl: bool,
    #[cfg(feature = "knobs")]
    pub(crate) panic_in_hook: bool,
    /// Register mode on a known ABI ([`Shim::registering`]): registrations over memory that a
    /// call releases are taken down before the driver runs it ([`Shim::before_ioctl`]).
    pub registering: bool,
    /// Successful cuMemFree calls (the CUDA hooks' only count of their own).
    pub cuda_frees: AtomicU64,
}
const _: () = assert!(core::mem::size_of::<ShimHotState>() == 64);

#[repr(C)]
pub struct Shim {
    pub line: ShimHotState,
    /// The hooks' work on its way to the core, and the core ([`Shim::core`]).
    pub pipeline: Pipeline,
    /// Registrations hold its write side, release-type driver calls its read side (`registrations`).
    pub(crate) release_gate: parking_lot::RwLock<()>,
    /// The route decision, readable without the core's lock.
    pub(crate) route_choice: RouteChoice,
    pub cfg: Config,
    pub version: Option<DriverVersion>,
    pub(crate) capture_lock: Mutex<()>,
    /// GDRSHIM_CAPTURE's file while it is ours (`line.capture_fd` says whether there is one).
    pub(crate) capture_file: crate::fdtable::own::Kept,
    pub stats: Stats,
    pub(crate) stood_aside_logged: core::sync::atomic::AtomicBool,
    /// The answers to CUDA's GPUDirect RDMA questions.
    pub(crate) answers: Answers,
    /// Tickets of deregistrations begun by a queued outcome (`registrations::verbs_dereg_begin`).
    pub(crate) dereg_tickets: AtomicU64,
    /// (clock ticks, nanoseconds) at start, to turn GDRSHIM_TIMING's ticks into nanoseconds.
    #[cfg(feature = "knobs")]
    pub(crate) clock_mark: (u64, u64),
}
