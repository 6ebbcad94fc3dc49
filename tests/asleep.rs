//! A process that never touches a GPU must not notice gdrshim: no initialisation, no output, no
//! file, no thread; and an fd of any number costs at most one `fstat` in its life (tests/c/quiet.c,
//! with tests/c/countstat.c counting the `fstat`s the shim makes).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::build("asleep");
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let src = |f: &str| c.join(f).to_str().unwrap().to_string();
        common::cc(
            &e,
            &[
                "-shared",
                "-fPIC",
                "-O1",
                "-Wall",
                "-Werror",
                "-o",
                "libcountstat.so",
                &src("countstat.c"),
                "-ldl",
            ],
        );
        common::fakes::Fakes::in_dir(&e.dir).fakerm();
        common::cc(&e, &["-O1", "-Wall", "-Werror", "-o", "quiet", &src("quiet.c"), "-ldl"]);
        for f in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
            std::fs::write(e.dir.join("dev").join(f), b"").unwrap();
        }
        e
    })
}

fn field(line: &str, key: &str) -> i64 {
    let at = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key}= in {line}"));
    line[at + key.len() + 2..].split_whitespace().next().unwrap().parse().unwrap()
}

/// `quiet ARGS` under the shim and libcountstat (then the libraries `more`, from the scratch
/// folder) with `envs`: its first line of output and its stderr, once it has exited 0.
fn quiet(e: &Env, args: &[&str], more: &[&str], envs: &[(&str, &OsStr)]) -> (String, String) {
    let mut preload = format!("{}:{}", e.shim.display(), e.dir.join("libcountstat.so").display());
    for lib in more {
        preload = format!("{preload}:{}", e.dir.join(lib).display());
    }
    let out = Command::new(e.dir.join("quiet"))
        .args(args)
        .env("LD_PRELOAD", preload)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    (stdout.lines().next().unwrap_or_default().to_string(), stderr.into_owned())
}

#[test]
fn a_process_that_never_touches_a_gpu_does_not_notice_the_shim() {
    let e = env();
    let files = e.dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let (log, capture) = (files.join("log-%p"), files.join("capture-%p"));
    let (line, stderr) = quiet(
        e,
        &["plain"],
        &[],
        &[
            ("GDRSHIM_MODE", "register".as_ref()),
            ("GDRSHIM_LOG_LEVEL", "debug".as_ref()),
            ("GDRSHIM_LOG_FILE", log.as_os_str()),
            ("GDRSHIM_CAPTURE", capture.as_os_str()),
        ],
    );
    assert_eq!(stderr, "", "nothing is printed, not even the summary");
    let left: Vec<_> = std::fs::read_dir(&files).unwrap().map(|f| f.unwrap().file_name()).collect();
    assert!(left.is_empty(), "no log or capture file is made: {left:?}");
    assert_eq!(field(&line, "threads"), 1, "no thread is started: {line}");
    assert_eq!(field(&line, "core"), 0, "the front loads no core: {line}");
    // one look per fd, however many ioctls (1000 each) and wherever the fd is in the table
    for key in ["stat_pipe", "stat_socket", "stat_null", "stat_5000"] {
        assert_eq!(field(&line, key), 1, "{key}: {line}");
    }
    if field(&line, "top") > 0 {
        assert_eq!(field(&line, "stat_top"), 1, "{line}");
    }
}

/// Files opened by their paths, dup'ed, read and closed, and never ioctl'ed: the shim maps nothing
/// (the fd table is mapped at the first ioctl's look, not at an open).
#[test]
fn a_process_that_only_opens_files_maps_nothing() {
    let e = env();
    let (line, _) = quiet(e, &["files"], &[], &[("GDRSHIM_MODE", "register".as_ref())]);
    assert_eq!(field(&line, "reads"), 100, "{line}");
    assert_eq!(field(&line, "shim_maps"), 0, "{line}");
}

/// A dup2 that works keeps the caller's errno even when the fd table cannot map the page for its
/// new fd (the address space is full: RLIMIT_AS).
#[test]
fn a_dup_keeps_errno_when_the_table_cannot_grow() {
    let e = env();
    let run = |shim: bool| {
        let mut c = Command::new(e.dir.join("quiet"));
        c.arg("errno").env("LD_PRELOAD", e.dir.join("libcountstat.so"));
        if shim {
            c.env(
                "LD_PRELOAD",
                format!("{}:{}", e.shim.display(), e.dir.join("libcountstat.so").display()),
            );
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_string()
    };
    assert_eq!(run(false), "quiet errno dup2=5000 errno=0", "without the shim");
    assert_eq!(run(true), "quiet errno dup2=5000 errno=0", "with the shim");
}

#[test]
fn an_nvidia_fd_far_up_the_table_is_looked_at_once_and_wakes_the_shim() {
    let e = env();
    let dev = e.dir.join("dev");
    let (line, stderr) = quiet(
        e,
        &["nvidia", dev.to_str().unwrap()],
        &["libfakerm.so"],
        &[("GDRSHIM_TEST_DEV_DIR", dev.as_os_str()), ("GDRSHIM_MODE", "shadow".as_ref())],
    );
    assert_eq!(field(&line, "ok"), 1000, "{line}");
    // one fstat, at its first ioctl, whatever its number; never again (through the front, the fd
    // that wakes the core is looked at by both)
    assert!(field(&line, "stat_5000") <= if common::via_front() { 2 } else { 1 }, "{line}");
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("gdrshim: summary"))
        .unwrap_or_else(|| panic!("the shim woke: {stderr}"));
    assert_eq!(field(summary, "nv_ioctls"), 1000, "{summary}");
    assert_eq!(
        field(&line, "core"),
        common::via_front() as i64,
        "the front loaded the core: {line}"
    );
    assert_eq!(field(&line, "errno_kept"), 1000, "{line}");
}

/// gdrshim's own queries (a launcher or a tool asking what the shim would do) are no GPU touch:
/// they answer without starting the shim or loading the core, print nothing, and `gdrshim_mode`
/// names the mode GDRSHIM_MODE asks for, as the started shim would.
#[test]
fn a_query_of_ours_is_not_a_gpu_touch() {
    let e = env();
    // (None: unset, the zero-configuration default)
    let cases: [(Option<&str>, i64); 6] = [
        (None, 3),
        (Some("register"), 3),
        (Some(" Shadow "), 2),
        (Some("trace"), 1),
        (Some("off"), 0),
        (Some("loud!"), 2),
    ];
    for (mode, want) in cases {
        let mut c = Command::new(e.dir.join("quiet"));
        c.arg("query").env(
            "LD_PRELOAD",
            format!("{}:{}", e.shim.display(), e.dir.join("libcountstat.so").display()),
        );
        c.env("GDRSHIM_LOG_LEVEL", "debug").env_remove("GDRSHIM_MODE");
        if let Some(m) = mode {
            c.env("GDRSHIM_MODE", m);
        }
        let out = c.output().unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stdout}{stderr}");
        let line = stdout.lines().next().unwrap_or_default();
        assert_eq!(stderr, "", "GDRSHIM_MODE={mode:?}: nothing printed, not even the summary");
        assert_eq!(field(line, "mode"), want, "GDRSHIM_MODE={mode:?}: {line}");
        // not registering yet (no GPU touched): what the started shim answers before its first
        // NVIDIA call; the counters of a shim that has seen nothing (issue 40: -ENOSYS, which
        // callers read as no shim), and nothing mapped; off: no shim
        let (counters, lookup) = if want == 0 { (-38, -38) } else { (176, -2) };
        assert_eq!((field(line, "active"), field(line, "route")), (0, 0), "{line}");
        assert_eq!((field(line, "counters"), field(line, "lookup")), (counters, lookup), "{line}");
        assert!(
            line.ends_with(if want == 0 { " unknown=-" } else { " unknown=20,21" }),
            "zeros, BAR1 unknown: {line}"
        );
        assert_eq!(
            (field(line, "errno_kept"), field(line, "threads"), field(line, "core")),
            (1, 1, 0),
            "{line}"
        );
    }
}
