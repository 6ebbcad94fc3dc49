//! What gdrshim answers when a program asks CUDA whether GPUDirect RDMA works:
//!
//! - `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124): 1 while gdrshim serves dma-bufs (the DMA-BUF
//!   route in register mode), since `cuMemGetHandleForAddressRange` then works: gdrshim serves
//!   what libcuda refuses. NCCL asks it before it uses its own DMA-BUF path.
//! - `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (116): NCCL's GPU-side gate, asked through
//!   cudart. Opt-in (`GDRSHIM_ADVERTISE_GDR=1`, the "stock NCCL without a rebuild" route), and
//!   only while a route registers GPU memory here, never with NCCL's receive-side flush turned off
//!   (`NCCL_GDR_FLUSH_DISABLE`): on GPUs before sm_90 GDR without that flush gives stale data.
//!
//! gdrshim never claims a peer-memory client: NCCL's nv_mem probe is left to the kernel.
#![forbid(unsafe_code)]

use crate::route::Route;

/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (cuda.h).
pub const ATTR_GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (cuda.h).
pub const ATTR_DMA_BUF_SUPPORTED: i32 = 124;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `GDRSHIM_ADVERTISE_GDR=1`.
    pub advertise: bool,
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
        if self.route.is_none() {
            Some("gdrshim registers nothing here (GDRSHIM_MODE is not register, the driver ABI is unknown, or no route works)")
        } else if self.flush_disabled {
            Some("NCCL_GDR_FLUSH_DISABLE is set: GPUs before sm_90 need that flush, without it received data can be stale")
        } else {
            None
        }
    }

    /// The value to return for `cuDeviceGetAttribute(attrib)` whose driver answer was `real`.
    pub fn device_attribute(&self, attrib: i32, real: i32) -> Answer {
        match attrib {
            ATTR_GPU_DIRECT_RDMA_SUPPORTED => self.gdr_attribute(real),
            ATTR_DMA_BUF_SUPPORTED => self.dmabuf_attribute(real),
            _ => Answer::Unchanged,
        }
    }

    fn gdr_attribute(&self, real: i32) -> Answer {
        let driver = if self.hide_gdr_for_test { 0 } else { real };
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

    fn dmabuf_attribute(&self, real: i32) -> Answer {
        let driver = if self.hide_dmabuf_for_test { 0 } else { real };
        if driver != 0 {
            return Answer::Unchanged;
        }
        if self.route == Some(Route::Dmabuf) {
            return Answer::Replaced(1, "gdrshim exports dma-bufs of this process's GPU memory (route dmabuf)");
        }
        if driver != real {
            Answer::Replaced(0, "GDRSHIM_TEST_HIDE_DMABUF=1 (test only)")
        } else {
            Answer::Unchanged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const ON: Policy = Policy {
        advertise: true,
        hide_gdr_for_test: false,
        hide_dmabuf_for_test: false,
        route: Some(Route::Nv503c),
        flush_disabled: false,
    };

    #[test]
    fn only_when_asked_and_registering() {
        assert_eq!(Policy::default().device_attribute(116, 0), Answer::Unchanged);
        assert!(matches!(ON.device_attribute(116, 0), Answer::Replaced(1, _)));
        assert!(matches!(Policy { route: Some(Route::Dmabuf), ..ON }.device_attribute(116, 0), Answer::Replaced(1, _)));
        assert_eq!(ON.device_attribute(116, 1), Answer::Unchanged, "native support is left alone");
        assert_eq!(ON.device_attribute(117, 0), Answer::Unchanged, "only the GDR and DMA-BUF attributes");
        let none = Policy { route: None, ..ON };
        assert!(matches!(none.device_attribute(116, 0), Answer::Refused(w) if w.contains("GDRSHIM_MODE")));
    }

    #[test]
    fn never_with_the_flush_disabled() {
        let p = Policy { flush_disabled: true, ..ON };
        assert!(matches!(p.device_attribute(116, 0), Answer::Refused(w) if w.contains("NCCL_GDR_FLUSH_DISABLE")));
    }

    #[test]
    fn dmabuf_supported_only_while_gdrshim_serves_dmabufs() {
        let dmabuf = Policy { advertise: false, route: Some(Route::Dmabuf), ..ON };
        assert!(matches!(dmabuf.device_attribute(124, 0), Answer::Replaced(1, _)));
        assert_eq!(dmabuf.device_attribute(124, 1), Answer::Unchanged, "libcuda's own yes stays");
        assert_eq!(ON.device_attribute(124, 0), Answer::Unchanged, "the NV503C route serves no dma-buf");
        assert_eq!(Policy { route: None, ..dmabuf }.device_attribute(124, 0), Answer::Unchanged);
        // GeForce emulation: libcuda's yes hidden; gdrshim's own answer decides
        let hide = Policy { hide_dmabuf_for_test: true, ..dmabuf };
        assert!(matches!(hide.device_attribute(124, 1), Answer::Replaced(1, _)));
        assert!(matches!(Policy { route: None, ..hide }.device_attribute(124, 1), Answer::Replaced(0, _)));
    }

    #[test]
    fn test_hiding() {
        let hide = Policy { hide_gdr_for_test: true, advertise: false, ..ON };
        assert!(matches!(hide.device_attribute(116, 1), Answer::Replaced(0, _)));
        assert!(
            matches!(Policy { hide_gdr_for_test: true, ..ON }.device_attribute(116, 1), Answer::Replaced(1, w) if w.contains("ADVERTISE"))
        );
        let hide_shadow = Policy { hide_gdr_for_test: true, route: None, ..ON };
        assert!(matches!(hide_shadow.device_attribute(116, 1), Answer::Replaced(0, _)));
    }
}
