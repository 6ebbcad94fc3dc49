//! Which route makes GPU memory reachable for the NIC on this machine, and why.
//!
//! - DMA-BUF: gdrshim exports the exact pieces through NV_ESC_EXPORT_TO_DMABUF_FD and registers
//!   them with `ibv_reg_dmabuf_mr`. Read by the kernel's RDMA core (`ib_umem_dmabuf`): the inbox
//!   stack is enough.
//! - NV503C: gdrshim registers the memory with NV50_THIRD_PARTY_P2P before the verbs call. Its
//!   only reader is nvidia-peermem, which loads only on MLNX_OFED/DOCA-OFED kernels; without it
//!   this route cannot work.
//!
//! The choice is made once per process from [`Facts`], when first needed.
#![forbid(unsafe_code)]

use std::fmt;

/// `GDRSHIM_ROUTE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wish {
    Auto,
    Dmabuf,
    Nv503c,
}

impl Wish {
    pub fn parse(v: &str) -> Option<Wish> {
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Wish::Auto),
            "dmabuf" | "dma-buf" => Some(Wish::Dmabuf),
            "nv503c" | "503c" | "peermem" => Some(Wish::Nv503c),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Wish::Auto => "auto",
            Wish::Dmabuf => "dmabuf",
            Wish::Nv503c => "nv503c",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Dmabuf,
    Nv503c,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Dmabuf => "dmabuf",
            Route::Nv503c => "nv503c",
        }
    }
}

/// What the machine offers each route, as far as the process can see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// RM's NV2080_CTRL_GPU_INFO_INDEX_DMABUF_CAPABILITY of the GPU: `None` when it could not be
    /// asked (no GPU yet, or a branch whose control size is unknown).
    pub gpu_dmabuf: Option<bool>,
    /// The driver branch's export struct is one gdrshim knows (570 and later).
    pub export_abi: bool,
    /// libibverbs has `ibv_reg_dmabuf_mr@IBVERBS_1.12` (rdma-core 34 and later).
    pub verbs_dmabuf: bool,
    /// A peer-memory client is loaded: `/sys/module/nvidia_peermem` or
    /// `/sys/kernel/mm/memory_peers/nv_mem*`.
    pub peermem: bool,
}

/// The outcome: a route, or none with what each route lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Use(Route),
    None(Lacks),
}

/// What each route lacks here (empty: nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lacks {
    pub dmabuf: Vec<&'static str>,
    pub nv503c: Vec<&'static str>,
}

impl fmt::Display for Lacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[&str]| if v.is_empty() { "nothing".to_string() } else { v.join(", ") };
        write!(f, "DMA-BUF lacks {}; NV503C lacks {}", list(&self.dmabuf), list(&self.nv503c))
    }
}

impl Facts {
    pub fn lacks(&self) -> Lacks {
        let mut l = Lacks::default();
        match self.gpu_dmabuf {
            Some(true) => {}
            Some(false) => l.dmabuf.push(
                "the GPU's dma-buf capability (RM says no: kernel without dma-buf, or APM on)",
            ),
            None => l
                .dmabuf
                .push("a known dma-buf capability of the GPU (could not be asked on this driver)"),
        }
        if !self.export_abi {
            l.dmabuf.push("a driver branch whose export struct gdrshim knows (570 or later)");
        }
        if !self.verbs_dmabuf {
            l.dmabuf.push("ibv_reg_dmabuf_mr in libibverbs (rdma-core 34 or later)");
        }
        if !self.peermem {
            l.nv503c.push("nvidia-peermem (it loads only with MLNX_OFED/DOCA-OFED)");
        }
        l
    }
}

/// The route for `wish` given `facts`. Auto prefers DMA-BUF: it needs no out-of-tree RDMA stack.
pub fn choose(wish: Wish, facts: &Facts) -> Choice {
    let l = facts.lacks();
    let dmabuf = l.dmabuf.is_empty();
    let nv503c = l.nv503c.is_empty();
    match wish {
        Wish::Auto if dmabuf => Choice::Use(Route::Dmabuf),
        Wish::Auto if nv503c => Choice::Use(Route::Nv503c),
        Wish::Dmabuf if dmabuf => Choice::Use(Route::Dmabuf),
        Wish::Nv503c if nv503c => Choice::Use(Route::Nv503c),
        _ => Choice::None(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the three things the issue names: peer memory loaded or not, GPU
    /// dma-buf capable or not, libibverbs with or without 1.12.
    #[test]
    fn the_route_matrix() {
        for peermem in [false, true] {
            for capable in [false, true] {
                for verbs in [false, true] {
                    let f = Facts {
                        gpu_dmabuf: Some(capable),
                        export_abi: true,
                        verbs_dmabuf: verbs,
                        peermem,
                    };
                    let got = choose(Wish::Auto, &f);
                    let want = if capable && verbs {
                        Choice::Use(Route::Dmabuf)
                    } else if peermem {
                        Choice::Use(Route::Nv503c)
                    } else {
                        Choice::None(f.lacks())
                    };
                    assert_eq!(got, want, "peermem={peermem} capable={capable} verbs={verbs}");
                    if let Choice::None(l) = got {
                        let text = l.to_string();
                        assert!(text.contains("nvidia-peermem"), "{text}");
                        assert_eq!(text.contains("ibv_reg_dmabuf_mr"), !verbs, "{text}");
                        assert_eq!(text.contains("dma-buf capability"), !capable, "{text}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_forced_route_is_used_only_where_it_can_work() {
        let all =
            Facts { gpu_dmabuf: Some(true), export_abi: true, verbs_dmabuf: true, peermem: true };
        assert_eq!(choose(Wish::Nv503c, &all), Choice::Use(Route::Nv503c));
        assert_eq!(choose(Wish::Dmabuf, &all), Choice::Use(Route::Dmabuf));
        let no_peermem = Facts { peermem: false, ..all };
        assert!(matches!(choose(Wish::Nv503c, &no_peermem), Choice::None(_)));
        let old_driver = Facts { export_abi: false, ..all };
        assert_eq!(choose(Wish::Auto, &old_driver), Choice::Use(Route::Nv503c));
        assert!(
            matches!(choose(Wish::Dmabuf, &old_driver), Choice::None(l) if l.to_string().contains("570"))
        );
        let unknown = Facts { gpu_dmabuf: None, peermem: false, ..all };
        assert!(matches!(choose(Wish::Auto, &unknown), Choice::None(_)));
    }

    #[test]
    fn wish_names() {
        assert_eq!(Wish::parse(" DMABUF "), Some(Wish::Dmabuf));
        assert_eq!(Wish::parse("nv503c"), Some(Wish::Nv503c));
        assert_eq!(Wish::parse("auto"), Some(Wish::Auto));
        assert_eq!(Wish::parse("both"), None);
    }
}
