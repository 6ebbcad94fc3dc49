//! The exact map from GPU virtual address to the RM memory behind it, per mapping GPU, with UVM's
//! semantics: a new map first unmaps what it overlaps on that GPU; unmaps split entries; UVM
//! external ranges are kept too (GPU VA that is reserved but not mapped).
//!
//! Pure data structure: no FFI, no locks. Sized for jobs that hold a million live allocations:
//! one 24-byte entry per mapping, kept in the cell of its first 2 MiB granule (a range mapped
//! whole is a bit in its entry); a point lookup reads one cell, the next or previous entry a
//! bounded number of words of the cells' tables (`gpu`), so no operation reads more for more
//! entries held (`touch` counts it); nothing scans all entries but a client's free.
#![forbid(unsafe_code)]

use crate::abi::Uuid;
use touch::Tree;

mod cells;
pub mod contexts;
mod entry;
mod gpu;
pub mod granule;
mod lookup;
mod mems;
pub mod owned;
pub mod touch;
mod types;
pub use contexts::ContextTag;
use mems::MemTable;
pub use types::{Allocation, MemInfo, MemRef, Miss, Origin, Piece, UNSEEN};
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ends;

use entry::{Entry, OFFSET_LIMIT};
use gpu::{GpuMap, Gpus};

const TOMBSTONES: usize = 4096;

#[derive(Default, Clone)]
pub struct VaMap {
    per_gpu: Gpus,
    /// UVM external ranges (base → length, non-overlapping, as UVM keeps them) that no entry
    /// claims: those not mapped whole (a VMM reservation), or not yet.
    ranges: Tree<u64, u64>,
    /// Removed ranges (merged, start → end), so a miss can say "freed" rather than "unmapped".
    tombstones: Tree<u64, u64>,
    /// Every memory object the process allocated or mapped: its allocation (16 bytes a slot:
    /// the one table per allocation besides the entries) and how many entries map it, so that
    /// freeing memory that is no longer mapped (the usual order: UVM_FREE, then RM_FREE) costs
    /// no scan.
    mems: MemTable,
    /// The program's own allocations that are not exactly one entry (`owned`).
    owned: owned::Allocations,
    /// Allocations seen so far (`MemInfo::serial`).
    serials: u64,
}

impl VaMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn entries(&self) -> usize {
        self.per_gpu.values().map(|m| m.len()).sum()
    }

    /// The memory objects mapped anywhere in `[base, end)`, on any GPU, each once.
    pub fn memory_in(&self, base: u64, end: u64) -> Vec<MemRef> {
        lookup::memory_in(&self.per_gpu, base, end)
    }

    /// Whether memory is mapped in `[base, end)` and all of it is system memory (host pages that
    /// CUDA also mapped for the GPU, as pinned host memory is): the NIC pins their CPU pages.
    pub fn only_sysmem_in(&self, base: u64, end: u64) -> bool {
        lookup::only_sysmem_in(&self.per_gpu, &self.mems, base, end)
    }

    /// Whether some GPU maps `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        lookup::contains(&self.per_gpu, addr)
    }

    /// Whether `addr` is GPU virtual address space this process made: mapped on some GPU, or in
    /// a UVM external range.
    pub fn is_gpu_va(&self, addr: u64) -> bool {
        // the mappings first: a GPU registration goes on to look them up, so their path is warm
        self.contains(addr)
            || self.ranges.range(..=addr).next_back().is_some_and(|(&b, &l)| addr - b < l)
    }

    /// Exact lookup: the pieces that cover `[addr, addr+len)` on every GPU that maps any of it
    /// (all such GPUs must agree), or why not.
    pub fn lookup(&self, addr: u64, len: u64) -> Result<Vec<Piece>, Miss> {
        let miss_at =
            |at| if self.was_mapped(at) { Miss::Freed { at } } else { Miss::Unmapped { at } };
        lookup::lookup(&self.per_gpu, &self.mems, addr, len, miss_at)
    }

    /// The common case of [`lookup`](Self::lookup) without an allocation: one GPU maps any of
    /// the range, and one entry there covers all of it. `None`: not that case (ask `lookup`).
    pub fn lookup_one(&self, addr: u64, len: u64) -> Option<Piece> {
        lookup::lookup_one(&self.per_gpu, &self.mems, addr, len)
    }

    /// [`lookup_one`](Self::lookup_one), and whether the program owns all of the range: where
    /// the entry is marked so, [`first_unowned`](Self::first_unowned) of the range is `None`
    /// (a mark is only ever on a whole allocation of the program's or the rest of one).
    pub fn lookup_one_owned(&self, addr: u64, len: u64) -> Option<(Piece, bool)> {
        lookup::lookup_one_owned(&self.per_gpu, &self.mems, addr, len)
    }

    /// Like [`lookup`](Self::lookup) but the range must lie in one memory object.
    pub fn lookup_single(&self, addr: u64, len: u64) -> Result<Piece, Miss> {
        // (what `lookup` answers first, without its Vec: a registration asks this twice)
        if let Some(p) = self.lookup_one(addr, len) {
            return Ok(p);
        }
        let p = self.lookup(addr, len)?;
        if p.len() == 1 {
            Ok(p[0])
        } else {
            Err(Miss::SpansMemoryObjects { count: p.len() })
        }
    }

    /// All entries of all GPUs as (gpu, va, len, mem, offset), for diagnostics and tests.
    pub fn dump(&self) -> Vec<(Uuid, u64, u64, MemRef, u64)> {
        lookup::dump(&self.per_gpu)
    }

    /// The program was handed `[base, base+len)` by a CUDA call that allocated it (an allocation
    /// carved from a longer mapping counts to that mapping's end, as libcuda counts it).
    /// Its context unknown: [`own_in`](Self::own_in).
    pub fn own(&mut self, base: u64, len: u64) {
        self.own_in(base, len, ContextTag::Unknown);
    }

    /// [`own`](Self::own), made in context `tag` (what ends it: [`end_owned`](Self::end_owned)).
    pub fn own_in(&mut self, base: u64, len: u64, tag: ContextTag) {
        owned::own(&mut self.per_gpu, &mut self.owned, base, len, true, tag);
    }

    /// The program was handed `[base, base+len)` of memory it did not allocate here: an import
    /// (an IPC handle, a pool pointer, a handle mapped by `cuMemMap`). Counted exactly, never to
    /// the end of the mapping it sits in: that mapping is the exporter's chunk or pool, whose
    /// other blocks are the exporter's, not this program's.
    /// Its context unknown: [`own_import_in`](Self::own_import_in).
    pub fn own_import(&mut self, base: u64, len: u64) {
        self.own_import_in(base, len, ContextTag::Unknown);
    }

    /// [`own_import`](Self::own_import), opened in context `tag` (an IPC handle), or of none
    /// (a handle mapped, a pool pointer).
    pub fn own_import_in(&mut self, base: u64, len: u64, tag: ContextTag) {
        owned::own(&mut self.per_gpu, &mut self.owned, base, len, false, tag);
    }

    /// The program freed the allocation that starts at `base`: whether there was one.
    pub fn disown_at(&mut self, base: u64) -> bool {
        owned::disown_at(&mut self.per_gpu, &mut self.owned, base)
    }

    /// `[base, end)` is the program's no longer.
    pub fn disown(&mut self, base: u64, end: u64) {
        owned::disown(&mut self.per_gpu, &mut self.owned, base, end);
    }

    /// CUDA contexts ended: the allocations made in those `ended` names are the program's no
    /// longer, and those of an unknown context at VA GPU `unknown_on` maps (`None`: every one)
    /// ([`owned::end_of`]).
    pub fn end_owned(&mut self, ended: &dyn Fn(u64) -> bool, unknown_on: Option<Uuid>) {
        owned::end_of(&mut self.per_gpu, &mut self.owned, ended, unknown_on);
    }

    /// The context of the program's allocation at `addr`.
    pub fn context_at(&self, addr: u64) -> ContextTag {
        self.owned.tags.at(addr)
    }

    /// The driver took `[base, end)` back (UVM freed or unmapped it everywhere): the recorded
    /// ranges in it go (marked entries went with the mappings).
    pub fn forget_owned(&mut self, base: u64, end: u64) {
        self.owned.remove(base, end);
    }

    /// The first byte of `[addr, end)` that is in no allocation of the program's, or `None` when
    /// its allocations cover all of it ([`owned::first_unowned`]).
    pub fn first_unowned(&self, addr: u64, end: u64) -> Option<u64> {
        owned::first_unowned(&self.per_gpu, &self.owned, addr, end)
    }

    /// How many allocations the program holds that are not exactly one entry.
    pub fn owned_ranges(&self) -> usize {
        self.owned.len()
    }

    /// UVM_CREATE_EXTERNAL_RANGE. UVM refuses a range over another, so whatever this map still
    /// holds there was freed unseen: it goes, mappings included.
    pub fn create_range(&mut self, base: u64, len: u64) {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return };
        let overlaps = |b: u64, l: u64| b < end && base < b.saturating_add(l);
        // the stale ranges, recorded or claimed by an entry: each goes whole
        let mut stale: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(&b, &l)| overlaps(b, l) || b >= base)
            .map(|(&b, &l)| (b, l))
            .collect();
        stale.retain(|&(b, l)| overlaps(b, l));
        for m in self.per_gpu.values() {
            let first = m.at(base).map(|(s, _)| s).unwrap_or(base);
            stale.extend(
                m.range(first..end).filter(|(_, e)| e.claims_range()).map(|(s, e)| (s, e.end - s)),
            );
        }
        stale.push((base, len));
        for &(b, l) in &stale {
            self.unmap_all(b, l);
            self.ranges.remove(&b);
        }
        self.ranges.insert(base, len);
    }

    /// The extent of the UVM external range at `base`, if this map knows one there.
    pub fn range_at(&self, base: u64) -> Option<u64> {
        if let Some(&l) = self.ranges.get(&base) {
            return Some(l);
        }
        // through the cells: the entry at base, if it starts there
        self.per_gpu.values().find_map(|m| {
            m.at(base).filter(|(s, e)| *s == base && e.claims_range()).map(|(_, e)| e.end - base)
        })
    }

    /// What UVM_FREE(base) releases: the range created there, or else the length the call gives,
    /// or else the run of mappings continuing from base.
    pub fn free_extent(&self, base: u64, length: Option<u64>) -> u64 {
        self.range_at(base).or(length).unwrap_or_else(|| self.run_end(base) - base)
    }

    /// UVM_FREE: the range at `base` goes, with every mapping in it on every GPU. Returns whether
    /// the range was known.
    pub fn free_range(&mut self, base: u64, length: Option<u64>) -> bool {
        let known = self.range_at(base).is_some();
        let len = self.free_extent(base, length);
        if len > 0 {
            self.unmap_all(base, len);
        }
        self.ranges.remove(&base);
        known
    }

    /// UVM_MAP_EXTERNAL_ALLOCATION on one GPU: `[base, base+len)` → `mem` at `offset`.
    pub fn map(&mut self, gpu: Uuid, base: u64, len: u64, mem: MemRef, offset: u64) {
        if len == 0 || base.checked_add(len).is_none() {
            return;
        }
        owned::end_under(&mut self.per_gpu, &mut self.owned, base, base + len, mem);
        self.unmap(gpu, base, len);
        if offset.checked_add(len).is_none_or(|end| end > OFFSET_LIMIT) {
            return; // no RM memory is that large: kept out, so that lookups miss (and a cut's offset stays below the limit)
        }
        let alloc = self.mems.count_in(mem);
        let mut e = Entry::new(base + len, offset, mem, alloc);
        if self.ranges.get(&base) == Some(&len) {
            self.ranges.remove(&base);
            e = e.claiming();
        }
        self.per_gpu.entry(gpu).or_default().insert(base, e, e.whole(base));
    }

    /// Removes the entry at `start`, with its count, and gives back the range it claimed.
    fn take(
        m: &mut GpuMap,
        mems: &mut MemTable,
        ranges: &mut Tree<u64, u64>,
        start: u64,
    ) -> Option<(Entry, Origin)> {
        let (e, o) = m.remove(start)?;
        mems.count_out(e.mem);
        if e.claims_range() {
            ranges.insert(start, e.end - start);
        }
        Some((e, o))
    }

    /// UVM_UNMAP_EXTERNAL on one GPU. Returns how many entries it cut or removed.
    pub fn unmap(&mut self, gpu: Uuid, base: u64, len: u64) -> usize {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return 0 };
        let Some(m) = self.per_gpu.get_mut(&gpu) else { return 0 };
        let touched = Self::unmap_in(m, &mut self.mems, &mut self.ranges, base, end);
        if touched > 0 {
            self.tombstone(base, len);
        }
        touched
    }

    /// Cuts `[base, end)` out of one GPU's entries. (A GPU's map stays even when empty: GPUs
    /// are few, and dropping and rebuilding its tree on every free/alloc costs allocations.)
    fn unmap_in(
        m: &mut GpuMap,
        mems: &mut MemTable,
        ranges: &mut Tree<u64, u64>,
        base: u64,
        end: u64,
    ) -> usize {
        // The usual cases in one descent (the loop below takes several): the last entry that
        // starts before `end` ends by `base`, so nothing overlaps (a new map); or it is exactly
        // `[base, end)`, so it is the only one that overlaps (entries never overlap): a free.
        if m.none_in(base, end) {
            return 0; // a new map over untouched VA, from its cells alone
        }
        if m.at(base).is_some_and(|(s, e)| s == base && e.end == end) {
            // a free, through the cells: an entry that is exactly the range is all it overlaps
            Self::take(m, mems, ranges, base);
            return 1;
        }
        let last = m.range(..end).next_back().map(|(s, e)| (s, e.end));
        match last {
            None => return 0,
            Some((_, e_end)) if e_end <= base => return 0,
            Some((s, e_end)) if s == base && e_end == end => {
                Self::take(m, mems, ranges, s);
                return 1;
            }
            _ => {}
        }
        let mut touched = 0;
        // At most one entry starts before base and reaches into the range; then those inside.
        let mut next =
            m.at(base).map(|(s, _)| s).or_else(|| m.range(base..end).next().map(|(s, _)| s));
        while let Some(s) = next {
            // found just now; were its place wrong, remove has forgotten it: stop, never panic
            let Some((e, origin)) = Self::take(m, mems, ranges, s) else { break };
            touched += 1;
            if s < base {
                m.insert(s, e.cut(s, s, base), origin);
                mems.count_in(e.mem);
            }
            if e.end > end {
                m.insert(end, e.cut(s, end, e.end), origin);
                mems.count_in(e.mem);
            }
            next = m.range(base..end).next().map(|(s, _)| s);
        }
        touched
    }

    /// The range goes away on every GPU (UVM_FREE, or a new range over a stale one).
    pub fn unmap_all(&mut self, base: u64, len: u64) -> usize {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return 0 };
        let mut touched = 0;
        for m in self.per_gpu.values_mut() {
            touched += Self::unmap_in(m, &mut self.mems, &mut self.ranges, base, end);
        }
        if touched > 0 {
            self.tombstone(base, len);
        }
        touched
    }

    /// Where the run of entries that starts at `base` on some GPU and continues without a gap
    /// ends (`base` if no entry starts there).
    pub fn run_end(&self, base: u64) -> u64 {
        let mut end = base;
        for m in self.per_gpu.values() {
            let mut at = base;
            while let Some(e) = m.get(at) {
                at = e.end;
            }
            end = end.max(at);
        }
        end
    }

    /// RM_ALLOC of memory under `parent`. A handle seen before (its free missed) loses its
    /// mappings first.
    pub fn add_memory(&mut self, mem: MemRef, parent: u32, class: u32) {
        touch::add(touch::HASH_PROBE);
        if self.mems.contains(mem) {
            self.remove_memory(mem);
        }
        self.serials += 1;
        self.mems.insert(mem, MemInfo { parent, class, entries: 0, serial: self.serials });
    }

    /// The allocation of `mem`, if it was seen.
    pub fn memory(&self, mem: MemRef) -> Option<MemInfo> {
        touch::add(touch::HASH_PROBE);
        self.mems.get(mem).filter(|i| i.class != UNSEEN)
    }

    /// Whether the map knows `mem` at all: allocated, or mapped without its allocation seen.
    pub fn knows(&self, mem: MemRef) -> bool {
        touch::add(touch::HASH_PROBE);
        self.mems.contains(mem)
    }

    /// The memory objects of `client` allocated under `parent`.
    pub fn memory_under(&self, client: u32, parent: u32) -> Vec<MemRef> {
        self.mems
            .iter()
            .filter(|(m, i)| m.client == client && i.class != UNSEEN && i.parent == parent)
            .map(|(m, _)| m)
            .collect()
    }

    /// The memory objects of `client` this map knows (allocated or mapped).
    pub fn memory_of(&self, client: u32) -> Vec<MemRef> {
        self.mems.iter().map(|(m, _)| m).filter(|m| m.client == client).collect()
    }

    /// How many memory objects this map knows.
    pub fn memories(&self) -> usize {
        self.mems.len()
    }

    /// RM free of a memory object: it is forgotten, and every mapping of it goes. (Scans the
    /// entries only when the memory is still mapped: CUDA unmaps before it frees.)
    pub fn remove_memory(&mut self, mem: MemRef) -> usize {
        touch::add(touch::HASH_PROBE);
        let Some(info) = self.mems.remove(mem) else { return 0 };
        if info.entries == 0 {
            return 0;
        }
        self.mems.insert(mem, MemInfo { class: UNSEEN, ..info });
        self.remove_where(|m| m == mem)
    }

    /// Every memory object of `client` is forgotten, with its mappings (client freed): one pass
    /// over the entries.
    pub fn remove_client(&mut self, client: u32) -> usize {
        let mut mapped = false;
        let of_client: Vec<(MemRef, MemInfo)> =
            self.mems.iter().filter(|(m, _)| m.client == client).collect();
        for (m, i) in of_client {
            self.mems.remove(m);
            if i.entries > 0 {
                mapped = true;
                self.mems.insert(m, MemInfo { class: UNSEEN, ..i });
            }
        }
        if !mapped {
            return 0;
        }
        self.remove_where(|m| m.client == client)
    }

    fn remove_where(&mut self, gone: impl Fn(MemRef) -> bool) -> usize {
        let mut removed = Vec::new();
        for m in self.per_gpu.values_mut() {
            let starts: Vec<u64> = m.iter().filter(|(_, e)| gone(e.mem)).map(|(s, _)| s).collect();
            for s in starts {
                if let Some((e, _)) = Self::take(m, &mut self.mems, &mut self.ranges, s) {
                    removed.push((s, e.end - s));
                }
            }
        }
        for &(s, l) in &removed {
            self.tombstone(s, l);
            // the memory under a recorded allocation is gone (RM freed it, maybe with no UVM
            // unmap first): so is the allocation
            self.owned.remove(s, s + l);
        }
        removed.len()
    }

    fn tombstone(&mut self, base: u64, len: u64) {
        let (mut b, mut e) = (base, base.saturating_add(len));
        // the usual case: the same VA freed again, or inside a range already recorded
        if self.tombstones.range(..=b).next_back().is_some_and(|(_, &t)| t >= e) {
            return;
        }
        if let Some((&s, &t)) = self.tombstones.range(..=b).next_back() {
            if t >= b {
                b = s;
                e = e.max(t);
                self.tombstones.remove(&s);
            }
        }
        while let Some((&s, &t)) = self.tombstones.range(b..).next() {
            if s > e {
                break;
            }
            e = e.max(t);
            self.tombstones.remove(&s);
        }
        self.tombstones.insert(b, e);
        if self.tombstones.len() > TOMBSTONES {
            self.tombstones.pop_first();
        }
    }

    /// Whether `addr` was mapped once and has been unmapped or freed since (as far as the
    /// bounded record of removed ranges reaches).
    pub fn was_mapped(&self, addr: u64) -> bool {
        self.tombstones.range(..=addr).next_back().is_some_and(|(_, &t)| addr < t)
    }
}
