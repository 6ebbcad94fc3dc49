//! `dmabuf-probe`: the three calls that must succeed for
//! GPUDirect RDMA through DMA-BUF: allocate GPU memory, export it with
//! `cuMemGetHandleForAddressRange(…, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`, register the fd with
//! `ibv_reg_dmabuf_mr` on each HCA. libcuda and libibverbs are loaded at run time, so the probe
//! runs (and says what it cannot do) on a machine that has neither.

use crate::report::{Check, Report, Status};
use core::ffi::{c_char, c_int, c_void, CStr};
use libloading::{Library, Symbol};

pub const AFTER_HELP: &str = "Exit codes:
  0  pass: every step worked (GPUDirect RDMA through DMA-BUF works natively here)
  1  a step failed on a machine where it could run (each FAIL line says why and what to do)
  2  could not check here: libcuda cannot be loaded, no GPU (or no device N), no libibverbs or no
     HCA for step 3; or a usage error";

/// `gdrshim-tool dmabuf-probe`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Bytes of GPU memory to allocate, export and register (or with K, M, G: 1K = 1024)
    #[arg(long, value_name = "BYTES", default_value_t = 2 << 20, value_parser = crate::size::parser(0, u64::MAX, false))]
    size: usize,
    /// CUDA device ordinal
    #[arg(long, value_name = "N", default_value_t = 0)]
    device: c_int,
    /// The CUDA driver library to load (a name the dynamic loader searches for, or a path)
    #[arg(long, value_name = "LIB", default_value = "libcuda.so.1")]
    libcuda: String,
    /// The verbs library to load for step 3 (a name the dynamic loader searches for, or a path)
    #[arg(long, value_name = "LIB", default_value = "libibverbs.so.1")]
    libibverbs: String,
    /// One JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let r = probe(&self.libcuda, &self.libibverbs, self.size, self.device);
        Ok(r.print("dmabuf-probe", self.json))
    }
}

type CUresult = c_int;
const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
const IBV_ACCESS_REMOTE_READ: c_int = 4;

struct Cuda {
    lib: Library,
}

impl Cuda {
    fn err_name(&self, r: CUresult) -> String {
        // SAFETY: cuGetErrorName(CUresult, const char**) from libcuda; the string is static.
        unsafe {
            if let Ok(f) =
                self.lib.get::<unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult>(
                    b"cuGetErrorName\0",
                )
            {
                let mut s: *const c_char = core::ptr::null();
                if f(r, &mut s) == 0 && !s.is_null() {
                    return format!("{} ({r})", CStr::from_ptr(s).to_string_lossy());
                }
            }
        }
        format!("CUresult {r}")
    }
}

fn errno_text(e: i32) -> String {
    // SAFETY: strerror returns a valid C string for any value.
    let s = unsafe { CStr::from_ptr(libc::strerror(e)) }.to_string_lossy().into_owned();
    format!("errno {e} ({s})")
}

/// CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE: no GPU to probe here.
const CUDA_ERROR_NO_DEVICE: CUresult = 100;
const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;

pub fn probe(libcuda: &str, libibverbs: &str, size: usize, ordinal: c_int) -> Report {
    let mut r = Report::default();
    // SAFETY: loading the system's libcuda runs its initialisers, as any CUDA program does.
    let cuda = match unsafe { Library::new(libcuda) } {
        Ok(lib) => Cuda { lib },
        Err(e) => {
            r.push(
                Check::new(
                    "dmabuf.libcuda",
                    Status::CouldNotCheck,
                    format!("{libcuda} cannot be loaded ({e}): no NVIDIA driver here, the GPU steps cannot run"),
                )
                .fix("run it on a GPU node with the NVIDIA driver installed (in a container: --gpus all)"),
            );
            r.could_not_check(format!("libcuda ({libcuda}) cannot be loaded"));
            return r;
        }
    };
    let api = match CudaApi::load(&cuda.lib) {
        Ok(api) => api,
        Err(missing) => {
            r.push(missing);
            return r;
        }
    };
    r.push(Check::new("dmabuf.libcuda", Status::Pass, format!("{libcuda} loaded")));
    let Some(dev) = device(&cuda, &api, ordinal, &mut r) else { return r };
    dma_buf_attribute(&cuda, &api, dev, ordinal, &mut r);
    gpu_steps(&cuda, &api, dev, ordinal, size, libibverbs, &mut r);
    r
}

/// The driver API calls the probe makes.
struct CudaApi<'l> {
    init: Symbol<'l, unsafe extern "C" fn(u32) -> CUresult>,
    dev_get: Symbol<'l, unsafe extern "C" fn(*mut c_int, c_int) -> CUresult>,
    attr: Symbol<'l, unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult>,
    retain: Symbol<'l, unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult>,
    release: Symbol<'l, unsafe extern "C" fn(c_int) -> CUresult>,
    set_cur: Symbol<'l, unsafe extern "C" fn(*mut c_void) -> CUresult>,
    alloc: Symbol<'l, unsafe extern "C" fn(*mut u64, usize) -> CUresult>,
    free: Symbol<'l, unsafe extern "C" fn(u64) -> CUresult>,
    export: Symbol<'l, unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> CUresult>,
}

impl<'l> CudaApi<'l> {
    /// Each call by its name, in this order: the first that libcuda lacks is the FAIL.
    fn load(lib: &'l Library) -> Result<CudaApi<'l>, Check> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the CUDA driver API symbol, typed by its field with its documented signature.
                match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                    Ok(f) => f,
                    Err(e) => {
                        return Err(Check::new(
                            "dmabuf.libcuda",
                            Status::Fail,
                            format!("libcuda lacks {} ({e}): driver older than CUDA 11.7?", $name),
                        ))
                    }
                }
            };
        }
        Ok(CudaApi {
            init: sym!("cuInit"),
            dev_get: sym!("cuDeviceGet"),
            attr: sym!("cuDeviceGetAttribute"),
            retain: sym!("cuDevicePrimaryCtxRetain"),
            release: sym!("cuDevicePrimaryCtxRelease_v2"),
            set_cur: sym!("cuCtxSetCurrent"),
            alloc: sym!("cuMemAlloc_v2"),
            free: sym!("cuMemFree_v2"),
            export: sym!("cuMemGetHandleForAddressRange"),
        })
    }
}

/// cuInit, then device `ordinal`: None where there is none to probe (could not check) or the
/// driver failed.
fn device(cuda: &Cuda, api: &CudaApi, ordinal: c_int, r: &mut Report) -> Option<c_int> {
    let mut dev = 0;
    // SAFETY: plain driver API calls with valid out-pointers.
    let rc = unsafe { (api.init)(0) };
    if rc == CUDA_ERROR_NO_DEVICE {
        r.push(Check::new(
            "dmabuf.init",
            Status::CouldNotCheck,
            format!("cuInit: {}: no GPU here, the GPU steps cannot run", cuda.err_name(rc)),
        ));
        r.could_not_check("libcuda finds no GPU");
        return None;
    }
    if rc != 0 {
        r.push(
            Check::new("dmabuf.init", Status::Fail, format!("cuInit failed: {}", cuda.err_name(rc)))
                .fix("no usable GPU, or kernel module and libcuda versions differ (doctor's driver.versions)"),
        );
        return None;
    }
    // SAFETY: as above.
    let rc = unsafe { (api.dev_get)(&mut dev, ordinal) };
    if rc == CUDA_ERROR_INVALID_DEVICE {
        r.push(Check::new(
            "dmabuf.init",
            Status::CouldNotCheck,
            format!("cuDeviceGet({ordinal}): {}: there is no device {ordinal}", cuda.err_name(rc)),
        ));
        r.could_not_check(format!("no CUDA device {ordinal} here (--device)"));
        return None;
    }
    if rc != 0 {
        r.push(Check::new(
            "dmabuf.init",
            Status::Fail,
            format!("cuDeviceGet({ordinal}) failed: {}", cuda.err_name(rc)),
        ));
        return None;
    }
    Some(dev)
}

/// What the driver says of the device: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.
fn dma_buf_attribute(cuda: &Cuda, api: &CudaApi, dev: c_int, ordinal: c_int, r: &mut Report) {
    let mut v = 0;
    // SAFETY: a driver API call with a valid out-pointer.
    let rc = unsafe { (api.attr)(&mut v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) };
    if rc == 0 && v == 1 {
        r.push(Check::new(
            "dmabuf.attribute",
            Status::Pass,
            format!("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 1 on device {ordinal}"),
        ));
    } else {
        r.push(
            Check::new(
                "dmabuf.attribute",
                Status::Warn,
                format!(
                    "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = {v} ({}) on device {ordinal}: the driver says it cannot export DMA-BUF",
                    cuda.err_name(rc)
                ),
            )
            .fix("GeForce: use gdrshim instead; otherwise the open kernel module and a kernel with CONFIG_DMA_SHARED_BUFFER (nvidia_drm modeset is not read by the export)"),
        );
    }
}

/// Steps 1 to 3 in the device's context: allocate, export as a DMA-BUF, register on each HCA.
fn gpu_steps(
    cuda: &Cuda,
    api: &CudaApi,
    dev: c_int,
    ordinal: c_int,
    size: usize,
    libibverbs: &str,
    r: &mut Report,
) {
    let mut ctx = core::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is released below.
    let rc = unsafe { (api.retain)(&mut ctx, dev) };
    // SAFETY: ctx came from retain.
    if rc != 0 || unsafe { (api.set_cur)(ctx) } != 0 {
        r.push(Check::new(
            "dmabuf.alloc",
            Status::Fail,
            format!("no CUDA context on device {ordinal}: {}", cuda.err_name(rc)),
        ));
        return;
    }
    let mut ptr = 0u64;
    // SAFETY: a valid out-pointer; freed below.
    let rc = unsafe { (api.alloc)(&mut ptr, size) };
    if rc != 0 {
        r.push(Check::new(
            "dmabuf.alloc",
            Status::Fail,
            format!(
                "step 1, cuMemAlloc({size}) (what cudaMalloc does) failed: {}",
                cuda.err_name(rc)
            ),
        ));
        // SAFETY: releasing the context retained above.
        unsafe { (api.release)(dev) };
        return;
    }
    r.push(Check::new(
        "dmabuf.alloc",
        Status::Pass,
        format!("step 1: {size} bytes of GPU memory at {ptr:#x}"),
    ));
    let mut fd: c_int = -1;
    // SAFETY: the handle for DMA_BUF_FD is an int; [ptr, ptr+size) is our allocation.
    let rc = unsafe {
        (api.export)(
            &mut fd as *mut c_int as *mut c_void,
            ptr,
            size,
            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if rc != 0 || fd < 0 {
        r.push(
            Check::new("dmabuf.export", Status::Fail, format!("step 2, cuMemGetHandleForAddressRange(DMA_BUF_FD) failed: {}", cuda.err_name(rc)))
                .fix("CUDA_ERROR_NOT_SUPPORTED (801) is what a GeForce returns (use gdrshim); on Hopper/Blackwell: the open kernel module and a kernel with CONFIG_DMA_SHARED_BUFFER (not nvidia_drm modeset: the export does not read it)"),
        );
    } else {
        r.push(Check::new(
            "dmabuf.export",
            Status::Pass,
            format!("step 2: DMA-BUF fd {fd} for the allocation"),
        ));
        verbs_step(r, libibverbs, fd, ptr, size);
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    }
    // SAFETY: our allocation and context.
    unsafe {
        (api.free)(ptr);
        (api.release)(dev);
    }
}

/// Step 3: the DMA-BUF registered on each HCA.
fn verbs_step(r: &mut Report, libibverbs: &str, fd: c_int, ptr: u64, size: usize) {
    // SAFETY: loading the system's libibverbs (or the one named), as any verbs program does.
    let lib = match unsafe { Library::new(libibverbs) } {
        Ok(l) => l,
        Err(e) => {
            r.push(
                Check::new(
                    "dmabuf.verbs",
                    Status::CouldNotCheck,
                    format!("{libibverbs} cannot be loaded ({e}): step 3 (ibv_reg_dmabuf_mr) cannot run here"),
                )
                .fix("install rdma-core (ibverbs-providers) on a machine with an HCA"),
            );
            r.could_not_check(
                "libibverbs cannot be loaded: step 3 (ibv_reg_dmabuf_mr) could not run",
            );
            return;
        }
    };
    // SAFETY: libibverbs symbols with their verbs.h signatures.
    let Ok(api) = (unsafe { VerbsApi::load(&lib) }) else {
        r.push(
            Check::new(
                "dmabuf.verbs",
                Status::Fail,
                "libibverbs lacks ibv_reg_dmabuf_mr: rdma-core older than v34",
            )
            .fix("upgrade rdma-core (≥ 34) and use a kernel ≥ 5.12"),
        );
        return;
    };
    let mut n = 0;
    // SAFETY: valid out-pointer; the list is freed below.
    let devs = unsafe { (api.list)(&mut n) };
    if devs.is_null() || n == 0 {
        r.push(Check::new("dmabuf.verbs", Status::CouldNotCheck, "libibverbs loaded, but there is no HCA (ibv_get_device_list found 0 devices): step 3, ibv_reg_dmabuf_mr, cannot run on this machine"));
        r.could_not_check("no HCA: step 3 (ibv_reg_dmabuf_mr) could not run");
        if !devs.is_null() {
            // SAFETY: from ibv_get_device_list.
            unsafe { (api.free_list)(devs) };
        }
        return;
    }
    for i in 0..n as usize {
        // SAFETY: i < n entries of the list.
        let d = unsafe { *devs.add(i) };
        r.push(register_on(&api, d, fd, ptr, size));
    }
    // SAFETY: from ibv_get_device_list.
    unsafe { (api.free_list)(devs) };
}

type List = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type Name = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type Open = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type Pd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type Reg = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void;
type Int = unsafe extern "C" fn(*mut c_void) -> c_int;
type FreeList = unsafe extern "C" fn(*mut *mut c_void);

/// The verbs calls step 3 makes.
struct VerbsApi<'l> {
    list: Symbol<'l, List>,
    name: Symbol<'l, Name>,
    open: Symbol<'l, Open>,
    alloc_pd: Symbol<'l, Pd>,
    reg: Symbol<'l, Reg>,
    dereg: Symbol<'l, Int>,
    dealloc: Symbol<'l, Int>,
    close: Symbol<'l, Int>,
    free_list: Symbol<'l, FreeList>,
}

impl<'l> VerbsApi<'l> {
    /// # Safety
    /// `lib` is a libibverbs: each name is the verbs.h function of that signature.
    unsafe fn load(lib: &'l Library) -> Result<VerbsApi<'l>, libloading::Error> {
        // SAFETY: the caller's promise: the verbs.h signatures.
        unsafe {
            Ok(VerbsApi {
                list: lib.get(b"ibv_get_device_list\0")?,
                name: lib.get(b"ibv_get_device_name\0")?,
                open: lib.get(b"ibv_open_device\0")?,
                alloc_pd: lib.get(b"ibv_alloc_pd\0")?,
                reg: lib.get(b"ibv_reg_dmabuf_mr\0")?,
                dereg: lib.get(b"ibv_dereg_mr\0")?,
                dealloc: lib.get(b"ibv_dealloc_pd\0")?,
                close: lib.get(b"ibv_close_device\0")?,
                free_list: lib.get(b"ibv_free_device_list\0")?,
            })
        }
    }
}

/// ibv_reg_dmabuf_mr of `fd` on device `d` of the list, in a context and PD of its own.
fn register_on(api: &VerbsApi, d: *mut c_void, fd: c_int, ptr: u64, size: usize) -> Check {
    // SAFETY: a device of the list.
    let dn = unsafe { CStr::from_ptr((api.name)(d)) }.to_string_lossy().into_owned();
    let id = format!("dmabuf.reg.{dn}");
    // SAFETY: a device of the list.
    let ctx = unsafe { (api.open)(d) };
    if ctx.is_null() {
        return Check::new(
            &id,
            Status::Fail,
            format!("ibv_open_device({dn}) failed: {}", errno_text(errno())),
        )
        .fix("missing /dev/infiniband/uverbs* (containers: --device), or ib_uverbs not loaded");
    }
    // SAFETY: an open context.
    let pd = unsafe { (api.alloc_pd)(ctx) };
    if pd.is_null() {
        let c = Check::new(
            &id,
            Status::Fail,
            format!("ibv_alloc_pd({dn}) failed: {}", errno_text(errno())),
        );
        // SAFETY: our context.
        unsafe { (api.close)(ctx) };
        return c;
    }
    // SAFETY: our pd and fd; iova = the GPU address, as NCCL registers it.
    let mr = unsafe {
        (api.reg)(
            pd,
            0,
            size,
            ptr,
            fd,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        )
    };
    let c = if mr.is_null() {
        let e = errno();
        let fix = match e {
            libc::EOPNOTSUPP | libc::EPROTONOSUPPORT => "the kernel or provider lacks DMA-BUF MRs: kernel ≥ 5.12 with CONFIG_DMA_SHARED_BUFFER and ib_umem_dmabuf, rdma-core ≥ 34, an HCA with ODP (ConnectX-6/7)",
            libc::EFAULT | libc::ENOMEM => "raise the locked-memory limit (ulimit -l unlimited; docker --ulimit memlock=-1)",
            libc::EINVAL => "the HCA driver refused the dma-buf (firmware too old, or this HCA has no DMA-BUF support)",
            _ => "see the kernel log (dmesg) for the HCA driver's reason",
        };
        Check::new(
            &id,
            Status::Fail,
            format!("step 3, ibv_reg_dmabuf_mr on {dn} failed: {}", errno_text(e)),
        )
        .fix(fix)
    } else {
        let c = Check::new(
            &id,
            Status::Pass,
            format!("step 3: ibv_reg_dmabuf_mr on {dn}: GPUDirect RDMA through DMA-BUF works, nvidia_peermem is not needed"),
        );
        // SAFETY: our MR.
        unsafe { (api.dereg)(mr) };
        c
    };
    // SAFETY: our pd and context.
    unsafe {
        (api.dealloc)(pd);
        (api.close)(ctx);
    }
    c
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
