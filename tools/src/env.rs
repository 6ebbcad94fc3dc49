//! `env`: what the shim would do with this environment, on any machine (a login node without a
//! GPU too). It reads the variables through the library's own parser (gdrshim-common's `config`,
//! src/common/src/config.rs, the code the library runs), so a value the shim would refuse with a
//! warning at a job's first GPU call is a FAIL here, before the job; it adds what the parser does
//! not see: a variable name gdrshim does not read (a typo) and where `LD_PRELOAD` points.

use crate::config::{self, Config, Level, Mode};
use crate::ncclconf::{self, FileText, FlushSettings};
use crate::report::{Check, Report, Status};
use std::collections::BTreeMap;
use std::path::Path;

pub const AFTER_HELP: &str = "Reads GDRSHIM_*, NCCL_GDR_FLUSH_DISABLE, NCCL_NET_FORCE_FLUSH and LD_PRELOAD from this process's
environment (NAME=VALUE arguments add to it or replace) and says what the shim would do with them,
with the library's own parser: no GPU, driver or shim needed. NCCL's two flush variables count as
NCCL will see them with its configuration files ($NCCL_CONF_FILE or ~/.nccl.conf, then
/etc/nccl.conf: the environment wins), read here as the shim reads them; env.nccl-conf says which
file gave each. Which route works is the machine's (scripts/doctor says it).

Exit codes:
  0  the shim would take every value as written (WARN lines are worth reading)
  1  a value the shim would refuse (it would warn and use another), LD_PRELOAD naming the shim by
     a relative path or a file that is not there, or NCCL_GDR_FLUSH_DISABLE set
  2  a usage error";

/// `gdrshim-tool env`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Variables to judge as if set (they replace this environment's of the same name)
    #[arg(value_name = "NAME=VALUE", value_parser = assignment)]
    vars: Vec<(String, String)>,
    /// One JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

fn assignment(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v))
            if !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            Ok((n.into(), v.into()))
        }
        _ => Err(format!("'{s}' is not NAME=VALUE")),
    }
}

impl Args {
    pub fn run(self) -> Result<u8, String> {
        let mut vars: BTreeMap<String, String> = std::env::vars().collect();
        vars.extend(self.vars);
        Ok(judge(&vars).print("env", self.json))
    }
}

/// This machine's files, read for NCCL's variables: the real uid's home from /etc/passwd as
/// the shim reads it, each file as NCCL would find it.
fn nccl_files(vars: &BTreeMap<String, String>) -> FlushSettings {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let passwd = std::fs::read("/etc/passwd").ok();
    let home = passwd.and_then(|p| ncclconf::passwd_home(&p, uid));
    FlushSettings::read(
        |k| vars.get(k).cloned(),
        home.as_deref(),
        |path| {
            use std::io::Read;
            let Ok(f) = std::fs::File::open(path) else { return FileText::Absent };
            let mut bytes = Vec::new();
            match f.take(ncclconf::READ_LIMIT as u64 + 1).read_to_end(&mut bytes) {
                Ok(n) if n <= ncclconf::READ_LIMIT => FileText::Whole(bytes),
                _ => {
                    bytes.truncate(ncclconf::READ_LIMIT);
                    FileText::Cut(bytes)
                }
            }
        },
    )
}

/// The variables the library reads (src/common/src/config.rs), the release's and the test builds'
/// ones.
fn known() -> Vec<&'static str> {
    let mut v = vec![
        config::ENV_MODE,
        config::ENV_LEVEL,
        config::ENV_LOG_FILE,
        config::ENV_CAPTURE,
        config::ENV_SUMMARY,
        config::ENV_EAGER,
        config::ENV_ADVERTISE_GDR,
        config::ENV_ROUTE,
    ];
    v.extend(config::KNOB_VARS);
    v
}

pub fn judge(vars: &BTreeMap<String, String>) -> Report {
    judge_with(vars, &nccl_files(vars))
}

/// [`judge`] with NCCL's flush variables as `nccl` found them.
pub fn judge_with(vars: &BTreeMap<String, String>, nccl: &FlushSettings) -> Report {
    let (mut c, warnings) = Config::from_env(|k| vars.get(k).cloned());
    c.count_nccl_files(nccl);
    let mut r = Report::default();
    let said = |name: &str| -> Vec<String> {
        warnings.iter().filter(|w| w.starts_with(&format!("{name}="))).cloned().collect()
    };
    // a check of the variables `names`: FAIL with the shim's own warning where it would give one
    let one = |id: &str, names: &[&str], ok: String| {
        let ev = names.iter().filter_map(|n| vars.get(*n).map(|v| format!("{n}={v:?}")));
        let bad: Vec<String> = names.iter().flat_map(|n| said(n)).collect();
        let c = match bad.first() {
            Some(w) => Check::new(id, Status::Fail, format!("the shim would warn: {w}"))
                .fix("set it to one of the values the line names, or unset it for the default"),
            None => Check::new(id, Status::Pass, ok),
        };
        ev.fold(c, Check::evidence)
    };
    let mode = match c.mode {
        Mode::Register => {
            "register: at each verbs registration of GPU memory, the shim makes exactly that memory reachable for the NIC by its route"
        }
        Mode::Shadow => "shadow: the shim builds its map and logs what it would register; it registers nothing",
        Mode::Trace => "trace: one decoded line per NVIDIA call; nothing registered",
        Mode::Off => "off: every call passes through untouched; nothing registered",
    };
    let mut m = one("env.mode", &[config::ENV_MODE], mode.into());
    if m.status == Status::Pass && c.mode != Mode::Register {
        m.status = Status::Info;
    }
    r.push(m);
    r.push(one(
        "env.route",
        &[config::ENV_ROUTE],
        format!(
            "route {}: which route works is the machine's (scripts/doctor's route.* checks)",
            c.route.name()
        ),
    ));
    let log = format!(
        "log level {}, to {}; exit summary {}",
        level(c.level),
        c.log_file.as_deref().map_or("stderr".to_string(), |f| format!("{f} (%h host, %p pid)")),
        if c.summary { "on" } else { "off" }
    );
    r.push(one("env.log", &[config::ENV_LEVEL, config::ENV_LOG_FILE, config::ENV_SUMMARY], log));
    r.push(one(
        "env.eager",
        &[config::ENV_EAGER],
        if c.eager {
            "eager: every CUDA allocation registered when made (NV503C route)".into()
        } else {
            "not eager (the default)".into()
        },
    ));
    if let Some(f) = &c.capture_file {
        r.push(
            Check::new(
                "env.capture",
                Status::Warn,
                format!("a raw capture of every NVIDIA call is written to {f}"),
            )
            .fix(
                "for a bug report only: unset GDRSHIM_CAPTURE for jobs (it grows with every call)",
            ),
        );
    }
    r.push(nccl_conf(nccl));
    r.push(advertise(&c, vars, nccl, &said(config::ENV_ADVERTISE_GDR)));
    let knobs: Vec<&str> =
        config::KNOB_VARS.iter().copied().filter(|k| vars.contains_key(*k)).collect();
    if !knobs.is_empty() {
        r.push(
            Check::new(
                "env.knobs",
                Status::Warn,
                format!(
                    "{} only work in test builds of gdrshim: a release ignores them",
                    knobs.join(", ")
                ),
            )
            .fix("unset them"),
        );
    }
    let names = known();
    for n in vars.keys().filter(|n| n.starts_with("GDRSHIM_") && !names.contains(&n.as_str())) {
        r.push(
            Check::new(
                &format!("env.unknown.{n}"),
                Status::Warn,
                format!("{n} is not a variable gdrshim reads"),
            )
            .fix(format!("a typo? gdrshim reads {}", names[..8].join(", "))),
        );
    }
    r.push(preload(vars.get("LD_PRELOAD").map(String::as_str).unwrap_or("")));
    r
}

fn level(l: Level) -> &'static str {
    match l {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// The files NCCL reads and where each flush variable comes from.
fn nccl_conf(nccl: &FlushSettings) -> Check {
    let mut files: Vec<String> = Vec::new();
    for a in &nccl.answers {
        for f in &a.reading.files {
            if !files.contains(f) {
                files.push(f.clone());
            }
        }
    }
    let c = Check::new(
        "env.nccl-conf",
        Status::Info,
        format!(
            "NCCL_NET_FORCE_FLUSH: {}; NCCL_GDR_FLUSH_DISABLE: {} (the environment wins over NCCL's files)",
            nccl.force_flush_origin(),
            nccl.flush_disabled_origin()
        ),
    );
    nccl.answers
        .iter()
        .map(|a| format!("{} reads {}", a.reading.versions, a.reading.files.join(", then ")))
        .fold(c, Check::evidence)
}

/// Stock NCCL's GPU-side gate (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED).
fn advertise(
    c: &Config,
    vars: &BTreeMap<String, String>,
    nccl: &FlushSettings,
    bad: &[String],
) -> Check {
    let ev = |ch: Check| {
        ["GDRSHIM_ADVERTISE_GDR", config::ENV_NCCL_FLUSH_DISABLE, config::ENV_NCCL_FORCE_FLUSH]
            .iter()
            .filter_map(|n| vars.get(*n).map(|v| format!("{n}={v:?}")))
            .fold(ch, Check::evidence)
    };
    if let Some(w) = bad.first() {
        return ev(Check::new("env.advertise", Status::Fail, format!("the shim would warn: {w}"))
            .fix("GDRSHIM_ADVERTISE_GDR takes 0 or 1"));
    }
    if c.nccl_flush_disabled {
        return ev(Check::new("env.advertise", Status::Fail, format!("NCCL_GDR_FLUSH_DISABLE is set ({}): the shim never tells stock NCCL that GDR works, and without NCCL's flush a GeForce can read received data stale", nccl.flush_disabled_origin())).fix("unset NCCL_GDR_FLUSH_DISABLE (or remove its line from the file named)"));
    }
    if !c.advertise_gdr {
        return ev(Check::new(
            "env.advertise",
            Status::Info,
            "GDRSHIM_ADVERTISE_GDR=0: stock NCCL is not told that GDR works (a patched NCCL asks the shim itself)",
        ));
    }
    let sm90 = if c.nccl_force_flush {
        format!("NCCL_NET_FORCE_FLUSH is forced ({}): also on sm_90 and later GPUs that do not order remote writes themselves", nccl.force_flush_origin())
    } else {
        "not on sm_90 and later GPUs that do not order remote writes themselves unless NCCL_NET_FORCE_FLUSH=1, in the job (gdr-env.sh sets it) or in /etc/nccl.conf (deploy.sh writes it there on such a node); below sm_90 NCCL flushes anyway".to_string()
    };
    ev(Check::new(
        "env.advertise",
        Status::Pass,
        format!("stock NCCL is told GDR works while a route registers; {sm90}"),
    ))
}

/// Where LD_PRELOAD points: the shim by an absolute path, its core beside it.
fn preload(value: &str) -> Check {
    let shim = value
        .split([':', ' '])
        .find(|p| Path::new(p).file_name().is_some_and(|n| n == "libgdrshim.so"));
    let ev = format!("LD_PRELOAD={value:?}");
    let Some(p) = shim else {
        return Check::new("env.preload", Status::Info, "LD_PRELOAD names no libgdrshim.so: this environment does not load the shim")
            .evidence(ev)
            .fix("to load it: LD_PRELOAD=/opt/rtx4090-gdr/current/lib/libgdrshim.so, or scripts/gdr-env.sh");
    };
    let path = Path::new(p);
    if !path.is_absolute() {
        return Check::new("env.preload", Status::Fail, format!("LD_PRELOAD names {p} by a relative path: each process resolves it against its own working folder, and ranks started elsewhere run without the shim"))
            .evidence(ev)
            .fix("name it by its absolute path (gdr-env.sh always does)");
    }
    let core = path.with_file_name("libgdrshim-core.so");
    match (path.is_file(), core.is_file()) {
        (true, true) => Check::new("env.preload", Status::Pass, format!("LD_PRELOAD loads {p}, and its core is beside it")).evidence(ev),
        (false, _) => Check::new("env.preload", Status::Fail, format!("LD_PRELOAD names {p}, which is not there: the loader skips it"))
            .evidence(ev)
            .fix("install a release (scripts/deploy.sh) or correct the path"),
        (true, false) => Check::new(
            "env.preload",
            Status::Fail,
            format!("{p} is there but not {}: the shim loads its core from beside it at the first GPU call", core.display()),
        )
        .evidence(ev)
        .fix("copy the release's lib/ whole (both files)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vars: &[(&str, &str)]) -> Report {
        with_files(vars, &[])
    }

    /// The judgement with NCCL's files `files` (path, text) and no other.
    fn with_files(vars: &[(&str, &str)], files: &[(&str, &str)]) -> Report {
        let vars: BTreeMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let nccl = FlushSettings::read(
            |k| vars.get(k).cloned(),
            Some("/home/pw"),
            |p| {
                files
                    .iter()
                    .find(|(f, _)| *f == p)
                    .map_or(FileText::Absent, |(_, t)| FileText::Whole(t.as_bytes().to_vec()))
            },
        );
        judge_with(&vars, &nccl)
    }

    #[test]
    fn nccls_files_count_and_are_named() {
        let etc = [("/etc/nccl.conf", "# added by gdrshim\nNCCL_NET_FORCE_FLUSH=1\n")];
        let r = with_files(&[("HOME", "/home/pw")], &etc);
        let a = r.get("env.advertise").unwrap();
        assert!(
            a.summary.contains("NCCL_NET_FORCE_FLUSH is forced (\"1\" from /etc/nccl.conf)"),
            "{a:?}"
        );
        let n = r.get("env.nccl-conf").unwrap();
        assert!(
            n.summary.starts_with(
                "NCCL_NET_FORCE_FLUSH: \"1\" from /etc/nccl.conf; NCCL_GDR_FLUSH_DISABLE: unset"
            ),
            "{n:?}"
        );
        assert_eq!(
            n.evidence,
            [
                "NCCL up to 2.29 reads /home/pw/.nccl.conf, then /etc/nccl.conf",
                "NCCL 2.30 and later reads /home/pw/.nccl.conf, then /etc/nccl.conf"
            ]
        );
        // the job's own 0 wins
        let r = with_files(&[("NCCL_NET_FORCE_FLUSH", "0")], &etc);
        assert!(r.get("env.advertise").unwrap().summary.contains("unless NCCL_NET_FORCE_FLUSH=1"));
        assert!(r.get("env.nccl-conf").unwrap().summary.contains("\"0\" from the environment"));
        // a file that disables the flush: FAIL, naming the file
        let r = with_files(&[], &[("/etc/nccl.conf", "NCCL_GDR_FLUSH_DISABLE=1\n")]);
        assert_eq!(r.exit_code(), 1);
        assert!(r.get("env.advertise").unwrap().summary.contains("(\"1\" from /etc/nccl.conf)"));
        // no file: neither
        let r = run(&[]);
        assert!(r
            .get("env.nccl-conf")
            .unwrap()
            .summary
            .starts_with("NCCL_NET_FORCE_FLUSH: unset;"));
    }

    #[test]
    fn the_librarys_own_verdicts() {
        let r = run(&[]);
        assert_eq!(r.exit_code(), 0, "{}", r.text());
        assert!(r.get("env.mode").unwrap().summary.starts_with("register: "), "the default");
        let r = run(&[("GDRSHIM_MODE", "regster"), ("GDRSHIM_ROUTE", "fastest")]);
        assert_eq!(r.exit_code(), 1);
        let m = r.get("env.mode").unwrap();
        assert!(
            m.summary.contains("using shadow (registers nothing)")
                && m.evidence == ["GDRSHIM_MODE=\"regster\""],
            "{m:?}"
        );
        assert!(m.fix.contains("one of the values"), "{m:?}");
        assert!(
            r.get("env.route").unwrap().summary.contains("not one of auto, dmabuf, nv503c"),
            "{}",
            r.text()
        );
        let r = run(&[("GDRSHIM_MODE", "shadow"), ("GDRSHIM_SUMMARY", "maybe")]);
        assert_eq!(
            (r.get("env.mode").unwrap().status, r.get("env.log").unwrap().status),
            (Status::Info, Status::Fail)
        );
    }

    #[test]
    fn what_the_parser_does_not_see() {
        let r = run(&[
            ("GDRSHIM_MOD", "register"),
            ("GDRSHIM_TIMING", "1"),
            ("NCCL_GDR_FLUSH_DISABLE", "1"),
        ]);
        assert_eq!(r.get("env.unknown.GDRSHIM_MOD").unwrap().status, Status::Warn);
        assert_eq!(r.get("env.knobs").unwrap().status, Status::Warn);
        assert_eq!(r.get("env.advertise").unwrap().status, Status::Fail);
        assert_eq!(preload("libgdrshim.so").status, Status::Fail, "relative");
        assert_eq!(preload("/nonexistent/lib/libgdrshim.so").status, Status::Fail);
        assert_eq!(preload("/usr/lib/libfoo.so").status, Status::Info);
    }
}
