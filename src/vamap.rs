//! The exact map from GPU virtual address to the RM memory behind it, per mapping GPU, with UVM's
//! semantics: a new map first unmaps what it overlaps on that GPU; unmaps split entries.
//!
//! Pure data structure: no FFI, no locks.

use crate::decode::Uuid;
use crate::fxhash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use std::fmt;

/// An RM memory object, named by its client and handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemRef {
    pub client: u32,
    pub memory: u32,
}

/// The UVM map call an entry came from (kept whole when the entry is later split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub base: u64,
    pub length: u64,
    pub offset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    end: u64,
    mem: MemRef,
    /// Offset into `mem` of this entry's first byte.
    offset: u64,
    origin: Origin,
}

/// One piece of an exact lookup: `[va, va+len)` is `mem` at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub va: u64,
    pub len: u64,
    pub mem: MemRef,
    pub offset: u64,
    pub origin: Origin,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    Empty,
    Overflow,
    /// Nothing is mapped at `at` (and nothing was recently).
    Unmapped {
        at: u64,
    },
    /// `at` was mapped but has been unmapped or freed.
    Freed {
        at: u64,
    },
    /// Two mapping GPUs see different memory at the same address.
    GpusDisagree {
        at: u64,
    },
    /// The range is covered, but by more than one memory object.
    SpansMemoryObjects {
        count: usize,
    },
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::Empty => write!(f, "zero-length range"),
            Miss::Overflow => write!(f, "range wraps the address space"),
            Miss::Unmapped { at } => write!(f, "unmapped hole at {at:#x} (no UVM mapping seen there)"),
            Miss::Freed { at } => write!(f, "freed: {at:#x} was mapped but has been unmapped or freed"),
            Miss::GpusDisagree { at } => write!(f, "mapping GPUs disagree about the memory at {at:#x}"),
            Miss::SpansMemoryObjects { count } => write!(f, "spans {count} memory objects"),
        }
    }
}

const TOMBSTONES: usize = 4096;

#[derive(Default, Clone)]
pub struct VaMap {
    per_gpu: HashMap<Uuid, BTreeMap<u64, Entry>>,
    /// Removed ranges (merged, start → end), so a miss can say "freed" rather than "unmapped".
    tombstones: BTreeMap<u64, u64>,
    /// Entries per memory object, so that freeing memory that is no longer mapped (the usual
    /// order: UVM_FREE, then RM_FREE) costs no scan.
    per_mem: HashMap<MemRef, usize>,
}

impl VaMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn entries(&self) -> usize {
        self.per_gpu.values().map(|m| m.len()).sum()
    }

    /// UVM_MAP_EXTERNAL_ALLOCATION on one GPU: `[base, base+len)` → `mem` at `offset`.
    pub fn map(&mut self, gpu: Uuid, base: u64, len: u64, mem: MemRef, offset: u64) {
        if len == 0 || base.checked_add(len).is_none() {
            return;
        }
        self.unmap(gpu, base, len);
        let origin = Origin { base, length: len, offset };
        self.per_gpu.entry(gpu).or_default().insert(base, Entry { end: base + len, mem, offset, origin });
        *self.per_mem.entry(mem).or_default() += 1;
    }

    fn forget_entry(per_mem: &mut HashMap<MemRef, usize>, mem: MemRef) {
        if let Some(n) = per_mem.get_mut(&mem) {
            *n -= 1;
            if *n == 0 {
                per_mem.remove(&mem);
            }
        }
    }

    /// UVM_UNMAP_EXTERNAL on one GPU. Returns how many entries it cut or removed.
    pub fn unmap(&mut self, gpu: Uuid, base: u64, len: u64) -> usize {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return 0 };
        let Some(m) = self.per_gpu.get_mut(&gpu) else { return 0 };
        let touched = Self::unmap_in(m, &mut self.per_mem, base, end);
        if touched > 0 {
            self.tombstone(base, len);
        }
        touched
    }

    /// Cuts `[base, end)` out of one GPU's entries. (A GPU's map stays even when empty: GPUs
    /// are few, and dropping and rebuilding its tree on every free/alloc costs allocations.)
    fn unmap_in(m: &mut BTreeMap<u64, Entry>, per_mem: &mut HashMap<MemRef, usize>, base: u64, end: u64) -> usize {
        // The usual cases in one descent (the loop below takes several): the last entry that
        // starts before `end` ends by `base`, so nothing overlaps (a new map); or it is exactly
        // `[base, end)`, so it is the only one that overlaps (entries never overlap): a free.
        match m.range(..end).next_back() {
            None => return 0,
            Some((_, e)) if e.end <= base => return 0,
            Some((&s, e)) if s == base && e.end == end => {
                let e = m.remove(&s).expect("key just found");
                Self::forget_entry(per_mem, e.mem);
                return 1;
            }
            _ => {}
        }
        let mut touched = 0;
        // At most one entry starts before base and reaches into the range; then those inside.
        let mut next = m
            .range(..base)
            .next_back()
            .filter(|(_, e)| e.end > base)
            .map(|(&s, _)| s)
            .or_else(|| m.range(base..end).next().map(|(&s, _)| s));
        while let Some(s) = next {
            let e = m.remove(&s).expect("key just found");
            touched += 1;
            Self::forget_entry(per_mem, e.mem);
            if s < base {
                m.insert(s, Entry { end: base, ..e });
                *per_mem.entry(e.mem).or_default() += 1;
            }
            if e.end > end {
                m.insert(end, Entry { end: e.end, offset: e.offset + (end - s), ..e });
                *per_mem.entry(e.mem).or_default() += 1;
            }
            next = m.range(base..end).next().map(|(&s, _)| s);
        }
        touched
    }

    /// UVM_FREE: the range goes away on every GPU.
    pub fn unmap_all(&mut self, base: u64, len: u64) -> usize {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return 0 };
        let mut touched = 0;
        for m in self.per_gpu.values_mut() {
            touched += Self::unmap_in(m, &mut self.per_mem, base, end);
        }
        if touched > 0 {
            self.tombstone(base, len);
        }
        touched
    }

    /// RM free of a memory object: every mapping of it goes.
    pub fn remove_memory(&mut self, mem: MemRef) -> usize {
        if self.per_mem.remove(&mem).is_none() {
            return 0;
        }
        let mut gone = Vec::new();
        for m in self.per_gpu.values_mut() {
            m.retain(|&s, e| {
                let keep = e.mem != mem;
                if !keep {
                    gone.push((s, e.end - s));
                }
                keep
            });
        }
        for &(s, l) in &gone {
            self.tombstone(s, l);
        }
        gone.len()
    }

    /// Every memory object of `client` loses its mappings (client freed).
    pub fn remove_client(&mut self, client: u32) -> usize {
        let mems: Vec<MemRef> = self.per_mem.keys().filter(|m| m.client == client).copied().collect();
        let mut n = 0;
        for m in mems {
            n += self.remove_memory(m);
        }
        n
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

    /// The memory objects mapped anywhere in `[base, end)`, on any GPU, each once.
    pub fn memory_in(&self, base: u64, end: u64) -> Vec<MemRef> {
        let mut out: Vec<MemRef> = Vec::new();
        for m in self.per_gpu.values() {
            let first = m.range(..base).next_back().filter(|(_, e)| e.end > base).map(|(&s, _)| s).unwrap_or(base);
            for (_, e) in m.range(first..end) {
                if !out.contains(&e.mem) {
                    out.push(e.mem);
                }
            }
        }
        out
    }

    /// Whether some GPU maps `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        self.per_gpu.values().any(|m| m.range(..=addr).next_back().is_some_and(|(_, e)| addr < e.end))
    }

    fn miss_at(&self, at: u64) -> Miss {
        if self.was_mapped(at) {
            Miss::Freed { at }
        } else {
            Miss::Unmapped { at }
        }
    }

    /// The exact cover of `[addr, addr+len)` on one GPU, merged where consecutive entries
    /// continue the same memory; or the first hole.
    fn cover(m: &BTreeMap<u64, Entry>, addr: u64, end: u64) -> Result<Vec<Piece>, u64> {
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = addr;
        let mut cursor = m.range(..=addr).next_back().filter(|(_, e)| e.end > addr).map(|(&s, _)| s).unwrap_or(addr);
        while at < end {
            let Some((&s, e)) = m.range(cursor..).next() else { return Err(at) };
            if s > at {
                return Err(at);
            }
            let piece_end = e.end.min(end);
            let off = e.offset + (at - s);
            match pieces.last_mut() {
                Some(p) if p.mem == e.mem && p.offset + p.len == off => p.len += piece_end - at,
                _ => pieces.push(Piece { va: at, len: piece_end - at, mem: e.mem, offset: off, origin: e.origin }),
            }
            at = piece_end;
            cursor = e.end;
        }
        Ok(pieces)
    }

    /// Exact lookup: the pieces that cover `[addr, addr+len)` on every GPU that maps any of it
    /// (all such GPUs must agree), or why not.
    pub fn lookup(&self, addr: u64, len: u64) -> Result<Vec<Piece>, Miss> {
        if len == 0 {
            return Err(Miss::Empty);
        }
        let end = addr.checked_add(len).ok_or(Miss::Overflow)?;
        let mut answer: Option<Vec<Piece>> = None;
        let mut first_hole: Option<u64> = None;
        // Every GPU that maps any of the range must give the same answer, so order does not matter.
        for m in self.per_gpu.values() {
            let touches = m.range(..end).next_back().is_some_and(|(_, e)| e.end > addr);
            if !touches {
                continue;
            }
            match Self::cover(m, addr, end) {
                Ok(p) => match &answer {
                    None => answer = Some(p),
                    Some(a) if same_backing(a, &p) => {}
                    Some(_) => return Err(Miss::GpusDisagree { at: addr }),
                },
                Err(hole) => {
                    first_hole = Some(first_hole.map_or(hole, |h: u64| h.min(hole)));
                }
            }
        }
        match (answer, first_hole) {
            (Some(_), Some(_)) => Err(Miss::GpusDisagree { at: addr }),
            (Some(p), None) => Ok(p),
            (None, Some(h)) => Err(self.miss_at(h)),
            (None, None) => Err(self.miss_at(addr)),
        }
    }

    /// The common case of [`lookup`](Self::lookup) without an allocation: one GPU maps any of
    /// the range, and one entry there covers all of it. `None`: not that case (ask `lookup`).
    pub fn lookup_one(&self, addr: u64, len: u64) -> Option<Piece> {
        let end = addr.checked_add(len).filter(|_| len > 0)?;
        let mut found = None;
        for m in self.per_gpu.values() {
            let Some((&s, e)) = m.range(..end).next_back().filter(|(_, e)| e.end > addr) else { continue };
            if found.is_some() || s > addr || e.end < end {
                return None;
            }
            found = Some(Piece { va: addr, len, mem: e.mem, offset: e.offset + (addr - s), origin: e.origin });
        }
        found
    }

    /// Like [`lookup`](Self::lookup) but the range must lie in one memory object.
    pub fn lookup_single(&self, addr: u64, len: u64) -> Result<Piece, Miss> {
        let p = self.lookup(addr, len)?;
        if p.len() == 1 {
            Ok(p[0])
        } else {
            Err(Miss::SpansMemoryObjects { count: p.len() })
        }
    }

    /// All entries of all GPUs as (gpu, va, len, mem, offset), for diagnostics and tests.
    pub fn dump(&self) -> Vec<(Uuid, u64, u64, MemRef, u64)> {
        let mut v: Vec<_> =
            self.per_gpu.iter().flat_map(|(g, m)| m.iter().map(move |(&s, e)| (*g, s, e.end - s, e.mem, e.offset))).collect();
        v.sort();
        v
    }
}

fn same_backing(a: &[Piece], b: &[Piece]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.va == y.va && x.len == y.len && x.mem == y.mem && x.offset == y.offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G0: Uuid = [0; 16];
    const G1: Uuid = [1; 16];
    fn m(h: u32) -> MemRef {
        MemRef { client: 0xc1d0_0001, memory: h }
    }

    #[test]
    fn exact_hit_and_sub_range() {
        let mut v = VaMap::new();
        v.map(G0, 0x10_0000, 0x20_0000, m(1), 0);
        let p = v.lookup_single(0x10_0000 + 0x1000, 0x1000).unwrap();
        assert_eq!((p.va, p.len, p.mem, p.offset), (0x10_1000, 0x1000, m(1), 0x1000));
        assert_eq!(p.origin, Origin { base: 0x10_0000, length: 0x20_0000, offset: 0 });
    }

    #[test]
    fn miss_reasons() {
        let mut v = VaMap::new();
        v.map(G0, 0x10_0000, 0x1_0000, m(1), 0);
        v.map(G0, 0x11_0000, 0x1_0000, m(2), 0);
        assert_eq!(v.lookup(0, 0), Err(Miss::Empty));
        assert_eq!(v.lookup(u64::MAX, 2), Err(Miss::Overflow));
        assert_eq!(v.lookup(0x5000, 0x1000), Err(Miss::Unmapped { at: 0x5000 }));
        assert_eq!(v.lookup(0x10_f000, 0x3000).unwrap().len(), 2);
        assert_eq!(v.lookup_single(0x10_f000, 0x3000), Err(Miss::SpansMemoryObjects { count: 2 }));
        // hole after the second mapping
        assert_eq!(v.lookup(0x11_f000, 0x2000), Err(Miss::Unmapped { at: 0x12_0000 }));
        v.unmap_all(0x10_0000, 0x1_0000);
        assert_eq!(v.lookup(0x10_0000, 0x1000), Err(Miss::Freed { at: 0x10_0000 }));
        assert_eq!(v.remove_memory(m(2)), 1);
        assert_eq!(v.lookup(0x11_0000, 0x1000), Err(Miss::Freed { at: 0x11_0000 }));
        assert_eq!(v.entries(), 0);
    }

    #[test]
    fn new_map_replaces_overlap_and_splits() {
        let mut v = VaMap::new();
        v.map(G0, 0x0, 0x10_0000, m(1), 0x100_0000);
        v.map(G0, 0x4_0000, 0x1_0000, m(2), 0);
        let d = v.dump();
        assert_eq!(
            d,
            vec![(G0, 0, 0x4_0000, m(1), 0x100_0000), (G0, 0x4_0000, 0x1_0000, m(2), 0), (G0, 0x5_0000, 0xb_0000, m(1), 0x105_0000)]
        );
        // The split-off tail keeps offsets consistent and merges back on lookup only when contiguous.
        let p = v.lookup(0x5_0000, 0x1000).unwrap();
        assert_eq!(p[0].offset, 0x105_0000);
    }

    #[test]
    fn per_gpu_unmap_and_agreement() {
        let mut v = VaMap::new();
        v.map(G0, 0x10_0000, 0x1_0000, m(1), 0);
        v.map(G1, 0x10_0000, 0x1_0000, m(1), 0);
        assert!(v.lookup_single(0x10_0000, 0x1_0000).is_ok());
        v.unmap(G1, 0x10_0000, 0x8000);
        // G1 now half-covers: the answer is no longer exact on every GPU that maps it.
        assert_eq!(v.lookup(0x10_0000, 0x1_0000), Err(Miss::GpusDisagree { at: 0x10_0000 }));
        v.map(G1, 0x10_0000, 0x1_0000, m(9), 0);
        assert_eq!(v.lookup(0x10_0000, 0x1000), Err(Miss::GpusDisagree { at: 0x10_0000 }));
    }

    /// A naive model: one entry per 4 KiB page per GPU.
    #[derive(Default)]
    struct Model {
        pages: HashMap<(u8, u64), (MemRef, u64)>,
    }
    const PAGE: u64 = 0x1000;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn property_against_naive_page_model() {
        let gpus = [G0, G1];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut v = VaMap::new();
        let mut model = Model::default();
        const SPACE: u64 = 64; // pages
        let ops = 100_000;
        let mut hits = 0u64;
        for _ in 0..ops {
            let g = rng.below(2) as u8;
            let base = rng.below(SPACE) * PAGE;
            let len = (1 + rng.below(8)) * PAGE;
            match rng.below(10) {
                0..=3 => {
                    let mem = m(1 + rng.below(6) as u32);
                    let off = rng.below(16) * PAGE;
                    v.map(gpus[g as usize], base, len, mem, off);
                    for i in 0..len / PAGE {
                        model.pages.insert((g, base / PAGE + i), (mem, off + i * PAGE));
                    }
                }
                4 | 5 => {
                    v.unmap(gpus[g as usize], base, len);
                    for i in 0..len / PAGE {
                        model.pages.remove(&(g, base / PAGE + i));
                    }
                }
                6 => {
                    v.unmap_all(base, len);
                    for gg in 0..2u8 {
                        for i in 0..len / PAGE {
                            model.pages.remove(&(gg, base / PAGE + i));
                        }
                    }
                }
                7 => {
                    let mem = m(1 + rng.below(6) as u32);
                    v.remove_memory(mem);
                    model.pages.retain(|_, (mm, _)| *mm != mem);
                }
                _ => {
                    // lookup, compared page by page with the model; the fast path agrees with it
                    let got = v.lookup(base, len);
                    if let Some(one) = v.lookup_one(base, len) {
                        assert_eq!(got, Ok(vec![one]), "lookup_one at {base:#x}+{len:#x}");
                    }
                    let first = base / PAGE;
                    let mut expect: Option<Vec<(MemRef, u64)>> = Some(Vec::new());
                    for i in 0..len / PAGE {
                        let a = model.pages.get(&(0, first + i)).copied();
                        let b = model.pages.get(&(1, first + i)).copied();
                        let any0 = (0..len / PAGE).any(|j| model.pages.contains_key(&(0, first + j)));
                        let any1 = (0..len / PAGE).any(|j| model.pages.contains_key(&(1, first + j)));
                        let page = match (any0, any1) {
                            (true, true) => {
                                if a.is_some() && a == b {
                                    a
                                } else {
                                    None
                                }
                            }
                            (true, false) => a,
                            (false, true) => b,
                            (false, false) => None,
                        };
                        match (page, expect.as_mut()) {
                            (Some(p), Some(e)) => e.push(p),
                            _ => expect = None,
                        }
                    }
                    match (got, expect) {
                        (Ok(pieces), Some(pages)) => {
                            hits += 1;
                            // expand pieces into pages and compare exactly
                            let mut exp = Vec::new();
                            for p in &pieces {
                                assert_eq!(p.va % PAGE, 0);
                                for i in 0..p.len / PAGE {
                                    exp.push((p.mem, p.offset + i * PAGE));
                                }
                            }
                            assert_eq!(exp, pages, "lookup {base:#x}+{len:#x}");
                            // merged pieces never continue one another
                            for w in pieces.windows(2) {
                                assert!(!(w[0].mem == w[1].mem && w[0].offset + w[0].len == w[1].offset));
                            }
                        }
                        (Err(_), None) => {}
                        (got, exp) => panic!("lookup {base:#x}+{len:#x}: map {got:?} model {exp:?}"),
                    }
                }
            }
        }
        assert!(hits > 1000, "the property test must exercise hits, got {hits}");
        // the per-memory index always counts exactly the entries there are
        let mut counted: HashMap<MemRef, usize> = HashMap::default();
        for (_, _, _, m, _) in v.dump() {
            *counted.entry(m).or_default() += 1;
        }
        assert_eq!(counted, v.per_mem);
    }
}
