//! The map against its semantics and against a page-by-page model.

use super::*;
use mems::AllocId;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

const G0: Uuid = [0; 16];
const G1: Uuid = [1; 16];
fn m(h: u32) -> MemRef {
    MemRef { client: 0xc1d0_0001, memory: h }
}

#[test]
fn exact_hit_and_sub_range() {
    let mut v = VaMap::new();
    v.map(G0, 0x10_0000, 0x20_0000, m(1), 0);
    let p = v.lookup_single(0x10_0000 + 0x1000, 0x1000).unwrap();
    assert_eq!((p.va, p.len, p.mem, p.offset), (0x10_1000, 0x1000, m(1), 0x1000));
    assert_eq!(p.origin, Origin { base: 0x10_0000, length: 0x20_0000, offset: 0 });
}

#[test]
fn miss_reasons() {
    let mut v = VaMap::new();
    v.map(G0, 0x10_0000, 0x1_0000, m(1), 0);
    v.map(G0, 0x11_0000, 0x1_0000, m(2), 0);
    assert_eq!(v.lookup(0, 0), Err(Miss::Empty));
    assert_eq!(v.lookup(u64::MAX, 2), Err(Miss::Overflow));
    assert_eq!(v.lookup(0x5000, 0x1000), Err(Miss::Unmapped { at: 0x5000 }));
    assert_eq!(v.lookup(0x10_f000, 0x3000).unwrap().len(), 2);
    assert_eq!(v.lookup_single(0x10_f000, 0x3000), Err(Miss::SpansMemoryObjects { count: 2 }));
    // hole after the second mapping
    assert_eq!(v.lookup(0x11_f000, 0x2000), Err(Miss::Unmapped { at: 0x12_0000 }));
    v.unmap_all(0x10_0000, 0x1_0000);
    assert_eq!(v.lookup(0x10_0000, 0x1000), Err(Miss::Freed { at: 0x10_0000 }));
    assert_eq!(v.remove_memory(m(2)), 1);
    assert_eq!(v.lookup(0x11_0000, 0x1000), Err(Miss::Freed { at: 0x11_0000 }));
    assert_eq!(v.entries(), 0);
}

#[test]
fn new_map_replaces_overlap_and_splits() {
    let mut v = VaMap::new();
    v.map(G0, 0x0, 0x10_0000, m(1), 0x100_0000);
    v.map(G0, 0x4_0000, 0x1_0000, m(2), 0);
    let d = v.dump();
    assert_eq!(
        d,
        vec![
            (G0, 0, 0x4_0000, m(1), 0x100_0000),
            (G0, 0x4_0000, 0x1_0000, m(2), 0),
            (G0, 0x5_0000, 0xb_0000, m(1), 0x105_0000)
        ]
    );
    // The split-off tail keeps offsets consistent and merges back on lookup only when contiguous.
    let p = v.lookup(0x5_0000, 0x1000).unwrap();
    assert_eq!(p[0].offset, 0x105_0000);
}

#[test]
fn per_gpu_unmap_and_agreement() {
    let mut v = VaMap::new();
    v.map(G0, 0x10_0000, 0x1_0000, m(1), 0);
    v.map(G1, 0x10_0000, 0x1_0000, m(1), 0);
    assert!(v.lookup_single(0x10_0000, 0x1_0000).is_ok());
    v.unmap(G1, 0x10_0000, 0x8000);
    // G1 now half-covers: the answer is no longer exact on every GPU that maps it.
    assert_eq!(v.lookup(0x10_0000, 0x1_0000), Err(Miss::GpusDisagree { at: 0x10_0000 }));
    v.map(G1, 0x10_0000, 0x1_0000, m(9), 0);
    assert_eq!(v.lookup(0x10_0000, 0x1000), Err(Miss::GpusDisagree { at: 0x10_0000 }));
}

/// A naive model: one entry per 4 KiB page per GPU.
#[derive(Default)]
struct Model {
    pages: HashMap<(u8, u64), (MemRef, u64)>,
}
const PAGE: u64 = 0x1000;

use crate::testkit::Rng;

#[test]
fn property_against_naive_page_model() {
    let gpus = [G0, G1];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut v = VaMap::new();
    let mut model = Model::default();
    const SPACE: u64 = 64; // pages
    let ops = 100_000;
    let mut hits = 0u64;
    for _ in 0..ops {
        let g = rng.below(2) as u8;
        let base = rng.below(SPACE) * PAGE;
        let len = (1 + rng.below(8)) * PAGE;
        match rng.below(10) {
            0..=3 => {
                let mem = m(1 + rng.below(6) as u32);
                let off = rng.below(16) * PAGE;
                v.map(gpus[g as usize], base, len, mem, off);
                for i in 0..len / PAGE {
                    model.pages.insert((g, base / PAGE + i), (mem, off + i * PAGE));
                }
            }
            4 | 5 => {
                v.unmap(gpus[g as usize], base, len);
                for i in 0..len / PAGE {
                    model.pages.remove(&(g, base / PAGE + i));
                }
            }
            6 => {
                v.unmap_all(base, len);
                for gg in 0..2u8 {
                    for i in 0..len / PAGE {
                        model.pages.remove(&(gg, base / PAGE + i));
                    }
                }
            }
            7 => {
                let mem = m(1 + rng.below(6) as u32);
                v.remove_memory(mem);
                model.pages.retain(|_, (mm, _)| *mm != mem);
            }
            _ => {
                // lookup, compared page by page with the model; the fast path agrees with it
                let got = v.lookup(base, len);
                if let Some(one) = v.lookup_one(base, len) {
                    assert_eq!(got, Ok(vec![one]), "lookup_one at {base:#x}+{len:#x}");
                }
                let first = base / PAGE;
                let mut expect: Option<Vec<(MemRef, u64)>> = Some(Vec::new());
                for i in 0..len / PAGE {
                    let a = model.pages.get(&(0, first + i)).copied();
                    let b = model.pages.get(&(1, first + i)).copied();
                    let any0 = (0..len / PAGE).any(|j| model.pages.contains_key(&(0, first + j)));
                    let any1 = (0..len / PAGE).any(|j| model.pages.contains_key(&(1, first + j)));
                    let page = match (any0, any1) {
                        (true, true) => {
                            if a.is_some() && a == b {
                                a
                            } else {
                                None
                            }
                        }
                        (true, false) => a,
                        (false, true) => b,
                        (false, false) => None,
                    };
                    match (page, expect.as_mut()) {
                        (Some(p), Some(e)) => e.push(p),
                        _ => expect = None,
                    }
                }
                match (got, expect) {
                    (Ok(pieces), Some(pages)) => {
                        hits += 1;
                        // expand pieces into pages and compare exactly
                        let mut exp = Vec::new();
                        for p in &pieces {
                            assert_eq!(p.va % PAGE, 0);
                            // the map call a piece starts in holds its start, at the same offset
                            assert!(
                                p.origin.base <= p.va && p.va < p.origin.base + p.origin.length,
                                "{p:?}"
                            );
                            assert_eq!(p.origin.offset + (p.va - p.origin.base), p.offset, "{p:?}");
                            for i in 0..p.len / PAGE {
                                exp.push((p.mem, p.offset + i * PAGE));
                            }
                        }
                        assert_eq!(exp, pages, "lookup {base:#x}+{len:#x}");
                        // merged pieces never continue one another
                        for w in pieces.windows(2) {
                            assert!(
                                !(w[0].mem == w[1].mem && w[0].offset + w[0].len == w[1].offset)
                            );
                        }
                    }
                    (Err(_), None) => {}
                    (got, exp) => panic!("lookup {base:#x}+{len:#x}: map {got:?} model {exp:?}"),
                }
            }
        }
    }
    assert!(hits > 1000, "the property test must exercise hits, got {hits}");
    // the per-memory index always counts exactly the entries there are
    let mut counted: HashMap<MemRef, u32> = HashMap::default();
    for (_, _, _, m, _) in v.dump() {
        *counted.entry(m).or_default() += 1;
    }
    let known: HashMap<MemRef, u32> = v.mems.iter().map(|(m, i)| (m, i.entries)).collect();
    assert_eq!(counted, known, "memory never allocated is known exactly while mapped");
    // origins are kept only for entries cut out of a larger call, and only while they exist
    for g in v.per_gpu.values() {
        for (s, o) in g.cuts() {
            let e = g.get(*s).expect("an origin without its entry");
            assert_ne!(*o, e.whole(*s));
        }
    }
}

#[test]
fn ranges_mapped_whole_need_no_record_and_come_back_when_unmapped() {
    let mut v = VaMap::new();
    v.create_range(0x20_0000, 0x20_0000);
    assert!(v.is_gpu_va(0x30_0000), "reserved, not mapped: GPU VA all the same");
    assert_eq!(v.lookup(0x30_0000, 0x1000), Err(Miss::Unmapped { at: 0x30_0000 }));
    v.map(G0, 0x20_0000, 0x20_0000, m(1), 0);
    assert!(v.ranges.is_empty(), "a range mapped whole is claimed by its entry");
    assert_eq!(v.range_at(0x20_0000), Some(0x20_0000));
    // the same range mapped on a second GPU: one claim is enough
    v.map(G1, 0x20_0000, 0x20_0000, m(1), 0);
    v.unmap(G0, 0x20_0000, 0x20_0000);
    assert_eq!(
        v.ranges.get(&0x20_0000),
        Some(&0x20_0000),
        "the claim's entry went: the range is recorded again"
    );
    v.unmap(G1, 0x20_0000, 0x20_0000);
    assert!(v.is_gpu_va(0x3f_f000) && !v.contains(0x3f_f000));
    assert_eq!(v.lookup(0x20_0000, 0x1000), Err(Miss::Freed { at: 0x20_0000 }));
    // a cut of a claiming entry gives the range back whole
    v.map(G0, 0x20_0000, 0x20_0000, m(2), 0);
    assert!(v.ranges.is_empty());
    v.unmap(G0, 0x28_0000, 0x1_0000);
    assert_eq!(v.range_at(0x20_0000), Some(0x20_0000));
    assert_eq!(v.free_extent(0x20_0000, None), 0x20_0000);
    assert!(v.free_range(0x20_0000, None));
    assert!(!v.is_gpu_va(0x20_0000) && v.entries() == 0 && v.ranges.is_empty());
    // a range created over one this map still holds: the old one was freed unseen, and goes
    v.create_range(0x40_0000, 0x10_0000);
    v.map(G0, 0x40_0000, 0x10_0000, m(3), 0);
    v.create_range(0x48_0000, 0x10_0000);
    assert_eq!(v.entries(), 0, "{:?}", v.dump());
    assert!(!v.is_gpu_va(0x40_0000) && v.is_gpu_va(0x50_0000));
    assert_eq!(v.free_extent(0x40_0000, None), 0);
}

/// Ranges against a model: UVM's rules (ranges never overlap, maps only inside one), random
/// creates, maps (whole and partial, on two GPUs), unmaps, frees; GPU VA is exactly what the
/// model has reserved or mapped, and every range's extent is known.
#[test]
fn property_ranges_against_a_model() {
    let gpus = [G0, G1];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut v = VaMap::new();
    let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
    let mut mapped: HashMap<(u8, u64), ()> = HashMap::default();
    const SPACE: u64 = 256;
    for _ in 0..50_000 {
        let base = rng.below(SPACE) * PAGE;
        let len = (1 + rng.below(16)) * PAGE;
        let g = rng.below(2) as u8;
        match rng.below(6) {
            0 => {
                let free = !ranges.iter().any(|(&b, &l)| b < base + len && base < b + l);
                if free {
                    v.create_range(base, len);
                    ranges.insert(base, len);
                }
            }
            1 | 2 => {
                // inside a range: the whole range or a piece of it
                let Some((&b, &l)) =
                    ranges.range(..=base).next_back().filter(|(&b, &l)| base < b + l)
                else {
                    continue;
                };
                let (mb, ml) =
                    if rng.below(2) == 0 { (b, l) } else { (base, len.min(b + l - base)) };
                v.map(gpus[g as usize], mb, ml, m(1 + rng.below(4) as u32), 0);
                for p in mb / PAGE..(mb + ml) / PAGE {
                    mapped.insert((g, p), ());
                }
            }
            3 => {
                v.unmap(gpus[g as usize], base, len);
                for p in base / PAGE..(base + len) / PAGE {
                    mapped.remove(&(g, p));
                }
            }
            4 => {
                let Some((&b, &l)) = ranges.range(..=base).next_back() else { continue };
                assert!(v.free_range(b, None), "range at {b:#x} known");
                ranges.remove(&b);
                for p in b / PAGE..(b + l) / PAGE {
                    mapped.remove(&(0, p));
                    mapped.remove(&(1, p));
                }
            }
            _ => {
                for (&b, &l) in &ranges {
                    assert_eq!(v.range_at(b), Some(l));
                    assert_eq!(v.free_extent(b, None), l);
                }
                for p in 0..SPACE + 16 {
                    let a = p * PAGE;
                    let want = ranges.range(..=a).next_back().is_some_and(|(&b, &l)| a < b + l)
                        || mapped.contains_key(&(0, p))
                        || mapped.contains_key(&(1, p));
                    assert_eq!(v.is_gpu_va(a), want, "{a:#x}");
                }
            }
        }
    }
    // nothing is recorded twice: a claimed range has no record of its own
    for (&b, _) in v.ranges.iter() {
        assert!(v.per_gpu.values().all(|m| !m.get(b).is_some_and(|e| e.claims_range())));
    }
}

#[test]
fn memory_records_live_with_their_allocation_or_their_mappings() {
    let mut v = VaMap::new();
    v.add_memory(m(1), 0xd, 0x40);
    assert_eq!(v.memory(m(1)).map(|i| (i.parent, i.class)), Some((0xd, 0x40)));
    v.map(G0, 0x10_0000, 0x1_0000, m(1), 0);
    v.unmap(G0, 0x10_0000, 0x1_0000);
    assert!(v.memory(m(1)).is_some(), "unmapped memory stays until it is freed");
    // memory whose allocation was not seen: known while mapped, forgotten with its last entry
    v.map(G0, 0x20_0000, 0x1_0000, m(2), 0);
    v.map(G1, 0x20_0000, 0x1_0000, m(2), 0);
    assert!(v.knows(m(2)) && v.memory(m(2)).is_none());
    v.unmap(G0, 0x20_0000, 0x1_0000);
    assert!(v.knows(m(2)));
    v.unmap_all(0x20_0000, 0x1_0000);
    assert!(!v.knows(m(2)));
    // a handle allocated again without the free seen: its old mappings go
    v.map(G0, 0x30_0000, 0x1_0000, m(1), 0);
    v.add_memory(m(1), 0xd, 0x40);
    assert_eq!(v.lookup(0x30_0000, 0x1000), Err(Miss::Freed { at: 0x30_0000 }));
    // freeing mapped memory takes its entries and its record
    v.map(G0, 0x40_0000, 0x1_0000, m(1), 0);
    assert_eq!(v.remove_memory(m(1)), 1);
    assert!(!v.knows(m(1)) && v.entries() == 0 && v.memories() == 0);
    // a client's free forgets all of its memory, mapped or not
    v.add_memory(m(3), 0xd, 0x40);
    v.add_memory(m(4), 0xd, 0x40);
    v.map(G0, 0x50_0000, 0x1_0000, m(4), 0);
    v.add_memory(MemRef { client: 7, memory: 1 }, 0xd, 0x40);
    assert_eq!(v.remove_client(m(3).client), 1);
    assert_eq!(v.memories(), 1);
    assert_eq!(v.memory_under(7, 0xd), vec![MemRef { client: 7, memory: 1 }]);
}

#[test]
fn cells_agree_with_the_tree_at_granule_scale() {
    // Entries of 512 KiB to 4 MiB over 64 MiB that straddles a leaf of cells, mapped, cut, freed
    // and reused, memory allocated again under them: every point lookup equals the tree's
    // answer, the cells' books stay right, and entries know their memory's allocation.
    const UNIT: u64 = 0x8_0000;
    const ORIGIN: u64 = (1 << 27) - (32 << 20);
    let gpus = [G0, G1];
    let mut rng = Rng(0x51ed_2701_3c4f_9a8b);
    let mut v = VaMap::new();
    let mut fast = 0u64;
    for op in 0..20_000u64 {
        let g = gpus[rng.below(2) as usize];
        let base = ORIGIN + rng.below(128) * UNIT;
        let len = (1 + rng.below(8)) * UNIT;
        match rng.below(6) {
            0..=2 => v.map(g, base, len, m(1 + rng.below(9) as u32), rng.below(4) * UNIT),
            3 => drop(v.unmap(g, base, len)),
            4 => drop(v.free_range(base, Some(len))),
            5 if rng.below(2) == 0 => drop(v.remove_memory(m(1 + rng.below(9) as u32))),
            _ => v.add_memory(
                m(1 + rng.below(9) as u32),
                0xd0 + rng.below(2) as u32,
                [0x40, 0x3e][rng.below(2) as usize],
            ),
        }
        if op % 97 == 0 {
            for gm in v.per_gpu.values() {
                gm.check_cells();
                // what an entry remembers of its memory's allocation is what the table says now
                for (_, e) in gm.iter() {
                    let now =
                        v.mems.get(e.mem).map(|i| Allocation { parent: i.parent, class: i.class });
                    assert_eq!(Some(v.mems.allocation(e.alloc(), e.mem)), now, "{:?}", e.mem);
                }
                for a in (ORIGIN - UNIT..ORIGIN + 140 * UNIT).step_by(0x1_0000) {
                    let tree = gm.range(..=a).next_back().filter(|(_, e)| a < e.end);
                    assert_eq!(gm.at(a), tree, "at({a:#x})");
                    fast += u64::from(tree.is_some());
                }
            }
        }
    }
    assert!(fast > 10_000, "the lookups must find entries, got {fast}");
}

#[test]
fn an_entry_of_any_width_costs_bounded_work_and_is_found() {
    // UVM refuses such lengths, but the map takes what the decoder gives: an entry of 2^50 bytes
    // gets no hints beyond its home cell (bounded time and memory) and is found through the tree.
    let mut v = VaMap::new();
    let base = 0x1000_0000_0000;
    v.map(G0, base, 1 << 50, m(1), 0);
    v.map(G0, base + (1 << 50), 0x20_0000, m(2), 0);
    let g = &v.per_gpu[&G0];
    g.check_cells();
    assert_eq!(g.at(base + (1 << 49)).map(|(s, e)| (s, e.mem)), Some((base, m(1))));
    assert_eq!(v.lookup_one(base + (1 << 50) - 0x1000, 0x1000).map(|p| p.mem), Some(m(1)));
    assert_eq!(v.lookup_one(base + (1 << 50), 0x1000).map(|p| p.mem), Some(m(2)));
    v.unmap(G0, base, 1 << 50);
    v.per_gpu[&G0].check_cells();
    assert!(!v.contains(base + (1 << 49)));
}

#[test]
fn a_map_whose_offsets_would_pass_the_limit_is_kept_out() {
    // offset + length beyond any RM memory: a later cut could not carry its offset; not kept
    let mut v = VaMap::new();
    v.map(G0, 0x10000, 1 << 41, m(1), (1 << 63) - (1 << 40));
    assert!(!v.contains(0x10000 + (1 << 40)));
    v.unmap(G0, 0x10000, 1 << 40);
    assert_eq!(v.range_at(0x10000 + (1 << 40)), None);
    assert_eq!(v.entries(), 0);
}

#[test]
fn a_granule_aligned_entry_is_found_in_its_own_cell_and_every_lookup_equals_the_trees() {
    // Entries of a quarter granule to three granules, some granule-aligned and some not, at
    // random over 96 granules that straddle a leaf and a middle table, plus a few at and above
    // 2^48 and a few wider than MAX_SPAN: inserted, replaced and removed against a model that
    // keeps every entry whole (its offset is a version, so an old one would show). Every point
    // lookup, `get` and `range` equal the model's, the cells' books stay right (hints complete),
    // and an entry that starts a granule nobody else starts in is found without the tree from
    // any granule it covers whole.
    use super::entry::Entry;
    use super::gpu::GpuMap;
    const GR: u64 = 1 << granule::SHIFT;
    const ORIGIN: u64 = (1 << 37) - 48 * GR;
    const HIGH: u64 = (1 << 48) - 2 * GR;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut g = GpuMap::default();
    let mut model: BTreeMap<u64, Entry> = BTreeMap::new();
    let (mut fast, mut slow_allowed) = (0u64, 0u64);
    for op in 0..30_000u64 {
        let (start, len) = match rng.below(40) {
            0 => (HIGH + rng.below(16) * (GR / 2), (1 + rng.below(6)) * (GR / 2)),
            1 => (
                ORIGIN + 200 * GR + rng.below(4) * GR * (granule::MAX_SPAN + 2),
                (granule::MAX_SPAN + rng.below(3)) * GR,
            ),
            _ => {
                let quarter = rng.below(96 * 4);
                let start =
                    ORIGIN + quarter * (GR / 4) + if rng.below(3) == 0 { 0x1000 } else { 0 };
                (start, (1 + rng.below(12)) * (GR / 4))
            }
        };
        if rng.below(5) < 3 {
            let overlaps =
                model.range(..start + len).next_back().is_some_and(|(_, e)| e.end > start);
            if !overlaps
                || model.contains_key(&start)
                    && model.range(start + 1..start + len).next().is_none()
            {
                let e =
                    Entry::new(start + len, op << 12, m(1 + rng.below(50) as u32), AllocId::UNSEEN);
                g.insert(start, e, e.whole(start));
                model.insert(start, e);
            }
        } else if let Some((&s, _)) = model.range(start..).next() {
            assert_eq!(g.remove(s).map(|(e, _)| e), model.remove(&s));
        }
        if op % 101 == 0 {
            g.check_cells();
            assert!(
                g.iter().map(|(s, e)| (s, *e)).eq(model.iter().map(|(&s, &e)| (s, e))),
                "every entry, whole, in order"
            );
            const WIDE: u64 = ORIGIN + 200 * GR;
            let probes = (ORIGIN - GR..ORIGIN + 100 * GR)
                .step_by(0x4_0000)
                .chain((HIGH - GR..HIGH + 12 * GR).step_by(0x8_0000))
                .chain(
                    (WIDE..WIDE + 4 * (granule::MAX_SPAN + 3) * GR)
                        .step_by((granule::MAX_SPAN / 8 * GR + 0x1000) as usize),
                );
            for a in probes {
                let want =
                    model.range(..=a).next_back().filter(|(_, e)| a < e.end).map(|(&s, &e)| (s, e));
                assert_eq!(g.at(a).map(|(s, e)| (s, *e)), want, "at({a:#x})");
                assert_eq!(
                    g.range(a..).next().map(|(s, e)| (s, *e)),
                    model.range(a..).next().map(|(&s, &e)| (s, e))
                );
                let Some((s, e)) = want else { continue };
                assert_eq!(g.get(s), Some(&e));
                let home = s & !(GR - 1);
                let alone = model.range(home..home + GR).count() == 1;
                let whole = granule::of(a) == granule::of(s)
                    || a & !(GR - 1) >= s && (a & !(GR - 1)) + GR <= e.end;
                if s % GR == 0
                    && alone
                    && whole
                    && a < 1 << 48
                    && e.end - s <= granule::MAX_SPAN * GR
                {
                    assert_eq!(
                        g.in_cells(a),
                        Some(s),
                        "{s:#x} is found from {a:#x} without the tree"
                    );
                    fast += 1;
                } else {
                    slow_allowed += 1;
                }
            }
        }
    }
    assert!(
        fast > 1_000 && slow_allowed > 1_000,
        "both kinds looked up: {fast} through the cells, {slow_allowed} other"
    );
}

#[test]
fn an_entry_that_waited_in_overflow_moves_home_when_the_granule_frees() {
    use super::entry::Entry;
    use super::gpu::GpuMap;
    const GR: u64 = 1 << granule::SHIFT;
    let base = 0x7f00_0000_0000u64;
    let mut g = GpuMap::default();
    let (a, b) = (
        Entry::new(base + GR / 2, 0, m(1), AllocId::UNSEEN),
        Entry::new(base + GR, 0, m(2), AllocId::UNSEEN),
    );
    g.insert(base, a, a.whole(base));
    g.insert(base + GR / 2, b, b.whole(base + GR / 2));
    g.check_cells();
    assert_eq!(g.in_cells(base + GR / 2), None, "the granule's cell is the first entry's");
    assert_eq!(g.at(base + GR / 2).map(|(s, _)| s), Some(base + GR / 2), "found through the tree");
    g.remove(base);
    g.check_cells();
    assert_eq!(g.in_cells(base + GR / 2), Some(base + GR / 2), "moved home");
    // above the cells' reach (2^48) entries live in overflow and are found through the tree
    let high = 1u64 << 50;
    let c = Entry::new(high + GR, 0, m(3), AllocId::UNSEEN);
    g.insert(high, c, c.whole(high));
    g.check_cells();
    assert_eq!(g.at(high + 5).map(|(_, e)| e.mem), Some(m(3)));
    assert_eq!(g.in_cells(high + 5), None);
    assert_eq!(g.remove(high).map(|(e, _)| e.mem), Some(m(3)));
    g.check_cells();
}
