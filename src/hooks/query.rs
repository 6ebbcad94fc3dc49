//! Small exported query functions (declared in `include/gdrshim.h`): version, mode and an exact
//! lookup used by the BAR1 read-back check and by NCCL patches.

use crate::activation::active;
use crate::shim;
use crate::shim::registrations::Served;
use crate::sys::{in_hook, Contained};
use core::ffi::{c_char, c_int};

/// `GDRSHIM_QUERY_VERSION`: bump when the layout of `GdrshimBacking` changes.
pub const QUERY_ABI: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GdrshimBacking {
    pub struct_version: u32,
    pub h_client: u32,
    pub h_memory: u32,
    pub h_device: u32,
    pub device_id: u32,
    pub ctl_fd: i32,
    pub offset: u64,
    pub map_base: u64,
    pub map_length: u64,
}
const _: () = assert!(core::mem::size_of::<GdrshimBacking>() == 48);

static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_version() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}

/// 0 off, 1 trace, 2 shadow, 3 register.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_mode() -> c_int {
    if !active() {
        return 0;
    }
    if let Some(s) = shim::try_get() {
        return s.cfg.mode.number();
    }
    // (a panic here falls to the path below)
    if in_hook(crate::activation::hooks_in_place_once).unwrap_or(false) {
        // a query of ours is no GPU touch: before the shim has started, the mode it will start
        // in, without starting it (no output, no summary at exit)
        return crate::activation::asked_mode();
    }
    // a copy loaded with dlopen sees no GPU touch ever: its first query starts it, and it says
    // why it registers nothing
    in_hook(|| shim::get().cfg.mode.number()).unwrap_or_else(failed)
}

/// A query's answer when its work gave none: `-EBUSY` asked from inside gdrshim, `-EIO` it
/// panicked.
fn failed(c: Contained) -> c_int {
    match c {
        Contained::Reentered => -libc::EBUSY,
        Contained::Panicked => -libc::EIO,
    }
}

/// 1 when gdrshim registers GPU memory for verbs in this process (register mode on a driver ABI
/// it knows), else 0. What the NCCL patches ask before they let GDR on.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_gdr_active() -> c_int {
    shim::call_in(|s| (s.registering() && s.route().is_some()) as c_int).unwrap_or(0)
}

/// The route gdrshim registers GPU memory for verbs by here: 1 DMA-BUF, 2 NV503C, 0 none
/// (not registering, or no route works on this machine). What patch 0001 names in its log line.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_gdr_route() -> c_int {
    shim::call_in(|s| match s.route() {
        Some(crate::route::Route::Dmabuf) if s.registering() => 1,
        Some(crate::route::Route::Nv503c) if s.registering() => 2,
        _ => 0,
    })
    .unwrap_or(0)
}

/// A dma-buf fd of exactly the GPU memory behind `[va, va+len)` (host-page aligned; one GPU;
/// this process's own memory), as `cuMemGetHandleForAddressRange` gives one on datacenter GPUs:
/// the fd (the caller closes it), or `-ENOENT` not covered exactly (the reason is logged),
/// `-EACCES` the range is not the program's own device memory (a byte outside its CUDA
/// allocations, a hole, host or imported memory),
/// `-EPERM` not register mode or not the DMA-BUF route, `-ENOSYS` shim off or unknown driver.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_export_dmabuf(va: u64, len: u64) -> c_int {
    shim::call_in(|s| {
        if s.line.table.is_none() {
            return -libc::ENOSYS;
        }
        if !s.registering() || s.route() != Some(crate::route::Route::Dmabuf) {
            return -libc::EPERM;
        }
        match s.serve_dmabuf(va, len, crate::abi::dmabuf::MAPPING_DEFAULT) {
            Served::Fd(fd) => fd,
            Served::InvalidRange => -libc::EACCES,
            Served::NotServed => -libc::ENOENT,
        }
    })
    .unwrap_or(-libc::ENOSYS)
}

/// Whether the shim has not started and a query must not start it: a copy whose hooks see the
/// process's calls (not one loaded with dlopen, whose first query starts it) that has seen no
/// NVIDIA call yet. A query of ours is no GPU touch: it prints nothing and leaves no summary.
fn not_started() -> bool {
    shim::try_get().is_none() && in_hook(crate::activation::hooks_in_place_once).unwrap_or(false)
}

/// Exact lookup of `[va, va+len)`: 0 and `*out` filled on a single-object hit; `-ENOENT` on a
/// miss (also in a process that has touched no GPU: nothing is mapped there); `-EXDEV` when the
/// range spans memory objects; `-ENOSYS` when nothing is tracked.
///
/// # Safety
/// `out` is null or points to a writable `GdrshimBacking`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn gdrshim_lookup(va: u64, len: u64, out: *mut GdrshimBacking) -> c_int {
    if !active() {
        return -libc::ENOSYS;
    }
    if not_started() {
        return -libc::ENOENT;
    }
    let r = in_hook(|| {
        let s = shim::get();
        if s.line.table.is_none() {
            return Err(-libc::ENOSYS);
        }
        let (p, device, ctl_fd) =
            s.backing_of(va, len).ok_or(-libc::EBUSY)?.map_err(|m| match m {
                crate::vamap::Miss::SpansMemoryObjects { .. } => -libc::EXDEV,
                _ => -libc::ENOENT,
            })?;
        let (h_device, device_id) = device.unwrap_or((0, u32::MAX));
        Ok(GdrshimBacking {
            struct_version: QUERY_ABI,
            h_client: p.mem.client,
            h_memory: p.mem.memory,
            h_device,
            device_id,
            ctl_fd: ctl_fd.unwrap_or(-1),
            offset: p.offset,
            map_base: p.origin.base,
            map_length: p.origin.length,
        })
    });
    match r {
        Ok(Ok(b)) => {
            if !out.is_null() {
                // SAFETY: per the contract.
                unsafe { *out = b };
            }
            0
        }
        Ok(Err(e)) => e,
        Err(c) => failed(c),
    }
}

/// Explicit handles live in the registrar's MR table under keys no provider pointer can take.
const EXPLICIT: u64 = 1 << 63;
static NEXT_HANDLE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);

/// Registers the GPU memory behind `[va, va+len)` for third-party P2P, as a verbs registration
/// of it would (for applications that hand GPU memory to a NIC some other way). Returns a handle
/// greater than 0; 0 when nothing is needed (libcuda registers natively); `-EINVAL` host memory
/// (everything, in a process that has touched no GPU); `-ENOENT`
/// not exactly one tracked GPU mapping (the reason is logged); `-EXDEV` spans memory objects;
/// `-EPERM` not in register mode; `-ENOSYS` driver ABI unknown or shim off; `-EBUSY` timed out.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_register(va: u64, len: u64) -> i64 {
    if active() && not_started() {
        // no GPU touched: nothing here is GPU memory (as gdrshim_lookup answers), without
        // starting the shim
        let register = crate::activation::asked_mode() == crate::config::mode_word::REGISTER;
        return -((if register { libc::EINVAL } else { libc::EPERM }) as i64);
    }
    shim::call_in(|s| {
        if s.line.table.is_none() {
            return -(libc::ENOSYS as i64);
        }
        if s.cfg.mode != crate::config::Mode::Register {
            return -(libc::EPERM as i64);
        }
        if s.route() == Some(crate::route::Route::Dmabuf) {
            // a dma-buf has no registration to hold: gdrshim_export_dmabuf gives the buffer itself
            return -(libc::EOPNOTSUPP as i64);
        }
        let r = crate::registrar::VerbsReg { addr: va, len, access: 0, rereg: false };
        match s.verbs_before("gdrshim_register", r) {
            None => -(libc::EBUSY as i64),
            Some(crate::registrar::Decision::Host) => -(libc::EINVAL as i64),
            Some(crate::registrar::Decision::StandAside) => 0,
            Some(crate::registrar::Decision::Miss(m) | crate::registrar::Decision::Refuse(m)) => {
                if matches!(
                    m,
                    crate::registrar::RegMiss::Lookup(
                        crate::vamap::Miss::SpansMemoryObjects { .. }
                    )
                ) {
                    -(libc::EXDEV as i64)
                } else {
                    -(libc::ENOENT as i64)
                }
            }
            Some(crate::registrar::Decision::Exported(e)) => {
                // the route was decided DMA-BUF after the check above (by another thread, or by
                // this call's own decision): the buffer is not wanted (its hold given back, the
                // last closes our fd of it)
                s.dmabuf_not_wanted(&e);
                -(libc::EOPNOTSUPP as i64)
            }
            Some(d) => {
                let h = NEXT_HANDLE.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
                s.verbs_after(&d, EXPLICIT | h);
                h as i64
            }
        }
    })
    .unwrap_or(-(libc::ENOSYS as i64))
}

/// Drops a handle of `gdrshim_register` (0 is a no-op): 0, or `-ENOENT` for a handle not held.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_unregister(handle: i64) -> c_int {
    if handle == 0 {
        return 0;
    }
    if handle < 0 {
        return -libc::EINVAL;
    }
    shim::call_in(|s| match s.unregister_explicit(EXPLICIT | handle as u64) {
        Some(true) => 0,
        Some(false) => -libc::ENOENT,
        None => -libc::EBUSY,
    })
    .unwrap_or(-libc::ENOSYS)
}

/// Copies the counters (those of the exit summary) into `*out`, at most `size` bytes of it, so a
/// program built against an older header keeps working. Returns the bytes written, or -ENOSYS
/// (off, inert). In a process that has touched no GPU: the counts of a shim that has seen
/// nothing (0, and the BAR1 fields unknown), without starting it.
///
/// # Safety
/// `out` points to `size` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn gdrshim_counters(
    out: *mut crate::counters::GdrshimCounters,
    size: usize,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let unseen = || {
        let c = crate::counters::GdrshimCounters {
            bar1_bytes: u64::MAX,
            bar1_static: u64::MAX,
            ..Default::default()
        };
        (active() && not_started()).then(|| c.to_bytes())
    };
    let Some(v) = shim::call_in(|s| s.counters().to_bytes()).or_else(unseen) else {
        return -libc::ENOSYS;
    };
    let n = size.min(v.len()) / 8 * 8;
    // SAFETY: v holds at least n bytes; out has `size` ≥ n writable bytes.
    unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), out as *mut u8, n) };
    n as c_int
}

#[cfg(feature = "knobs")]
/// Benchmark only: with GDRSHIM_BENCH_PAUSE=1 in shadow mode, `pause` != 0 makes every hook
/// inert until `gdrshim_bench_pause(0)`. 0 on success; -EPERM where not allowed; -ENOSYS off.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_bench_pause(pause: c_int) -> c_int {
    // not `active()`: a paused shim answers this one call
    in_hook(|| {
        if pause != 0 && !crate::activation::active() {
            return -libc::ENOSYS;
        }
        match shim::try_get() {
            Some(s) if shim::knobs::bench_pause(s, pause != 0) => 0,
            Some(_) => -libc::EPERM,
            None => -libc::ENOSYS,
        }
    })
    .unwrap_or_else(failed)
}

#[cfg(feature = "knobs")]
/// Test only: the cache lines, tree nodes and table buckets the map and the registrar have read
/// on the calling thread so far (`vamap::touch`), so that a test can compare what one operation
/// reads at two sizes of the program. (-ENOSYS is the front's answer where no shim is loaded.)
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn gdrshim_test_touches() -> i64 {
    crate::vamap::touch::total() as i64
}

/// Writes a mark line into the capture file (fixtures use it to label what caused the traffic).
///
/// # Safety
/// `text` is null or a valid C string.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn gdrshim_mark(text: *const c_char) {
    if text.is_null() || !active() {
        return;
    }
    // SAFETY: per the contract.
    let t = unsafe { core::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned();
    let _ = in_hook(|| shim::get().mark(&t));
}
