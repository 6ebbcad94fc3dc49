//! Environment configuration, read once. Every variable is documented in the README and in
//! `include/gdrshim.h`. A bad value gives a warning naming the variable and what it accepts, then
//! the default.
#![forbid(unsafe_code)]

use std::fmt;

pub use crate::mode_word;
// NCCL's flush variables and how NCCL reads their values: ncclconf's, named here too
pub use crate::ncclconf::{
    disables_flush, forces_flush, ENV_NCCL_FLUSH_DISABLE, ENV_NCCL_FORCE_FLUSH,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Pure pass-through: the hooks forward and do nothing else.
    Off,
    /// Decode every RM/UVM call and log it; build the map.
    Trace,
    /// Build the map, predict libcuda's registrations and compare with the native ones; at a
    /// verbs registration, decide and log what would be registered, register nothing.
    Shadow,
    /// Shadow, plus: register GPU memory with NV503C before delegating verbs registrations.
    Register,
}

impl Mode {
    /// What `gdrshim_mode()` answers.
    pub fn number(self) -> i32 {
        match self {
            Mode::Off => mode_word::OFF,
            Mode::Trace => mode_word::TRACE,
            Mode::Shadow => mode_word::SHADOW,
            Mode::Register => mode_word::REGISTER,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Trace => "trace",
            Mode::Shadow => "shadow",
            Mode::Register => "register",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    pub level: Level,
    pub log_file: Option<String>,
    pub capture_file: Option<String>,
    pub summary: bool,
    /// Register every user allocation when CUDA returns it, as libcuda does on datacenter GPUs,
    /// so that verbs users gdrshim does not intercept (UCX, MPI, static binaries) work too.
    pub eager: bool,
    /// `GDRSHIM_ADVERTISE_GDR`: answer NCCL's GPU-side GDR probe yes while gdrshim registers (see
    /// `advertise`). On unless set to 0.
    pub advertise_gdr: bool,
    /// `GDRSHIM_ADVERTISE_GDR=1` was set (not the default): a refusal for want of a route is then
    /// worth a line.
    pub advertise_gdr_asked: bool,
    /// `GDRSHIM_ROUTE`: how registrations reach the NIC (DMA-BUF, NV503C, or auto).
    pub route: crate::route::Wish,
    /// `NCCL_GDR_FLUSH_DISABLE` (NCCL's variable) is set non-zero, in the environment or, once
    /// [`Config::count_nccl_files`] ran, by a file NCCL reads: never advertise GDR then.
    pub nccl_flush_disabled: bool,
    /// `NCCL_NET_FORCE_FLUSH` (NCCL's variable) is a non-zero integer, in the environment or, once
    /// [`Config::count_nccl_files`] ran, by the files every NCCL version reads: NCCL flushes
    /// received GDR data on every GPU, also from sm_90 on.
    pub nccl_force_flush: bool,
    /// The tests' and benchmarks' knobs (all off in a release build).
    pub knobs: Knobs,
}

/// Test and benchmark knobs. A build with the `knobs` feature (the tests', the GPU machine's)
/// reads them from the environment; a release build never does, and says so once if one is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// `GDRSHIM_TIMING=1`: time the ioctl and allocation hooks (two clock reads per call).
    pub timing: bool,
    /// `GDRSHIM_BENCH_PAUSE=1`, shadow mode only: `gdrshim_bench_pause` may make the hooks inert
    /// for a while, so that one process can time its loop with and without the shim.
    pub bench_pause: bool,
    /// `GDRSHIM_APPLY_THREAD=0`: full batches are applied by the thread that filled them.
    pub no_apply_thread: bool,
    /// `GDRSHIM_TEST_DEV_DIR`: a folder whose `nvidiactl`, `nvidia-uvm`, `nvidiaN`, `version` and
    /// `sys/` stand in for the device nodes, /proc/driver/nvidia/version and /sys.
    pub dev_dir: Option<String>,
    /// `GDRSHIM_TEST_HIDE_GDR=1`: report `GPU_DIRECT_RDMA_SUPPORTED` as 0 (a GeForce, seen by NCCL).
    pub hide_gdr: bool,
    /// `GDRSHIM_TEST_HIDE_DMABUF=1`: hide libcuda's dma-buf support (attribute 124 reads 0,
    /// `cuMemGetHandleForAddressRange` answers as on a GeForce), so gdrshim's own exports are
    /// exercised on a datacenter GPU.
    pub hide_dmabuf: bool,
    /// `GDRSHIM_TEST_ASSUME_PEERMEM=1`: take nvidia-peermem as loaded, so the NV503C route is
    /// exercised against the real RM on a machine without it (no NIC reads the registrations).
    pub assume_peermem: bool,
    /// `GDRSHIM_TEST_PANIC=<site>`: panic inside the hooks of this family (`ioctl`, `hook`,
    /// `dlsym`) to prove panics are contained.
    pub panic: Option<String>,
    /// `GDRSHIM_TEST_SETTLE_LATE=1`: every verbs call's outcome is kept for the core's next
    /// holder, as when the core's lock is not had within the hooks' wait.
    pub settle_late: bool,
    /// `GDRSHIM_TEST_DEREG_QUEUED=1`: every deregistration begins by a queued outcome, as when
    /// the core's lock is not had within the hooks' wait.
    pub dereg_queued: bool,
    /// `GDRSHIM_TEST_FD_USE_DELAY_US=N`: N µs between gdrshim's check that an fd number is
    /// still its own and the call that uses it (the NIC's registration of a kept dma-buf, an
    /// export's ioctl on a GPU node), as a thread preempted there would spend.
    pub fd_use_delay_us: u32,
}

/// The knobs' variables.
pub const KNOB_VARS: [&str; 11] = [
    ENV_TIMING,
    ENV_BENCH_PAUSE,
    ENV_APPLY_THREAD,
    ENV_TEST_DEV_DIR,
    ENV_TEST_HIDE_GDR,
    ENV_TEST_HIDE_DMABUF,
    ENV_TEST_ASSUME_PEERMEM,
    ENV_TEST_PANIC,
    ENV_TEST_SETTLE_LATE,
    ENV_TEST_DEREG_QUEUED,
    ENV_TEST_FD_USE_DELAY_US,
];

impl Knobs {
    fn from_env(
        get: &impl Fn(&str) -> Option<String>,
        mode: Mode,
        warnings: &mut Vec<String>,
    ) -> Knobs {
        let mut k = Knobs {
            timing: flag(get, ENV_TIMING, false, warnings),
            bench_pause: flag(get, ENV_BENCH_PAUSE, false, warnings),
            no_apply_thread: !flag(get, ENV_APPLY_THREAD, true, warnings),
            dev_dir: get(ENV_TEST_DEV_DIR).filter(|s| !s.is_empty()),
            hide_gdr: flag(get, ENV_TEST_HIDE_GDR, false, warnings),
            hide_dmabuf: flag(get, ENV_TEST_HIDE_DMABUF, false, warnings),
            assume_peermem: flag(get, ENV_TEST_ASSUME_PEERMEM, false, warnings),
            panic: get(ENV_TEST_PANIC).filter(|s| !s.is_empty()),
            settle_late: flag(get, ENV_TEST_SETTLE_LATE, false, warnings),
            dereg_queued: flag(get, ENV_TEST_DEREG_QUEUED, false, warnings),
            fd_use_delay_us: get(ENV_TEST_FD_USE_DELAY_US)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
        };
        if k.bench_pause && mode != Mode::Shadow {
            warnings.push(format!(
                "{ENV_BENCH_PAUSE}=1 is for shadow mode only (a pause would leave registrations over memory freed meanwhile); ignored"
            ));
            k.bench_pause = false;
        }
        k
    }
}

pub const ENV_MODE: &str = "GDRSHIM_MODE"; // also read as a C string by activation::first_active
pub const ENV_LEVEL: &str = "GDRSHIM_LOG_LEVEL";
pub const ENV_LOG_FILE: &str = "GDRSHIM_LOG_FILE";
pub const ENV_CAPTURE: &str = "GDRSHIM_CAPTURE";
pub const ENV_SUMMARY: &str = "GDRSHIM_SUMMARY";
pub const ENV_EAGER: &str = "GDRSHIM_EAGER";
pub const ENV_TIMING: &str = "GDRSHIM_TIMING";
pub const ENV_BENCH_PAUSE: &str = "GDRSHIM_BENCH_PAUSE";
pub const ENV_APPLY_THREAD: &str = "GDRSHIM_APPLY_THREAD";
pub const ENV_TEST_DEV_DIR: &str = "GDRSHIM_TEST_DEV_DIR";
pub const ENV_ADVERTISE_GDR: &str = "GDRSHIM_ADVERTISE_GDR";
pub const ENV_TEST_HIDE_GDR: &str = "GDRSHIM_TEST_HIDE_GDR";
pub const ENV_ROUTE: &str = "GDRSHIM_ROUTE";
pub const ENV_TEST_HIDE_DMABUF: &str = "GDRSHIM_TEST_HIDE_DMABUF";
pub const ENV_TEST_ASSUME_PEERMEM: &str = "GDRSHIM_TEST_ASSUME_PEERMEM";
pub const ENV_TEST_PANIC: &str = "GDRSHIM_TEST_PANIC";
pub const ENV_TEST_SETTLE_LATE: &str = "GDRSHIM_TEST_SETTLE_LATE";
pub const ENV_TEST_DEREG_QUEUED: &str = "GDRSHIM_TEST_DEREG_QUEUED";
pub const ENV_TEST_FD_USE_DELAY_US: &str = "GDRSHIM_TEST_FD_USE_DELAY_US";

impl Default for Config {
    fn default() -> Self {
        Config {
            // zero configuration: LD_PRELOAD alone gives GDR (GDRSHIM_MODE=shadow for the old default)
            mode: Mode::Register,
            level: Level::Warn,
            log_file: None,
            capture_file: None,
            summary: true,
            eager: false,
            advertise_gdr: true,
            advertise_gdr_asked: false,
            route: crate::route::Wish::Auto,
            nccl_flush_disabled: false,
            nccl_force_flush: false,
            knobs: Knobs::default(),
        }
    }
}

impl Config {
    /// Parses from a variable getter; returns the config and the warnings to log once logging is up.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        if let Some(v) = get(ENV_MODE) {
            c.mode = match mode_word::effective(Some(v.as_bytes())) {
                mode_word::OFF => Mode::Off,
                mode_word::TRACE => Mode::Trace,
                mode_word::REGISTER => Mode::Register,
                _ => Mode::Shadow,
            };
            // a mode asked for but not understood registers nothing (on doubt, nothing)
            if mode_word::parse(v.as_bytes()).is_none() {
                warnings.push(format!("{ENV_MODE}={v:?} is not one of off, trace, shadow, register; using shadow (registers nothing)"));
            }
        }
        if let Some(v) = get(ENV_LEVEL) {
            match v.trim().to_ascii_lowercase().as_str() {
                "error" => c.level = Level::Error,
                "warn" | "warning" => c.level = Level::Warn,
                "info" => c.level = Level::Info,
                "debug" => c.level = Level::Debug,
                "trace" => c.level = Level::Trace,
                _ => warnings.push(format!(
                    "{ENV_LEVEL}={v:?} is not one of error, warn, info, debug, trace; using warn"
                )),
            }
        }
        if c.mode == Mode::Trace && get(ENV_LEVEL).is_none() {
            // Trace mode exists to print the calls.
            c.level = Level::Info;
        }
        c.log_file = get(ENV_LOG_FILE).filter(|s| !s.is_empty());
        c.capture_file = get(ENV_CAPTURE).filter(|s| !s.is_empty());
        if let Some(v) = get(ENV_SUMMARY) {
            match v.trim() {
                "0" | "no" | "false" => c.summary = false,
                "1" | "yes" | "true" => c.summary = true,
                _ => warnings.push(format!("{ENV_SUMMARY}={v:?} is not 0 or 1; using 1")),
            }
        }
        c.eager = flag(&get, ENV_EAGER, false, &mut warnings);
        c.advertise_gdr = flag(&get, ENV_ADVERTISE_GDR, true, &mut warnings);
        c.advertise_gdr_asked =
            matches!(get(ENV_ADVERTISE_GDR).as_deref().map(str::trim), Some("1" | "yes" | "true"));
        if let Some(v) = get(ENV_ROUTE) {
            match crate::route::Wish::parse(&v) {
                Some(w) => c.route = w,
                None => warnings.push(format!(
                    "{ENV_ROUTE}={v:?} is not one of auto, dmabuf, nv503c; using auto"
                )),
            }
        }
        // the environment's alone; the core and the tools add NCCL's files (`ncclconf`)
        c.nccl_flush_disabled = get(ENV_NCCL_FLUSH_DISABLE).as_deref().is_some_and(disables_flush);
        c.nccl_force_flush = get(ENV_NCCL_FORCE_FLUSH).as_deref().is_some_and(forces_flush);
        if cfg!(feature = "knobs") {
            c.knobs = Knobs::from_env(&get, c.mode, &mut warnings);
        } else {
            let set: Vec<&str> = KNOB_VARS.iter().copied().filter(|k| get(k).is_some()).collect();
            if !set.is_empty() {
                let verb = if set.len() == 1 { "works" } else { "work" };
                warnings.push(format!(
                    "{} only {verb} in test builds of gdrshim (the `knobs` feature); ignored",
                    set.join(", ")
                ));
            }
        }
        (c, warnings)
    }
}

impl Config {
    /// Takes NCCL's flush variables as NCCL will see them with its configuration files
    /// (`ncclconf`: the environment still wins, and every NCCL version's reading counts).
    pub fn count_nccl_files(&mut self, nccl: &crate::ncclconf::FlushSettings) {
        self.nccl_force_flush = nccl.force_flush;
        self.nccl_flush_disabled = nccl.flush_disabled;
    }
}

/// A 0/1 variable: a bad value warns and keeps the default.
fn flag(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
    warnings: &mut Vec<String>,
) -> bool {
    match get(name).as_deref().map(str::trim) {
        None => default,
        Some("0" | "no" | "false") => false,
        Some("1" | "yes" | "true") => true,
        Some(v) => {
            warnings.push(format!("{name}={v:?} is not 0 or 1; using {}", default as u8));
            default
        }
    }
}

/// Expands `%h` (host name) and `%p` (pid) in a path, as NCCL_DEBUG_FILE does.
pub fn expand_path(template: &str, host: &str, pid: u32) -> String {
    template.replace("%h", host).replace("%p", &pid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let m: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let (c, w) = parse(&[]);
        assert_eq!(c, Config::default());
        assert_eq!(c.mode, Mode::Register, "zero configuration: register by default");
        assert!(
            c.advertise_gdr && !c.advertise_gdr_asked,
            "GDR advertised by default, not asked for"
        );
        assert!(!c.nccl_flush_disabled && !c.nccl_force_flush);
        assert!(w.is_empty());
    }

    #[test]
    fn values() {
        let (c, w) = parse(&[
            ("GDRSHIM_MODE", " Trace "),
            ("GDRSHIM_LOG_FILE", "/tmp/x.%p"),
            ("GDRSHIM_SUMMARY", "0"),
        ]);
        assert_eq!((c.mode, c.level, c.summary), (Mode::Trace, Level::Info, false));
        assert_eq!(c.log_file.as_deref(), Some("/tmp/x.%p"));
        assert!(w.is_empty());
        assert_eq!(parse(&[("GDRSHIM_MODE", "off")]).0.mode, Mode::Off);
        assert_eq!(parse(&[("GDRSHIM_MODE", "register")]).0.mode, Mode::Register);
        assert_eq!(parse(&[("GDRSHIM_MODE", "shadow")]).0.mode, Mode::Shadow);
        assert_eq!(parse(&[("GDRSHIM_MODE", "none")]).0.mode, Mode::Off);
    }

    #[test]
    fn garbage_warns_and_keeps_the_default_but_a_garbled_mode_registers_nothing() {
        let (c, w) = parse(&[
            ("GDRSHIM_MODE", "\u{1b}[31mregister!"),
            ("GDRSHIM_LOG_LEVEL", "loud"),
            ("GDRSHIM_SUMMARY", "maybe"),
        ]);
        assert_eq!(c.mode, Mode::Shadow, "a mode asked for but not understood: nothing registered");
        assert_eq!(c.level, Level::Warn);
        assert!(c.summary);
        assert_eq!(w.len(), 3);
        assert!(
            w[0].contains("GDRSHIM_MODE")
                && w[0].contains("off, trace, shadow, register")
                && w[0].contains("using shadow"),
            "{w:?}"
        );
        assert!(w[1].contains("GDRSHIM_LOG_LEVEL"));
    }

    #[test]
    fn advertising_flags() {
        let (c, w) = parse(&[("GDRSHIM_ADVERTISE_GDR", "1"), ("NCCL_GDR_FLUSH_DISABLE", "0")]);
        assert!(c.advertise_gdr && c.advertise_gdr_asked && !c.nccl_flush_disabled && w.is_empty());
        for v in ["1", " 2", "x", ""] {
            assert!(parse(&[("NCCL_GDR_FLUSH_DISABLE", v)]).0.nccl_flush_disabled, "{v:?}");
        }
        let (c, w) = parse(&[("GDRSHIM_ADVERTISE_GDR", "0")]);
        assert!(!c.advertise_gdr && !c.advertise_gdr_asked && w.is_empty(), "turned down");
        let (c, w) = parse(&[("GDRSHIM_ADVERTISE_GDR", "sure")]);
        assert!(c.advertise_gdr && !c.advertise_gdr_asked, "a bad value keeps the default");
        assert!(w[0].contains("GDRSHIM_ADVERTISE_GDR") && w[0].contains("using 1"), "{w:?}");
    }

    #[test]
    fn a_forced_flush_only_from_a_clean_nonzero_integer() {
        for (v, forced) in [
            ("1", true),
            (" 2 ", true),
            ("-1", true),
            ("0", false),
            ("", false),
            ("yes", false),
            ("0x1", false),
        ] {
            assert_eq!(parse(&[("NCCL_NET_FORCE_FLUSH", v)]).0.nccl_force_flush, forced, "{v:?}");
        }
        assert!(!parse(&[]).0.nccl_force_flush);
    }

    #[test]
    fn route_choice() {
        assert_eq!(parse(&[]).0.route, crate::route::Wish::Auto);
        assert_eq!(parse(&[("GDRSHIM_ROUTE", "dmabuf")]).0.route, crate::route::Wish::Dmabuf);
        let (c, w) = parse(&[("GDRSHIM_ROUTE", "fastest")]);
        assert_eq!(c.route, crate::route::Wish::Auto);
        assert!(w[0].contains("GDRSHIM_ROUTE") && w[0].contains("auto, dmabuf, nv503c"), "{w:?}");
    }

    #[cfg(feature = "knobs")]
    #[test]
    fn knobs_are_read_in_a_knobs_build() {
        let k = parse(&[]).0.knobs;
        assert_eq!(k, Knobs::default());
        let (c, w) = parse(&[
            ("GDRSHIM_APPLY_THREAD", "0"),
            ("GDRSHIM_TEST_HIDE_GDR", "yes"),
            ("GDRSHIM_TIMING", "1"),
        ]);
        assert!(
            c.knobs.no_apply_thread && c.knobs.hide_gdr && c.knobs.timing && w.is_empty(),
            "{w:?}"
        );
        let (c, w) = parse(&[("GDRSHIM_APPLY_THREAD", "later"), ("GDRSHIM_TIMING", "lots")]);
        assert!(!c.knobs.no_apply_thread && !c.knobs.timing);
        assert!(w[0].contains("GDRSHIM_TIMING") && w[1].contains("GDRSHIM_APPLY_THREAD"), "{w:?}");
        let (c, w) = parse(&[("GDRSHIM_BENCH_PAUSE", "1"), ("GDRSHIM_MODE", "register")]);
        assert!(!c.knobs.bench_pause && w[0].contains("shadow mode only"), "{w:?}");
    }

    #[cfg(not(feature = "knobs"))]
    #[test]
    fn a_release_build_ignores_the_knobs_and_says_so() {
        let (c, w) = parse(&[
            ("GDRSHIM_TEST_HIDE_GDR", "1"),
            ("GDRSHIM_TIMING", "1"),
            ("GDRSHIM_TEST_DEV_DIR", "/tmp/x"),
        ]);
        assert_eq!(c.knobs, Knobs::default());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("GDRSHIM_TIMING, GDRSHIM_TEST_DEV_DIR, GDRSHIM_TEST_HIDE_GDR only work in test builds"), "{w:?}");
        let (_, w) = parse(&[("GDRSHIM_TIMING", "1")]);
        assert!(w[0].starts_with("GDRSHIM_TIMING only works in test builds"), "{w:?}");
    }

    #[test]
    fn path_expansion() {
        assert_eq!(expand_path("/tmp/g.%h.%p.log", "node1", 42), "/tmp/g.node1.42.log");
    }
}
