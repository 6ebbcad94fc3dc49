//! Which copy of a library a caller reaches. A process may hold two copies of libibverbs (the
//! system's, which NCCL `dlopen`s `RTLD_LOCAL`, and a wheel's renamed one, which NIXL's UCX links)
//! or of libmlx5; each copy's objects (its PDs, MRs, umems) are laid out by that copy and must
//! never be handed to the other. Without gdrshim, a call a library makes to `ibv_reg_mr` binds
//! to the first definition in the process's global scope and, where there is none, in that
//! library's own dependencies: its copy. gdrshim's exported hooks answer every caller, so they
//! ask the same: the global scope after gdrshim first ([`next::next`]), then the dependencies
//! of the object the call came from ([`for_caller`]). A call that reaches a copy through `dlsym`
//! on its handle is bound to that copy already (`hooks::slots`); a function it needs of the same
//! copy is looked up beside it ([`beside`]).

use super::next;
use core::ffi::{c_char, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
use gdrshim_common::elf;

/// One answer: callers in `[start, end)` (one loaded segment of an object; every address for an
/// answer of the global scope) reach `f`, as resolved in dlclose generation `generation`.
struct Answer {
    start: usize,
    end: usize,
    generation: u64,
    f: *mut c_void,
}

/// The answers of one hooked symbol, for a few callers (a process calls a verbs function from
/// one or two libraries). An answer, once published, is never changed or freed: a reader takes
/// it whole or not at all. Replaced ones (a full cache, a library reloaded) are not freed either:
/// a few dozen bytes each, bounded by how often a process loads libraries again.
pub struct Callers {
    answers: [AtomicPtr<Answer>; 4],
    next: AtomicUsize,
}

impl Callers {
    pub const fn new() -> Callers {
        Callers {
            answers: [const { AtomicPtr::new(core::ptr::null_mut()) }; 4],
            next: AtomicUsize::new(0),
        }
    }

    fn find(&self, caller: usize, generation: u64) -> Option<*mut c_void> {
        self.answers.iter().find_map(|slot| {
            let p = slot.load(Acquire);
            // SAFETY: a published answer is never changed or freed.
            let a = unsafe { p.as_ref() }?;
            (a.generation == generation && caller >= a.start && caller < a.end).then_some(a.f)
        })
    }

    fn publish(&self, a: Answer) {
        let i = self.next.fetch_add(1, Relaxed) % self.answers.len();
        self.answers[i].store(Box::into_raw(Box::new(a)), Release);
    }
}

impl Default for Callers {
    fn default() -> Self {
        Self::new()
    }
}

/// `name` of the library `lib` (a file-name prefix, `libibverbs.so`) as the caller at `caller`
/// (an address in its code) reaches it without gdrshim; null where there is none.
pub fn for_caller(
    callers: &Callers,
    caller: usize,
    name: &'static CStr,
    lib: &'static [u8],
) -> *mut c_void {
    let generation = next::DL_GENERATION.load(Acquire);
    if let Some(f) = callers.find(caller, generation) {
        return f;
    }
    // the hook's caller keeps its errno, whatever the lookups leave
    let e = crate::sys::errno();
    let global = next::next(name, false);
    let (a, f) = if !global.is_null() {
        (Answer { start: 0, end: usize::MAX, generation, f: global }, global)
    } else {
        match object_of(caller) {
            // gdrshim's own code is no caller whose copy can be told (its calls into a copy
            // are marked, `hooks::within`): nothing is remembered for its segment
            Some(o) if !next::in_this_copy(caller as *mut c_void) => {
                let f = in_dependencies(&o, name, lib)
                    .unwrap_or_else(|| next::in_loaded_library(lib, name));
                (Answer { start: o.segment.0, end: o.segment.1, generation, f }, f)
            }
            _ => {
                let f = next::in_loaded_library(lib, name);
                crate::sys::set_errno(e);
                return f;
            }
        }
    };
    crate::sys::set_errno(e);
    if !f.is_null() {
        callers.publish(a);
    }
    f
}

/// `name` in the same loaded object as `f` (another function of the copy `f` is of), remembered
/// in `callers` by `f`: null where that object has none.
pub fn beside(callers: &Callers, f: *mut c_void, name: &'static CStr) -> *mut c_void {
    let generation = next::DL_GENERATION.load(Acquire);
    let at = f as usize;
    if let Some(p) = callers.find(at, generation) {
        return p;
    }
    let e = crate::sys::errno();
    let p = elf::object_holding(at).map_or(0, |(base, _)| elf::definition_at(base, name.to_bytes()))
        as *mut c_void;
    crate::sys::set_errno(e);
    if !p.is_null() {
        callers.publish(Answer { start: at, end: at + 1, generation, f: p });
    }
    p
}

/// A loaded object: its load base, the segment that holds the address asked about, and the
/// names it needs (DT_NEEDED).
struct Object {
    base: usize,
    segment: (usize, usize),
    needed: Vec<Vec<u8>>,
    soname: Option<Vec<u8>>,
    file: Vec<u8>,
}

const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;
const DT_SONAME: i64 = 14;

/// The object `info` describes, as far as [`Object`] goes (`segment` the one holding `addr`, or
/// the whole span of its segments).
///
/// # Safety
/// `info` comes from `dl_iterate_phdr`.
unsafe fn describe(info: &libc::dl_phdr_info, addr: usize) -> Object {
    let base = info.dlpi_addr as usize;
    let (mut segment, mut dynamic) = ((usize::MAX, 0), 0usize);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let start = base.wrapping_add(ph.p_vaddr as usize);
        let end = start.wrapping_add(ph.p_memsz as usize);
        if ph.p_type == libc::PT_LOAD && addr >= start && addr < end {
            segment = (start, end);
        }
        if ph.p_type == libc::PT_DYNAMIC {
            dynamic = start;
        }
    }
    let (mut strtab, mut needed_at, mut soname_at) = (0usize, Vec::new(), None);
    let mut d = dynamic as *const [i64; 2];
    while !d.is_null() && dynamic != 0 {
        // SAFETY: the dynamic section is an array of (tag, value) ended by DT_NULL.
        let [tag, val] = unsafe { *d };
        match tag {
            0 => break,
            DT_NEEDED => needed_at.push(val as usize),
            DT_SONAME => soname_at = Some(val as usize),
            // ld.so relocates this entry in place on x86-64; an unrelocated one is base-relative
            DT_STRTAB => {
                strtab = if (val as usize) < base { val as usize + base } else { val as usize }
            }
            _ => {}
        }
        // SAFETY: still inside the array (DT_NULL not reached).
        d = unsafe { d.add(1) };
    }
    // SAFETY: offsets into the object's NUL-terminated string table.
    let string =
        |off: usize| unsafe { CStr::from_ptr((strtab + off) as *const c_char) }.to_bytes().to_vec();
    let (needed, soname) = if strtab == 0 {
        (Vec::new(), None)
    } else {
        (needed_at.into_iter().map(string).collect(), soname_at.map(string))
    };
    let file = if info.dlpi_name.is_null() {
        Vec::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by ld.so.
        let full = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        full.rsplit(|&c| c == b'/').next().unwrap_or_default().to_vec()
    };
    Object { base, segment, needed, soname, file }
}

/// Every loaded object, described (`addr`: the address whose segment [`Object::segment`] is).
fn objects(addr: usize) -> Vec<Object> {
    let mut out = Vec::new();
    elf::each_loaded_object(|info| {
        // SAFETY: info comes from dl_iterate_phdr.
        out.push(unsafe { describe(info, addr) });
        false
    });
    out
}

fn object_of(addr: usize) -> Option<Object> {
    objects(addr).into_iter().find(|o| o.segment.0 != usize::MAX)
}

/// `name` in the copy of `lib` among `o`'s dependencies, and theirs, breadth first (the order
/// of a local scope): the first that is `lib` and defines it.
fn in_dependencies(o: &Object, name: &'static CStr, lib: &[u8]) -> Option<*mut c_void> {
    let all = objects(0);
    let by_name = |n: &[u8]| all.iter().find(|x| x.soname.as_deref() == Some(n) || x.file == n);
    let mut queue: Vec<&[u8]> = o.needed.iter().map(Vec::as_slice).collect();
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut i = 0;
    // (a scope is a few dozen objects; the bound stops any loop)
    while i < queue.len() && i < 256 {
        let n = queue[i];
        i += 1;
        if seen.contains(&n) {
            continue;
        }
        seen.push(n);
        let Some(dep) = by_name(n) else { continue };
        if next::is_library(n, lib) || next::is_library(&dep.file, lib) {
            let f = elf::definition_at(dep.base, name.to_bytes());
            if f != 0 {
                return Some(f as *mut c_void);
            }
        }
        queue.extend(dep.needed.iter().map(Vec::as_slice));
    }
    None
}
