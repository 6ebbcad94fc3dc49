//! A finished NVIDIA ioctl → a typed [`Event`].
//!
//! Decoding happens only after the real call returned 0 and the RM/UVM status is NV_OK, and reads
//! only the bytes that the request encodes (RM: `_IOC_SIZE`; UVM: the branch's struct size).
#![forbid(unsafe_code)]

use crate::abi::{self, class, esc, p2p, status, uvm, AbiTable};
use core::mem::size_of;

pub use crate::abi::Uuid;

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

/// The [`Pending`] release of a call not yet issued, or `None` for calls that release nothing.
/// `read(offset, len)` reads the caller's argument bytes (which the kernel has not vetted yet,
/// so it must not fault); only the fields named here are read.
pub fn pending(dev: DevKind, request: u64, t: &AbiTable, read: &ReadPieces) -> Option<Pending> {
    match (dev, request) {
        (DevKind::Uvm, uvm::FREE) => read(&[(0, 8)]).map(|b| Pending::UvmFree { base: u64_at(&b, 0) }),
        // a sparse map first unmaps what that GPU had mapped in its range
        (DevKind::Uvm, uvm::UNMAP_EXTERNAL | uvm::MAP_EXTERNAL_SPARSE) => {
            read(&[(0, 16)]).map(|b| Pending::UvmUnmap { base: u64_at(&b, 0), length: u64_at(&b, 8) })
        }
        (DevKind::Uvm, uvm::MAP_EXTERNAL_ALLOCATION) => {
            let l = t.uvm_map_external();
            // base, length, offset; then hClient and hMemory behind the GPU attribute array
            let b = read(&[(0, 24), (l.h_client(), 8)])?;
            Some(Pending::UvmMap {
                base: u64_at(&b, 0),
                length: u64_at(&b, 8),
                offset: u64_at(&b, 16),
                h_client: u32_at(&b, 24),
                h_memory: u32_at(&b, 28),
            })
        }
        // the driver reads only _IOC_NR and _IOC_SIZE of an RM request, on any NVIDIA node
        (DevKind::Ctl | DevKind::Gpu(_), r)
            if abi::ioc_type(r) == abi::NV_IOCTL_MAGIC
                && abi::ioc_nr(r) == esc::RM_FREE
                && abi::ioc_size(r) == size_of::<abi::Nvos00Free>() =>
        {
            let b = read(&[(0, 12)])?;
            Some(Pending::RmFree { h_client: u32_at(&b, 0), h_object: u32_at(&b, 8) })
        }
        _ => None,
    }
}

/// How many argument bytes the hook must capture for `request` on `dev`, or `None` when the call
/// is not decoded at all (then nothing is read).
pub fn arg_len(dev: DevKind, request: u64, t: &AbiTable) -> Option<usize> {
    match dev {
        DevKind::Ctl | DevKind::Gpu(_) => {
            if abi::ioc_type(request) != abi::NV_IOCTL_MAGIC {
                return None;
            }
            let size = abi::ioc_size(request);
            (size > 0).then_some(size)
        }
        DevKind::Uvm => uvm_arg_len(request, t),
    }
}

fn uvm_arg_len(cmd: u64, t: &AbiTable) -> Option<usize> {
    Some(match cmd {
        uvm::REGISTER_GPU => size_of::<abi::UvmRegisterGpuParams>(),
        uvm::REGISTER_GPU_VASPACE => size_of::<abi::UvmRegisterGpuVaspaceParams>(),
        uvm::CREATE_EXTERNAL_RANGE => size_of::<abi::UvmCreateExternalRangeParams>(),
        uvm::MAP_EXTERNAL_ALLOCATION => t.uvm_map_external().size(),
        uvm::UNMAP_EXTERNAL => size_of::<abi::UvmUnmapExternalParams>(),
        uvm::MAP_EXTERNAL_SPARSE => size_of::<abi::UvmMapExternalSparseParams>(),
        uvm::FREE => t.uvm_free_size(),
        _ => return None,
    })
}

/// Whether RM accepted a finished RM_ALLOC or RM_CONTROL (`arg` its bytes after the call): only
/// then has RM read the parameters behind its pointer. Other calls: `false`.
pub fn rm_accepted(request: u64, arg: &[u8]) -> bool {
    if abi::ioc_type(request) != abi::NV_IOCTL_MAGIC {
        return false;
    }
    let status = match (abi::ioc_nr(request), arg.len()) {
        (esc::RM_ALLOC, 48) => abi::read_pod::<abi::Nvos64Alloc>(arg).map(|a| a.status),
        (esc::RM_ALLOC, 32) => abi::read_pod::<abi::Nvos21Alloc>(arg).map(|a| a.status),
        (esc::RM_CONTROL, 32) => abi::read_pod::<abi::Nvos54Control>(arg).map(|c| c.status),
        _ => None,
    };
    status == Some(status::NV_OK)
}

/// Size of the alloc parameter struct RM copies in for `class` (RM ignores `paramsSize`).
pub fn alloc_params_len(class_id: u32, t: &AbiTable) -> Option<usize> {
    Some(match class_id {
        c if class::uses_memory_alloc_params(c) => t.memory_alloc_params_size,
        class::NV01_DEVICE_0 => size_of::<abi::Nv0080AllocParams>(),
        class::NV20_SUBDEVICE_0 => size_of::<abi::Nv2080AllocParams>(),
        class::FERMI_VASPACE_A => t.vaspace_alloc_params_size,
        class::NV50_THIRD_PARTY_P2P => size_of::<abi::Nv503cAllocParams>(),
        _ => return None,
    })
}

/// Size of the control parameters gdrshim decodes for `cmd`.
pub fn control_params_len(cmd: u32) -> Option<usize> {
    Some(match cmd {
        p2p::REGISTER_VA_SPACE => size_of::<abi::Nv503cRegisterVaSpace>(),
        p2p::UNREGISTER_VA_SPACE => size_of::<abi::Nv503cUnregisterVaSpace>(),
        p2p::REGISTER_VIDMEM => size_of::<abi::Nv503cRegisterVidmem>(),
        p2p::UNREGISTER_VIDMEM => size_of::<abi::Nv503cUnregisterVidmem>(),
        p2p::REGISTER_PID => 4,
        _ => return None,
    })
}

/// Decodes one finished ioctl. `arg` holds the argument bytes after the call (as many as
/// [`arg_len`] asked for); `rc` is what the real ioctl returned.
pub fn decode(dev: DevKind, fd: i32, request: u64, rc: i32, arg: &[u8], params: &dyn ParamReader, t: &AbiTable) -> Outcome {
    match dev {
        DevKind::Ctl | DevKind::Gpu(_) => decode_rm(fd, request, rc, arg, params, t),
        DevKind::Uvm => decode_uvm(request, rc, arg, t),
    }
}

fn failed_or<T>(rc: i32, st: u32, f: impl FnOnce() -> T) -> Result<T, Outcome> {
    if rc != 0 || st != status::NV_OK {
        Err(Outcome::Failed { rc, status: st })
    } else {
        Ok(f())
    }
}

fn decode_rm(fd: i32, request: u64, rc: i32, arg: &[u8], params: &dyn ParamReader, t: &AbiTable) -> Outcome {
    if abi::ioc_type(request) != abi::NV_IOCTL_MAGIC {
        return Outcome::Ignored;
    }
    let nr = abi::ioc_nr(request);
    let size = abi::ioc_size(request);
    if arg.len() != size {
        return Outcome::Malformed("captured bytes differ from _IOC_SIZE");
    }
    if rc != 0 {
        return Outcome::Failed { rc, status: 0 };
    }
    let r = match nr {
        esc::RM_ALLOC => decode_alloc(fd, arg, params, t),
        esc::RM_FREE => decode_free(arg),
        esc::RM_CONTROL => decode_control(arg, params),
        esc::RM_DUP_OBJECT => decode_dup(arg),
        esc::CHECK_VERSION_STR => decode_version(arg),
        esc::EXPORT_TO_DMABUF_FD if t.dmabuf_export => decode_export(arg),
        _ => Ok(Outcome::Ignored),
    };
    r.unwrap_or_else(|o| o)
}

struct AllocCall {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_params: u64,
    status: u32,
}

fn decode_alloc(fd: i32, arg: &[u8], params: &dyn ParamReader, t: &AbiTable) -> Result<Outcome, Outcome> {
    let a = match arg.len() {
        32 => {
            let a: abi::Nvos21Alloc = abi::read_pod(arg).ok_or(Outcome::Malformed("NVOS21"))?;
            AllocCall {
                h_root: a.h_root,
                h_parent: a.h_object_parent,
                h_new: a.h_object_new,
                h_class: a.h_class,
                p_params: a.p_alloc_parms,
                status: a.status,
            }
        }
        48 => {
            let a: abi::Nvos64Alloc = abi::read_pod(arg).ok_or(Outcome::Malformed("NVOS64"))?;
            AllocCall {
                h_root: a.h_root,
                h_parent: a.h_object_parent,
                h_new: a.h_object_new,
                h_class: a.h_class,
                p_params: a.p_alloc_parms,
                status: a.status,
            }
        }
        _ => return Err(Outcome::Malformed("RM_ALLOC size is neither NVOS21 nor NVOS64")),
    };
    failed_or(0, a.status, || ())?;
    let read_params = |len: usize| -> Option<ParamBytes> {
        if a.p_params == 0 {
            None
        } else {
            params.read_small(a.p_params, len)
        }
    };
    let ev = match a.h_class {
        c if class::is_root(c) => Event::RootClient { fd, h_client: a.h_new },
        class::NV01_DEVICE_0 => {
            // No parameters means device instance 0, as RM assumes.
            let device_id = match read_params(size_of::<abi::Nv0080AllocParams>()) {
                Some(b) => abi::read_pod::<abi::Nv0080AllocParams>(&b).map(|p| p.device_id).unwrap_or(0),
                None => 0,
            };
            Event::Device { h_client: a.h_root, h_device: a.h_new, device_id }
        }
        class::NV20_SUBDEVICE_0 => {
            let subdevice_id =
                read_params(4).and_then(|b| abi::read_pod::<abi::Nv2080AllocParams>(&b)).map(|p| p.sub_device_id).unwrap_or(0);
            Event::Subdevice { h_client: a.h_root, h_device: a.h_parent, h_subdevice: a.h_new, subdevice_id }
        }
        class::FERMI_VASPACE_A => {
            let flags = read_params(t.vaspace_alloc_params_size)
                .and_then(|b| abi::read_pod::<abi::VaSpaceAllocParamsV580>(b.padded(56)))
                .map(|p| p.flags)
                .unwrap_or(0);
            Event::VaSpace { h_client: a.h_root, h_parent: a.h_parent, h_vaspace: a.h_new, class: a.h_class, flags }
        }
        class::NV50_THIRD_PARTY_P2P => {
            let flags = read_params(4).and_then(|b| abi::read_pod::<abi::Nv503cAllocParams>(&b)).map(|p| p.flags).unwrap_or(0);
            Event::P2pAlloc { h_client: a.h_root, h_parent: a.h_parent, h_object: a.h_new, flags }
        }
        c if class::uses_memory_alloc_params(c) => {
            let p = read_params(t.memory_alloc_params_size).and_then(|b| abi::read_pod::<abi::MemoryAllocationParamsV545>(b.padded(128)));
            Event::Memory {
                h_client: a.h_root,
                h_parent: a.h_parent,
                h_memory: a.h_new,
                class: c,
                size: p.map(|p| p.size),
                attr: p.map_or(0, |p| p.attr),
                attr2: p.map_or(0, |p| p.attr2),
                flags: p.map_or(0, |p| p.flags),
            }
        }
        c => Event::OtherObject { h_client: a.h_root, h_parent: a.h_parent, h_object: a.h_new, class: c },
    };
    Ok(Outcome::Event(ev))
}

fn decode_export(arg: &[u8]) -> Result<Outcome, Outcome> {
    use abi::dmabuf::{ExportToDmabufFd, EXPORT_MAX_HANDLES};
    let e: ExportToDmabufFd =
        abi::read_pod(arg).filter(|_| arg.len() == size_of::<ExportToDmabufFd>()).ok_or(Outcome::Malformed("export struct"))?;
    failed_or(0, e.status, || ())?;
    let n = e.num_objects as usize;
    if n == 0 || n > EXPORT_MAX_HANDLES {
        return Err(Outcome::Malformed("export numObjects out of range"));
    }
    let pieces = (0..n).map(|i| (e.handles[i], e.offsets[i], e.sizes[i])).collect();
    Ok(Outcome::Event(Event::DmabufExport(Box::new(ExportCall {
        fd: e.fd,
        h_client: e.h_client,
        total_objects: e.total_objects,
        index: e.index,
        total_size: e.total_size,
        mapping_type: e.mapping_type,
        pieces,
    }))))
}

fn decode_free(arg: &[u8]) -> Result<Outcome, Outcome> {
    let f: abi::Nvos00Free = abi::read_pod(arg).filter(|_| arg.len() == 16).ok_or(Outcome::Malformed("NVOS00"))?;
    failed_or(0, f.status, || Outcome::Event(Event::Free { h_client: f.h_root, h_parent: f.h_object_parent, h_object: f.h_object_old }))
}

fn decode_dup(arg: &[u8]) -> Result<Outcome, Outcome> {
    let d: abi::Nvos55Dup = abi::read_pod(arg).filter(|_| arg.len() == 28).ok_or(Outcome::Malformed("NVOS55"))?;
    failed_or(0, d.status, || {
        Outcome::Event(Event::Dup {
            h_client: d.h_client,
            h_parent: d.h_parent,
            h_object: d.h_object,
            h_client_src: d.h_client_src,
            h_object_src: d.h_object_src,
        })
    })
}

fn decode_version(arg: &[u8]) -> Result<Outcome, Outcome> {
    let v: abi::RmApiVersion = abi::read_pod(arg).filter(|_| arg.len() == 72).ok_or(Outcome::Malformed("rm_api_version"))?;
    let end = v.version_string.iter().position(|&b| b == 0).unwrap_or(64);
    match core::str::from_utf8(&v.version_string[..end]) {
        Ok(s) if !s.is_empty() => Ok(Outcome::Event(Event::Version(s.to_string()))),
        _ => Ok(Outcome::Ignored),
    }
}

fn decode_control(arg: &[u8], params: &dyn ParamReader) -> Result<Outcome, Outcome> {
    let c: abi::Nvos54Control = abi::read_pod(arg).filter(|_| arg.len() == 32).ok_or(Outcome::Malformed("NVOS54"))?;
    failed_or(0, c.status, || ())?;
    if c.cmd >> 16 != p2p::CTRL_CLASS {
        return Ok(Outcome::Ignored);
    }
    let want = match control_params_len(c.cmd) {
        Some(n) => n,
        None => return Ok(Outcome::Ignored),
    };
    if c.params_size as usize != want {
        return Err(Outcome::Malformed("503C control paramsSize"));
    }
    let b = if c.params == 0 { None } else { params.read_small(c.params, want) };
    let b = b.ok_or(Outcome::Malformed("503C control params unreadable"))?;
    let ctrl = match c.cmd {
        p2p::REGISTER_VA_SPACE => {
            let p: abi::Nv503cRegisterVaSpace = abi::read_pod(&b).ok_or(Outcome::Malformed("503C params"))?;
            P2pCtrl::RegisterVaSpace { h_vaspace: p.h_va_space, token: p.va_space_token }
        }
        p2p::UNREGISTER_VA_SPACE => P2pCtrl::UnregisterVaSpace { h_vaspace: u32_at(&b, 0) },
        p2p::REGISTER_VIDMEM => {
            let p: abi::Nv503cRegisterVidmem = abi::read_pod(&b).ok_or(Outcome::Malformed("503C params"))?;
            P2pCtrl::RegisterVidmem { h_memory: p.h_memory, address: p.address, size: p.size, offset: p.offset }
        }
        p2p::UNREGISTER_VIDMEM => P2pCtrl::UnregisterVidmem { h_memory: u32_at(&b, 0) },
        _ => P2pCtrl::RegisterPid { h_client: u32_at(&b, 0) },
    };
    Ok(Outcome::Event(Event::P2pControl { h_client: c.h_client, h_object: c.h_object, ctrl }))
}

mod uvm_calls;
use uvm_calls::{decode_uvm, u32_at, u64_at};

mod display;
pub use display::uuid_str;
#[cfg(test)]
mod tests;
