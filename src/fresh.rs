//! What the program created since gdrshim could last have made a registration: RM objects and
//! UVM external ranges, from calls the driver accepted.
//!
//! Why: before a call that releases memory or VA runs, gdrshim must take down what is registered
//! over it, and deciding that needs the map with every queued call applied (an allocation's calls
//! usually still wait in the queue). A registration is made only on a map with every queued call
//! applied (`Pipeline::core`), which forgets this record. So it can only use memory and VA the
//! map knew then. A release of an object or range created after that, or a map or unmap inside
//! such a range, cannot touch a live registration. Such a release needs no decision, and so no
//! catching up (an allocation and its free with registrations live).
//!
//! Kept: the last [`HANDLES`] objects and [`RANGES`] ranges. Forgetting one only sends its
//! release the long way. So does a release that the registrations alone say touches one of them
//! (`Registrar::may_touch`): a registration left behind by a release that got no decision (its
//! lock not free in time) or that happened behind gdrshim's back is still taken down at the
//! first release over it, as before.
#![forbid(unsafe_code)]

use crate::decode::{Event, Pending};

/// RM objects remembered (an allocation makes one memory object).
pub const HANDLES: usize = 32;
/// UVM external ranges remembered (an allocation makes one).
pub const RANGES: usize = 16;

/// What a release covered by the record touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// The RM object it frees (and what RM frees with it).
    Object,
    /// The VA `[start, end)` it unmaps or maps over (a UVM free: the whole range).
    Va { start: u64, end: u64 },
}

#[derive(Clone, Debug, Default)]
pub struct FreshRecord {
    /// (client, object), oldest overwritten first.
    handles: [Option<(u32, u32)>; HANDLES],
    /// [start, end) of external ranges, oldest overwritten first.
    ranges: [Option<(u64, u64)>; RANGES],
    next_handle: usize,
    next_range: usize,
    /// Anything recorded since the last forget (forgetting nothing costs nothing).
    recorded: bool,
}

impl FreshRecord {
    /// Notes what an accepted call created.
    pub fn record(&mut self, ev: &Event) {
        let handle = match *ev {
            Event::RootClient { h_client, .. } => (h_client, h_client),
            Event::Device { h_client, h_device, .. } => (h_client, h_device),
            Event::Subdevice { h_client, h_subdevice, .. } => (h_client, h_subdevice),
            Event::VaSpace { h_client, h_vaspace, .. } => (h_client, h_vaspace),
            Event::Memory { h_client, h_memory, .. } => (h_client, h_memory),
            Event::OtherObject { h_client, h_object, .. }
            | Event::P2pAlloc { h_client, h_object, .. }
            | Event::Dup { h_client, h_object, .. } => (h_client, h_object),
            Event::UvmCreateExternalRange { base, length } => {
                if let Some(end) = base.checked_add(length).filter(|_| length > 0) {
                    self.ranges[self.next_range] = Some((base, end));
                    self.next_range = (self.next_range + 1) % RANGES;
                    self.recorded = true;
                }
                return;
            }
            // a freed range's record goes: what UVM_FREE(base) frees next is another range
            Event::UvmFree { base, .. } => {
                for r in self.ranges.iter_mut() {
                    if matches!(*r, Some((start, _)) if start == base) {
                        *r = None;
                    }
                }
                return;
            }
            _ => return,
        };
        self.handles[self.next_handle] = Some(handle);
        self.next_handle = (self.next_handle + 1) % HANDLES;
        self.recorded = true;
    }

    /// `Some` when everything `call` releases (or maps over) was created since the record was
    /// last forgotten: what it touches.
    pub fn fresh(&self, call: &Pending) -> Option<Fresh> {
        match *call {
            Pending::RmFree { h_client, h_object } => {
                self.handles.contains(&Some((h_client, h_object))).then_some(Fresh::Object)
            }
            // the whole range that starts at `base`
            Pending::UvmFree { base } => {
                // every record at base (one dropped free can leave two): the widest, on the safe side
                self.ranges
                    .iter()
                    .flatten()
                    .filter(|&&(start, _)| start == base)
                    .map(|&(_, end)| end)
                    .max()
                    .map(|end| Fresh::Va { start: base, end })
            }
            Pending::UvmMap { base, length, .. } | Pending::UvmUnmap { base, length } => {
                let end = base.checked_add(length).filter(|_| length > 0)?;
                self.ranges
                    .iter()
                    .flatten()
                    .any(|&(start, stop)| start <= base && end <= stop)
                    .then_some(Fresh::Va { start: base, end })
            }
        }
    }

    /// A registration may now be made on what the map knows: nothing recorded so far is new to it.
    pub fn forget(&mut self) {
        if self.recorded {
            *self = FreshRecord::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(h_client: u32, h_memory: u32) -> Event {
        Event::Memory {
            h_client,
            h_parent: 2,
            h_memory,
            class: 0x40,
            size: Some(1 << 21),
            attr: 0,
            attr2: 0,
            flags: 0,
        }
    }
    fn range(base: u64, length: u64) -> Event {
        Event::UvmCreateExternalRange { base, length }
    }
    fn map(base: u64, length: u64) -> Pending {
        Pending::UvmMap { base, length, offset: 0, h_client: 1, h_memory: 9 }
    }
    impl FreshRecord {
        fn covers(&self, call: &Pending) -> bool {
            self.fresh(call).is_some()
        }
    }

    #[test]
    fn what_a_fresh_release_touches() {
        let mut b = FreshRecord::default();
        b.record(&memory(1, 0x10));
        b.record(&range(0x20_0000, 0x40_0000));
        assert_eq!(b.fresh(&Pending::RmFree { h_client: 1, h_object: 0x10 }), Some(Fresh::Object));
        assert_eq!(
            b.fresh(&Pending::UvmFree { base: 0x20_0000 }),
            Some(Fresh::Va { start: 0x20_0000, end: 0x60_0000 }),
            "the whole range"
        );
        assert_eq!(
            b.fresh(&map(0x30_0000, 0x1000)),
            Some(Fresh::Va { start: 0x30_0000, end: 0x30_1000 }),
            "what the map call covers"
        );
        assert_eq!(
            b.fresh(&Pending::UvmUnmap { base: 0x40_0000, length: 0x20_0000 }),
            Some(Fresh::Va { start: 0x40_0000, end: 0x60_0000 })
        );
    }

    #[test]
    fn a_release_of_what_was_created_since_is_covered_and_nothing_else() {
        let mut b = FreshRecord::default();
        b.record(&memory(1, 0x10));
        b.record(&range(0x20_0000, 0x40_0000));
        assert!(b.covers(&Pending::RmFree { h_client: 1, h_object: 0x10 }));
        assert!(!b.covers(&Pending::RmFree { h_client: 1, h_object: 0x11 }), "another object");
        assert!(
            !b.covers(&Pending::RmFree { h_client: 2, h_object: 0x10 }),
            "the same handle in another client"
        );
        assert!(b.covers(&Pending::UvmFree { base: 0x20_0000 }));
        assert!(
            !b.covers(&Pending::UvmFree { base: 0x40_0000 }),
            "a range that starts inside it is another range"
        );
        assert!(b.covers(&map(0x20_0000, 0x40_0000)), "the whole range");
        assert!(b.covers(&map(0x40_0000, 0x1000)), "inside it");
        assert!(b.covers(&Pending::UvmUnmap { base: 0x30_0000, length: 0x10_0000 }));
        assert!(!b.covers(&map(0x1f_f000, 0x2000)), "starts before it");
        assert!(!b.covers(&map(0x5f_f000, 0x2000)), "ends after it");
        assert!(!b.covers(&map(0x20_0000, 0)), "empty");
        assert!(!b.covers(&map(u64::MAX - 0xfff, 0x2000)), "wraps");
        b.forget();
        for p in [
            Pending::RmFree { h_client: 1, h_object: 0x10 },
            Pending::UvmFree { base: 0x20_0000 },
            map(0x20_0000, 0x1000),
        ] {
            assert!(!b.covers(&p), "{p:?} after forget");
        }
    }

    #[test]
    fn every_object_kind_counts_and_nothing_else_does() {
        let created = [
            Event::RootClient { fd: 3, h_client: 7 },
            Event::Device { h_client: 7, h_device: 8, device_id: 0 },
            Event::Subdevice { h_client: 7, h_device: 8, h_subdevice: 9, subdevice_id: 0 },
            Event::VaSpace { h_client: 7, h_parent: 8, h_vaspace: 10, class: 0x90f1, flags: 0 },
            memory(7, 11),
            Event::OtherObject { h_client: 7, h_parent: 8, h_object: 12, class: 0x1 },
            Event::P2pAlloc { h_client: 7, h_parent: 9, h_object: 13, flags: 0 },
            Event::Dup { h_client: 7, h_parent: 8, h_object: 14, h_client_src: 5, h_object_src: 6 },
        ];
        let mut b = FreshRecord::default();
        for ev in &created {
            b.record(ev);
        }
        for h in [7, 8, 9, 10, 11, 12, 13, 14] {
            assert!(b.covers(&Pending::RmFree { h_client: 7, h_object: h }), "object {h}");
        }
        assert!(
            !b.covers(&Pending::RmFree { h_client: 5, h_object: 6 }),
            "a dup's source is not new"
        );
        let mut b = FreshRecord::default();
        b.record(&Event::Free { h_client: 7, h_parent: 8, h_object: 11 });
        b.record(&Event::UvmFree { base: 0x20_0000, length: Some(0x20_0000) });
        b.record(&range(0x20_0000, 0));
        b.record(&range(u64::MAX - 0xfff, 0x2000));
        assert!(!b.covers(&Pending::RmFree { h_client: 7, h_object: 11 }));
        assert!(!b.covers(&Pending::UvmFree { base: 0x20_0000 }));
        assert!(
            !b.covers(&Pending::UvmFree { base: u64::MAX - 0xfff }),
            "a range that would wrap is not kept"
        );
    }

    #[test]
    fn a_freed_range_leaves_the_record_and_its_base_may_come_back_wider() {
        let mut b = FreshRecord::default();
        b.record(&range(0x20_0000, 0x20_0000));
        b.record(&Event::UvmFree { base: 0x20_0000, length: None });
        assert!(
            !b.covers(&Pending::UvmFree { base: 0x20_0000 }),
            "freed: whatever UVM_FREE frees there next is not new"
        );
        b.record(&range(0x20_0000, 0x400_0000));
        assert_eq!(
            b.fresh(&Pending::UvmFree { base: 0x20_0000 }),
            Some(Fresh::Va { start: 0x20_0000, end: 0x420_0000 }),
            "the range there now"
        );
        // a free the record never saw (dropped, or of a range it does not keep): the widest wins
        let mut b = FreshRecord::default();
        b.record(&range(0x20_0000, 0x20_0000));
        b.record(&range(0x20_0000, 0x400_0000));
        b.record(&range(0x20_0000, 0x100_0000));
        assert_eq!(
            b.fresh(&Pending::UvmFree { base: 0x20_0000 }),
            Some(Fresh::Va { start: 0x20_0000, end: 0x420_0000 })
        );
    }

    #[test]
    fn the_oldest_are_forgotten_first() {
        let mut b = FreshRecord::default();
        for h in 1..=(HANDLES as u32 + 1) {
            b.record(&memory(1, h));
        }
        assert!(!b.covers(&Pending::RmFree { h_client: 1, h_object: 1 }), "overwritten");
        for h in 2..=(HANDLES as u32 + 1) {
            assert!(b.covers(&Pending::RmFree { h_client: 1, h_object: h }), "object {h}");
        }
        for i in 0..=(RANGES as u64) {
            b.record(&range((i + 1) << 21, 1 << 21));
        }
        assert!(!b.covers(&Pending::UvmFree { base: 1 << 21 }), "overwritten");
        for i in 1..=(RANGES as u64) {
            assert!(b.covers(&Pending::UvmFree { base: (i + 1) << 21 }), "range {i}");
        }
    }
}
