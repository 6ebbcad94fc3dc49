//! What a decoded call is: the device node it was made on, the typed events, the outcome of
//! decoding, the releases pending before a call; and how a call that failed reads.
#![forbid(unsafe_code)]

use crate::abi::{status, Uuid};

/// Which NVIDIA device node an fd refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DevKind {
    Ctl,
    Gpu(u32),
    Uvm,
}

impl DevKind {
    pub fn tag(&self) -> String {
        match self {
            DevKind::Ctl => "c".into(),
            DevKind::Gpu(n) => format!("g{n}"),
            DevKind::Uvm => "u".into(),
        }
    }
    pub fn parse(s: &str) -> Option<DevKind> {
        match s {
            "c" => Some(DevKind::Ctl),
            "u" => Some(DevKind::Uvm),
            _ => s.strip_prefix('g')?.parse().ok().map(DevKind::Gpu),
        }
    }
}

/// Where an ioctl's embedded pointers (alloc params, control params) can be read.
pub trait ParamReader {
    /// Exactly `len` bytes at user pointer `ptr`, or `None` if they cannot be read.
    fn read(&self, ptr: u64, len: usize) -> Option<Vec<u8>>;
    /// The same for the small structs the decoder reads (at most [`ParamBytes::CAP`] bytes),
    /// without a heap allocation where the reader can (the live hook: this runs on every call).
    fn read_small(&self, ptr: u64, len: usize) -> Option<ParamBytes> {
        self.read(ptr, len).and_then(|v| ParamBytes::from_slice(&v[..len.min(v.len())]))
    }
}

/// Up to 128 parameter bytes on the stack, zero beyond `len`.
#[derive(Clone, Copy)]
pub struct ParamBytes {
    len: usize,
    buf: [u8; ParamBytes::CAP],
}
impl ParamBytes {
    pub const CAP: usize = 128;
    pub fn from_slice(b: &[u8]) -> Option<ParamBytes> {
        let mut p = ParamBytes { len: b.len(), buf: [0; Self::CAP] };
        p.buf.get_mut(..b.len())?.copy_from_slice(b);
        Some(p)
    }
    /// The bytes, zero-extended to at least `n` (older branches' shorter structs).
    pub fn padded(&self, n: usize) -> &[u8] {
        &self.buf[..n.clamp(self.len, Self::CAP)]
    }
}
impl core::ops::Deref for ParamBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Reads nothing: for calls whose embedded pointers must not be followed.
pub struct NoParams;
impl ParamReader for NoParams {
    fn read(&self, _ptr: u64, _len: usize) -> Option<Vec<u8>> {
        None
    }
}

/// Control calls of libcuda's own NV503C object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum P2pCtrl {
    RegisterVaSpace { h_vaspace: u32, token: u64 },
    UnregisterVaSpace { h_vaspace: u32 },
    RegisterVidmem { h_memory: u32, address: u64, size: u64, offset: u64 },
    UnregisterVidmem { h_memory: u32 },
    RegisterPid { h_client: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    RootClient {
        fd: i32,
        h_client: u32,
    },
    Device {
        h_client: u32,
        h_device: u32,
        device_id: u32,
    },
    Subdevice {
        h_client: u32,
        h_device: u32,
        h_subdevice: u32,
        subdevice_id: u32,
    },
    VaSpace {
        h_client: u32,
        h_parent: u32,
        h_vaspace: u32,
        class: u32,
        flags: u32,
    },
    /// Memory object; `size` is `None` when the parameters could not be read.
    Memory {
        h_client: u32,
        h_parent: u32,
        h_memory: u32,
        class: u32,
        size: Option<u64>,
        attr: u32,
        attr2: u32,
        flags: u32,
    },
    OtherObject {
        h_client: u32,
        h_parent: u32,
        h_object: u32,
        class: u32,
    },
    /// libcuda (or anyone but us) allocated an NV50_THIRD_PARTY_P2P object.
    P2pAlloc {
        h_client: u32,
        h_parent: u32,
        h_object: u32,
        flags: u32,
    },
    P2pControl {
        h_client: u32,
        h_object: u32,
        ctrl: P2pCtrl,
    },
    Free {
        h_client: u32,
        h_parent: u32,
        h_object: u32,
    },
    Dup {
        h_client: u32,
        h_parent: u32,
        h_object: u32,
        h_client_src: u32,
        h_object_src: u32,
    },
    Version(String),
    UvmRegisterGpu {
        uuid: Uuid,
        rm_ctrl_fd: i32,
        h_client: u32,
    },
    UvmRegisterGpuVaSpace {
        uuid: Uuid,
        rm_ctrl_fd: i32,
        h_client: u32,
        h_vaspace: u32,
    },
    UvmCreateExternalRange {
        base: u64,
        length: u64,
    },
    UvmMapExternal {
        base: u64,
        length: u64,
        offset: u64,
        gpus: GpuList,
        rm_ctrl_fd: i32,
        h_client: u32,
        h_memory: u32,
    },
    UvmUnmapExternal {
        base: u64,
        length: u64,
        gpu: Uuid,
    },
    UvmFree {
        base: u64,
        length: Option<u64>,
    },
    /// A dma-buf export made by the program (libcuda's `cuMemGetHandleForAddressRange`): boxed,
    /// it is large and rare.
    DmabufExport(Box<ExportCall>),
}

/// One NV_ESC_EXPORT_TO_DMABUF_FD call as RM accepted it: `fd` is the buffer's fd after the call
/// (new when the call created it), `pieces` the `num_objects` handles from slot `index` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportCall {
    pub fd: i32,
    pub h_client: u32,
    pub total_objects: u32,
    pub index: u32,
    pub total_size: u64,
    pub mapping_type: u8,
    /// (hMemory, offset, size) per piece.
    pub pieces: Vec<(u32, u64, u64)>,
}

/// The GPUs of one UVM map call: inline for one (the usual case), so that decoding the call in
/// the ioctl hook allocates nothing.
pub type GpuList = smallvec::SmallVec<[Uuid; 1]>;

/// What one finished ioctl amounted to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Event(Event),
    /// A well-formed call that the map does not need.
    Ignored,
    /// The kernel refused it (ioctl rc) or RM/UVM answered a status other than NV_OK.
    Failed {
        rc: i32,
        status: u32,
    },
    /// The request's size does not match what this branch's table says: counted, never decoded.
    Malformed(&'static str),
}

/// A call about to release or replace GPU memory or VA, read from its arguments *before* the
/// driver runs it, so that registrations over that memory or VA can be removed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// UVM_FREE: the whole external range that starts at `base`, on every GPU.
    UvmFree { base: u64 },
    /// UVM_UNMAP_EXTERNAL of `[base, base+length)` on one GPU.
    UvmUnmap { base: u64, length: u64 },
    /// UVM_MAP_EXTERNAL_ALLOCATION: UVM first unmaps whatever it overlaps.
    UvmMap { base: u64, length: u64, offset: u64, h_client: u32, h_memory: u32 },
    /// RM_FREE of any object (memory, device, subdevice, VA space, a whole client).
    RmFree { h_client: u32, h_object: u32 },
}

/// Reads pieces `(offset, len)` of a call's argument, concatenated; `None` if any is unreadable.
pub type ReadPieces<'a> = dyn Fn(&[(usize, usize)]) -> Option<Vec<u8>> + 'a;

/// A call's result: `Err(Failed)` unless the ioctl and RM's status both succeeded, else `f()`.
pub(crate) fn failed_or<T>(rc: i32, st: u32, f: impl FnOnce() -> T) -> Result<T, Outcome> {
    if rc != 0 || st != status::NV_OK {
        Err(Outcome::Failed { rc, status: st })
    } else {
        Ok(f())
    }
}
