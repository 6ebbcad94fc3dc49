//! RM as far as third-party P2P and dma-buf exports go, with its rules and its own clean-ups:
//! the model test's driver (nvidia-abi.md S3, S10).

use super::*;
use crate::fd::{FileId, OwnedFd};

/// A dma-buf: its size and, per slot, the (memory, offset, size) attached.
pub(super) type Buffer = (u64, Vec<Option<(MemRef, u64, u64)>>);

#[derive(Clone, Copy)]
pub(super) struct FakeMem {
    pub(super) device: u32,
    pub(super) vidmem: bool,
    pub(super) size: u64,
}

#[derive(Clone)]
pub(super) struct P2pObj {
    pub(super) client: u32,
    pub(super) subdevice: u32,
    pub(super) h: u32,
    pub(super) vaspaces: Vec<u32>,
}

/// RM as far as third-party P2P goes, with its rules and its own clean-ups.
#[derive(Default)]
pub(super) struct StrictRm {
    pub(super) subdevices: HashMap<(u32, u32), u32>, // (client, subdevice) -> device
    pub(super) mems: HashMap<MemRef, FakeMem>,
    pub(super) p2p: Vec<P2pObj>,
    pub(super) regs: Vec<(u32, VidmemTuple)>, // (503C handle, tuple)
    pub(super) next_handle: u32,
    pub(super) refused: u64,
    /// (client, device) -> device instance (the GPU)
    pub(super) instances: HashMap<(u32, u32), u32>,
    /// dma-bufs made: fd -> (total size, pieces (memory, offset, size) by slot)
    pub(super) exports: HashMap<i32, Buffer>,
    pub(super) next_fd: i32,
}

impl StrictRm {
    pub(super) fn obj(&self, client: u32, h: u32) -> Option<&P2pObj> {
        self.p2p.iter().find(|o| o.client == client && o.h == h)
    }
    /// RM frees a vidmem object: it unregisters it from every 503C of its client.
    pub(super) fn free_mem(&mut self, m: MemRef) {
        self.mems.remove(&m);
        self.regs.retain(|(_, t)| t.mem != m);
    }
    /// RM frees a device: its memory, its subdevice and the 503C under that.
    pub(super) fn free_device(&mut self, client: u32, device: u32) {
        let gone: Vec<MemRef> = self
            .mems
            .iter()
            .filter(|(m, f)| m.client == client && f.device == device)
            .map(|(m, _)| *m)
            .collect();
        for m in gone {
            self.free_mem(m);
        }
        let subs: Vec<u32> = self
            .subdevices
            .iter()
            .filter(|(k, d)| k.0 == client && **d == device)
            .map(|(k, _)| k.1)
            .collect();
        for s in subs {
            self.subdevices.remove(&(client, s));
            let objs: Vec<u32> = self
                .p2p
                .iter()
                .filter(|o| o.client == client && o.subdevice == s)
                .map(|o| o.h)
                .collect();
            for h in objs {
                self.drop_p2p(client, h);
            }
        }
    }
    pub(super) fn free_client(&mut self, client: u32) {
        self.mems.retain(|m, _| m.client != client);
        self.regs.retain(|(_, t)| t.mem.client != client);
        self.p2p.retain(|o| o.client != client);
        self.subdevices.retain(|k, _| k.0 != client);
    }
    pub(super) fn drop_p2p(&mut self, client: u32, h: u32) {
        self.regs.retain(|(p, t)| !(*p == h && t.mem.client == client));
        self.p2p.retain(|o| !(o.client == client && o.h == h));
    }
    fn refuse<T>(&mut self, st: u32) -> Result<T, u32> {
        self.refused += 1;
        Err(st)
    }

    /// `nvidia_p2p_get_pages` without tokens, for this process: every 503C of the pid, every VA
    /// space of each (two VA spaces on one object count a hit twice), exactly one range holding
    /// the 64 KiB-rounded `[va, va+len)`. Gives the memory and the offset of `va` in it.
    pub(super) fn get_pages(&self, va: u64, len: u64) -> Result<(MemRef, u64), &'static str> {
        let (lo, hi) = (down(va), up(va + len));
        let mut hits = Vec::new();
        for o in &self.p2p {
            if o.vaspaces.is_empty() {
                continue;
            }
            for (_, t) in self.regs.iter().filter(|(p, t)| *p == o.h && t.mem.client == o.client) {
                if lo >= t.address && hi <= t.address + t.size {
                    for _ in &o.vaspaces {
                        hits.push(*t);
                    }
                }
            }
        }
        match hits.as_slice() {
            [t] => Ok((t.mem, t.offset + (va - t.address))),
            [] => Err("no registration holds the range (EFAULT/EINVAL)"),
            _ => Err("more than one registration holds the range (NV_ERR_GENERIC)"),
        }
    }
}

impl Rm for StrictRm {
    fn alloc_p2p(&mut self, c: RmClient, subdevice: u32) -> Result<u32, u32> {
        let client = c.handle;
        if !self.subdevices.contains_key(&(client, subdevice)) {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        if self.p2p.iter().any(|o| o.client == client && o.subdevice == subdevice) {
            return self.refuse(status::NV_ERR_STATE_IN_USE);
        }
        self.next_handle += 1;
        let h = 0xcaf0_0000 + self.next_handle;
        self.p2p.push(P2pObj { client, subdevice, h, vaspaces: Vec::new() });
        Ok(h)
    }
    fn register_va_space(&mut self, c: RmClient, p2p: u32, h_vaspace: u32) -> Result<u64, u32> {
        let client = c.handle;
        let Some(i) = self.p2p.iter().position(|o| o.client == client && o.h == p2p) else {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        };
        if self.p2p[i].vaspaces.contains(&h_vaspace) {
            return self.refuse(status::NV_ERR_INSERT_DUPLICATE_NAME);
        }
        self.p2p[i].vaspaces.push(h_vaspace);
        Ok(0xfe00)
    }
    fn register_vidmem(&mut self, c: RmClient, p2p: u32, t: &VidmemTuple) -> Result<(), u32> {
        let client = c.handle;
        let Some(o) = self.obj(client, p2p).cloned() else {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        };
        // same client, then same device as the 503C's subdevice, then FBMEM, then alignment
        if t.mem.client != client {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        let Some(m) = self.mems.get(&t.mem).copied() else {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        };
        if self.subdevices.get(&(client, o.subdevice)) != Some(&m.device) {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        if !m.vidmem {
            return self.refuse(status::NV_ERR_NOT_SUPPORTED);
        }
        if t.size == 0
            || !(t.size | t.address | t.offset).is_multiple_of(PAGE)
            || t.offset.checked_add(t.size).is_none_or(|e| e > m.size)
        {
            return self.refuse(status::NV_ERR_INVALID_ARGUMENT);
        }
        let clash = self.regs.iter().any(|(p, r)| {
            *p == p2p
                && r.mem.client == client
                && (r.mem == t.mem
                    || (t.address < r.address + r.size && r.address < t.address + t.size))
        });
        if clash {
            return self.refuse(status::NV_ERR_INSERT_DUPLICATE_NAME);
        }
        self.regs.push((p2p, *t));
        Ok(())
    }
    fn unregister_vidmem(&mut self, c: RmClient, p2p: u32, h_memory: u32) -> Result<(), u32> {
        let client = c.handle;
        let n = self.regs.len();
        self.regs
            .retain(|(p, t)| !(*p == p2p && t.mem.client == client && t.mem.memory == h_memory));
        if self.regs.len() == n {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        Ok(())
    }
    fn free(&mut self, c: RmClient, _parent: u32, h: u32) -> Result<(), u32> {
        let client = c.handle;
        if self.obj(client, h).is_none() {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        self.drop_p2p(client, h);
        Ok(())
    }
    fn gpu_dmabuf_capable(&mut self, c: RmClient, subdevice: u32) -> Result<bool, u32> {
        if !self.subdevices.contains_key(&(c.handle, subdevice)) {
            return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
        }
        Ok(true)
    }
    /// RM's rules of nv-dmabuf.c / RmDmabufVerifyMemHandle: the memory of the fd's GPU, video
    /// memory, page-aligned pieces inside it, slots filled once, sizes adding up to the total.
    fn export_dmabuf(
        &mut self,
        c: RmClient,
        instance: u32,
        p: &mut ExportToDmabufFd,
        into: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32> {
        // a later call names the buffer it adds to, and only that one
        assert_eq!(into.map_or(-1, OwnedFd::num), p.fd, "the buffer a later call adds to");
        let (n, index, total_objects) =
            (p.num_objects as usize, p.index as usize, p.total_objects as usize);
        if p.total_size == 0
            || n == 0
            || total_objects == 0
            || n > 128
            || n > total_objects
            || index + n > total_objects
        {
            return self.refuse(status::NV_ERR_INVALID_ARGUMENT);
        }
        let mut pieces = Vec::new();
        for i in 0..n {
            let m = MemRef { client: c.handle, memory: p.handles[i] };
            let Some(f) = self.mems.get(&m).copied() else {
                return self.refuse(status::NV_ERR_OBJECT_NOT_FOUND);
            };
            if self.instances.get(&(c.handle, f.device)) != Some(&instance) {
                return self.refuse(status::NV_ERR_INVALID_OBJECT_PARENT);
            }
            let (off, size) = (p.offsets[i], p.sizes[i]);
            if !f.vidmem || size == 0 || (off | size) % 0x1000 != 0 || off + size > f.size {
                return self.refuse(status::NV_ERR_INVALID_ARGUMENT);
            }
            pieces.push((m, off, size));
        }
        let creates = p.fd == -1;
        let fd = if creates {
            self.next_fd += 1;
            self.exports.insert(self.next_fd, (p.total_size, vec![None; total_objects]));
            self.next_fd
        } else {
            p.fd
        };
        let Some((total, slots)) = self.exports.get_mut(&fd) else {
            return self.refuse(status::NV_ERR_INVALID_ARGUMENT);
        };
        for (i, piece) in pieces.into_iter().enumerate() {
            if slots[index + i].replace(piece).is_some() {
                return self.refuse(status::NV_ERR_IN_USE);
            }
        }
        if slots.iter().all(Option::is_some)
            && slots.iter().map(|s| s.expect("filled").2).sum::<u64>() != *total
        {
            return self.refuse(status::NV_ERR_INVALID_ARGUMENT);
        }
        p.fd = fd;
        Ok(creates.then(|| OwnedFd::new(fd, FileId { dev: 1, ino: fd as u64, rdev: 0 })))
    }
    fn close_fd(&mut self, fd: OwnedFd) {
        self.exports.remove(&fd.num());
    }
    /// (no program here closes fds it does not own)
    fn still_ours(&mut self, _fd: &OwnedFd) -> bool {
        true
    }
}
