//! What gdrshim answers when a program asks whether GPUDirect RDMA works: the driver attribute
//! `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (NCCL's GPU-side gate, asked through cudart) and
//! NCCL's peer-memory probe (`access()` of an nv_mem sysfs file, its NIC-side gate).
//!
//! This is the "stock NCCL without a rebuild" route, so it is opt-in (`GDRSHIM_ADVERTISE_GDR=1`),
//! and it never says yes unless gdrshim itself registers GPU memory for verbs in this process, or
//! when NCCL's receive-side flush is turned off (`NCCL_GDR_FLUSH_DISABLE`): on GPUs before sm_90
//! GDR without that flush gives stale data, and the probe cannot tell which GPU NCCL will flush.

/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (cuda.h).
pub const ATTR_GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;

/// The one peer-memory file answered: the legacy `nv_peer_mem` client. `/sys/module/nvidia_peermem`
/// is left alone on purpose: NCCL ≥ 2.30 reads that one alone as "nvidia_peermem is loaded" for
/// GPU-initiated networking, which gdrshim does not provide.
pub const PEER_MEMORY_PROBE_PATH: &[u8] = b"/sys/kernel/mm/memory_peers/nv_mem/version";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `GDRSHIM_ADVERTISE_GDR=1`.
    pub advertise: bool,
    /// `GDRSHIM_TEST_HIDE_GDR=1`: answer 0 for the attribute, so a datacenter GPU looks like a
    /// GeForce to NCCL (how the patched gate is exercised on the H200).
    pub hide_for_test: bool,
    /// gdrshim registers GPU memory for verbs here: register mode on a driver ABI it knows.
    pub registering: bool,
    /// `NCCL_GDR_FLUSH_DISABLE` is set to a non-zero value.
    pub flush_disabled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The driver's value goes back untouched.
    Unchanged,
    /// This value goes back instead, for this reason.
    Replaced(i32, &'static str),
    /// Not advertised although asked to, for this reason (worth one warning).
    Refused(&'static str),
}

impl Policy {
    fn why_not(&self) -> Option<&'static str> {
        if !self.registering {
            Some("gdrshim is not registering here (GDRSHIM_MODE is not register, or the driver ABI is unknown)")
        } else if self.flush_disabled {
            Some("NCCL_GDR_FLUSH_DISABLE is set: GPUs before sm_90 need that flush, without it received data can be stale")
        } else {
            None
        }
    }

    /// The value to return for `cuDeviceGetAttribute(attrib)` whose driver answer was `real`.
    pub fn device_attribute(&self, attrib: i32, real: i32) -> Answer {
        if attrib != ATTR_GPU_DIRECT_RDMA_SUPPORTED {
            return Answer::Unchanged;
        }
        let driver = if self.hide_for_test { 0 } else { real };
        if driver != 0 || !self.advertise {
            return if driver != real { Answer::Replaced(driver, "GDRSHIM_TEST_HIDE_GDR=1 (test only)") } else { Answer::Unchanged };
        }
        match self.why_not() {
            Some(why) => {
                if driver != real {
                    Answer::Replaced(driver, "GDRSHIM_TEST_HIDE_GDR=1 (test only); not advertised")
                } else {
                    Answer::Refused(why)
                }
            }
            None => Answer::Replaced(1, "GDRSHIM_ADVERTISE_GDR=1: gdrshim registers GPU memory for verbs"),
        }
    }

    /// Whether `access(path, F_OK)`, which failed, should succeed instead.
    pub fn peer_memory_probe(&self, path: &[u8], mode: i32) -> Answer {
        if !self.advertise || path != PEER_MEMORY_PROBE_PATH || mode != libc::F_OK {
            return Answer::Unchanged;
        }
        match self.why_not() {
            Some(why) => Answer::Refused(why),
            None => Answer::Replaced(0, "GDRSHIM_ADVERTISE_GDR=1: gdrshim takes the peer-memory client's place"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const ON: Policy = Policy { advertise: true, hide_for_test: false, registering: true, flush_disabled: false };

    #[test]
    fn only_when_asked_and_registering() {
        assert_eq!(Policy::default().device_attribute(116, 0), Answer::Unchanged);
        assert!(matches!(ON.device_attribute(116, 0), Answer::Replaced(1, _)));
        assert_eq!(ON.device_attribute(116, 1), Answer::Unchanged, "native support is left alone");
        assert_eq!(ON.device_attribute(117, 0), Answer::Unchanged, "only the GDR attribute");
        let shadow = Policy { registering: false, ..ON };
        assert!(matches!(shadow.device_attribute(116, 0), Answer::Refused(w) if w.contains("GDRSHIM_MODE")));
    }

    #[test]
    fn never_with_the_flush_disabled() {
        let p = Policy { flush_disabled: true, ..ON };
        assert!(matches!(p.device_attribute(116, 0), Answer::Refused(w) if w.contains("NCCL_GDR_FLUSH_DISABLE")));
        assert!(matches!(p.peer_memory_probe(PEER_MEMORY_PROBE_PATH, libc::F_OK), Answer::Refused(_)));
    }

    #[test]
    fn test_hiding() {
        let hide = Policy { hide_for_test: true, advertise: false, ..ON };
        assert!(matches!(hide.device_attribute(116, 1), Answer::Replaced(0, _)));
        assert!(matches!(Policy { hide_for_test: true, ..ON }.device_attribute(116, 1), Answer::Replaced(1, w) if w.contains("ADVERTISE")));
        let hide_shadow = Policy { hide_for_test: true, registering: false, ..ON };
        assert!(matches!(hide_shadow.device_attribute(116, 1), Answer::Replaced(0, _)));
    }

    #[test]
    fn peer_memory_probe_is_one_exact_path() {
        assert!(matches!(ON.peer_memory_probe(PEER_MEMORY_PROBE_PATH, libc::F_OK), Answer::Replaced(0, _)));
        assert_eq!(ON.peer_memory_probe(b"/sys/module/nvidia_peermem/version", libc::F_OK), Answer::Unchanged);
        assert_eq!(ON.peer_memory_probe(b"/sys/kernel/mm/memory_peers/nv_mem/version2", libc::F_OK), Answer::Unchanged);
        assert_eq!(ON.peer_memory_probe(PEER_MEMORY_PROBE_PATH, libc::R_OK), Answer::Unchanged);
        assert_eq!(Policy::default().peer_memory_probe(PEER_MEMORY_PROBE_PATH, libc::F_OK), Answer::Unchanged);
    }
}
