//! One GPU's entries (a job holds a million), ordered by a tree of their starts and kept in cells
//! of 2 MiB granules, so that a point lookup reads one cell.
#![forbid(unsafe_code)]

use super::cells::{Cell, Cells, View, FREE};
use super::entry::Entry;
use super::granule;
use super::touch::Tree;
use super::types::Origin;

/// An entry that is a whole UVM map call (nearly all) keeps no origin; one cut out of a larger
/// call by an unmap or an overlapping map keeps it in `cut`.
///
/// Every granule below 2^48 has a cell (40 bytes, [`Cells`]). An entry lives in the cell of the
/// granule its start lies in, its home, unless another entry is at home there; then it lives in
/// `overflow`. Each other granule an entry touches is another's home or names ("hints") it. A
/// point lookup ([`at`](Self::at)) reads the cell of the address's granule and checks that its
/// entry covers the address: entries never overlap, so one that covers it is the answer. That
/// is one cache miss at a million entries, where a radix of slot numbers in front of a slab took
/// two (`docs/results/scale-2026-12-03d`); a hint, or an entry that does not cover the address,
/// costs a second read or the tree's descent. An empty cell proves that no entry touches its
/// granule (while no entry is too wide to hint), so a lookup of host memory or of VA not
/// mapped yet costs one read too. The tree says where each entry is; a hint is only believed
/// when its entry covers the address, and an empty cell only by that rule.
///
/// The price is a cell per granule, in leaves of 64 (128 MiB, 2.5 KiB): for allocations packed
/// in VA, as CUDA's are, 40 bytes per 2 MiB mapped (20 ppm), a 2 MiB allocation one cell, a 1 GiB
/// one 512; an allocation alone in its 128 MiB costs a whole leaf. Entries above 2^48 (5-level
/// paging) have no cells: they live in overflow and are found through the tree.
/// Every GPU's entries, by the GPU's UUID.
pub(super) type Gpus = rustc_hash::FxHashMap<crate::abi::Uuid, GpuMap>;

#[derive(Default, Clone)]
pub(super) struct GpuMap {
    /// start → [`IN_CELL`], or the entry's slot in `overflow`
    tree: Tree<u64, u32>,
    cells: Cells,
    overflow: Vec<(u64, Entry)>,
    free_overflow: Vec<u32>,
    cut: Tree<u64, Origin>,
    /// Entries wider than [`granule::MAX_SPAN`]: they hint nothing, so while there is one an
    /// empty cell proves nothing.
    wide: usize,
}

/// The tree's mark for an entry that lives in its home cell.
const IN_CELL: u32 = u32::MAX;

/// Wider than hints reach ([`granule::MAX_SPAN`]).
fn is_wide(start: u64, end: u64) -> bool {
    !granule::kept(&granule::touched(start, end - start))
}

/// The granules an entry touches, its home among them (callers skip it), or none when it is
/// wide (lookups there then take the tree).
fn granules(start: u64, end: u64) -> std::ops::RangeInclusive<u64> {
    let span = granule::touched(start, end - start);
    if !granule::kept(&span) {
        #[allow(clippy::reversed_empty_ranges)]
        return 1..=0;
    }
    span
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

    fn view(&self, granule: u64) -> View<'_> {
        self.cells.view(granule)
    }

    fn set_cell(&mut self, granule: u64, c: Cell) {
        self.cells.set(granule, c)
    }

    /// The entry at `start`, where the tree says it is (`None` only if the books disagree: the
    /// entry is then not found, never another's taken).
    fn entry_of(&self, start: u64, loc: u32) -> Option<&Entry> {
        let found = if loc == IN_CELL {
            match self.view(granule::of(start)) {
                View::Home(s, e) if s == start => Some(e),
                _ => None,
            }
        } else {
            self.overflow.get(loc as usize).filter(|(s, _)| *s == start).map(|(_, e)| e)
        };
        debug_assert!(found.is_some(), "the tree places {start:#x} where it is not");
        found
    }

    /// Takes the entry at `start` out of its overflow slot (`None` if the slot holds another).
    fn take_overflow(&mut self, slot: u32, start: u64) -> Option<Entry> {
        let held = self.overflow.get_mut(slot as usize).filter(|(s, _)| *s == start)?;
        let (_, e) = std::mem::replace(held, (FREE, Entry::NONE));
        self.free_overflow.push(slot);
        Some(e)
    }

    pub fn insert(&mut self, start: u64, e: Entry, origin: Origin) {
        debug_assert!(start < e.end);
        if origin != e.whole(start) {
            self.cut.insert(start, origin);
        } else if !self.cut.is_empty() {
            self.cut.remove(&start);
        }
        let home = granule::of(start);
        match self.tree.get(&start).copied() {
            Some(loc) => {
                if let Some(old_end) = self.entry_of(start, loc).map(|old| old.end) {
                    self.unhint(start, old_end);
                    self.wide -= usize::from(is_wide(start, old_end));
                }
                self.wide += usize::from(is_wide(start, e.end));
                if loc == IN_CELL {
                    self.set_cell(home, Cell::home(start, e));
                } else if let Some(held) =
                    self.overflow.get_mut(loc as usize).filter(|(s, _)| *s == start)
                {
                    *held = (start, e);
                }
            }
            None => {
                let loc = if !Cells::covers(home) || matches!(self.view(home), View::Home(..)) {
                    match self.free_overflow.pop() {
                        Some(slot) => {
                            self.overflow[slot as usize] = (start, e);
                            slot
                        }
                        None => {
                            self.overflow.push((start, e));
                            (self.overflow.len() - 1) as u32
                        }
                    }
                } else {
                    self.set_cell(home, Cell::home(start, e));
                    IN_CELL
                };
                self.tree.insert(start, loc);
                self.wide += usize::from(is_wide(start, e.end));
            }
        }
        for g in granules(start, e.end).filter(|&g| g != home) {
            if !matches!(self.view(g), View::Home(..)) {
                self.set_cell(g, Cell::hint(start));
            }
        }
    }

    /// Takes the entry at `start` out of the tree and its place. `None` if there is none (or
    /// the books disagree: it is then forgotten, never another's taken).
    pub fn remove(&mut self, start: u64) -> Option<(Entry, Origin)> {
        let loc = self.tree.remove(&start)?;
        let cut = if self.cut.is_empty() { None } else { self.cut.remove(&start) };
        let e = if loc == IN_CELL {
            let home = granule::of(start);
            let e = *self.entry_of(start, IN_CELL)?;
            self.set_cell(home, Cell::EMPTY);
            self.refill(home);
            e
        } else {
            self.take_overflow(loc, start)?
        };
        self.unhint(start, e.end);
        self.wide -= usize::from(is_wide(start, e.end));
        Some((e, cut.unwrap_or_else(|| e.whole(start))))
    }

    /// Empties the cells beyond its home that hint the entry at `start`.
    fn unhint(&mut self, start: u64, end: u64) {
        let home = granule::of(start);
        for g in granules(start, end).filter(|&g| g != home) {
            if self.view(g) == View::Hint(start) {
                self.set_cell(g, Cell::EMPTY);
            }
        }
    }

    /// A granule's cell has just been emptied: an entry that starts in it (all were in
    /// overflow) moves home, or else the cell hints the entry that covers its first byte.
    fn refill(&mut self, granule: u64) {
        let lo = granule << granule::SHIFT;
        let hi = lo.saturating_add(1 << granule::SHIFT);
        if let Some((&s, &slot)) = self.tree.range(lo..hi).next() {
            if slot != IN_CELL {
                if let Some(e) = self.take_overflow(slot, s) {
                    self.tree.insert(s, IN_CELL);
                    self.set_cell(granule, Cell::home(s, e));
                }
            }
            return;
        }
        let Some((&s, &loc)) = self.tree.range(..lo).next_back() else { return };
        if self
            .entry_of(s, loc)
            .is_some_and(|e| e.end > lo && granules(s, e.end).contains(&granule))
        {
            self.set_cell(granule, Cell::hint(s));
        }
    }

    /// Whether no entry touches granule `g`, known from its cell alone: every entry that is not
    /// wide marks each granule it touches (its home, another's home, or a hint), so an empty cell
    /// is untouched while no entry is wide.
    fn untouched(&self, g: u64) -> bool {
        self.wide == 0 && Cells::covers(g) && self.view(g) == View::Empty
    }

    /// Whether no entry touches `[start, end)`, known from a few cells (`false`: not known).
    pub fn none_in(&self, start: u64, end: u64) -> bool {
        let span = granule::touched(start, end.saturating_sub(start));
        span.end() - span.start() < 8 && span.into_iter().all(|g| self.untouched(g))
    }

    /// The entry covering `addr`.
    pub fn at(&self, addr: u64) -> Option<(u64, &Entry)> {
        let g = granule::of(addr);
        let cell = self.view(g);
        if cell == View::Empty && self.wide == 0 && Cells::covers(g) {
            return None; // untouched: see `untouched`
        }
        let found = match cell {
            View::Home(s, e) => Some((s, e)),
            View::Hint(s) => match self.view(granule::of(s)) {
                View::Home(hs, e) if hs == s => Some((s, e)),
                _ => self.get(s).map(|e| (s, e)),
            },
            View::Empty => None,
        };
        if let Some((s, e)) = found.filter(|(s, e)| *s <= addr && addr < e.end) {
            return Some((s, e));
        }
        self.range(..=addr).next_back().filter(|(_, e)| addr < e.end)
    }

    /// The entry that starts at `start`.
    pub fn get(&self, start: u64) -> Option<&Entry> {
        self.tree.get(&start).and_then(|&loc| self.entry_of(start, loc))
    }

    /// The entries whose start lies in `r`, in order.
    pub fn range<R: std::ops::RangeBounds<u64>>(
        &self,
        r: R,
    ) -> impl DoubleEndedIterator<Item = (u64, &Entry)> {
        self.tree.range(r).filter_map(|(&s, &loc)| self.entry_of(s, loc).map(|e| (s, e)))
    }

    /// Every entry, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> {
        self.range(..)
    }

    #[cfg(test)]
    pub fn cuts(&self) -> impl Iterator<Item = (&u64, &Origin)> {
        self.cut.iter()
    }

    /// The entry `at` finds in the address's cell, or through its hint, without the tree.
    #[cfg(test)]
    pub fn in_cells(&self, addr: u64) -> Option<u64> {
        let s = match self.view(granule::of(addr)) {
            View::Home(s, _) => s,
            View::Hint(s) => match self.view(granule::of(s)) {
                View::Home(hs, _) if hs == s => s,
                _ => return None,
            },
            View::Empty => return None,
        };
        Some(s).filter(|&s| self.get(s).is_some_and(|e| s <= addr && addr < e.end))
    }

    /// The cells' books agree with the tree: every entry is where the tree says and nowhere
    /// else; an entry in overflow has its home taken by another; every hint names a live entry
    /// that touches its granule, and every granule an entry touches beyond its home hints it
    /// unless it is another's home; leaves count their cells.
    #[cfg(test)]
    pub fn check_cells(&self) {
        let mut homes = 0;
        for (g, view) in self.cells.check_and_list() {
            match view {
                View::Empty => unreachable!("listed cells are not empty"),
                View::Home(s, e) => {
                    homes += 1;
                    assert_eq!(granule::of(s), g, "an entry lives in its start's granule");
                    assert_eq!(
                        self.tree.get(&s),
                        Some(&IN_CELL),
                        "the tree knows {s:#x} is at home"
                    );
                    assert!(s < e.end);
                }
                View::Hint(s) => {
                    let e = self
                        .get(s)
                        .unwrap_or_else(|| panic!("hint in {g:#x} names {s:#x}, not live"));
                    assert_ne!(granule::of(s), g, "a home granule holds no hint of its own entry");
                    assert!(
                        granules(s, e.end).contains(&g),
                        "a hint names an entry that touches its granule"
                    );
                }
            }
        }
        let mut in_overflow = 0;
        let wide = self
            .tree
            .iter()
            .map(|(k, _)| k)
            .filter(|&&s| self.get(s).is_some_and(|e| is_wide(s, e.end)))
            .count();
        assert_eq!(wide, self.wide, "wide entries are counted");
        for (&s, &loc) in self.tree.iter() {
            // hints are complete: each granule an entry touches beyond its home (with a cell) is
            // another's home or hints this entry
            let end = self.get(s).map_or(s + 1, |e| e.end);
            assert!(s < end, "{s:#x} ends after it starts");
            for g in granules(s, end).filter(|&g| g != granule::of(s) && Cells::covers(g)) {
                let v = self.view(g);
                assert!(
                    matches!(v, View::Home(..)) || v == View::Hint(s),
                    "granule {g:#x} of {s:#x}: {v:?}"
                );
            }
            if loc == IN_CELL {
                continue;
            }
            in_overflow += 1;
            assert_eq!(self.overflow[loc as usize].0, s, "overflow slot {loc} holds {s:#x}");
            assert!(
                !Cells::covers(granule::of(s))
                    || matches!(self.view(granule::of(s)), View::Home(hs, _) if hs != s),
                "{s:#x} is in overflow while its home is free"
            );
        }
        assert_eq!(homes + in_overflow, self.tree.len(), "no entry is kept twice or lost");
        assert_eq!(self.overflow.len(), in_overflow + self.free_overflow.len());
        assert!(self.free_overflow.iter().all(|&f| self.overflow[f as usize].0 == FREE));
    }
}
