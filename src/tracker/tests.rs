//! The tracker against sequences of events as libcuda issues them.

use super::*;
use crate::vamap::{ContextTag, Miss};

pub(crate) const C: u32 = 0xc1d0_0022;
pub(crate) const DEV: u32 = 0x5c00_0002;
const G: Uuid = [3; 16];

pub(crate) fn base_tracker() -> Tracker {
    let mut t = Tracker::new();
    for e in [
        Event::RootClient { fd: 8, h_client: C },
        Event::Device { h_client: C, h_device: DEV, device_id: 0 },
        Event::Subdevice { h_client: C, h_device: DEV, h_subdevice: 0x5c00_0003, subdevice_id: 0 },
    ] {
        t.apply(&e);
    }
    t
}

pub(crate) fn alloc(t: &mut Tracker, h: u32, va: u64, len: u64, native: bool) {
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
    if native {
        t.apply(&Event::P2pControl {
            h_client: C,
            h_object: 0x5c00_000d,
            ctrl: P2pCtrl::RegisterVidmem { h_memory: h, address: va, size: len, offset: 0 },
        });
    }
    t.apply(&Event::UvmCreateExternalRange { base: va, length: len });
    t.apply(&Event::UvmMapExternal {
        base: va,
        length: len,
        offset: 0,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: h,
    });
}

#[test]
fn shadow_matches_native_sequence() {
    let mut t = base_tracker();
    alloc(&mut t, 0x5c00_0096, 0x7f43_5200_0000, 64 << 20, true);
    alloc(&mut t, 0x5c00_009a, 0x7f43_6fe0_0000, 2 << 20, true);
    assert_eq!(t.memory_device(MemRef { client: C, memory: 0x5c00_0096 }), Some((DEV, 0)));
    assert!(
        matches!(t.user_allocation(0x7f43_5200_0000, 64 << 20), Verdict::Covered(v) if v[0].1 == NativeAnswer::Matched)
    );
    // Two sub-allocations of one 2 MiB chunk match one native registration once.
    t.user_allocation(0x7f43_6fe0_0000, 4096);
    t.user_allocation(0x7f43_6fe0_1000, 4096);
    assert_eq!(
        t.counts,
        ShadowCounts { native: 2, matched: 2, user_allocs: 3, ..Default::default() }
    );
    // cuMemFree: UNREGISTER_VIDMEM, UVM_FREE, RM_FREE.
    t.apply(&Event::P2pControl {
        h_client: C,
        h_object: 0x5c00_000d,
        ctrl: P2pCtrl::UnregisterVidmem { h_memory: 0x5c00_0096 },
    });
    t.apply(&Event::UvmFree { base: 0x7f43_5200_0000, length: Some(64 << 20) });
    t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: 0x5c00_0096 });
    assert_eq!(
        t.user_allocation(0x7f43_5200_0000, 4096),
        Verdict::Uncovered(Miss::Freed { at: 0x7f43_5200_0000 })
    );
    assert_eq!(t.counts.unpredicted, 0);
}

#[test]
fn mismatch_and_unpredicted_are_counted() {
    let mut t = base_tracker();
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 1,
        class: 0x40,
        size: Some(0x40_0000),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::P2pControl {
        h_client: C,
        h_object: 9,
        ctrl: P2pCtrl::RegisterVidmem {
            h_memory: 1,
            address: 0x1000_0000,
            size: 0x40_0000,
            offset: 0,
        },
    });
    // libcuda maps it elsewhere than it registered: our prediction differs.
    t.apply(&Event::UvmMapExternal {
        base: 0x2000_0000,
        length: 0x40_0000,
        offset: 0,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 1,
    });
    let v = t.user_allocation(0x2000_0000, 0x1000);
    assert!(matches!(v, Verdict::Covered(ref p) if matches!(p[0].1, NativeAnswer::Mismatched(_))));
    assert_eq!(t.counts.mismatched, 1);
    // a native registration nobody predicted
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 2,
        class: 0x40,
        size: Some(0x20_0000),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::P2pControl {
        h_client: C,
        h_object: 9,
        ctrl: P2pCtrl::RegisterVidmem {
            h_memory: 2,
            address: 0x3000_0000,
            size: 0x20_0000,
            offset: 0,
        },
    });
    let notes = t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: 2 });
    assert!(matches!(notes[..], [Notice::Unpredicted(_)]));
    // memory 1 was never matched either: at exit it counts as unpredicted.
    assert_eq!(t.finish().len(), 1);
    assert_eq!(t.counts.unpredicted, 2);
}

#[test]
fn freeing_the_device_or_client_drops_memory_and_mappings() {
    let mut t = base_tracker();
    alloc(&mut t, 0x10, 0x100_0000, 0x20_0000, false);
    assert!(t.map.lookup_single(0x100_0000, 0x1000).is_ok());
    t.apply(&Event::Free { h_client: C, h_parent: C, h_object: DEV });
    assert!(t.object(C, 0x10).is_none());
    assert!(t.map.lookup(0x100_0000, 0x1000).is_err());
    alloc(&mut t, 0x11, 0x200_0000, 0x20_0000, false);
    t.apply(&Event::Free { h_client: C, h_parent: C, h_object: C });
    assert_eq!(t.objects(), 0);
    assert_eq!(t.map.entries(), 0);
}

#[test]
fn uvm_free_of_unknown_range_drops_what_continues_from_base() {
    let mut t = base_tracker();
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: 1,
        class: 0x40,
        size: None,
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::UvmMapExternal {
        base: 0x1000_0000,
        length: 0x20_0000,
        offset: 0,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 1,
    });
    t.apply(&Event::UvmMapExternal {
        base: 0x1020_0000,
        length: 0x20_0000,
        offset: 0x20_0000,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 1,
    });
    t.apply(&Event::UvmMapExternal {
        base: 0x2000_0000,
        length: 0x20_0000,
        offset: 0,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 1,
    });
    let n = t.apply(&Event::UvmFree { base: 0x1000_0000, length: None });
    assert_eq!(n, vec![Notice::UnknownUvmFree { base: 0x1000_0000 }]);
    assert!(t.map.lookup(0x1030_0000, 0x1000).is_err());
    assert!(t.map.lookup(0x2000_0000, 0x1000).is_ok());
}

#[test]
fn memory_mapped_before_we_saw_it_loses_its_mappings_when_freed() {
    let mut t = base_tracker();
    // mapped, its allocation unseen (the shim came in late)
    t.apply(&Event::UvmMapExternal {
        base: 0x3000_0000,
        length: 0x20_0000,
        offset: 0,
        gpus: smallvec::smallvec![G],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 0x77,
    });
    assert!(t.map.lookup(0x3000_0000, 0x1000).is_ok());
    assert_eq!(t.object(C, 0x77), None);
    t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: 0x77 });
    assert_eq!(t.map.lookup(0x3000_0000, 0x1000), Err(Miss::Freed { at: 0x3000_0000 }));
    // a device's free takes the memory under it, from the map's table
    alloc(&mut t, 0x78, 0x4000_0000, 0x20_0000, false);
    assert_eq!(t.object(C, 0x78).map(|o| o.parent), Some(DEV));
    t.apply(&Event::Free { h_client: C, h_parent: C, h_object: DEV });
    assert_eq!(t.object(C, 0x78), None);
    assert!(t.map.lookup(0x4000_0000, 0x1000).is_err());
    assert_eq!(t.objects(), 1, "the client is all that is left");
}

#[test]
fn dup_keeps_the_root_memory() {
    let mut t = base_tracker();
    alloc(&mut t, 0x10, 0x100_0000, 0x20_0000, false);
    t.apply(&Event::RootClient { fd: 20, h_client: 0xc1d0_0099 });
    t.apply(&Event::Device { h_client: 0xc1d0_0099, h_device: 1, device_id: 0 });
    t.apply(&Event::Dup {
        h_client: 0xc1d0_0099,
        h_parent: 1,
        h_object: 2,
        h_client_src: C,
        h_object_src: 0x10,
    });
    assert!(matches!(t.object(0xc1d0_0099, 2).unwrap().kind, ObjKind::Memory { .. }));
    assert_eq!(
        t.dup_root(MemRef { client: 0xc1d0_0099, memory: 2 }),
        Some(MemRef { client: C, memory: 0x10 })
    );
    t.apply(&Event::Free { h_client: 0xc1d0_0099, h_parent: 1, h_object: 2 });
    assert_eq!(t.dup_root(MemRef { client: 0xc1d0_0099, memory: 2 }), None);
    assert_eq!(t.client_fd(0xc1d0_0099), Some(20));
}

/// The end of a device's primary context ends the allocations made in it, learned from the
/// program's retain, and those of a context no hook saw made; another device's primary context
/// (its allocation peer-mapped on this GPU) and a context the program created live on, until
/// their own end.
#[test]
fn a_context_end_ends_the_allocations_of_the_contexts_it_ends() {
    const H: Uuid = [4; 16];
    const M: u64 = 1 << 20;
    let mut t = base_tracker();
    let (p0, p1, made, unseen) = (0xc0, 0xc1, 0xc102, 0xd00);
    t.context_made(p0, Some(0));
    t.context_made(p1, Some(1));
    t.context_made(made, None);
    for (i, ctx) in [p0, p1, made, unseen].into_iter().enumerate() {
        let (va, mem) = (i as u64 * 4 * M, MemRef { client: C, memory: 0x100 + i as u32 });
        t.map.map(G, va, 2 * M, mem, 0);
        t.map.map(H, va, 2 * M, mem, 0);
        t.map.own_in(va, 0x1000, ContextTag::Of(ctx));
    }
    let lives = |t: &Tracker, i: u64| t.map.first_unowned(i * 4 * M, i * 4 * M + 0x1000).is_none();
    t.context_ended(ContextEnd::Primary { dev: 0, gpu: Some(G) });
    assert!(!lives(&t, 0), "device 0's primary context's");
    assert!(lives(&t, 1), "device 1's, mapped on device 0's GPU too");
    assert!(lives(&t, 2), "a context the program created");
    assert!(!lives(&t, 3), "a context of unknown kind may have been device 0's primary");
    t.context_ended(ContextEnd::Destroyed { ctx: 0xdead });
    assert!(lives(&t, 1) && lives(&t, 2), "a destroy of another context");
    t.context_ended(ContextEnd::Destroyed { ctx: made });
    assert!(!lives(&t, 2) && lives(&t, 1));
    t.context_ended(ContextEnd::Primary { dev: 1, gpu: Some(H) });
    assert!(!lives(&t, 1));
}
