//! Verbs registration calls. Reached as exported symbols (programs linked against libibverbs,
//! such as perftest) and through `dlsym`/`dlvsym` on a libibverbs handle (NCCL). Every call is
//! delegated unchanged; around it the registrar makes (and later undoes) the NV503C registration
//! of exactly the GPU memory behind the range.

use crate::hooks::slots::slotted;
use crate::real::NextFn;
use crate::registrar::Decision;
use crate::shim::{self, set_errno};
use core::ffi::{c_int, c_uint, c_void};
use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

type Pd = *mut c_void;
type Mr = *mut c_void;

/// The registrar's decision before the real call; errno untouched, panics contained.
fn before(api: &str, addr: u64, len: u64) -> Option<Decision> {
    shim::call_in(|s| s.verbs_before(api, addr, len)).flatten()
}

fn after(d: Option<Decision>, mr: Mr) {
    // Only a hit holds a reference that the MR must keep or drop.
    let Some(d @ Decision::Hit { .. }) = d else { return };
    shim::call_in(|s| s.verbs_after(&d, mr as u64));
}

macro_rules! verbs_reg {
    ($modname:ident, $export:ident, $sym:literal, ($($a:ident : $t:ty),*), |$($b:ident),*| $range:expr) => {
        pub mod $modname {
            use super::*;
            type F = unsafe extern "C" fn($($t),*) -> Mr;
            pub static NEXT: NextFn = NextFn::reloadable($sym, b"libibverbs.so");
            slotted!(install, REAL, super::$export, call, ($($a: $t),*) -> Mr);

            #[inline(always)]
            pub unsafe fn call(real: *mut c_void, $($a: $t),*) -> Mr {
                if real.is_null() {
                    set_errno(libc::ENOSYS);
                    return null_mut();
                }
                let range = |$($b: $t),*| -> (u64, u64) { $range };
                let (addr, len) = range($($a),*);
                let d = before(stringify!($export), addr, len);
                // SAFETY: real is the provider's function of exactly this signature.
                let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
                // SAFETY: forwarded unchanged.
                let mr = unsafe { f($($a),*) };
                after(d, mr);
                mr
            }
        }

        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $export($($a: $t),*) -> Mr {
            // SAFETY: the next definition after gdrshim, libibverbs', with this signature.
            unsafe { $modname::call($modname::NEXT.get(), $($a),*) }
        }
    };
}

verbs_reg!(reg_mr, ibv_reg_mr, c"ibv_reg_mr", (pd: Pd, addr: *mut c_void, length: usize, access: c_int), |_pd, addr, length, _access| (addr as u64, length as u64));
verbs_reg!(reg_mr_iova, ibv_reg_mr_iova, c"ibv_reg_mr_iova", (pd: Pd, addr: *mut c_void, length: usize, iova: u64, access: c_int), |_pd, addr, length, _iova, _access| (addr as u64, length as u64));
verbs_reg!(reg_mr_iova2, ibv_reg_mr_iova2, c"ibv_reg_mr_iova2", (pd: Pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint), |_pd, addr, length, _iova, _access| (addr as u64, length as u64));
// struct ibv_mr_init_attr (rdma-core >= 59): 0 length, 8 access, 16 comp_mask, 24 iova, 32 addr,
// 40 fd, 48 fd_offset, 56 dmah [INF: read from generated bindings, not a header of the version].
// A DMA-BUF registration has no addr; whatever addr names is only ever looked up exactly.
verbs_reg!(reg_mr_ex, ibv_reg_mr_ex, c"ibv_reg_mr_ex", (pd: Pd, attr: *mut c_void), |_pd, attr| mr_ex_range(attr));

fn mr_ex_range(attr: *mut c_void) -> (u64, u64) {
    if attr.is_null() {
        return (0, 0);
    }
    let mut b = [0u8; 40];
    // SAFETY: the caller passes a readable ibv_mr_init_attr of at least 40 bytes to the provider.
    unsafe { core::ptr::copy_nonoverlapping(attr as *const u8, b.as_mut_ptr(), 40) };
    let len = u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    let addr = u64::from_le_bytes(b[32..40].try_into().unwrap_or([0; 8]));
    (addr, len)
}

static DEREG_NEXT: NextFn = NextFn::reloadable(c"ibv_dereg_mr", b"libibverbs.so");
type DeregF = unsafe extern "C" fn(Mr) -> c_int;

unsafe fn dereg_call(real: *mut c_void, mr: Mr) -> c_int {
    if real.is_null() {
        return libc::ENOSYS;
    }
    // The reference comes out of the table before the provider frees the MR: afterwards the
    // same pointer may already be another thread's new MR.
    let held = if shim::try_get().is_some_and(|s| s.live_mrs.load(Relaxed) > 0) {
        shim::call_in(|s| s.verbs_dereg_begin(mr as u64)).flatten()
    } else {
        None
    };
    // SAFETY: the provider's ibv_dereg_mr.
    let f: DeregF = unsafe { core::mem::transmute::<*mut c_void, DeregF>(real) };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(mr) };
    if let Some(held) = held {
        shim::call_in(|s| s.verbs_dereg_end(mr as u64, held, rc == 0));
    }
    rc
}
slotted!(dereg_install, DEREG_REAL, ibv_dereg_mr, dereg_call, (mr: Mr) -> c_int);

/// # Safety
/// As libibverbs' `ibv_dereg_mr`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: Mr) -> c_int {
    // SAFETY: forwarded to the next definition.
    unsafe { dereg_call(DEREG_NEXT.get(), mr) }
}

static REREG_NEXT: NextFn = NextFn::reloadable(c"ibv_rereg_mr", b"libibverbs.so");
type ReregF = unsafe extern "C" fn(Mr, c_int, Pd, *mut c_void, usize, c_int) -> c_int;
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;

/// A re-registration that moves the MR to `[addr, addr+length)` is a registration of the new range
/// and a deregistration of the old one, in that order, once the provider accepted it.
unsafe fn rereg_call(real: *mut c_void, mr: Mr, flags: c_int, pd: Pd, addr: *mut c_void, length: usize, access: c_int) -> c_int {
    if real.is_null() {
        return libc::ENOSYS;
    }
    let moves = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let d = if moves { before("ibv_rereg_mr", addr as u64, length as u64) } else { None };
    // SAFETY: the provider's ibv_rereg_mr.
    let f: ReregF = unsafe { core::mem::transmute::<*mut c_void, ReregF>(real) };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(mr, flags, pd, addr, length, access) };
    if moves {
        shim::call_in(|s| {
            if rc == 0 {
                s.verbs_dereg(mr as u64);
            }
            if let Some(d) = &d {
                s.verbs_after(d, if rc == 0 { mr as u64 } else { 0 });
            }
        });
    }
    rc
}
slotted!(rereg_install, REREG_REAL, ibv_rereg_mr, rereg_call, (mr: Mr, flags: c_int, pd: Pd, addr: *mut c_void, length: usize, access: c_int) -> c_int);

/// # Safety
/// As libibverbs' `ibv_rereg_mr`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(mr: Mr, flags: c_int, pd: Pd, addr: *mut c_void, length: usize, access: c_int) -> c_int {
    // SAFETY: forwarded to the next definition.
    unsafe { rereg_call(REREG_NEXT.get(), mr, flags, pd, addr, length, access) }
}

static DMABUF_NEXT: NextFn = NextFn::reloadable(c"ibv_reg_dmabuf_mr", b"libibverbs.so");
type DmabufF = unsafe extern "C" fn(Pd, u64, usize, u64, c_int, c_int) -> Mr;

unsafe fn dmabuf_call(real: *mut c_void, pd: Pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> Mr {
    if real.is_null() {
        set_errno(libc::ENOSYS);
        return null_mut();
    }
    if let Some(s) = shim::try_get() {
        s.stats.dmabuf_mrs.fetch_add(1, Relaxed);
    }
    // SAFETY: the provider's ibv_reg_dmabuf_mr, forwarded unchanged: DMA-BUF needs no help.
    let f: DmabufF = unsafe { core::mem::transmute::<*mut c_void, DmabufF>(real) };
    // SAFETY: forwarded unchanged.
    unsafe { f(pd, offset, length, iova, fd, access) }
}
slotted!(dmabuf_install, DMABUF_REAL, ibv_reg_dmabuf_mr, dmabuf_call, (pd: Pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> Mr);

/// # Safety
/// As libibverbs' `ibv_reg_dmabuf_mr`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(pd: Pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> Mr {
    // SAFETY: forwarded to the next definition.
    unsafe { dmabuf_call(DMABUF_NEXT.get(), pd, offset, length, iova, fd, access) }
}

type Install = fn(*mut c_void) -> *mut c_void;

/// Verbs names we wrap, and the symbol versions whose ABI we implement (`None`: unversioned
/// `dlsym`, which gives the default version).
pub fn by_symbol(name: &[u8], version: Option<&[u8]>) -> Option<Install> {
    let v = |want: &[u8]| version.is_none_or(|got| got == want);
    Some(match name {
        b"ibv_reg_mr" if v(b"IBVERBS_1.1") => reg_mr::install,
        b"ibv_reg_mr_iova" if v(b"IBVERBS_1.7") => reg_mr_iova::install,
        b"ibv_reg_mr_iova2" if v(b"IBVERBS_1.8") => reg_mr_iova2::install,
        b"ibv_reg_mr_ex" if v(b"IBVERBS_1.15") => reg_mr_ex::install,
        b"ibv_dereg_mr" if v(b"IBVERBS_1.1") => dereg_install,
        b"ibv_rereg_mr" if v(b"IBVERBS_1.1") => rereg_install,
        b"ibv_reg_dmabuf_mr" if v(b"IBVERBS_1.12") => dmabuf_install,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_abi_versions_we_implement_are_wrapped() {
        assert!(super::by_symbol(b"ibv_reg_mr", Some(b"IBVERBS_1.1")).is_some());
        assert!(super::by_symbol(b"ibv_reg_mr", Some(b"IBVERBS_1.0")).is_none(), "the 1.0 compat ABI differs");
        assert!(super::by_symbol(b"ibv_reg_mr", None).is_some());
        assert!(super::by_symbol(b"ibv_reg_mr_iova2", Some(b"IBVERBS_1.8")).is_some());
        assert!(super::by_symbol(b"ibv_open_device", Some(b"IBVERBS_1.1")).is_none());
    }
}
