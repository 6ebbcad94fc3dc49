//! Unit and model-based tests of the registrar on the NV503C route, against a fake RM that
//! enforces the 503C rules the registrar depends on.

use super::*;
use crate::abi::dmabuf::ExportToDmabufFd;
use crate::abi::status::{self, Call};
use crate::decode::{Event, P2pCtrl};
use crate::fd::OwnedFd;
use crate::tracker::Tracker;
use crate::vamap::MemRef;
use crate::vamap::Miss;

pub(super) const C: u32 = 0xc1d0_0001;
pub(super) const DEV: u32 = 0x5c00_0002;
pub(super) const SUB: u32 = 0x5c00_0003;
pub(super) const VAS: u32 = 0x5c00_0009;
pub(super) const GPU: [u8; 16] = [9; 16];

/// A fake RM that enforces the 503C rules the registrar depends on.
#[derive(Default)]
pub(super) struct FakeRm {
    pub(super) p2p: Vec<(u32, u32)>, // (subdevice, handle)
    vaspaces: u32,
    pub(super) regs: Vec<VidmemTuple>,
    fail_va_space: bool,
    fail_alloc: Option<u32>,
    frees: u32,
    /// RM's answer to the dma-buf capability question (`None`: the question is a test failure)
    pub(super) dmabuf_capable: Option<bool>,
    pub(super) capability_asked: u32,
}
impl Rm for FakeRm {
    fn alloc_p2p(&mut self, _c: Client, sub: u32) -> Result<u32, u32> {
        if let Some(st) = self.fail_alloc {
            return Err(st);
        }
        if self.p2p.iter().any(|p| p.0 == sub) {
            return Err(status::NV_ERR_STATE_IN_USE);
        }
        self.p2p.push((sub, 0xcaf0_0000));
        Ok(0xcaf0_0000)
    }
    fn register_va_space(&mut self, _c: Client, _p: u32, _v: u32) -> Result<u64, u32> {
        if self.fail_va_space {
            return Err(status::NV_ERR_INVALID_ARGUMENT);
        }
        self.vaspaces += 1;
        Ok(0xfe00)
    }
    fn register_vidmem(&mut self, _c: Client, _p: u32, t: &VidmemTuple) -> Result<(), u32> {
        if self.regs.iter().any(|r| {
            r.mem == t.mem || (t.address < r.address + r.size && r.address < t.address + t.size)
        }) {
            return Err(status::NV_ERR_INSERT_DUPLICATE_NAME);
        }
        self.regs.push(*t);
        Ok(())
    }
    fn unregister_vidmem(&mut self, _c: Client, _p: u32, h: u32) -> Result<(), u32> {
        let n = self.regs.len();
        self.regs.retain(|r| r.mem.memory != h);
        if self.regs.len() == n {
            Err(status::NV_ERR_OBJECT_NOT_FOUND)
        } else {
            Ok(())
        }
    }
    fn free(&mut self, _c: Client, _parent: u32, h: u32) -> Result<(), u32> {
        self.frees += 1;
        self.p2p.retain(|p| p.1 != h);
        Ok(())
    }
    fn gpu_dmabuf_capable(&mut self, _c: Client, _sub: u32) -> Result<bool, u32> {
        self.capability_asked += 1;
        Ok(self.dmabuf_capable.expect("the NV503C route asks no dma-buf question"))
    }
    fn export_dmabuf(
        &mut self,
        _c: Client,
        _d: u32,
        _p: &mut ExportToDmabufFd,
        _into: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32> {
        panic!("the NV503C route exports nothing")
    }
    fn close_fd(&mut self, _fd: OwnedFd) {
        panic!("the NV503C route keeps no fd")
    }
    fn still_ours(&mut self, _fd: &OwnedFd) -> bool {
        panic!("the NV503C route keeps no fd")
    }
}

/// UVM_MAP_EXTERNAL_ALLOCATION of memory `h` of client C at `[base, base+length)` on GPU.
pub(super) fn map_on_gpu(base: u64, length: u64, offset: u64, h: u32) -> Event {
    Event::UvmMapExternal {
        base,
        length,
        offset,
        gpus: smallvec::smallvec![GPU],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: h,
    }
}

pub(super) fn tracker_with(maps: &[(u32, u64, u64)]) -> Tracker {
    let mut t = Tracker::new();
    t.apply(&Event::RootClient { fd: 8, h_client: C });
    t.apply(&Event::Device { h_client: C, h_device: DEV, device_id: 0 });
    t.apply(&Event::Subdevice { h_client: C, h_device: DEV, h_subdevice: SUB, subdevice_id: 0 });
    t.apply(&Event::VaSpace {
        h_client: C,
        h_parent: DEV,
        h_vaspace: VAS,
        class: 0x90f1,
        flags: 0x48,
    });
    t.apply(&Event::UvmRegisterGpuVaSpace {
        uuid: GPU,
        rm_ctrl_fd: 8,
        h_client: C,
        h_vaspace: VAS,
    });
    for &(h, va, len) in maps {
        t.apply(&Event::Memory {
            h_client: C,
            h_parent: DEV,
            h_memory: h,
            class: 0x40,
            size: Some(len),
            attr: 0,
            attr2: 0,
            flags: 0,
        });
        t.apply(&Event::UvmCreateExternalRange { base: va, length: len });
        t.apply(&map_on_gpu(va, len, 0, h));
        // each is an allocation the program made (cuMemAlloc)
        t.map.own(va, len);
    }
    t
}

#[test]
fn registers_the_backing_mapping_once_and_refcounts_mrs() {
    let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    // NCCL-style 4 KiB-rounded MRs inside one 2 MiB chunk
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_1000, 0x1000);
    assert!(matches!(a, Decision::Hit { fresh: true, offset: 0x1000, .. }));
    r.after_reg(&mut rm, &a, 0xa);
    let b = r.before_reg(&t, &mut rm, 0x7f00_0001_0000, 0x2000);
    assert!(matches!(b, Decision::Hit { fresh: false, .. }));
    r.after_reg(&mut rm, &b, 0xb);
    assert_eq!(
        rm.regs,
        vec![VidmemTuple {
            mem: MemRef { client: C, memory: 0x10 },
            address: 0x7f00_0000_0000,
            size: 0x20_0000,
            offset: 0
        }]
    );
    assert_eq!((rm.p2p.len(), rm.vaspaces), (1, 1), "one 503C with exactly one VA space");
    r.after_dereg(&mut rm, 0xa);
    assert_eq!(rm.regs.len(), 1);
    r.after_dereg(&mut rm, 0xb);
    assert!(rm.regs.is_empty());
    assert_eq!((r.counts.registered, r.counts.unregistered, r.counts.rm_errors), (1, 1, 0));
}

#[test]
fn a_failed_verbs_call_drops_its_reference() {
    let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &a, 0);
    assert!(rm.regs.is_empty());
    assert_eq!(r.live_registrations(), 0);
}

#[test]
fn misses_register_nothing() {
    let t =
        tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000), (0x11, 0x7f00_0020_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    assert!(matches!(
        r.before_reg(&t, &mut rm, 0x7f00_001f_f000, 0x2000),
        Decision::Refuse(RegMiss::Lookup(Miss::SpansMemoryObjects { count: 2 }))
    ));
    assert!(matches!(
        r.before_reg(&t, &mut rm, 0x7f00_003f_f000, 0x2000),
        Decision::Refuse(RegMiss::Lookup(Miss::Unmapped { .. }))
    ));
    assert_eq!(r.before_reg(&t, &mut rm, 0x1000, 0x1000), Decision::Host);
    assert!(rm.regs.is_empty() && rm.p2p.is_empty());
    assert_eq!(r.counts.pass0_misses, 2);
}

#[test]
fn unaligned_mapping_is_a_miss_not_a_guess() {
    let mut t = tracker_with(&[]);
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 0x20,
        class: 0x40,
        size: Some(0x10_0000),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&map_on_gpu(0x7f00_0000_1000, 0x8000, 0x1000, 0x20));
    t.map.own(0x7f00_0000_1000, 0x8000);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    assert!(matches!(
        r.before_reg(&t, &mut rm, 0x7f00_0000_1000, 0x1000),
        Decision::Refuse(RegMiss::Unaligned(_))
    ));
    assert!(rm.p2p.is_empty());
}

#[test]
fn refused_va_space_leaves_no_half_made_object() {
    let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    let mut rm = FakeRm { fail_va_space: true, ..Default::default() };
    let mut r = Registrar::new(false);
    let d = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    assert!(matches!(d, Decision::Refuse(RegMiss::Rm { call: Call::RegisterVaSpace, .. })));
    assert!(rm.p2p.is_empty(), "the 503C was freed again");
    assert_eq!((rm.frees, r.counts.rm_errors), (1, 1));
    let mut rm = FakeRm { fail_alloc: Some(status::NV_ERR_NOT_SUPPORTED), ..Default::default() };
    let d = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    let (Decision::Miss(m) | Decision::Refuse(m)) = d else { panic!() };
    // the 503C constructor refuses NOT_SUPPORTED for APM/CC; a P2P patch has nothing to do with it
    assert!(m.to_string().contains("APM"), "{m}");
    assert!(!m.to_string().contains("P2P-patched"), "{m}");
}

#[test]
fn native_registration_means_stand_aside() {
    let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    t.apply(&Event::P2pAlloc { h_client: C, h_parent: SUB, h_object: 0x5c00_000d, flags: 1 });
    t.apply(&Event::P2pControl {
        h_client: C,
        h_object: 0x5c00_000d,
        ctrl: P2pCtrl::RegisterVaSpace { h_vaspace: VAS, token: 0xfe00 },
    });
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    assert_eq!(r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000), Decision::StandAside);
    assert!(rm.p2p.is_empty());
}

#[test]
fn release_before_free_and_the_same_memory_at_a_new_va() {
    let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &a, 0xa);
    // VMM unmap of the VA while the MR is live: unregistered first
    let (gone, in_use) =
        r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: 0x7f00_0000_0000 });
    assert_eq!(
        in_use.len(),
        1,
        "the live MR is named: the NIC keeps the old memory until its dereg"
    );
    assert_eq!(gone.len(), 1);
    assert!(rm.regs.is_empty());
    t.apply(&Event::UvmFree { base: 0x7f00_0000_0000, length: Some(0x20_0000) });
    t.apply(&map_on_gpu(0x7f00_1000_0000, 0x20_0000, 0, 0x10));
    t.map.own(0x7f00_1000_0000, 0x20_0000);
    let b = r.before_reg(&t, &mut rm, 0x7f00_1000_0000, 0x1000);
    assert!(matches!(b, Decision::Hit { fresh: true, .. }));
    r.after_reg(&mut rm, &b, 0xb);
    // the old MR's dereg is a no-op now; the new one's unregisters
    r.after_dereg(&mut rm, 0xa);
    assert_eq!(rm.regs.len(), 1);
    r.after_dereg(&mut rm, 0xb);
    assert!(rm.regs.is_empty());
    assert_eq!(r.counts.rm_errors, 0);
}

#[test]
fn a_remap_to_other_memory_unregisters_first_an_identical_one_does_not() {
    let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x40_0000)]);
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 0x11,
        class: 0x40,
        size: Some(0x40_0000),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &a, 0xa);
    // cuMemSetAccess maps the first half again, same memory, same offsets: kept
    let same = Pending::UvmMap {
        base: 0x7f00_0000_0000,
        length: 0x20_0000,
        offset: 0,
        h_client: C,
        h_memory: 0x10,
    };
    assert!(r.before_driver_call(&t, &mut rm, same).0.is_empty());
    // the second half now at another offset of the same memory: the registration would lie
    let shifted = Pending::UvmMap {
        base: 0x7f00_0020_0000,
        length: 0x10_0000,
        offset: 0,
        h_client: C,
        h_memory: 0x10,
    };
    assert_eq!(r.before_driver_call(&t, &mut rm, shifted).0.len(), 1);
    assert!(rm.regs.is_empty());
    r.after_dereg(&mut rm, 0xa);
    let b = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &b, 0xb);
    // other memory over part of it: unregistered before UVM replaces it
    let other = Pending::UvmMap {
        base: 0x7f00_0030_0000,
        length: 0x1_0000,
        offset: 0,
        h_client: C,
        h_memory: 0x11,
    };
    assert_eq!(r.before_driver_call(&t, &mut rm, other).0.len(), 1);
    t.apply(&map_on_gpu(0x7f00_0030_0000, 0x1_0000, 0, 0x11));
    // and the mapping it cut is no longer registrable as a whole
    let c = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    assert!(matches!(c, Decision::Refuse(RegMiss::MappingNotWhole { .. })), "{c:?}");
    assert!(c_miss_text(&c).contains("no longer whole"));
    assert!(rm.regs.is_empty());
}

fn c_miss_text(d: &Decision) -> String {
    match d {
        Decision::Miss(m) | Decision::Refuse(m) => m.to_string(),
        _ => String::new(),
    }
}

#[test]
fn a_freed_device_with_nothing_registered_takes_our_503c_with_it() {
    let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &a, 0xa);
    r.after_dereg(&mut rm, 0xa);
    assert_eq!((r.live_registrations(), r.p2p_objects()), (0, 1));
    r.forget_freed(C, 0x5c00_0077); // some other object: nothing
    assert_eq!(r.p2p_objects(), 1);
    r.forget_freed(C, VAS);
    assert_eq!(r.p2p_objects(), 0, "RM freed our 503C with the VA space");
}

#[test]
fn freeing_the_va_space_or_device_takes_our_503c_down_first() {
    let t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    for h in [VAS, SUB, DEV] {
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
        r.after_reg(&mut rm, &a, 0xa);
        assert_eq!(r.p2p_objects(), 1);
        let (gone, _) =
            r.before_driver_call(&t, &mut rm, Pending::RmFree { h_client: C, h_object: h });
        assert_eq!(gone.len(), 1, "freeing {h:#x}");
        assert!(
            rm.regs.is_empty() && rm.p2p.is_empty(),
            "freeing {h:#x}: our 503C and its registration are gone"
        );
        assert_eq!(r.p2p_objects(), 0);
        assert_eq!(r.counts.rm_errors, 0);
    }
}

#[test]
fn tables_sized_for_a_peak_shrink_when_it_has_passed() {
    let mut m: HashMap<u64, u64> = HashMap::default();
    for i in 0..100_000 {
        m.insert(i, i);
    }
    let peak = m.capacity();
    for i in 0..100_000 {
        m.remove(&i);
        super::shrink_when_sparse(&mut m);
        assert!(m.capacity() <= peak);
    }
    assert!(m.capacity() <= 2048, "capacity {} after the peak of {peak}", m.capacity());
    // small tables are left alone
    let mut small: HashMap<u64, u64> = (0..500).map(|i| (i, i)).collect();
    let cap = small.capacity();
    small.retain(|k, _| *k == 0);
    super::shrink_when_sparse(&mut small);
    assert_eq!(small.capacity(), cap);
}

#[test]
fn a_release_of_any_granule_of_a_registration_takes_it_down() {
    // A 6 MiB mapping, 1 MiB into a 2 MiB granule: it touches granules 0..=3 of its region. A
    // release of its first 4 KiB, of its last 4 KiB, or of VA just past it finds exactly what it
    // touches (the granule index answers "nothing" only where nothing is registered).
    const BASE: u64 = 0x7f00_0010_0000;
    const LEN: u64 = 0x60_0000;
    for (at, len, hits) in [
        (BASE, 0x1000, true),
        (BASE + LEN - 0x1000, 0x1000, true),
        (BASE + LEN, 0x20_0000, false),
        (BASE - 0x1000, 0x1000, false),
    ] {
        let t = tracker_with(&[(0x10, BASE, LEN)]);
        let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
        let a = r.before_reg(&t, &mut rm, BASE + 0x1000, 0x1000);
        assert!(matches!(a, Decision::Hit { fresh: true, .. }), "{a:?}");
        let (gone, _) =
            r.before_driver_call(&t, &mut rm, Pending::UvmUnmap { base: at, length: len });
        assert_eq!(gone.len(), usize::from(hits), "release {at:#x}+{len:#x}");
        assert_eq!(rm.regs.is_empty(), hits, "release {at:#x}+{len:#x}");
    }
}

#[test]
fn a_registration_too_wide_to_count_is_still_found_by_a_release() {
    // 1 TiB (2^19 granules, beyond the per-granule count): a release of its last 4 KiB asks the
    // tree and takes it down.
    const BASE: u64 = 0x7000_0000_0000;
    const LEN: u64 = 1 << 40;
    let t = tracker_with(&[(0x10, BASE, LEN)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, BASE, 0x1000);
    assert!(matches!(a, Decision::Hit { fresh: true, .. }), "{a:?}");
    let (gone, _) = r.before_driver_call(
        &t,
        &mut rm,
        Pending::UvmUnmap { base: BASE + LEN - 0x1000, length: 0x1000 },
    );
    assert_eq!(gone.len(), 1);
    assert!(rm.regs.is_empty());
}

#[test]
fn a_fresh_release_over_a_registration_left_behind_still_needs_a_decision() {
    use crate::fresh::Fresh;
    let t =
        tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000), (0x11, 0x7f00_0040_0000, 0x20_0000)]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let va = |start: u64, len: u64| Fresh::Va { start, end: start + len };
    let map = |base: u64, length: u64| Pending::UvmMap {
        base,
        length,
        offset: 0,
        h_client: C,
        h_memory: 0x12,
    };
    // nothing registered: nothing to touch
    assert!(!r.may_touch(&map(0x7f00_0000_0000, 0x20_0000), va(0x7f00_0000_0000, 0x20_0000)));
    let a = r.before_reg(&t, &mut rm, 0x7f00_0000_0000, 0x1000);
    r.after_reg(&mut rm, &a, 0xa);
    // Its range freed without a decision (say the locks were not free in time), then a new range
    // over the same VA: the registration is still there, so a map into the new range is decided.
    for (call, fresh) in [
        (map(0x7f00_0000_0000, 0x20_0000), va(0x7f00_0000_0000, 0x20_0000)),
        (map(0x7f00_001f_f000, 0x2000), va(0x7f00_001f_f000, 0x2000)),
        (
            Pending::UvmUnmap { base: 0x7f00_0010_0000, length: 0x1000 },
            va(0x7f00_0010_0000, 0x1000),
        ),
        (Pending::UvmFree { base: 0x7f00_0000_0000 }, va(0x7f00_0000_0000, 0x20_0000)),
    ] {
        assert!(r.may_touch(&call, fresh), "{call:?}");
    }
    // VA beside it, and the other memory's range, touch nothing registered
    assert!(!r.may_touch(&map(0x7f00_0020_0000, 0x20_0000), va(0x7f00_0020_0000, 0x20_0000)));
    assert!(
        !r.may_touch(&Pending::UvmFree { base: 0x7f00_0040_0000 }, va(0x7f00_0040_0000, 0x20_0000))
    );
    // objects: the registered memory's handle, its client, and the parents of our 503C are
    // decided; another memory object is not
    let free = |h_object: u32| Pending::RmFree { h_client: C, h_object };
    for h in [0x10, C, DEV, SUB, VAS] {
        assert!(r.may_touch(&free(h), Fresh::Object), "object {h:#x}");
    }
    assert!(!r.may_touch(&free(0x11), Fresh::Object));
    assert!(
        !r.may_touch(&Pending::RmFree { h_client: C + 1, h_object: 0x10 }, Fresh::Object),
        "another client"
    );
}

/// A registration left behind by a release that got no decision is still taken down at the
/// first release over it, also when its range's base was freed and created again since (with
/// another length): the release of the range there now is checked against all of it.
#[test]
fn a_free_of_a_recreated_base_is_checked_against_the_range_there_now() {
    use crate::fresh::{Fresh, FreshRecord};
    const B: u64 = 0x7f00_0000_0000;
    // R_old = [B, B+64M) with a mapping of 0x10 at B+32M, registered
    let mut t = tracker_with(&[]);
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 0x10,
        class: 0x40,
        size: Some(0x20_0000),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::UvmCreateExternalRange { base: B, length: 0x400_0000 });
    t.apply(&map_on_gpu(B + 0x200_0000, 0x20_0000, 0, 0x10));
    t.map.own(B + 0x200_0000, 0x20_0000);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let a = r.before_reg(&t, &mut rm, B + 0x200_0000, 0x1000);
    assert!(matches!(a, Decision::Hit { fresh: true, .. }), "{a:?}");
    r.after_reg(&mut rm, &a, 0xa);
    // (the registration forgot the record) R_old freed with no decision (locks not free in time)
    let mut record = FreshRecord::default();
    t.apply(&Event::UvmFree { base: B, length: None });
    // R1 = [B, B+2M) created and freed, R2 = [B, B+64M) created at the same base
    for ev in [
        Event::UvmCreateExternalRange { base: B, length: 0x20_0000 },
        Event::UvmFree { base: B, length: None },
        Event::UvmCreateExternalRange { base: B, length: 0x400_0000 },
    ] {
        record.record(&ev);
        t.apply(&ev);
    }
    let call = Pending::UvmFree { base: B };
    let fresh = record.fresh(&call);
    assert_eq!(
        fresh,
        Some(Fresh::Va { start: B, end: B + 0x400_0000 }),
        "the range there now, not the one freed before"
    );
    assert_eq!(t.uvm_free_extent(B, None), 0x400_0000, "what the decision would take down");
    assert!(
        r.may_touch(&call, fresh.unwrap()),
        "the release gets its decision: a registration lies in the range"
    );
    assert_eq!(rm.regs.len(), 1);
}
