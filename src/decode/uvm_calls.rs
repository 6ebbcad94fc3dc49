//! UVM calls (/dev/nvidia-uvm) → events.

use super::types::{failed_or, Event, Outcome};
use crate::abi::{self, uvm, AbiTable, Uuid};
use core::mem::size_of;

/// The argument bytes of a UVM command gdrshim decodes on this branch (`None`: not decoded).
pub(super) fn uvm_arg_len(cmd: u64, t: &AbiTable) -> Option<usize> {
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

pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4).map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}
fn i32_at(b: &[u8], off: usize) -> i32 {
    u32_at(b, off) as i32
}
pub(super) fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}
fn uuid_at(b: &[u8], off: usize) -> Uuid {
    let mut u = [0u8; 16];
    if let Some(s) = b.get(off..off + 16) {
        u.copy_from_slice(s);
    }
    u
}

pub(super) fn decode_uvm(cmd: u64, rc: i32, arg: &[u8], t: &AbiTable) -> Outcome {
    let want = match uvm_arg_len(cmd, t) {
        Some(n) => n,
        None => return Outcome::Ignored,
    };
    if arg.len() != want {
        return Outcome::Malformed("captured bytes differ from the UVM struct size");
    }
    use abi::UvmUnmapExternalParams as Unmap;
    use abi::{
        read_pod, UvmCreateExternalRangeParams as Create, UvmFreeParamsV535 as FreeV535,
        UvmFreeParamsV590 as FreeV590,
    };
    use abi::{
        UvmMapExternalSparseParams as Sparse, UvmRegisterGpuParams as RegGpu,
        UvmRegisterGpuVaspaceParams as RegVa,
    };
    // (the size was checked against the struct above: every read_pod below succeeds)
    let r = match cmd {
        uvm::REGISTER_GPU => match read_pod::<RegGpu>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmRegisterGpu {
                uuid: p.gpu_uuid,
                rm_ctrl_fd: p.rm_ctrl_fd,
                h_client: p.h_client,
            }),
            None => return Outcome::Malformed("UVM_REGISTER_GPU too short"),
        },
        uvm::REGISTER_GPU_VASPACE => match read_pod::<RegVa>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmRegisterGpuVaSpace {
                uuid: p.gpu_uuid,
                rm_ctrl_fd: p.rm_ctrl_fd,
                h_client: p.h_client,
                h_vaspace: p.h_va_space,
            }),
            None => return Outcome::Malformed("UVM_REGISTER_GPU_VASPACE too short"),
        },
        uvm::CREATE_EXTERNAL_RANGE => match read_pod::<Create>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmCreateExternalRange {
                base: p.base,
                length: p.length,
            }),
            None => return Outcome::Malformed("UVM_CREATE_EXTERNAL_RANGE too short"),
        },
        uvm::MAP_EXTERNAL_ALLOCATION => {
            // its size depends on the branch's GPU slots: read through the layout's offsets
            let l = t.uvm_map_external();
            let count = u64_at(arg, l.count());
            if count == 0 || count as usize > l.max_gpus {
                return Outcome::Malformed(
                    "UVM_MAP_EXTERNAL_ALLOCATION gpuAttributesCount out of range",
                );
            }
            failed_or(rc, u32_at(arg, l.rm_status()), || Event::UvmMapExternal {
                base: u64_at(arg, abi::UvmMapExternalLayout::BASE),
                length: u64_at(arg, abi::UvmMapExternalLayout::LENGTH),
                offset: u64_at(arg, abi::UvmMapExternalLayout::OFFSET),
                gpus: (0..count as usize).map(|i| uuid_at(arg, l.gpu_uuid(i))).collect(),
                rm_ctrl_fd: i32_at(arg, l.rm_ctrl_fd()),
                h_client: u32_at(arg, l.h_client()),
                h_memory: u32_at(arg, l.h_memory()),
            })
        }
        uvm::UNMAP_EXTERNAL => match read_pod::<Unmap>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmUnmapExternal {
                base: p.base,
                length: p.length,
                gpu: p.gpu_uuid,
            }),
            None => return Outcome::Malformed("UVM_UNMAP_EXTERNAL too short"),
        },
        // to the map, a sparse mapping is no memory: what the GPU had mapped there is gone
        // (UVM unmaps before anything that can fail: a refusal after it leaves the range unmapped,
        // and dropping a mapping from the map is the safe direction whatever rmStatus says)
        uvm::MAP_EXTERNAL_SPARSE => match read_pod::<Sparse>(arg) {
            Some(p) => failed_or(rc, 0, || Event::UvmUnmapExternal {
                base: p.base,
                length: p.length,
                gpu: p.gpu_uuid,
            }),
            None => return Outcome::Malformed("UVM_MAP_EXTERNAL_SPARSE too short"),
        },
        _ if t.uvm_free_has_length => match read_pod::<FreeV535>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmFree {
                base: p.base,
                length: Some(p.length),
            }),
            None => return Outcome::Malformed("UVM_FREE too short"),
        },
        _ => match read_pod::<FreeV590>(arg) {
            Some(p) => failed_or(rc, p.rm_status, || Event::UvmFree { base: p.base, length: None }),
            None => return Outcome::Malformed("UVM_FREE too short"),
        },
    };
    match r {
        Ok(e) => Outcome::Event(e),
        Err(o) => o,
    }
}
