//! Which registration route this process takes, decided once at the first need (a GPU
//! registration, a CUDA capability question), from RM's answers, the loader's, and the machine's
//! peer-memory module; readable without the core's lock once decided.

use crate::config::Config;
use crate::route::{self, Facts, Route};
use crate::state::Core;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

/// The route decision: not decided yet, none, or a route.
#[derive(Default)]
pub struct RouteChoice {
    state: AtomicU8,
}

const UNDECIDED: u8 = 0;
const NONE: u8 = 1;
const DMABUF: u8 = 2;
const NV503C: u8 = 3;

impl RouteChoice {
    /// The decision so far: `None` not decided yet; `Some(None)` no route works here.
    pub fn decided(&self) -> Option<Option<Route>> {
        match self.state.load(Relaxed) {
            DMABUF => Some(Some(Route::Dmabuf)),
            NV503C => Some(Some(Route::Nv503c)),
            NONE => Some(None),
            _ => None,
        }
    }

    /// What the decision needs from the loader, asked with no lock of ours held: whether
    /// libibverbs has `ibv_reg_dmabuf_mr` may take a `dlopen`, which waits for the loader's lock,
    /// and a thread holding that (a library's constructor) may wait for a hook that needs ours.
    /// `None` once decided (nothing to ask). A yes is kept (a registration of host memory before
    /// the decision asks too, and must stay cheap); a no is asked again, since libibverbs may be
    /// loaded later.
    pub fn loader_facts(&self, cfg: &Config) -> Option<bool> {
        static VERBS_DMABUF: AtomicBool = AtomicBool::new(false);
        if self.state.load(Relaxed) != UNDECIDED || cfg.route == route::Wish::Nv503c {
            return None;
        }
        if VERBS_DMABUF.load(Relaxed) {
            return Some(true);
        }
        let yes = verbs_has_dmabuf();
        VERBS_DMABUF.store(yes, Relaxed);
        Some(yes)
    }

    /// Decides the route with the core's lock held (once; later calls read the decision), with
    /// the loader's answer asked before the lock was taken ([`loader_facts`](Self::loader_facts)),
    /// on a driver whose export ABI is `export_abi`.
    pub fn decide<R: crate::registrar::Rm>(
        &self,
        c: &mut Core<R>,
        cfg: &Config,
        export_abi: bool,
        verbs_dmabuf: Option<bool>,
    ) -> Option<Route> {
        if let Some(r) = c.registrar.route() {
            return r.clone().ok();
        }
        let Core { tracker, registrar, rm, .. } = c;
        // DMA-BUF's facts are asked only where that route may be taken
        let may_dmabuf = cfg.route != route::Wish::Nv503c && export_abi;
        let gpu_dmabuf = if may_dmabuf { registrar.probe_gpu_dmabuf(tracker, rm) } else { None };
        // asked before the program has a GPU whose capability RM can tell (a device attribute
        // read before CUDA made its context): nothing is known yet, so nothing is decided
        if may_dmabuf
            && gpu_dmabuf.is_none()
            && !tracker.devices().iter().any(|&(c, d)| tracker.subdevice_of(c, d).is_some())
        {
            return None;
        }
        let verbs_dmabuf = may_dmabuf && verbs_dmabuf == Some(true);
        let facts = Facts { gpu_dmabuf, export_abi, verbs_dmabuf, peermem: peermem_loaded(cfg) };
        let (state, r) = match route::choose(cfg.route, &facts) {
            route::Choice::Use(r) => {
                crate::log_info!(
                    "registration route {} (GDRSHIM_ROUTE={}; {facts:?})",
                    r.name(),
                    cfg.route.name()
                );
                (if r == Route::Dmabuf { DMABUF } else { NV503C }, Ok(r))
            }
            route::Choice::None(lacks) => {
                crate::log_warn!(
                    "no registration route works here (GDRSHIM_ROUTE={}): {lacks}; every verbs call passes through untouched",
                    cfg.route.name()
                );
                (NONE, Err(lacks.to_string()))
            }
        };
        registrar.set_route(r.clone());
        self.state.store(state, Relaxed);
        r.ok()
    }
}

/// Whether nvidia-peermem (the NV503C route's reader) is loaded.
fn peermem_loaded(cfg: &Config) -> bool {
    if cfg.knobs.assume_peermem {
        return true;
    }
    let root =
        cfg.knobs.dev_dir.as_deref().map(|d| format!("{d}/sys")).unwrap_or_else(|| "/sys".into());
    ["module/nvidia_peermem", "kernel/mm/memory_peers/nv_mem", "kernel/mm/memory_peers/nv_mem_nc"]
        .iter()
        .any(|p| {
            let Ok(c) = std::ffi::CString::new(format!("{root}/{p}")) else { return false };
            let e = crate::sys::errno();
            // SAFETY: a valid C string; access has no other preconditions.
            let ok = unsafe { libc::access(c.as_ptr(), libc::F_OK) } == 0;
            crate::sys::set_errno(e);
            ok
        })
}

/// libibverbs (loaded in any scope, or loadable) has `ibv_reg_dmabuf_mr` (IBVERBS_1.12).
fn verbs_has_dmabuf() -> bool {
    let found = crate::real::in_loaded_library(b"libibverbs.so", c"ibv_reg_dmabuf_mr");
    if !found.is_null() {
        return true;
    }
    // not loaded yet: look without keeping it
    // SAFETY: dlopen of a library by name with lazy binding; the handle is closed below.
    let h =
        unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        return false;
    }
    // SAFETY: a lookup on the handle just obtained, with valid C strings.
    let p = crate::real::real_dlvsym().map_or(core::ptr::null_mut(), |f| unsafe {
        f(h, c"ibv_reg_dmabuf_mr".as_ptr(), c"IBVERBS_1.12".as_ptr())
    });
    if let Some(close) = crate::real::dlclose() {
        // SAFETY: the handle dlopen gave above.
        unsafe { close(h) };
    }
    !p.is_null()
}
