//! libmlx5's devx umem registrations (`mlx5dv_devx_umem_reg`, `_reg_ex`, `_dereg`): the memory
//! UCX's GPU-direct paths, NVSHMEM's IBGDA and NCCL's DOCA GIN hand the NIC for queues and
//! buffers. Reached as exported symbols and through `dlsym`/`dlvsym` on a libmlx5 handle.
//!
//! The same decision as a verbs MR (`verbs::before`): NV503C registers the GPU memory with RM
//! before the real call and keeps the reference with the umem until `mlx5dv_devx_umem_dereg`;
//! DMA-BUF turns the call into `mlx5dv_devx_umem_reg_ex` with `MLX5DV_UMEM_MASK_DMABUF` and
//! gdrshim's export of exactly that memory (`addr` becomes the offset in the buffer, as
//! mlx5dv_devx_umem_reg(3) says; the caller's access, page sizes and other mask bits kept), and
//! closes its fd after where it is its own (the umem holds the buffer). If the provider refuses, the original call
//! is delegated untouched and fails as it would without gdrshim.

use super::caller::with_caller;
use super::decision::{after, before_export, outcome_owed, refused, use_export, ExportUse};
use super::slots::slotted;
use super::verbs::{before, RegArgs};
use crate::abi::mlx5dv::{self as m, DevxUmemIn};
use crate::real::scope::{self, Callers};
use crate::registrar::Export;
use crate::shim;
use crate::sys::{errno, set_errno};
use core::ffi::{c_int, c_void};
use core::ptr::null_mut;

type Ctx = *mut c_void;
type Umem = *mut c_void;
type RegF = unsafe extern "C" fn(Ctx, *mut c_void, usize, u32) -> Umem;
type RegExF = unsafe extern "C" fn(Ctx, *mut DevxUmemIn) -> Umem;
type DeregF = unsafe extern "C" fn(Umem) -> c_int;

/// Bytes of the caller's `mlx5dv_devx_umem_in` read: up to `comp_mask` (a caller built against
/// rdma-core before `dmabuf_fd` passes no more; `dmabuf_fd` only matters with its mask bit, and
/// such a call is the program's own dma-buf, passed through).
const UMEM_IN_READ: usize = 40;

/// `mlx5dv_devx_umem_reg_ex` of `input` (gdrshim's export `e` in place of the caller's memory),
/// while the export's fd is still that buffer (`decision::use_export`). `Refused`: the provider
/// refused (logged), or has no `_reg_ex`.
fn register_export(
    api: &str,
    a: &RegArgs,
    e: &Export,
    reg_ex: *mut c_void,
    mut input: DevxUmemIn,
) -> ExportUse<Umem> {
    let e0 = errno();
    // the outcome must reach the registrar (see `decision::outcome_owed`)
    let _no_cancel = crate::sys::NoCancel::new();
    let Some(in_use) = use_export(e) else {
        set_errno(e0);
        return ExportUse::Stale;
    };
    let umem = if reg_ex.is_null() {
        set_errno(libc::ENOSYS);
        null_mut()
    } else {
        // SAFETY: libmlx5's mlx5dv_devx_umem_reg_ex (MLX5_1.19), of this signature.
        let f: RegExF = unsafe { core::mem::transmute::<*mut c_void, RegExF>(reg_ex) };
        // SAFETY: the caller's context and a complete umem_in of ours, alive for the call.
        unsafe { f(a.ctx(), &mut input) }
    };
    drop(in_use);
    let err = errno();
    let (addr, len) = (a.addr(), input.size);
    if umem.is_null() {
        shim::call_in(|s| s.dmabuf_refused(api, "mlx5dv_devx_umem_reg_ex", e, addr, len, err));
        set_errno(e0);
        return ExportUse::Refused;
    }
    // a umem shows no address: its entry is the dma-buf's, with no address to put back
    shim::call_in(|s| s.verbs_after_dmabuf(e, umem as u64, 0, 0));
    set_errno(e0);
    ExportUse::Made(umem)
}

/// `mlx5dv_devx_umem_reg_ex` of the copy of libmlx5 `reg` (its `mlx5dv_devx_umem_reg`) is of.
fn reg_ex_beside(reg: *mut c_void) -> *mut c_void {
    static BESIDE: Callers = Callers::new();
    scope::beside(&BESIDE, reg, c"mlx5dv_devx_umem_reg_ex")
}

unsafe fn reg_call(
    real: *mut c_void,
    ctx: Ctx,
    addr: *mut c_void,
    size: usize,
    access: u32,
) -> Umem {
    if real.is_null() {
        set_errno(libc::ENOSYS);
        return null_mut();
    }
    const API: &str = "mlx5dv_devx_umem_reg";
    let a = RegArgs::of(ctx, addr as u64, size as u64, access);
    let exported = before_export(
        || before(API, &a, false),
        |e| {
            // what mlx5dv_devx_umem_reg asks of the kernel, on gdrshim's buffer
            let input = DevxUmemIn {
                addr: e.offset,
                size: size as u64,
                access,
                pgsz_bitmap: m::UMEM_LEGACY_PGSZ_BITMAP,
                comp_mask: m::UMEM_MASK_DMABUF,
                dmabuf_fd: e.fd,
            };
            register_export(API, &a, e, reg_ex_beside(real), input)
        },
    );
    let d = match exported {
        Ok(u) => return u,
        Err(d) => d,
    };
    if refused(&d) {
        return null_mut();
    }
    let _no_cancel = outcome_owed(&d);
    // SAFETY: libmlx5's function of exactly this signature.
    let f: RegF = unsafe { core::mem::transmute::<*mut c_void, RegF>(real) };
    // SAFETY: forwarded unchanged.
    let umem = unsafe { f(ctx, addr, size, access) };
    after(d, umem);
    umem
}
slotted!(reg_install, REG_REAL, mlx5dv_devx_umem_reg, reg_call, (ctx: Ctx, addr: *mut c_void, size: usize, access: u32) -> Umem);

/// The exported hooks' bodies: the copy of libmlx5 the caller reaches (`real::scope`).
unsafe extern "C" fn reg_exported(
    ctx: Ctx,
    addr: *mut c_void,
    size: usize,
    access: u32,
    caller: usize,
) -> Umem {
    static CALLERS: Callers = Callers::new();
    let real = scope::for_caller(&CALLERS, caller, c"mlx5dv_devx_umem_reg", b"libmlx5.so");
    // SAFETY: that copy's function of this signature.
    unsafe { reg_call(real, ctx, addr, size, access) }
}
with_caller!(mlx5dv_devx_umem_reg, reg_exported, 4);

/// The caller's `umem_in`, as far as gdrshim reads it (`None`: none given).
fn read_umem_in(input: *const DevxUmemIn) -> Option<DevxUmemIn> {
    if input.is_null() {
        return None;
    }
    let mut b = [0u8; UMEM_IN_READ];
    // SAFETY: the caller passes a readable umem_in, at least these bytes, to the provider.
    unsafe { core::ptr::copy_nonoverlapping(input as *const u8, b.as_mut_ptr(), b.len()) };
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    Some(DevxUmemIn {
        addr: u64_at(0),
        size: u64_at(8),
        access: u32::from_le_bytes(b[16..20].try_into().unwrap_or([0; 4])),
        pgsz_bitmap: u64_at(24),
        comp_mask: u64_at(32),
        dmabuf_fd: -1,
    })
}

/// What gdrshim makes of a `umem_in`: a registration by address, or a call it leaves untouched
/// (the program's own dma-buf; `comp_mask` bits it does not know, named in the log).
fn umem_in_args(ctx: Ctx, input: Option<DevxUmemIn>) -> RegArgs {
    let Some(i) = input else { return RegArgs::untouched(ctx, 0, 0) };
    let unknown = i.comp_mask & !m::UMEM_MASK_KNOWN;
    if unknown != 0 || i.comp_mask & m::UMEM_MASK_DMABUF != 0 {
        return RegArgs::untouched(ctx, i.addr, unknown);
    }
    RegArgs::of(ctx, i.addr, i.size, i.access)
}

unsafe fn reg_ex_call(real: *mut c_void, ctx: Ctx, input: *mut DevxUmemIn) -> Umem {
    if real.is_null() {
        set_errno(libc::ENOSYS);
        return null_mut();
    }
    const API: &str = "mlx5dv_devx_umem_reg_ex";
    let caller = read_umem_in(input);
    let a = umem_in_args(ctx, caller);
    let exported = before_export(
        || before(API, &a, false),
        |e| match caller {
            Some(i) => {
                let converted = DevxUmemIn {
                    addr: e.offset,
                    comp_mask: i.comp_mask | m::UMEM_MASK_DMABUF,
                    dmabuf_fd: e.fd,
                    ..i
                };
                register_export(API, &a, e, real, converted)
            }
            // (no umem_in: nothing was decided; never here)
            None => {
                shim::call_in(|s| s.dmabuf_not_wanted(e));
                ExportUse::Refused
            }
        },
    );
    let d = match exported {
        Ok(u) => return u,
        Err(d) => d,
    };
    if refused(&d) {
        return null_mut();
    }
    let _no_cancel = outcome_owed(&d);
    // SAFETY: libmlx5's function of exactly this signature.
    let f: RegExF = unsafe { core::mem::transmute::<*mut c_void, RegExF>(real) };
    // SAFETY: forwarded unchanged.
    let umem = unsafe { f(ctx, input) };
    after(d, umem);
    umem
}
slotted!(reg_ex_install, REG_EX_REAL, mlx5dv_devx_umem_reg_ex, reg_ex_call, (ctx: Ctx, input: *mut DevxUmemIn) -> Umem);

unsafe extern "C" fn reg_ex_exported(ctx: Ctx, input: *mut DevxUmemIn, caller: usize) -> Umem {
    static CALLERS: Callers = Callers::new();
    let real = scope::for_caller(&CALLERS, caller, c"mlx5dv_devx_umem_reg_ex", b"libmlx5.so");
    // SAFETY: that copy's function of this signature.
    unsafe { reg_ex_call(real, ctx, input) }
}
with_caller!(mlx5dv_devx_umem_reg_ex, reg_ex_exported, 2);

/// The umem's reference leaves our table before the provider frees it (as `ibv_dereg_mr`'s),
/// and comes back if the provider refuses.
unsafe fn dereg_call(real: *mut c_void, umem: Umem) -> c_int {
    if real.is_null() {
        return libc::ENOSYS;
    }
    let start = if shim::try_get().is_some_and(|s| s.may_hold_mrs()) {
        shim::call_in(|s| s.verbs_dereg_begin(umem as u64, 0)).flatten()
    } else {
        None
    };
    // the reference taken out must be given back or released (see `decision::outcome_owed`)
    let _no_cancel = start.is_some().then(crate::sys::NoCancel::new);
    // SAFETY: libmlx5's function of exactly this signature.
    let f: DeregF = unsafe { core::mem::transmute::<*mut c_void, DeregF>(real) };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(umem) };
    if let Some(start) = start {
        shim::call_in(|s| s.verbs_dereg_end(umem as u64, start, rc == 0));
    }
    rc
}
slotted!(dereg_install, DEREG_REAL, mlx5dv_devx_umem_dereg, dereg_call, (umem: Umem) -> c_int);

unsafe extern "C" fn dereg_exported(umem: Umem, caller: usize) -> c_int {
    static CALLERS: Callers = Callers::new();
    // SAFETY: that copy's function of this signature.
    unsafe {
        dereg_call(
            scope::for_caller(&CALLERS, caller, c"mlx5dv_devx_umem_dereg", b"libmlx5.so"),
            umem,
        )
    }
}
with_caller!(mlx5dv_devx_umem_dereg, dereg_exported, 1);

type Install = fn(*mut c_void) -> *mut c_void;

/// The libmlx5 names gdrshim wraps, with the symbol version whose ABI it implements (`None`:
/// unversioned `dlsym`, the default version).
pub fn by_symbol(name: &[u8], version: Option<&[u8]>) -> Option<Install> {
    let v = |want: &[u8]| version.is_none_or(|got| got == want);
    Some(match name {
        b"mlx5dv_devx_umem_reg" if v(m::MLX5_1_7) => reg_install,
        b"mlx5dv_devx_umem_reg_ex" if v(m::MLX5_1_19) => reg_ex_install,
        b"mlx5dv_devx_umem_dereg" if v(m::MLX5_1_7) => dereg_install,
        _ => return None,
    })
}

/// Every (name, version) [`by_symbol`] wraps (docs/registration-entry-points.md lists them).
pub const HOOKED: &[(&str, &str)] = &[
    ("mlx5dv_devx_umem_reg", "MLX5_1.7"),
    ("mlx5dv_devx_umem_reg_ex", "MLX5_1.19"),
    ("mlx5dv_devx_umem_dereg", "MLX5_1.7"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn umem_in(mask: u64) -> DevxUmemIn {
        DevxUmemIn {
            addr: 0x7f00_0000_0000,
            size: 0x2000,
            access: 7,
            pgsz_bitmap: !0xffff,
            comp_mask: mask,
            dmabuf_fd: -1,
        }
    }

    #[test]
    fn a_umem_by_address_is_ours_a_dmabuf_or_an_unknown_bit_is_not() {
        let a = umem_in_args(null_mut(), Some(umem_in(0)));
        assert!(a.is_ours() && a.addr() == 0x7f00_0000_0000);
        assert!(
            !umem_in_args(null_mut(), Some(umem_in(m::UMEM_MASK_DMABUF))).is_ours(),
            "the program's own dma-buf"
        );
        let u = umem_in_args(null_mut(), Some(umem_in(0x20)));
        assert!(!u.is_ours() && u.unknown() == 0x20, "an unknown bit is named and left alone");
        assert!(!umem_in_args(null_mut(), None).is_ours());
    }

    #[test]
    fn the_caller_struct_is_read_field_by_field() {
        let i = umem_in(0);
        assert_eq!(read_umem_in(&i), Some(i));
        assert_eq!(read_umem_in(core::ptr::null()), None);
    }

    #[test]
    fn only_the_abi_versions_we_implement_are_wrapped() {
        assert!(by_symbol(b"mlx5dv_devx_umem_reg", Some(b"MLX5_1.7")).is_some());
        assert!(by_symbol(b"mlx5dv_devx_umem_reg", Some(b"MLX5_1.19")).is_none());
        assert!(by_symbol(b"mlx5dv_devx_umem_reg_ex", None).is_some());
        assert!(by_symbol(b"mlx5dv_devx_umem_import", None).is_none());
        for (n, v) in HOOKED {
            assert!(by_symbol(n.as_bytes(), Some(v.as_bytes())).is_some(), "{n}@{v}");
        }
    }
}
