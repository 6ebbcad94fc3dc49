//! The registrar against a model: random allocations, maps, unmaps, frees and verbs
//! registrations, every registration RM holds checked after every step.

use super::tests::{map_on_gpu, tracker_with, FakeRm, C, DEV};
use super::*;
use crate::decode::Event;

/// Model-based: random allocations, maps (sub-ranges, offsets), unmaps, frees in any order,
/// verbs registrations of random sub-ranges (and of random addresses), deregistrations. After
/// every step every registration the fake RM holds is exactly a live mapping of the model, and
/// every hit names the mapping the model has at that address. `GDRSHIM_MODEL_OPS` sets the
/// number of operations (default 1 000 000).
#[test]
fn model_based_random_operations() {
    let ops = crate::testkit::model_ops(1_000_000);
    let mut rng = crate::testkit::Rng(0x2545_f491_4f6c_dd1d);
    let mut rnd = move |n: u64| rng.below(n);
    const SLOT: u64 = 16 << 20; // one VA slot per mapping, so model mappings never overlap
    const BASE: u64 = 0x7f00_0000_0000;
    let mut t = tracker_with(&[]);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let mut mems: Vec<(u32, u64)> = Vec::new(); // (handle, size)
    let mut next_mem = 0x100u32;
    let mut maps: std::collections::BTreeMap<u64, (u64, u32, u64)> = Default::default(); // slot base -> (len, mem, offset)
    let mut mrs: Vec<(u64, VidmemTuple)> = Vec::new();
    let mut next_mr = 1u64;
    let (mut hits, mut misses, mut frees, mut unmaps) = (0u64, 0u64, 0u64, 0u64);
    for step in 0..ops {
        match rnd(100) {
            0..=9 if mems.len() < 48 => {
                let size = (1 + rnd(128)) << 16;
                t.apply(&Event::Memory {
                    h_client: C,
                    h_parent: DEV,
                    h_memory: next_mem,
                    class: 0x40,
                    size: Some(size),
                    attr: 0,
                    attr2: 0,
                    flags: 0,
                });
                mems.push((next_mem, size));
                next_mem += 1;
            }
            10..=29 if !mems.is_empty() => {
                let slot = BASE + rnd(64) * SLOT;
                if maps.contains_key(&slot) {
                    continue;
                }
                let (h, size) = mems[rnd(mems.len() as u64) as usize];
                let offset = rnd(size >> 16) << 16;
                let len = (1 + rnd((size - offset) >> 16)) << 16;
                t.apply(&Event::UvmCreateExternalRange { base: slot, length: len });
                t.apply(&map_on_gpu(slot, len, offset, h));
                t.map.own(slot, len);
                maps.insert(slot, (len, h, offset));
            }
            30..=37 if !maps.is_empty() => {
                // UVM_FREE of a mapping, as the shim's before_ioctl handles it
                let slot = *maps.keys().nth(rnd(maps.len() as u64) as usize).unwrap();
                r.before_driver_call(&t, &mut rm, Pending::UvmFree { base: slot });
                t.apply(&Event::UvmFree { base: slot, length: None });
                maps.remove(&slot);
                unmaps += 1;
            }
            38..=41 if !mems.is_empty() => {
                // RM_FREE of a memory object, mapped or not
                let (h, _) = mems.swap_remove(rnd(mems.len() as u64) as usize);
                r.before_driver_call(&t, &mut rm, Pending::RmFree { h_client: C, h_object: h });
                t.apply(&Event::Free { h_client: C, h_parent: DEV, h_object: h });
                // RM frees the memory; UVM keeps the VA range (now backed by nothing we may register)
                maps.retain(|_, m| m.1 != h);
                frees += 1;
            }
            42..=79 => {
                // a verbs registration: mostly inside a mapping, sometimes anywhere
                let (addr, len) = match (maps.is_empty(), rnd(5)) {
                    (false, 0..=3) => {
                        let (&slot, &(mlen, _, _)) =
                            maps.iter().nth(rnd(maps.len() as u64) as usize).unwrap();
                        let a = slot + (rnd(mlen >> 12) << 12);
                        (a, (1 + rnd(64)) << 12)
                    }
                    _ => (BASE + rnd(64 * SLOT), 1 + rnd(1 << 22)),
                };
                let d = r.before_reg(&t, &mut rm, addr, len);
                if let Decision::Hit { tuple, .. } = &d {
                    // exactly the model's mapping at that address, and the MR inside it
                    let (&slot, &(mlen, h, off)) =
                        maps.range(..=addr).next_back().expect("a hit lies in a live mapping");
                    assert_eq!(
                        (tuple.address, tuple.size, tuple.mem.memory, tuple.offset),
                        (slot, mlen, h, off),
                        "step {step}: hit at {addr:#x}+{len:#x}"
                    );
                    assert!(
                        addr >= slot
                            && addr + len <= slot + mlen.div_ceil(0x10000) * 0x10000 + 0x10000,
                        "step {step}"
                    );
                    hits += 1;
                    let mr = if rnd(10) == 0 { 0 } else { next_mr };
                    next_mr += 1;
                    r.after_reg(&mut rm, &d, mr);
                    if mr != 0 {
                        mrs.push((mr, *tuple));
                    }
                } else {
                    misses += 1;
                }
            }
            80..=99 if !mrs.is_empty() => {
                let (mr, _) = mrs.swap_remove(rnd(mrs.len() as u64) as usize);
                r.after_dereg(&mut rm, mr);
            }
            _ => {}
        }
        // every registration RM holds is a live mapping of the model, exactly
        for reg in &rm.regs {
            let m = maps.get(&reg.address);
            assert_eq!(
                m.map(|&(l, h, o)| (l, h, o)),
                Some((reg.size, reg.mem.memory, reg.offset)),
                "step {step}: RM holds {reg} but the model has {m:?} there"
            );
        }
        assert!(rm.regs.len() <= maps.len());
    }
    // drop every MR: nothing stays registered
    for (mr, _) in mrs.drain(..) {
        r.after_dereg(&mut rm, mr);
    }
    assert!(rm.regs.is_empty(), "{:?}", rm.regs);
    assert_eq!(r.live_registrations(), 0);
    assert_eq!(r.counts.registered, r.counts.unregistered);
    assert!(
        hits > ops / 10 && misses > 0 && frees > 0 && unmaps > 0,
        "hits={hits} misses={misses} frees={frees} unmaps={unmaps}"
    );
    eprintln!(
        "model: {ops} operations, {hits} hits, {misses} misses, {unmaps} unmaps, {frees} frees, {} registered, rm_errors={}",
        r.counts.registered, r.counts.rm_errors
    );
}
