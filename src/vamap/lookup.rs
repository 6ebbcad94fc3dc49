//! Exact lookups: which memory, at which offsets, covers a VA range, on every GPU that maps it.
#![forbid(unsafe_code)]

use super::gpu::{GpuMap, Gpus};
use super::mems::MemTable;
use super::types::{MemRef, Miss, Piece};
use crate::abi::Uuid;

/// The memory objects mapped anywhere in `[base, end)`, on any GPU, each once.
pub fn memory_in(gpus: &Gpus, base: u64, end: u64) -> Vec<MemRef> {
    let mut out: Vec<MemRef> = Vec::new();
    for m in gpus.values() {
        let first = m.at(base).map(|(s, _)| s).unwrap_or(base);
        for (_, e) in m.range(first..end) {
            if !out.contains(&e.mem) {
                out.push(e.mem);
            }
        }
    }
    out
}

/// Whether memory is mapped in `[base, end)` and all of it is system memory, by the class each
/// entry carries (no read of the memory table: a GPU registration asks this first).
pub fn only_sysmem_in(gpus: &Gpus, mems: &MemTable, base: u64, end: u64) -> bool {
    let mut any = false;
    for m in gpus.values() {
        let first = m.at(base).map(|(s, _)| s).unwrap_or(base);
        for (_, e) in m.range(first..end) {
            if !mems.allocation(e.alloc(), e.mem).class().is_some_and(crate::abi::class::is_sysmem)
            {
                return false;
            }
            any = true;
        }
    }
    any
}

/// Whether some GPU maps `addr`.
pub fn contains(gpus: &Gpus, addr: u64) -> bool {
    gpus.values().any(|m| m.at(addr).is_some())
}

/// The exact cover of `[addr, addr+len)` on one GPU, merged where consecutive entries
/// continue the same memory; or the first hole.
fn cover(g: &GpuMap, mems: &MemTable, addr: u64, end: u64) -> Result<Vec<Piece>, u64> {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut at = addr;
    let mut cursor = g.at(addr).map(|(s, _)| s).unwrap_or(addr);
    while at < end {
        let Some((s, e)) = g.range(cursor..).next() else { return Err(at) };
        if s > at {
            return Err(at);
        }
        let piece_end = e.end.min(end);
        let off = e.offset() + (at - s);
        match pieces.last_mut() {
            Some(p) if p.mem == e.mem && p.offset + p.len == off => p.len += piece_end - at,
            _ => pieces.push(Piece {
                va: at,
                len: piece_end - at,
                mem: e.mem,
                offset: off,
                origin: g.origin(s, e),
                alloc: mems.allocation(e.alloc(), e.mem),
            }),
        }
        at = piece_end;
        cursor = e.end;
    }
    Ok(pieces)
}

/// Exact lookup: the pieces that cover `[addr, addr+len)` on every GPU that maps any of it
/// (all such GPUs must agree), or why not (`miss_at`: the miss a hole at an address is).
pub fn lookup(
    gpus: &Gpus,
    mems: &MemTable,
    addr: u64,
    len: u64,
    miss_at: impl Fn(u64) -> Miss,
) -> Result<Vec<Piece>, Miss> {
    if len == 0 {
        return Err(Miss::Empty);
    }
    let end = addr.checked_add(len).ok_or(Miss::Overflow)?;
    if let Some(p) = lookup_one(gpus, mems, addr, len) {
        return Ok(vec![p]);
    }
    let mut answer: Option<Vec<Piece>> = None;
    let mut first_hole: Option<u64> = None;
    // Every GPU that maps any of the range must give the same answer, so order does not matter.
    for m in gpus.values() {
        let touches = m.range(..end).next_back().is_some_and(|(_, e)| e.end > addr);
        if !touches {
            continue;
        }
        match cover(m, mems, addr, end) {
            Ok(p) => match &answer {
                None => answer = Some(p),
                Some(a) if same_backing(a, &p) => {}
                Some(_) => return Err(Miss::GpusDisagree { at: addr }),
            },
            Err(hole) => {
                first_hole = Some(first_hole.map_or(hole, |h: u64| h.min(hole)));
            }
        }
    }
    match (answer, first_hole) {
        (Some(_), Some(_)) => Err(Miss::GpusDisagree { at: addr }),
        (Some(p), None) => Ok(p),
        (None, Some(h)) => Err(miss_at(h)),
        (None, None) => Err(miss_at(addr)),
    }
}

/// The common case of [`lookup`] without an allocation: one GPU maps any of the range, and one
/// entry there covers all of it. `None`: not that case (ask `lookup`).
pub fn lookup_one(gpus: &Gpus, mems: &MemTable, addr: u64, len: u64) -> Option<Piece> {
    lookup_one_owned(gpus, mems, addr, len).map(|(p, _)| p)
}

/// [`lookup_one`], and whether the program owns the entry's bytes (the entry's own mark).
pub fn lookup_one_owned(
    gpus: &Gpus,
    mems: &MemTable,
    addr: u64,
    len: u64,
) -> Option<(Piece, bool)> {
    let end = addr.checked_add(len).filter(|_| len > 0)?;
    let mut found = None;
    for m in gpus.values() {
        // the entry at addr, through its cell; the ordered search only for a GPU without one there
        let (s, e) = match m.at(addr) {
            Some(hit) => hit,
            None if !m.none_in(addr, end)
                && m.range(..end).next_back().is_some_and(|(_, e)| e.end > addr) =>
            {
                return None
            }
            None => continue,
        };
        if found.is_some() || e.end < end {
            return None;
        }
        let piece = Piece {
            va: addr,
            len,
            mem: e.mem,
            offset: e.offset() + (addr - s),
            origin: m.origin(s, e),
            alloc: mems.allocation(e.alloc(), e.mem),
        };
        found = Some((piece, e.owned()));
    }
    found
}

/// All entries of all GPUs as (gpu, va, len, mem, offset), for diagnostics and tests.
pub fn dump(gpus: &Gpus) -> Vec<(Uuid, u64, u64, MemRef, u64)> {
    let mut v: Vec<_> = gpus
        .iter()
        .flat_map(|(g, m)| m.iter().map(move |(s, e)| (*g, s, e.end - s, e.mem, e.offset())))
        .collect();
    v.sort();
    v
}

fn same_backing(a: &[Piece], b: &[Piece]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.va == y.va && x.len == y.len && x.mem == y.mem && x.offset == y.offset)
}
