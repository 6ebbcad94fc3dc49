//! One GPU's entries: 24 bytes each in an ordered tree (a job holds a million).
#![forbid(unsafe_code)]

use super::{MemRef, Origin};
use std::collections::BTreeMap;

/// Set in `Entry::offset_bits` when the entry's extent is also a UVM external range, which then
/// needs no record of its own (the usual allocation: one range, mapped whole, once).
const CLAIMS_RANGE: u64 = 1 << 63;
/// Offsets into RM memory at or above this cannot be real; such a map is not kept.
pub const OFFSET_LIMIT: u64 = CLAIMS_RANGE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub end: u64,
    offset_bits: u64,
    pub mem: MemRef,
}

impl Entry {
    pub fn new(end: u64, offset: u64, mem: MemRef) -> Entry {
        debug_assert!(offset < OFFSET_LIMIT);
        Entry { end, offset_bits: offset, mem }
    }

    /// Offset into `mem` of this entry's first byte.
    pub fn offset(&self) -> u64 {
        self.offset_bits & !CLAIMS_RANGE
    }

    pub fn claims_range(&self) -> bool {
        self.offset_bits & CLAIMS_RANGE != 0
    }

    pub fn claiming(self) -> Entry {
        Entry { offset_bits: self.offset_bits | CLAIMS_RANGE, ..self }
    }

    /// The same memory, cut to `[start, end)` of an entry that began at `was`: a cut never
    /// claims its range.
    pub fn cut(&self, was: u64, start: u64, end: u64) -> Entry {
        Entry::new(end, self.offset() + (start - was), self.mem)
    }

    /// The map call of an entry that is one whole call.
    pub fn whole(&self, start: u64) -> Origin {
        Origin { base: start, length: self.end - start, offset: self.offset() }
    }
}

/// An entry that is a whole UVM map call (nearly all) keeps no origin; one cut out of a larger
/// call by an unmap or an overlapping map keeps it in `cut`.
#[derive(Default, Clone)]
pub(super) struct GpuMap {
    pub entries: BTreeMap<u64, Entry>,
    cut: BTreeMap<u64, Origin>,
}

impl GpuMap {
    pub fn origin(&self, start: u64, e: &Entry) -> Origin {
        if self.cut.is_empty() {
            return e.whole(start);
        }
        self.cut.get(&start).copied().unwrap_or_else(|| e.whole(start))
    }

    pub fn insert(&mut self, start: u64, e: Entry, origin: Origin) {
        if origin != e.whole(start) {
            self.cut.insert(start, origin);
        } else if !self.cut.is_empty() {
            self.cut.remove(&start);
        }
        self.entries.insert(start, e);
    }

    pub fn remove(&mut self, start: u64) -> Option<(Entry, Origin)> {
        let e = self.entries.remove(&start)?;
        let o = if self.cut.is_empty() { None } else { self.cut.remove(&start) };
        Some((e, o.unwrap_or_else(|| e.whole(start))))
    }

    /// The entry covering `addr`.
    pub fn at(&self, addr: u64) -> Option<(u64, &Entry)> {
        self.entries.range(..=addr).next_back().filter(|(_, e)| addr < e.end).map(|(&s, e)| (s, e))
    }

    #[cfg(test)]
    pub fn cuts(&self) -> impl Iterator<Item = (&u64, &Origin)> {
        self.cut.iter()
    }
}
