//! libc's own `dlsym` and `dlvsym`, found in its dynamic symbol table without calling `dlsym`,
//! and the loader's list of objects read without its lock.
//!
//! A library that defines `dlsym` itself cannot ask `dlsym` for the real one. The front (which
//! has no std) and the core both use it: core and libc only here.

use core::ffi::{c_char, c_int, c_void, CStr};

#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_val: u64,
}
const _: () = assert!(core::mem::size_of::<Elf64Dyn>() == 16);
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;

struct Search<'a> {
    /// File-name prefix of the object to search: libc first, then libdl (glibc < 2.34).
    object: &'static [u8],
    names: [&'a [u8]; 2],
    found: [usize; 2],
    /// The sizes of what was found (`st_size`).
    sizes: [usize; 2],
}

fn gnu_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 5381;
    for &c in name {
        h = h.wrapping_mul(33).wrapping_add(c as u32);
    }
    h
}

/// Looks `names` up in one loaded object's GNU hash table, taking only default-version
/// (not hidden) definitions.
///
/// # Safety
/// `info` must come from `dl_iterate_phdr`, which describes a mapped, relocated object.
unsafe fn lookup_in_object(info: &libc::dl_phdr_info, s: &mut Search<'_>) -> bool {
    let base = info.dlpi_addr as usize;
    let mut dynamic: *const Elf64Dyn = core::ptr::null();
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_DYNAMIC {
            dynamic = (base + ph.p_vaddr as usize) as *const Elf64Dyn;
        }
    }
    if dynamic.is_null() {
        return false;
    }
    let (mut symtab, mut strtab, mut gnuhash, mut versym) = (0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic;
    loop {
        // SAFETY: the dynamic section is an array terminated by DT_NULL.
        let e = unsafe { &*d };
        if e.d_tag == DT_NULL {
            break;
        }
        let v = e.d_val as usize;
        // ld.so relocates these entries in place on x86-64; take unrelocated ones relative to base.
        let v = if v < base { v + base } else { v };
        match e.d_tag {
            t if t == DT_SYMTAB => symtab = v,
            t if t == DT_STRTAB => strtab = v,
            0x6fff_fef5 => gnuhash = v, // DT_GNU_HASH
            0x6fff_fff0 => versym = v,  // DT_VERSYM
            _ => {}
        }
        // SAFETY: still inside the array (DT_NULL not reached).
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 || gnuhash == 0 {
        return false;
    }
    let h = gnuhash as *const u32;
    // SAFETY: the GNU hash header is 4 words, then bloom (u64 words), buckets, chains.
    let (nbuckets, symoffset, bloom_size) = unsafe { (*h, *h.add(1), *h.add(2)) };
    if nbuckets == 0 {
        return true;
    }
    // SAFETY: the buckets follow the 4-word header and the bloom words, inside the table.
    let buckets = unsafe { h.add(4).cast::<u64>().add(bloom_size as usize).cast::<u32>() };
    // SAFETY: the chains follow the nbuckets bucket words.
    let chains = unsafe { buckets.add(nbuckets as usize) };
    for (k, name) in s.names.iter().enumerate() {
        if s.found[k] != 0 {
            continue;
        }
        let hash = gnu_hash(name);
        // SAFETY: bucket index < nbuckets.
        let mut idx = unsafe { *buckets.add((hash % nbuckets) as usize) };
        if idx < symoffset {
            continue;
        }
        loop {
            // SAFETY: idx >= symoffset indexes the chain array and the symbol table.
            let ch = unsafe { *chains.add((idx - symoffset) as usize) };
            if (ch | 1) == (hash | 1) {
                // SAFETY: idx is a symbol index the hash table handed out.
                let sym = unsafe { &*(symtab as *const libc::Elf64_Sym).add(idx as usize) };
                // SAFETY: st_name is an offset into the NUL-terminated string table.
                let nm =
                    unsafe { CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char) };
                // SAFETY: DT_VERSYM has one u16 per symbol.
                let hidden = versym != 0
                    && unsafe { *(versym as *const u16).add(idx as usize) } & 0x8000 != 0;
                // (an executable's undefined function can have a value: its PLT entry)
                if nm.to_bytes() == *name && sym.st_value != 0 && sym.st_shndx != 0 && !hidden {
                    s.found[k] = base + sym.st_value as usize;
                    s.sizes[k] = sym.st_size as usize;
                    break;
                }
            }
            if ch & 1 != 0 {
                break;
            }
            idx += 1;
        }
    }
    true
}

/// Calls `visit` with each object in the loader's list, in its order, until `visit` answers
/// true. `dl_iterate_phdr` takes the loader's write lock only, not the lock `dlopen` holds while
/// constructors run.
pub fn each_loaded_object<F: FnMut(&libc::dl_phdr_info) -> bool>(mut visit: F) {
    unsafe extern "C" fn call<F: FnMut(&libc::dl_phdr_info) -> bool>(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and the `F` given to it below, alive for
        // the whole call.
        let (info, visit) = unsafe { (&*info, &mut *(data as *mut F)) };
        c_int::from(visit(info))
    }
    // SAFETY: the callback only hands what ld.so describes to `visit`.
    unsafe { libc::dl_iterate_phdr(Some(call::<F>), &mut visit as *mut F as *mut c_void) };
}

/// The object's file name, its path after the last '/' (`None`: the loader gave no name).
pub fn file_name(info: &libc::dl_phdr_info) -> Option<&[u8]> {
    if info.dlpi_name.is_null() {
        return None;
    }
    // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by ld.so.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    name.rsplit(|&c| c == b'/').next()
}

/// Looks `s`'s names up in every object whose file name starts with `s.object`, until both are
/// found.
fn search(s: &mut Search<'_>) {
    each_loaded_object(|info| {
        if file_name(info).is_some_and(|f| f.starts_with(s.object)) {
            // SAFETY: info comes from dl_iterate_phdr.
            unsafe { lookup_in_object(info, s) };
        }
        s.found[0] != 0 && s.found[1] != 0
    });
}

/// The addresses of libc's `dlsym` and `dlvsym` (0: not found), the default versions.
pub fn libc_dlsym_dlvsym() -> [usize; 2] {
    // libdl.so.2 of glibc >= 2.34 only forwards to libc: a forwarder would make glibc see it,
    // not our caller, as the caller of dlsym. So libc.so.6 first.
    let mut s =
        Search { object: b"libc.so.6", names: [b"dlsym", b"dlvsym"], found: [0, 0], sizes: [0, 0] };
    for object in [&b"libc.so.6"[..], b"libdl.so.2"] {
        s.object = object;
        search(&mut s);
        if s.found[0] != 0 && s.found[1] != 0 {
            break;
        }
    }
    s.found
}

/// The address of the first default-version definition of `name` in the loader's list of
/// objects (0: none): what `dlsym(RTLD_DEFAULT, name)` answers for the objects loaded at start
/// (the program, the preloaded ones, their libraries, in that order), found without `dlsym`,
/// which takes the lock a `dlopen` holds while it runs constructors.
pub fn first_definition(name: &'static [u8]) -> usize {
    let mut s = Search { object: b"", names: [name, name], found: [0, 0], sizes: [0, 0] };
    search(&mut s);
    s.found[0]
}

/// Whether `addr` lies in one of the loaded segments of the object `info` describes.
fn holds(info: &libc::dl_phdr_info, addr: usize) -> bool {
    let base = info.dlpi_addr as usize;
    (0..info.dlpi_phnum as usize).any(|i| {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let start = base.wrapping_add(ph.p_vaddr as usize);
        ph.p_type == libc::PT_LOAD
            && addr >= start
            && addr < start.wrapping_add(ph.p_memsz as usize)
    })
}

/// The loaded object holding `addr`: its load base and name (the loader's C string), found
/// without `dladdr` (which takes the loader's lock).
pub fn object_holding(addr: usize) -> Option<(usize, *const c_char)> {
    if addr == 0 {
        return None;
    }
    let mut found = None;
    each_loaded_object(|info| {
        if holds(info, addr) {
            found = Some((info.dlpi_addr as usize, info.dlpi_name));
        }
        found.is_some()
    });
    found
}

/// Whether the object holding `addr` comes before libc in the loader's list: an object loaded at
/// the start, ahead of the libraries (preloaded), not one loaded with `dlopen` later, whose
/// exports the process does not call.
pub fn loaded_before_libc(addr: usize) -> bool {
    let mut answer = None;
    each_loaded_object(|info| {
        if holds(info, addr) {
            answer = Some(true);
        } else if file_name(info).is_some_and(|f| f.starts_with(b"libc.so.6")) {
            answer = Some(false);
        }
        answer.is_some()
    });
    answer == Some(true)
}

/// The first default-version definition of `name` after the object holding `after`, in the
/// loader's list: `dlsym(RTLD_NEXT, name)` asked from that object, for a name libc defines (every
/// object ahead of libc in the list is in the global scope: loaded at start), found without the
/// loader's lock (a hook's first call from a thread that a constructor waits for).
/// `None` where this cannot tell: not found, or an object on the way has no GNU hash table (a
/// definition there would be missed); the caller asks `dlsym` then.
pub fn next_definition(after: usize, name: &'static [u8]) -> Option<usize> {
    let mut s = Search { object: b"", names: [name, name], found: [0, 0], sizes: [0, 0] };
    let (mut passed, mut unsure) = (false, false);
    each_loaded_object(|info| {
        if !passed {
            passed = holds(info, after);
            return false;
        }
        // SAFETY: info comes from dl_iterate_phdr.
        if !unsafe { lookup_in_object(info, &mut s) } {
            // (the vDSO has no names we look up; any other object without GNU hash: unsure)
            // SAFETY: dlpi_name is null or a NUL-terminated string owned by ld.so.
            let vdso = !info.dlpi_name.is_null()
                && unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes().starts_with(b"linux-vdso");
            if !vdso {
                unsure = true;
                return true;
            }
        }
        s.found[0] != 0
    });
    (!unsure && s.found[0] != 0).then_some(s.found[0])
}

/// `name` (an object, with its size) in the loaded object whose file name starts with `object`.
pub fn object_in(object: &'static [u8], name: &'static [u8]) -> Option<(usize, usize)> {
    let mut s = Search { object, names: [name, name], found: [0, 0], sizes: [0, 0] };
    search(&mut s);
    (s.found[0] != 0).then_some((s.found[0], s.sizes[0]))
}

/// The default-version definition of `name` in the loaded object whose load base is `base` (0:
/// none, or no such object loaded).
pub fn definition_at(base: usize, name: &[u8]) -> usize {
    let mut s = Search { object: b"", names: [name, name], found: [0, 0], sizes: [0, 0] };
    each_loaded_object(|info| {
        if info.dlpi_addr as usize != base {
            return false;
        }
        // SAFETY: info comes from dl_iterate_phdr.
        unsafe { lookup_in_object(info, &mut s) };
        true
    });
    s.found[0]
}

/// Whether `addr` lies in one of gdrshim's own objects (the core or the front: those that define
/// `gdrshim_version`).
pub fn in_gdrshim(addr: usize) -> bool {
    object_holding(addr).is_some_and(|(base, _)| definition_at(base, b"gdrshim_version") != 0)
}

/// Whether an object loaded now other than gdrshim's own defines `name` (a default-version
/// definition): what a lookup that found gdrshim's hook would find without gdrshim, in some
/// scope. `true` where this cannot tell (an object without a GNU hash table).
pub fn defined_beside_gdrshim(name: &[u8]) -> bool {
    let mut beside = false;
    each_loaded_object(|info| {
        let mut s =
            Search { object: b"", names: [name, b"gdrshim_version"], found: [0, 0], sizes: [0, 0] };
        // SAFETY: info comes from dl_iterate_phdr.
        if !unsafe { lookup_in_object(info, &mut s) } {
            // SAFETY: dlpi_name is null or a NUL-terminated string owned by ld.so.
            let vdso = !info.dlpi_name.is_null()
                && unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes().starts_with(b"linux-vdso");
            beside = !vdso;
        } else {
            beside = s.found[0] != 0 && s.found[1] == 0;
        }
        beside
    });
    beside
}
