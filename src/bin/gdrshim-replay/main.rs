//! Replays a gdrshim capture through the decoder, the VA map and the shadow oracle, and prints
//! what gdrshim would register for every user allocation. No GPU needed.
//!
//!     gdrshim-replay [--quiet] [--bench] CAPTURE...
//!
//! A capture is plain text (`GDRSHIM_CAPTURE` writes `.cap`) or gzip (`.cap.gz`, as the fixtures
//! in tests/fixtures ship); a file that is neither is rejected with the reason (see `input`).

mod input;

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const EXIT_CODES: &str = "Exit codes:
  0  every capture replayed, and the map matched libcuda everywhere
  1  a capture replayed with a mismatch, an uncovered allocation, or a line that is no capture record
  2  a usage error, or a file that could not be replayed: unreadable, not gzip, a damaged or
     truncated gzip stream, not a capture, truncated at record N (the reason is on stderr)
Every file is tried; the exit code is the worst of them.";

#[derive(Parser, Debug)]
#[command(
    name = "gdrshim-replay",
    version = concat!("(gdrshim) ", env!("CARGO_PKG_VERSION")),
    about = "Replays gdrshim captures (GDRSHIM_CAPTURE files, .cap or .cap.gz): what gdrshim would register \
             for every user allocation, and the shadow oracle's summary. No GPU needed.",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Print only each capture's header and summary line, not the line per allocation
    #[arg(long)]
    quiet: bool,
    /// Time decode+map per NVIDIA ioctl instead of replaying (50 rounds)
    #[arg(long)]
    bench: bool,
    /// Capture files (plain text or gzip)
    #[arg(value_name = "CAPTURE", required = true)]
    captures: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help and --version on stdout with 0; a usage error on stderr with 2
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let worst = cli.captures.iter().map(|f| replay_one(f, &cli)).max().unwrap_or(0);
    ExitCode::from(worst)
}

/// Replays one file; its exit code (0, 1 or 2, as [`EXIT_CODES`] says).
fn replay_one(path: &Path, cli: &Cli) -> u8 {
    let f = path.display();
    let text = match input::load(path) {
        Ok(t) => t,
        Err(why) => {
            eprintln!("gdrshim-replay: {f}: rejected: {why}");
            return 2;
        }
    };
    if cli.bench {
        match gdrshim::capture::bench_decode_apply(&text, 50) {
            Some((n, ns)) => {
                println!("bench {f}: decode+map per NVIDIA ioctl {ns:.0} ns ({n} ioctls replayed)")
            }
            None => println!("bench {f}: no verified ABI table"),
        }
        return 0;
    }
    let r = gdrshim::capture::replay(&text);
    println!("== {f} (driver {})", r.version.map_or("unknown".into(), |v| v.to_string()));
    if !cli.quiet {
        for line in &r.report {
            println!("{line}");
        }
    }
    let c = r.tracker.counts;
    println!("gdrshim: summary replay={f} {}", gdrshim::capture::summary_fields(&r));
    if r.bad_lines > 0 {
        let (n, start) = input::first_bad_line(&text).unwrap_or_default();
        eprintln!("gdrshim-replay: {f}: {} line(s) are no capture record, the first is line {n}: {start:?}", r.bad_lines);
    }
    if r.version.is_none() {
        eprintln!("gdrshim-replay: {f}: no `V <driver version>` record: nothing could be decoded");
    }
    u8::from(c.mismatched > 0 || c.uncovered > 0 || r.bad_lines > 0)
}
