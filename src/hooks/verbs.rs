//! Verbs registration calls. Reached as exported symbols (programs linked against libibverbs,
//! such as perftest) and through `dlsym`/`dlvsym` on a libibverbs handle (NCCL).
//!
//! NV503C route: the call is delegated unchanged; around it the registrar makes (and later
//! undoes) the registration of exactly the GPU memory behind the range. DMA-BUF route: a call on
//! GPU memory the map covers exactly becomes `ibv_reg_dmabuf_mr` of gdrshim's export of exactly
//! that memory (the original call could only fail with EFAULT); the MR reads as the caller's
//! (`addr` is the VA it registered). If the provider refuses the export, the original call is
//! delegated untouched and fails as it would without gdrshim.

use super::caller::with_caller;
use super::decision::{after, outcome_owed, refused};
use super::decision::{before_export, use_export, ExportUse};
use super::slots::slotted;
use super::within::{self, reentered, Inside};
use crate::abi::verbs::{self as v, IBV_MR_ADDR_OFFSET, IBV_REREG_MR_CHANGE_TRANSLATION};
use crate::real::scope::{self, Callers};
use crate::registrar::{Decision, DeregStart, Export, HeldRef, VerbsReg};
use crate::shim;
use crate::sys::{errno, set_errno};
use core::ffi::{c_int, c_uint, c_void};
use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

type Pd = *mut c_void;
type Mr = *mut c_void;

/// A registration's arguments, as both routes see them.
#[derive(Clone, Copy)]
pub struct RegArgs {
    pd: Pd,
    addr: u64,
    len: u64,
    /// The MR's I/O virtual address (the caller's `addr` unless given).
    iova: u64,
    access: u32,
    /// `false`: nothing for gdrshim to do (a dma-buf registration through `ibv_reg_mr_ex`).
    ours: bool,
    /// `ibv_reg_mr_ex`: the caller's `comp_mask` and `dmah`, kept in the call that replaces it.
    ex: Option<(u64, u64)>,
    /// `comp_mask` bits gdrshim does not know: the call passes through untouched, said once.
    unknown: u64,
}

impl RegArgs {
    /// A registration of `[addr, addr+len)` by address (`ctx`: its PD or device context).
    pub(crate) fn of(ctx: *mut c_void, addr: u64, len: u64, access: u32) -> Self {
        RegArgs { pd: ctx, addr, len, iova: addr, access, ours: true, ex: None, unknown: 0 }
    }
    /// A call gdrshim passes through untouched; `unknown` names the `comp_mask` bits it does
    /// not know (0: nothing to say).
    pub(crate) fn untouched(ctx: *mut c_void, addr: u64, unknown: u64) -> Self {
        RegArgs { ours: false, unknown, ..Self::of(ctx, addr, 0, 0) }
    }
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
    pub(crate) fn ctx(&self) -> *mut c_void {
        self.pd
    }
    #[cfg(test)]
    pub(crate) fn is_ours(&self) -> bool {
        self.ours
    }
    #[cfg(test)]
    pub(crate) fn unknown(&self) -> u64 {
        self.unknown
    }
}

/// The registrar's decision before the real call; errno untouched, panics contained.
pub(crate) fn before(api: &str, a: &RegArgs, rereg: bool) -> Option<Decision> {
    if a.unknown != 0 {
        let (addr, unknown) = (a.addr, a.unknown);
        shim::call_in(|_| {
            crate::log_limited!(
                crate::config::Level::Warn,
                "unknown comp_mask",
                "{api} addr={addr:#x}: comp_mask bits {unknown:#x} unknown to gdrshim (it knows rdma-core v64.0's): passed through untouched, nothing registered"
            )
        });
    }
    if !a.ours || !crate::activation::active() {
        return None;
    }
    // A process whose shim never started has seen no GPU memory: nothing to look up.
    shim::try_get()?;
    shim::call_in(|s| {
        s.verbs_before(api, VerbsReg { addr: a.addr, len: a.len, access: a.access, rereg })
    })
    .flatten()
}

type DmabufF = unsafe extern "C" fn(Pd, u64, usize, u64, c_int, c_int) -> Mr;
type RegExF = unsafe extern "C" fn(Pd, *mut v::MrInitAttr) -> Mr;

/// The registration of gdrshim's export `e` for `a`: `ibv_reg_dmabuf_mr`, or for `ibv_reg_mr_ex`
/// (`real`) the caller's call with the address turned into the buffer and every other
/// `comp_mask` bit kept. The export's fd is gdrshim's kept one: the hook closes nothing (an MR
/// holds its own reference to the buffer), and hands it over only while it is still that buffer
/// ([`use_export`]).
fn register_export(api: &str, a: &RegArgs, e: &Export, real: *mut c_void) -> ExportUse<Mr> {
    let e0 = errno();
    // the outcome must reach the registrar (see `outcome_owed`)
    let _no_cancel = crate::sys::NoCancel::new();
    // the same copy's: the PD is that copy's (looked up before the use: it may take the
    // loader's lock)
    let dmabuf_real = match a.ex {
        Some(_) => null_mut(),
        None => {
            static BESIDE: Callers = Callers::new();
            scope::beside(&BESIDE, real, c"ibv_reg_dmabuf_mr")
        }
    };
    let Some(in_use) = use_export(e) else {
        set_errno(e0);
        return ExportUse::Stale;
    };
    let (with, mr) = match a.ex {
        Some((mask, dmah)) => {
            let mut attr = v::MrInitAttr {
                length: a.len,
                access: a.access as i32,
                comp_mask: (mask & !v::REG_MR_MASK_ADDR)
                    | v::REG_MR_MASK_FD
                    | v::REG_MR_MASK_FD_OFFSET
                    | v::REG_MR_MASK_IOVA,
                iova: a.iova,
                fd: e.fd,
                fd_offset: e.offset,
                dmah,
                ..Default::default()
            };
            // SAFETY: the provider's ibv_reg_mr_ex (IBVERBS_1.15), whose slot this call came through.
            let f: RegExF = unsafe { core::mem::transmute::<*mut c_void, RegExF>(real) };
            let _inside = Inside::enter(real);
            // SAFETY: the caller's PD and a complete ibv_mr_init_attr of ours, alive for the call.
            ("ibv_reg_mr_ex", unsafe { f(a.pd, &mut attr) })
        }
        None => {
            let real = dmabuf_real;
            if real.is_null() {
                set_errno(libc::ENOSYS);
                ("ibv_reg_dmabuf_mr", null_mut())
            } else {
                // SAFETY: the provider's ibv_reg_dmabuf_mr, of this signature (IBVERBS_1.12).
                let f: DmabufF = unsafe { core::mem::transmute::<*mut c_void, DmabufF>(real) };
                let _inside = Inside::enter(real);
                // SAFETY: the caller's PD and access, our buffer's fd and the offset of the MR in it.
                ("ibv_reg_dmabuf_mr", unsafe {
                    f(a.pd, e.offset, a.len as usize, a.iova, e.fd, a.access as c_int)
                })
            }
        }
    };
    drop(in_use);
    let err = errno();
    if mr.is_null() {
        shim::call_in(|s| s.dmabuf_refused(api, with, e, a.addr, a.len, err));
        set_errno(e0);
        return ExportUse::Refused;
    }
    // SAFETY: the provider returned a live `struct ibv_mr`, whose `addr` field (a pointer-sized
    // integer at IBV_MR_ADDR_OFFSET) the caller may read; nobody else uses the MR yet.
    let provider_addr = unsafe {
        let slot = (mr as *mut u8).add(IBV_MR_ADDR_OFFSET) as *mut u64;
        let was = slot.read_unaligned();
        slot.write_unaligned(a.addr);
        was
    };
    shim::call_in(|s| s.verbs_after_dmabuf(e, mr as u64, provider_addr, a.addr));
    set_errno(e0);
    ExportUse::Made(mr)
}

macro_rules! verbs_reg {
    ($modname:ident, $export:ident, $n:tt, $sym:literal, ($($a:ident : $t:ty),*), |$($b:ident),*| $args:expr) => {
        pub mod $modname {
            use super::*;
            type F = unsafe extern "C" fn($($t),*) -> Mr;
            slotted!(install, REAL, super::$export, call, ($($a: $t),*) -> Mr);

            /// The exported hook's body: the copy of libibverbs the caller reaches (inside
            /// gdrshim's own call to a copy: that copy's, as it is).
            pub unsafe extern "C" fn exported($($a: $t,)* caller: usize) -> Mr {
                static INNER: Callers = Callers::new();
                if let Some(real) = reentered(&INNER, $sym) {
                    // SAFETY: the outer call's copy's function of this signature.
                    return unsafe { forward(real, $($a),*) };
                }
                static CALLERS: Callers = Callers::new();
                let real = scope::for_caller(&CALLERS, caller, $sym, b"libibverbs.so");
                // SAFETY: that copy's function of this signature.
                unsafe { call(real, $($a),*) }
            }

            /// `real` called as it is.
            unsafe fn forward(real: *mut c_void, $($a: $t),*) -> Mr {
                if real.is_null() {
                    set_errno(libc::ENOSYS);
                    return null_mut();
                }
                // SAFETY: real is the provider's function of exactly this signature.
                let f: F = unsafe { core::mem::transmute::<*mut c_void, F>(real) };
                // SAFETY: forwarded unchanged.
                unsafe { f($($a),*) }
            }

            #[inline(always)]
            pub unsafe fn call(real: *mut c_void, $($a: $t),*) -> Mr {
                if real.is_null() || within::outer().is_some() {
                    // SAFETY: as the caller's call.
                    return unsafe { forward(real, $($a),*) };
                }
                let args = |$($b: $t),*| -> RegArgs { $args };
                let a = args($($a),*);
                let api = stringify!($export);
                let exported = before_export(
                    || before(api, &a, false),
                    |e| register_export(api, &a, e, real),
                );
                let d = match exported {
                    Ok(mr) => return mr,
                    Err(d) => d,
                };
                if refused(&d) {
                    return null_mut();
                }
                let _no_cancel = outcome_owed(&d);
                let mr = {
                    let _inside = Inside::enter(real);
                    // SAFETY: real is the provider's function of this signature, forwarded unchanged.
                    unsafe { forward(real, $($a),*) }
                };
                after(d, mr);
                mr
            }
        }

        with_caller!($export, $modname::exported, $n);
    };
}

fn args(pd: Pd, addr: *mut c_void, length: usize, iova: u64, access: u32) -> RegArgs {
    RegArgs { iova, ..RegArgs::of(pd, addr as u64, length as u64, access) }
}

verbs_reg!(reg_mr, ibv_reg_mr, 4, c"ibv_reg_mr", (pd: Pd, addr: *mut c_void, length: usize, access: c_int), |pd, addr, length, access| args(
    pd,
    addr,
    length,
    addr as u64,
    access as u32
));
verbs_reg!(reg_mr_iova, ibv_reg_mr_iova, 5, c"ibv_reg_mr_iova", (pd: Pd, addr: *mut c_void, length: usize, iova: u64, access: c_int), |pd, addr, length, iova, access| args(
    pd,
    addr,
    length,
    iova,
    access as u32
));
verbs_reg!(reg_mr_iova2, ibv_reg_mr_iova2, 5, c"ibv_reg_mr_iova2", (pd: Pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint), |pd, addr, length, iova, access| args(
    pd, addr, length, iova, access
));
verbs_reg!(reg_mr_ex, ibv_reg_mr_ex, 2, c"ibv_reg_mr_ex", (pd: Pd, attr: *mut c_void), |pd, attr| mr_ex_args(pd, attr));

/// `struct ibv_mr_init_attr` of `ibv_reg_mr_ex`: a registration of `addr` only when the caller
/// gave one, and neither a dma-buf fd nor a provider's buffer (`ibv_alloc_buf` memory is the
/// provider's, never CUDA's). Bits gdrshim does not know leave the call untouched.
fn mr_ex_args(pd: Pd, attr: *mut c_void) -> RegArgs {
    if attr.is_null() {
        return RegArgs::untouched(pd, 0, 0);
    }
    let mut b = [0u8; v::MR_INIT_ATTR_READ];
    // SAFETY: the caller passes a readable ibv_mr_init_attr, larger than these bytes, to the provider.
    unsafe { core::ptr::copy_nonoverlapping(attr as *const u8, b.as_mut_ptr(), b.len()) };
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let mask = u64_at(v::MR_INIT_ATTR_COMP_MASK);
    let addr = u64_at(v::MR_INIT_ATTR_ADDR);
    if mask & !v::REG_MR_MASK_KNOWN != 0 {
        return RegArgs::untouched(pd, addr, mask & !v::REG_MR_MASK_KNOWN);
    }
    if mask & v::REG_MR_MASK_ADDR == 0
        || mask & (v::REG_MR_MASK_FD | v::REG_MR_MASK_FD_OFFSET | v::REG_MR_MASK_BUF) != 0
    {
        return RegArgs::untouched(pd, addr, 0);
    }
    let dmah = if mask & v::REG_MR_MASK_DMAH != 0 {
        // SAFETY: with IBV_REG_MR_MASK_DMAH the caller's struct has `dmah` (libibverbs reads it).
        unsafe { ((attr as *const u8).add(v::MR_INIT_ATTR_DMAH) as *const u64).read_unaligned() }
    } else {
        0
    };
    let iova = if mask & v::REG_MR_MASK_IOVA != 0 { u64_at(v::MR_INIT_ATTR_IOVA) } else { addr };
    let access = u32::from_le_bytes(b[v::MR_INIT_ATTR_ACCESS..][..4].try_into().unwrap_or([0; 4]));
    RegArgs {
        iova,
        ex: Some((mask, dmah)),
        ..RegArgs::of(pd, addr, u64_at(v::MR_INIT_ATTR_LENGTH), access)
    }
}

type DeregF = unsafe extern "C" fn(Mr) -> c_int;

/// Writes `value` into `mr->addr`.
///
/// # Safety
/// `mr` is a live `struct ibv_mr` the provider made for us.
unsafe fn set_mr_addr(mr: Mr, value: u64) {
    // SAFETY: per the contract; `addr` is a pointer-sized integer at IBV_MR_ADDR_OFFSET.
    unsafe { ((mr as *mut u8).add(IBV_MR_ADDR_OFFSET) as *mut u64).write_unaligned(value) };
}

/// What `mr->addr` reads.
///
/// # Safety
/// `mr` is a live `struct ibv_mr`.
unsafe fn mr_addr(mr: Mr) -> u64 {
    // SAFETY: per the contract; `addr` is a pointer-sized integer at IBV_MR_ADDR_OFFSET.
    unsafe { ((mr as *const u8).add(IBV_MR_ADDR_OFFSET) as *const u64).read_unaligned() }
}

unsafe fn dereg_call(real: *mut c_void, mr: Mr) -> c_int {
    if real.is_null() {
        return libc::ENOSYS;
    }
    if within::outer().is_some() {
        // SAFETY: the provider's ibv_dereg_mr, inside gdrshim's own call: forwarded unchanged.
        return unsafe { core::mem::transmute::<*mut c_void, DeregF>(real)(mr) };
    }
    // The reference comes out of the table before the provider frees the MR: afterwards the
    // same pointer may already be another thread's new MR.
    let start = if shim::try_get().is_some_and(|s| s.may_hold_mrs()) {
        // SAFETY: a non-null `mr` is the caller's live MR (ibv_dereg_mr's contract).
        let shown = if mr.is_null() { 0 } else { unsafe { mr_addr(mr) } };
        shim::call_in(|s| s.verbs_dereg_begin(mr as u64, shown)).flatten()
    } else {
        None
    };
    // the reference taken out must be given back or released (see `outcome_owed`)
    let _no_cancel = start.is_some().then(crate::sys::NoCancel::new);
    // (a reference taken out by a queued outcome is not known here: `addr` stays as the caller
    // sees it, which rdma-core's deregistration of a dma-buf MR does not read)
    if let Some(DeregStart::Taken(HeldRef::Dmabuf { provider_addr, .. })) = &start {
        // SAFETY: a dma-buf MR of ours, alive until the provider's call below returns.
        unsafe { set_mr_addr(mr, *provider_addr) };
    }
    // SAFETY: the provider's ibv_dereg_mr.
    let f: DeregF = unsafe { core::mem::transmute::<*mut c_void, DeregF>(real) };
    let inside = Inside::enter(real);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(mr) };
    drop(inside);
    if let Some(start) = start {
        if let (DeregStart::Taken(HeldRef::Dmabuf { va, .. }), true) = (&start, rc != 0) {
            // SAFETY: the provider refused: the MR still exists and shows the caller's VA again.
            unsafe { set_mr_addr(mr, *va) };
        }
        shim::call_in(|s| s.verbs_dereg_end(mr as u64, start, rc == 0));
    }
    rc
}
slotted!(dereg_install, DEREG_REAL, ibv_dereg_mr, dereg_call, (mr: Mr) -> c_int);

/// The exported `ibv_dereg_mr`'s body: the copy of libibverbs the caller reaches.
unsafe extern "C" fn dereg_exported(mr: Mr, caller: usize) -> c_int {
    static INNER: Callers = Callers::new();
    if let Some(real) = reentered(&INNER, c"ibv_dereg_mr") {
        // SAFETY: the outer call's copy's ibv_dereg_mr.
        return unsafe { dereg_call(real, mr) };
    }
    static CALLERS: Callers = Callers::new();
    // SAFETY: that copy's ibv_dereg_mr.
    unsafe {
        dereg_call(scope::for_caller(&CALLERS, caller, c"ibv_dereg_mr", b"libibverbs.so"), mr)
    }
}
with_caller!(ibv_dereg_mr, dereg_exported, 1);

type ReregF = unsafe extern "C" fn(Mr, c_int, Pd, *mut c_void, usize, c_int) -> c_int;

/// A re-registration that moves the MR to `[addr, addr+length)` is a registration of the new range
/// and a deregistration of the old one, in that order, once the provider accepted it.
unsafe fn rereg_call(
    real: *mut c_void,
    mr: Mr,
    flags: c_int,
    pd: Pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    if real.is_null() {
        return libc::ENOSYS;
    }
    // SAFETY: the provider's ibv_rereg_mr.
    let f: ReregF = unsafe { core::mem::transmute::<*mut c_void, ReregF>(real) };
    if within::outer().is_some() {
        // SAFETY: inside gdrshim's own call: forwarded unchanged.
        return unsafe { f(mr, flags, pd, addr, length, access) };
    }
    let moves = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let d = if moves {
        before("ibv_rereg_mr", &args(pd, addr, length, addr as u64, access as u32), true)
    } else {
        None
    };
    if refused(&d) {
        // the MR stays as it was, as when the kernel refuses the command
        return v::IBV_REREG_MR_ERR_CMD;
    }
    // a move's outcome is owed for the new range and for what the MR held before
    let _no_cancel = moves.then(crate::sys::NoCancel::new);
    let inside = Inside::enter(real);
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(mr, flags, pd, addr, length, access) };
    drop(inside);
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

/// The exported `ibv_rereg_mr`'s body: the copy of libibverbs the caller reaches.
unsafe extern "C" fn rereg_exported(
    mr: Mr,
    flags: c_int,
    pd: Pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
    caller: usize,
) -> c_int {
    static INNER: Callers = Callers::new();
    let real = match reentered(&INNER, c"ibv_rereg_mr") {
        Some(real) => real,
        None => {
            static CALLERS: Callers = Callers::new();
            scope::for_caller(&CALLERS, caller, c"ibv_rereg_mr", b"libibverbs.so")
        }
    };
    // SAFETY: that copy's ibv_rereg_mr.
    unsafe { rereg_call(real, mr, flags, pd, addr, length, access) }
}
with_caller!(ibv_rereg_mr, rereg_exported, 6);

unsafe fn dmabuf_call(
    real: *mut c_void,
    pd: Pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> Mr {
    if real.is_null() {
        set_errno(libc::ENOSYS);
        return null_mut();
    }
    // SAFETY: the provider's ibv_reg_dmabuf_mr, forwarded unchanged: the program's own dma-buf.
    let f: DmabufF = unsafe { core::mem::transmute::<*mut c_void, DmabufF>(real) };
    // (inside gdrshim's own call the outer call counted it, or it is gdrshim's own)
    let _inside = match within::outer() {
        Some(_) => None,
        None => {
            if let Some(s) = shim::try_get() {
                s.stats.dmabuf_mrs.fetch_add(1, Relaxed);
            }
            Some(Inside::enter(real))
        }
    };
    // SAFETY: forwarded unchanged.
    unsafe { f(pd, offset, length, iova, fd, access) }
}
slotted!(dmabuf_install, DMABUF_REAL, ibv_reg_dmabuf_mr, dmabuf_call, (pd: Pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> Mr);

/// The exported `ibv_reg_dmabuf_mr`'s body: the copy of libibverbs the caller reaches.
unsafe extern "C" fn dmabuf_exported(
    pd: Pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
    caller: usize,
) -> Mr {
    static INNER: Callers = Callers::new();
    let real = match reentered(&INNER, c"ibv_reg_dmabuf_mr") {
        Some(real) => real,
        None => {
            static CALLERS: Callers = Callers::new();
            scope::for_caller(&CALLERS, caller, c"ibv_reg_dmabuf_mr", b"libibverbs.so")
        }
    };
    // SAFETY: that copy's ibv_reg_dmabuf_mr.
    unsafe { dmabuf_call(real, pd, offset, length, iova, fd, access) }
}
with_caller!(ibv_reg_dmabuf_mr, dmabuf_exported, 6);

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

/// Every (name, version) [`by_symbol`] wraps (docs/registration-entry-points.md lists them).
pub const HOOKED: &[(&str, &str)] = &[
    ("ibv_reg_mr", "IBVERBS_1.1"),
    ("ibv_reg_mr_iova", "IBVERBS_1.7"),
    ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
    ("ibv_reg_mr_ex", "IBVERBS_1.15"),
    ("ibv_dereg_mr", "IBVERBS_1.1"),
    ("ibv_rereg_mr", "IBVERBS_1.1"),
    ("ibv_reg_dmabuf_mr", "IBVERBS_1.12"),
];

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_abi_versions_we_implement_are_wrapped() {
        assert!(super::by_symbol(b"ibv_reg_mr", Some(b"IBVERBS_1.1")).is_some());
        assert!(
            super::by_symbol(b"ibv_reg_mr", Some(b"IBVERBS_1.0")).is_none(),
            "the 1.0 compat ABI differs"
        );
        assert!(super::by_symbol(b"ibv_reg_mr", None).is_some());
        assert!(super::by_symbol(b"ibv_reg_mr_iova2", Some(b"IBVERBS_1.8")).is_some());
        assert!(super::by_symbol(b"ibv_open_device", Some(b"IBVERBS_1.1")).is_none());
    }

    #[test]
    fn a_dmabuf_registration_through_reg_mr_ex_is_not_ours() {
        let mut attr = [0u64; 8];
        attr[0] = 0x1000; // length
        attr[2] = super::v::REG_MR_MASK_ADDR | super::v::REG_MR_MASK_FD;
        attr[4] = 0x7f00_0000_0000;
        assert!(!super::mr_ex_args(core::ptr::null_mut(), attr.as_mut_ptr().cast()).ours);
        attr[2] = super::v::REG_MR_MASK_ADDR;
        let a = super::mr_ex_args(core::ptr::null_mut(), attr.as_mut_ptr().cast());
        assert!(a.ours && a.addr == 0x7f00_0000_0000 && a.iova == a.addr && a.len == 0x1000);
    }

    #[test]
    fn reg_mr_ex_keeps_the_bits_it_does_not_convert_and_leaves_what_it_does_not_know() {
        let mut attr = [0u64; 9];
        attr[0] = 0x1000;
        attr[4] = 0x7f00_0000_0000;
        attr[7] = 0xd0a4; // dmah
        attr[2] = super::v::REG_MR_MASK_ADDR | super::v::REG_MR_MASK_DMAH;
        let a = super::mr_ex_args(core::ptr::null_mut(), attr.as_mut_ptr().cast());
        assert!(
            a.ours && a.ex == Some((attr[2], 0xd0a4)),
            "the DMA handle goes with the converted call"
        );
        attr[2] = super::v::REG_MR_MASK_ADDR | super::v::REG_MR_MASK_BUF;
        assert!(
            !super::mr_ex_args(core::ptr::null_mut(), attr.as_mut_ptr().cast()).ours,
            "the provider's own buffer"
        );
        attr[2] = super::v::REG_MR_MASK_ADDR | 0x40;
        let u = super::mr_ex_args(core::ptr::null_mut(), attr.as_mut_ptr().cast());
        assert!(
            !u.ours && u.unknown == 0x40 && u.addr == attr[4],
            "an unknown bit: untouched, named"
        );
    }
}
