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
use crate::decode::{Event, Pending, Uuid};
use crate::registrar::{Client as RmClient, Decision, RegMiss, Registrar, Rm};
use crate::route::Route;
use crate::tracker::{Tracker, VidmemTuple};
use crate::vamap::MemRef;
use std::collections::HashMap;

mod strict_rm;
use strict_rm::{FakeMem, StrictRm};

const PAGE: u64 = 0x1_0000;
const RANGE: u64 = 4 << 20;
const RANGES: u64 = 16;
const BASE: u64 = 0x7f00_0000_0000;
const NPAGES: usize = (RANGE * RANGES / PAGE) as usize;
const GPUS: [Uuid; 2] = [[0xa0; 16], [0xb1; 16]];

fn down(x: u64) -> u64 {
    x & !(PAGE - 1)
}
fn up(x: u64) -> u64 {
    (x + PAGE - 1) & !(PAGE - 1)
}

/// One RM client of the process: a device and subdevice per GPU, a VA space per device.
#[derive(Clone, Copy)]
struct Client {
    h: u32,
    devices: [u32; 2],
    subdevices: [u32; 2],
    vaspaces: [u32; 2],
}
impl Client {
    fn new(k: usize) -> Client {
        let h = 0xc1d0_0001 + k as u32;
        let d = |i: u32| 0x5c00_0010 + 0x100 * k as u32 + i;
        Client { h, devices: [d(0), d(1)], subdevices: [d(0x10), d(0x11)], vaspaces: [d(0x20), d(0x21)] }
    }
}

/// What the process really has mapped: per GPU, per 64 KiB page, the memory and its offset.
struct Model {
    pages: [Vec<Option<(MemRef, u64)>>; 2],
    /// Pages in an allocation the program made through CUDA (the rest is CUDA's own memory).
    owned: Vec<bool>,
}
impl Model {
    fn page(va: u64) -> usize {
        ((va - BASE) / PAGE) as usize
    }
    fn set(&mut self, g: usize, base: u64, len: u64, v: impl Fn(u64) -> Option<(MemRef, u64)>) {
        for p in (0..len).step_by(PAGE as usize) {
            self.pages[g][Self::page(base + p)] = v(p);
        }
    }
    /// The memory every mapping GPU sees at page `va`, if they all agree and at least one maps it.
    fn at(&self, va: u64) -> Result<Option<(MemRef, u64)>, ()> {
        let i = Self::page(va);
        match (self.pages[0][i], self.pages[1][i]) {
            (Some(a), Some(b)) if a != b => Err(()),
            (Some(a), _) | (_, Some(a)) => Ok(Some(a)),
            (None, None) => Ok(None),
        }
    }
    fn own(&mut self, base: u64, len: u64, owned: bool) {
        for p in (0..len).step_by(PAGE as usize) {
            self.owned[Self::page(base + p)] = owned;
        }
    }
    /// Whether every page of `[addr, addr+len)` is the program's own.
    fn owns(&self, addr: u64, len: u64) -> bool {
        (down(addr)..up(addr + len)).step_by(PAGE as usize).all(|p| self.owned[Self::page(p)])
    }
    fn forget(&mut self, gone: impl Fn(MemRef) -> bool) {
        for g in &mut self.pages {
            for p in g.iter_mut() {
                if p.is_some_and(|(m, _)| gone(m)) {
                    *p = None;
                }
            }
        }
    }
}

struct World {
    t: Tracker,
    r: Registrar,
    rm: StrictRm,
    model: Model,
    clients: [Client; 2],
    /// The client whose VA space UVM has for each GPU (one GPU VA space per GPU per process).
    uvm_owner: [usize; 2],
    mems: Vec<(MemRef, usize, bool, u64)>, // (memory, device index, vidmem, size)
    next_mem: u32,
}

impl World {
    fn new(route: Route) -> World {
        let mut w = World {
            t: Tracker::new(),
            r: Registrar::with_route(false, Ok(route)),
            rm: StrictRm::default(),
            model: Model { pages: [vec![None; NPAGES], vec![None; NPAGES]], owned: vec![false; NPAGES] },
            clients: [Client::new(0), Client::new(1)],
            uvm_owner: [0, 1],
            mems: Vec::new(),
            next_mem: 0x100,
        };
        for k in 0..2 {
            w.setup_client(k);
        }
        for r in 0..RANGES {
            w.t.apply(&Event::UvmCreateExternalRange { base: BASE + r * RANGE, length: RANGE });
        }
        w
    }
    fn setup_client(&mut self, k: usize) {
        let c = self.clients[k];
        self.t.apply(&Event::RootClient { fd: 10 + k as i32, h_client: c.h });
        for i in 0..2 {
            self.setup_device(k, i);
        }
    }
    fn setup_device(&mut self, k: usize, i: usize) {
        let c = self.clients[k];
        self.t.apply(&Event::Device { h_client: c.h, h_device: c.devices[i], device_id: i as u32 });
        self.t.apply(&Event::Subdevice { h_client: c.h, h_device: c.devices[i], h_subdevice: c.subdevices[i], subdevice_id: 0 });
        self.t.apply(&Event::VaSpace {
            h_client: c.h,
            h_parent: c.devices[i],
            h_vaspace: c.vaspaces[i],
            class: class::FERMI_VASPACE_A,
            flags: 0x48,
        });
        if self.uvm_owner[i] == k {
            self.t.apply(&Event::UvmRegisterGpuVaSpace {
                uuid: GPUS[i],
                rm_ctrl_fd: 10 + k as i32,
                h_client: c.h,
                h_vaspace: c.vaspaces[i],
            });
        }
        self.rm.subdevices.insert((c.h, c.subdevices[i]), c.devices[i]);
        self.rm.instances.insert((c.h, c.devices[i]), i as u32);
    }

    /// The shim's order (`Shim::before_ioctl`): while registrations are live, those the call
    /// concerns go first; then the driver runs it.
    fn driver(&mut self, call: Pending) {
        if self.r.in_use() {
            self.r.before_driver_call(&self.t, &mut self.rm, call);
        }
    }

    /// Every registration RM holds is, page by page, the memory the model has there.
    fn check(&self, step: u64) {
        for (_, reg) in &self.rm.regs {
            for p in (0..reg.size).step_by(PAGE as usize) {
                let want = Some((reg.mem, reg.offset + p));
                let got = self.model.at(reg.address + p);
                assert_eq!(got, Ok(want), "step {step}: RM holds {reg} but the model has {got:?} at {:#x}", reg.address + p);
            }
        }
        assert_eq!(self.r.live_registrations(), self.rm.regs.len(), "step {step}: the registrar and RM disagree");
        for o in &self.rm.p2p {
            assert!(o.vaspaces.len() <= 1, "step {step}: a 503C with {} VA spaces", o.vaspaces.len());
        }
    }
}

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
                let class = if vidmem { class::NV01_MEMORY_LOCAL_USER } else { class::NV01_MEMORY_SYSTEM };
                w.t.apply(&Event::Memory {
                    h_client: c.h,
                    h_parent: c.devices[i],
                    h_memory: m.memory,
                    class,
                    size: Some(size),
                    attr: 0,
                    attr2: 0,
                    flags: 0,
                });
                w.rm.mems.insert(m, FakeMem { device: c.devices[i], vidmem, size });
                w.mems.push((m, i, vidmem, size));
                count("allocs");
            }
            80..=299 if !w.mems.is_empty() => {
                let (m, _, _, size) = w.mems[rnd(w.mems.len() as u64) as usize];
                let range = BASE + rnd(RANGES) * RANGE;
                let base = range + rnd(RANGE / PAGE) * PAGE;
                let offset = rnd(size / PAGE) * PAGE;
                let len = (1 + rnd(((size - offset) / PAGE).min((range + RANGE - base) / PAGE))) * PAGE;
                let gpus: Vec<usize> = match rnd(4) {
                    0 => vec![0, 1],
                    1 | 2 => vec![0],
                    _ => vec![1],
                };
                w.driver(Pending::UvmMap { base, length: len, offset, h_client: m.client, h_memory: m.memory });
                w.t.apply(&Event::UvmMapExternal {
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
                if rnd(8) != 0 {
                    w.t.map.own(base, len);
                    w.model.own(base, len, true);
                }
                count("maps");
            }
            300..=329 => {
                // the same mapping again (cuMemSetAccess), or a part of it
                let g = rnd(2) as usize;
                let va = BASE + rnd(NPAGES as u64) * PAGE;
                if let Some((m, off)) = w.model.pages[g][Model::page(va)] {
                    let len = PAGE * (1 + rnd(4)).min((BASE + RANGE * RANGES - va) / PAGE);
                    if (0..len).step_by(PAGE as usize).all(|p| w.model.pages[g][Model::page(va + p)] == Some((m, off + p))) {
                        w.driver(Pending::UvmMap { base: va, length: len, offset: off, h_client: m.client, h_memory: m.memory });
                        w.t.apply(&Event::UvmMapExternal {
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
                w.t.apply(&Event::UvmUnmapExternal { base, length: len, gpu: GPUS[g] });
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
                w.t.apply(&Event::UvmFree { base, length: Some(RANGE) });
                for g in 0..2 {
                    w.model.set(g, base, RANGE, |_| None);
                }
                w.model.own(base, RANGE, false);
                w.t.apply(&Event::UvmCreateExternalRange { base, length: RANGE });
                count("uvm_frees");
            }
            420..=449 if !w.mems.is_empty() => {
                let (m, _, _, _) = w.mems.swap_remove(rnd(w.mems.len() as u64) as usize);
                let parent = w.clients.iter().find(|c| c.h == m.client).map(|c| c.devices[0]).unwrap_or(0);
                w.driver(Pending::RmFree { h_client: m.client, h_object: m.memory });
                w.rm.free_mem(m);
                w.r.forget_freed(m.client, m.memory);
                w.t.apply(&Event::Free { h_client: m.client, h_parent: parent, h_object: m.memory });
                // UVM keeps its own reference, but the handle is gone: nothing there may be registered
                w.model.forget(|x| x == m);
                count("mem_frees");
            }
            450 if rnd(2) == 0 => {
                // the program unmaps a range of its own VA (cuMemUnmap) whatever is there
                let base = BASE + rnd(NPAGES as u64) * PAGE;
                let len = PAGE * (1 + rnd(8)).min((BASE + RANGE * RANGES - base) / PAGE);
                w.t.map.disown(base, base + len);
                w.model.own(base, len, false);
                count("program_unmaps");
            }
            450..=451 => {
                // a device goes (its memory, subdevice, VA space and our 503C with it), then comes back
                let (k, i) = (rnd(2) as usize, rnd(2) as usize);
                let c = w.clients[k];
                w.driver(Pending::RmFree { h_client: c.h, h_object: c.devices[i] });
                w.rm.free_device(c.h, c.devices[i]);
                w.r.forget_freed(c.h, c.devices[i]); // as the shim does after every RM free
                w.t.apply(&Event::Free { h_client: c.h, h_parent: c.h, h_object: c.devices[i] });
                let gone: Vec<MemRef> = w.mems.iter().filter(|x| x.0.client == c.h && x.1 == i).map(|x| x.0).collect();
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
                w.rm.free_client(c.h);
                w.t.apply(&Event::Free { h_client: c.h, h_parent: c.h, h_object: c.h });
                w.r.forget_client(c.h);
                w.mems.retain(|x| x.0.client != c.h);
                w.model.forget(|x| x.client == c.h);
                w.setup_client(k);
                count("client_frees");
            }
            453..=749 => {
                // a verbs registration: mostly small, page-aligned or not, sometimes large
                let mut addr = BASE + rnd(RANGE * RANGES / 0x1000) * 0x1000 + if rnd(8) == 0 { rnd(0x1000) } else { 0 };
                if rnd(4) != 0 {
                    // mostly where something is mapped: the next mapped page from there
                    let from = Model::page(down(addr));
                    if let Some(i) = (from..NPAGES).chain(0..from).find(|&i| w.model.pages[0][i].is_some() || w.model.pages[1][i].is_some())
                    {
                        addr = BASE + i as u64 * PAGE + (addr & (PAGE - 1));
                    }
                }
                let len = if rnd(10) == 0 { 1 + rnd(RANGE) } else { (1 + rnd(32)) * 0x1000 };
                let len = len.min(BASE + RANGE * RANGES - addr);
                let d = w.r.before_reg(&w.t, &mut w.rm, addr, len);
                match &d {
                    Decision::Hit { mem, .. } => {
                        assert_eq!(route, Route::Nv503c, "step {step}");
                        assert!(w.model.owns(addr, len), "step {step}: MR {addr:#x}+{len:#x} over memory the program did not allocate");
                        // what the NIC gets is what the process sees, for every page of the MR
                        let got = w.rm.get_pages(addr, len);
                        let Ok((gm, goff)) = got else { panic!("step {step}: hit at {addr:#x}+{len:#x} but peermem says {got:?}") };
                        assert_eq!(gm, *mem, "step {step}");
                        for p in (down(addr)..up(addr + len)).step_by(PAGE as usize) {
                            let want = Some((gm, down(goff) + (p - down(addr))));
                            assert_eq!(w.model.at(p), Ok(want), "step {step}: MR {addr:#x}+{len:#x} page {p:#x}");
                        }
                        count("hits");
                        let mr = if rnd(10) == 0 { 0 } else { next_mr };
                        next_mr += 1;
                        w.r.after_reg(&mut w.rm, &d, mr);
                        if mr != 0 {
                            mrs.push(mr);
                        }
                    }
                    Decision::Host => {
                        // never GPU memory that the model has mapped as vidmem
                        if let Ok(Some((m, _))) = w.model.at(down(addr)) {
                            assert!(w.mems.iter().any(|x| x.0 == m && !x.2), "step {step}: vidmem at {addr:#x} taken for host memory");
                        }
                        count("host");
                    }
                    Decision::Exported(e) => {
                        assert!(w.model.owns(addr, len), "step {step}: export {addr:#x}+{len:#x} of memory the program did not allocate");
                        // the buffer, 4 KiB page by page, is what the process has there now
                        let (total, slots) =
                            w.rm.exports.get(&e.fd).cloned().expect("an fd of ours RM handed out, open while the call uses it");
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
                                let want = w.model.at(va & !(PAGE - 1)).ok().flatten().map(|(mm, o)| (mm, o + (va & (PAGE - 1))));
                                assert_eq!(want, Some((m, off + q)), "step {step}: export of {addr:#x}+{len:#x} at {va:#x}");
                            }
                            at += size;
                        }
                        assert_eq!(at, total, "step {step}");
                        count("exports");
                        let mr = next_mr;
                        next_mr += 1;
                        w.r.after_dmabuf_reg(&mut w.rm, mr, e, 0, addr);
                        mrs.push(mr);
                    }
                    Decision::StandAside | Decision::WouldExport { .. } | Decision::Odp => panic!("step {step}: {d:?}"),
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
                                assert!(*at >= addr && *at < addr + len, "step {step}: {at:#x} outside {addr:#x}+{len:#x}");
                                "miss_not_program_memory"
                            }
                            _ => "miss_other",
                        });
                    }
                }
            }
            750..=999 if !mrs.is_empty() => {
                let mr = mrs.swap_remove(rnd(mrs.len() as u64) as usize);
                w.r.after_dereg(&mut w.rm, mr);
                count("deregs");
            }
            _ => {}
        }
        w.check(step);
    }
    for mr in mrs.drain(..) {
        w.r.after_dereg(&mut w.rm, mr);
    }
    assert!(w.rm.regs.is_empty(), "left registered: {:?}", w.rm.regs);
    assert_eq!(w.r.live_registrations(), 0);
    assert_eq!(w.r.counts.registered, w.r.counts.unregistered);
    // gdrshim never made a call RM refused: every refusal would be a wrong guess about RM's rules
    assert_eq!((w.rm.refused, w.r.counts.rm_errors), (0, 0), "{:?}", w.r.counts);
    let g = |k: &str| n.get(k).copied().unwrap_or(0);
    let mut keys: Vec<_> = n.iter().collect();
    keys.sort();
    eprintln!("model (2 clients, 2 GPUs, {route:?}): {ops} operations, {keys:?}, registered={}", w.r.counts.registered);
    assert_eq!(w.r.dmabuf_mrs(), 0, "every dma-buf MR deregistered");
    assert!(w.rm.exports.is_empty(), "every export was taken by an MR");
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
