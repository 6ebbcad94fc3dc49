//! What gdrshim answers CUDA's GPUDirect RDMA questions (`advertise` decides): the device
//! attributes NCCL reads (GDR, DMA-BUF, VMM GDR), each first answer per device logged once, and
//! whether a `cuMemCreate` refused for `gpuDirectRDMACapable` alone may be retried without it.

use crate::advertise::{
    Answer, FlagRetry, GpuFacts, Policy, ATTR_DMA_BUF_SUPPORTED,
    ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

#[derive(Default)]
pub struct Answers {
    /// One bit per CUDA device whose answer was logged, per attribute (GDR, DMA-BUF, VMM GDR).
    logged: [AtomicU32; 3],
    /// `GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` was answered 1 in this process: a `cuMemCreate`
    /// refused for `gpuDirectRDMACapable` alone may be retried without it.
    vmm_gdr_answered: AtomicBool,
}

impl Answers {
    /// `cuDeviceGetAttribute` answered `*value` for `attrib` (one of `advertise::answers`) on
    /// `dev`: replace it where the policy says so. `ask` reads another attribute of `dev` from
    /// libcuda (the GPU's facts, read only where they decide). The first answer per device and
    /// attribute is logged (info; a refusal: a warning, once). Whether it was replaced.
    pub fn device_attribute(
        &self,
        policy: &Policy,
        attrib: i32,
        dev: i32,
        value: &mut i32,
        ask: &dyn Fn(i32) -> Option<i32>,
    ) -> bool {
        let name = crate::advertise::name(attrib);
        // (no lock of ours is held here: libcuda is asked freely)
        let read = policy.needs_gpu_facts(attrib, *value);
        let gpu = if read { GpuFacts::read(ask) } else { GpuFacts::default() };
        let answer = policy.device_attribute(attrib, *value, &gpu);
        let first = || {
            let slot = match attrib {
                ATTR_DMA_BUF_SUPPORTED => 1,
                ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED => 2,
                _ => 0,
            };
            let bit = 1u32 << (dev.clamp(0, 31) as u32);
            self.logged[slot].fetch_or(bit, Relaxed) & bit == 0
        };
        match answer {
            Answer::Replaced(v, why) => {
                if attrib == ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED && v == 1 {
                    self.vmm_gdr_answered.store(true, Relaxed);
                }
                if first() {
                    let facts = if read { format!(" ({gpu})") } else { String::new() };
                    crate::log_info!("cuDeviceGetAttribute({name}, device {dev}): driver says {}, answered {v}: {why}{facts}", *value);
                }
                *value = v;
                true
            }
            Answer::Refused(why) => {
                if first() {
                    crate::log_warn!("cuDeviceGetAttribute({name}, device {dev}): driver says 0; GPUDirect RDMA not advertised: {why}");
                }
                false
            }
            Answer::Unchanged => false,
        }
    }

    /// `cuMemCreate` failed with `first` for properties whose `gpuDirectRDMACapable` is `flag`:
    /// whether to call it once more without the flag (see `advertise::flag_retry`).
    pub fn vmm_flag_retry(&self, first: i32, flag: u8) -> FlagRetry {
        let retry = crate::advertise::flag_retry(first, flag, self.vmm_gdr_answered.load(Relaxed));
        if let FlagRetry::NotUnderstood(v) = retry {
            crate::log_limited!(
                crate::config::Level::Warn,
                "cuMemCreate flag",
                "cuMemCreate failed ({first}) with allocFlags.gpuDirectRDMACapable={v}, a value gdrshim does not know: passed through untouched"
            );
        }
        retry
    }

    /// The retry of `vmm_flag_retry` gave `again` (the caller gets the first result unless it is
    /// a success).
    pub fn vmm_flag_retried(size: u64, first: i32, again: i32) {
        if again == crate::abi::cuda::result::SUCCESS {
            crate::log_limited!(
                crate::config::Level::Info,
                "cuMemCreate retried",
                "cuMemCreate size={size:#x}: libcuda refused gpuDirectRDMACapable ({first}) on this GPU; created without it (gdrshim registers this memory for verbs like any other)"
            );
        } else {
            crate::log_limited!(
                crate::config::Level::Warn,
                "cuMemCreate retry failed",
                "cuMemCreate size={size:#x}: failed ({first}) with gpuDirectRDMACapable and ({again}) without it: the original error {first} stands"
            );
        }
    }
}
