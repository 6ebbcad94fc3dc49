//! gdrshim-tool: `doctor`, `verify-run`, `dmabuf-probe`, `selftest`, `fleet` and `report` (see each module).
//!
//! Each subcommand is one variant of [`Cmd`] whose arguments (a `clap::Args` struct with a
//! `run(self) -> Result<u8, String>`) live in its own module; adding a subcommand is one variant
//! and one match arm in [`main`].

mod dmabuf;
mod doctor;
mod fleet;
mod machine;
mod report;
mod rig_report;
mod routes;
mod selftest;
mod topology;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// `--version` of the tool and of each subcommand: "gdrshim-tool [SUBCOMMAND] (gdrshim) 0.2.0", the
/// form every script of the release prints too ("NAME (gdrshim) VERSION").
const VERSION: &str = concat!("(gdrshim) ", env!("CARGO_PKG_VERSION"));

/// The exit codes every subcommand keeps (shown under each `--help`).
pub const EXIT_CODES: &str = "Exit codes:
  0  pass / ready
  1  fail / not ready (a check failed; each FAIL line says why and how to fix it)
  2  could not check here, unusable input, or a usage error

--json (every command): one JSON object, one line: {\"tool\", \"version\", \"checks\": [{\"id\", \"status\",
\"summary\", \"evidence\": [...], \"fix\"}...], \"could_not_check\": null or why, \"result\", \"exit\"}; a
status is PASS, WARN, FAIL, INFO or COULD NOT CHECK, a result PASS, FAIL or COULD NOT CHECK (README:
\"The tools' JSON\")";

#[derive(Parser, Debug)]
#[command(
    name = "gdrshim-tool",
    version = VERSION,
    about = "gdrshim's operator tools: preflight doctor, acceptance verifier, DMA-BUF probe, rig self-test",
    after_help = EXIT_CODES,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Judge a saved machine state (scripts/gdr-state-record save) by the runbook's preflight checks
    #[command(after_help = doctor::AFTER_HELP, display_name = "gdrshim-tool doctor")]
    Doctor(doctor::Args),
    /// Judge a NCCL Tests run (and the shim's, perftest's and the kernel's logs) by the acceptance checklist
    // the usage written out: after an unknown flag, clap's own lists the option it suggests as if required
    #[command(after_help = verify::AFTER_HELP, display_name = "gdrshim-tool verify-run", override_usage = "gdrshim-tool verify-run --nccl-log <FILE> [OPTIONS]")]
    VerifyRun(verify::Args),
    /// Allocate GPU memory, export it as a DMA-BUF and register it on each HCA (no gdrshim involved)
    #[command(after_help = dmabuf::AFTER_HELP, display_name = "gdrshim-tool dmabuf-probe")]
    DmabufProbe(dmabuf::Args),
    /// Prove GPUDirect RDMA here: GPU memory registered under the shim, RDMA WRITE/READ through one self-connected QP, every byte checked
    #[command(after_help = selftest::AFTER_HELP, display_name = "gdrshim-tool selftest")]
    Selftest(selftest::Args),
    /// Prove GPUDirect RDMA across a fleet, one task per node or GPU from the job's launcher: every node pair on every rail, WRITE and READ GPU→GPU, bytes checked; names the culprit
    #[command(after_help = fleet::AFTER_HELP, display_name = "gdrshim-tool fleet")]
    Fleet(fleet::Args),
    /// One file about this rig to attach to a question: verdict, route, prerequisites, PCIe paths, self-test figures; nothing private unless asked
    #[command(after_help = rig_report::AFTER_HELP, display_name = "gdrshim-tool report")]
    Report(rig_report::Args),
    /// Print the tool's version
    Version,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help and --version print on stdout and exit 0; anything else is a usage error,
            // printed on stderr with the usage, exit 2
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // with --json, an error that stops a command is the one JSON object too (on stdout; the line on stderr)
    let json_name = match &cli.cmd {
        Cmd::Doctor(a) if a.json => Some("doctor"),
        Cmd::VerifyRun(a) if a.json => Some("verify-run"),
        Cmd::DmabufProbe(a) if a.json => Some("dmabuf-probe"),
        Cmd::Selftest(a) if a.json => Some("selftest"),
        Cmd::Fleet(a) if a.json => Some("fleet"),
        _ => None,
    };
    let rc = match cli.cmd {
        Cmd::Doctor(a) => a.run(),
        Cmd::VerifyRun(a) => a.run(),
        Cmd::DmabufProbe(a) => a.run(),
        Cmd::Selftest(a) => a.run(),
        Cmd::Fleet(a) => a.run(),
        Cmd::Report(a) => a.run(),
        Cmd::Version => {
            println!("gdrshim-tool {VERSION}");
            Ok(0)
        }
    };
    match rc {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            if let Some(tool) = json_name {
                println!("{}", report::json_object(tool, &[], Some(&msg), 2, ""));
            }
            eprintln!("gdrshim-tool: {msg}");
            ExitCode::from(2)
        }
    }
}
