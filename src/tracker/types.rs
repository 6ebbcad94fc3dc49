//! What the tracker knows and says: RM objects, REGISTER_VIDMEM tuples, the shadow oracle's
//! counts and verdicts, and the notices worth a log line.
#![forbid(unsafe_code)]

use crate::vamap::{MemRef, Miss};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjKind {
    Client {
        fd: i32,
    },
    Device {
        device_id: u32,
    },
    Subdevice,
    VaSpace {
        flags: u32,
    },
    /// (12 bytes with its parent: a job holds a million of these. A duplicate's root memory is
    /// in `Tracker::dups`.)
    Memory {
        class: u32,
    },
    P2p,
    Other {
        class: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Obj {
    pub parent: u32,
    pub kind: ObjKind,
}

/// A REGISTER_VIDMEM tuple, as libcuda issues it and as gdrshim predicts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VidmemTuple {
    pub mem: MemRef,
    pub address: u64,
    pub size: u64,
    pub offset: u64,
}

impl fmt::Display for VidmemTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{hClient={:#010x} hMemory={:#010x} address={:#x} size={:#x} offset={:#x}}}",
            self.mem.client, self.mem.memory, self.address, self.size, self.offset
        )
    }
}

/// A REGISTER_VIDMEM libcuda made itself, and whether an allocation's prediction matched it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NativeReg {
    pub tuple: VidmemTuple,
    pub matched: bool,
}

/// Counters that end up in the exit summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShadowCounts {
    pub native: u64,
    pub matched: u64,
    pub mismatched: u64,
    pub unpredicted: u64,
    pub predicted_only: u64,
    pub user_allocs: u64,
    pub uncovered: u64,
    /// dma-bufs libcuda exported for `cuMemGetHandleForAddressRange` (datacenter GPUs), and
    /// those equal / not equal to the map's plan of the same range.
    pub dmabuf_native: u64,
    pub dmabuf_matched: u64,
    pub dmabuf_mismatched: u64,
}

impl ShadowCounts {
    /// The counts as the summary names them.
    pub fn pairs(&self) -> [(&'static str, u64); 10] {
        [
            ("native", self.native),
            ("matched", self.matched),
            ("mismatched", self.mismatched),
            ("unpredicted", self.unpredicted),
            ("predicted_only", self.predicted_only),
            ("user_allocs", self.user_allocs),
            ("uncovered", self.uncovered),
            ("dmabuf_native", self.dmabuf_native),
            ("dmabuf_matched", self.dmabuf_matched),
            ("dmabuf_mismatched", self.dmabuf_mismatched),
        ]
    }
}

/// What the shadow oracle found for one user allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Covered by the map; per piece the predicted tuple and what libcuda registered.
    Covered(Vec<(VidmemTuple, NativeAnswer)>),
    Uncovered(Miss),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeAnswer {
    Matched,
    Mismatched(VidmemTuple),
    /// libcuda registered nothing for this memory.
    None,
}

/// Something worth a log line, produced while applying an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    NativeRegistrationPresent,
    /// A native registration went away without any user allocation having predicted it.
    Unpredicted(VidmemTuple),
    UnknownUvmFree {
        base: u64,
    },
    /// libcuda's dma-buf of `[ptr, ptr+size)` is not what the map predicts.
    DmabufMismatch {
        ptr: u64,
        size: u64,
        native: String,
        predicted: String,
    },
}
