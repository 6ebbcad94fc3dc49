//! The world of the model test: what the process really has mapped (the model, page by page)
//! beside the pure core on the strict fake RM, and the check that every registration RM holds
//! is that memory.

use super::strict_rm::StrictRm;
use crate::abi::class;
use crate::decode::Uuid;
use crate::decode::{Event, Pending};
use crate::registrar::Registrar;
use crate::route::Route;
use crate::state::{Core, Work};
use crate::tracker::Tracker;
use crate::vamap::{ContextTag, MemRef};

pub(super) const PAGE: u64 = 0x1_0000;
pub(super) const RANGE: u64 = 4 << 20;
pub(super) const RANGES: u64 = 16;
pub(super) const BASE: u64 = 0x7f00_0000_0000;
pub(super) const NPAGES: usize = (RANGE * RANGES / PAGE) as usize;
pub(super) const GPUS: [Uuid; 2] = [[0xa0; 16], [0xb1; 16]];

pub(super) fn down(x: u64) -> u64 {
    x & !(PAGE - 1)
}
pub(super) fn up(x: u64) -> u64 {
    (x + PAGE - 1) & !(PAGE - 1)
}

/// One RM client of the process: a device and subdevice per GPU, a VA space per device.
#[derive(Clone, Copy)]
pub(super) struct Client {
    pub(super) h: u32,
    pub(super) devices: [u32; 2],
    pub(super) subdevices: [u32; 2],
    pub(super) vaspaces: [u32; 2],
}
impl Client {
    pub(super) fn new(k: usize) -> Client {
        let h = 0xc1d0_0001 + k as u32;
        let d = |i: u32| 0x5c00_0010 + 0x100 * k as u32 + i;
        Client {
            h,
            devices: [d(0), d(1)],
            subdevices: [d(0x10), d(0x11)],
            vaspaces: [d(0x20), d(0x21)],
        }
    }
}

/// What the process really has mapped: per GPU, per 64 KiB page, the memory and its offset.
pub(super) struct Model {
    pub(super) pages: [Vec<Option<(MemRef, u64)>>; 2],
    /// Pages in an allocation the program made through CUDA (the rest is CUDA's own memory).
    pub(super) owned: Vec<bool>,
    /// The context each page's allocation was made in.
    pub(super) contexts: Vec<ContextTag>,
}
impl Model {
    pub(super) fn page(va: u64) -> usize {
        ((va - BASE) / PAGE) as usize
    }
    pub(super) fn set(
        &mut self,
        g: usize,
        base: u64,
        len: u64,
        v: impl Fn(u64) -> Option<(MemRef, u64)>,
    ) {
        for p in (0..len).step_by(PAGE as usize) {
            self.pages[g][Self::page(base + p)] = v(p);
        }
    }
    /// The memory every mapping GPU sees at page `va`, if they all agree and at least one maps it.
    pub(super) fn at(&self, va: u64) -> Result<Option<(MemRef, u64)>, ()> {
        let i = Self::page(va);
        match (self.pages[0][i], self.pages[1][i]) {
            (Some(a), Some(b)) if a != b => Err(()),
            (Some(a), _) | (_, Some(a)) => Ok(Some(a)),
            (None, None) => Ok(None),
        }
    }
    pub(super) fn own(&mut self, base: u64, len: u64, owned: bool) {
        for p in (0..len).step_by(PAGE as usize) {
            self.owned[Self::page(base + p)] = owned;
        }
    }
    /// `[base, base+len)` was made in context `tag`.
    pub(super) fn made_in(&mut self, base: u64, len: u64, tag: ContextTag) {
        for p in (0..len).step_by(PAGE as usize) {
            self.contexts[Self::page(base + p)] = tag;
        }
    }
    /// Context `tag` ended: CUDA freed what was made in it.
    pub(super) fn context_ended(&mut self, tag: ContextTag) {
        for (owned, &t) in self.owned.iter_mut().zip(&self.contexts) {
            *owned &= t != tag;
        }
    }
    /// Whether every page of `[addr, addr+len)` is the program's own.
    pub(super) fn owns(&self, addr: u64, len: u64) -> bool {
        (down(addr)..up(addr + len)).step_by(PAGE as usize).all(|p| self.owned[Self::page(p)])
    }
    pub(super) fn forget(&mut self, gone: impl Fn(MemRef) -> bool) {
        for g in &mut self.pages {
            for p in g.iter_mut() {
                if p.is_some_and(|(m, _)| gone(m)) {
                    *p = None;
                }
            }
        }
    }
}

pub(super) struct World {
    /// The pure core as the process has it, on the strict fake RM.
    pub(super) core: Core<StrictRm>,
    pub(super) model: Model,
    pub(super) clients: [Client; 2],
    /// The client whose VA space UVM has for each GPU (one GPU VA space per GPU per process).
    pub(super) uvm_owner: [usize; 2],
    pub(super) mems: Vec<(MemRef, usize, bool, u64)>, // (memory, device index, vidmem, size)
    pub(super) next_mem: u32,
    /// The program's CUDA contexts: each GPU's primary context, and a library's it created.
    pub(super) contexts: [u64; 3],
}

impl World {
    pub(super) fn new(route: Route) -> World {
        let mut w = World {
            core: Core {
                decoded: 0,
                tracker: Box::new(Tracker::new()),
                registrar: Box::new(Registrar::with_route(false, Ok(route))),
                rm: StrictRm::default(),
            },
            model: Model {
                pages: [vec![None; NPAGES], vec![None; NPAGES]],
                owned: vec![false; NPAGES],
                contexts: vec![ContextTag::NoContext; NPAGES],
            },
            clients: [Client::new(0), Client::new(1)],
            uvm_owner: [0, 1],
            mems: Vec::new(),
            next_mem: 0x100,
            contexts: [0xc0, 0xc1, 0xc100],
        };
        for i in 0..3 {
            w.context_made(i);
        }
        for k in 0..2 {
            w.setup_client(k);
        }
        for r in 0..RANGES {
            w.core
                .tracker
                .apply(&Event::UvmCreateExternalRange { base: BASE + r * RANGE, length: RANGE });
        }
        w
    }
    /// The program made context `i` (a GPU's primary context retained, or the library's created).
    pub(super) fn context_made(&mut self, i: usize) {
        let made =
            Work::ContextMade { ctx: self.contexts[i], primary_of: (i < 2).then_some(i as i32) };
        self.core.apply(&[made], &mut |_| {});
    }
    pub(super) fn setup_client(&mut self, k: usize) {
        let c = self.clients[k];
        self.core.tracker.apply(&Event::RootClient { fd: 10 + k as i32, h_client: c.h });
        for i in 0..2 {
            self.setup_device(k, i);
        }
    }
    pub(super) fn setup_device(&mut self, k: usize, i: usize) {
        let c = self.clients[k];
        self.core.tracker.apply(&Event::Device {
            h_client: c.h,
            h_device: c.devices[i],
            device_id: i as u32,
        });
        self.core.tracker.apply(&Event::Subdevice {
            h_client: c.h,
            h_device: c.devices[i],
            h_subdevice: c.subdevices[i],
            subdevice_id: 0,
        });
        self.core.tracker.apply(&Event::VaSpace {
            h_client: c.h,
            h_parent: c.devices[i],
            h_vaspace: c.vaspaces[i],
            class: class::FERMI_VASPACE_A,
            flags: 0x48,
        });
        if self.uvm_owner[i] == k {
            self.core.tracker.apply(&Event::UvmRegisterGpuVaSpace {
                uuid: GPUS[i],
                rm_ctrl_fd: 10 + k as i32,
                h_client: c.h,
                h_vaspace: c.vaspaces[i],
            });
        }
        self.core.rm.subdevices.insert((c.h, c.subdevices[i]), c.devices[i]);
        self.core.rm.instances.insert((c.h, c.devices[i]), i as u32);
    }

    /// The shim's order (`Shim::before_ioctl`): while registrations are live, those the call
    /// concerns go first; then the driver runs it.
    pub(super) fn driver(&mut self, call: Pending) {
        if self.core.registrar.in_use() {
            self.core.registrar.before_driver_call(&self.core.tracker, &mut self.core.rm, call);
        }
    }

    /// Every registration RM holds is, page by page, the memory the model has there.
    pub(super) fn check(&self, step: u64) {
        for (_, reg) in &self.core.rm.regs {
            for p in (0..reg.size).step_by(PAGE as usize) {
                let want = Some((reg.mem, reg.offset + p));
                let got = self.model.at(reg.address + p);
                assert_eq!(
                    got,
                    Ok(want),
                    "step {step}: RM holds {reg} but the model has {got:?} at {:#x}",
                    reg.address + p
                );
            }
        }
        assert_eq!(
            self.core.registrar.live_registrations(),
            self.core.rm.regs.len(),
            "step {step}: the registrar and RM disagree"
        );
        for o in &self.core.rm.p2p {
            assert!(
                o.vaspaces.len() <= 1,
                "step {step}: a 503C with {} VA spaces",
                o.vaspaces.len()
            );
        }
    }
}
