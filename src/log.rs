//! Logging through `tracing`, written with plain `write(2)` so that it works before and during
//! hooking. Lines are prefixed like NCCL's: `host:pid:tid [gdrshim] LEVEL message`.
//!
//! The `log_*!` macros check the level first (an atomic load) and hand `tracing` one event per
//! level from [`emit`]. Not a `tracing` macro per call site: each of those is a static with a dozen
//! relocations, which the dynamic loader applies in every process the library is preloaded into
//! (a hundred of them were a third of the library's start-up cost per exec).

use crate::config::{expand_path, Config, Level};
use core::sync::atomic::Ordering;
use std::fmt;
use tracing::{Event, Subscriber};

/// GDRSHIM_LOG_FILE's file while it is ours; stderr without one, or once the program closed it.
static LOG_FILE: crate::fdtable::own::Kept = crate::fdtable::own::Kept::none();

/// The most verbose level written (`config::Level` as a number); 0 until logging is set up.
static MAX_LEVEL: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

/// Whether lines of `level` are written.
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// One line at `level` (the `log_*!` macros check [`enabled`] first).
#[cold]
#[inline(never)]
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    match level {
        Level::Error => tracing::error!("{args}"),
        Level::Warn => tracing::warn!("{args}"),
        Level::Info => tracing::info!("{args}"),
        Level::Debug => tracing::debug!("{args}"),
        Level::Trace => tracing::trace!("{args}"),
    }
}

/// Lines of one kind that may repeat without end (a miss per verbs call under a race, a refusal
/// per export): the first [`LIMIT_FIRST`] as they come, then at most one a second, saying how
/// many like it were held back. The total held back is in the summary (`lines_held=`).
pub const LIMIT_FIRST: u64 = 10;
struct Limited {
    key: &'static str,
    seen: u64,
    held: u64,
    last_ns: u64,
}
static LIMITS: parking_lot::Mutex<Vec<Limited>> = parking_lot::const_mutex(Vec::new());
static HELD: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Lines held back so far.
pub fn held() -> u64 {
    HELD.load(Ordering::Relaxed)
}

fn coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-buffer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether a line of kind `key` may be written now, with how many were held back since the last.
pub fn allow(key: &'static str) -> Option<u64> {
    let now = coarse_ns();
    let mut l = LIMITS.lock();
    let i = match l.iter().position(|x| x.key == key) {
        Some(i) => i,
        None => {
            l.push(Limited { key, seen: 0, held: 0, last_ns: 0 });
            l.len() - 1
        }
    };
    let x = &mut l[i];
    x.seen += 1;
    if x.seen <= LIMIT_FIRST || now.saturating_sub(x.last_ns) >= 1_000_000_000 {
        x.last_ns = now;
        Some(core::mem::take(&mut x.held))
    } else {
        x.held += 1;
        HELD.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// A rate-limited line (see [`allow`]).
#[cold]
#[inline(never)]
pub fn emit_held(level: Level, held: u64, args: fmt::Arguments<'_>) {
    if held > 0 {
        emit(level, format_args!("{args} ({held} more like this held back since the last)"));
    } else {
        emit(level, args);
    }
}

#[macro_export]
macro_rules! log_limited {
    ($level:expr, $key:expr, $($arg:tt)+) => {
        if $crate::log::enabled($level) {
            if let Some(held) = $crate::log::allow($key) {
                $crate::log::emit_held($level, held, format_args!($($arg)+))
            }
        }
    };
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)+) => {
        if $crate::log::enabled($level) {
            $crate::log::emit($level, format_args!($($arg)+))
        }
    };
}
#[macro_export]
macro_rules! log_error { ($($arg:tt)+) => { $crate::log_at!($crate::config::Level::Error, $($arg)+) }; }
#[macro_export]
macro_rules! log_warn { ($($arg:tt)+) => { $crate::log_at!($crate::config::Level::Warn, $($arg)+) }; }
#[macro_export]
macro_rules! log_info { ($($arg:tt)+) => { $crate::log_at!($crate::config::Level::Info, $($arg)+) }; }
#[macro_export]
macro_rules! log_debug { ($($arg:tt)+) => { $crate::log_at!($crate::config::Level::Debug, $($arg)+) }; }

pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    }
}

/// Writes all of `bytes` to the log file with one `write(2)` where possible, else to stderr.
pub fn write_raw(bytes: &[u8]) {
    // The library's own unit tests start its runtime inside the test harness's process, which has
    // no GPU: its warnings and exit summary there are noise in a passing suite's output
    // (GDRSHIM_UNIT_TEST_LOG=1 shows them).
    #[cfg(test)]
    if std::env::var_os("GDRSHIM_UNIT_TEST_LOG").is_none() {
        return;
    }
    let kept = LOG_FILE.num();
    if kept.is_some() && LOG_FILE.write_all(bytes) {
        return;
    }
    let _no_cancel = crate::sys::NoCancel::new();
    if let Some(n) = kept {
        // (the first line after the program closed it says so, here)
        let say = format!("gdrshim: the log file's fd {n} was closed by the program: gdrshim logs to stderr from now on\n");
        write_fd(2, say.as_bytes());
    }
    write_fd(2, bytes);
}

fn write_fd(fd: i32, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: the slice is valid for reads of len - off bytes.
        let n = unsafe {
            libc::write(fd, bytes[off..].as_ptr() as *const libc::c_void, bytes.len() - off)
        };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}

/// The subscriber: one NCCL-style line per event, written with `write(2)`. Hand-written rather
/// than tracing-subscriber's fmt layer: that one's registry, per-thread span stacks and formatting
/// layers cost a few hundred relocations and pages the dynamic loader touches in every process the
/// library is preloaded into, for features (spans, layers, filters) gdrshim does not use.
struct NcclLines {
    host: String,
    max: tracing::Level,
}

/// Writes an event's fields: the message as it is, any other field as ` name=value`.
struct Fields<'a>(&'a mut String);
impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for NcclLines {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= self.max
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(self.max))
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &Event<'_>) {
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid)) };
        let mut line = format!("{}:{pid}:{tid} [gdrshim] {} ", self.host, event.metadata().level());
        event.record(&mut Fields(&mut line));
        line.push('\n');
        write_raw(line.as_bytes());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Sets up logging once; returns warnings to print (they go to the chosen destination).
pub fn init(cfg: &Config) -> Vec<String> {
    let mut warnings = Vec::new();
    let host = host_name();
    if let Some(tpl) = &cfg.log_file {
        // SAFETY: getpid has no preconditions.
        let path = expand_path(tpl, &host, unsafe { libc::getpid() } as u32);
        match crate::files::open_private(&path) {
            Ok(fd) => LOG_FILE.keep(fd),
            Err(e) => {
                warnings.push(format!("GDRSHIM_LOG_FILE={path:?} refused: {e}; logging to stderr"))
            }
        }
    }
    let max = match cfg.level {
        Level::Error => tracing::Level::ERROR,
        Level::Warn => tracing::Level::WARN,
        Level::Info => tracing::Level::INFO,
        Level::Debug => tracing::Level::DEBUG,
        Level::Trace => tracing::Level::TRACE,
    };
    MAX_LEVEL.store(cfg.level as u8, Ordering::Relaxed);
    let sub = NcclLines { host, max };
    // Our own copy of tracing: the host program's subscriber (if any) is a different static.
    let _ = tracing::subscriber::set_global_default(sub);
    warnings
}

/// The exit summary: a bare line, whatever the level, so that tools can grep it.
pub fn summary_line(fields: &str) {
    write_raw(format!("gdrshim: summary {fields}\n").as_bytes());
}

/// A prefixed line written without `tracing` (for exit handlers, where thread-locals are gone).
pub fn raw_line(level: &str, msg: &str) {
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid)) };
    write_raw(format!("{}:{pid}:{tid} [gdrshim] {level} {msg}\n", host_name()).as_bytes());
}

/// Panics inside gdrshim are caught at every boundary; this makes each one a single log line
/// instead of std's multi-line report on the host's stderr. It is gdrshim's own copy of std,
/// so the host program's panic hook is untouched.
pub fn contain_panic_messages() {
    std::panic::set_hook(Box::new(|info| {
        let loc = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        raw_line(
            "ERROR",
            &format!("internal error at {loc}: {msg}; the call was passed through unchanged"),
        );
    }));
}
