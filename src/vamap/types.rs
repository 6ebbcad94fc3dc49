//! What the map holds and answers: memory objects, the pieces of a lookup, what is known of an
//! allocation, why a lookup missed; and the count of entries that map each memory object.
#![forbid(unsafe_code)]

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

/// One piece of an exact lookup: `[va, va+len)` is `mem` at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub va: u64,
    pub len: u64,
    pub mem: MemRef,
    pub offset: u64,
    pub origin: Origin,
    /// `mem`'s allocation (what [`VaMap::memory`] says of it).
    pub alloc: Allocation,
}

/// What the map knows of a memory object's allocation: the object it was allocated under (its
/// device) and its class; [`Allocation::UNSEEN`] when the allocation was not seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub parent: u32,
    pub class: u32,
}

impl Allocation {
    pub const UNSEEN: Allocation = Allocation { parent: 0, class: UNSEEN };

    /// The class, if the allocation was seen.
    pub fn class(&self) -> Option<u32> {
        (self.class != UNSEEN).then_some(self.class)
    }

    /// The parent (device) handle, if the allocation was seen.
    pub fn parent(&self) -> Option<u32> {
        (self.class != UNSEEN).then_some(self.parent)
    }
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
            Miss::Unmapped { at } => {
                write!(f, "unmapped hole at {at:#x} (no UVM mapping seen there)")
            }
            Miss::Freed { at } => {
                write!(f, "freed: {at:#x} was mapped but has been unmapped or freed")
            }
            Miss::GpusDisagree { at } => {
                write!(f, "mapping GPUs disagree about the memory at {at:#x}")
            }
            Miss::SpansMemoryObjects { count } => write!(f, "spans {count} memory objects"),
        }
    }
}

/// What the map knows of a memory object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// The object it was allocated under (its device), and its class; 0 and [`UNSEEN`] when its
    /// allocation was not seen (mapped all the same).
    pub parent: u32,
    pub class: u32,
    pub(crate) entries: u32,
    /// Which allocation of this handle it is: a handle freed and allocated again is new memory
    /// under an old name, and a dma-buf of the old one must never stand for it.
    pub serial: u64,
}

/// The class of memory whose allocation was not seen (no RM class is 0).
pub const UNSEEN: u32 = 0;
