//! Why a registration or an export was not made: one reason per miss, worded for people.
#![forbid(unsafe_code)]

use crate::abi::status::{self, Call};
use crate::tracker::VidmemTuple;
use crate::vamap::Miss;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegMiss {
    Lookup(Miss),
    NotVidmem {
        class: u32,
    },
    NoDevice,
    NoSubdevice,
    NoVaSpace,
    Unaligned(VidmemTuple),
    SpansMappings {
        mapping_end: u64,
    },
    /// The UVM mapping an MR lies in is no longer whole: part of it was unmapped or mapped again.
    MappingNotWhole {
        tuple: VidmemTuple,
    },
    OtherAddress {
        registered: VidmemTuple,
    },
    Rm {
        call: Call,
        status: u32,
    },
    /// No route can work here: what each lacks.
    NoRoute(String),
    /// DMA-BUF: the range cannot be one dma-buf of this process's own memory.
    Export(crate::tracker::dmabuf::PlanMiss),
    /// DMA-BUF: RM says the GPU has no dma-buf capability.
    GpuNotCapable,
    /// `ibv_rereg_mr` cannot move an MR onto a dma-buf.
    Rereg,
    /// The memory's RM client was not allocated through this process's NVIDIA fds.
    UnknownClient {
        client: u32,
    },
    /// The map missed a call the driver accepted (`Tracker::incomplete`).
    MapIncomplete,
    /// Byte `at` of the range is not memory the program allocated through CUDA (`crate::vamap::owned`).
    NotProgramMemory {
        at: u64,
    },
}

impl fmt::Display for RegMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegMiss::Lookup(m) => write!(f, "{m}"),
            RegMiss::NotVidmem { class } => write!(f, "memory class {class:#x} is not vidmem"),
            RegMiss::NoDevice => write!(f, "the memory's device is unknown"),
            RegMiss::NoSubdevice => write!(f, "no single subdevice under the memory's device"),
            RegMiss::NoVaSpace => write!(f, "no VA space registered with UVM under the memory's device"),
            RegMiss::Unaligned(t) => write!(f, "backing range {t} is not 64 KiB aligned"),
            RegMiss::SpansMappings { mapping_end } => write!(f, "the MR runs past its UVM mapping (ends at {mapping_end:#x})"),
            RegMiss::MappingNotWhole { tuple } => write!(
                f,
                "the UVM mapping {tuple} is no longer whole (part of it was unmapped or mapped to other memory); registering it \
                 would describe memory that is not there"
            ),
            RegMiss::OtherAddress { registered } => {
                write!(f, "the memory is already registered at another VA {registered} (one range per hMemory)")
            }
            RegMiss::Rm { call, status: st } => {
                write!(f, "{} refused: {st:#x} {} ({})", call.name(), status::name(*st), status::cause(*call, *st))
            }
            RegMiss::NoRoute(why) => write!(f, "no registration route on this machine: {why}"),
            RegMiss::Export(m) => write!(f, "{m}"),
            RegMiss::GpuNotCapable => write!(f, "RM reports no dma-buf capability for this GPU (kernel without dma-buf, or APM on)"),
            RegMiss::Rereg => write!(f, "ibv_rereg_mr cannot move an MR onto GPU memory on the DMA-BUF route; deregister and register"),
            RegMiss::UnknownClient { client } => {
                write!(f, "the memory's RM client {client:#010x} was not allocated through this process's NVIDIA fds")
            }
            RegMiss::NotProgramMemory { at } => write!(
                f,
                "{at:#x} is not in any allocation this program made through CUDA (cuMemAlloc*, a pool, cuMemMap, an IPC or pool \
                 import): CUDA's own memory, memory freed, or a range running past its allocation; libcuda refuses such a \
                 range too"
            ),
            RegMiss::MapIncomplete => write!(
                f,
                "the map missed a driver call earlier (its lock was not free for 5 s, see the ERROR line): it may describe memory \
                 that is gone, so nothing is registered or exported in this process any more"
            ),
        }
    }
}
