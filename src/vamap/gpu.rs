//! One GPU's entries (a job holds a million): 32 bytes each, ordered, with a radix over 2 MiB
//! granules in front of the tree for point lookups.
#![forbid(unsafe_code)]

use super::{granule, Allocation, MemRef, Origin};
use rustc_hash::FxHashMap as HashMap;
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
    /// `mem`'s allocation as the map knew it when this entry was made; it cannot change while
    /// the entry lives (a handle allocated again loses its mappings first), so a lookup answers
    /// class and parent without a second table's cache miss.
    pub alloc: Allocation,
}

impl Entry {
    pub fn new(end: u64, offset: u64, mem: MemRef, alloc: Allocation) -> Entry {
        debug_assert!(offset < OFFSET_LIMIT);
        Entry { end, offset_bits: offset, mem, alloc }
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
        Entry::new(end, self.offset() + (start - was), self.mem, self.alloc)
    }

    /// The map call of an entry that is one whole call.
    pub fn whole(&self, start: u64) -> Origin {
        Origin { base: start, length: self.end - start, offset: self.offset() }
    }
}

/// An entry that is a whole UVM map call (nearly all) keeps no origin; one cut out of a larger
/// call by an unmap or an overlapping map keeps it in `cut`.
///
/// Entries live in a slab (start and entry, 40 bytes) ordered by a tree of slot numbers; a
/// radix of 2 MiB granules names, per granule, the slot of an entry that touches it. A point
/// lookup ([`at`](Self::at)) reads the radix leaf and the slot (two cache misses at a million
/// entries, against a dozen for a tree descent) and checks that the slot's entry covers the
/// address: entries never overlap, so an entry that covers it is the answer, and a hint that
/// is stale or absent only costs the tree descent. Correctness never rests on the radix.
#[derive(Default, Clone)]
pub(super) struct GpuMap {
    tree: BTreeMap<u64, u32>,
    slab: Vec<(u64, Entry)>,
    free_slots: Vec<u32>,
    hints: HashMap<u64, Box<Leaf>>,
    cut: BTreeMap<u64, Origin>,
}

/// The start of a free slab slot: no entry starts there (it would end past the address space).
const FREE: u64 = u64::MAX;
/// Granules per radix leaf (a leaf covers 128 MiB in 260 bytes).
const LEAF_BITS: u32 = 6;
const LEAF_LEN: usize = 1 << LEAF_BITS;

/// One radix leaf: slot + 1 per granule (0: no hint), and how many are set.
#[derive(Clone)]
struct Leaf {
    slots: [u32; LEAF_LEN],
    set: u32,
}

/// The granules an entry's hints cover: all it touches, or none when it is wider than
/// [`granule::MAX_SPAN`] (its lookups then take the tree).
fn granules(start: u64, end: u64) -> std::ops::RangeInclusive<u64> {
    let span = granule::touched(start, end - start);
    if !granule::kept(&span) {
        #[allow(clippy::reversed_empty_ranges)]
        return 1..=0;
    }
    span
}

fn leaf_of(granule: u64) -> (u64, usize) {
    (granule >> LEAF_BITS, (granule & (LEAF_LEN as u64 - 1)) as usize)
}

impl GpuMap {
    pub fn origin(&self, start: u64, e: &Entry) -> Origin {
        if self.cut.is_empty() {
            return e.whole(start);
        }
        self.cut.get(&start).copied().unwrap_or_else(|| e.whole(start))
    }

    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn insert(&mut self, start: u64, e: Entry, origin: Origin) {
        debug_assert!(start < e.end);
        if origin != e.whole(start) {
            self.cut.insert(start, origin);
        } else if !self.cut.is_empty() {
            self.cut.remove(&start);
        }
        let slot = match self.tree.get(&start) {
            Some(&slot) => {
                let (_, old) = self.slab[slot as usize];
                self.unhint(start, old.end, slot);
                slot
            }
            None => {
                let slot = match self.free_slots.pop() {
                    Some(slot) => slot,
                    None => {
                        self.slab.push((FREE, e));
                        (self.slab.len() - 1) as u32
                    }
                };
                self.tree.insert(start, slot);
                slot
            }
        };
        self.slab[slot as usize] = (start, e);
        for g in granules(start, e.end) {
            let (key, i) = leaf_of(g);
            let leaf = self.hints.entry(key).or_insert_with(|| Box::new(Leaf { slots: [0; LEAF_LEN], set: 0 }));
            if leaf.slots[i] == 0 {
                leaf.set += 1;
            }
            leaf.slots[i] = slot + 1;
        }
    }

    pub fn remove(&mut self, start: u64) -> Option<(Entry, Origin)> {
        let slot = self.tree.remove(&start)?;
        let (_, e) =
            std::mem::replace(&mut self.slab[slot as usize], (FREE, Entry::new(0, 0, MemRef { client: 0, memory: 0 }, Allocation::UNSEEN)));
        self.unhint(start, e.end, slot);
        self.free_slots.push(slot);
        let o = if self.cut.is_empty() { None } else { self.cut.remove(&start) };
        Some((e, o.unwrap_or_else(|| e.whole(start))))
    }

    /// Clears the hints of `[start, end)` that name `slot`; a leaf with none left goes.
    fn unhint(&mut self, start: u64, end: u64, slot: u32) {
        for g in granules(start, end) {
            let (key, i) = leaf_of(g);
            let Some(leaf) = self.hints.get_mut(&key) else { continue };
            if leaf.slots[i] == slot + 1 {
                leaf.slots[i] = 0;
                leaf.set -= 1;
                if leaf.set == 0 {
                    self.hints.remove(&key);
                }
            }
        }
    }

    /// The entry covering `addr`.
    pub fn at(&self, addr: u64) -> Option<(u64, &Entry)> {
        let (key, i) = leaf_of(granule::of(addr));
        if let Some(slot) = self.hints.get(&key).map(|l| l.slots[i]).filter(|&s| s != 0) {
            let (s, e) = &self.slab[slot as usize - 1];
            if *s != FREE && *s <= addr && addr < e.end {
                return Some((*s, e));
            }
        }
        self.range(..=addr).next_back().filter(|(_, e)| addr < e.end)
    }

    /// The entry that starts at `start`.
    pub fn get(&self, start: u64) -> Option<&Entry> {
        self.tree.get(&start).map(|&slot| &self.slab[slot as usize].1)
    }

    /// The entries whose start lies in `r`, in order.
    pub fn range<R: std::ops::RangeBounds<u64>>(&self, r: R) -> impl DoubleEndedIterator<Item = (u64, &Entry)> {
        self.tree.range(r).map(|(&s, &slot)| (s, &self.slab[slot as usize].1))
    }

    /// Every entry, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> {
        self.range(..)
    }

    #[cfg(test)]
    pub fn cuts(&self) -> impl Iterator<Item = (&u64, &Origin)> {
        self.cut.iter()
    }

    /// The radix's own bookkeeping agrees with the tree: every hint names a live entry that
    /// touches its granule, and leaves count their hints.
    #[cfg(test)]
    pub fn check_hints(&self) {
        for (&key, leaf) in &self.hints {
            let set = leaf.slots.iter().filter(|&&s| s != 0).count() as u32;
            assert_eq!(set, leaf.set, "leaf {key:#x} counts its hints");
            assert!(set > 0, "an empty leaf is dropped");
            for (i, &s) in leaf.slots.iter().enumerate().filter(|(_, &s)| s != 0) {
                let (start, e) = self.slab[s as usize - 1];
                assert_ne!(start, FREE, "a hint names a free slot");
                assert_eq!(self.tree.get(&start), Some(&(s - 1)));
                let g = (key << LEAF_BITS) | i as u64;
                assert!(granules(start, e.end).contains(&g), "a hint names an entry that touches its granule");
            }
        }
        assert_eq!(self.slab.len(), self.tree.len() + self.free_slots.len());
    }
}
