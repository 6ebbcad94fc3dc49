//! libcuda.so.1 through libloading: the driver API calls the self-test makes. Looked up with
//! `dlsym`, so under gdrshim `cuMemAlloc_v2` and `cuMemGetHandleForAddressRange` are the shim's
//! wrappers, as a program that dlopens libcuda gets them.

use core::ffi::{c_char, c_int, c_void, CStr};
use libloading::Library;

pub type CUresult = c_int;
pub const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
pub const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
pub const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;

type Init = unsafe extern "C" fn(u32) -> CUresult;
type DevGet = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
type DevName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult;
type Attr = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult;
type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
type Release = unsafe extern "C" fn(c_int) -> CUresult;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type Free = unsafe extern "C" fn(u64) -> CUresult;
type HtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> CUresult;
type DtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> CUresult;
type Export = unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> CUresult;
type ErrName = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;
type StreamCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> CUresult;
type StreamOp = unsafe extern "C" fn(*mut c_void) -> CUresult;

pub struct Cuda {
    _lib: Library,
    init: Init,
    dev_get: DevGet,
    dev_name: Option<DevName>,
    attr: Option<Attr>,
    retain: Retain,
    release: Release,
    set_current: SetCurrent,
    alloc: Alloc,
    free: Free,
    htod: HtoD,
    dtoh: DtoH,
    export: Option<Export>,
    err_name: Option<ErrName>,
    stream_create: Option<StreamCreate>,
    stream_sync: Option<StreamOp>,
    stream_destroy: Option<StreamOp>,
    dev: c_int,
    ctx: bool,
}

/// A failed driver call: the call as written and the status's name.
pub type CuErr = (String, String);

impl Cuda {
    pub fn load() -> Result<Cuda, String> {
        // SAFETY: loading the system's libcuda runs its initialisers, as any CUDA program does.
        let lib = unsafe { Library::new("libcuda.so.1") }
            .map_err(|e| format!("libcuda.so.1 cannot be loaded: {e}"))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the driver API symbol with its cuda.h signature (the field's type); valid
                // while `_lib` is held.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("libcuda lacks {}: {e}", $name))?
            };
        }
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as above, for a symbol older drivers may lack.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|s| *s)
            };
        }
        Ok(Cuda {
            init: sym!("cuInit"),
            dev_get: sym!("cuDeviceGet"),
            dev_name: opt!("cuDeviceGetName"),
            attr: opt!("cuDeviceGetAttribute"),
            retain: sym!("cuDevicePrimaryCtxRetain"),
            release: sym!("cuDevicePrimaryCtxRelease_v2"),
            set_current: sym!("cuCtxSetCurrent"),
            alloc: sym!("cuMemAlloc_v2"),
            free: sym!("cuMemFree_v2"),
            htod: sym!("cuMemcpyHtoD_v2"),
            dtoh: sym!("cuMemcpyDtoH_v2"),
            export: opt!("cuMemGetHandleForAddressRange"),
            err_name: opt!("cuGetErrorName"),
            stream_create: opt!("cuStreamCreate"),
            stream_sync: opt!("cuStreamSynchronize"),
            stream_destroy: opt!("cuStreamDestroy_v2"),
            _lib: lib,
            dev: 0,
            ctx: false,
        })
    }

    pub fn name(&self, r: CUresult) -> String {
        if let Some(f) = self.err_name {
            let mut s: *const c_char = core::ptr::null();
            // SAFETY: cuGetErrorName writes a pointer to a static string (or fails).
            if unsafe { f(r, &mut s) } == 0 && !s.is_null() {
                // SAFETY: a NUL-terminated static string from libcuda.
                return format!("{} ({r})", unsafe { CStr::from_ptr(s) }.to_string_lossy());
            }
        }
        format!("CUresult {r}")
    }

    fn check(&self, call: String, r: CUresult) -> Result<(), CuErr> {
        if r == 0 {
            Ok(())
        } else {
            Err((call, self.name(r)))
        }
    }

    /// cuInit, cuDeviceGet(gpu), the primary context made current. Returns the device's name.
    pub fn open(&mut self, gpu: c_int) -> Result<String, CuErr> {
        // SAFETY: plain driver API calls with valid out-pointers.
        self.check("cuInit(0)".into(), unsafe { (self.init)(0) })?;
        let mut dev = 0;
        // SAFETY: as above.
        self.check(format!("cuDeviceGet({gpu})"), unsafe { (self.dev_get)(&mut dev, gpu) })?;
        self.dev = dev;
        let mut ctx = core::ptr::null_mut();
        // SAFETY: as above; released in Drop.
        self.check(format!("cuDevicePrimaryCtxRetain({gpu})"), unsafe {
            (self.retain)(&mut ctx, dev)
        })?;
        self.ctx = true;
        // SAFETY: ctx came from cuDevicePrimaryCtxRetain.
        self.check("cuCtxSetCurrent".into(), unsafe { (self.set_current)(ctx) })?;
        let mut buf = [0 as c_char; 128];
        match self.dev_name {
            // SAFETY: the buffer holds 128 bytes, as we say; libcuda NUL-terminates it.
            Some(f) if unsafe { f(buf.as_mut_ptr(), 128, dev) } == 0 => {
                // SAFETY: NUL-terminated by cuDeviceGetName (the last byte stays 0 in any case).
                Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
            }
            _ => Ok(format!("device {gpu}")),
        }
    }

    pub fn attribute(&self, a: c_int) -> Option<c_int> {
        let f = self.attr?;
        let mut v = 0;
        // SAFETY: a valid out-pointer and the device from cuDeviceGet.
        (unsafe { f(&mut v, a, self.dev) } == 0).then_some(v)
    }

    pub fn alloc(&self, size: usize) -> Result<u64, CuErr> {
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; the caller frees the allocation.
        self.check(format!("cuMemAlloc({size})"), unsafe { (self.alloc)(&mut p, size) })?;
        Ok(p)
    }

    pub fn free(&self, p: u64) {
        // SAFETY: p came from cuMemAlloc and is freed once.
        unsafe { (self.free)(p) };
    }

    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<(), CuErr> {
        // SAFETY: src is readable for its length; dst is our allocation of at least that size.
        self.check(format!("cuMemcpyHtoD({dst:#x}, {})", src.len()), unsafe {
            (self.htod)(dst, src.as_ptr().cast(), src.len())
        })
    }

    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), CuErr> {
        // SAFETY: dst is writable for its length; src is our allocation of at least that size.
        self.check(format!("cuMemcpyDtoH({src:#x}, {})", dst.len()), unsafe {
            (self.dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// cuMemGetHandleForAddressRange(DMA_BUF_FD): the fd; None: this libcuda lacks the call.
    pub fn export_dmabuf(&self, p: u64, size: usize) -> Option<Result<c_int, CuErr>> {
        let f = self.export?;
        let mut fd: c_int = -1;
        // SAFETY: the handle for DMA_BUF_FD is an int; [p, p+size) is our allocation.
        let r = unsafe {
            f((&mut fd as *mut c_int).cast(), p, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
        };
        Some(
            self.check(format!("cuMemGetHandleForAddressRange({p:#x}, {size}, DMA_BUF_FD)"), r)
                .map(|()| fd),
        )
    }
}

impl Cuda {
    /// A stream of its own (`cuStreamCreate`, non-blocking): what NCCL's calls are queued on.
    pub fn stream(&self) -> Result<*mut c_void, CuErr> {
        let f = self
            .stream_create
            .ok_or_else(|| ("dlsym(cuStreamCreate)".to_string(), "missing".to_string()))?;
        let mut s = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; CU_STREAM_NON_BLOCKING = 1; the caller destroys it.
        self.check("cuStreamCreate".into(), unsafe { f(&mut s, 1) })?;
        Ok(s)
    }

    /// Waits for everything queued on `s`.
    pub fn sync(&self, s: *mut c_void) -> Result<(), CuErr> {
        let f = self
            .stream_sync
            .ok_or_else(|| ("dlsym(cuStreamSynchronize)".to_string(), "missing".to_string()))?;
        // SAFETY: a stream from `stream()`, not yet destroyed.
        self.check("cuStreamSynchronize".into(), unsafe { f(s) })
    }

    pub fn destroy_stream(&self, s: *mut c_void) {
        if let Some(f) = self.stream_destroy {
            // SAFETY: a stream from `stream()`, destroyed once.
            unsafe { f(s) };
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if self.ctx {
            // SAFETY: releasing the primary context retained in open().
            unsafe { (self.release)(self.dev) };
        }
    }
}
