//! Replays a gdrshim capture through the decoder, the VA map and the shadow oracle, and prints
//! what gdrshim would register for every user allocation. No GPU needed.
//!
//!     gdrshim-replay CAPTURE... [--quiet] [--bench]

use std::process::ExitCode;

fn main() -> ExitCode {
    const USAGE: &str = "usage: gdrshim-replay [--quiet] [--bench] CAPTURE...\n  replays gdrshim captures (GDRSHIM_CAPTURE files): what gdrshim would register for every\n  user allocation, and the shadow oracle's summary\n  exit: 0 every capture matched, 1 a mismatch, an uncovered allocation or a bad line, 2 usage or an unreadable file";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--version") {
        println!("gdrshim-replay {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if let Some(bad) = args.iter().find(|a| a.starts_with('-') && !matches!(a.as_str(), "--quiet" | "--bench")) {
        eprintln!("gdrshim-replay: unknown option {bad}\n{USAGE}");
        return ExitCode::from(2);
    }
    let quiet = args.iter().any(|a| a == "--quiet");
    let bench = args.iter().any(|a| a == "--bench");
    let files: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if files.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let mut bad = false;
    for f in files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::from(2);
            }
        };
        if bench {
            match gdrshim::capture::bench_decode_apply(&text, 50) {
                Some((n, ns)) => println!("bench {f}: decode+map per NVIDIA ioctl {ns:.0} ns ({n} ioctls replayed)"),
                None => println!("bench {f}: no verified ABI table"),
            }
            continue;
        }
        let r = gdrshim::capture::replay(&text);
        println!("== {f} (driver {})", r.version.map_or("unknown".into(), |v| v.to_string()));
        if !quiet {
            for line in &r.report {
                println!("{line}");
            }
        }
        let c = r.tracker.counts;
        println!("gdrshim: summary replay={f} {}", gdrshim::capture::summary_fields(&r));
        bad |= c.mismatched > 0 || c.uncovered > 0 || r.bad_lines > 0;
    }
    if bad {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
