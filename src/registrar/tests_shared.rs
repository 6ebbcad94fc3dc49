//! One dma-buf per piece set: every verbs MR over the same pieces of the same allocations uses
//! one export of ours, closed with the last MR; a buffer is never reused for memory freed and
//! allocated again, and CUDA's callers always get a new export of their own.

use super::tests::{tracker_with, C, DEV};
use super::*;
use crate::abi::dmabuf::ExportToDmabufFd;
use crate::decode::Event;
use crate::fd::{FileId, OwnedFd};
use std::collections::BTreeMap;

const VA: u64 = 0x7f00_0000_0000;
const MB2: u64 = 0x20_0000;

/// An RM whose exports are files with an identity: every fd open is listed with the buffer it
/// is, every close is checked, and an fd of ours is closed only while its number is still it.
#[derive(Default)]
struct BufRm {
    exports: u32,
    next_fd: i32,
    /// fd → buffer number
    open: BTreeMap<i32, u32>,
    /// exported pieces per buffer
    pieces: Vec<Vec<(u32, u64, u64)>>,
    /// `fstat`s (identity checks) and closes made: system calls, several µs each under gVisor
    fstats: u32,
    closes: u32,
    /// fds of ours found closed by the program and let go unclosed
    let_go: u32,
}
impl BufRm {
    fn fd(&mut self, buf: u32) -> i32 {
        self.next_fd += 1;
        let fd = 100 + self.next_fd;
        self.open.insert(fd, buf);
        fd
    }
    /// What the program does with an fd it was handed (a CUDA caller's): closes it.
    fn caller_closes(&mut self, e: &Export) {
        assert!(e.buf.is_none(), "only a caller's own fd is the caller's to close");
        assert!(self.open.remove(&e.fd).is_some(), "the caller's fd {} is open", e.fd);
    }
    fn is_file(&mut self, fd: &OwnedFd) -> bool {
        self.fstats += 1;
        self.open.get(&fd.num()).map(|&b| b as u64) == Some(fd.file().ino)
    }
}
impl Rm for BufRm {
    fn alloc_p2p(&mut self, _: Client, _: u32) -> Result<u32, u32> {
        panic!("no 503C on the DMA-BUF route")
    }
    fn register_va_space(&mut self, _: Client, _: u32, _: u32) -> Result<u64, u32> {
        panic!("no 503C on the DMA-BUF route")
    }
    fn register_vidmem(&mut self, _: Client, _: u32, _: &VidmemTuple) -> Result<(), u32> {
        panic!("no 503C on the DMA-BUF route")
    }
    fn unregister_vidmem(&mut self, _: Client, _: u32, _: u32) -> Result<(), u32> {
        panic!("no 503C on the DMA-BUF route")
    }
    fn free(&mut self, _: Client, _: u32, _: u32) -> Result<(), u32> {
        panic!("no 503C on the DMA-BUF route")
    }
    fn gpu_dmabuf_capable(&mut self, _: Client, _: u32) -> Result<bool, u32> {
        Ok(true)
    }
    fn export_dmabuf(
        &mut self,
        _: Client,
        _: u32,
        p: &mut ExportToDmabufFd,
        _: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32> {
        self.exports += 1;
        let n = p.num_objects as usize;
        self.pieces.push((0..n).map(|i| (p.handles[i], p.offsets[i], p.sizes[i])).collect());
        let buf = self.exports;
        let fd = self.fd(buf);
        // made ours: its identity, one fstat
        self.fstats += 1;
        Ok(Some(OwnedFd::new(fd, FileId { dev: 7, ino: buf as u64, rdev: 0 })))
    }
    fn close_fd(&mut self, fd: OwnedFd) {
        if !self.is_file(&fd) {
            self.let_go += 1;
            return;
        }
        self.closes += 1;
        assert!(
            self.open.remove(&fd.num()).is_some(),
            "closed fd {} twice or never had it",
            fd.num()
        );
    }
    fn still_ours(&mut self, fd: &OwnedFd) -> bool {
        self.is_file(fd)
    }
}

fn exported(d: Decision) -> Export {
    match d {
        Decision::Exported(e) => e,
        d => panic!("not exported: {d:?}"),
    }
}

/// The system calls of a registration, by the route's own count (H200 under gVisor):
/// a new buffer costs its export and one `fstat` (its identity), no duplicate and no close; the
/// same buffer again costs one `fstat`, nothing else; the fd handed to the verbs call is the kept
/// one.
#[test]
fn a_registration_makes_no_system_call_it_does_not_need() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    let first = register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    assert_eq!(
        (rm.exports, rm.fstats, rm.closes, rm.next_fd),
        (1, 1, 0, 1),
        "first: the export and its identity only"
    );
    let again = register(&mut r, &t, &mut rm, VA, MB2, 0xb);
    assert_eq!(
        (rm.exports, rm.fstats, rm.closes, rm.next_fd),
        (1, 2, 0, 1),
        "repeat: one identity check only"
    );
    assert_eq!(first.fd, again.fd, "the kept fd itself");
    assert!(
        first.buf.is_some() && again.buf.is_some(),
        "gdrshim's kept fd: the hook closes nothing"
    );
    dereg(&mut r, &mut rm, 0xa, VA);
    dereg(&mut r, &mut rm, 0xb, VA);
    assert_eq!((rm.closes, rm.open.len()), (1, 0), "closed once, with the last MR");
}

/// The kept fd is the verbs call's own argument: a release on another thread while the call runs
/// must not close it (its number could name another file by the time the call reads it).
#[test]
fn a_buffer_released_while_its_verbs_call_runs_keeps_its_fd_until_the_outcome() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    let twin = exported(r.before_reg(&t, &mut rm, VA, MB2));
    assert!(twin.reused);
    r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: VA });
    assert!(rm.open.contains_key(&twin.fd), "in use by a verbs call: still open");
    r.after_dmabuf_reg(&mut rm, 0xb, &twin, 0, VA);
    assert!(
        rm.open.is_empty(),
        "the call returned: closed (the MRs hold the buffer in the kernel)"
    );
    let fresh = exported(r.before_reg(&t, &mut rm, VA, MB2));
    assert!(!fresh.reused, "a released buffer is never used again");
    // a refused call's outcome closes it the same way
    r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: VA });
    assert!(rm.open.contains_key(&fresh.fd));
    r.dmabuf_not_used(&mut rm, &fresh);
    assert!(rm.open.is_empty());
    dereg(&mut r, &mut rm, 0xa, VA);
    dereg(&mut r, &mut rm, 0xb, VA);
    assert_eq!(r.dmabuf_buffers(), (0, 0));
}

/// A verbs registration of `[va, va+len)` through to its MR `mr`, as the hook makes it.
fn register(r: &mut Registrar, t: &Tracker, rm: &mut BufRm, va: u64, len: u64, mr: u64) -> Export {
    let e = exported(r.before_reg(t, rm, va, len));
    assert!(rm.open.contains_key(&e.fd), "the call's fd {} is open", e.fd);
    r.after_dmabuf_reg(rm, mr, &e, 0, va);
    e
}

fn dereg(r: &mut Registrar, rm: &mut BufRm, mr: u64, va: u64) {
    let held = r.take_mr(rm, mr, va).expect("a dma-buf MR of ours");
    r.finish_dereg(rm, mr, held, true);
}

#[test]
fn n_mrs_over_one_buffer_share_one_export_closed_with_the_last() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    for k in 0..4 {
        let e = register(&mut r, &t, &mut rm, VA, MB2, 0xa0 + k);
        assert_eq!(e.reused, k > 0);
    }
    assert_eq!(rm.exports, 1, "one export for four MRs (second NIC, relaxed-order twin, ...)");
    assert_eq!((r.counts.dmabuf_exports, r.counts.dmabuf_reused), (1, 3));
    assert_eq!(rm.open.len(), 1, "our one fd, handed to every call");
    assert_eq!(r.dmabuf_bytes(), (4 * MB2, 4 * MB2, MB2, MB2));
    for k in 0..3 {
        dereg(&mut r, &mut rm, 0xa0 + k, VA);
        assert_eq!(rm.open.len(), 1, "open while an MR uses it");
    }
    dereg(&mut r, &mut rm, 0xa3, VA);
    assert!(rm.open.is_empty(), "closed with the last MR: {:?}", rm.open);
    assert_eq!(r.dmabuf_bytes(), (0, 4 * MB2, 0, MB2), "live back to 0, the peaks kept");
    assert_eq!(r.dmabuf_buffers(), (0, 0));
    // and a later registration exports again
    register(&mut r, &t, &mut rm, VA, MB2, 0xb0);
    assert_eq!(rm.exports, 2);
}

#[test]
fn other_pieces_get_their_own_buffer() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    let half = register(&mut r, &t, &mut rm, VA, MB2 / 2, 0xb);
    assert!(!half.reused, "half the allocation is another piece set");
    // an MR at another offset in the same page-rounded range is the same buffer
    let inner = register(&mut r, &t, &mut rm, VA + 0x10, MB2 / 2 - 0x10, 0xc);
    assert!(inner.reused && inner.offset == 0x10, "{inner:?}");
    assert_eq!(rm.exports, 2);
}

#[test]
fn memory_freed_and_allocated_again_under_its_handle_gets_a_new_export() {
    let mut t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    // the program frees the memory (the MR still holds the old buffer) and CUDA allocates again
    // with the same handle at the same VA
    r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: VA });
    t.apply(&Event::UvmFree { base: VA, length: None });
    r.before_driver_call(&t, &mut rm, Pending::RmFree { h_client: C, h_object: 0x10 });
    t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: 0x10 });
    assert!(
        rm.open.is_empty(),
        "our fd closed at the release; the MR keeps its buffer in the kernel"
    );
    let t2 = {
        t.apply(&Event::Memory {
            h_client: C,
            h_parent: DEV,
            h_memory: 0x10,
            class: 0x40,
            size: Some(MB2),
            attr: 0,
            attr2: 0,
            flags: 0,
        });
        t.apply(&Event::UvmCreateExternalRange { base: VA, length: MB2 });
        t.apply(&super::tests::map_on_gpu(VA, MB2, 0, 0x10));
        t.map.own(VA, MB2);
        t
    };
    let e = register(&mut r, &t2, &mut rm, VA, MB2, 0xb);
    assert!(!e.reused);
    assert_eq!(rm.exports, 2, "new memory under the old handle: a new export");
    // the old MR goes: nothing of ours left to close for it, the new buffer stays
    dereg(&mut r, &mut rm, 0xa, VA);
    assert_eq!(rm.open.len(), 1);
    dereg(&mut r, &mut rm, 0xb, VA);
    assert!(rm.open.is_empty());
}

/// The key alone must tell new memory from old even when no release was seen before the
/// registration (a free that reached the map without passing the registrar).
#[test]
fn a_handle_allocated_again_without_a_seen_release_is_not_the_old_buffer() {
    let mut t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    t.apply(&Event::UvmFree { base: VA, length: None });
    t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: 0x10 });
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 0x10,
        class: 0x40,
        size: Some(MB2),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::UvmCreateExternalRange { base: VA, length: MB2 });
    t.apply(&super::tests::map_on_gpu(VA, MB2, 0, 0x10));
    t.map.own(VA, MB2);
    let e = register(&mut r, &t, &mut rm, VA, MB2, 0xb);
    assert!(!e.reused, "same handle, offsets and VA, other allocation: {e:?}");
    assert_eq!(rm.exports, 2);
}

#[test]
fn a_refused_registration_releases_its_hold_and_the_last_closes() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    let e = exported(r.before_reg(&t, &mut rm, VA, MB2));
    r.dmabuf_not_used(&mut rm, &e);
    assert!(rm.open.is_empty(), "no MR uses it: closed");
    // one MR, then a twin the provider refuses: the buffer stays for the first
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    let twin = exported(r.before_reg(&t, &mut rm, VA, MB2));
    assert!(twin.reused);
    r.dmabuf_not_used(&mut rm, &twin);
    assert_eq!(rm.open.len(), 1);
    dereg(&mut r, &mut rm, 0xa, VA);
    assert!(rm.open.is_empty());
}

#[test]
fn cuda_callers_get_their_own_export_never_kept() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    let a = r.export(&t, &mut rm, VA, MB2, 0).unwrap().unwrap();
    let b = r.export(&t, &mut rm, VA, MB2, 0).unwrap().unwrap();
    assert_eq!(rm.exports, 3, "each cuMemGetHandleForAddressRange is its own export");
    assert!(a.buf.is_none() && b.buf.is_none() && a.fd != b.fd);
    // the caller closes them; the verbs MR's buffer is not touched by that
    rm.caller_closes(&a);
    rm.caller_closes(&b);
    let e = register(&mut r, &t, &mut rm, VA, MB2, 0xb);
    assert!(e.reused, "a caller's export is never a kept buffer, nor does it end one");
}

/// A program that closed our fd (closefrom in a daemon, a bug) must not make us hand out the
/// file that got its number next.
#[test]
fn our_fd_closed_by_the_program_is_not_used_again() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    register(&mut r, &t, &mut rm, VA, MB2, 0xa);
    let ours = *rm.open.keys().next().unwrap();
    rm.open.insert(ours, 999); // the number now names another file
    let e = register(&mut r, &t, &mut rm, VA, MB2, 0xb);
    assert!(!e.reused && rm.exports == 2, "{e:?}");
    assert_eq!(rm.open.get(&ours), Some(&999), "the other file's fd is never closed by us");
    assert_eq!(rm.let_go, 1, "our fd of the first buffer is let go, unclosed");
    dereg(&mut r, &mut rm, 0xa, VA);
    dereg(&mut r, &mut rm, 0xb, VA);
    assert_eq!(rm.open.len(), 1, "only the foreign file left: {:?}", rm.open);
    assert_eq!(rm.open.get(&ours), Some(&999));
}

#[test]
fn shadow_mode_keeps_nothing() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(true, Ok(Route::Dmabuf)));
    assert!(matches!(r.before_reg(&t, &mut rm, VA, MB2), Decision::WouldExport { .. }));
    assert_eq!((rm.exports, rm.open.len()), (0, 0));
}

/// What a call came to, taken in later (the registrar's lock was not had in time): until then
/// the buffer stays open for it, and the MR it made is found by its deregistration afterwards;
/// a refused call's outcome gives the hold back. Nothing is kept once all are taken in.
#[test]
fn outcomes_taken_in_late_keep_and_then_give_back_the_buffer() {
    let t = tracker_with(&[(0x10, VA, MB2)]);
    let (mut rm, mut r) = (BufRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    let first = exported(r.before_reg(&t, &mut rm, VA, MB2));
    let refused = exported(r.before_reg(&t, &mut rm, VA, MB2));
    assert!(refused.reused && r.live_mrs() == 0, "nothing taken in yet");
    assert_eq!(rm.open.len(), 1, "open for the calls whose outcomes are owed");
    r.take_outcome(&mut rm, Outcome::DmabufUnused(refused));
    assert_eq!(rm.open.len(), 1, "the first call's outcome is still owed");
    r.take_outcome(&mut rm, Outcome::DmabufMr { e: first, mr: 0xa, provider_addr: 0, va: VA });
    assert_eq!((r.live_mrs(), r.dmabuf_bytes().0), (1, MB2));
    let held = r.take_mr(&mut rm, 0xa, VA).expect("the MR taken in late is found");
    r.take_outcome(&mut rm, Outcome::DeregEnd { mr: 0xa, held, deregistered: true });
    assert_eq!(
        (rm.open.len(), r.dmabuf_buffers(), r.live_mrs()),
        (0, (0, 0), 0),
        "closed with the last"
    );
}
