//! What each operation of the map and the registrar reads, counted (issue 48): the cache lines of
//! the cells and their tables, the nodes of the ordered trees, the tables' buckets. A structure
//! whose cost grows with what the program holds shows it in these counts on any machine, busy or
//! not, where a timed ratio passes or fails by luck (tests/scale.rs compares them at 10^3 and 10^5
//! live allocations, the shim's hooks running the map on the calling thread with
//! `GDRSHIM_APPLY_THREAD=0`). Counted in tests and knobs builds only; elsewhere [`add`] is nothing.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ops::RangeBounds;

// Per thread in the unit tests, which run side by side; one count in a knobs build of the shim,
// read by a test whose calls run one at a time on one thread: a plain load and store (no
// read-modify-write, no thread-local lookup, which in a preloaded library is a call), so that
// the benchmark's times, taken with the same build, carry next to nothing of it.
#[cfg(test)]
thread_local! {
    static TOUCHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
#[cfg(all(feature = "knobs", not(test)))]
static TOUCHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `n` more cache lines or nodes read.
#[inline(always)]
pub fn add(n: u64) {
    #[cfg(test)]
    TOUCHED.with(|t| t.set(t.get() + n));
    #[cfg(all(feature = "knobs", not(test)))]
    {
        use std::sync::atomic::Ordering::Relaxed;
        TOUCHED.store(TOUCHED.load(Relaxed) + n, Relaxed);
    }
    #[cfg(not(any(test, feature = "knobs")))]
    let _ = n;
}

/// What has been read so far (this thread's in the unit tests; 0 where nothing is counted).
pub fn total() -> u64 {
    #[cfg(test)]
    return TOUCHED.with(|t| t.get());
    #[cfg(all(feature = "knobs", not(test)))]
    return TOUCHED.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(any(test, feature = "knobs")))]
    0
}

/// One probe of a hash table: its control group and its bucket.
pub const HASH_PROBE: u64 = 2;

/// The nodes a descent of a B-tree of `len` keys reads: one per level. std's tree keeps 5 to 11
/// keys a node (its root fewer); with nodes half full, as keys inserted in order leave them, a
/// level holds 6 times the keys of the one below.
pub fn levels(len: usize) -> u64 {
    let (mut levels, mut reach) = (1, 11usize);
    while reach < len {
        levels += 1;
        reach = reach.saturating_mul(6);
    }
    levels
}

/// An ordered map that counts what it reads: a descent, [`levels`] nodes; each entry an
/// iteration goes on to, one more.
#[derive(Clone, Debug)]
pub struct Tree<K, V>(BTreeMap<K, V>);

impl<K, V> Default for Tree<K, V> {
    fn default() -> Self {
        Tree(BTreeMap::new())
    }
}

impl<K: Ord + Copy, V> Tree<K, V> {
    fn descend(&self) {
        add(levels(self.0.len()));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        if self.0.is_empty() {
            return None;
        }
        self.descend();
        self.0.get(k)
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        self.descend();
        self.0.insert(k, v)
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        if self.0.is_empty() {
            return None;
        }
        self.descend();
        self.0.remove(k)
    }

    pub fn pop_first(&mut self) -> Option<(K, V)> {
        self.descend();
        self.0.pop_first()
    }

    /// The entries whose key lies in `r`, in order: a descent to each end taken, and one entry
    /// per step.
    pub fn range<R: RangeBounds<K>>(&self, r: R) -> Range<'_, K, V> {
        if !self.0.is_empty() {
            self.descend();
        }
        Range(self.0.range(r))
    }

    /// Every entry, in order (a whole walk: counted per entry).
    pub fn iter(&self) -> Range<'_, K, V> {
        self.range(..)
    }
}

/// [`Tree::range`]'s iterator (a named type, not `impl Trait`: a borrow of it ends where its
/// last use does).
pub struct Range<'a, K, V>(std::collections::btree_map::Range<'a, K, V>);

impl<'a, K, V> Iterator for Range<'a, K, V> {
    type Item = (&'a K, &'a V);
    fn next(&mut self) -> Option<Self::Item> {
        let x = self.0.next();
        add(u64::from(x.is_some()));
        x
    }
}

impl<K, V> DoubleEndedIterator for Range<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let x = self.0.next_back();
        add(u64::from(x.is_some()));
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_counts_more_levels_as_it_grows_and_the_counter_adds_up() {
        assert_eq!((levels(0), levels(11), levels(12), levels(66), levels(67)), (1, 1, 2, 2, 3));
        assert!(levels(100_000) > levels(1000), "a descent reads more nodes in a larger tree");
        let mut t: Tree<u64, u64> = Tree::default();
        for k in 0..1000 {
            t.insert(k, k);
        }
        let before = total();
        assert_eq!(t.get(&5), Some(&5));
        assert_eq!(total() - before, levels(1000));
        let before = total();
        assert_eq!(t.range(10..13).count(), 3);
        assert_eq!(total() - before, levels(1000) + 3, "a descent, then one per entry");
    }
}
