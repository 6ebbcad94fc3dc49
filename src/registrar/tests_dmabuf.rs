//! The registrar's tests of the DMA-BUF route and of a map that missed a call (tests.rs holds
//! the rest and the fakes).

use super::tests::{tracker_with, FakeRm, C, DEV, SUB, VAS};
use super::*;
use crate::decode::Event;
use crate::tracker::Tracker;
use crate::vamap::MemRef;

/// A map that missed a call the driver accepted registers and exports nothing, on either route.
#[test]
fn an_incomplete_map_registers_and_exports_nothing() {
    const VA: u64 = 0x7f00_0000_0000;
    let mut t = tracker_with(&[(0x10, VA, 0x20_0000)]);
    t.incomplete = true;
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    assert!(matches!(
        r.before_reg(&t, &mut rm, VA, 0x1000),
        Decision::Refuse(RegMiss::MapIncomplete)
    ));
    assert!(rm.regs.is_empty() && rm.p2p.is_empty(), "no RM call");
    let mut d = Registrar::with_route(false, Ok(Route::Dmabuf));
    assert!(matches!(d.export(&t, &mut rm, VA, 0x1000, 0), Err(RegMiss::MapIncomplete)));
    assert!(matches!(
        d.before_reg(&t, &mut rm, VA, 0x1000),
        Decision::Refuse(RegMiss::MapIncomplete)
    ));
    t.incomplete = false;
    assert!(
        matches!(r.before_reg(&t, &mut rm, VA, 0x1000), Decision::Hit { fresh: true, .. }),
        "the same map, complete"
    );
}

/// A dma-buf MR whose deregistration got past gdrshim leaves its reference under its pointer;
/// when malloc gives the pointer to another MR, the reference is not taken for that one (the
/// hook would write the old MR's address into it) but finished.
#[test]
fn a_stale_dmabuf_reference_is_not_taken_for_another_mr() {
    const VA: u64 = 0x7f00_0000_0000;
    let mut r = Registrar::with_route(false, Ok(Route::Dmabuf));
    let e = Export {
        fd: 5,
        file: None,
        offset: 0,
        pieces: 1,
        bytes: 0x20_0000,
        mems: vec![MemRef { client: C, memory: 0x10 }],
        buf: None,
        reused: false,
    };
    r.after_dmabuf_reg(&mut FakeRm::default(), 0xa, &e, 0, VA);
    r.after_dmabuf_reg(&mut FakeRm::default(), 0xb, &e, 0, VA + 0x1000);
    assert_eq!((r.live_mrs(), r.dmabuf_mrs()), (2, 2));
    assert_eq!(r.take_mr(&mut FakeRm::default(), 0xa, 0x5555_0000), None, "0xa is now a host MR");
    assert_eq!((r.live_mrs(), r.dmabuf_mrs()), (1, 1), "the stale reference is finished");
    assert!(
        matches!(r.take_mr(&mut FakeRm::default(), 0xb, VA + 0x1000), Some(HeldRef::Dmabuf { va, .. }) if va == VA + 0x1000)
    );
}

/// A capability question asked before the device has a subdevice gets no answer from RM: that is
/// not kept, and RM is asked once the subdevice exists (review: the error stayed for good).
#[test]
fn a_capability_question_asked_too_early_is_asked_again() {
    let mut t = Tracker::new();
    t.apply(&Event::RootClient { fd: 8, h_client: C });
    t.apply(&Event::Device { h_client: C, h_device: DEV, device_id: 0 });
    let mut r = Registrar::with_route(false, Ok(Route::Dmabuf));
    let mut rm = FakeRm::default();
    rm.dmabuf_capable = Some(true);
    assert_eq!(r.probe_gpu_dmabuf(&t, &mut rm), None, "no subdevice yet");
    t.apply(&Event::Subdevice { h_client: C, h_device: DEV, h_subdevice: SUB, subdevice_id: 0 });
    assert_eq!(r.probe_gpu_dmabuf(&t, &mut rm), Some(true));
    assert_eq!(r.probe_gpu_dmabuf(&t, &mut rm), Some(true));
    assert_eq!(rm.capability_asked, 1, "RM's answer is kept");
}

/// A free of an object says a dma-buf MR's memory is still in use only when the memory lies under
/// it (review: any object of the client did, an event or a subdevice too).
#[test]
fn only_a_free_over_the_memory_says_a_dmabuf_mr_still_uses_it() {
    let mut t = tracker_with(&[(0x10, 0x7f00_0000_0000, 0x20_0000)]);
    t.apply(&Event::OtherObject { h_client: C, h_parent: DEV, h_object: 0x77, class: 0x79 });
    let mut r = Registrar::with_route(false, Ok(Route::Dmabuf));
    let e = Export {
        fd: 5,
        file: None,
        offset: 0,
        pieces: 1,
        bytes: 0x20_0000,
        mems: vec![MemRef { client: C, memory: 0x10 }],
        buf: None,
        reused: false,
    };
    r.after_dmabuf_reg(&mut FakeRm::default(), 0xa, &e, 0, 0x7f00_0000_0000);
    let mut in_use = |h| {
        r.before_driver_call(
            &t,
            &mut FakeRm::default(),
            Pending::RmFree { h_client: C, h_object: h },
        )
        .1
        .len()
    };
    assert_eq!(
        (in_use(0x77), in_use(SUB), in_use(VAS)),
        (0, 0, 0),
        "an event, the subdevice, the VA space"
    );
    assert_eq!(
        (in_use(0x10), in_use(DEV), in_use(C)),
        (1, 1, 1),
        "the memory, its device, its client"
    );
}
