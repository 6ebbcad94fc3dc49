//! An allocation's record ends exactly when its memory ends, by every path the driver and CUDA
//! have, and a record whose end cannot be seen is not trusted: CUDA's own memory mapped where a
//! record outlived its memory is never taken for the program's.

use super::{ContextTag, MemRef, VaMap};

const M: u64 = 1 << 20;
const A: [u8; 16] = [0xa0; 16];
const B: [u8; 16] = [0xb1; 16];
const CHUNK: MemRef = MemRef { client: 1, memory: 0x10 };
const CUDAS: MemRef = MemRef { client: 1, memory: 0x20 };

/// A 4 KiB allocation carved from CUDA's 2 MiB chunk at 0 (its record reaches the chunk's end).
fn carved(gpus: &[[u8; 16]]) -> VaMap {
    let mut m = VaMap::default();
    for &g in gpus {
        m.map(g, 0, 2 * M, CHUNK, 0);
    }
    m.own(0, 0x1000);
    assert_eq!(m.first_unowned(0, 2 * M), None, "the chunk counts as the allocation's");
    m
}

#[test]
fn an_rm_free_without_an_unmap_ends_the_record() {
    let mut m = carved(&[A]);
    m.remove_memory(CHUNK);
    m.map(A, 0, 2 * M, CUDAS, 0);
    assert_eq!(m.first_unowned(0, 2 * M), Some(0), "CUDA's memory where the freed chunk was");
    assert_eq!(m.first_unowned(0, 0x1000), Some(0));
}

#[test]
fn a_chunk_unmapped_one_gpu_at_a_time_with_cuda_memory_between_ends_the_record() {
    let mut m = carved(&[A, B]);
    m.unmap(A, 0, 2 * M);
    assert_eq!(m.first_unowned(0, 0x1000), None, "B still maps the chunk: the allocation lives");
    m.map(A, 0, 2 * M, CUDAS, 0);
    m.unmap(B, 0, 2 * M);
    assert_eq!(m.first_unowned(0, 2 * M), Some(0), "CUDA's memory on A, nothing on B");
    // the same with the allocation exactly one mapping (a mark on each GPU's entry)
    let mut w = VaMap::default();
    w.map(A, 0, 2 * M, CHUNK, 0);
    w.map(B, 0, 2 * M, CHUNK, 0);
    w.own(0, 2 * M);
    w.unmap(A, 0, 2 * M);
    w.map(A, 0, 2 * M, CUDAS, 0);
    assert_eq!(w.first_unowned(0, 2 * M), Some(0), "B's mark went when other memory came on A");
}

#[test]
fn a_peer_mapping_of_the_same_memory_keeps_the_record() {
    let mut m = carved(&[A]);
    m.map(B, 0, 2 * M, CHUNK, 0);
    assert_eq!(
        m.first_unowned(0, 2 * M),
        None,
        "the same memory on another GPU: still the allocation"
    );
}

/// Allocations whose context is unknown: a context's end on a GPU ends those at VA it maps.
#[test]
fn a_context_end_ends_the_unknown_contexts_records_of_its_gpu_and_only_those() {
    let mut m = carved(&[A]);
    m.map(B, 8 * M, 2 * M, MemRef { client: 1, memory: 0x30 }, 0);
    m.own(8 * M, 0x1000);
    m.map(A, 4 * M, 2 * M, MemRef { client: 1, memory: 0x40 }, 0);
    m.own(4 * M, 2 * M);
    m.map(B, 4 * M, 2 * M, MemRef { client: 1, memory: 0x40 }, 0);
    m.end_owned(&|_| false, Some(A));
    assert_eq!(m.first_unowned(0, 0x1000), Some(0), "A's carved allocation");
    assert_eq!(m.first_unowned(4 * M, 6 * M), Some(4 * M), "A's whole one, peer-mapped on B too");
    assert_eq!(m.first_unowned(8 * M, 8 * M + 0x1000), None, "B's own allocation lives");
    m.end_owned(&|_| false, None);
    assert_eq!(m.first_unowned(8 * M, 8 * M + 0x1000), Some(8 * M), "an unknown GPU: every record");
}

/// An import (an IPC handle, a pool pointer) is the program's exactly: the exporter's chunk it
/// sits in is not, while an allocation the program carved itself counts to its chunk's end.
#[test]
fn an_import_never_reaches_the_exporters_other_blocks() {
    let mut m = VaMap::default();
    m.map(A, 0, 2 * M, CHUNK, 0);
    m.own_import(0x1000, 0x1000);
    assert_eq!(m.first_unowned(0x1000, 0x2000), None);
    assert_eq!(m.first_unowned(0x1000, 2 * M), Some(0x2000), "the exporter's other blocks");
    m.own(0x8000, 0x1000);
    assert_eq!(
        m.first_unowned(0x8000, 2 * M),
        None,
        "carved here: to the chunk's end, as libcuda counts it"
    );
}

const P_A: ContextTag = ContextTag::Of(0xc0);
const P_B: ContextTag = ContextTag::Of(0xc1);
const LIB: ContextTag = ContextTag::Of(0xc102);

/// The primary context's allocations on A (carved, and one whole mapping), a library context's
/// on A, B's primary context's peer-mapped on A, VMM memory on A, and one of unknown context on
/// B.
fn of_contexts() -> VaMap {
    let mut m = VaMap::default();
    m.map(A, 0, 2 * M, CHUNK, 0);
    m.own_in(0, 0x1000, P_A);
    m.map(A, 4 * M, 2 * M, MemRef { client: 1, memory: 0x40 }, 0);
    m.own_in(4 * M, 2 * M, P_A);
    m.map(A, 8 * M, 2 * M, MemRef { client: 1, memory: 0x50 }, 0);
    m.own_in(8 * M, 0x1000, LIB);
    let peer = MemRef { client: 1, memory: 0x60 };
    m.map(B, 12 * M, 2 * M, peer, 0);
    m.map(A, 12 * M, 2 * M, peer, 0);
    m.own_in(12 * M, 2 * M, P_B);
    m.map(A, 16 * M, 2 * M, MemRef { client: 1, memory: 0x70 }, 0);
    m.own_import_in(16 * M, 2 * M, ContextTag::NoContext);
    m.own_in(16 * M, 2 * M, ContextTag::NoContext);
    m.map(B, 20 * M, 2 * M, MemRef { client: 1, memory: 0x80 }, 0);
    m.own(20 * M, 0x1000);
    m
}

fn lives(m: &VaMap, base: u64, len: u64) -> bool {
    m.first_unowned(base, base + len).is_none()
}

#[test]
fn a_destroy_ends_exactly_the_allocations_made_in_that_context() {
    let mut m = of_contexts();
    m.end_owned(&|c| c == 0xc102, None);
    assert!(!lives(&m, 8 * M, 0x1000), "the library context's allocation");
    assert!(lives(&m, 0, 0x1000) && lives(&m, 4 * M, 2 * M), "the primary context's live on");
    assert!(lives(&m, 12 * M, 2 * M), "B's, peer-mapped on A");
    assert!(lives(&m, 16 * M, 2 * M), "VMM memory is no context's");
    assert!(!lives(&m, 20 * M, 0x1000), "an unknown context's: any context's end (fail safe)");
    assert_eq!(m.context_at(8 * M), P_A, "no tag kept for what ended");
}

#[test]
fn a_primary_end_on_one_gpu_keeps_another_gpus_peer_mapped_allocation() {
    let mut m = of_contexts();
    m.end_owned(&|c| c == 0xc0, Some(A));
    assert!(!lives(&m, 0, 0x1000) && !lives(&m, 4 * M, 2 * M), "A's primary context's");
    assert!(lives(&m, 12 * M, 2 * M), "B's allocation mapped on A too");
    assert!(lives(&m, 8 * M, 0x1000) && lives(&m, 16 * M, 2 * M));
    assert!(lives(&m, 20 * M, 0x1000), "an unknown context's on B: not A's");
    m.end_owned(&|c| c == 0xc1, Some(B));
    assert!(!lives(&m, 12 * M, 2 * M) && !lives(&m, 20 * M, 0x1000));
}

/// The pieces of an allocation that a partial unmap leaves keep its context; memory allocated
/// again where an ended one lay goes with its own context.
#[test]
fn an_allocations_context_follows_its_pieces_and_not_its_va() {
    let mut m = of_contexts();
    m.unmap(A, 8 * M, 0x800);
    m.own_in(8 * M + 0x800, 0x800, LIB);
    m.disown(8 * M + 0xc00, 8 * M + 0xd00);
    assert_eq!((m.context_at(8 * M + 0x800), m.context_at(8 * M + 0xe00)), (LIB, LIB));
    m.end_owned(&|c| c == 0xc102, None);
    assert!(!lives(&m, 8 * M + 0x800, 0x400) && !lives(&m, 8 * M + 0xd00, 0x300));
    m.own_in(8 * M, 0x1000, P_A);
    m.end_owned(&|c| c == 0xc102, Some(B));
    assert!(lives(&m, 8 * M, 0x1000), "the primary context's allocation at that VA now");
    assert!(m.disown_at(8 * M));
    m.own_in(8 * M, 0x2000, LIB);
    assert!(m.disown_at(8 * M));
    assert_eq!(m.context_at(8 * M), P_A, "a free takes its context's tag: the usual one reads");
    m.own(8 * M, 0x1000);
    assert_eq!(m.context_at(8 * M), ContextTag::Unknown);
}

/// The driver freeing other memory that another GPU maps at an allocation's VA leaves the
/// allocation, and its context with it (the model test found a context's end missing it).
#[test]
fn another_gpus_memory_freed_under_an_allocation_keeps_its_context() {
    let mut m = VaMap::default();
    m.map(A, 8 * M, 2 * M, CHUNK, 0);
    m.own_in(8 * M, 2 * M, P_A);
    let other = MemRef { client: 1, memory: 0x90 };
    m.map(B, 0, 2 * M, other, 0);
    m.map(A, 0, 2 * M, CUDAS, 0);
    m.own_in(0, 2 * M, LIB);
    m.remove_memory(other);
    assert!(lives(&m, 0, 2 * M));
    assert_eq!(m.context_at(0), LIB);
    m.end_owned(&|c| c == 0xc102, None);
    assert!(!lives(&m, 0, 2 * M), "the library context's allocation ended with it");
    assert!(lives(&m, 8 * M, 2 * M));
}

/// The registration decision's shortcut (src/registrar): where `lookup_one_owned` finds one entry
/// covering a range and says the program owns it, `first_unowned` of that range is `None`; and
/// its piece is `lookup_one`'s. Through maps, unmaps, allocations carved or whole, frees, memory
/// freed under them and context ends, in any order, on two GPUs.
#[test]
fn an_entry_marked_the_programs_holds_no_unowned_byte() {
    use crate::testkit::{model_ops, Rng};
    let mut rng = Rng(0x0dd_ba11_5eed);
    let mut m = VaMap::default();
    let (gpus, page) = ([A, B], 0x1000u64);
    let (mut marked, mut checked) = (0u64, 0u64);
    for _ in 0..model_ops(100_000) {
        let g = gpus[rng.below(2) as usize];
        let base = rng.below(48) * 64 * page;
        let len = (1 + rng.below(4 * 64)) * page;
        let mem = MemRef { client: 1, memory: 0x10 + rng.below(6) as u32 };
        match rng.below(12) {
            0..=2 => m.map(g, base, len, mem, rng.below(8) * page),
            3 => drop(m.unmap(g, base, len)),
            4 => m.own_in(base, len, ContextTag::Of(0xc0 + rng.below(2))),
            5 => {
                // an allocation as cuMemAlloc makes one: mapped, then the program's, exactly
                m.map(g, base, len, mem, 0);
                m.own_in(base, len, ContextTag::Of(0xc0 + rng.below(2)));
            }
            6 => m.own(base, page),
            7 => drop(m.disown_at(base)),
            8 => m.disown(base, base + len),
            9 => drop(m.remove_memory(mem)),
            10 => m.end_owned(&|c| c == 0xc0, if rng.below(2) == 0 { Some(g) } else { None }),
            _ => {
                // a registration's range: a few pages somewhere in the first 64 of `base`
                let (at, n) = (base + rng.below(64) * page, (1 + rng.below(8)) * page);
                let got = m.lookup_one_owned(at, n);
                assert_eq!(got.map(|(p, _)| p), m.lookup_one(at, n));
                if let Some((_, true)) = got {
                    marked += 1;
                    assert_eq!(m.first_unowned(at, at + n), None, "{at:#x}+{n:#x}");
                }
                checked += 1;
            }
        }
    }
    assert!(marked > checked / 50, "the case was met: {marked} of {checked}");
}
