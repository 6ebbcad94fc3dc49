//! Logging through `tracing`, written with plain `write(2)` so that it works before and during
//! hooking. Lines are prefixed like NCCL's: `host:pid:tid [gdrshim] LEVEL message`.

use crate::config::{expand_path, Config, Level};
use core::sync::atomic::{AtomicI32, Ordering};
use std::ffi::CString;
use std::fmt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

static LOG_FD: AtomicI32 = AtomicI32::new(2);

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

/// Writes all of `bytes` to the log fd with one `write(2)` where possible.
pub fn write_raw(bytes: &[u8]) {
    let fd = LOG_FD.load(Ordering::Relaxed);
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: the slice is valid for reads of len - off bytes.
        let n = unsafe { libc::write(fd, bytes[off..].as_ptr() as *const libc::c_void, bytes.len() - off) };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}

pub struct FdWriter;
impl std::io::Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_raw(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct MakeFdWriter;
impl<'a> MakeWriter<'a> for MakeFdWriter {
    type Writer = FdWriter;
    fn make_writer(&'a self) -> FdWriter {
        FdWriter
    }
}

struct NcclStyle {
    host: String,
}

impl<S, N> FormatEvent<S, N> for NcclStyle
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid)) };
        write!(w, "{}:{}:{} [gdrshim] {} ", self.host, pid, tid, event.metadata().level())?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

fn open_log_file(path: &str) -> Result<i32, String> {
    let c = CString::new(path).map_err(|_| "path contains a NUL byte".to_string())?;
    let open = crate::real::open().ok_or("open() not found")?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: c is a valid C string; open has no other preconditions.
    let fd = unsafe { open(c.as_ptr(), flags, 0o600) };
    if fd < 0 {
        Err(std::io::Error::last_os_error().to_string())
    } else {
        Ok(fd)
    }
}

/// Sets up logging once; returns warnings to print (they go to the chosen destination).
pub fn init(cfg: &Config) -> Vec<String> {
    let mut warnings = Vec::new();
    let host = host_name();
    if let Some(tpl) = &cfg.log_file {
        // SAFETY: getpid has no preconditions.
        let path = expand_path(tpl, &host, unsafe { libc::getpid() } as u32);
        match open_log_file(&path) {
            Ok(fd) => LOG_FD.store(fd, Ordering::Relaxed),
            Err(e) => {
                warnings.push(format!("GDRSHIM_LOG_FILE={path:?} cannot be opened ({e}; symlinks are not followed); logging to stderr"))
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
    let sub = tracing_subscriber::fmt().with_max_level(max).with_writer(MakeFdWriter).event_format(NcclStyle { host }).finish();
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
        raw_line("ERROR", &format!("internal error at {loc}: {msg}; the call was passed through unchanged"));
    }));
}
