//! The cells of [`GpuMap`](super::gpu::GpuMap): one per 2 MiB granule of GPU VA, in leaves found
//! through a two-level table (no hash), so that reaching a granule's cell is two loads that stay
//! in cache (the middle tables hold 4 bytes per leaf) and then the cell itself. Each level also
//! keeps a bit per slot below it that holds an entry at home, so that the next or the previous
//! entry from a granule is found in a bounded number of reads (a word per leaf, at most 16 per
//! middle table and 32 at the top), however many entries there are, as a page table or an
//! rtree finds one.
#![forbid(unsafe_code)]

use super::entry::Entry;
use super::granule;
use super::touch;

/// Granules per leaf: a leaf covers 128 MiB in 2 KiB and a line.
const LEAF_BITS: u32 = 6;
const LEAF_LEN: usize = 1 << LEAF_BITS;
/// Leaves per middle table (4 KiB; 128 GiB of VA).
const MID_BITS: u32 = 10;
const MID_LEN: usize = 1 << MID_BITS;
/// Cells exist for the first 2^48 bytes of VA (x86-64's and Arm's user space); a granule above
/// has none, and its entries live in `GpuMap`'s overflow and are found through its tree.
const VA_BITS: u32 = 48;
const TOP_LEN: usize = 1 << (VA_BITS - granule::SHIFT - LEAF_BITS - MID_BITS);

/// The start of an empty cell: no entry starts there (it would end past the address space).
pub const FREE: u64 = u64::MAX;

/// One granule's cell: empty (`start == FREE`), a hint naming the entry that starts at `start`
/// (`entry.end == 0`: no entry ends at 0), or the entry at `start`, at home. Sentinels instead of
/// an enum keep it at 32 bytes instead of 40, so that a cell lies in one cache line (its leaf
/// aligned to one): a lookup reads one line.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Cell {
    start: u64,
    entry: Entry,
}

#[derive(Debug, PartialEq, Eq)]
pub enum View<'a> {
    Empty,
    Hint(u64),
    Home(u64, &'a Entry),
}

impl Cell {
    fn is_home(&self) -> bool {
        self.start != FREE && self.entry.end != 0
    }

    pub const EMPTY: Cell = Cell { start: FREE, entry: Entry::NONE };

    pub fn hint(start: u64) -> Cell {
        Cell { start, entry: Entry::NONE }
    }

    pub fn home(start: u64, entry: Entry) -> Cell {
        debug_assert!(start < entry.end);
        Cell { start, entry }
    }

    pub fn is_empty(&self) -> bool {
        self.start == FREE
    }

    pub fn view(&self) -> View<'_> {
        match (self.start, self.entry.end) {
            (FREE, _) => View::Empty,
            (s, 0) => View::Hint(s),
            (s, _) => View::Home(s, &self.entry),
        }
    }
}

/// `repr(C)` and aligned to a cache line: the cells first, each in a line of its own, then the
/// counts in a line of theirs.
#[derive(Clone)]
#[repr(C, align(64))]
struct Leaf {
    cells: [Cell; LEAF_LEN],
    /// bit i: cell i holds an entry at home
    homes: u64,
    /// cells not empty: a leaf with none goes
    used: u32,
}

const MID_WORDS: usize = MID_LEN / 64;
const TOP_WORDS: usize = TOP_LEN.div_ceil(64);

#[derive(Clone)]
struct Mid {
    /// index + 1 in `Cells::leaves`; 0: none
    leaves: [u32; MID_LEN],
    used: u32,
    /// bit m: leaf m holds an entry at home
    home_leaves: [u64; MID_WORDS],
}

/// Every granule's cell, empty unless set.
#[derive(Default, Clone)]
pub struct Cells {
    /// TOP_LEN slots once the first cell is set (16 KiB)
    top: Vec<Option<Box<Mid>>>,
    /// bit t: middle table t holds an entry at home (TOP_WORDS words once the first cell is set)
    home_mids: Vec<u64>,
    /// The leaves, in one array rather than an allocation each: leaves made one after another
    /// (an allocator's neighbouring segments) are neighbours in memory, which costs fewer
    /// page-table reads than leaves spread over the heap (docs/results/scale-2026-12-03d). Like
    /// any growing array it is copied when it grows (33 MB at a million packed entries), and
    /// keeps its size until every leaf is free.
    leaves: Vec<Leaf>,
    free_leaves: Vec<u32>,
}

/// The last granule that has a cell.
const LAST_GRANULE: u64 = (1 << (VA_BITS - granule::SHIFT)) - 1;

fn granule_at(t: usize, m: usize, i: usize) -> u64 {
    ((((t << MID_BITS) | m) << LEAF_BITS) | i) as u64
}

/// The first set bit at or after `from` in `words` (read a cache line at a time).
fn first_bit_from(words: &[u64], from: usize) -> Option<usize> {
    let mut w = from / 64;
    let mut bits = words.get(w)? & (u64::MAX << (from % 64));
    touch::add(1);
    loop {
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        w += 1;
        bits = *words.get(w)?;
        touch::add(u64::from(w.is_multiple_of(8)));
    }
}

/// The last set bit at or before `to` in `words`.
fn last_bit_to(words: &[u64], to: usize) -> Option<usize> {
    let mut w = to / 64;
    let mut bits = words.get(w)? & (u64::MAX >> (63 - to % 64));
    touch::add(1);
    loop {
        if bits != 0 {
            return Some(w * 64 + 63 - bits.leading_zeros() as usize);
        }
        w = w.checked_sub(1)?;
        bits = words[w];
        touch::add(u64::from(w % 8 == 7));
    }
}

/// (top, mid, cell) indices of a granule, if it has a cell.
fn place(granule: u64) -> Option<(usize, usize, usize)> {
    let leaf = granule >> LEAF_BITS;
    let top = (leaf >> MID_BITS) as usize;
    (top < TOP_LEN).then_some((
        top,
        (leaf as usize) & (MID_LEN - 1),
        (granule as usize) & (LEAF_LEN - 1),
    ))
}

impl Cells {
    pub fn view(&self, granule: u64) -> View<'_> {
        let Some((t, m, i)) = place(granule) else { return View::Empty };
        // the top table's slot, the middle table's, the cell
        touch::add(3);
        match self.top.get(t).and_then(|mid| mid.as_ref()).map(|mid| mid.leaves[m]) {
            Some(l) if l != 0 => self.leaves[l as usize - 1].cells[i].view(),
            _ => View::Empty,
        }
    }

    /// Whether `granule` can have a cell.
    pub fn covers(granule: u64) -> bool {
        place(granule).is_some()
    }

    /// Sets a granule's cell (nothing for one that cannot have a cell), making or dropping its
    /// leaf and middle table.
    pub fn set(&mut self, granule: u64, c: Cell) {
        let Some((t, m, i)) = place(granule) else { return };
        touch::add(3);
        if c.is_empty() {
            let Some(mid) = self.top.get_mut(t).and_then(|mid| mid.as_mut()) else { return };
            let l = mid.leaves[m];
            if l == 0 {
                return;
            }
            let leaf = &mut self.leaves[l as usize - 1];
            if !leaf.cells[i].is_empty() {
                leaf.used -= 1;
            }
            leaf.cells[i] = c;
            if leaf.homes & (1 << i) != 0 {
                leaf.homes &= !(1 << i);
                if leaf.homes == 0 {
                    mid.home_leaves[m / 64] &= !(1 << (m % 64));
                    if mid.home_leaves.iter().all(|&w| w == 0) {
                        self.home_mids[t / 64] &= !(1 << (t % 64));
                    }
                }
            }
            if leaf.used == 0 {
                mid.leaves[m] = 0;
                self.free_leaves.push(l - 1);
                if self.free_leaves.len() == self.leaves.len() {
                    (self.leaves, self.free_leaves) = (Vec::new(), Vec::new());
                }
                mid.used -= 1;
                if mid.used == 0 {
                    self.top[t] = None;
                }
            }
            return;
        }
        if self.top.is_empty() {
            self.top.resize_with(TOP_LEN, || None);
            self.home_mids = vec![0; TOP_WORDS];
        }
        let mid = self.top[t].get_or_insert_with(|| {
            Box::new(Mid { leaves: [0; MID_LEN], used: 0, home_leaves: [0; MID_WORDS] })
        });
        if mid.leaves[m] == 0 {
            let l = match self.free_leaves.pop() {
                Some(l) => l,
                None => {
                    self.leaves.push(Leaf { homes: 0, used: 0, cells: [Cell::EMPTY; LEAF_LEN] });
                    (self.leaves.len() - 1) as u32
                }
            };
            mid.leaves[m] = l + 1;
            mid.used += 1;
        }
        let leaf = &mut self.leaves[mid.leaves[m] as usize - 1];
        if leaf.cells[i].is_empty() {
            leaf.used += 1;
        }
        leaf.cells[i] = c;
        if c.is_home() {
            leaf.homes |= 1 << i;
            mid.home_leaves[m / 64] |= 1 << (m % 64);
            self.home_mids[t / 64] |= 1 << (t % 64);
        } else if leaf.homes & (1 << i) != 0 {
            leaf.homes &= !(1 << i);
            if leaf.homes == 0 {
                mid.home_leaves[m / 64] &= !(1 << (m % 64));
                if mid.home_leaves.iter().all(|&w| w == 0) {
                    self.home_mids[t / 64] &= !(1 << (t % 64));
                }
            }
        }
    }

    /// The leaf at (t, m), if there is one.
    fn leaf(&self, t: usize, m: usize) -> Option<&Leaf> {
        let l = self.top.get(t)?.as_ref()?.leaves[m];
        (l != 0).then(|| &self.leaves[l as usize - 1])
    }

    /// The first granule in `[from, to]` whose cell holds an entry at home.
    pub fn next_home(&self, from: u64, to: u64) -> Option<u64> {
        let to = to.min(LAST_GRANULE);
        if from > to || self.top.is_empty() {
            return None;
        }
        let (t0, m0, i0) = place(from)?;
        let found = self.next_home_from(t0, m0, i0)?;
        (found <= to).then_some(found)
    }

    fn next_home_from(&self, t0: usize, m0: usize, i0: usize) -> Option<u64> {
        // in the leaf of `from`
        touch::add(3);
        if let Some(leaf) = self.leaf(t0, m0) {
            let bits = leaf.homes & (u64::MAX << i0);
            if bits != 0 {
                return Some(granule_at(t0, m0, bits.trailing_zeros() as usize));
            }
        }
        // a later leaf of its middle table, then a later middle table
        let mid = self.top[t0].as_ref();
        let m = mid.and_then(|mid| first_bit_from(&mid.home_leaves, m0 + 1));
        let (t, m) = match m {
            Some(m) => (t0, m),
            None => {
                let t = first_bit_from(&self.home_mids, t0 + 1)?;
                let mid = self.top[t].as_ref()?;
                (t, first_bit_from(&mid.home_leaves, 0)?)
            }
        };
        touch::add(1);
        let leaf = self.leaf(t, m)?;
        (leaf.homes != 0).then(|| granule_at(t, m, leaf.homes.trailing_zeros() as usize))
    }

    /// The last granule in `[from, to]` whose cell holds an entry at home.
    pub fn prev_home(&self, from: u64, to: u64) -> Option<u64> {
        let to = to.min(LAST_GRANULE);
        if from > to || self.top.is_empty() {
            return None;
        }
        let (t0, m0, i0) = place(to)?;
        let found = self.prev_home_from(t0, m0, i0)?;
        (found >= from).then_some(found)
    }

    fn prev_home_from(&self, t0: usize, m0: usize, i0: usize) -> Option<u64> {
        touch::add(3);
        if let Some(leaf) = self.leaf(t0, m0) {
            let bits = leaf.homes & (u64::MAX >> (63 - i0));
            if bits != 0 {
                return Some(granule_at(t0, m0, 63 - bits.leading_zeros() as usize));
            }
        }
        let mid = self.top[t0].as_ref();
        let m =
            mid.and_then(|mid| m0.checked_sub(1).and_then(|m| last_bit_to(&mid.home_leaves, m)));
        let (t, m) = match m {
            Some(m) => (t0, m),
            None => {
                let t = last_bit_to(&self.home_mids, t0.checked_sub(1)?)?;
                let mid = self.top[t].as_ref()?;
                (t, last_bit_to(&mid.home_leaves, MID_LEN - 1)?)
            }
        };
        touch::add(1);
        let leaf = self.leaf(t, m)?;
        (leaf.homes != 0).then(|| granule_at(t, m, 63 - leaf.homes.leading_zeros() as usize))
    }

    /// Every cell that is not empty, with its granule; and each leaf's and middle table's own
    /// count checked against what it holds.
    #[cfg(test)]
    pub fn check_and_list(&self) -> Vec<(u64, View<'_>)> {
        let (mut out, mut in_use, mut seen) = (Vec::new(), 0, std::collections::BTreeSet::new());
        for (t, mid) in self.top.iter().enumerate() {
            let Some(mid) = mid else { continue };
            assert_eq!(
                self.home_mids[t / 64] >> (t % 64) & 1,
                u64::from(mid.home_leaves.iter().any(|&w| w != 0)),
                "the top marks middle table {t}"
            );
            let leaves = mid.leaves.iter().filter(|&&l| l != 0).count() as u32;
            assert_eq!(leaves, mid.used, "middle table {t} counts its leaves");
            assert!(leaves > 0, "an empty middle table is dropped");
            for (m, &l) in mid.leaves.iter().enumerate().filter(|(_, &l)| l != 0) {
                let leaf = &self.leaves[l as usize - 1];
                in_use += 1;
                assert!(seen.insert(l), "leaf {l} is named once");
                assert!(!self.free_leaves.contains(&(l - 1)), "a leaf in use is not free");
                let used = leaf.cells.iter().filter(|c| !c.is_empty()).count() as u32;
                assert_eq!(used, leaf.used, "leaf {t}/{m} counts its cells");
                let homes = leaf
                    .cells
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_home())
                    .fold(0u64, |b, (i, _)| b | 1 << i);
                assert_eq!(homes, leaf.homes, "leaf {t}/{m} marks its homes");
                assert_eq!(
                    mid.home_leaves[m / 64] >> (m % 64) & 1,
                    u64::from(homes != 0),
                    "middle table {t} marks leaf {m}"
                );
                assert!(used > 0, "an empty leaf is dropped");
                for (i, c) in leaf.cells.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
                    out.push((granule_at(t, m, i), c.view()));
                }
            }
        }
        assert_eq!(
            in_use + self.free_leaves.len(),
            self.leaves.len(),
            "every leaf is in use or free"
        );
        assert!(self.free_leaves.iter().all(|&f| self.leaves[f as usize].used == 0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_32_bytes_and_its_leaves_come_and_go() {
        assert_eq!(std::mem::size_of::<Cell>(), 32);
        assert_eq!(std::mem::size_of::<Leaf>(), 64 * 32 + 64, "the cells, then a line of counts");
        let mut c = Cells::default();
        let top_granule = (1u64 << (VA_BITS - granule::SHIFT)) - 1;
        assert!(Cells::covers(top_granule) && !Cells::covers(top_granule + 1));
        c.set(top_granule + 1, Cell::hint(7));
        assert_eq!(c.view(top_granule + 1), View::Empty, "no cell above 2^48");
        c.set(top_granule, Cell::hint(7));
        c.set(3, Cell::hint(9));
        assert_eq!(c.view(top_granule), View::Hint(7));
        assert_eq!(c.view(3), View::Hint(9));
        assert_eq!(c.view(4), View::Empty);
        assert_eq!(c.check_and_list().len(), 2);
        c.set(3, Cell::EMPTY);
        c.set(top_granule, Cell::EMPTY);
        assert!(c.check_and_list().is_empty());
        assert!(c.top.iter().all(|m| m.is_none()), "emptied tables are dropped");
        assert!(c.leaves.is_empty(), "and the leaves with them");
        // a freed leaf is reused while others live on, and its cells start empty
        let leaf = 1u64 << LEAF_BITS;
        for k in 0..3 {
            c.set(k * leaf + 1, Cell::hint(k));
        }
        c.set(leaf + 1, Cell::EMPTY);
        c.set(5 * leaf + 2, Cell::hint(5));
        assert_eq!(c.leaves.len(), 3, "the freed leaf was reused");
        assert_eq!(c.view(5 * leaf + 1), View::Empty);
        assert_eq!(c.view(leaf + 1), View::Empty);
        assert_eq!(c.check_and_list().len(), 3);
    }
}
