//! The dma-buf of a range: the exact pieces an export of `[addr, addr+len)` carries (libcuda's own
//! export carries exactly these: one handle per run of one memory object), and the shadow oracle
//! that compares libcuda's exports with it.
//!
//! RM does not check that exported memory belongs to the caller (nvidia-abi.md S10), so a plan is
//! made only of memory of this process's own RM clients, covered exactly by its map.
#![forbid(unsafe_code)]

use crate::abi::dmabuf::{ExportToDmabufFd, EXPORT_MAX_HANDLES};
use crate::abi::{class, zeroed};
use crate::decode::ExportCall;
use crate::vamap::{MemRef, Miss, Piece, VaMap};
use std::fmt;

/// The host page: RM wants every offset and size of an export aligned to it (x86-64: 4 KiB).
pub const HOST_PAGE: u64 = 4096;

/// One piece of a buffer: `size` bytes of `memory` from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub memory: u32,
    pub offset: u64,
    pub size: u64,
}

/// What one dma-buf of a range is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub client: u32,
    /// The RM device of every piece and its device instance (the GPU whose /dev/nvidiaN exports).
    pub device: u32,
    pub device_instance: u32,
    /// VA of the buffer's first byte: the host page the range starts in.
    pub base: u64,
    pub spans: Vec<Span>,
    pub total: u64,
    /// Per span, which allocation of its handle it is (`MemInfo::serial`): with the spans, the
    /// identity of the memory a buffer of this plan holds.
    pub serials: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanMiss {
    Lookup(Miss),
    NotVidmem {
        class: u32,
    },
    UnknownMemory {
        memory: u32,
    },
    /// RM does not bind an export to its caller: only memory of this process's own clients.
    ForeignClient {
        client: u32,
    },
    SpansClients,
    SpansGpus,
    Unaligned {
        at: u64,
    },
}

impl fmt::Display for PlanMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanMiss::Lookup(m) => write!(f, "{m}"),
            PlanMiss::NotVidmem { class } => write!(f, "memory class {class:#x} is not vidmem"),
            PlanMiss::UnknownMemory { memory } => {
                write!(f, "memory {memory:#010x} was never seen allocated")
            }
            PlanMiss::ForeignClient { client } => {
                write!(f, "the memory's RM client {client:#010x} is not one this process allocated (gdrshim exports only its own)")
            }
            PlanMiss::SpansClients => write!(f, "the range spans memory of two RM clients"),
            PlanMiss::SpansGpus => {
                write!(f, "the range spans memory of two GPUs (one dma-buf is one GPU's)")
            }
            PlanMiss::Unaligned { at } => {
                write!(f, "a piece at {at:#x} is not host-page aligned in its memory")
            }
        }
    }
}

fn page_down(x: u64) -> u64 {
    x & !(HOST_PAGE - 1)
}

impl Plan {
    /// Export calls needed (RM takes at most 128 handles per call).
    pub fn calls(&self) -> usize {
        self.spans.len().div_ceil(EXPORT_MAX_HANDLES)
    }

    /// The parameters of call `k`: the first creates the buffer (`fd` -1), the others add their
    /// pieces to `fd` at their index.
    pub fn call(&self, k: usize, fd: i32, mapping_type: u8) -> ExportToDmabufFd {
        let mut p: ExportToDmabufFd = zeroed();
        let chunk = &self.spans
            [k * EXPORT_MAX_HANDLES..((k + 1) * EXPORT_MAX_HANDLES).min(self.spans.len())];
        p.fd = if k == 0 { -1 } else { fd };
        p.h_client = self.client;
        p.total_objects = self.spans.len() as u32;
        p.num_objects = chunk.len() as u32;
        p.index = (k * EXPORT_MAX_HANDLES) as u32;
        p.total_size = self.total;
        p.mapping_type = mapping_type;
        for (i, s) in chunk.iter().enumerate() {
            p.handles[i] = s.memory;
            p.offsets[i] = s.offset;
            p.sizes[i] = s.size;
        }
        p
    }
}

/// Pieces that continue one another (the same memory, the next offset) as one: two exports of
/// the same bytes compare equal however their callers cut them.
fn merged(spans: impl IntoIterator<Item = Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for s in spans {
        match out.last_mut() {
            Some(l) if l.memory == s.memory && l.offset + l.size == s.offset => l.size += s.size,
            _ => out.push(s),
        }
    }
    out
}

/// libcuda's export calls for one buffer, gathered by fd until CUDA hands the fd out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NativeExport {
    client: u32,
    total: u64,
    slots: Vec<Option<Span>>,
}

/// At most this many native buffers wait for their request (exports CUDA made for itself).
const NATIVE_WAITING: usize = 64;

/// What [`plan`] needs of the tracker beside its map: a piece's RM device and device instance,
/// and whether a client is one of this process's own.
pub trait PlanFacts {
    fn piece_device(&self, p: &Piece) -> Option<(u32, u32)>;
    fn own_client(&self, client: u32) -> bool;
}

/// The dma-buf of `[addr, addr+len)`, rounded out to host pages: every byte covered exactly by
/// this process's own video memory on one GPU, or why not.
pub fn plan(map: &VaMap, facts: &dyn PlanFacts, addr: u64, len: u64) -> Result<Plan, PlanMiss> {
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(HOST_PAGE - 1))
        .map(page_down)
        .ok_or(PlanMiss::Lookup(Miss::Overflow))?;
    let base = page_down(addr);
    if len == 0 {
        return Err(PlanMiss::Lookup(Miss::Empty));
    }
    let pieces = map.lookup(base, end - base).map_err(PlanMiss::Lookup)?;
    let client = pieces[0].mem.client;
    let mut device = None;
    for p in &pieces {
        if p.mem.client != client {
            return Err(PlanMiss::SpansClients);
        }
        match p.alloc.class() {
            Some(class::NV01_MEMORY_LOCAL_USER) => {}
            Some(class) => return Err(PlanMiss::NotVidmem { class }),
            None => return Err(PlanMiss::UnknownMemory { memory: p.mem.memory }),
        }
        let d = facts.piece_device(p).ok_or(PlanMiss::UnknownMemory { memory: p.mem.memory })?;
        if *device.get_or_insert(d) != d {
            return Err(PlanMiss::SpansGpus);
        }
        if p.offset % HOST_PAGE != 0 || p.len % HOST_PAGE != 0 {
            return Err(PlanMiss::Unaligned { at: p.va });
        }
    }
    if !facts.own_client(client) {
        return Err(PlanMiss::ForeignClient { client });
    }
    let (device, device_instance) = device.expect("at least one piece");
    let spans =
        merged(pieces.iter().map(|p| Span { memory: p.mem.memory, offset: p.offset, size: p.len }));
    let serials = spans
        .iter()
        .map(|s| map.memory(MemRef { client, memory: s.memory }).map_or(0, |i| i.serial))
        .collect();
    Ok(Plan { client, device, device_instance, base, spans, total: end - base, serials })
}

/// libcuda's own dma-buf exports (datacenter GPUs), gathered under their fd until CUDA hands the
/// fd out.
#[derive(Default)]
pub struct NativeExports {
    by_fd: rustc_hash::FxHashMap<i32, NativeExport>,
}

impl NativeExports {
    /// A native export call (decoded): gathered under its fd.
    pub fn record(&mut self, e: &ExportCall) {
        let fresh = |e: &ExportCall| NativeExport {
            client: e.h_client,
            total: e.total_size,
            slots: vec![None; e.total_objects as usize],
        };
        if self.by_fd.len() >= NATIVE_WAITING && !self.by_fd.contains_key(&e.fd) {
            self.by_fd.clear();
        }
        let entry = self.by_fd.entry(e.fd).or_insert_with(|| fresh(e));
        let fits = entry.slots.len() == e.total_objects as usize
            && entry
                .slots
                .get(e.index as usize..e.index as usize + e.pieces.len())
                .is_some_and(|s| s.iter().all(Option::is_none));
        if !fits {
            // an fd number used again for another buffer
            *entry = fresh(e);
        }
        for (i, &(memory, offset, size)) in e.pieces.iter().enumerate() {
            if let Some(slot) = entry.slots.get_mut(e.index as usize + i) {
                *slot = Some(Span { memory, offset, size });
            }
        }
    }

    /// The export gathered under `fd`, taken out (CUDA handed the fd out).
    pub fn take(&mut self, fd: i32) -> Option<NativeExport> {
        self.by_fd.remove(&fd)
    }
}

impl NativeExport {
    /// Whether this export is exactly `plan`'s buffer.
    pub fn equals(&self, plan: &Plan) -> bool {
        let complete: Option<Vec<Span>> = self.slots.iter().copied().collect();
        complete.is_some_and(|n| {
            plan.client == self.client && plan.total == self.total && plan.spans == merged(n)
        })
    }

    /// The export's pieces, for a line.
    pub fn describe(&self) -> String {
        format!("{:?} total {:#x}", self.slots, self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Event;
    use crate::tracker::tests::{alloc, base_tracker, C, DEV};
    use crate::tracker::Notice;

    #[test]
    fn a_plan_is_the_exact_pieces() {
        let mut t = base_tracker();
        alloc(&mut t, 0x10, 0x7f00_0000_0000, 64 << 20, false);
        let p = t.dmabuf_plan(0x7f00_0000_0000, 64 << 20).unwrap();
        assert_eq!(p.spans, vec![Span { memory: 0x10, offset: 0, size: 64 << 20 }]);
        assert_eq!((p.client, p.device, p.base, p.total), (C, DEV, 0x7f00_0000_0000, 64 << 20));
        // a sub-range, not page aligned: rounded out to host pages, offset as libcuda gives it
        let p = t.dmabuf_plan(0x7f00_0020_0010, 0x1000).unwrap();
        assert_eq!(p.spans, vec![Span { memory: 0x10, offset: 0x20_0000, size: 0x2000 }]);
        assert_eq!((p.base, p.total), (0x7f00_0020_0000, 0x2000));
        // two chunks of a VMM range: two handles
        alloc(&mut t, 0x11, 0x7f00_0400_0000, 4 << 20, false);
        alloc(&mut t, 0x12, 0x7f00_0440_0000, 4 << 20, false);
        let p = t.dmabuf_plan(0x7f00_0400_0000, 8 << 20).unwrap();
        assert_eq!(p.spans.len(), 2);
        assert_eq!(p.spans[1], Span { memory: 0x12, offset: 0, size: 4 << 20 });
        assert!(matches!(t.dmabuf_plan(0x7f00_0480_0000, 0x1000), Err(PlanMiss::Lookup(_))));
    }

    #[test]
    fn only_own_video_memory_on_one_gpu() {
        let mut t = base_tracker();
        t.apply(&Event::Memory {
            h_client: C,
            h_parent: DEV,
            h_memory: 0x20,
            class: 0x3e,
            size: Some(0x20_0000),
            attr: 0,
            attr2: 0,
            flags: 0,
        });
        t.apply(&Event::UvmMapExternal {
            base: 0x1000_0000,
            length: 0x20_0000,
            offset: 0,
            gpus: smallvec::smallvec![[3; 16]],
            rm_ctrl_fd: 8,
            h_client: C,
            h_memory: 0x20,
        });
        assert_eq!(t.dmabuf_plan(0x1000_0000, 0x1000), Err(PlanMiss::NotVidmem { class: 0x3e }));
        // a client this process never allocated (its map entry came from a UVM call alone)
        t.apply(&Event::UvmMapExternal {
            base: 0x2000_0000,
            length: 0x20_0000,
            offset: 0,
            gpus: smallvec::smallvec![[3; 16]],
            rm_ctrl_fd: 8,
            h_client: 0xc1d0_0999,
            h_memory: 0x21,
        });
        assert_eq!(
            t.dmabuf_plan(0x2000_0000, 0x1000),
            Err(PlanMiss::UnknownMemory { memory: 0x21 })
        );
    }

    #[test]
    fn more_than_128_pieces_take_several_calls() {
        let mut t = base_tracker();
        for i in 0..130u32 {
            alloc(&mut t, 0x100 + i, 0x7f00_0000_0000 + u64::from(i) * 0x1_0000, 0x1_0000, false);
        }
        let p = t.dmabuf_plan(0x7f00_0000_0000, 130 * 0x1_0000).unwrap();
        assert_eq!((p.spans.len(), p.calls()), (130, 2));
        let first = p.call(0, -1, 0);
        assert_eq!(
            (first.fd, first.total_objects, first.num_objects, first.index, first.total_size),
            (-1, 130, 128, 0, 130 * 0x1_0000)
        );
        assert_eq!(
            (first.handles[127], first.offsets[127], first.sizes[127]),
            (0x100 + 127, 0, 0x1_0000)
        );
        let second = p.call(1, 9, 0);
        assert_eq!(
            (second.fd, second.num_objects, second.index, second.handles[1]),
            (9, 2, 128, 0x100 + 129)
        );
        assert_eq!(second.handles[2], 0, "nothing past num_objects");
    }

    #[test]
    fn the_oracle_compares_libcuda_exports_with_the_plan() {
        let mut t = base_tracker();
        alloc(&mut t, 0x10, 0x7f00_0000_0000, 64 << 20, false);
        let native = |fd, off, size| ExportCall {
            fd,
            h_client: C,
            total_objects: 1,
            index: 0,
            total_size: size,
            mapping_type: 0,
            pieces: vec![(0x10, off, size)],
        };
        t.apply(&Event::DmabufExport(Box::new(native(40, 0x20_0000, 0x40_0000))));
        assert_eq!(t.dmabuf_request(0x7f00_0020_0000, 0x40_0000, 40), None);
        t.apply(&Event::DmabufExport(Box::new(native(41, 0, 0x40_0000))));
        assert!(matches!(
            t.dmabuf_request(0x7f00_0020_0000, 0x40_0000, 41),
            Some(Notice::DmabufMismatch { .. })
        ));
        // a request without a native export seen (the shim's own exports) is not compared
        assert_eq!(t.dmabuf_request(0x7f00_0020_0000, 0x40_0000, 42), None);
        assert_eq!(
            (t.counts.dmabuf_native, t.counts.dmabuf_matched, t.counts.dmabuf_mismatched),
            (2, 1, 1)
        );
    }
}
