//! The pure core: what the process knows of its GPU memory (the tracker and its map), the
//! registrations of each route made on it, and the RM calls they make (`Rm`: the real ones in the
//! process, a fake in the tests); and the hooks' work it applies in order.
#![forbid(unsafe_code)]

use crate::capture;
use crate::decode;
use crate::registrar::{Outcome, Registrar, Rm};
use crate::tracker::{ContextEnd, Tracker};
use crate::vamap::ContextTag;

/// The pure core: the map and the registrations that depend on it, with the RM calls they make
/// (the real ones in the process, a fake in the tests). The process keeps it behind one lock
/// (`pipeline`).
pub struct Core<R: Rm> {
    /// NVIDIA calls decoded into an event and applied (every reader catches up first, so it
    /// counts them all).
    pub decoded: u64,
    pub tracker: Box<Tracker>,
    pub registrar: Box<Registrar>,
    /// Our own RM calls (the real ones own the /dev/nvidiaN fds they export on).
    pub rm: R,
}

/// What the ioctl and allocation hooks hand to the core.
pub enum Work {
    Event(decode::Event),
    /// The program was handed `[ptr, ptr+len)`, made in context `ctx` (`VaMap::own_in`).
    UserAllocation {
        api: &'static str,
        ptr: u64,
        len: u64,
        ctx: ContextTag,
    },
    /// The program was handed `[ptr, ptr+len)` by a CUDA call that is no allocation of new
    /// memory (`cuMemMap` of a handle, an IPC or pool import): its memory from now on, exactly
    /// that range (`VaMap::own_import_in`), of context `ctx` (an IPC handle's) or of none.
    ProgramMapping {
        ptr: u64,
        len: u64,
        ctx: ContextTag,
    },
    /// The program made CUDA context `ctx`: device `primary_of`'s primary context (retained),
    /// or one it created.
    ContextMade {
        ctx: u64,
        primary_of: Option<i32>,
    },
    /// A CUDA context ended: the allocations made in it are the program's no longer
    /// (`Tracker::context_ended`).
    ContextEnded(ContextEnd),
    /// The program gave memory back: the allocation at `ptr` (`len` `None`: a free), or all of
    /// `[ptr, ptr+len)` (an unmap).
    ProgramRelease {
        ptr: u64,
        len: Option<u64>,
    },
    /// CUDA handed out dma-buf `fd` for `[ptr, ptr+size)` (compared with libcuda's export).
    DmabufRequest {
        ptr: u64,
        size: u64,
        fd: i32,
    },
}

impl<R: Rm> Core<R> {
    /// Applies `batch`, in order. `warn` gets the lines worth a warning.
    pub fn apply(&mut self, batch: &[Work], warn: &mut dyn FnMut(&str)) {
        let Core { tracker, registrar, decoded, .. } = self;
        for w in batch {
            match *w {
                Work::Event(ref ev) => {
                    *decoded += 1;
                    if let decode::Event::Free { h_client, h_object, .. } = *ev {
                        if h_client == h_object {
                            registrar.forget_client(h_client);
                        } else {
                            registrar.forget_freed(h_client, h_object);
                        }
                    }
                    for n in tracker.apply(ev) {
                        warn(&capture::notice_line(&n));
                    }
                }
                Work::UserAllocation { api, ptr, len, ctx } => {
                    if let Some(v) = tracker.user_allocation_quiet(ptr, len, ctx) {
                        warn(&capture::verdict_line(api, ptr, len, &v));
                    }
                }
                Work::ProgramMapping { ptr, len, ctx } => tracker.map.own_import_in(ptr, len, ctx),
                Work::ContextMade { ctx, primary_of } => tracker.context_made(ctx, primary_of),
                Work::ContextEnded(end) => tracker.context_ended(end),
                Work::ProgramRelease { ptr, len: None } => {
                    tracker.map.disown_at(ptr);
                }
                Work::ProgramRelease { ptr, len: Some(len) } => {
                    tracker.map.disown(ptr, ptr.saturating_add(len))
                }
                Work::DmabufRequest { ptr, size, fd } => {
                    if let Some(n) = tracker.dmabuf_request(ptr, size, fd) {
                        warn(&capture::notice_line(&n));
                    }
                }
            }
        }
    }

    /// Takes in what a verbs call over one of the registrar's decisions came to.
    pub fn take_outcome(&mut self, o: Outcome) {
        let Core { registrar, rm, .. } = self;
        registrar.take_outcome(rm, o);
    }
}
