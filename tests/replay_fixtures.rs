//! The decoder and the map on raw bytes captured on the H200 (driver 580.159.04, CUDA 13.0).

use gdrshim::abi::{self, DriverVersion};
use gdrshim::capture::{parse_line, replay, Record};
use gdrshim::decode::{decode, Event, Outcome, P2pCtrl, ParamReader};
use std::io::Read;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()).read_to_string(&mut s).unwrap();
    s
}

struct Bytes(Option<Vec<u8>>);
impl ParamReader for Bytes {
    fn read(&self, _: u64, len: usize) -> Option<Vec<u8>> {
        self.0.as_ref().filter(|b| b.len() >= len).map(|b| b[..len].to_vec())
    }
}

fn events(text: &str) -> Vec<Event> {
    let t = abi::table_for(DriverVersion(580, 159, 4)).unwrap();
    let mut v = Vec::new();
    for l in text.lines() {
        if let Some(Record::Ioctl(io)) = parse_line(l) {
            match decode(
                io.dev,
                io.fd,
                io.request,
                io.rc,
                &io.arg,
                &Bytes(io.params.map(|p| p.1)),
                t,
            ) {
                Outcome::Event(e) => v.push(e),
                Outcome::Malformed(why) => panic!("malformed on real traffic: {why}: {l:.120}"),
                _ => {}
            }
        }
    }
    v
}

#[test]
fn native_registration_sequence_decodes_as_the_fact_sheet_says() {
    let ev = events(&fixture("alloc-probe.cap.gz"));
    let p2p = ev.iter().filter(|e| matches!(e, Event::P2pAlloc { .. })).collect::<Vec<_>>();
    assert_eq!(p2p.len(), 1, "one 503C per context");
    assert!(matches!(p2p[0], Event::P2pAlloc { flags: 1, .. }), "TYPE_BAR1");
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::P2pControl { ctrl: P2pCtrl::RegisterVaSpace { token: 0xfe00, .. }, .. }
    )));
    // cudaMalloc(64 MiB): REGISTER_VIDMEM of a 64 MiB vidmem object, then its UVM map at the same VA.
    let (h, addr) = ev
        .iter()
        .find_map(|e| match e {
            Event::P2pControl {
                ctrl: P2pCtrl::RegisterVidmem { h_memory, address, size: 0x400_0000, offset: 0 },
                ..
            } => Some((*h_memory, *address)),
            _ => None,
        })
        .expect("64 MiB registration");
    assert!(ev.iter().any(|e| matches!(e, Event::Memory { h_memory, class: 0x40, size: Some(0x400_0000), .. } if *h_memory == h)));
    assert!(ev.iter().any(|e| matches!(e, Event::UvmMapExternal { base, length: 0x400_0000, h_memory, gpus, .. } if *base == addr && *h_memory == h && gpus.len() == 1)));
    assert!(ev.iter().any(|e| matches!(e, Event::UvmRegisterGpuVaSpace { .. })));
    assert!(ev.iter().any(|e| matches!(e, Event::Device { device_id: 0, .. })));
}

#[test]
fn every_fixture_replays_without_malformed_or_mismatched() {
    for f in [
        "alloc-probe.cap.gz",
        "torch-alloc.cap.gz",
        "torch-exp.cap.gz",
        "torch-nccl.cap.gz",
        "bar1-readback.cap.gz",
    ] {
        let r = replay(&fixture(f));
        assert_eq!((r.malformed, r.bad_lines), (0, 0), "{f}");
        assert!(r.decoded > 100, "{f}: decoded {}", r.decoded);
        assert_eq!(r.tracker.counts.mismatched, 0, "{f}");
        assert!(r.tracker.counts.native > 0, "{f}: the H200 registers natively");
    }
}

/// The replay tool on `args`: exit code, stdout, stderr.
fn replay_tool(args: &[&std::path::Path]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gdrshim-replay"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The summary fields of a replay's output, without the `replay=FILE` that names the file.
fn summary_of(stdout: &str) -> String {
    let l = stdout
        .lines()
        .find(|l| l.starts_with("gdrshim: summary "))
        .unwrap_or_else(|| panic!("no summary: {stdout}"));
    l.split_whitespace().filter(|f| !f.starts_with("replay=")).collect::<Vec<_>>().join(" ")
}

/// Each shipped `.cap.gz` replays as it is, through the program users run, exactly as its
/// decompressed `.cap` does: the driver read, hundreds of ioctls, libcuda's registrations all
/// predicted, exit 0.
#[test]
fn the_replay_tool_reads_each_shipped_capture_gz_and_cap() {
    let scratch =
        std::env::temp_dir().join(format!("gdrshim-replay-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cap.gz"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 5, "{names:?}");
    for n in &names {
        let gz = fixtures_dir().join(n);
        let (rc, out, err) = replay_tool(&[&gz]);
        assert_eq!(rc, 0, "{n}: {err}\n{out}");
        assert!(
            out.starts_with(&format!("== {} (driver 580.159.04)", gz.display())),
            "{n}: {out:.200}"
        );
        let s = summary_of(&out);
        assert!(
            s.contains(" malformed=0 ")
                && s.contains(" mismatched=0 ")
                && s.contains(" uncovered=0 "),
            "{n}: {s}"
        );
        let field = |k: &str| {
            s.split_whitespace()
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap()
        };
        assert!(
            field("ioctls=") > 400 && field("native=") > 0 && field("native=") == field("matched="),
            "{n}: {s}"
        );
        let plain = scratch.join(n.trim_end_matches(".gz"));
        std::fs::write(&plain, fixture(n)).unwrap();
        let (rc, out2, err) = replay_tool(&[&plain]);
        assert_eq!((rc, summary_of(&out2)), (0, s), "{n} as plain text: {err}");
    }
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// A file that is not a capture is rejected with the reason on stderr and exit 2 (as `--help`
/// says), never replayed into an all-zero summary; the other files named still are.
#[test]
fn the_replay_tool_rejects_garbage_and_says_why() {
    let d = std::env::temp_dir().join(format!("gdrshim-replay-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let text = fixture("alloc-probe.cap.gz");
    let gz = std::fs::read(fixtures_dir().join("alloc-probe.cap.gz")).unwrap();
    // the 200th line cut after its first ten characters: `I c 10 c0…`, no rc, no argument
    let cut: usize = text.lines().take(199).map(|l| l.len() + 1).sum::<usize>() + 10;
    let mut noise: Vec<u8> =
        (0u32..4096).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    noise[0] = 0xff;
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        ("noise.cap", noise, "not a capture: binary data (not UTF-8 text) at byte 0".into()),
        (
            "hello.cap",
            b"hello world\nthis is not a capture\n".to_vec(),
            "not a capture: bad magic: the first line is \"hello world\"".into(),
        ),
        ("empty.cap", Vec::new(), "not a capture: the file is empty".into()),
        (
            "plain.cap.gz",
            text.as_bytes().to_vec(),
            "not gzip: bad magic [56 20] where a .gz file starts 1f 8b".into(),
        ),
        (
            "half.cap.gz",
            gz[..gz.len() / 2].to_vec(),
            "truncated: the gzip stream ends early, at record ".into(),
        ),
        (
            "cut.cap",
            text.as_bytes()[..cut].to_vec(),
            "truncated at record 200: its line has no end".into(),
        ),
    ];
    for (name, bytes, why) in &cases {
        let f = d.join(name);
        std::fs::write(&f, bytes).unwrap();
        let (rc, out, err) = replay_tool(&[&f]);
        assert_eq!(rc, 2, "{name}: {out}{err}");
        assert!(err.contains(&format!("{}: rejected: {why}", f.display())), "{name}: {err}");
        assert!(!out.contains("summary"), "{name}: a rejected file has no summary: {out}");
    }
    // a capture with a bad line in it replays, exit 1, naming the first bad line
    let bad = d.join("bad-line.cap");
    std::fs::write(&bad, text.replacen("\nM ", "\nZ this is no record\nM ", 1)).unwrap();
    let (rc, out, err) = replay_tool(&[&bad]);
    assert_eq!(rc, 1, "{out}{err}");
    assert!(summary_of(&out).contains(" malformed=0 "));
    assert!(
        err.contains(
            "1 line(s) are no capture record, the first is line 2: \"Z this is no record\""
        ),
        "{err}"
    );
    // every file is tried; the exit code is the worst
    let good = fixtures_dir().join("torch-alloc.cap.gz");
    let (rc, out, err) = replay_tool(&[&good, &d.join("hello.cap"), &bad]);
    assert_eq!(rc, 2, "{err}");
    assert_eq!(out.matches("gdrshim: summary").count(), 2, "{out}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn each_mark_comes_before_the_lines_of_the_step_it_names() {
    // issue 31: a program writes its mark after its step; the replay printed "# cudaMalloc 64M"
    // after the 64 MiB allocation's line, under the one before it
    let r = replay(&fixture("alloc-probe.cap.gz"));
    let at = |prefix: &str| {
        r.report
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix}: {:#?}", r.report))
    };
    let alloc_64m = at("cuMemAlloc_v2 [0x7f63d6000000, +0x4000000)");
    assert_eq!(r.report[alloc_64m - 1], "# cudaMalloc 64M", "{:#?}", r.report);
    let alloc_3m = at("cuMemAlloc_v2 [0x7f63f8800000, +0x300000)");
    assert_eq!(r.report[alloc_3m - 1], "# cuMemAlloc 3M", "{:#?}", r.report);
    assert_eq!(r.report[at("cuMemAllocPitch_v2") - 1], "# mallocPitch");
    // what follows the last mark is labelled so
    let r = replay("V 580.159.04\nM one\nA cuMemAlloc_v2 7f0000000000 1000\n");
    assert_eq!(r.report[..2], ["# one", "# (after the last mark)"], "{:#?}", r.report);
    assert!(r.report[2].starts_with("cuMemAlloc_v2 [0x7f0000000000, +0x1000)"), "{:#?}", r.report);
    let r = replay("V 580.159.04\nA cuMemAlloc_v2 7f0000000000 1000\nM one\n");
    assert_eq!(r.report[0], "# one", "{:#?}", r.report);
}
