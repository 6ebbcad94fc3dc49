//! The memory table: every memory object the process allocated or mapped (a million in a large
//! job), its allocation, how many entries map it and which allocation of its handle it is, in a
//! 16-byte slot of one open-addressing table kept between 57 % and 85 % full (issue 48: a std
//! `HashMap` of 32-byte slots, grown by doubling, was 69 bytes per object at a million, 48 %
//! full). The allocation (parent, class) is a number of 10 bits ([`AllocId`]): a process has
//! few devices and classes, so the numbers stay few, and an entry of the map carries its
//! memory's number in its spare offset bits, keeping its cell at 32 bytes. A record that does not
//! fit a slot (a number past the last, more entries or a later serial than the slot holds) lives
//! in `wide`, a std map, whole: nothing is ever cut short.
#![forbid(unsafe_code)]

use super::touch;
use super::types::{Allocation, MemInfo, MemRef, UNSEEN};
use rustc_hash::FxHashMap as HashMap;

/// An allocation (parent, class) by number: 0 is [`Allocation::UNSEEN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocId(u16);

/// Bits of an [`AllocId`].
pub const ALLOC_ID_BITS: u32 = 10;

impl AllocId {
    pub const UNSEEN: AllocId = AllocId(0);
    /// Past the last number: the memory table's record says (it is then in `wide`).
    const ASK: AllocId = AllocId((1 << ALLOC_ID_BITS) - 1);

    pub fn bits(self) -> u64 {
        u64::from(self.0)
    }

    pub fn from_bits(bits: u64) -> AllocId {
        AllocId((bits & ((1 << ALLOC_ID_BITS) - 1)) as u16)
    }
}

/// A slot's record: serial (40 bits), entries (14), allocation number (10).
const ENTRIES_BITS: u32 = 14;
const SERIAL_BITS: u32 = 64 - ENTRIES_BITS - ALLOC_ID_BITS;
/// The key of a free slot (the memory object with this key lives in `wide`).
const FREE: u64 = u64::MAX;
/// Growth: past 85 % full, half as many slots again.
const FULL_NUM: usize = 17;
const FULL_DEN: usize = 20;

#[derive(Clone, Copy)]
struct Slot {
    key: u64,
    record: u64,
}

const FREE_SLOT: Slot = Slot { key: FREE, record: 0 };

fn key(mem: MemRef) -> u64 {
    (u64::from(mem.client) << 32) | u64::from(mem.memory)
}

fn mem_of(key: u64) -> MemRef {
    MemRef { client: (key >> 32) as u32, memory: key as u32 }
}

#[derive(Default, Clone)]
pub struct MemTable {
    /// Robin Hood linear probing: a key sits at or after its home, and never further from it
    /// than the key before it is from its own, so a search stops at the first slot closer to
    /// home than it; a removal shifts the run after it back (no tombstones).
    slots: Vec<Slot>,
    len: usize,
    wide: HashMap<MemRef, MemInfo>,
    /// By number: the allocations seen (never forgotten; at most 2^10 - 1).
    allocs: Vec<Allocation>,
    ids: HashMap<(u32, u32), AllocId>,
}

impl MemTable {
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing, then the high half of a product as the slot (any table length)
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (key >> 29);
        ((u128::from(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)) * self.slots.len() as u128) >> 64)
            as usize
    }

    fn distance(&self, at: usize, key: u64) -> usize {
        let home = self.home(key);
        if at >= home {
            at - home
        } else {
            at + self.slots.len() - home
        }
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.slots.len() {
            0
        } else {
            at + 1
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() || key == FREE {
            return None;
        }
        let (mut at, mut d) = (self.home(key), 0);
        loop {
            let s = self.slots[at];
            if s.key == key {
                return Some(at);
            }
            if s.key == FREE || self.distance(at, s.key) < d {
                return None;
            }
            at = self.next(at);
            d += 1;
        }
    }

    fn put_new(&mut self, mut cur: Slot) {
        let (mut at, mut d) = (self.home(cur.key), 0);
        loop {
            let s = self.slots[at];
            if s.key == FREE {
                self.slots[at] = cur;
                return;
            }
            let sd = self.distance(at, s.key);
            if sd < d {
                self.slots[at] = cur;
                cur = s;
                d = sd;
            }
            at = self.next(at);
            d += 1;
        }
    }

    fn take_at(&mut self, mut at: usize) -> Slot {
        let taken = self.slots[at];
        loop {
            let n = self.next(at);
            let s = self.slots[n];
            if s.key == FREE || self.distance(n, s.key) == 0 {
                self.slots[at] = FREE_SLOT;
                break;
            }
            self.slots[at] = s;
            at = n;
        }
        self.len -= 1;
        taken
    }

    fn grow(&mut self) {
        let len = (self.slots.len() + self.slots.len() / 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![FREE_SLOT; len]);
        for s in old.into_iter().filter(|s| s.key != FREE) {
            self.put_new(s);
        }
    }

    /// The number of an allocation, given one if it has none and numbers are left.
    fn id_of(&mut self, parent: u32, class: u32) -> AllocId {
        if class == UNSEEN {
            return AllocId::UNSEEN;
        }
        if self.allocs.is_empty() {
            self.allocs.push(Allocation::UNSEEN);
        }
        if let Some(&id) = self.ids.get(&(parent, class)) {
            return id;
        }
        if self.allocs.len() >= usize::from(AllocId::ASK.0) {
            return AllocId::ASK;
        }
        let id = AllocId(self.allocs.len() as u16);
        self.allocs.push(Allocation { parent, class });
        self.ids.insert((parent, class), id);
        id
    }

    fn pack(&mut self, i: &MemInfo) -> Option<u64> {
        let id = self.id_of(i.parent, i.class);
        (id != AllocId::ASK && i.entries < (1 << ENTRIES_BITS) && i.serial < (1 << SERIAL_BITS))
            .then(|| {
                i.serial << (64 - SERIAL_BITS) | u64::from(i.entries) << ALLOC_ID_BITS | id.bits()
            })
    }

    fn unpack(&self, record: u64) -> MemInfo {
        let id = AllocId::from_bits(record).0 as usize;
        let a = self.allocs.get(id).copied().unwrap_or(Allocation::UNSEEN);
        MemInfo {
            parent: a.parent,
            class: a.class,
            entries: ((record >> ALLOC_ID_BITS) & ((1 << ENTRIES_BITS) - 1)) as u32,
            serial: record >> (64 - SERIAL_BITS),
        }
    }

    pub fn get(&self, mem: MemRef) -> Option<MemInfo> {
        match self.find(key(mem)) {
            Some(at) => Some(self.unpack(self.slots[at].record)),
            None if self.wide.is_empty() => None,
            None => self.wide.get(&mem).copied(),
        }
    }

    pub fn contains(&self, mem: MemRef) -> bool {
        self.get(mem).is_some()
    }

    /// Sets `mem`'s record (of a class [`UNSEEN`], the parent is not kept).
    pub fn insert(&mut self, mem: MemRef, info: MemInfo) {
        let info = if info.class == UNSEEN { MemInfo { parent: 0, ..info } } else { info };
        let k = key(mem);
        let packed = if k == FREE { None } else { self.pack(&info) };
        match (self.find(k), packed) {
            (Some(at), Some(r)) => self.slots[at].record = r,
            (Some(at), None) => {
                self.take_at(at);
                self.wide.insert(mem, info);
            }
            (None, _) if self.wide.contains_key(&mem) => {
                self.wide.insert(mem, info);
            }
            (None, Some(r)) => {
                if (self.len + 1) * FULL_DEN > self.slots.len() * FULL_NUM {
                    self.grow();
                }
                self.put_new(Slot { key: k, record: r });
                self.len += 1;
            }
            (None, None) => {
                self.wide.insert(mem, info);
            }
        }
    }

    pub fn remove(&mut self, mem: MemRef) -> Option<MemInfo> {
        match self.find(key(mem)) {
            Some(at) => {
                let s = self.take_at(at);
                Some(self.unpack(s.record))
            }
            None => self.wide.remove(&mem),
        }
    }

    pub fn len(&self) -> usize {
        self.len + self.wide.len()
    }

    /// Every record, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (MemRef, MemInfo)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.key != FREE)
            .map(|s| (mem_of(s.key), self.unpack(s.record)))
            .chain(self.wide.iter().map(|(m, i)| (*m, *i)))
    }

    /// One entry more maps `mem`; the number of its allocation as known.
    pub fn count_in(&mut self, mem: MemRef) -> AllocId {
        touch::add(touch::HASH_PROBE);
        const ONE: u64 = 1 << ALLOC_ID_BITS;
        if let Some(at) = self.find(key(mem)) {
            let r = self.slots[at].record;
            if (r >> ALLOC_ID_BITS) & (ONE - 1) < ONE - 1 {
                self.slots[at].record = r + ONE; // the usual case, in place
                return AllocId::from_bits(r);
            }
        }
        let mut i =
            self.get(mem).unwrap_or(MemInfo { parent: 0, class: UNSEEN, entries: 0, serial: 0 });
        i.entries += 1;
        self.insert(mem, i);
        match self.find(key(mem)) {
            Some(at) => AllocId::from_bits(self.slots[at].record),
            None => AllocId::ASK,
        }
    }

    /// One entry fewer maps `mem`; a record of an allocation not seen goes with its last entry.
    pub fn count_out(&mut self, mem: MemRef) {
        touch::add(touch::HASH_PROBE);
        const ONE: u64 = 1 << ALLOC_ID_BITS;
        if let Some(at) = self.find(key(mem)) {
            let r = self.slots[at].record;
            let entries = (r >> ALLOC_ID_BITS) & (ONE - 1);
            if entries > 1 || (entries == 1 && AllocId::from_bits(r) != AllocId::UNSEEN) {
                self.slots[at].record = r - ONE;
                return;
            }
        }
        if let Some(mut i) = self.get(mem) {
            i.entries -= 1;
            if i.entries == 0 && i.class == UNSEEN {
                self.remove(mem);
            } else {
                self.insert(mem, i);
            }
        }
    }

    /// The allocation numbered `id` (an entry of `mem` carries it).
    pub fn allocation(&self, id: AllocId, mem: MemRef) -> Allocation {
        if id == AllocId::ASK {
            return self
                .get(mem)
                .map_or(Allocation::UNSEEN, |i| Allocation { parent: i.parent, class: i.class });
        }
        self.allocs.get(id.0 as usize).copied().unwrap_or(Allocation::UNSEEN)
    }

    /// Every slot's key is where a search finds it, and the count is right.
    #[cfg(test)]
    pub fn check(&self) {
        let used = self.slots.iter().filter(|s| s.key != FREE).count();
        assert_eq!(used, self.len, "the table counts its slots");
        for s in self.slots.iter().filter(|s| s.key != FREE) {
            assert!(self.find(s.key).is_some(), "{:#x} is found", s.key);
            assert!(!self.wide.contains_key(&mem_of(s.key)), "{:#x} is kept once", s.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_agrees_with_a_std_map_through_growth_removals_and_wide_records() {
        let mut t = MemTable::default();
        let mut model: std::collections::HashMap<MemRef, MemInfo> = Default::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for op in 0..200_000u64 {
            // sequential handles, a few clients, and the key that is a free slot's
            let mem = match rnd(50) {
                0 => MemRef { client: u32::MAX, memory: u32::MAX },
                _ => MemRef { client: 1 + rnd(3) as u32, memory: 0x1000 + rnd(5000) as u32 },
            };
            match rnd(4) {
                0 | 1 => {
                    let class = [UNSEEN, 0x40, 0x3e][rnd(3) as usize];
                    let info = MemInfo {
                        // past the last allocation number now and then
                        parent: if rnd(10) == 0 { 0x1_0000 + op as u32 } else { 0xd0 },
                        class,
                        entries: [0, 3, 1 << 20][rnd(3) as usize],
                        serial: if rnd(20) == 0 { 1 << 40 } else { op },
                    };
                    let info = if class == UNSEEN { MemInfo { parent: 0, ..info } } else { info };
                    t.insert(mem, info);
                    model.insert(mem, info);
                }
                2 => assert_eq!(t.remove(mem), model.remove(&mem)),
                _ => assert_eq!(t.get(mem), model.get(&mem).copied()),
            }
            if op % 10_007 == 0 {
                t.check();
                assert_eq!(t.len(), model.len());
                let mut all: Vec<_> = t.iter().collect();
                all.sort_by_key(|(m, _)| *m);
                let mut want: Vec<_> = model.iter().map(|(m, i)| (*m, *i)).collect();
                want.sort_by_key(|(m, _)| *m);
                assert_eq!(all, want);
            }
        }
        assert!(!t.wide.is_empty() && t.len > 1000, "both kinds of record were kept");
        assert!(t.allocs.len() == (1 << ALLOC_ID_BITS) - 1, "the numbers ran out");
    }

    #[test]
    fn a_slot_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }
}

#[cfg(test)]
mod through_the_map {
    use super::super::VaMap;
    use super::*;

    #[test]
    fn past_the_last_allocation_number_a_lookup_reads_the_allocation_from_the_table() {
        let mut v = VaMap::new();
        let gpu: crate::abi::Uuid = [1; 16];
        let n = 1u32 << ALLOC_ID_BITS;
        for k in 0..n + 50 {
            let mem = MemRef { client: 1, memory: 0x100 + k };
            // a parent each: more allocations than numbers
            v.add_memory(mem, 0x1_0000 + k, 0x40);
            v.map(gpu, 0x1000_0000_0000 + u64::from(k) * 0x20_0000, 0x20_0000, mem, 0);
        }
        for k in [0, n - 2, n - 1, n, n + 49] {
            let p = v.lookup_one(0x1000_0000_0000 + u64::from(k) * 0x20_0000, 0x1000).unwrap();
            assert_eq!(p.mem.memory, 0x100 + k);
            assert_eq!((p.alloc.parent(), p.alloc.class()), (Some(0x1_0000 + k), Some(0x40)));
            assert_eq!(v.memory(p.mem).map(|i| i.parent), Some(0x1_0000 + k));
        }
        assert!(v.mems.wide.len() >= 50, "the records past the numbers are kept whole");
        assert!(!v.only_sysmem_in(0x1000_0000_0000, 0x1000_0000_1000));
    }
}
