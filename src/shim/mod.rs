//! The process-wide runtime behind the hooks: configuration, the driver ABI table, the tracker,
//! the registrar, the capture file and the counters. It starts at the `open` of an NVIDIA node by
//! its usual name (CUDA's initialisation), else at the first ioctl on an NVIDIA fd or the first
//! call of a CUDA driver entry point we wrap; in a copy loaded with `dlopen` (whose hooks see no
//! GPU touch), at its first query. A process that never touches a GPU never starts it.

use crate::abi::{self, AbiTable, DriverVersion};
use crate::capture::{self, IoctlRecord};
use crate::pipeline::{Core, Pipeline, Work, BACKLOG};

mod answers;
#[cfg(feature = "knobs")]
pub mod knob_stats;
#[cfg(feature = "knobs")]
pub mod knobs;
pub mod registrations;
mod route;
mod summary;
mod types;
use crate::activation::{active, HOOK, PAUSED};
use crate::config::{self, Config, Mode};
use crate::decode::{self, DevKind, Outcome, ParamReader};
use crate::registrar::Registrar;
use crate::sys::{contained, in_hook};
use crate::tracker::Tracker;
use answers::Answers;
use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use gdrshim_common::ncclconf::{self, FileText, FlushSettings};
use once_cell::sync::OnceCell;
use parking_lot::Mutex;
use route::RouteChoice;
use std::time::Duration;
pub use types::{Shim, ShimHotState, Stats};

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
    let s = try_get().or_else(|| contained(get))?;
    run_in(s, f)
}

fn run_in<R>(s: &'static Shim, f: impl FnOnce(&'static Shim) -> R) -> Option<R> {
    in_hook(|| {
        #[cfg(feature = "knobs")]
        if s.line.panic_in_hook {
            s.test_panic("hook");
        }
        f(s)
    })
    .ok()
}

static SHIM: OnceCell<Shim> = OnceCell::new();

/// The runtime; call only with a [`crate::sys::Guard`] held (initialisation reads files through our hooks).
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
    // start-up opens, reads and writes files (the driver's version, the log): a thread with a
    // cancellation pending is cancelled at its own next cancellation point, not inside ours
    let _no_cancel = crate::sys::NoCancel::new();
    let s = SHIM.get_or_init(Shim::init);
    HOOK.shim.store(s as *const Shim as *mut c_void, core::sync::atomic::Ordering::Release);
    s
}

#[inline]
pub fn try_get() -> Option<&'static Shim> {
    let p = HOOK.shim.load(core::sync::atomic::Ordering::Acquire) as *const Shim;
    // SAFETY: only get_cold stores this pointer: into the SHIM static, once it was initialised;
    // never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// A small file of ours read whole as text (`files::read_small`: the fd ours while it is read).
fn read_file(path: &str) -> Option<String> {
    match crate::files::read_small(path, 64 << 10)? {
        (bytes, true) => String::from_utf8(bytes).ok(),
        (_, false) => None,
    }
}

/// NCCL's flush variables as NCCL will see them with its configuration files (`ncclconf`): the
/// files read here, at start-up, with our own fds; /etc/passwd read as text for the real uid's
/// home (never `getpwuid`, which may load NSS modules under the loader lock).
fn nccl_flush_settings() -> FlushSettings {
    let env = |k: &str| std::env::var(k).ok();
    let conf_named = env(ncclconf::ENV_CONF_FILE).is_some_and(|f| !f.is_empty());
    let env_decides = env(config::ENV_NCCL_FORCE_FLUSH).is_some()
        && env(config::ENV_NCCL_FLUSH_DISABLE).is_some();
    let passwd_home = if conf_named || env_decides {
        None
    } else {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        crate::files::read_small("/etc/passwd", ncclconf::READ_LIMIT)
            .and_then(|(text, _)| ncclconf::passwd_home(&text, uid))
    };
    FlushSettings::read(env, passwd_home.as_deref(), |path| {
        match crate::files::read_small(path, ncclconf::READ_LIMIT) {
            None => FileText::Absent,
            Some((bytes, true)) => FileText::Whole(bytes),
            Some((bytes, false)) => FileText::Cut(bytes),
        }
    })
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
        let (mut cfg, mut warnings) = Config::from_env(|k| std::env::var(k).ok());
        let nccl = nccl_flush_settings();
        cfg.count_nccl_files(&nccl);
        warnings.extend(crate::log::init(&cfg));
        crate::log::contain_panic_messages();
        for w in &warnings {
            crate::log_warn!("{w}");
        }
        crate::log_info!(
            "NCCL_NET_FORCE_FLUSH: {} (counted as forced: {}); NCCL_GDR_FLUSH_DISABLE: {}",
            nccl.force_flush_origin(),
            if nccl.force_flush { "yes" } else { "no" },
            nccl.flush_disabled_origin()
        );
        let version_path = match &cfg.knobs.dev_dir {
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
        let capture_file = crate::fdtable::own::Kept::none();
        if let Some(tpl) = &cfg.capture_file {
            // SAFETY: getpid has no preconditions.
            let path =
                crate::config::expand_path(
                    tpl,
                    &crate::log::host_name(),
                    unsafe { libc::getpid() } as u32,
                );
            // like the log file: never through a link, never somebody else's file
            match crate::files::open_private(&path) {
                Ok(fd) => capture_file.keep(fd),
                Err(e) => crate::log_warn!("GDRSHIM_CAPTURE={path:?} refused: {e}; not capturing"),
            }
        }
        let capture_fd = capture_file.num().unwrap_or(-1);
        // a copy loaded with dlopen: its hooks see nothing, so it never claims to register
        let in_place = crate::activation::hooks_in_place();
        if cfg.mode == Mode::Register && !in_place {
            crate::log_warn!("this copy of gdrshim was not preloaded (loaded with dlopen?): its hooks see nothing; it registers nothing and says so to NCCL");
        }
        let dry_run = cfg.mode != Mode::Register || !in_place;
        let backlog_max =
            if cfg.mode == Mode::Trace || crate::log::enabled(crate::config::Level::Debug) {
                1
            } else {
                BACKLOG
            };
        #[cfg(feature = "knobs")]
        crate::fdtable::closegate::set_use_delay_us(cfg.knobs.fd_use_delay_us);
        let rm = crate::rm::RealRm::new(
            table.unwrap_or(abi::table_for(DriverVersion(580, 0, 0)).expect("a known branch")),
            cfg.knobs.dev_dir.as_deref(),
        );
        let core = Core {
            tracker: Box::new(Tracker::new()),
            registrar: Box::new(Registrar::undecided(dry_run)),
            decoded: 0,
            rm,
        };
        let registering = cfg.mode == Mode::Register && table.is_some() && in_place;
        let pipeline = Pipeline::new(
            core,
            backlog_max,
            !cfg.knobs.no_apply_thread,
            cfg.knobs.timing,
            registering,
        );
        let line = ShimHotState {
            table,
            capture_fd: AtomicI32::new(capture_fd),
            mode: cfg.mode,
            #[cfg(feature = "knobs")]
            timing: cfg.knobs.timing,
            #[cfg(feature = "knobs")]
            panic_in_ioctl: cfg.knobs.panic.as_deref() == Some("ioctl"),
            #[cfg(feature = "knobs")]
            panic_in_hook: cfg.knobs.panic.as_deref() == Some("hook"),
            cuda_frees: AtomicU64::new(0),
            registering,
        };
        let shim = Shim {
            line,
            cfg,
            version,
            pipeline,
            release_gate: parking_lot::RwLock::new(()),
            route_choice: RouteChoice::default(),
            stood_aside_logged: core::sync::atomic::AtomicBool::new(false),
            answers: Answers::default(),
            dereg_tickets: AtomicU64::new(1),
            #[cfg(feature = "knobs")]
            clock_mark: crate::sys::Clock::mark(),
            capture_lock: Mutex::new(()),
            capture_file,
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
        if !self.capture_file.write_all(s.as_bytes()) {
            // the program closed our capture file's fd: capturing ends here
            self.line.capture_fd.store(-1, Relaxed);
            crate::log_warn!(
                "the capture file's fd {fd} was closed by the program: capturing stopped"
            );
        }
    }

    /// The core with every hook's work applied to it (see [`Pipeline::core`]).
    pub fn core(&self, wait: Duration) -> Option<parking_lot::MutexGuard<'_, Core>> {
        self.pipeline.core(wait)
    }

    /// Hands what a verbs call came to to the registrar (`Pipeline::settle`).
    pub(crate) fn settle(&self, o: crate::registrar::Outcome) {
        #[cfg(feature = "knobs")]
        let keep_only = self.cfg.knobs.settle_late;
        #[cfg(not(feature = "knobs"))]
        let keep_only = false;
        self.pipeline.settle(o, registrations::WAIT, keep_only);
    }

    /// Some MR may hold a registration of ours: a deregistration must look.
    pub fn may_hold_mrs(&self) -> bool {
        self.pipeline.may_hold_mrs()
    }

    /// Hands work to the core (see [`Pipeline::push`]).
    pub(crate) fn queue(&'static self, w: Work) -> Result<(), Work> {
        self.pipeline.push(w)
    }

    /// gdrshim registers GPU memory for verbs in this process: register mode on a known ABI.
    pub fn registering(&self) -> bool {
        self.line.registering
    }

    pub fn mark(&self, text: &str) {
        self.capture(&format!("M {text}"));
    }

    /// Called after every real ioctl on an NVIDIA fd.
    ///
    /// # Safety
    /// `arg` is the pointer the caller passed to `ioctl`; it is only read when `rc == 0`, which
    /// means the kernel just copied the encoded number of bytes to and from it.
    pub unsafe fn after_ioctl(
        &'static self,
        dev: DevKind,
        fd: i32,
        request: u64,
        rc: i32,
        arg: *mut c_void,
    ) {
        // The usual call is decoded and queued; everything else leaves this path at once (out
        // of line, so that the path stays a few cache lines of code).
        #[cfg(feature = "knobs")]
        if self.panics_in_ioctl() {
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
                crate::log_info!(
                    "{} fd={fd} request={request:#x} rc={rc} errno={} (failed, not decoded)",
                    dev.tag(),
                    crate::sys::errno()
                );
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
                    crate::log_info!(
                        "{} fd={fd} request={request:#x} status={status:#x} {}",
                        dev.tag(),
                        abi::status::name(status)
                    );
                }
            }
            Outcome::Malformed(why) => {
                self.stats.malformed.fetch_add(1, Relaxed);
                crate::log_debug!(
                    "{} fd={fd} request={request:#x}: {why}; passed through, not decoded",
                    dev.tag()
                );
            }
            Outcome::Ignored => {
                self.stats.not_decoded.fetch_add(1, Relaxed);
                if self.line.mode == Mode::Trace {
                    crate::log_info!(
                        "{} fd={fd} nr={:#x} size={} (not decoded)",
                        dev.tag(),
                        abi::ioc_nr(request),
                        abi::ioc_size(request)
                    );
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn event_dropped(&self, ev: &decode::Event) {
        self.stats.dropped.fetch_add(1, Relaxed);
        crate::log_error!(
            "tracker lock not available for 5 s; event dropped: {ev}; the map may now describe memory that is gone, so this \
             process registers and exports nothing more (pass0 misses say so)"
        );
    }

    #[cold]
    #[inline(never)]
    fn capture_call(
        &self,
        dev: DevKind,
        fd: i32,
        request: u64,
        rc: i32,
        bytes: &[u8],
        t: &AbiTable,
    ) {
        // The embedded parameters only where RM accepted the call (then it copied exactly these
        // bytes from the pointer); a refused call's pointer may not even be readable.
        let params = capture::params_spec(dev, request, bytes, t)
            .filter(|_| decode::rm_accepted(request, bytes))
            .and_then(|(off, plen)| {
                let ptr = u64::from_le_bytes(bytes[off..off + 8].try_into().ok()?);
                LiveParams.read(ptr, plen).map(|p| (off, p))
            });
        self.capture(&IoctlRecord { dev, fd, request, rc, arg: bytes.to_vec(), params }.line());
    }

    /// A user allocation `[ptr, ptr+len)` returned by a CUDA entry point.
    pub fn user_allocation(
        &'static self,
        api: &'static str,
        ptr: u64,
        len: u64,
        ctx: crate::vamap::ContextTag,
    ) {
        #[cfg(feature = "knobs")]
        let t0 = self.line.timing.then(crate::sys::Clock::now);
        self.user_allocation_inner(api, ptr, len, ctx);
        #[cfg(feature = "knobs")]
        if let Some(t0) = t0 {
            self.stats.knobs.alloc_hook_ns.fetch_add(crate::sys::Clock::now() - t0, Relaxed);
            self.stats.knobs.alloc_hook_calls.fetch_add(1, Relaxed);
        }
    }
}

/// Trace mode's line for a decoded call (out of line: the other modes never take it).
#[cold]
#[inline(never)]
fn trace_event(ev: &decode::Event) {
    crate::log_info!("{ev}");
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

extern "C" fn at_exit() {
    let _ = in_hook(|| {
        let _no_cancel = crate::sys::NoCancel::new();
        // a forked child that turned inert prints nothing
        if let Some(s) = try_get().filter(|_| active() || HOOK.active.load(Relaxed) == PAUSED) {
            crate::log::summary_line(&s.snapshot(true).line());
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
        assert_eq!(
            parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.288.01  Tue"),
            Some(DriverVersion(535, 288, 1))
        );
        assert_eq!(parse_proc_version("garbage"), None);
    }
}
