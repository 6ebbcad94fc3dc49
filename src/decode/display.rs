//! Trace mode's text of a decoded call.
#![forbid(unsafe_code)]

use super::types::{Event, P2pCtrl};
use crate::abi::Uuid;
use core::fmt;

pub fn uuid_str(u: &Uuid) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::RootClient { fd, h_client } => write!(f, "RM_ALLOC root client={h_client:#010x} fd={fd}"),
            Event::Device { h_client, h_device, device_id } => {
                write!(f, "RM_ALLOC device client={h_client:#010x} h={h_device:#010x} deviceId={device_id}")
            }
            Event::Subdevice { h_client, h_device, h_subdevice, subdevice_id } => {
                write!(
                    f,
                    "RM_ALLOC subdevice client={h_client:#010x} device={h_device:#010x} h={h_subdevice:#010x} subDeviceId={subdevice_id}"
                )
            }
            Event::VaSpace { h_client, h_parent, h_vaspace, class, flags } => {
                write!(f, "RM_ALLOC vaspace client={h_client:#010x} parent={h_parent:#010x} h={h_vaspace:#010x} class={class:#x} flags={flags:#x}")
            }
            Event::Memory { h_client, h_parent, h_memory, class, size, attr, attr2, flags } => {
                write!(f, "RM_ALLOC memory client={h_client:#010x} parent={h_parent:#010x} h={h_memory:#010x} class={class:#x} size=")?;
                match size {
                    Some(s) => write!(f, "{s:#x}")?,
                    None => write!(f, "?")?,
                }
                write!(f, " attr={attr:#x} attr2={attr2:#x} flags={flags:#x}")
            }
            Event::OtherObject { h_client, h_parent, h_object, class } => {
                write!(f, "RM_ALLOC object client={h_client:#010x} parent={h_parent:#010x} h={h_object:#010x} class={class:#x}")
            }
            Event::P2pAlloc { h_client, h_parent, h_object, flags } => write!(
                f,
                "RM_ALLOC NV50_THIRD_PARTY_P2P client={h_client:#010x} parent={h_parent:#010x} h={h_object:#010x} flags={flags:#x}"
            ),
            Event::P2pControl { h_client, h_object, ctrl } => {
                write!(f, "RM_CONTROL 503C client={h_client:#010x} obj={h_object:#010x} ")?;
                match ctrl {
                    P2pCtrl::RegisterVaSpace { h_vaspace, token } => {
                        write!(f, "REGISTER_VA_SPACE hVASpace={h_vaspace:#010x} token={token:#x}")
                    }
                    P2pCtrl::UnregisterVaSpace { h_vaspace } => write!(f, "UNREGISTER_VA_SPACE hVASpace={h_vaspace:#010x}"),
                    P2pCtrl::RegisterVidmem { h_memory, address, size, offset } => {
                        write!(f, "REGISTER_VIDMEM hMemory={h_memory:#010x} address={address:#x} size={size:#x} offset={offset:#x}")
                    }
                    P2pCtrl::UnregisterVidmem { h_memory } => write!(f, "UNREGISTER_VIDMEM hMemory={h_memory:#010x}"),
                    P2pCtrl::RegisterPid { h_client } => write!(f, "REGISTER_PID hClient={h_client:#010x}"),
                }
            }
            Event::Free { h_client, h_parent, h_object } => {
                write!(f, "RM_FREE client={h_client:#010x} parent={h_parent:#010x} h={h_object:#010x}")
            }
            Event::Dup { h_client, h_parent, h_object, h_client_src, h_object_src } => {
                write!(f, "RM_DUP client={h_client:#010x} parent={h_parent:#010x} h={h_object:#010x} from client={h_client_src:#010x} h={h_object_src:#010x}")
            }
            Event::Version(v) => write!(f, "CHECK_VERSION_STR {v}"),
            Event::UvmRegisterGpu { uuid, rm_ctrl_fd, h_client } => {
                write!(f, "UVM_REGISTER_GPU {} rmCtrlFd={rm_ctrl_fd} hClient={h_client:#010x}", uuid_str(uuid))
            }
            Event::UvmRegisterGpuVaSpace { uuid, rm_ctrl_fd, h_client, h_vaspace } => {
                write!(
                    f,
                    "UVM_REGISTER_GPU_VASPACE {} rmCtrlFd={rm_ctrl_fd} hClient={h_client:#010x} hVaSpace={h_vaspace:#010x}",
                    uuid_str(uuid)
                )
            }
            Event::UvmCreateExternalRange { base, length } => write!(f, "UVM_CREATE_EXTERNAL_RANGE base={base:#x} length={length:#x}"),
            Event::UvmMapExternal { base, length, offset, gpus, rm_ctrl_fd, h_client, h_memory } => {
                write!(f, "UVM_MAP_EXTERNAL_ALLOCATION base={base:#x} length={length:#x} offset={offset:#x} hClient={h_client:#010x} hMemory={h_memory:#010x} rmCtrlFd={rm_ctrl_fd} gpus=")?;
                for (i, g) in gpus.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { "," } else { "" }, uuid_str(g))?;
                }
                Ok(())
            }
            Event::UvmUnmapExternal { base, length, gpu } => {
                write!(f, "UVM_UNMAP_EXTERNAL base={base:#x} length={length:#x} {}", uuid_str(gpu))
            }
            Event::DmabufExport(e) => {
                write!(
                    f,
                    "EXPORT_TO_DMABUF_FD fd={} client={:#010x} objects {}+{}/{} totalSize={:#x} mappingType={}",
                    e.fd,
                    e.h_client,
                    e.index,
                    e.pieces.len(),
                    e.total_objects,
                    e.total_size,
                    e.mapping_type
                )?;
                for (h, o, s) in &e.pieces {
                    write!(f, " {h:#010x}@{o:#x}+{s:#x}")?;
                }
                Ok(())
            }
            Event::UvmFree { base, length } => match length {
                Some(l) => write!(f, "UVM_FREE base={base:#x} length={l:#x}"),
                None => write!(f, "UVM_FREE base={base:#x}"),
            },
        }
    }
}
