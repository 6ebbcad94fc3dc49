//! Which CUDA context each of the program's allocations goes with, so that a context's end ends
//! exactly the allocations CUDA frees with it (`owned::end_of`).
//!
//! CUDA frees a context's own allocations with it (`cuMemAlloc*`, `cuMemAllocPitch`, IPC handles
//! opened in it); memory of other contexts stays, and VMM memory (`cuMemCreate` + `cuMemMap`) and
//! the stream-ordered pools' (per device) belong to no context: they end by their own frees.
//!
//! Nearly every allocation of a job is made in one context (its GPU's primary), so a tag costs
//! nothing there: the first allocation's context is the usual one, and only an allocation of
//! another context is kept, as a span of VA. A span covers the allocation's bytes, so the pieces
//! of an allocation cut by a partial unmap keep its context.
#![forbid(unsafe_code)]

use super::touch::Tree;

/// The CUDA context an allocation of the program's goes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextTag {
    /// The hook could not learn it: ended by any context's end on its GPU (fail safe).
    Unknown,
    /// Memory of no context (VMM, a pool's): no context's end ends it.
    NoContext,
    /// Made in the context with this handle.
    Of(u64),
}

/// The contexts of the program's allocations: spans of VA tagged with another context than the
/// usual one. A span is cut only where every allocation over it ends (a free, an unmap by the
/// program, its context's end) or another is recorded: where the driver takes memory back, the
/// same VA may still be an allocation on another GPU, whose context must stay known. A stale span
/// tags no allocation.
#[derive(Clone, Debug, Default)]
pub struct Tags {
    /// `base -> (end, tag)`, non-overlapping.
    spans: Tree<u64, (u64, ContextTag)>,
    /// The context of every byte no span covers: the first allocation's (none before it).
    usual: Option<ContextTag>,
}

impl Tags {
    /// The context of the allocation that holds `addr`.
    pub fn at(&self, addr: u64) -> ContextTag {
        match self.spans.range(..=addr).next_back() {
            Some((_, &(end, tag))) if end > addr => tag,
            _ => self.usual.unwrap_or(ContextTag::Unknown),
        }
    }

    /// `[base, end)` is an allocation of context `tag` from now on.
    pub fn record(&mut self, base: u64, end: u64, tag: ContextTag) {
        self.cut(base, end);
        if *self.usual.get_or_insert(tag) != tag {
            self.spans.insert(base, (end, tag));
        }
    }

    /// `[base, end)` is no allocation's any more: the spans over it are cut there.
    pub fn cut(&mut self, base: u64, end: u64) {
        if end <= base {
            return;
        }
        if let Some((&b, &(e, t))) = self.spans.range(..base).next_back() {
            if e > base {
                self.spans.insert(b, (base, t));
                if e > end {
                    self.spans.insert(end, (e, t));
                }
            }
        }
        let inside: Vec<(u64, (u64, ContextTag))> =
            self.spans.range(base..end).map(|(&b, &v)| (b, v)).collect();
        for (b, (e, t)) in inside {
            self.spans.remove(&b);
            if e > end {
                self.spans.insert(end, (e, t));
            }
        }
    }

    /// How many allocations carry a context other than the usual one (stale spans included).
    pub fn spans(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::ContextTag::{NoContext, Of, Unknown};
    use super::*;

    #[test]
    fn the_usual_context_costs_nothing_and_another_is_a_span() {
        let mut t = Tags::default();
        assert_eq!(t.at(0), Unknown, "nothing recorded");
        t.record(0, 0x1000, Of(7));
        t.record(0x1000, 0x2000, Of(7));
        assert_eq!((t.at(0x1800), t.spans()), (Of(7), 0), "the first context is the usual one");
        t.record(0x4000, 0x8000, Of(9));
        t.record(0x8000, 0x9000, NoContext);
        assert_eq!((t.at(0x4000), t.at(0x7fff), t.at(0x8000)), (Of(9), Of(9), NoContext));
        assert_eq!(t.at(0x9000), Of(7), "past every span: the usual context");
        t.cut(0x5000, 0x6000);
        assert_eq!((t.at(0x4fff), t.at(0x5000), t.at(0x6000)), (Of(9), Of(7), Of(9)));
        t.record(0x4000, 0x8000, Of(7));
        assert_eq!((t.at(0x4000), t.at(0x6000), t.spans()), (Of(7), Of(7), 1));
    }
}
