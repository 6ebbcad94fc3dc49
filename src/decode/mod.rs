//! A finished NVIDIA ioctl → a typed [`Event`].
//!
//! Decoding happens only after the real call returned 0 and the RM/UVM status is NV_OK, and reads
//! only the bytes that the request encodes (RM: `_IOC_SIZE`; UVM: the branch's struct size).
#![forbid(unsafe_code)]

use crate::abi::{self, class, esc, p2p, status, uvm, AbiTable};
use core::mem::size_of;

pub use crate::abi::Uuid;
mod types;
use types::failed_or;
pub use types::*;

/// The [`Pending`] release of a call not yet issued, or `None` for calls that release nothing.
/// `read(offset, len)` reads the caller's argument bytes (which the kernel has not vetted yet,
/// so it must not fault); only the fields named here are read.
pub fn pending(dev: DevKind, request: u64, t: &AbiTable, read: &ReadPieces) -> Option<Pending> {
    match (dev, request) {
        (DevKind::Uvm, uvm::FREE) => {
            read(&[(0, 8)]).map(|b| Pending::UvmFree { base: u64_at(&b, 0) })
        }
        // a sparse map first unmaps what that GPU had mapped in its range
        (DevKind::Uvm, uvm::UNMAP_EXTERNAL | uvm::MAP_EXTERNAL_SPARSE) => read(&[(0, 16)])
            .map(|b| Pending::UvmUnmap { base: u64_at(&b, 0), length: u64_at(&b, 8) }),
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
pub fn decode(
    dev: DevKind,
    fd: i32,
    request: u64,
    rc: i32,
    arg: &[u8],
    params: &dyn ParamReader,
    t: &AbiTable,
) -> Outcome {
    match dev {
        DevKind::Ctl | DevKind::Gpu(_) => decode_rm(fd, request, rc, arg, params, t),
        DevKind::Uvm => decode_uvm(request, rc, arg, t),
    }
}

fn decode_rm(
    fd: i32,
    request: u64,
    rc: i32,
    arg: &[u8],
    params: &dyn ParamReader,
    t: &AbiTable,
) -> Outcome {
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
        esc::RM_ALLOC_MEMORY => decode_alloc_memory(arg),
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

fn decode_alloc(
    fd: i32,
    arg: &[u8],
    params: &dyn ParamReader,
    t: &AbiTable,
) -> Result<Outcome, Outcome> {
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
                Some(b) => {
                    abi::read_pod::<abi::Nv0080AllocParams>(&b).map(|p| p.device_id).unwrap_or(0)
                }
                None => 0,
            };
            Event::Device { h_client: a.h_root, h_device: a.h_new, device_id }
        }
        class::NV20_SUBDEVICE_0 => {
            let subdevice_id = read_params(4)
                .and_then(|b| abi::read_pod::<abi::Nv2080AllocParams>(&b))
                .map(|p| p.sub_device_id)
                .unwrap_or(0);
            Event::Subdevice {
                h_client: a.h_root,
                h_device: a.h_parent,
                h_subdevice: a.h_new,
                subdevice_id,
            }
        }
        class::FERMI_VASPACE_A => {
            let flags = read_params(t.vaspace_alloc_params_size)
                .and_then(|b| abi::read_pod::<abi::VaSpaceAllocParamsV580>(b.padded(56)))
                .map(|p| p.flags)
                .unwrap_or(0);
            Event::VaSpace {
                h_client: a.h_root,
                h_parent: a.h_parent,
                h_vaspace: a.h_new,
                class: a.h_class,
                flags,
            }
        }
        class::NV50_THIRD_PARTY_P2P => {
            let flags = read_params(4)
                .and_then(|b| abi::read_pod::<abi::Nv503cAllocParams>(&b))
                .map(|p| p.flags)
                .unwrap_or(0);
            Event::P2pAlloc { h_client: a.h_root, h_parent: a.h_parent, h_object: a.h_new, flags }
        }
        c if class::uses_memory_alloc_params(c) => {
            let p = read_params(t.memory_alloc_params_size)
                .and_then(|b| abi::read_pod::<abi::MemoryAllocationParamsV545>(b.padded(128)));
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
        c => Event::OtherObject {
            h_client: a.h_root,
            h_parent: a.h_parent,
            h_object: a.h_new,
            class: c,
        },
    };
    Ok(Outcome::Event(ev))
}

/// NV_ESC_RM_ALLOC_MEMORY: memory described to RM by the caller (libcuda's pinned host memory,
/// class NV01_MEMORY_SYSTEM_OS_DESCRIPTOR), later mapped into GPU VA like any other.
fn decode_alloc_memory(arg: &[u8]) -> Result<Outcome, Outcome> {
    let a: abi::Nvos02WithFd = abi::read_pod(arg).ok_or(Outcome::Malformed("NVOS02"))?;
    failed_or(0, a.status, || ())?;
    Ok(Outcome::Event(Event::Memory {
        h_client: a.h_root,
        h_parent: a.h_object_parent,
        h_memory: a.h_object_new,
        class: a.h_class,
        size: a.limit.checked_add(1),
        attr: 0,
        attr2: 0,
        flags: a.flags,
    }))
}

fn decode_export(arg: &[u8]) -> Result<Outcome, Outcome> {
    use abi::dmabuf::{ExportToDmabufFd, EXPORT_MAX_HANDLES};
    let e: ExportToDmabufFd = abi::read_pod(arg)
        .filter(|_| arg.len() == size_of::<ExportToDmabufFd>())
        .ok_or(Outcome::Malformed("export struct"))?;
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
    let f: abi::Nvos00Free =
        abi::read_pod(arg).filter(|_| arg.len() == 16).ok_or(Outcome::Malformed("NVOS00"))?;
    failed_or(0, f.status, || {
        Outcome::Event(Event::Free {
            h_client: f.h_root,
            h_parent: f.h_object_parent,
            h_object: f.h_object_old,
        })
    })
}

fn decode_dup(arg: &[u8]) -> Result<Outcome, Outcome> {
    let d: abi::Nvos55Dup =
        abi::read_pod(arg).filter(|_| arg.len() == 28).ok_or(Outcome::Malformed("NVOS55"))?;
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
    let v: abi::RmApiVersion = abi::read_pod(arg)
        .filter(|_| arg.len() == 72)
        .ok_or(Outcome::Malformed("rm_api_version"))?;
    let end = v.version_string.iter().position(|&b| b == 0).unwrap_or(64);
    match core::str::from_utf8(&v.version_string[..end]) {
        Ok(s) if !s.is_empty() => Ok(Outcome::Event(Event::Version(s.to_string()))),
        _ => Ok(Outcome::Ignored),
    }
}

fn decode_control(arg: &[u8], params: &dyn ParamReader) -> Result<Outcome, Outcome> {
    let c: abi::Nvos54Control =
        abi::read_pod(arg).filter(|_| arg.len() == 32).ok_or(Outcome::Malformed("NVOS54"))?;
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
            let p: abi::Nv503cRegisterVaSpace =
                abi::read_pod(&b).ok_or(Outcome::Malformed("503C params"))?;
            P2pCtrl::RegisterVaSpace { h_vaspace: p.h_va_space, token: p.va_space_token }
        }
        p2p::UNREGISTER_VA_SPACE => P2pCtrl::UnregisterVaSpace { h_vaspace: u32_at(&b, 0) },
        p2p::REGISTER_VIDMEM => {
            let p: abi::Nv503cRegisterVidmem =
                abi::read_pod(&b).ok_or(Outcome::Malformed("503C params"))?;
            P2pCtrl::RegisterVidmem {
                h_memory: p.h_memory,
                address: p.address,
                size: p.size,
                offset: p.offset,
            }
        }
        p2p::UNREGISTER_VIDMEM => P2pCtrl::UnregisterVidmem { h_memory: u32_at(&b, 0) },
        _ => P2pCtrl::RegisterPid { h_client: u32_at(&b, 0) },
    };
    Ok(Outcome::Event(Event::P2pControl { h_client: c.h_client, h_object: c.h_object, ctrl }))
}

mod uvm_calls;
use uvm_calls::{decode_uvm, u32_at, u64_at, uvm_arg_len};

mod display;
pub use display::uuid_str;
#[cfg(test)]
mod tests;
