//! The program's own GPU allocations, as its CUDA calls made them: what `cuMemAlloc*`, the
//! stream-ordered pools, `cuMemMap`/`cuMemSetAccess` and the imports of other processes' memory
//! (IPC handles, pool pointers) handed to the program, less what it freed or unmapped since.
//!
//! CUDA's own memory (its context, module and kernel-argument buffers, the pool's unallocated
//! blocks) sits in the same GPU VA space and the same RM/UVM map as the program's, and RM does not
//! ask whose memory it exports. libcuda exports a range only when every byte of it lies in
//! allocations the program made (adjacent allocations together are fine); a registration or an
//! export of gdrshim follows the same rule on every path, so a NIC, and a remote peer behind it,
//! can never reach memory the program was not given.
//!
//! The usual allocation is exactly one UVM mapping (a cudaMalloc of its own chunk, a VMM handle
//! mapped and granted access): its entry in the map carries the mark ([`own`]), at
//! no cost in memory. The rest (sub-allocations of a chunk, a range over several mappings, one not
//! mapped yet) is kept here: a tree of non-overlapping `[base, end)` ranges. A range recorded over
//! older ones replaces what it overlaps (the older were freed without our seeing it); a free takes
//! the allocation that starts at its pointer; an unmap takes what it covers, splitting at its ends.
//! Each allocation has the context it was made in (`contexts`): a context's end ends exactly its
//! own ([`end_of`]).
#![forbid(unsafe_code)]

use super::contexts::{ContextTag, Tags};
use super::gpu::{GpuMap, Gpus};
use super::touch::Tree;
use super::types::MemRef;
use crate::abi::Uuid;

/// Non-overlapping ranges, `base -> (end, reach)`.
#[derive(Clone, Debug, Default)]
pub struct Allocations {
    /// `base -> (end, reach)`: `reach` is where libcuda counts the allocation to (the end of the
    /// chunk it was carved from, [`VaMap::own`]); `end` where nothing lies beyond it.
    by_base: Tree<u64, (u64, u64)>,
    /// The context of each allocation, those marked on an entry included.
    pub tags: Tags,
}

impl Allocations {
    /// How many allocations are recorded.
    pub fn len(&self) -> usize {
        self.by_base.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_base.is_empty()
    }

    /// The program was handed `[base, base+len)`. Whatever was recorded over any of it is gone.
    pub fn add(&mut self, base: u64, len: u64) {
        self.add_reaching(base, len, 0);
    }

    /// [`Allocations::add`], counted on to `reach` where that is past its end.
    pub fn add_reaching(&mut self, base: u64, len: u64, reach: u64) {
        let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return };
        self.remove(base, end);
        self.by_base.insert(base, (end, reach.max(end)));
    }

    /// The program freed the allocation that starts at `base` (`cuMemFree`, `cuMemFreeAsync`,
    /// `cuIpcCloseMemHandle`): whether one did.
    pub fn free_at(&mut self, base: u64) -> bool {
        self.by_base.remove(&base).is_some()
    }

    /// `[base, end)` is no longer the program's (`cuMemUnmap`, `cuMemAddressFree`, or UVM
    /// releasing the VA): what lies in it goes, an allocation across either end is cut there.
    pub fn remove(&mut self, base: u64, end: u64) {
        if end <= base {
            return;
        }
        // one that starts below base and runs into the range keeps its part below base, and a
        // part above end if it runs past that too
        // (a part cut off below reaches no further than its new end)
        if let Some((&b, &(e, r))) = self.by_base.range(..base).next_back() {
            if e > base {
                self.by_base.insert(b, (base, base));
                if e > end {
                    self.by_base.insert(end, (e, r));
                }
            }
        }
        let inside: Vec<(u64, (u64, u64))> =
            self.by_base.range(base..end).map(|(&b, &v)| (b, v)).collect();
        for (b, (e, r)) in inside {
            self.by_base.remove(&b);
            if e > end {
                self.by_base.insert(end, (e, r));
            }
        }
    }

    /// The allocation that holds `addr`, as `[base, end)`.
    pub fn holding(&self, addr: u64) -> Option<(u64, u64)> {
        self.holding_reach(addr).map(|(b, e, _)| (b, e))
    }

    /// The allocation that holds `addr`: its base, end and reach.
    pub fn holding_reach(&self, addr: u64) -> Option<(u64, u64, u64)> {
        self.by_base
            .range(..=addr)
            .next_back()
            .filter(|(_, &(e, _))| e > addr)
            .map(|(&b, &(e, r))| (b, e, r))
    }
}

/// The program was handed `[base, base+len)` by a CUDA call (`carved`: one that allocated it,
/// which may carve it from a longer mapping; else an import, counted exactly). What was recorded
/// over any of it is gone; where it is exactly one entry on some GPU, that entry carries the mark.
/// It goes with context `tag`.
pub(super) fn own(
    gpus: &mut Gpus,
    records: &mut Allocations,
    base: u64,
    len: u64,
    carved: bool,
    tag: ContextTag,
) {
    let Some(end) = base.checked_add(len).filter(|_| len > 0) else { return };
    // carved from a mapping that runs past it (libcuda's chunk): counted to that mapping's end,
    // as libcuda counts it ([`chunk_end`]); known now, while it is that chunk
    let reach = if carved { chunk_end(gpus, end) } else { end };
    disown(gpus, records, base, end);
    let mut marked = false;
    for m in gpus.values_mut() {
        if let Some(e) = m.get(base).copied().filter(|e| e.end == end) {
            let origin = m.origin(base, &e);
            m.insert(base, e.with_owned(true), origin);
            marked = true;
        }
    }
    if !marked {
        records.add_reaching(base, len, reach);
    }
    records.tags.record(base, end, tag);
}

/// The program freed the allocation that starts at `base`: whether there was one.
pub(super) fn disown_at(gpus: &mut Gpus, records: &mut Allocations, base: u64) -> bool {
    if let Some((_, end)) = records.holding(base).filter(|&(b, _)| b == base) {
        records.free_at(base);
        records.tags.cut(base, end);
        return true;
    }
    let mut end = None;
    for m in gpus.values_mut() {
        if let Some(e) = m.get(base).copied().filter(|e| e.owned()) {
            let origin = m.origin(base, &e);
            m.insert(base, e.with_owned(false), origin);
            end = end.max(Some(e.end));
        }
    }
    // (only this allocation's bytes: a piece of it cut off elsewhere keeps its context)
    if let Some(end) = end {
        records.tags.cut(base, end);
    }
    end.is_some()
}

/// `[base, end)` is the program's no longer. A marked entry across either end keeps its part
/// outside as a recorded range.
pub(super) fn disown(gpus: &mut Gpus, records: &mut Allocations, base: u64, end: u64) {
    if end <= base {
        return;
    }
    records.remove(base, end);
    records.tags.cut(base, end);
    let mut rest: Vec<(u64, u64)> = Vec::new();
    for m in gpus.values_mut() {
        let first = m.at(base).map_or(base, |(s, _)| s);
        let marked: Vec<u64> = m
            .range(first..end)
            .filter(|(_, e)| e.owned() && e.end > base)
            .map(|(s, _)| s)
            .collect();
        for s in marked {
            let Some(e) = m.get(s).copied() else { continue };
            let origin = m.origin(s, &e);
            m.insert(s, e.with_owned(false), origin);
            rest.extend(
                [(s, base.min(e.end)), (end.max(s), e.end)]
                    .into_iter()
                    .filter(|(a, b)| a < b && (*b <= base || *a >= end)),
            );
        }
    }
    for (a, b) in rest {
        records.add(a, b - a);
    }
}

/// Memory `mem` is about to be mapped over `[base, end)` on some GPU. Where any GPU maps other
/// memory there now, the program's allocation there was freed unseen (a live one's VA is never
/// given to other memory, and every GPU that maps an address maps the same memory there): it is
/// the program's no longer, on every GPU, and libcuda's chunk rule ([`first_unowned`]) must not
/// reach from it into this memory. (One GPU unmapped first and CUDA's own memory mapped on it
/// while another GPU still maps the old chunk is such a case.)
pub(super) fn end_under(
    gpus: &mut Gpus,
    records: &mut Allocations,
    base: u64,
    end: u64,
    mem: MemRef,
) {
    let replaced = gpus.values().any(|m| {
        let first = m.at(base).map_or(base, |(s, _)| s);
        m.range(first..end).any(|(_, e)| e.end > base && e.mem != mem)
    });
    if replaced {
        disown(gpus, records, base, end);
    }
}

/// A CUDA context ended (`cuCtxDestroy`, a primary context reset or released for the last time):
/// CUDA freed the allocations made in it, whether or not the driver calls that freed each were
/// seen. So the allocations of each context that `ended` names are the program's no longer; an
/// allocation whose context is unknown ends with any context's end at VA that GPU `unknown_on`
/// maps (`None`: anywhere), and with it any other GPU's marks there (fail safe: it may be of that
/// context); memory of other contexts, VMM memory and the pools' live on.
pub(super) fn end_of(
    gpus: &mut Gpus,
    records: &mut Allocations,
    ended: &dyn Fn(u64) -> bool,
    unknown_on: Option<Uuid>,
) {
    let mut all: Vec<(u64, u64)> = records.by_base.iter().map(|(&b, &(e, _))| (b, e)).collect();
    for m in gpus.values() {
        all.extend(m.iter().filter(|(_, e)| e.owned()).map(|(s, e)| (s, e.end)));
    }
    all.sort_unstable();
    all.dedup();
    let mapped_on_unknowns_gpu = |base: u64, end: u64| match unknown_on {
        None => true,
        Some(g) => gpus.get(&g).is_some_and(|m| {
            let first = m.at(base).map_or(base, |(s, _)| s);
            m.range(first..end).any(|(_, e)| e.end > base)
        }),
    };
    let ending: Vec<(u64, u64)> = all
        .into_iter()
        .filter(|&(base, end)| match records.tags.at(base) {
            ContextTag::Of(ctx) => ended(ctx),
            ContextTag::Unknown => mapped_on_unknowns_gpu(base, end),
            ContextTag::NoContext => false,
        })
        .collect();
    for (base, end) in ending {
        records.remove(base, end);
        records.tags.cut(base, end);
        for m in gpus.values_mut() {
            let first = m.at(base).map_or(base, |(s, _)| s);
            let marked: Vec<u64> = m
                .range(first..end)
                .filter(|(_, e)| e.owned() && e.end > base)
                .map(|(s, _)| s)
                .collect();
            for s in marked {
                let Some(e) = m.get(s).copied() else { continue };
                let origin = m.origin(s, &e);
                m.insert(s, e.with_owned(false), origin);
            }
        }
    }
}

/// The first byte of `[addr, end)` that is in no allocation of the program's, or `None` when its
/// allocations (one, or several side by side) cover all of it. As libcuda counts them: the range
/// starts in an allocation's own bytes, and an allocation carved from a longer mapping reaches on
/// to that mapping's end ([`own`]).
pub(super) fn first_unowned(
    gpus: &Gpus,
    records: &Allocations,
    addr: u64,
    end: u64,
) -> Option<u64> {
    let mut at = addr;
    while at < end {
        if let Some((_, e, reach)) = records.holding_reach(at) {
            // the chunk as it was carved, as far as the same mapping still holds its end
            at = reach.min(chunk_end(gpus, e));
            continue;
        }
        let marked = gpus
            .values()
            .filter_map(|m: &GpuMap| m.at(at))
            .filter(|(_, e)| e.owned())
            .map(|(_, e)| e.end)
            .max();
        match marked {
            Some(e) => at = e,
            None => return Some(at),
        }
    }
    None
}

/// Where an allocation that ends at `end` reaches to: libcuda hands small and odd-sized
/// allocations out of mappings it made for the program (2 MiB chunks) and exports the rest of
/// such a mapping from an allocation on (the H200, tests/gpu/owned.cu odd-*: a 1-byte cuMemAlloc's
/// whole 2 MiB, a 3 MiB + 1 one's 4 MiB). So: the end of the mapping that holds its last byte,
/// only as far as every GPU that maps that byte maps it on (one GPU's older, longer mapping there
/// is no chunk of this allocation); `end` where nothing maps it.
fn chunk_end(gpus: &Gpus, end: u64) -> u64 {
    gpus.values()
        .filter_map(|m: &GpuMap| m.at(end - 1))
        .map(|(_, e)| e.end)
        .min()
        .unwrap_or(end)
        .max(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vamap::VaMap;

    const M: u64 = 1 << 20;

    #[test]
    fn neighbours_cover_together_and_a_byte_outside_does_not() {
        // (no mappings: every allocation is a recorded range)
        let mut a = VaMap::default();
        a.own(64 * M, 2 * M);
        a.own(66 * M, 2 * M);
        assert_eq!(a.first_unowned(64 * M, 68 * M), None, "two allocations side by side");
        assert_eq!(a.first_unowned(65 * M, 67 * M), None);
        assert_eq!(a.first_unowned(64 * M, 68 * M + 1), Some(68 * M), "one byte past the end");
        assert_eq!(
            a.first_unowned(64 * M - 4096, 65 * M),
            Some(64 * M - 4096),
            "a page before the start"
        );
        assert_eq!(a.first_unowned(70 * M, 71 * M), Some(70 * M), "memory the program never had");
        a.own(69 * M, M);
        assert_eq!(a.first_unowned(64 * M, 70 * M), Some(68 * M), "a hole between two allocations");
    }

    #[test]
    fn a_free_takes_only_the_allocation_at_its_pointer() {
        let mut a = VaMap::default();
        a.own(0x1000, 0x200);
        a.own(0x1200, 0x200);
        assert!(!a.disown_at(0x1100), "not the start of an allocation");
        assert!(a.disown_at(0x1000));
        assert_eq!(a.first_unowned(0x1000, 0x1400), Some(0x1000));
        assert_eq!(a.first_unowned(0x1200, 0x1400), None);
        assert!(!a.disown_at(0x1000), "freed once");
    }

    #[test]
    fn an_unmap_cuts_what_it_covers_and_keeps_the_rest() {
        let mut a = Allocations::default();
        a.add(0, 10 * M);
        a.remove(4 * M, 6 * M);
        assert_eq!(a.holding(M), Some((0, 4 * M)));
        assert_eq!(a.holding(5 * M), None);
        assert_eq!(a.holding(7 * M), Some((6 * M, 10 * M)));
        a.remove(0, 20 * M);
        assert!(a.is_empty());
    }

    #[test]
    fn a_new_allocation_replaces_what_it_overlaps() {
        let mut a = Allocations::default();
        a.add(0, 4 * M);
        a.add(2 * M, 4 * M);
        assert_eq!(a.holding(M), Some((0, 2 * M)));
        assert_eq!(a.holding(3 * M), Some((2 * M, 6 * M)));
        assert_eq!(a.len(), 2);
        a.add(2 * M, 4 * M);
        assert_eq!(a.len(), 2, "the same range again is one allocation");
        a.add(u64::MAX - 1, 8);
        a.add(5, 0);
        assert_eq!(a.len(), 2, "a range that wraps or is empty is not recorded");
    }

    /// libcuda's chunks: an odd-sized allocation counts to the end of the mapping holding its
    /// last byte (the H200's answers to tests/gpu/owned.cu's odd-* cases), not before its start
    /// and not into the next mapping.
    #[test]
    fn an_odd_sized_allocation_counts_to_the_end_of_its_mapping() {
        let gpu = [1u8; 16];
        let mem = crate::vamap::MemRef { client: 1, memory: 2 };
        let mut m = VaMap::default();
        m.map(gpu, 0, 2 * M, mem, 0);
        m.map(gpu, 2 * M, 4 * M, mem, 2 * M);
        m.map(gpu, 6 * M, 2 * M, crate::vamap::MemRef { client: 1, memory: 9 }, 0);
        m.own(0, 1);
        assert_eq!(m.first_unowned(0, 4096), None, "a 1-byte allocation's first page");
        assert_eq!(m.first_unowned(0, 2 * M), None, "its chunk");
        assert_eq!(m.first_unowned(0, 2 * M + 1), Some(2 * M), "not the next mapping");
        m.own(2 * M, 3 * M + 1);
        assert_eq!(m.first_unowned(2 * M, 6 * M), None, "3 MiB + 1 counts to its mapping's end");
        assert_eq!(
            m.first_unowned(2 * M, 6 * M + 1),
            Some(6 * M),
            "the other memory after it is not the program's"
        );
        m.own(M + 4096, 100);
        assert_eq!(
            m.first_unowned(M + 4096, M + 8192),
            None,
            "a later allocation inside the chunk"
        );
        assert!(m.disown_at(0));
        assert_eq!(
            m.first_unowned(0, 4096),
            Some(0),
            "freed: not the program's, not even the chunk before the next one"
        );
        assert_eq!(m.first_unowned(M + 4096, 2 * M), None);
        let mut bare = VaMap::default();
        bare.own(0, 1);
        assert_eq!(
            bare.first_unowned(0, 2),
            Some(1),
            "with no mapping known, the allocation's own bytes only"
        );
        // a range starting in the chunk's slack is no allocation's
        let mut slack = VaMap::default();
        slack.map(gpu, 0, 2 * M, mem, 0);
        slack.own(0, 1);
        assert_eq!(
            slack.first_unowned(M, M + 4096),
            Some(M),
            "a range that starts past every allocation's own bytes"
        );
        // a live allocation keeps its bytes when a lower neighbour in its chunk, allocated
        // after it (first fit after frees), is freed
        let mut fit = VaMap::default();
        fit.map(gpu, 0, 2 * M, mem, 0);
        fit.own(0x1000, 0x1000);
        fit.own(0, 0x1000);
        assert!(fit.disown_at(0));
        assert_eq!(fit.first_unowned(0x1000, 0x2000), None, "the live one above it");
        assert_eq!(fit.first_unowned(0x1000, 2 * M), None, "and its chunk from it on");
        assert_eq!(fit.first_unowned(0, 0x1000), Some(0), "the freed one");
    }

    /// An allocation that is exactly one mapping is a mark on its entry, not a recorded range;
    /// an unmap keeps the mark on what stays mapped; a partial unmap by the program keeps the
    /// rest of a marked entry as a range.
    #[test]
    fn an_allocation_that_is_one_mapping_costs_no_range() {
        let gpu = [1u8; 16];
        let mem = crate::vamap::MemRef { client: 1, memory: 2 };
        let mut m = VaMap::default();
        m.map(gpu, 0, 8 * M, mem, 0);
        m.own(0, 8 * M);
        assert_eq!(
            (m.owned_ranges(), m.first_unowned(0, 8 * M)),
            (0, None),
            "the entry carries the mark"
        );
        m.unmap(gpu, 6 * M, 2 * M);
        assert_eq!(m.first_unowned(0, 8 * M), Some(6 * M), "the unmapped part went with its entry");
        m.disown(2 * M, 4 * M);
        assert_eq!(
            m.owned_ranges(),
            2,
            "what stays of the marked entry around the hole is kept as ranges"
        );
        assert_eq!(m.first_unowned(0, 2 * M), None);
        assert_eq!(
            m.first_unowned(0, 6 * M),
            Some(2 * M),
            "what is left of a whole mapping reaches no further"
        );
        assert_eq!(m.first_unowned(4 * M, 6 * M), None);
        m.own(M, 100);
        assert_eq!(m.first_unowned(M, M + 100), None, "a sub-allocation is a range");
        assert!(m.disown_at(M) && !m.disown_at(M));
        m.map(gpu, 8 * M, 2 * M, mem, 8 * M);
        m.own(8 * M, 2 * M);
        assert!(m.disown_at(8 * M), "a free takes the mark");
        assert_eq!(m.first_unowned(8 * M, 10 * M), Some(8 * M));
        m.own(8 * M, 2 * M);
        m.map(gpu, 8 * M, 2 * M, crate::vamap::MemRef { client: 1, memory: 3 }, 0);
        assert_eq!(
            m.first_unowned(8 * M, 10 * M),
            Some(8 * M),
            "other memory mapped over it is not the program's"
        );
    }
}
