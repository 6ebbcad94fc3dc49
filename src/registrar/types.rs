//! What the registration paths share: the program's RM clients, the RM calls they need (`Rm`),
//! the counts, what to do about one verbs registration and what an MR holds.
#![forbid(unsafe_code)]

use super::bar1;
use super::miss::RegMiss;
use crate::abi::dmabuf::ExportToDmabufFd;
use crate::fd::{FileId, OwnedFd};
use crate::route::Route;
use crate::tracker::VidmemTuple;
use crate::vamap::MemRef;
use rustc_hash::FxHashMap as HashMap;

/// An RM client of the program and the /dev/nvidiactl fd it was allocated on (strict client
/// validation: RM takes the client's calls on that fd only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    pub handle: u32,
    pub ctl_fd: i32,
}

/// The RM calls the registrar needs. Errors are RM status codes (NV_ERR_GENERIC when the ioctl
/// itself failed).
pub trait Rm {
    fn alloc_p2p(&mut self, c: Client, subdevice: u32) -> Result<u32, u32>;
    fn register_va_space(&mut self, c: Client, p2p: u32, h_vaspace: u32) -> Result<u64, u32>;
    fn register_vidmem(&mut self, c: Client, p2p: u32, t: &VidmemTuple) -> Result<(), u32>;
    fn unregister_vidmem(&mut self, c: Client, p2p: u32, h_memory: u32) -> Result<(), u32>;
    fn free(&mut self, c: Client, parent: u32, h: u32) -> Result<(), u32>;
    /// RM's dma-buf capability of the GPU behind `subdevice`.
    fn gpu_dmabuf_capable(&mut self, c: Client, subdevice: u32) -> Result<bool, u32>;
    /// One NV_ESC_EXPORT_TO_DMABUF_FD on a /dev/nvidiaN fd of the GPU with RM device instance
    /// `device_instance`. The first call of a buffer (`params.fd` -1) makes it: its fd, ours
    /// (`Some`); a later one adds pieces to `params.fd`, `into`'s number (`None`), checked to be
    /// still that buffer where the call cannot meet a program close.
    fn export_dmabuf(
        &mut self,
        c: Client,
        device_instance: u32,
        params: &mut ExportToDmabufFd,
        into: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32>;
    /// Closes an fd of ours where its number is still that file; one the program closed (the
    /// number is another file now, or none) is let go unclosed, and said.
    fn close_fd(&mut self, fd: OwnedFd);
    /// Whether an fd of ours is still its file: a kept buffer's fd is checked before it is used
    /// again (a program may close fds it does not own, `closefrom` in a daemon).
    fn still_ours(&mut self, fd: &OwnedFd) -> bool;
    /// An fd of ours handed to a caller (CUDA's), whose it is from now on: its number.
    fn hand_out(&mut self, fd: OwnedFd) -> i32 {
        fd.into_parts().0
    }
    /// A refusal worth telling a person about that has no caller to return to (an unregister or
    /// a free RM refused), with a key for rate limiting. The core does no I/O: its `Rm` does.
    fn refused(&mut self, key: &'static str, line: String) {
        let _ = (key, line);
    }
    /// What RM says of the BAR1 of the GPU behind `subdevice` (RM device instance
    /// `device_instance`), or the PCI device's BAR 1 where RM cannot tell; unknown parts `None`.
    fn bar1(&mut self, c: Client, subdevice: u32, device_instance: u32) -> bar1::Bar1 {
        let _ = (c, subdevice, device_instance);
        bar1::Bar1::default()
    }
    /// A warning for a person that the core already rate-limited (the core does no I/O).
    fn notice(&mut self, line: String) {
        let _ = line;
    }
}

/// A table that held many entries and now holds few gives its buckets back: a registration
/// then touches a few warm cache lines, not a random bucket of a table sized for its peak.
/// Amortised O(1): the table shrinks to twice its size only after it fell below an eighth.
pub(crate) fn shrink_when_sparse<K: Eq + std::hash::Hash, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 1024 && m.len() * 8 < m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegCounts {
    pub pass0_hits: u64,
    pub pass0_misses: u64,
    pub registered: u64,
    pub unregistered: u64,
    pub rm_errors: u64,
    pub host: u64,
    pub stood_aside: u64,
    pub p2p_objects: u64,
    /// dma-bufs gdrshim exported (for verbs MRs and for CUDA's callers).
    pub dmabuf_exports: u64,
    /// Verbs registrations that used a buffer of ours already exported for the same pieces.
    pub dmabuf_reused: u64,
    /// `IBV_ACCESS_ON_DEMAND` registrations of GPU memory: neither route serves them.
    pub odp: u64,
}

impl RegCounts {
    /// The counts as the summary names them.
    pub fn pairs(&self) -> [(&'static str, u64); 11] {
        [
            ("pass0_hits", self.pass0_hits),
            ("pass0_misses", self.pass0_misses),
            ("registered", self.registered),
            ("unregistered", self.unregistered),
            ("rm_errors", self.rm_errors),
            ("host_mrs", self.host),
            ("stood_aside", self.stood_aside),
            ("p2p_objects", self.p2p_objects),
            ("dmabuf_exports", self.dmabuf_exports),
            ("dmabuf_reused", self.dmabuf_reused),
            ("odp_mrs", self.odp),
        ]
    }
}

/// What the hook must do for one DMA-BUF registration: `ibv_reg_dmabuf_mr(pd, offset, len,
/// iova, fd, access)`, then tell the registrar the outcome (`Registrar::after_dmabuf_reg` or
/// `dmabuf_not_used`). The hook closes nothing: `fd` is gdrshim's kept one, open until the outcome
/// is told (the MR holds its own reference to the buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// The buffer's fd for the call: a kept fd of ours (`buf` is `Some`), or for CUDA's callers
    /// the caller's own (`buf` is `None`).
    pub fd: i32,
    /// For a kept fd of ours, the file it was made as: the hook checks the number again within
    /// the call's protected section (a program may have closed it since the decision).
    pub file: Option<FileId>,
    /// Offset of the MR's first byte in the buffer (the buffer starts at the page below it).
    pub offset: u64,
    pub pieces: usize,
    pub bytes: u64,
    pub mems: Vec<MemRef>,
    /// The shared buffer whose kept fd `fd` is; `None`: the fd is the caller's.
    pub buf: Option<u64>,
    /// The buffer existed already (no export was made for this registration).
    pub reused: bool,
}

/// What to do about one verbs registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not GPU memory: delegate, nothing to do.
    Host,
    /// `IBV_ACCESS_ON_DEMAND`: ODP MRs can use neither route; delegated untouched, counted.
    Odp,
    /// Native registration present (datacenter GPU): delegate, register nothing.
    StandAside,
    /// NV503C: registered (or shared an existing registration) for this memory; commit or release.
    Hit { mem: MemRef, offset: u64, tuple: VidmemTuple, fresh: bool, id: u64 },
    /// DMA-BUF: exported; the hook registers the buffer instead of delegating.
    Exported(Export),
    /// DMA-BUF in shadow mode: what would be exported.
    WouldExport { pieces: usize, bytes: u64 },
    /// Nothing registered; delegate and let the real call fail as it would (shadow mode, no
    /// route, or VA that is no GPU memory now).
    Miss(RegMiss),
    /// GPU memory without an exact hit, in register mode: nothing registered, and the call must
    /// not reach the provider, which could serve it from memory that is not the program's (with
    /// nvidia-peermem loaded, from a registration RM holds for another MR: the whole mapping of
    /// a chunk whose other blocks are freed or CUDA's). It fails as on a GeForce without gdrshim:
    /// EFAULT.
    Refuse(RegMiss),
}

/// The registration reference of an MR being deregistered, held across the provider's call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeldRef {
    Nv503c {
        mem: MemRef,
        id: u64,
    },
    /// A dma-buf MR of ours: `ibv_mr.addr` must read `provider_addr` again while the provider
    /// deregisters it (gdrshim set it to the VA the caller registered).
    Dmabuf {
        provider_addr: u64,
        va: u64,
        mems: Vec<MemRef>,
        /// The shared buffer it was registered over, and the bytes of that buffer.
        buf: Option<u64>,
        bytes: u64,
    },
}

/// A memory object whose memory or VA a driver call is about to release while verbs MRs still
/// use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StillInUse {
    pub route: Route,
    pub what: String,
    pub mrs: u32,
}

/// A verbs registration request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsReg {
    pub addr: u64,
    pub len: u64,
    /// `IBV_ACCESS_*` flags.
    pub access: u32,
    /// `ibv_rereg_mr` moving an MR (cannot become a dma-buf MR).
    pub rereg: bool,
}
