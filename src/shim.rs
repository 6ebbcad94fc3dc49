//! The process-wide runtime behind the hooks: configuration, the driver ABI table, the tracker,
//! the capture file and the counters. Initialised lazily on the first NVIDIA ioctl or CUDA call.

use crate::abi::{self, AbiTable, DriverVersion};
use crate::capture::{self, IoctlRecord};
use crate::config::{Config, Mode};
use crate::decode::{self, DevKind, Outcome, ParamReader};
use crate::registrar::Registrar;
use crate::tracker::Tracker;
use core::cell::Cell;
use core::ffi::c_void;
use core::sync::atomic::{
    AtomicI32, AtomicPtr, AtomicU64, AtomicU8,
    Ordering::{Relaxed, SeqCst},
};
use once_cell::sync::OnceCell;
use parking_lot::Mutex;
use std::time::Duration;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside gdrshim, so calls we make ourselves bypass our hooks.
pub struct Guard(());
impl Guard {
    pub fn enter() -> Option<Guard> {
        IN_SHIM.with(|g| if g.replace(true) { None } else { Some(Guard(())) })
    }
}
impl Drop for Guard {
    fn drop(&mut self) {
        IN_SHIM.with(|g| g.set(false));
    }
}

pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}
pub fn set_errno(e: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// What every hooked call reads first, in one cache line: between two NVIDIA calls the driver's
/// own work evicts the caches, and each line a hook touches is a miss.
#[repr(C, align(64))]
pub struct HookLine {
    /// 0 = not read yet, 1 = off, 2 = active, [`PAUSED`]. Read from the environment alone (and
    /// AT_SECURE), so that the off mode never initialises anything.
    active: AtomicU8,
    /// The runtime once it is initialised ([`get`]).
    shim: AtomicPtr<Shim>,
    /// libc's `ioctl`.
    pub ioctl: crate::real::NextFn,
}
pub static HOOK: HookLine =
    HookLine { active: AtomicU8::new(0), shim: AtomicPtr::new(core::ptr::null_mut()), ioctl: crate::real::NextFn::new(c"ioctl") };
const _: () = assert!(core::mem::size_of::<HookLine>() == 64);

/// `HOOK.active` while a benchmark has paused the hooks ([`bench_pause`]).
const PAUSED: u8 = 3;

/// GDRSHIM_BENCH_PAUSE=1 in shadow mode: `pause` makes every hook inert (as in off mode) until
/// it is called again with `false`. Between the two the map sees nothing: the benchmark pauses
/// only between whole alloc/free iterations. `false` when not allowed here.
pub fn bench_pause(s: &Shim, pause: bool) -> bool {
    if !s.cfg.bench_pause || s.cfg.mode != Mode::Shadow {
        return false;
    }
    let (from, to) = if pause { (2, PAUSED) } else { (PAUSED, 2) };
    let ok = HOOK.active.compare_exchange(from, to, Relaxed, Relaxed).is_ok();
    if ok && pause {
        s.stats.bench_pauses.fetch_add(1, Relaxed);
    }
    ok || HOOK.active.load(Relaxed) == to
}

#[inline(always)]
pub fn active() -> bool {
    match HOOK.active.load(Relaxed) {
        2 => true,
        0 => first_active(),
        _ => false, // 1: off; PAUSED: gdrshim_bench_pause
    }
}

/// The first look at the environment (every hook asks `active`: this part stays out of line).
/// Nothing here may wait on anything: a fork can catch another thread in the middle of it, and
/// a forked child must never wait for a thread it does not have.
#[cold]
#[inline(never)]
fn first_active() -> bool {
    // Secure execution (setuid/setgid, or /etc/ld.so.preload reaching a privileged
    // program): inert, and no environment variable is even read.
    // SAFETY: getauxval has no preconditions.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    // GDRSHIM_MODE (config::ENV_MODE) through libc's getenv: std's takes a lock that a fork
    // could leave held.
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    let mode = unsafe { libc::getenv(c"GDRSHIM_MODE".as_ptr()) };
    let off = secure
        || (!mode.is_null() && {
            // SAFETY: getenv returned a NUL-terminated string of the environment.
            let v = unsafe { core::ffi::CStr::from_ptr(mode) }.to_bytes();
            matches!(v.trim_ascii().to_ascii_lowercase().as_slice(), b"off" | b"0" | b"none")
        })
        || another_copy_first();
    if !off {
        // Before anything can start initialising: a fork while another thread is inside the
        // one-time initialisation would leave the child waiting on it forever.
        install_fork_handler();
    }
    // a forked child may have turned inert meanwhile: that stays
    let _ = HOOK.active.compare_exchange(0, if off { 1 } else { 2 }, Relaxed, Relaxed);
    HOOK.active.load(Relaxed) == 2
}

/// Whether another copy of gdrshim owns the process's global names (two copies preloaded, or this
/// one loaded again under another path): that copy does the work, this one stays inert and says
/// so once, so the process gets one registration per MR and one summary.
fn another_copy_first() -> bool {
    let Some(dlsym) = crate::real::real_dlsym() else { return false };
    // SAFETY: a lookup of a C-string name in the global scope.
    let global = unsafe { dlsym(libc::RTLD_DEFAULT, c"gdrshim_version".as_ptr()) };
    // (our own exported names may resolve to the other copy even from inside this one: the
    // object is told by the address of a function nobody can interpose)
    let (Some(theirs), Some(ours)) = (object_of(global), object_of(another_copy_first as *mut c_void)) else { return false };
    if theirs.0 == ours.0 {
        return false;
    }
    crate::log::raw_line(
        "WARN",
        &format!("another copy of gdrshim ({}) is loaded before this one ({}): this copy stays inert", theirs.1, ours.1),
    );
    true
}

/// The loaded object `p` lies in: its base address and file name.
fn object_of(p: *mut c_void) -> Option<(usize, String)> {
    if p.is_null() {
        return None;
    }
    // SAFETY: dladdr only reads the loader's tables; info is a valid out-buffer.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return None;
    }
    let name = if info.dli_fname.is_null() {
        "?".into()
    } else {
        // SAFETY: a C string of the loader's.
        unsafe { core::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
    };
    Some((info.dli_fbase as usize, name))
}

/// Whether this copy's hooks really see the process's calls: its names are the process's global
/// ones (not a copy loaded with `dlopen`, whose hooks nothing calls), and `ioctl` resolves to it
/// or to another interposer ahead of it, not straight to libc.
pub fn hooks_in_place() -> bool {
    let Some(dlsym) = crate::real::real_dlsym() else { return false };
    // SAFETY: lookups of C-string names in the global scope.
    let (version, ioctl) =
        unsafe { (dlsym(libc::RTLD_DEFAULT, c"gdrshim_version".as_ptr()), dlsym(libc::RTLD_DEFAULT, c"ioctl".as_ptr())) };
    let ours = object_of(hooks_in_place as *mut c_void).map(|o| o.0);
    ours.is_some() && object_of(version).map(|o| o.0) == ours && !ioctl.is_null() && ioctl != HOOK.ioctl.get()
}

/// Installs [`fork_child`] once; returns when it is installed. Threads that come while another
/// installs it wait for it, since none may go on to initialise without it. The state word
/// carries the installer's pid: a child forked in the middle finds its parent's installer gone
/// and installs the handler itself (its parent cannot have initialised anything yet).
fn install_fork_handler() {
    use core::sync::atomic::AtomicU64;
    const DONE: u64 = 2;
    static AT_FORK: AtomicU64 = AtomicU64::new(0);
    // SAFETY: getpid has no preconditions.
    let me = (unsafe { libc::getpid() } as u64) << 2 | 1;
    loop {
        match AT_FORK.compare_exchange(0, me, Relaxed, Relaxed) {
            Ok(_) => {
                // SAFETY: an extern "C" fn without arguments, as pthread_atfork requires.
                unsafe { libc::pthread_atfork(None, None, Some(fork_child)) };
                AT_FORK.store(DONE, core::sync::atomic::Ordering::Release);
                return;
            }
            Err(DONE) => return,
            Err(other) if other >> 2 != me >> 2 => {
                // installing in a process that is not this one: we were forked meanwhile
                let _ = AT_FORK.compare_exchange(other, 0, Relaxed, Relaxed);
            }
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// Runs `f` on the runtime from inside a hook: only when active and already started (an NVIDIA
/// fd's ioctl starts it; a process that never had one has no GPU memory to look up), with this
/// thread marked as inside gdrshim, a panic contained, and the caller's errno as it was. `None`
/// if it did not run.
pub fn call_in<R>(f: impl FnOnce(&'static Shim) -> R) -> Option<R> {
    if !active() {
        return None;
    }
    run_in(try_get()?, f)
}

/// [`call_in`] for the CUDA driver's entry points: a program that calls them uses a GPU, so the
/// runtime starts here if no NVIDIA ioctl has started it yet (cudart resolves its entry points
/// through `cuGetProcAddress` before it opens a device).
pub fn call_in_waking<R>(f: impl FnOnce(&'static Shim) -> R) -> Option<R> {
    if !active() {
        return None;
    }
    let s = try_get().or_else(|| {
        let e = errno();
        let s = std::panic::catch_unwind(get).ok();
        set_errno(e);
        s
    })?;
    run_in(s, f)
}

fn run_in<R>(s: &'static Shim, f: impl FnOnce(&'static Shim) -> R) -> Option<R> {
    let e = errno();
    let r = Guard::enter().and_then(|_g| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if s.line.panic_in_hook {
                s.test_panic("hook");
            }
            f(s)
        }))
        .ok()
    });
    set_errno(e);
    r
}

/// One counter per (device kind, request number): ctl 0..256, uvm 256..512, gpu 512..768.
pub struct PerRequest(pub [AtomicU64; 768]);
impl Default for PerRequest {
    fn default() -> Self {
        PerRequest([const { AtomicU64::new(0) }; 768])
    }
}
impl PerRequest {
    const KINDS: [&'static str; 3] = ["ctl", "uvm", "gpu"];
    /// The counter of one request on one kind of NVIDIA device.
    pub fn slot(dev: DevKind, request: u64) -> usize {
        let kind = match dev {
            DevKind::Ctl => 0,
            DevKind::Uvm => 1,
            DevKind::Gpu(_) => 2,
        };
        kind * 256 + (request as usize & 0xff)
    }
    /// `kind:nr` of a counter, as the summary prints it.
    fn label(i: usize) -> String {
        format!("{}:{:#x}", Self::KINDS[i / 256], i % 256)
    }
}
impl core::ops::Index<usize> for PerRequest {
    type Output = AtomicU64;
    fn index(&self, i: usize) -> &AtomicU64 {
        &self.0[i]
    }
}

#[derive(Default)]
pub struct Stats {
    pub failed: AtomicU64,
    /// Decoded, but the core's lock was not free within 5 s.
    pub dropped: AtomicU64,
    pub malformed: AtomicU64,
    pub not_decoded: AtomicU64,
    pub passthrough: AtomicU64,
    pub wrapped: AtomicU64,
    pub unwrapped: AtomicU64,
    pub dmabuf_mrs: AtomicU64,
    /// Full batches the helper thread applied (GDRSHIM_APPLY_THREAD).
    pub helper_batches: AtomicU64,
    /// Times `gdrshim_bench_pause` made the hooks inert.
    pub bench_pauses: AtomicU64,
    /// GDR probes answered differently from the driver (`advertise`).
    pub gdr_answers: AtomicU64,
    /// dma-bufs handed to CUDA's callers where libcuda refused (DMA-BUF route).
    pub dmabuf_served: AtomicU64,
    /// Exports `ibv_reg_dmabuf_mr` refused (the original call was delegated).
    pub dmabuf_refused: AtomicU64,
    /// With GDRSHIM_TIMING=1: clock ticks spent in the ioctl hook outside the real call
    /// (nanoseconds in the summary).
    pub hook_ns: AtomicU64,
    /// GDRSHIM_TIMING: hook time and calls per (device kind, request number), and in the CUDA
    /// allocation hooks, to find where the time goes.
    pub hook_ns_by_req: PerRequest,
    pub hook_calls_by_req: PerRequest,
    pub alloc_hook_ns: AtomicU64,
    pub alloc_hook_calls: AtomicU64,
    /// GDRSHIM_TIMING: clock ticks the helper thread spent applying its batches (not the
    /// program's time, but worth knowing).
    pub helper_ns: AtomicU64,
}

/// The pure core, behind one lock: the map and the registrations that depend on it.
pub struct Core {
    /// NVIDIA calls decoded into an event and applied (every reader catches up first, so it
    /// counts them all).
    pub decoded: u64,
    pub tracker: Box<Tracker>,
    pub registrar: Box<Registrar>,
    /// Our own RM calls (it owns the /dev/nvidiaN fds it exports on).
    pub rm: crate::rm::RealRm,
}

/// What the ioctl and allocation hooks hand to the core.
pub(crate) enum Work {
    Event(decode::Event),
    UserAllocation {
        api: &'static str,
        ptr: u64,
        len: u64,
    },
    /// CUDA handed out dma-buf `fd` for `[ptr, ptr+size)` (compared with libcuda's export).
    DmabufRequest {
        ptr: u64,
        size: u64,
        fd: i32,
    },
}

/// Most work items the hooks leave unapplied (512 × 72 bytes). Applying them in a batch is
/// cheaper than one by one: between two NVIDIA calls the driver's own work evicts the caches,
/// so a lone event pays for the tracker's code and tables coming back, a batch once. H200, the
/// 2 MiB cuMemAlloc/cuMemFree loop with/without the shim in one process: 1.0295 with none
/// waiting against 1.0222 with 128 (h200-variants); 128 → 512 one more −0.15 % (h200-variants2).
const BACKLOG: usize = 512;

/// How the helper thread learns of a full batch: it looks every millisecond while batches come,
/// and sleeps until woken after a second without one. The hooks wake it only then: a wake-up from
/// the hook cost the calling thread 30–60 µs on our 2-vCPU VM (about what the helper then spent
/// applying the batch, as if it ran on the caller's CPU), and on the H200 the 2 MiB loop measured
/// 1.0235 woken against 1.0181 polling (h200-variants3).
const HELPER_POLL: Duration = Duration::from_millis(1);
const HELPER_POLLS: u32 = 1000;

/// The hooks' work not applied yet, behind a lock of its own, so that a hook never waits for a
/// batch being applied. `handed` (a full batch given to the helper thread) is older than
/// `current`; batches are taken out and applied only under the core's lock, so they are applied
/// one after the other, in the order they were filled.
struct Queue {
    current: Vec<Work>,
    helper: Helper,
    /// Boxed: what the hooks touch on every call (this lock, `current`) stays in one cache line.
    rest: Box<QueueRest>,
}
struct QueueRest {
    /// Full and waiting for the helper thread; empty when none waits.
    handed: Vec<Work>,
    /// Emptied batches, for reuse: no allocation in the hooks once there are enough.
    spare: Vec<Vec<Work>>,
}
/// The queue and its lock, in a cache line of their own. The lock is released with a plain
/// store, not a locked instruction: that would make the hook wait until the line of the slot it
/// just wrote arrives (a cache miss after each driver call), where a store lets the core go on.
/// It is held for a push or a swap of batches only, so a waiter spins, then yields.
#[repr(C, align(64))]
struct QueueLine {
    locked: core::sync::atomic::AtomicBool,
    queue: core::cell::UnsafeCell<Queue>,
}
const _: () = assert!(core::mem::size_of::<QueueLine>() == 64);
// SAFETY: the queue is reached only through a QueueGuard, which exists while `locked` is held.
unsafe impl Sync for QueueLine {}

struct QueueGuard<'a>(&'a QueueLine);

impl QueueLine {
    fn new(q: Queue) -> QueueLine {
        QueueLine { locked: core::sync::atomic::AtomicBool::new(false), queue: core::cell::UnsafeCell::new(q) }
    }

    #[inline]
    fn try_lock_for(&self, wait: Duration) -> Option<QueueGuard<'_>> {
        use core::sync::atomic::Ordering::Acquire;
        match self.locked.compare_exchange(false, true, Acquire, Relaxed) {
            Ok(_) => Some(QueueGuard(self)),
            Err(_) => self.lock_contended(wait),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self, wait: Duration) -> Option<QueueGuard<'_>> {
        use core::sync::atomic::Ordering::Acquire;
        let deadline = std::time::Instant::now() + wait;
        for spin in 1u32.. {
            if !self.locked.load(Relaxed) && self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok() {
                return Some(QueueGuard(self));
            }
            if spin < 128 {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
                if spin % 256 == 0 && std::time::Instant::now() > deadline {
                    return None;
                }
            }
        }
        None
    }
}

impl core::ops::Deref for QueueGuard<'_> {
    type Target = Queue;
    fn deref(&self) -> &Queue {
        // SAFETY: this guard holds the lock, so no other reference to the queue exists.
        unsafe { &*self.0.queue.get() }
    }
}
impl core::ops::DerefMut for QueueGuard<'_> {
    fn deref_mut(&mut self) -> &mut Queue {
        // SAFETY: as in deref; `&mut self` makes this the only reference through this guard.
        unsafe { &mut *self.0.queue.get() }
    }
}
impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        self.0.locked.store(false, core::sync::atomic::Ordering::Release);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Helper {
    /// Started when the first batch is full.
    NotStarted,
    Running,
    /// Not wanted (GDRSHIM_APPLY_THREAD=0, trace mode, debug level) or could not be started:
    /// a full batch is applied by the thread that filled it.
    Inline,
}

impl Core {
    /// Applies `batch`, in order. `warn` gets the lines worth a warning.
    fn apply(&mut self, batch: &[Work], warn: &mut dyn FnMut(&str)) {
        let Core { tracker, registrar, decoded, .. } = self;
        for w in batch {
            match *w {
                Work::Event(ref ev) => {
                    *decoded += 1;
                    if let decode::Event::Free { h_client, h_object, .. } = *ev {
                        if h_client == h_object {
                            registrar.forget_client(h_client);
                        } else {
                            registrar.forget_freed(h_client, h_object);
                        }
                    }
                    for n in tracker.apply(ev) {
                        warn(&capture::notice_line(&n));
                    }
                }
                Work::UserAllocation { api, ptr, len } => {
                    if let Some(v) = tracker.user_allocation_quiet(ptr, len) {
                        warn(&capture::verdict_line(api, ptr, len, &v));
                    }
                }
                Work::DmabufRequest { ptr, size, fd } => {
                    if let Some(n) = tracker.dmabuf_request(ptr, size, fd) {
                        warn(&capture::notice_line(&n));
                    }
                }
            }
        }
    }
}

/// What the hooks read on every NVIDIA call (and the CUDA hooks' one count), in one cache line
/// (see [`HookLine`]); the queue of their work follows in the next.
#[repr(C, align(64))]
pub struct ShimLine {
    /// The ABI table of this driver; `None`: every call passes through undecoded.
    pub table: Option<&'static AbiTable>,
    pub(crate) capture_fd: AtomicI32,
    /// Work items that may wait in the queue: 1 (none wait) in trace mode and at debug level,
    /// where lines must come out in the order of the calls.
    backlog_max: u32,
    /// `cfg.mode`.
    pub mode: Mode,
    /// `cfg.timing`.
    pub timing: bool,
    /// GDRSHIM_TEST_PANIC=ioctl, =hook.
    panic_in_ioctl: bool,
    panic_in_hook: bool,
    /// Register mode on a known ABI ([`Shim::registering`]): registrations over memory that a
    /// call releases are taken down before the driver runs it ([`Shim::before_ioctl`]).
    pub registering: bool,
    /// Successful cuMemFree calls (the CUDA hooks' only count of their own).
    pub cuda_frees: AtomicU64,
}
const _: () = assert!(core::mem::size_of::<ShimLine>() == 64);

#[repr(C)]
pub struct Shim {
    pub line: ShimLine,
    /// The hooks' work not applied yet ([`Shim::queue`]).
    queue: QueueLine,
    /// `queue.handed` holds a batch: read by the helper thread without the queue's lock, so that
    /// it never waits on (nor is handed) the lock the hooks take on every call.
    batch_handed: core::sync::atomic::AtomicBool,
    /// The helper thread, to wake it ([`Shim::helper_loop`]).
    helper: OnceCell<std::thread::Thread>,
    helper_asleep: core::sync::atomic::AtomicBool,
    /// Reach it through [`Shim::core`], which applies the queue first.
    pub(crate) core_lock: Mutex<Core>,
    /// Registrations hold its write side, release-type driver calls its read side (`serve`).
    pub(crate) release_gate: parking_lot::RwLock<()>,
    /// `serve::ROUTE_*`: the route decision, readable without the core's lock.
    pub(crate) route_state: AtomicU8,
    pub cfg: Config,
    pub version: Option<DriverVersion>,
    capture_lock: Mutex<()>,
    pub stats: Stats,
    pub(crate) stood_aside_logged: core::sync::atomic::AtomicBool,
    /// One bit per CUDA device whose GDR attribute answer was logged.
    pub(crate) gdr_attr_logged: AtomicU64,
    /// MRs holding a registration: a deregistration with none live needs no lock.
    pub live_mrs: core::sync::atomic::AtomicUsize,
    /// (clock ticks, nanoseconds) at start, to turn GDRSHIM_TIMING's ticks into nanoseconds.
    clock_mark: (u64, u64),
}

static SHIM: OnceCell<Shim> = OnceCell::new();

/// The runtime; call only with a [`Guard`] held (initialisation reads files through our hooks).
#[inline]
pub fn get() -> &'static Shim {
    match try_get() {
        Some(s) => s,
        None => get_cold(),
    }
}

#[cold]
#[inline(never)]
fn get_cold() -> &'static Shim {
    let s = SHIM.get_or_init(Shim::init);
    HOOK.shim.store(s as *const Shim as *mut Shim, core::sync::atomic::Ordering::Release);
    s
}

#[inline]
pub fn try_get() -> Option<&'static Shim> {
    let p = HOOK.shim.load(core::sync::atomic::Ordering::Acquire);
    // SAFETY: a pointer into the SHIM static, stored once it was initialised; never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn read_file(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The first `N.N[.N]` token of /proc/driver/nvidia/version's first line.
pub fn parse_proc_version(text: &str) -> Option<DriverVersion> {
    let line = text.lines().next()?;
    line.split_whitespace().find_map(|tok| {
        if tok.contains('.') && tok.chars().all(|c| c.is_ascii_digit() || c == '.') {
            DriverVersion::parse(tok)
        } else {
            None
        }
    })
}

impl Shim {
    fn init() -> Shim {
        let (cfg, mut warnings) = Config::from_env(|k| std::env::var(k).ok());
        warnings.extend(crate::log::init(&cfg));
        crate::log::contain_panic_messages();
        for w in &warnings {
            crate::log_warn!("{w}");
        }
        let version_path = match &cfg.test_dev_dir {
            Some(d) => format!("{d}/version"),
            None => "/proc/driver/nvidia/version".to_string(),
        };
        let version = read_file(&version_path).as_deref().and_then(parse_proc_version);
        let table = version.and_then(abi::table_for);
        match (version, table) {
            (Some(v), Some(t)) => crate::log_info!("mode={} driver {v}, ABI table {}", cfg.mode.name(), t.since),
            (Some(v), None) => crate::log_warn!(
                "driver {v} has no verified ABI table in gdrshim {}: passing every NVIDIA call through untouched (unknown driver ABI)",
                env!("CARGO_PKG_VERSION")
            ),
            (None, _) => {
                crate::log_warn!("cannot read the driver version from {version_path}: passing every NVIDIA call through untouched")
            }
        }
        let capture_fd = match &cfg.capture_file {
            Some(tpl) => {
                // SAFETY: getpid has no preconditions.
                let path = crate::config::expand_path(tpl, &crate::log::host_name(), unsafe { libc::getpid() } as u32);
                // like the log file: never through a link, never somebody else's file
                crate::files::open_private(&path).unwrap_or_else(|e| {
                    crate::log_warn!("GDRSHIM_CAPTURE={path:?} refused: {e}; not capturing");
                    -1
                })
            }
            None => -1,
        };
        // a copy loaded with dlopen: its hooks see nothing, so it never claims to register
        let in_place = hooks_in_place();
        if cfg.mode == Mode::Register && !in_place {
            crate::log_warn!("this copy of gdrshim was not preloaded (loaded with dlopen?): its hooks see nothing; it registers nothing and says so to NCCL");
        }
        let dry_run = cfg.mode != Mode::Register || !in_place;
        let backlog_max = if cfg.mode == Mode::Trace || crate::log::enabled(crate::config::Level::Debug) { 1 } else { BACKLOG };
        let rm = crate::rm::RealRm::new(
            table.unwrap_or(abi::table_for(DriverVersion(580, 0, 0)).expect("a known branch")),
            cfg.test_dev_dir.as_deref(),
        );
        let core = Core { tracker: Box::new(Tracker::new()), registrar: Box::new(Registrar::undecided(dry_run)), decoded: 0, rm };
        let helper = if cfg.apply_thread && backlog_max > 1 { Helper::NotStarted } else { Helper::Inline };
        let queue =
            Queue { current: Vec::with_capacity(backlog_max), helper, rest: Box::new(QueueRest { handed: Vec::new(), spare: Vec::new() }) };
        let line = ShimLine {
            table,
            capture_fd: AtomicI32::new(capture_fd),
            backlog_max: backlog_max as u32,
            mode: cfg.mode,
            timing: cfg.timing,
            panic_in_ioctl: cfg.test_panic.as_deref() == Some("ioctl"),
            panic_in_hook: cfg.test_panic.as_deref() == Some("hook"),
            cuda_frees: AtomicU64::new(0),
            registering: cfg.mode == Mode::Register && table.is_some() && in_place,
        };
        let shim = Shim {
            line,
            cfg,
            version,
            queue: QueueLine::new(queue),
            batch_handed: core::sync::atomic::AtomicBool::new(false),
            helper: OnceCell::new(),
            helper_asleep: core::sync::atomic::AtomicBool::new(false),
            core_lock: Mutex::new(core),
            release_gate: parking_lot::RwLock::new(()),
            route_state: AtomicU8::new(crate::serve::ROUTE_UNDECIDED),
            stood_aside_logged: core::sync::atomic::AtomicBool::new(false),
            gdr_attr_logged: AtomicU64::new(0),
            live_mrs: core::sync::atomic::AtomicUsize::new(0),
            clock_mark: crate::hooks::ioctl::Clock::mark(),
            capture_lock: Mutex::new(()),
            stats: Stats::default(),
        };
        if let Some(v) = version {
            shim.capture(&format!("V {v}"));
        }
        if shim.cfg.summary {
            // SAFETY: at_exit is an extern "C" fn with no arguments, as atexit requires.
            unsafe { libc::atexit(at_exit) };
        }
        shim
    }

    pub(crate) fn capture(&self, line: &str) {
        let fd = self.line.capture_fd.load(Relaxed);
        if fd < 0 {
            return;
        }
        let _g = self.capture_lock.lock();
        let mut s = String::with_capacity(line.len() + 1);
        s.push_str(line);
        s.push('\n');
        let b = s.as_bytes();
        let mut off = 0;
        while off < b.len() {
            // SAFETY: b is valid for reads of the remaining length.
            let n = unsafe { libc::write(fd, b[off..].as_ptr() as *const c_void, b.len() - off) };
            if n <= 0 {
                break;
            }
            off += n as usize;
        }
    }

    /// The GDRSHIM_TIMING keys: the average, the five most expensive request kinds in total
    /// (`kind:nr:ns_per_call*calls`), and the CUDA allocation hooks.
    fn timing_fields(&self, nv_ioctls: u64) -> String {
        let s = &self.stats;
        let mut top: Vec<(u64, usize, u64)> =
            (0..768).map(|i| (s.hook_ns_by_req[i].load(Relaxed), i, s.hook_calls_by_req[i].load(Relaxed))).filter(|t| t.2 > 0).collect();
        top.sort_unstable_by_key(|t| core::cmp::Reverse(t.0));
        // the counters hold clock ticks: nanoseconds per tick over this run
        let k = crate::hooks::ioctl::Clock::ns_per_tick(self.clock_mark);
        let top: Vec<String> =
            top.iter().take(5).map(|&(ticks, i, n)| format!("{}:{:.0}*{n}", PerRequest::label(i), ticks as f64 * k / n as f64)).collect();
        format!(
            " hook_ns_per_nv_ioctl={:.0} hook_top={} alloc_hook_ns_per_call={:.0} helper_ns_per_batch={:.0}",
            s.hook_ns.load(Relaxed) as f64 * k / nv_ioctls.max(1) as f64,
            top.join(","),
            s.alloc_hook_ns.load(Relaxed) as f64 * k / s.alloc_hook_calls.load(Relaxed).max(1) as f64,
            s.helper_ns.load(Relaxed) as f64 * k / s.helper_batches.load(Relaxed).max(1) as f64
        )
    }

    /// `GDRSHIM_TEST_PANIC=<site>`: panics here, to prove the hook contains it.
    #[inline]
    pub fn test_panic(&self, site: &str) {
        if self.cfg.test_panic.as_deref() == Some(site) {
            panic!("GDRSHIM_TEST_PANIC={site}: injected panic");
        }
    }

    /// gdrshim registers GPU memory for verbs in this process: register mode on a known ABI.
    pub fn registering(&self) -> bool {
        self.line.registering
    }

    pub fn mark(&self, text: &str) {
        self.capture(&format!("M {text}"));
    }

    /// The core with every hook's work applied to it: the way in for anyone who reads or changes
    /// the map or the registrations. `None` if the lock is not free within `wait`.
    pub fn core(&self, wait: Duration) -> Option<parking_lot::MutexGuard<'_, Core>> {
        let mut c = self.core_lock.try_lock_for(wait)?;
        // a map that may lack queued calls is no map to decide on
        self.catch_up(&mut c, &mut |l| crate::log_limited!(crate::config::Level::Warn, "map notice", "{l}")).then_some(c)
    }

    /// Applies everything queued to `c` (whose lock the caller holds), oldest batch first;
    /// `false` if the queue's lock was not free within 5 s.
    pub(crate) fn catch_up(&self, c: &mut Core, warn: &mut dyn FnMut(&str)) -> bool {
        let (older, newer) = {
            let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) else { return false };
            if q.rest.handed.is_empty() && q.current.is_empty() {
                return true;
            }
            let fresh = q.rest.spare.pop().unwrap_or_default();
            let newer = core::mem::replace(&mut q.current, fresh);
            self.batch_handed.store(false, Relaxed);
            (core::mem::take(&mut q.rest.handed), newer)
        };
        c.apply(&older, warn);
        c.apply(&newer, warn);
        self.give_back(older, newer);
        true
    }

    /// Emptied batches go back to the queue for reuse.
    fn give_back(&self, a: Vec<Work>, b: Vec<Work>) {
        if let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) {
            for mut v in [a, b] {
                if v.capacity() > 0 && q.rest.spare.len() < 2 {
                    v.clear();
                    q.rest.spare.push(v);
                }
            }
        }
    }

    /// Hands work to the core: applied once its batch is full (on the helper thread), or before
    /// anyone reads the core. Gives the work back if the queue's lock is not free within 5 s.
    pub(crate) fn queue(&self, w: Work) -> Result<(), Work> {
        let Some(mut q) = self.queue.try_lock_for(Duration::from_secs(5)) else { return Err(w) };
        q.current.push(w);
        if q.current.len() >= self.line.backlog_max as usize {
            self.batch_full(q);
        }
        Ok(())
    }

    /// The current batch is full: to the helper thread if it is free, else applied here.
    #[cold]
    #[inline(never)]
    fn batch_full(&self, mut q: QueueGuard<'_>) {
        if q.helper == Helper::NotStarted {
            q.helper = match self.start_helper() {
                Ok(()) => Helper::Running,
                Err(e) => {
                    crate::log_info!("no helper thread ({e}): batches of the map's work are applied by the threads that fill them");
                    Helper::Inline
                }
            };
        }
        if q.helper == Helper::Running && q.rest.handed.is_empty() {
            let fresh = q.rest.spare.pop().unwrap_or_else(|| Vec::with_capacity(BACKLOG));
            let full = core::mem::replace(&mut q.current, fresh);
            q.rest.handed = full;
            self.batch_handed.store(true, SeqCst);
            drop(q);
            if self.helper_asleep.load(SeqCst) {
                if let Some(t) = self.helper.get() {
                    t.unpark();
                }
            }
            return;
        }
        // no helper, or it is still on the batch before: this thread catches up itself
        drop(q);
        drop(self.core(Duration::from_secs(5)));
    }

    /// The helper thread's loop: waits for a handed batch and applies it (and nothing newer, so
    /// that the hooks keep filling their batch undisturbed).
    fn helper_loop(&'static self) -> ! {
        let demote = cpu_has_cldemote();
        loop {
            let mut polls = 0u32;
            while !self.batch_handed.load(SeqCst) {
                if polls < HELPER_POLLS {
                    polls += 1;
                    std::thread::park_timeout(HELPER_POLL);
                } else {
                    self.helper_asleep.store(true, SeqCst);
                    if !self.batch_handed.load(SeqCst) {
                        std::thread::park();
                    }
                    self.helper_asleep.store(false, SeqCst);
                    polls = 0;
                }
            }
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let Some(mut c) = self.core_lock.try_lock_for(Duration::from_secs(5)) else { return };
                let batch = match self.queue.try_lock_for(Duration::from_secs(5)) {
                    Some(mut q) => {
                        self.batch_handed.store(false, Relaxed);
                        core::mem::take(&mut q.rest.handed)
                    }
                    None => return,
                };
                if batch.is_empty() {
                    return; // a reader caught up first
                }
                let t0 = self.line.timing.then(crate::hooks::ioctl::Clock::now);
                c.apply(&batch, &mut |l| crate::log_limited!(crate::config::Level::Warn, "map notice", "{l}"));
                drop(c);
                if demote {
                    demote_lines(&batch);
                }
                if let Some(t0) = t0 {
                    self.stats.helper_ns.fetch_add(crate::hooks::ioctl::Clock::now() - t0, Relaxed);
                }
                self.stats.helper_batches.fetch_add(1, Relaxed);
                self.give_back(batch, Vec::new());
            }));
        }
    }

    /// Starts the thread that applies handed batches ([`Shim::helper_loop`]), with every signal
    /// blocked: the program's handlers stay with the program's threads.
    fn start_helper(&self) -> std::io::Result<()> {
        // SAFETY: plain signal-set operations on local sets; pthread_sigmask changes only this
        // thread's mask, restored below, and the new thread inherits the full mask.
        let old = unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            old
        };
        let r = std::thread::Builder::new().name("gdrshim-apply".into()).stack_size(256 << 10).spawn(|| {
            // our own calls in this thread (the log file) bypass our hooks
            let _inside = Guard::enter();
            get().helper_loop()
        });
        // SAFETY: restores this thread's mask as it was.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
        let _ = self.helper.set(r?.thread().clone());
        Ok(())
    }

    /// Called after every real ioctl on an NVIDIA fd.
    ///
    /// # Safety
    /// `arg` is the pointer the caller passed to `ioctl`; it is only read when `rc == 0`, which
    /// means the kernel just copied the encoded number of bytes to and from it.
    pub unsafe fn after_ioctl(&self, dev: DevKind, fd: i32, request: u64, rc: i32, arg: *mut c_void) {
        // The usual call is decoded and queued; everything else leaves this path at once (out
        // of line, so that the path stays a few cache lines of code).
        if self.line.panic_in_ioctl {
            self.test_panic("ioctl");
        }
        let Some(t) = self.line.table else {
            self.stats.passthrough.fetch_add(1, Relaxed);
            return;
        };
        let len = match decode::arg_len(dev, request, t) {
            Some(len) if rc == 0 && !arg.is_null() => len,
            _ => return self.not_decoded(dev, fd, request, rc),
        };
        // SAFETY: see the function contract; len is what the request encodes, and the caller's
        // buffer is not touched by anyone else while its own ioctl call is in progress.
        let bytes: &[u8] = unsafe { std::slice::from_raw_parts(arg as *const u8, len) };
        if self.line.capture_fd.load(Relaxed) >= 0 {
            self.capture_call(dev, fd, request, rc, bytes, t);
        }
        match decode::decode(dev, fd, request, rc, bytes, &LiveParams, t) {
            Outcome::Event(ev) => {
                if self.line.mode == Mode::Trace {
                    trace_event(&ev);
                }
                if let Err(Work::Event(ev)) = self.queue(Work::Event(ev)) {
                    self.event_dropped(&ev);
                }
            }
            other => self.not_an_event(dev, fd, request, other),
        }
    }

    /// A call not decoded before its bytes were looked at: it failed, or this branch's table does
    /// not know the request's size.
    #[cold]
    #[inline(never)]
    fn not_decoded(&self, dev: DevKind, fd: i32, request: u64, rc: i32) {
        if rc != 0 {
            self.stats.failed.fetch_add(1, Relaxed);
            if self.line.mode == Mode::Trace {
                crate::log_info!("{} fd={fd} request={request:#x} rc={rc} errno={} (failed, not decoded)", dev.tag(), crate::shim::errno());
            }
        } else {
            self.stats.not_decoded.fetch_add(1, Relaxed);
            if self.line.mode == Mode::Trace {
                crate::log_info!("{} fd={fd} request={request:#x} (not decoded)", dev.tag());
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn not_an_event(&self, dev: DevKind, fd: i32, request: u64, o: Outcome) {
        match o {
            Outcome::Event(_) => {} // after_ioctl queues events itself
            Outcome::Failed { status, .. } => {
                self.stats.failed.fetch_add(1, Relaxed);
                if self.line.mode == Mode::Trace {
                    crate::log_info!("{} fd={fd} request={request:#x} status={status:#x} {}", dev.tag(), abi::status::name(status));
                }
            }
            Outcome::Malformed(why) => {
                self.stats.malformed.fetch_add(1, Relaxed);
                crate::log_debug!("{} fd={fd} request={request:#x}: {why}; passed through, not decoded", dev.tag());
            }
            Outcome::Ignored => {
                self.stats.not_decoded.fetch_add(1, Relaxed);
                if self.line.mode == Mode::Trace {
                    crate::log_info!("{} fd={fd} nr={:#x} size={} (not decoded)", dev.tag(), abi::ioc_nr(request), abi::ioc_size(request));
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn event_dropped(&self, ev: &decode::Event) {
        self.stats.dropped.fetch_add(1, Relaxed);
        crate::log_error!("tracker lock not available for 5 s; event dropped: {ev}");
    }

    #[cold]
    #[inline(never)]
    fn capture_call(&self, dev: DevKind, fd: i32, request: u64, rc: i32, bytes: &[u8], t: &AbiTable) {
        // The embedded parameters only where RM accepted the call (then it copied exactly these
        // bytes from the pointer); a refused call's pointer may not even be readable.
        let params =
            capture::params_spec(dev, request, bytes, t).filter(|_| decode::rm_accepted(request, bytes)).and_then(|(off, plen)| {
                let ptr = u64::from_le_bytes(bytes[off..off + 8].try_into().ok()?);
                LiveParams.read(ptr, plen).map(|p| (off, p))
            });
        self.capture(&IoctlRecord { dev, fd, request, rc, arg: bytes.to_vec(), params }.line());
    }

    /// A user allocation `[ptr, ptr+len)` returned by a CUDA entry point.
    pub fn user_allocation(&self, api: &'static str, ptr: u64, len: u64) {
        let t0 = self.line.timing.then(crate::hooks::ioctl::Clock::now);
        self.user_allocation_inner(api, ptr, len);
        if let Some(t0) = t0 {
            self.stats.alloc_hook_ns.fetch_add(crate::hooks::ioctl::Clock::now() - t0, Relaxed);
            self.stats.alloc_hook_calls.fetch_add(1, Relaxed);
        }
    }

    /// Every NVIDIA call seen: each ends in exactly one of these counts.
    fn nv_ioctls(&self, decoded: u64) -> u64 {
        let s = &self.stats;
        [&s.passthrough, &s.failed, &s.not_decoded, &s.malformed, &s.dropped].iter().map(|c| c.load(Relaxed)).sum::<u64>() + decoded
    }

    /// The counters of `gdrshim_counters`.
    pub fn counters(&self) -> crate::hooks::query::GdrshimCounters {
        let (t, r, live, decoded) = match self.core(Duration::from_secs(1)) {
            Some(c) => (c.tracker.counts, c.registrar.counts, c.registrar.live_registrations() as u64, c.decoded),
            None => (Default::default(), Default::default(), u64::MAX, 0),
        };
        crate::hooks::query::GdrshimCounters {
            nv_ioctls: self.nv_ioctls(decoded),
            native: t.native,
            matched: t.matched,
            mismatched: t.mismatched,
            unpredicted: t.unpredicted,
            pass0_hits: r.pass0_hits,
            pass0_misses: r.pass0_misses,
            registered: r.registered,
            unregistered: r.unregistered,
            rm_errors: r.rm_errors,
            live_registrations: live,
            host_mrs: r.host,
            stood_aside: r.stood_aside,
        }
    }

    pub fn summary_fields(&self) -> String {
        let (c, entries, objects, rc, live, p2p_live, decoded, dmabuf_live) = match self.core_lock.try_lock_for(Duration::from_millis(200))
        {
            Some(mut core) => {
                let dmabuf_live = core.registrar.dmabuf_mrs();
                // At exit thread-locals may be gone, so no `tracing` here: plain lines only.
                let _ = self.catch_up(&mut core, &mut |l| crate::log::raw_line("WARN", l));
                let live = core.registrar.live_registrations();
                let p2p_live = core.registrar.p2p_objects();
                let rc = core.registrar.counts;
                let decoded = core.decoded;
                let t = &mut core.tracker;
                for left in t.finish() {
                    crate::log::raw_line("INFO", &format!("native registration never predicted, still live at exit: {left}"));
                }
                (t.counts, t.map.entries(), t.objects(), rc, live, p2p_live, decoded, dmabuf_live)
            }
            None => (Default::default(), 0, 0, Default::default(), 0, 0, 0, 0),
        };
        let route = match self.route_state.load(Relaxed) {
            crate::serve::ROUTE_UNDECIDED => "undecided",
            _ => self.route().map_or("none", |r| r.name()),
        };
        let s = &self.stats;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        format!(
            "pid={pid} mode={} driver={} abi={} nv_ioctls={} decoded={} failed={} malformed={} not_decoded={} passthrough={} native={} matched={} mismatched={} unpredicted={} predicted_only={} user_allocs={} uncovered={} map_entries={entries} rm_objects={objects} wrapped={} unwrapped={} cuda_frees={}{} pass0_hits={} pass0_misses={} registered={} unregistered={} rm_errors={} host_mrs={} dmabuf_mrs={} stood_aside={} p2p_objects={} p2p_live={p2p_live} live_registrations={live} lines_held={} route={route} dmabuf_exports={} dmabuf_served={} dmabuf_refused={} dmabuf_live={dmabuf_live} dmabuf_native={} dmabuf_matched={} dmabuf_mismatched={} odp_mrs={} gdr_answers={} helper_batches={}{}",
            self.cfg.mode.name(),
            self.version.map_or("unknown".to_string(), |v| v.to_string()),
            self.line.table.map_or("none", |t| t.since),
            self.nv_ioctls(decoded),
            decoded,
            s.failed.load(Relaxed),
            s.malformed.load(Relaxed),
            s.not_decoded.load(Relaxed),
            s.passthrough.load(Relaxed),
            c.native,
            c.matched,
            c.mismatched,
            c.unpredicted,
            c.predicted_only,
            c.user_allocs,
            c.uncovered,
            s.wrapped.load(Relaxed),
            s.unwrapped.load(Relaxed),
            self.line.cuda_frees.load(Relaxed),
            if self.cfg.timing { self.timing_fields(self.nv_ioctls(decoded)) } else { String::new() },
            rc.pass0_hits,
            rc.pass0_misses,
            rc.registered,
            rc.unregistered,
            rc.rm_errors,
            rc.host,
            s.dmabuf_mrs.load(Relaxed),
            rc.stood_aside,
            rc.p2p_objects,
            crate::log::held(),
            rc.dmabuf_exports,
            s.dmabuf_served.load(Relaxed),
            s.dmabuf_refused.load(Relaxed),
            c.dmabuf_native,
            c.dmabuf_matched,
            c.dmabuf_mismatched,
            rc.odp,
            s.gdr_answers.load(Relaxed),
            s.helper_batches.load(Relaxed),
            match s.bench_pauses.load(Relaxed) {
                0 => String::new(),
                n => format!(" bench_pauses={n}"),
            },
        )
    }
}

/// Trace mode's line for a decoded call (out of line: the other modes never take it).
#[cold]
#[inline(never)]
fn trace_event(ev: &decode::Event) {
    crate::log_info!("{ev}");
}

thread_local! {
    /// This thread's stack `[low, high)`, asked once (`(0, 0)`: not yet; `(1, 1)`: unknown).
    static STACK: core::cell::Cell<(u64, u64)> = const { core::cell::Cell::new((0, 0)) };
}

fn stack_bounds() -> (u64, u64) {
    // SAFETY: attr is initialised by pthread_getattr_np before it is read, and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (1, 1);
        }
        let (mut addr, mut size) = (core::ptr::null_mut::<c_void>(), 0usize);
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() {
            return (1, 1);
        }
        (addr as u64, addr as u64 + size as u64)
    }
}

/// Whether `[addr, addr+len)` lies in this thread's stack above our own frame: the frames of our
/// callers, mapped and readable, so no system call is needed to read it safely. (Not when
/// running on a signal stack: then our frame is not in the thread's stack.)
#[inline(never)]
fn in_callers_frames(addr: u64, len: u64) -> bool {
    let probe = 0u8;
    let here = core::hint::black_box(core::ptr::addr_of!(probe)) as u64;
    let (lo, hi) = STACK.with(|s| {
        if s.get() == (0, 0) {
            s.set(stack_bounds());
        }
        s.get()
    });
    lo <= here && here < hi && here <= addr && addr.checked_add(len).is_some_and(|end| end <= hi)
}

/// Reads pieces `(offset, len)` of our own memory at `addr`, concatenated, without faulting on a
/// bad pointer: directly where it is in the callers' stack frames (libcuda's parameters are),
/// else with one `process_vm_readv`.
pub(crate) fn read_own_pieces(addr: u64, pieces: &[(usize, usize)]) -> Option<Vec<u8>> {
    let total: usize = pieces.iter().map(|p| p.1).sum();
    if pieces.len() > 4 || total == 0 {
        return None;
    }
    let mut buf = vec![0u8; total];
    if pieces.iter().all(|&(off, len)| addr.checked_add(off as u64).is_some_and(|a| in_callers_frames(a, len as u64))) {
        let mut at = 0;
        for &(off, len) in pieces {
            // SAFETY: in_callers_frames: these bytes are in our callers' stack frames, mapped and
            // readable, and nothing else writes them while their thread is in this call.
            let src = unsafe { core::slice::from_raw_parts((addr + off as u64) as *const u8, len) };
            buf[at..at + len].copy_from_slice(src);
            at += len;
        }
        return Some(buf);
    }
    let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: total };
    let mut remote = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; 4];
    for (r, &(off, len)) in remote.iter_mut().zip(pieces) {
        *r = libc::iovec { iov_base: addr.checked_add(off as u64)? as *mut c_void, iov_len: len };
    }
    // SAFETY: the kernel copies between our own address ranges and reports bad ones as errors;
    // `local` is our buffer of `total` bytes.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), pieces.len() as libc::c_ulong, 0) };
    (n == total as isize).then_some(buf)
}

/// Reads the caller's embedded parameter pointers.
struct LiveParams;
impl ParamReader for LiveParams {
    fn read(&self, ptr: u64, len: usize) -> Option<Vec<u8>> {
        if ptr == 0 || len == 0 {
            return None;
        }
        // SAFETY: followed only after RM answered NV_OK for the call (decode checks the status
        // before it asks; the capture asks decode::rm_accepted first), which means RM copied
        // exactly these `len` bytes (the class's or control's struct) from it.
        Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec())
    }
    fn read_small(&self, ptr: u64, len: usize) -> Option<decode::ParamBytes> {
        if ptr == 0 || len == 0 {
            return None;
        }
        // SAFETY: as in `read`: RM copied exactly these `len` bytes from `ptr` for this call.
        decode::ParamBytes::from_slice(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
    }
}

/// Whether this CPU has CLDEMOTE (CPUID leaf 7, ECX bit 25).
fn cpu_has_cldemote() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // leaf 0 says whether leaf 7 exists
        core::arch::x86_64::__cpuid(0).eax >= 7 && core::arch::x86_64::__cpuid_count(7, 0).ecx >> 25 & 1 == 1
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// After the helper applied a batch: its cache lines go from the helper's core to the shared
/// cache, so that the hooks, writing the next batches into the same buffer, do not have to take
/// them from the helper's core first. H200, 2 MiB / 4 KiB loop on/off in one process: 1.0113 /
/// 1.0104 against 1.0149 / 1.0156 without (h200-variants4).
fn demote_lines(batch: &[Work]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (start, len) = (batch.as_ptr() as usize, core::mem::size_of_val(batch));
        for line in (start & !63..start + len).step_by(64) {
            // SAFETY: CLDEMOTE [rax] (0F 1C /0, spelled as bytes for older assemblers) is a hint
            // that neither reads nor writes memory; called only where CPUID reports it.
            unsafe { core::arch::asm!(".byte 0x0f, 0x1c, 0x00", in("rax") line, options(nostack, preserves_flags, readonly)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = batch;
}

// fork() after the shim is up (so after CUDA was initialised in this process): the child can
// inherit locks held by threads that do not exist in it, and CUDA does not let a forked child use
// the parent's context anyway. The child turns inert (pure pass-through, no summary) until it
// execs, which starts a fresh shim; the parent is untouched.
extern "C" fn fork_child() {
    HOOK.active.store(1, Relaxed);
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(_g) = Guard::enter() else { return };
        // a forked child that turned inert prints nothing
        if let Some(s) = try_get().filter(|_| active() || HOOK.active.load(Relaxed) == PAUSED) {
            crate::log::summary_line(&s.summary_fields());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_version_line() {
        let t = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Nov 20 2025\nGCC version:  gcc version 13.3.0\n";
        assert_eq!(parse_proc_version(t), Some(DriverVersion(580, 159, 4)));
        assert_eq!(parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.288.01  Tue"), Some(DriverVersion(535, 288, 1)));
        assert_eq!(parse_proc_version("garbage"), None);
    }

    fn empty_queue() -> QueueLine {
        QueueLine::new(Queue {
            current: Vec::new(),
            helper: Helper::Inline,
            rest: Box::new(QueueRest { handed: Vec::new(), spare: Vec::new() }),
        })
    }

    #[test]
    fn the_queue_lock_excludes_and_gives_up_after_its_wait() {
        let q = std::sync::Arc::new(empty_queue());
        let held = q.try_lock_for(Duration::ZERO).unwrap();
        let t0 = std::time::Instant::now();
        assert!(q.try_lock_for(Duration::from_millis(50)).is_none(), "a held lock is not taken twice");
        assert!(t0.elapsed() >= Duration::from_millis(50));
        drop(held);
        // four threads push through the lock at once: nothing lost, nothing doubled
        let threads: Vec<_> = (0..4u64)
            .map(|k| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        q.try_lock_for(Duration::from_secs(5)).unwrap().current.push(Work::UserAllocation {
                            api: "t",
                            ptr: k << 32 | i,
                            len: 1,
                        });
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let g = q.try_lock_for(Duration::ZERO).unwrap();
        let mut seen: Vec<u64> = g.current.iter().map(|w| if let Work::UserAllocation { ptr, .. } = w { *ptr } else { u64::MAX }).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 80_000);
    }

    #[test]
    fn guard_is_not_reentrant() {
        let g = Guard::enter().unwrap();
        assert!(Guard::enter().is_none());
        drop(g);
        assert!(Guard::enter().is_some());
    }
}
