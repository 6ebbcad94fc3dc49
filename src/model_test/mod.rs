//! Model-based test of the whole pure core (tracker, registrar, the pre-call release rules of
//! [`Pending`]) with two RM clients and two GPUs, against a fake RM that enforces the real RM's
//! third-party P2P rules (nvidia-abi.md S3) and answers `nvidia_p2p_get_pages` the way
//! nvidia-peermem asks it (by pid: every 503C of the process, every registered range).
//!
//! Random operations: vidmem and sysmem allocations on either device of either client, UVM maps
//! of any sub-range of them on one or both GPUs that overlap and replace each other (remaps,
//! cuMemSetAccess-style identical re-maps), per-GPU unmaps, UVM frees of whole ranges, RM frees of
//! memory, devices and whole clients in any order, verbs registrations of random ranges, and
//! deregistrations. After every step every registration RM holds describes, page by page, exactly
//! the memory the model has at that address on every GPU that maps it; every hit resolves, through
//! the peermem lookup, to the memory the model has there. `GDRSHIM_MODEL_OPS` sets the number of
//! operations (default 1 000 000).

use crate::abi::dmabuf::ExportToDmabufFd;
use crate::abi::{class, status};
use crate::decode::{Event, Pending};
use crate::registrar::{Client as RmClient, Decision, RegMiss, Rm};
use crate::route::Route;
use crate::state::Work;
use crate::tracker::{ContextEnd, VidmemTuple};
use crate::vamap::{ContextTag, MemRef};
use std::collections::HashMap;

mod strict_rm;
mod world;
use strict_rm::FakeMem;
use world::{down, up, Model, World, BASE, GPUS, NPAGES, PAGE, RANGE, RANGES};

#[test]
fn model_two_clients_two_gpus_overlapping_maps() {
    run_model(Route::Nv503c);
}

/// The same walk on the DMA-BUF route: every export is, 4 KiB page by page, the memory the
/// process has at those addresses, on the right GPU, and RM never refuses one.
#[test]
fn model_two_clients_two_gpus_dmabuf_exports() {
    run_model(Route::Dmabuf);
}

fn run_model(route: Route) {
    let ops = crate::testkit::model_ops(1_000_000);
    let mut rng = crate::testkit::Rng(0x9e37_79b9_7f4a_7c15);
    let mut rnd = move |n: u64| rng.below(n);
    let mut w = World::new(route);
    let mut mrs: Vec<u64> = Vec::new();
    let mut next_mr = 1u64;
    let mut n: HashMap<&'static str, u64> = HashMap::new();
    let mut count = |k: &'static str| *n.entry(k).or_default() += 1;
    for step in 0..ops {
        match rnd(1000) {
            0..=79 if w.mems.len() < 40 => {
                let (k, i) = (rnd(2) as usize, rnd(2) as usize);
                let vidmem = rnd(8) != 0;
                let size = (1 + rnd(32)) * PAGE;
                let c = w.clients[k];
                let m = MemRef { client: c.h, memory: w.next_mem };
                w.next_mem += 1;
                let class =
                    if vidmem { class::NV01_MEMORY_LOCAL_USER } else { class::NV01_MEMORY_SYSTEM };
                w.core.tracker.apply(&Event::Memory {
                    h_client: c.h,
                    h_parent: c.devices[i],
                    h_memory: m.memory,
                    class,
                    size: Some(size),
                    attr: 0,
                    attr2: 0,
                    flags: 0,
                });
                w.core.rm.mems.insert(m, FakeMem { device: c.devices[i], vidmem, size });
                w.mems.push((m, i, vidmem, size));
                count("allocs");
            }
            80..=299 if !w.mems.is_empty() => {
                let (m, _, _, size) = w.mems[rnd(w.mems.len() as u64) as usize];
                let range = BASE + rnd(RANGES) * RANGE;
                let base = range + rnd(RANGE / PAGE) * PAGE;
                let offset = rnd(size / PAGE) * PAGE;
                let len =
                    (1 + rnd(((size - offset) / PAGE).min((range + RANGE - base) / PAGE))) * PAGE;
                let gpus: Vec<usize> = match rnd(4) {
                    0 => vec![0, 1],
                    1 | 2 => vec![0],
                    _ => vec![1],
                };
                w.driver(Pending::UvmMap {
                    base,
                    length: len,
                    offset,
                    h_client: m.client,
                    h_memory: m.memory,
                });
                w.core.tracker.apply(&Event::UvmMapExternal {
                    base,
                    length: len,
                    offset,
                    gpus: gpus.iter().map(|&g| GPUS[g]).collect(),
                    rm_ctrl_fd: 10,
                    h_client: m.client,
                    h_memory: m.memory,
                });
                for &g in &gpus {
                    w.model.set(g, base, len, |p| Some((m, offset + p)));
                }
                // most mappings are an allocation of the program's; some are CUDA's own memory
                // (made in one of the program's contexts, or VMM or pool memory of none)
                if rnd(8) != 0 {
                    let tag = match rnd(4) as usize {
                        3 => ContextTag::NoContext,
                        i => ContextTag::Of(w.contexts[i]),
                    };
                    w.core.tracker.map.own_in(base, len, tag);
                    w.model.own(base, len, true);
                    w.model.made_in(base, len, tag);
                }
                count("maps");
            }
            300..=329 => {
                // the same mapping again (cuMemSetAccess), or a part of it
                let g = rnd(2) as usize;
                let va = BASE + rnd(NPAGES as u64) * PAGE;
                if let Some((m, off)) = w.model.pages[g][Model::page(va)] {
                    let len = PAGE * (1 + rnd(4)).min((BASE + RANGE * RANGES - va) / PAGE);
                    if (0..len)
                        .step_by(PAGE as usize)
                        .all(|p| w.model.pages[g][Model::page(va + p)] == Some((m, off + p)))
                    {
                        w.driver(Pending::UvmMap {
                            base: va,
                            length: len,
                            offset: off,
                            h_client: m.client,
                            h_memory: m.memory,
                        });
                        w.core.tracker.apply(&Event::UvmMapExternal {
                            base: va,
                            length: len,
                            offset: off,
                            gpus: smallvec::smallvec![GPUS[g]],
                            rm_ctrl_fd: 10,
                            h_client: m.client,
                            h_memory: m.memory,
                        });
                        count("same_remaps");
                    }
                }
            }
            330..=389 => {
                let g = rnd(2) as usize;
                let range = BASE + rnd(RANGES) * RANGE;
                let base = range + rnd(RANGE / PAGE) * PAGE;
                let len = (1 + rnd((range + RANGE - base) / PAGE)) * PAGE;
                w.driver(Pending::UvmUnmap { base, length: len });
                w.core.tracker.apply(&Event::UvmUnmapExternal { base, length: len, gpu: GPUS[g] });
                w.model.set(g, base, len, |_| None);
                // VA that no GPU maps any more is the program's no longer (`Tracker::apply`)
                if (base..base + len).step_by(PAGE as usize).all(|p| w.model.at(p) == Ok(None)) {
                    w.model.own(base, len, false);
                }
                count("unmaps");
            }
            390..=419 => {
                let base = BASE + rnd(RANGES) * RANGE;
                w.driver(Pending::UvmFree { base });
                w.core.tracker.apply(&Event::UvmFree { base, length: Some(RANGE) });
                for g in 0..2 {
                    w.model.set(g, base, RANGE, |_| None);
                }
                w.model.own(base, RANGE, false);
                w.core.tracker.apply(&Event::UvmCreateExternalRange { base, length: RANGE });
                count("uvm_frees");
            }
            420..=449 if !w.mems.is_empty() => {
                let (m, _, _, _) = w.mems.swap_remove(rnd(w.mems.len() as u64) as usize);
                let parent =
                    w.clients.iter().find(|c| c.h == m.client).map(|c| c.devices[0]).unwrap_or(0);
                w.driver(Pending::RmFree { h_client: m.client, h_object: m.memory });
                w.core.rm.free_mem(m);
                // the free as the process applies it (the registrar forgets what RM freed with it)
                w.core.apply(
                    &[Work::Event(Event::Free {
                        h_client: m.client,
                        h_parent: parent,
                        h_object: m.memory,
                    })],
                    &mut |_| {},
                );
                // UVM keeps its own reference, but the handle is gone: nothing there may be registered
                w.model.forget(|x| x == m);
                count("mem_frees");
            }
            450 if rnd(2) == 0 => {
                // the program unmaps a range of its own VA (cuMemUnmap) whatever is there
                let base = BASE + rnd(NPAGES as u64) * PAGE;
                let len = PAGE * (1 + rnd(8)).min((BASE + RANGE * RANGES - base) / PAGE);
                w.core.tracker.map.disown(base, base + len);
                w.model.own(base, len, false);
                count("program_unmaps");
            }
            450..=451 => {
                // a device goes (its memory, subdevice, VA space and our 503C with it), then comes back
                let (k, i) = (rnd(2) as usize, rnd(2) as usize);
                let c = w.clients[k];
                w.driver(Pending::RmFree { h_client: c.h, h_object: c.devices[i] });
                w.core.rm.free_device(c.h, c.devices[i]);
                w.core.apply(
                    &[Work::Event(Event::Free {
                        h_client: c.h,
                        h_parent: c.h,
                        h_object: c.devices[i],
                    })],
                    &mut |_| {},
                );
                let gone: Vec<MemRef> =
                    w.mems.iter().filter(|x| x.0.client == c.h && x.1 == i).map(|x| x.0).collect();
                w.mems.retain(|x| !(x.0.client == c.h && x.1 == i));
                w.model.forget(|x| gone.contains(&x));
                w.setup_device(k, i);
                count("device_frees");
            }
            452 => {
                // a whole client goes, then a new one with the same handles
                let k = rnd(2) as usize;
                let c = w.clients[k];
                w.driver(Pending::RmFree { h_client: c.h, h_object: c.h });
                w.core.rm.free_client(c.h);
                w.core.apply(
                    &[Work::Event(Event::Free { h_client: c.h, h_parent: c.h, h_object: c.h })],
                    &mut |_| {},
                );
                w.mems.retain(|x| x.0.client != c.h);
                w.model.forget(|x| x.client == c.h);
                w.setup_client(k);
                count("client_frees");
            }
            453 => {
                // a context ends (the library's destroyed, then another created; a GPU's primary
                // context reset, then retained again): CUDA freed what was made in it
                let i = rnd(3) as usize;
                let ended = w.contexts[i];
                let end = match i {
                    2 => ContextEnd::Destroyed { ctx: ended },
                    _ => ContextEnd::Primary { dev: i as i32, gpu: Some(GPUS[i]) },
                };
                w.core.apply(&[Work::ContextEnded(end)], &mut |_| {});
                w.model.context_ended(ContextTag::Of(ended));
                if i == 2 {
                    w.contexts[2] += 2;
                }
                w.context_made(i);
                count("context_ends");
            }
            454..=749 => {
                // a verbs registration: mostly small, page-aligned or not, sometimes large
                let mut addr = BASE
                    + rnd(RANGE * RANGES / 0x1000) * 0x1000
                    + if rnd(8) == 0 { rnd(0x1000) } else { 0 };
                if rnd(4) != 0 {
                    // mostly where something is mapped: the next mapped page from there
                    let from = Model::page(down(addr));
                    if let Some(i) = (from..NPAGES)
                        .chain(0..from)
                        .find(|&i| w.model.pages[0][i].is_some() || w.model.pages[1][i].is_some())
                    {
                        addr = BASE + i as u64 * PAGE + (addr & (PAGE - 1));
                    }
                }
                let len = if rnd(10) == 0 { 1 + rnd(RANGE) } else { (1 + rnd(32)) * 0x1000 };
                let len = len.min(BASE + RANGE * RANGES - addr);
                let d = w.core.registrar.before_reg(&w.core.tracker, &mut w.core.rm, addr, len);
                match &d {
                    Decision::Hit { mem, .. } => {
                        assert_eq!(route, Route::Nv503c, "step {step}");
                        assert!(w.model.owns(addr, len), "step {step}: MR {addr:#x}+{len:#x} over memory the program did not allocate");
                        // what the NIC gets is what the process sees, for every page of the MR
                        let got = w.core.rm.get_pages(addr, len);
                        let Ok((gm, goff)) = got else {
                            panic!(
                                "step {step}: hit at {addr:#x}+{len:#x} but peermem says {got:?}"
                            )
                        };
                        assert_eq!(gm, *mem, "step {step}");
                        for p in (down(addr)..up(addr + len)).step_by(PAGE as usize) {
                            let want = Some((gm, down(goff) + (p - down(addr))));
                            assert_eq!(
                                w.model.at(p),
                                Ok(want),
                                "step {step}: MR {addr:#x}+{len:#x} page {p:#x}"
                            );
                        }
                        count("hits");
                        let mr = if rnd(10) == 0 { 0 } else { next_mr };
                        next_mr += 1;
                        w.core.registrar.after_reg(&mut w.core.rm, &d, mr);
                        if mr != 0 {
                            mrs.push(mr);
                        }
                    }
                    Decision::Host => {
                        // never GPU memory that the model has mapped as vidmem
                        if let Ok(Some((m, _))) = w.model.at(down(addr)) {
                            assert!(
                                w.mems.iter().any(|x| x.0 == m && !x.2),
                                "step {step}: vidmem at {addr:#x} taken for host memory"
                            );
                        }
                        count("host");
                    }
                    Decision::Exported(e) => {
                        assert!(w.model.owns(addr, len), "step {step}: export {addr:#x}+{len:#x} of memory the program did not allocate");
                        // the buffer, 4 KiB page by page, is what the process has there now
                        let (total, slots) = w
                            .core
                            .rm
                            .exports
                            .get(&e.fd)
                            .cloned()
                            .expect("an fd of ours RM handed out, open while the call uses it");
                        let base = addr & !0xfff;
                        assert_eq!(addr - base, e.offset, "step {step}");
                        assert!(
                            total >= e.offset + len && total - (e.offset + len) < 0x1000,
                            "step {step}: buffer {total:#x} for {addr:#x}+{len:#x}"
                        );
                        let mut at = 0u64;
                        for (m, off, size) in slots.into_iter().map(|s| s.expect("complete")) {
                            for q in (0..size).step_by(0x1000) {
                                let va = base + at + q;
                                let want = w
                                    .model
                                    .at(va & !(PAGE - 1))
                                    .ok()
                                    .flatten()
                                    .map(|(mm, o)| (mm, o + (va & (PAGE - 1))));
                                assert_eq!(
                                    want,
                                    Some((m, off + q)),
                                    "step {step}: export of {addr:#x}+{len:#x} at {va:#x}"
                                );
                            }
                            at += size;
                        }
                        assert_eq!(at, total, "step {step}");
                        count("exports");
                        let mr = next_mr;
                        next_mr += 1;
                        w.core.registrar.after_dmabuf_reg(&mut w.core.rm, mr, e, 0, addr);
                        mrs.push(mr);
                    }
                    Decision::StandAside | Decision::WouldExport { .. } | Decision::Odp => {
                        panic!("step {step}: {d:?}")
                    }
                    Decision::Miss(m) | Decision::Refuse(m) => {
                        count(match m {
                            RegMiss::Lookup(_) => "miss_lookup",
                            RegMiss::MappingNotWhole { .. } => "miss_not_whole",
                            RegMiss::OtherAddress { .. } => "miss_other_address",
                            RegMiss::SpansMappings { .. } => "miss_spans_mapping",
                            RegMiss::NoVaSpace => "miss_no_vaspace",
                            RegMiss::Rm { .. } => "miss_rm",
                            RegMiss::Export(_) => "miss_export",
                            // (the model's `owned` is all the program may reach; gdrshim may
                            // hold less: CUDA's own memory mapped over an allocation takes its
                            // mark, so hits and exports are checked against it, not refusals)
                            RegMiss::NotProgramMemory { at } => {
                                assert!(
                                    *at >= addr && *at < addr + len,
                                    "step {step}: {at:#x} outside {addr:#x}+{len:#x}"
                                );
                                "miss_not_program_memory"
                            }
                            _ => "miss_other",
                        });
                    }
                }
            }
            750..=999 if !mrs.is_empty() => {
                let mr = mrs.swap_remove(rnd(mrs.len() as u64) as usize);
                w.core.registrar.after_dereg(&mut w.core.rm, mr);
                count("deregs");
            }
            _ => {}
        }
        w.check(step);
    }
    for mr in mrs.drain(..) {
        w.core.registrar.after_dereg(&mut w.core.rm, mr);
    }
    assert!(w.core.rm.regs.is_empty(), "left registered: {:?}", w.core.rm.regs);
    assert_eq!(w.core.registrar.live_registrations(), 0);
    assert_eq!(w.core.registrar.counts.registered, w.core.registrar.counts.unregistered);
    // gdrshim never made a call RM refused: every refusal would be a wrong guess about RM's rules
    assert_eq!(
        (w.core.rm.refused, w.core.registrar.counts.rm_errors),
        (0, 0),
        "{:?}",
        w.core.registrar.counts
    );
    let g = |k: &str| n.get(k).copied().unwrap_or(0);
    let mut keys: Vec<_> = n.iter().collect();
    keys.sort();
    eprintln!(
        "model (2 clients, 2 GPUs, {route:?}): {ops} operations, {keys:?}, registered={}",
        w.core.registrar.counts.registered
    );
    assert_eq!(w.core.registrar.dmabuf_mrs(), 0, "every dma-buf MR deregistered");
    assert!(w.core.rm.exports.is_empty(), "every export was taken by an MR");
    if ops >= 100_000 && route == Route::Dmabuf {
        for k in [
            "exports",
            "host",
            "maps",
            "unmaps",
            "uvm_frees",
            "mem_frees",
            "device_frees",
            "client_frees",
            "context_ends",
            "deregs",
            "miss_lookup",
            "miss_not_program_memory",
            "program_unmaps",
        ] {
            assert!(g(k) > 0, "the random walk never reached {k}: {keys:?}");
        }
        assert!(g("exports") > ops / 50, "{keys:?}");
    }
    if ops >= 100_000 && route == Route::Nv503c {
        for k in [
            "hits",
            "host",
            "maps",
            "same_remaps",
            "unmaps",
            "uvm_frees",
            "mem_frees",
            "device_frees",
            "client_frees",
            "context_ends",
            "deregs",
            "miss_lookup",
            "miss_not_whole",
            "miss_no_vaspace",
            "miss_not_program_memory",
            "program_unmaps",
        ] {
            assert!(g(k) > 0, "the random walk never reached {k}: {keys:?}");
        }
        assert!(g("hits") > ops / 50, "{keys:?}");
    }
}
