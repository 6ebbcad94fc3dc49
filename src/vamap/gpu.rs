//! One GPU's entries (a job holds a million), kept in cells of 2 MiB granules, so that a point
//! lookup reads one cell and the next or previous entry a bounded number more.
#![forbid(unsafe_code)]

use super::cells::{Cell, Cells, View, FREE};
use super::entry::Entry;
use super::granule;
use super::touch::Tree;
use super::types::Origin;
use std::ops::Bound;

/// An entry that is a whole UVM map call (nearly all) keeps no origin; one cut out of a larger
/// call by an unmap or an overlapping map keeps it in `cut`.
///
/// Every granule below 2^48 has a cell (32 bytes, [`Cells`]). An entry lives in the cell of the
/// granule its start lies in, its home, unless another entry is at home there; then it lives in
/// `overflow`, and `spilled` orders it. Each other granule an entry touches is another's home or
/// names ("hints") it. A point lookup ([`at`](Self::at)) reads the cell of the address's granule
/// and checks that its entry covers the address: entries never overlap, so one that covers it
/// is the answer. That is one cache miss at a million entries (`docs/results/scale-2026-12-03d`);
/// a hint costs a second read. An empty cell proves that no entry touches its granule (while no
/// entry is too wide to hint), so a lookup of host memory or of VA not mapped yet costs one read
/// too. The entries in order (the next one from an address, the last one before it) are the
/// cells' homes, found through the bits each level of the cells keeps ([`Cells::next_home`]),
/// merged with `spilled`: nothing is read per entry held, so every operation costs the same at
/// a million entries as at a thousand (issue 48), where a tree of every start read a node more
/// per level.
///
/// The price is a cell per granule, in leaves of 64 (128 MiB, 2.06 KiB): for allocations packed
/// in VA, as CUDA's are, 33 bytes per 2 MiB mapped (16 ppm), a 2 MiB allocation one cell, a 1 GiB
/// one 512; an allocation alone in its 128 MiB costs a whole leaf. Entries above 2^48 (5-level
/// paging) have no cells: they live in overflow and are found through `spilled`.
/// Every GPU's entries, by the GPU's UUID.
pub(super) type Gpus = rustc_hash::FxHashMap<crate::abi::Uuid, GpuMap>;

#[derive(Default, Clone)]
pub(super) struct GpuMap {
    cells: Cells,
    /// The entries not at home, start → their slot in `overflow`: a second entry that starts in
    /// a granule (smaller than 2 MiB, or not aligned to it), or one above 2^48.
    spilled: Tree<u64, u32>,
    overflow: Vec<(u64, Entry)>,
    free_overflow: Vec<u32>,
    cut: Tree<u64, Origin>,
    /// Entries wider than [`granule::MAX_SPAN`]: they hint nothing, so while there is one an
    /// empty cell proves nothing.
    wide: usize,
    len: usize,
}

/// Wider than hints reach ([`granule::MAX_SPAN`]).
fn is_wide(start: u64, end: u64) -> bool {
    !granule::kept(&granule::touched(start, end - start))
}

/// The granules an entry touches, its home among them (callers skip it), or none when it is
/// wide (lookups there then take the ordered search).
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
        self.len
    }

    fn view(&self, granule: u64) -> View<'_> {
        self.cells.view(granule)
    }

    fn set_cell(&mut self, granule: u64, c: Cell) {
        self.cells.set(granule, c)
    }

    /// The entry at `start` if it is at home.
    fn at_home(&self, start: u64) -> Option<&Entry> {
        match self.view(granule::of(start)) {
            View::Home(s, e) if s == start => Some(e),
            _ => None,
        }
    }

    /// The entry at `start` if it is spilled, with its slot (`None` also if the books disagree:
    /// the entry is then not found, never another's taken).
    fn spilled_at(&self, start: u64) -> Option<(u32, &Entry)> {
        let slot = *self.spilled.get(&start)?;
        let found = self.overflow.get(slot as usize).filter(|(s, _)| *s == start);
        debug_assert!(found.is_some(), "spilled {start:#x} is not in its slot");
        found.map(|(_, e)| (slot, e))
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
        if let Some(old_end) = self.get(start).map(|old| old.end) {
            self.unhint(start, old_end);
            self.wide -= usize::from(is_wide(start, old_end));
            self.wide += usize::from(is_wide(start, e.end));
            if self.at_home(start).is_some() {
                self.set_cell(home, Cell::home(start, e));
            } else if let Some((slot, _)) = self.spilled_at(start) {
                self.overflow[slot as usize] = (start, e);
            }
        } else {
            if !Cells::covers(home) || matches!(self.view(home), View::Home(..)) {
                let slot = match self.free_overflow.pop() {
                    Some(slot) => {
                        self.overflow[slot as usize] = (start, e);
                        slot
                    }
                    None => {
                        self.overflow.push((start, e));
                        (self.overflow.len() - 1) as u32
                    }
                };
                self.spilled.insert(start, slot);
            } else {
                self.set_cell(home, Cell::home(start, e));
            }
            self.len += 1;
            self.wide += usize::from(is_wide(start, e.end));
        }
        for g in granules(start, e.end).filter(|&g| g != home) {
            if !matches!(self.view(g), View::Home(..)) {
                self.set_cell(g, Cell::hint(start));
            }
        }
    }

    /// Takes the entry at `start` out of its place. `None` if there is none (or the books
    /// disagree: it is then forgotten, never another's taken).
    pub fn remove(&mut self, start: u64) -> Option<(Entry, Origin)> {
        let e = if let Some(&e) = self.at_home(start) {
            let home = granule::of(start);
            self.set_cell(home, Cell::EMPTY);
            self.refill(home);
            e
        } else {
            let slot = self.spilled.remove(&start)?;
            self.take_overflow(slot, start)?
        };
        let cut = if self.cut.is_empty() { None } else { self.cut.remove(&start) };
        self.len -= 1;
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

    /// A granule's cell has just been emptied: an entry that starts in it (all were spilled)
    /// moves home, or else the cell hints the entry that covers its first byte.
    fn refill(&mut self, granule: u64) {
        let lo = granule << granule::SHIFT;
        let hi = lo.saturating_add(1 << granule::SHIFT);
        if let Some((&s, &slot)) = self.spilled.range(lo..hi).next() {
            if let Some(e) = self.take_overflow(slot, s) {
                self.spilled.remove(&s);
                self.set_cell(granule, Cell::home(s, e));
            }
            return;
        }
        let Some(before) = lo.checked_sub(1) else { return };
        let Some((s, end)) = self.last_in(0, before).map(|(s, e)| (s, e.end)) else { return };
        if end > lo && granules(s, end).contains(&granule) {
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
        self.last_in(0, addr).filter(|(_, e)| addr < e.end)
    }

    /// The entry that starts at `start`.
    pub fn get(&self, start: u64) -> Option<&Entry> {
        self.at_home(start).or_else(|| self.spilled_at(start).map(|(_, e)| e))
    }

    /// The entry with the smallest start in `[lo, hi]`: the first home from `lo`'s granule on,
    /// or a spilled one before it.
    fn first_in(&self, lo: u64, hi: u64) -> Option<(u64, &Entry)> {
        if lo > hi {
            return None;
        }
        let g = granule::of(lo);
        let home = match self.view(g) {
            View::Home(s, e) if s >= lo => Some((s, e)),
            _ if g < granule::of(hi) => {
                self.cells.next_home(g + 1, granule::of(hi)).and_then(|h| match self.view(h) {
                    View::Home(s, e) => Some((s, e)),
                    _ => None,
                })
            }
            _ => None,
        }
        .filter(|(s, _)| *s <= hi);
        let spilled = self.spilled.range(lo..=hi).next().and_then(|(&s, &slot)| {
            self.overflow.get(slot as usize).filter(|(os, _)| *os == s).map(|(_, e)| (s, e))
        });
        match (home, spilled) {
            (Some(h), Some(o)) => Some(if o.0 < h.0 { o } else { h }),
            (h, o) => h.or(o),
        }
    }

    /// The entry with the largest start in `[lo, hi]`.
    fn last_in(&self, lo: u64, hi: u64) -> Option<(u64, &Entry)> {
        if lo > hi {
            return None;
        }
        let g = granule::of(hi);
        let home = match self.view(g) {
            View::Home(s, e) if s <= hi => Some((s, e)),
            _ if g > granule::of(lo) => {
                self.cells.prev_home(granule::of(lo), g - 1).and_then(|h| match self.view(h) {
                    View::Home(s, e) => Some((s, e)),
                    _ => None,
                })
            }
            _ => None,
        }
        .filter(|(s, _)| *s >= lo);
        let spilled = self.spilled.range(lo..=hi).next_back().and_then(|(&s, &slot)| {
            self.overflow.get(slot as usize).filter(|(os, _)| *os == s).map(|(_, e)| (s, e))
        });
        match (home, spilled) {
            (Some(h), Some(o)) => Some(if o.0 > h.0 { o } else { h }),
            (h, o) => h.or(o),
        }
    }

    /// The entries whose start lies in `r`, in order.
    pub fn range<R: std::ops::RangeBounds<u64>>(&self, r: R) -> Entries<'_> {
        let lo = match r.start_bound() {
            Bound::Included(&x) => Some(x),
            Bound::Excluded(&x) => x.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let hi = match r.end_bound() {
            Bound::Included(&x) => Some(x),
            Bound::Excluded(&x) => x.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        match (lo, hi) {
            (Some(lo), Some(hi)) if lo <= hi => Entries { map: self, lo, hi, done: false },
            _ => Entries { map: self, lo: 1, hi: 0, done: true },
        }
    }

    /// Every entry, in order.
    pub fn iter(&self) -> Entries<'_> {
        self.range(..)
    }

    #[cfg(test)]
    pub fn cuts(&self) -> impl Iterator<Item = (&u64, &Origin)> {
        self.cut.iter()
    }

    /// The entry `at` finds in the address's cell, or through its hint, without a search.
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

    /// The books agree: every entry is at home or spilled, never both; a spilled entry has its
    /// home taken by another; every hint names a live entry that touches its granule, and every
    /// granule an entry touches beyond its home hints it unless it is another's home; the walk
    /// in order finds every entry once; leaves count their cells and mark their homes.
    #[cfg(test)]
    pub fn check_cells(&self) {
        let mut homes = 0;
        for (g, view) in self.cells.check_and_list() {
            match view {
                View::Empty => unreachable!("listed cells are not empty"),
                View::Home(s, e) => {
                    homes += 1;
                    assert_eq!(granule::of(s), g, "an entry lives in its start's granule");
                    assert!(self.spilled.get(&s).is_none(), "{s:#x} is at home and spilled");
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
        let all: Vec<(u64, Entry)> = self.iter().map(|(s, e)| (s, *e)).collect();
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "the walk is in order");
        assert_eq!(all.len(), self.len, "the walk finds every entry once");
        let back: Vec<u64> = self.iter().rev().map(|(s, _)| s).collect();
        assert!(back.iter().rev().eq(all.iter().map(|(s, _)| s)), "and backwards the same");
        let wide = all.iter().filter(|(s, e)| is_wide(*s, e.end)).count();
        assert_eq!(wide, self.wide, "wide entries are counted");
        for &(s, e) in &all {
            // hints are complete: each granule an entry touches beyond its home (with a cell) is
            // another's home or hints this entry
            assert!(s < e.end, "{s:#x} ends after it starts");
            for g in granules(s, e.end).filter(|&g| g != granule::of(s) && Cells::covers(g)) {
                let v = self.view(g);
                assert!(
                    matches!(v, View::Home(..)) || v == View::Hint(s),
                    "granule {g:#x} of {s:#x}: {v:?}"
                );
            }
        }
        for (&s, &slot) in self.spilled.iter() {
            assert_eq!(self.overflow[slot as usize].0, s, "overflow slot {slot} holds {s:#x}");
            assert!(
                !Cells::covers(granule::of(s))
                    || matches!(self.view(granule::of(s)), View::Home(hs, _) if hs != s),
                "{s:#x} is spilled while its home is free"
            );
        }
        assert_eq!(homes + self.spilled.len(), self.len, "no entry is kept twice or lost");
        assert_eq!(self.overflow.len(), self.spilled.len() + self.free_overflow.len());
        assert!(self.free_overflow.iter().all(|&f| self.overflow[f as usize].0 == FREE));
    }
}

/// [`GpuMap::range`]'s walk: each step one bounded search from where the last ended.
pub(super) struct Entries<'a> {
    map: &'a GpuMap,
    lo: u64,
    hi: u64,
    done: bool,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (u64, &'a Entry);
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let Some((s, e)) = self.map.first_in(self.lo, self.hi) else {
            self.done = true;
            return None;
        };
        // entries never overlap: the next starts at or past this one's end, and one that ends
        // past the range ends the walk without a read of the bits that find the next
        match e.end.max(s + 1) {
            n if n <= self.hi => self.lo = n,
            _ => self.done = true,
        }
        Some((s, e))
    }
}

impl DoubleEndedIterator for Entries<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let Some((s, e)) = self.map.last_in(self.lo, self.hi) else {
            self.done = true;
            return None;
        };
        match s.checked_sub(1).filter(|&p| p >= self.lo) {
            Some(p) => self.hi = p,
            None => self.done = true,
        }
        Some((s, e))
    }
}
