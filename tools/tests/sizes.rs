//! Sizes with K, M, G (binary, 1K = 1024), as NCCL Tests writes them, wherever a command takes
//! one (`--size` of `selftest`, `fleet`, `dmabuf-probe`), and said in each one's `--help`.

mod common;

use common::tool;

#[test]
fn every_size_takes_k_m_g_suffixes() {
    // `fleet --size 4M` was refused ("invalid digit"): a fleet of this one task now runs with it
    let (rc, out, err) = tool(&["fleet", "--size", "4M", "--json"]);
    assert!(!err.contains("invalid value"), "{err}");
    let j = common::check_shape("fleet", &out, rc);
    assert_eq!(j.get("bytes"), Some(&common::J::Num(4194304.0)), "{out}");
    let (_, out, _) = tool(&["fleet", "--size", "64k"]);
    assert!(out.contains(", 64 KiB per transfer,"), "{out}");
    // the probe and the self-test go on to what this machine lacks, past their arguments
    let (rc, out, err) =
        tool(&["dmabuf-probe", "--size", "2MiB", "--libcuda", "/nonexistent/libcuda.so.1"]);
    assert_eq!(rc, 2, "{err}");
    assert!(out.contains("could not check here: ") && err.is_empty(), "{out}{err}");
    let (rc, out, err) =
        tool(&["selftest", "--size", "16M", "--shim", "/nonexistent/libgdrshim.so", "--json"]);
    assert_eq!(rc, 2, "{err}");
    let j = common::check_shape("selftest", &out, rc);
    assert!(j.get("could_not_check").unwrap().str().starts_with("--shim /nonexistent/"), "{out}");
}

#[test]
fn a_size_out_of_range_or_in_si_units_is_one_usage_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["fleet", "--size", "8G"], "gdrshim-tool fleet: invalid value '8G' for '--size <BYTES>': a power of two from 4096 to 4294967296 (4 GiB) (try --help)"),
        (&["fleet", "--size", "7"], "gdrshim-tool fleet: invalid value '7' for '--size <BYTES>': a power of two from 4096 to 4294967296 (4 GiB) (try --help)"),
        (&["fleet", "--size", "4MB"], "gdrshim-tool fleet: invalid value '4MB' for '--size <BYTES>': MB is a power of ten in SI: write 4M or 4MiB (binary, 1K = 1024) (try --help)"),
        (&["selftest", "--size", "96K"], "gdrshim-tool selftest: invalid value '96K' for '--size <BYTES>': a power of two from 65536 to 1073741824 (1 GiB) (try --help)"),
        (&["selftest", "--size", "2G"], "gdrshim-tool selftest: invalid value '2G' for '--size <BYTES>': a power of two from 65536 to 1073741824 (1 GiB) (try --help)"),
        (&["dmabuf-probe", "--size", "1.5M"], "gdrshim-tool dmabuf-probe: invalid value '1.5M' for '--size <BYTES>': \".5M\" is no size suffix: bytes, or with K, M, G: 1K = 1024 (64K, 16M, 1G) (try --help)"),
        (&["dmabuf-probe", "--size", "20000000000G"], "gdrshim-tool dmabuf-probe: invalid value '20000000000G' for '--size <BYTES>': more bytes than there are: at most 18446744073709551615 (try --help)"),
    ];
    for (args, want) in cases {
        let (rc, out, err) = tool(args);
        assert_eq!(
            (rc, out.as_str(), err.as_str()),
            (2, "", format!("{want}\n").as_str()),
            "{args:?}"
        );
    }
}

#[test]
fn each_commands_help_says_how_a_size_is_written() {
    for cmd in ["selftest", "fleet", "dmabuf-probe"] {
        let (rc, out, _) = tool(&[cmd, "--help"]);
        assert_eq!(rc, 0);
        let line = out
            .lines()
            .skip_while(|l| !l.contains("--size <BYTES>"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(line.contains("K, M, G: 1K = 1024"), "{cmd}: {line}");
    }
}
