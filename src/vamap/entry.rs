//! One entry of the map: where a GPU VA range's bytes are in RM memory (24 bytes; the start is
//! kept by whoever holds the entry).
#![forbid(unsafe_code)]

use super::mems::{AllocId, ALLOC_ID_BITS};
use super::types::{MemRef, Origin};

/// Set in `Entry::offset_bits` when the entry's extent is also a UVM external range, which then
/// needs no record of its own (the usual allocation: one range, mapped whole, once).
const CLAIMS_RANGE: u64 = 1 << 63;
/// Set when the entry's extent is exactly an allocation the program made through CUDA (`owned`).
const OWNED: u64 = 1 << 62;
/// Offsets into RM memory at or above this (4 PiB) cannot be real; such a map is not kept.
pub const OFFSET_LIMIT: u64 = 1 << OFFSET_BITS;
const OFFSET_BITS: u32 = 52;
// the allocation's number between the offset and the flags
const _: () = assert!(OFFSET_BITS + ALLOC_ID_BITS == 62);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)] // `end` first: see cells::Cell
pub struct Entry {
    pub end: u64,
    offset_bits: u64,
    pub mem: MemRef,
}

impl Entry {
    /// What an empty or hint cell holds: no entry ends at 0.
    pub const NONE: Entry = Entry { end: 0, offset_bits: 0, mem: MemRef { client: 0, memory: 0 } };

    /// `alloc`: `mem`'s allocation as the map knew it when this entry was made, by number; it
    /// cannot change while the entry lives (a handle allocated again loses its mappings first),
    /// so a lookup answers class and parent without the memory table's cache miss.
    pub fn new(end: u64, offset: u64, mem: MemRef, alloc: AllocId) -> Entry {
        debug_assert!(offset < OFFSET_LIMIT);
        Entry { end, offset_bits: offset | alloc.bits() << OFFSET_BITS, mem }
    }

    /// Offset into `mem` of this entry's first byte.
    pub fn offset(&self) -> u64 {
        self.offset_bits & (OFFSET_LIMIT - 1)
    }

    /// The number of `mem`'s allocation ([`super::mems::MemTable::allocation`] says which).
    pub fn alloc(&self) -> AllocId {
        AllocId::from_bits(self.offset_bits >> OFFSET_BITS)
    }

    /// Whether the program owns the entry's bytes (they are, or are the rest of, one of its
    /// allocations).
    pub fn owned(&self) -> bool {
        self.offset_bits & OWNED != 0
    }

    pub fn with_owned(self, owned: bool) -> Entry {
        Entry {
            offset_bits: if owned { self.offset_bits | OWNED } else { self.offset_bits & !OWNED },
            ..self
        }
    }

    pub fn claims_range(&self) -> bool {
        self.offset_bits & CLAIMS_RANGE != 0
    }

    pub fn claiming(self) -> Entry {
        Entry { offset_bits: self.offset_bits | CLAIMS_RANGE, ..self }
    }

    /// The same memory, cut to `[start, end)` of an entry that began at `was`: a cut never
    /// claims its range, and its bytes stay the program's if they were.
    pub fn cut(&self, was: u64, start: u64, end: u64) -> Entry {
        Entry::new(end, self.offset() + (start - was), self.mem, self.alloc())
            .with_owned(self.owned())
    }

    /// The map call of an entry that is one whole call.
    pub fn whole(&self, start: u64) -> Origin {
        Origin { base: start, length: self.end - start, offset: self.offset() }
    }
}

// the cell that holds an entry is 32 bytes with its start (cells::Cell)
const _: () = assert!(std::mem::size_of::<Entry>() == 24);
