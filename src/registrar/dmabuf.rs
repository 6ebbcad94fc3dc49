//! DMA-BUF route: the exact pieces of a range exported as one dma-buf through the GPU's own
//! /dev/nvidiaN, for `ibv_reg_dmabuf_mr` (the hook) or for CUDA's callers. RM keeps its own
//! reference on the memory until the buffer is released, so there is no RM state of ours to undo;
//! what is kept is which memory live MRs use, to say so when that memory is freed.
#![forbid(unsafe_code)]

pub use crate::tracker::dmabuf::{Plan, PlanMiss, Span, HOST_PAGE};

use super::{Client, Export, RegMiss, Rm, StillInUse};
use crate::abi::status::{self, Call};
use crate::decode::Pending;
use crate::route::Route;
use crate::tracker::{ObjKind, Tracker};
use crate::vamap::MemRef;
use rustc_hash::FxHashMap as HashMap;

#[derive(Default)]
pub struct Dmabuf {
    /// RM's dma-buf capability per (client, device), asked once RM can answer.
    capable: HashMap<(u32, u32), bool>,
    /// Live dma-buf MRs per memory object they cover.
    users: HashMap<MemRef, u32>,
}

impl Dmabuf {
    fn capability(&mut self, t: &Tracker, rm: &mut dyn Rm, client: u32, device: u32) -> Result<bool, u32> {
        if let Some(&r) = self.capable.get(&(client, device)) {
            return Ok(r);
        }
        // only RM's answer is kept: a question asked before the device has its subdevice, or one
        // RM refused, is asked again next time
        let r = match (t.client_fd(client), t.subdevice_of(client, device)) {
            (Some(ctl_fd), Some(sub)) => rm.gpu_dmabuf_capable(Client { handle: client, ctl_fd }, sub),
            _ => Err(status::NV_ERR_INVALID_OBJECT_PARENT),
        };
        if let Ok(answer) = r {
            self.capable.insert((client, device), answer);
        }
        r
    }

    /// The capability of the first GPU of the program's own clients that RM answers for.
    pub fn probe_any(&mut self, t: &Tracker, rm: &mut dyn Rm) -> Option<bool> {
        let devices = t.devices();
        devices.into_iter().find_map(|(client, device)| self.capability(t, rm, client, device).ok())
    }

    /// Exports `plan` (for an MR starting at `addr`): the fd of the new buffer, or why not.
    pub fn export(&mut self, t: &Tracker, rm: &mut dyn Rm, plan: &Plan, addr: u64, mapping_type: u8) -> Result<Export, RegMiss> {
        match self.capability(t, rm, plan.client, plan.device) {
            Ok(true) => {}
            Ok(false) => return Err(RegMiss::GpuNotCapable),
            Err(st) => return Err(RegMiss::Rm { call: Call::GpuQuery, status: st }),
        }
        let ctl_fd = t.client_fd(plan.client).ok_or(RegMiss::UnknownClient { client: plan.client })?;
        let c = Client { handle: plan.client, ctl_fd };
        let mut fd = -1;
        for k in 0..plan.calls() {
            let mut params = plan.call(k, fd, mapping_type);
            match rm.export_dmabuf(c, plan.device_instance, &mut params) {
                Ok(got) if k == 0 => fd = got,
                Ok(_) => {}
                Err(st) => {
                    if fd >= 0 {
                        rm.close_fd(fd);
                    }
                    return Err(RegMiss::Rm { call: Call::DmabufExport, status: st });
                }
            }
        }
        let mut mems: Vec<MemRef> = plan.spans.iter().map(|s| MemRef { client: plan.client, memory: s.memory }).collect();
        mems.sort_unstable();
        mems.dedup();
        Ok(Export { fd, offset: addr - plan.base, pieces: plan.spans.len(), bytes: plan.total, mems })
    }

    pub fn mr_added(&mut self, mems: &[MemRef]) {
        for m in mems {
            *self.users.entry(*m).or_default() += 1;
        }
    }

    pub fn mr_gone(&mut self, mems: &[MemRef]) {
        for m in mems {
            if let Some(n) = self.users.get_mut(m) {
                *n -= 1;
                if *n == 0 {
                    self.users.remove(m);
                }
            }
        }
    }

    /// The memory a driver call is about to release (or map over) that dma-buf MRs still use:
    /// the NIC keeps that memory until the MRs go, as with libcuda's own dma-bufs.
    pub fn in_use_by(&self, t: &Tracker, call: &Pending) -> Vec<StillInUse> {
        if self.users.is_empty() {
            return Vec::new();
        }
        let mems: Vec<MemRef> = match *call {
            Pending::RmFree { h_client, h_object } => match t.object(h_client, h_object).map(|o| o.kind) {
                Some(ObjKind::Memory { .. }) => vec![MemRef { client: h_client, memory: h_object }],
                // RM frees what lies under the object (a device's memory, a client's everything)
                Some(_) => self.users.keys().filter(|m| m.client == h_client && lies_under(t, **m, h_object)).copied().collect(),
                None => Vec::new(),
            },
            Pending::UvmFree { base } => t.map.memory_in(base, base.saturating_add(t.uvm_free_extent(base, None))),
            Pending::UvmUnmap { base, length } => t.map.memory_in(base, base.saturating_add(length)),
            // mapping the same memory again (cuMemSetAccess) leaves the MRs describing what is there
            Pending::UvmMap { base, length, h_client, h_memory, .. } => {
                let same = MemRef { client: h_client, memory: h_memory };
                t.map.memory_in(base, base.saturating_add(length)).into_iter().filter(|m| *m != same).collect()
            }
        };
        let mut out: Vec<StillInUse> = Vec::new();
        for m in mems {
            if let Some(&n) = self.users.get(&m) {
                let what = format!("{{hClient={:#010x} hMemory={:#010x}}}", m.client, m.memory);
                if !out.iter().any(|s| s.what == what) {
                    out.push(StillInUse { route: Route::Dmabuf, what, mrs: n });
                }
            }
        }
        out
    }
}

/// Whether `object` is among `mem`'s ancestors in the tracker's tree of RM objects.
fn lies_under(t: &Tracker, mem: MemRef, object: u32) -> bool {
    let mut h = mem.memory;
    // (RM's tree is a few levels deep: memory, device, client; the bound stops any loop)
    for _ in 0..8 {
        let Some(o) = t.object(mem.client, h) else { return false };
        if o.parent == object {
            return true;
        }
        if o.parent == h {
            return false; // the client, its own parent
        }
        h = o.parent;
    }
    false
}
