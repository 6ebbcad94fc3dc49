//! The program's CUDA contexts, as its calls made them: which is each device's primary context
//! (learned from the program's own `cuDevicePrimaryCtxRetain`) and which it created
//! (`cuCtxCreate`), so that a context's end ends exactly the allocations made in it
//! (`VaMap::end_owned`).
//!
//! A primary context's handle is learned from the retains the program makes, never by asking
//! libcuda at the reset: a retain of ours could make a new primary context (its GPU memory and a
//! changed state of the program's) where another thread reset it in between. A retain that no
//! hook saw leaves a context of unknown kind, which any primary context's end ends: the reset of
//! one GPU may then refuse more than it must, never serve memory CUDA freed.
#![forbid(unsafe_code)]

use crate::abi::Uuid;
use rustc_hash::FxHashSet as HashSet;

/// A CUDA context ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextEnd {
    /// `cuCtxDestroy` of the context with this handle.
    Destroyed { ctx: u64 },
    /// Device `dev`'s primary context (GPU `gpu`, `None` where its UUID is unknown) was reset or
    /// released by its last holder.
    Primary { dev: i32, gpu: Option<Uuid> },
}

#[derive(Clone, Debug, Default)]
pub struct Contexts {
    /// `(device, handle)`: each device's primary context, as its latest retain answered.
    primaries: Vec<(i32, u64)>,
    /// The contexts the program created and has not destroyed.
    created: HashSet<u64>,
}

impl Contexts {
    /// `ctx` is device `dev`'s primary context (`Some(dev)`), or one the program created.
    pub fn made(&mut self, ctx: u64, primary_of: Option<i32>) {
        // (a handle is reused once its context is gone: it names the new one only)
        self.forget(ctx);
        match primary_of {
            Some(dev) => {
                self.primaries.retain(|&(d, _)| d != dev);
                self.primaries.push((dev, ctx));
            }
            None => {
                self.created.insert(ctx);
            }
        }
    }

    /// Whether `end` ends context `ctx`: a destroy its own context; the end of a device's primary
    /// context that one, and every context of unknown kind (it may be that primary, retained
    /// where no hook saw it).
    pub fn ends(&self, end: ContextEnd, ctx: u64) -> bool {
        match end {
            ContextEnd::Destroyed { ctx: gone } => ctx == gone,
            ContextEnd::Primary { dev, .. } => {
                match self.primaries.iter().find(|&&(_, c)| c == ctx) {
                    Some(&(d, _)) => d == dev,
                    None => !self.created.contains(&ctx),
                }
            }
        }
    }

    /// `end` happened: the contexts it ended are known no longer.
    pub fn ended(&mut self, end: ContextEnd) {
        match end {
            ContextEnd::Destroyed { ctx } => self.forget(ctx),
            ContextEnd::Primary { dev, .. } => self.primaries.retain(|&(d, _)| d != dev),
        }
    }

    fn forget(&mut self, ctx: u64) {
        self.created.remove(&ctx);
        self.primaries.retain(|&(_, c)| c != ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P0: u64 = 0xc0;
    const P1: u64 = 0xc1;
    const MADE: u64 = 0xc102;
    const UNSEEN: u64 = 0xd00;

    #[test]
    fn a_primary_end_ends_its_own_and_those_of_unknown_kind() {
        let mut k = Contexts::default();
        k.made(P0, Some(0));
        k.made(P1, Some(1));
        k.made(MADE, None);
        let reset0 = ContextEnd::Primary { dev: 0, gpu: None };
        assert!(k.ends(reset0, P0));
        assert!(!k.ends(reset0, P1), "another GPU's primary context");
        assert!(!k.ends(reset0, MADE), "a context the program created");
        assert!(k.ends(reset0, UNSEEN), "a context no hook saw made may be this primary");
        let destroy = ContextEnd::Destroyed { ctx: MADE };
        assert!(k.ends(destroy, MADE) && !k.ends(destroy, P0) && !k.ends(destroy, UNSEEN));
        k.ended(reset0);
        assert!(k.ends(ContextEnd::Primary { dev: 1, gpu: None }, P0), "forgotten: unknown kind");
        k.ended(destroy);
        k.made(MADE, Some(0));
        assert!(k.ends(reset0, MADE), "a handle reused names its new context");
    }
}
