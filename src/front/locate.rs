//! Where the core is, and whether the file there can be loaded.
//!
//! The core is the `libgdrshim-core.so` beside the *file* the front was loaded from, not beside
//! the path the front was preloaded by: a relative path (`./lib/libgdrshim.so`, or a bare name
//! found through `LD_LIBRARY_PATH`) would be looked up from whatever folder the process is in at
//! its first GPU touch (a `libgdrshim-core.so` planted there would run), a symlink to the front
//! alone would miss the core, and a `current` link switched to another release between the
//! process's start and its first touch would pair this front with another release's core. The
//! kernel names the file mapped at the front's own addresses (`/proc/self/map_files`: the inode's
//! path, symlinks resolved, independent of the current folder); without /proc, only an absolute
//! preload path is trusted, and a relative one loads no core.
//!
//! What is found is checked before `dlopen` maps it: a truncated or damaged core (a copy cut
//! short) would otherwise crash the process with SIGBUS when the loader touches a page past its
//! end.

use crate::sys;
use core::ffi::{c_int, c_void, CStr};

/// Why no core path: the front's one line says it.
pub type Refusal = &'static [u8];

struct Own {
    addr: usize,
    /// The mapping (page-aligned) of the segment holding `addr`, and the object's name.
    start: usize,
    end: usize,
    name: *const core::ffi::c_char,
}

unsafe extern "C" fn each_own(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our own Own pointer.
    let (info, own) = unsafe { (&*info, &mut *(data as *mut Own)) };
    let base = info.dlpi_addr as usize;
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let start = base.wrapping_add(ph.p_vaddr as usize);
        if ph.p_type == libc::PT_LOAD
            && own.addr >= start
            && own.addr < start.wrapping_add(ph.p_memsz as usize)
        {
            // SAFETY: getauxval has no preconditions.
            let page = (unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize).max(4096);
            own.start = start & !(page - 1);
            own.end = (start + ph.p_memsz as usize + page - 1) & !(page - 1);
            own.name = info.dlpi_name;
            return 1;
        }
    }
    0
}

/// `<folder of the front's file>/libgdrshim-core.so`, NUL-terminated, into `out`; its length.
pub fn core_path(out: &mut [u8; 4096]) -> Result<usize, Refusal> {
    // dl_iterate_phdr, not dladdr: it takes only the loader's list lock, never the lock a
    // `dlopen` holds while it runs constructors
    let mut own =
        Own { addr: core_path as *const () as usize, start: 0, end: 0, name: core::ptr::null() };
    // SAFETY: the callback only reads what ld.so describes and writes into `own`.
    unsafe { libc::dl_iterate_phdr(Some(each_own), &mut own as *mut Own as *mut c_void) };
    if own.end == 0 {
        return Err(b"cannot find its own file, so cannot find libgdrshim-core.so");
    }
    let mut link = [0u8; 64];
    let mut w = Writer { buf: &mut link, len: 0 };
    w.put(b"/proc/self/map_files/");
    w.hex(own.start);
    w.put(b"-");
    w.hex(own.end);
    w.put(b"\0");
    let link_len = w.len;
    let file_len = match sys::readlink(link.get(..link_len).unwrap_or_default(), &mut out[..]) {
        Some(n) if n < out.len() && out[0] == b'/' => {
            if out.get(..n).is_some_and(|f| f.ends_with(b" (deleted)")) {
                return Err(b"its own file was removed or replaced since the process started, so its core is gone too");
            }
            n
        }
        _ => {
            // no /proc: the path it was loaded by, if that cannot depend on the current folder
            if own.name.is_null() {
                return Err(b"cannot find its own file, so cannot find libgdrshim-core.so");
            }
            // SAFETY: a C string of the loader's.
            let name = unsafe { CStr::from_ptr(own.name) }.to_bytes();
            if name.first() != Some(&b'/') || name.len() >= out.len() {
                return Err(b"was preloaded by a relative path and /proc cannot name its file: it loads no core from the current folder (preload libgdrshim.so by its absolute path)");
            }
            if let Some(dst) = out.get_mut(..name.len()) {
                dst.copy_from_slice(name);
            }
            name.len()
        }
    };
    let folder =
        out.get(..file_len).and_then(|f| f.iter().rposition(|&c| c == b'/')).map_or(0, |i| i + 1);
    let core = crate::attach::CORE_FILE;
    let Some(dst) = out.get_mut(folder..folder + core.len() + 1) else {
        return Err(b"has a path too long for its core's");
    };
    let (name, nul) = dst.split_at_mut(core.len());
    name.copy_from_slice(core);
    nul.fill(0);
    Ok(folder + core.len())
}

struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}
impl Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        for &c in b {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = c;
                self.len += 1;
            }
        }
    }
    /// Lower-case hexadecimal without leading zeros, as the kernel names map_files entries.
    fn hex(&mut self, v: usize) {
        let mut started = false;
        for shift in (0..16).rev() {
            let d = (v >> (shift * 4)) & 15;
            started |= d != 0 || shift == 0;
            if started {
                self.put(&[b"0123456789abcdef"[d]]);
            }
        }
    }
}

/// Whether the file at `path` (NUL-terminated) is a whole x86-64 shared object: every part its
/// headers point at lies inside the file (a copy cut short fails here, not with SIGBUS later).
pub fn whole_elf(path: &[u8]) -> Result<(), Refusal> {
    let Some(fd) = sys::open_read(path) else { return Err(b"cannot be opened") };
    let r = check_elf(fd);
    sys::close(fd);
    r
}

fn check_elf(fd: c_int) -> Result<(), Refusal> {
    const BAD: Refusal = b"is not a whole x86-64 shared object (cut short or damaged?)";
    let st = sys::fstat(fd).ok_or(&b"cannot be read"[..])?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(b"is not a plain file");
    }
    let size = st.st_size as u64;
    let mut eh = [0u8; 64];
    if size < 64 || !sys::pread_exact(fd, &mut eh, 0) {
        return Err(BAD);
    }
    let at = |b: &[u8], o: usize, n: usize| {
        let mut a = [0u8; 8];
        if let (Some(src), Some(dst)) = (b.get(o..o + n), a.get_mut(..n)) {
            dst.copy_from_slice(src);
        }
        u64::from_le_bytes(a)
    };
    let u16_at = |b: &[u8], o: usize| at(b, o, 2);
    let u64_at = |b: &[u8], o: usize| at(b, o, 8);
    // \x7fELF, 64-bit, little-endian, a shared object (ET_DYN) for x86-64 (62)
    if !eh.starts_with(b"\x7fELF\x02\x01") || u16_at(&eh, 16) != 3 || u16_at(&eh, 18) != 62 {
        return Err(BAD);
    }
    let (phoff, phentsize, phnum) = (u64_at(&eh, 32), u16_at(&eh, 54), u16_at(&eh, 56));
    let (shoff, shentsize, shnum) = (u64_at(&eh, 40), u16_at(&eh, 58), u16_at(&eh, 60));
    let inside = |off: u64, len: u64| off.checked_add(len).is_some_and(|end| end <= size);
    if phentsize != 56
        || phnum == 0
        || phnum > 64
        || !inside(phoff, phnum * 56)
        || !inside(shoff, shnum * shentsize)
    {
        return Err(BAD);
    }
    let mut ph = [0u8; 56 * 64];
    let Some(ph) = ph.get_mut(..(phnum * 56) as usize) else { return Err(BAD) };
    if !sys::pread_exact(fd, ph, phoff) {
        return Err(BAD);
    }
    for p in ph.chunks_exact(56) {
        // every segment's file bytes (PT_LOAD, PT_DYNAMIC, ...) lie inside the file
        if !inside(u64_at(p, 8), u64_at(p, 32)) {
            return Err(BAD);
        }
    }
    Ok(())
}

/// Whether the object holding `a` comes before the one holding `b` in the loader's list (the
/// order in which the process's global scope searches preloaded objects).
pub fn comes_first(a: usize, b: usize) -> bool {
    struct Order {
        a: usize,
        b: usize,
        first: u8,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our own Order pointer.
        let (info, o) = unsafe { (&*info, &mut *(data as *mut Order)) };
        let base = info.dlpi_addr as usize;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            let start = base.wrapping_add(ph.p_vaddr as usize);
            let holds = |x: usize| x >= start && x < start.wrapping_add(ph.p_memsz as usize);
            if ph.p_type == libc::PT_LOAD && (holds(o.a) || holds(o.b)) {
                o.first = if holds(o.a) { 1 } else { 2 };
                return 1;
            }
        }
        0
    }
    let mut o = Order { a, b, first: 0 };
    // SAFETY: the callback only reads what ld.so describes and writes into `o`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut o as *mut Order as *mut c_void) };
    o.first == 1
}
