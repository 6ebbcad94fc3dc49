//! The real libc functions behind our hooks.
//!
//! gdrshim defines `dlsym` and `dlvsym` itself, so it cannot ask `dlsym` for the real `dlsym`.
//! It reads libc's own dynamic symbol table instead (found with `dl_iterate_phdr`), then resolves
//! everything else with the real `dlsym(RTLD_NEXT, …)`, which names the next definition after
//! gdrshim, as a preloaded library should.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// Read by the assembly stubs in `hooks::dl`, which tail-jump here.
pub static GDRSHIM_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
pub static GDRSHIM_REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_val: u64,
}
const _: () = assert!(core::mem::size_of::<Elf64Dyn>() == 16);
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;

struct Search {
    /// File-name prefix of the object to search: libc first, then libdl (glibc < 2.34).
    object: &'static [u8],
    names: [&'static [u8]; 2],
    found: [usize; 2],
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
unsafe fn lookup_in_object(info: &libc::dl_phdr_info, s: &mut Search) {
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
        return;
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
        return;
    }
    let h = gnuhash as *const u32;
    // SAFETY: the GNU hash header is 4 words, then bloom (u64 words), buckets, chains.
    let (nbuckets, symoffset, bloom_size) = unsafe { (*h, *h.add(1), *h.add(2)) };
    if nbuckets == 0 {
        return;
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
                let nm = unsafe { CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char) };
                // SAFETY: DT_VERSYM has one u16 per symbol.
                let hidden = versym != 0 && unsafe { *(versym as *const u16).add(idx as usize) } & 0x8000 != 0;
                if nm.to_bytes() == *name && sym.st_value != 0 && !hidden {
                    s.found[k] = base + sym.st_value as usize;
                    break;
                }
            }
            if ch & 1 != 0 {
                break;
            }
            idx += 1;
        }
    }
}

unsafe extern "C" fn each_object(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our own Search pointer.
    let (info, s) = unsafe { (&*info, &mut *(data as *mut Search)) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is a NUL-terminated string owned by ld.so.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let file = name.rsplit(|&c| c == b'/').next().unwrap_or(name);
    if file.starts_with(s.object) {
        // SAFETY: info comes from dl_iterate_phdr.
        unsafe { lookup_in_object(info, s) };
    }
    (s.found[0] != 0 && s.found[1] != 0) as c_int
}

/// Finds the real `dlsym`/`dlvsym`. Idempotent; cheap after the first call.
pub fn resolve_dl() -> bool {
    if !GDRSHIM_REAL_DLSYM.load(Ordering::Acquire).is_null() && !GDRSHIM_REAL_DLVSYM.load(Ordering::Acquire).is_null() {
        return true;
    }
    // libdl.so.2 of glibc >= 2.34 only forwards to libc: a forwarder would make glibc see it,
    // not our caller, as the caller of dlsym. So libc.so.6 first.
    let mut s = Search { object: b"libc.so.6", names: [b"dlsym", b"dlvsym"], found: [0, 0] };
    for object in [&b"libc.so.6"[..], b"libdl.so.2"] {
        s.object = object;
        // SAFETY: the callback only reads the objects ld.so describes and writes into `s`.
        unsafe { libc::dl_iterate_phdr(Some(each_object), &mut s as *mut Search as *mut c_void) };
        if s.found[0] != 0 && s.found[1] != 0 {
            break;
        }
    }
    if s.found[0] == 0 || s.found[1] == 0 {
        return false;
    }
    GDRSHIM_REAL_DLSYM.store(s.found[0] as *mut c_void, Ordering::Release);
    GDRSHIM_REAL_DLVSYM.store(s.found[1] as *mut c_void, Ordering::Release);
    true
}

pub fn real_dlsym() -> Option<DlsymFn> {
    if !resolve_dl() {
        return None;
    }
    let p = GDRSHIM_REAL_DLSYM.load(Ordering::Acquire);
    // SAFETY: p is libc's dlsym, found in its symbol table with this C signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

pub fn real_dlvsym() -> Option<DlvsymFn> {
    if !resolve_dl() {
        return None;
    }
    let p = GDRSHIM_REAL_DLVSYM.load(Ordering::Acquire);
    // SAFETY: p is libc's dlvsym, found in its symbol table with this C signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, DlvsymFn>(p) })
}

/// `dlsym(RTLD_NEXT, name)` as seen from gdrshim: the next definition after us.
pub fn next(name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: RTLD_NEXT with a valid C string; the caller address is inside gdrshim.
        Some(f) => unsafe { f(libc::RTLD_NEXT, name.as_ptr()) },
        None => core::ptr::null_mut(),
    }
}

/// Counts successful `dlclose` calls: a library reached through `RTLD_NEXT` (libibverbs,
/// libcuda) may have been unloaded and loaded again elsewhere since a pointer was cached.
pub static DL_GENERATION: AtomicU64 = AtomicU64::new(0);

/// A lazily resolved pointer to the next definition of one symbol. It holds no pointer until
/// resolved (the name comes with each call): a static with a pointer in it is a relocation the
/// loader writes in every process at start-up, and a page of it touched (issue 16).
pub struct NextFn {
    ptr: AtomicPtr<c_void>,
    /// For symbols of libraries that can be unloaded: the [`DL_GENERATION`] `ptr` was resolved
    /// in, plus one (0: never resolved). `u64::MAX` for libc's, which is never unloaded.
    resolved_in: AtomicU64,
}

impl NextFn {
    /// A libc function: resolved once.
    pub const fn libc() -> Self {
        NextFn { ptr: AtomicPtr::new(core::ptr::null_mut()), resolved_in: AtomicU64::new(u64::MAX) }
    }
    /// A function of a library (a file-name prefix such as `libibverbs.so`, given with each
    /// call), which may be loaded only in a plugin's local scope, and may be `dlclose`d and
    /// loaded again at another address: looked up again after any `dlclose`.
    pub const fn reloadable() -> Self {
        NextFn { ptr: AtomicPtr::new(core::ptr::null_mut()), resolved_in: AtomicU64::new(0) }
    }
    /// The next definition of `name` (always the same name for one `NextFn`: use [`next_def!`]),
    /// and where `RTLD_NEXT` does not see it, `library`'s own.
    #[inline(always)]
    pub fn get(&self, name: &'static CStr, library: Option<&'static [u8]>) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        let seen = self.resolved_in.load(Ordering::Acquire);
        let now = if seen == u64::MAX { u64::MAX } else { DL_GENERATION.load(Ordering::Acquire) + 1 };
        if !p.is_null() && seen == now {
            return p;
        }
        self.resolve(name, library, seen, now)
    }

    #[cold]
    #[inline(never)]
    fn resolve(&self, name: &'static CStr, library: Option<&'static [u8]>, seen: u64, now: u64) -> *mut c_void {
        let mut p = next(name);
        if p.is_null() {
            if let Some(lib) = library {
                p = in_loaded_library(lib, name);
            }
        }
        self.ptr.store(p, Ordering::Release);
        if seen != u64::MAX {
            self.resolved_in.store(now, Ordering::Release);
        }
        p
    }
}

/// The next definition of a symbol, cached in a static of this call site's own:
/// `next_def!(c"close")` for libc's (resolved once); `next_def!(c"ibv_reg_mr" in b"libibverbs.so")` for
/// a library's that may be unloaded (resolved again after any `dlclose`, and found in a plugin's
/// local scope by the library's file-name prefix).
macro_rules! next_def {
    ($sym:literal) => {{
        // .data, not .bss: see hooks::slots::slotted
        #[link_section = ".data.gdrshim_hooks"]
        static NEXT: $crate::real::NextFn = $crate::real::NextFn::libc();
        NEXT.get($sym, None)
    }};
    ($sym:literal in $lib:literal) => {{
        #[link_section = ".data.gdrshim_hooks"]
        static NEXT: $crate::real::NextFn = $crate::real::NextFn::reloadable();
        NEXT.get($sym, Some($lib))
    }};
}
pub(crate) use next_def;

/// `name` in an already loaded library whose file name starts with `prefix`, in whatever scope
/// it was loaded (a plugin's `RTLD_LOCAL` dependency). Loads nothing and keeps no reference.
pub fn in_loaded_library(prefix: &[u8], name: &CStr) -> *mut c_void {
    struct Find<'a> {
        prefix: &'a [u8],
        path: Option<std::ffi::CString>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our own Find pointer.
        let (info, f) = unsafe { (&*info, &mut *(data as *mut Find)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated string owned by ld.so.
        let full = unsafe { CStr::from_ptr(info.dlpi_name) };
        let file = full.to_bytes().rsplit(|&c| c == b'/').next().unwrap_or_default();
        if file.starts_with(f.prefix) {
            f.path = Some(full.to_owned());
            return 1;
        }
        0
    }
    let mut f = Find { prefix, path: None };
    // SAFETY: the callback only reads what ld.so describes and writes into `f`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut f as *mut Find as *mut c_void) };
    let Some(path) = f.path else { return core::ptr::null_mut() };
    // SAFETY: RTLD_NOLOAD only finds an object that is loaded already (and counts a reference).
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: a lookup on the handle just obtained.
    let p = real_dlsym().map_or(core::ptr::null_mut(), |d| unsafe { d(h, name.as_ptr()) });
    // The reference goes back at once (through libc, so our dlclose hook does not count it):
    // an unload later is seen through DL_GENERATION.
    if let Some(close) = dlclose() {
        // SAFETY: the handle dlopen gave above.
        unsafe { close(h) };
    }
    p
}

/// Declares a typed accessor for the real function behind a hook.
macro_rules! real_fn {
    ($vis:vis $acc:ident, $sym:literal, $ty:ty) => {
        $vis fn $acc() -> Option<$ty> {
            let p = $crate::real::next_def!($sym);
            // SAFETY: p is the next definition of a libc symbol with exactly this C signature.
            (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut core::ffi::c_void, $ty>(p) })
        }
    };
}

real_fn!(pub open, c"open", unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub open64, c"open64", unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub openat, c"openat", unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub openat64, c"openat64", unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int);
real_fn!(pub close, c"close", unsafe extern "C" fn(c_int) -> c_int);
real_fn!(pub dup, c"dup", unsafe extern "C" fn(c_int) -> c_int);
real_fn!(pub dup2, c"dup2", unsafe extern "C" fn(c_int, c_int) -> c_int);
real_fn!(pub dup3, c"dup3", unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
real_fn!(pub fcntl, c"fcntl", unsafe extern "C" fn(c_int, c_int, libc::c_ulong) -> c_int);
real_fn!(pub dlclose, c"dlclose", unsafe extern "C" fn(*mut c_void) -> c_int);

#[cfg(test)]
mod tests {
    #[test]
    fn finds_libc_dlsym_and_it_works() {
        assert!(super::resolve_dl());
        let f = super::real_dlsym().unwrap();
        // SAFETY: RTLD_DEFAULT lookup of a libc symbol.
        let p = unsafe { f(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert_eq!(p, libc::getpid as *mut core::ffi::c_void);
    }
}
