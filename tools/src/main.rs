//! gdrshim-tool: `doctor`, `verify-run`, `dmabuf-probe`, `selftest`, `fleet`, `report`, `env`, `cdi`,
//! `gpu-facts` (see each module).
//!
//! Each subcommand is one variant of [`Cmd`] whose arguments (a `clap::Args` struct with a
//! `run(self) -> Result<u8, String>` and a `--json` flag) live in its own module; adding a
//! subcommand is one variant and one match arm in [`main`]. What every command keeps (README:
//! "Every command"): a usage error is one line on stderr ending in "(try --help)", exit 2; an
//! error that stops a command is its report with no checks (the one JSON object with --json,
//! else the RESULT line) and the message on stderr, exit 2.

/// The library's own reading of its environment, of NCCL's configuration files and the route
/// wishes it names (gdrshim-common, which the library builds on too), so that `env` judges a
/// value exactly as the shim will. The tool links no other part of the library (its hooks would
/// interpose the tool's own calls).
use gdrshim_common::{config, ncclconf};

mod cdi;
mod dmabuf;
mod doctor;
mod env;
mod fleet;
mod gpu_facts;
mod json;
mod machine;
mod report;
mod report_command;
mod routes;
mod selftest;
mod size;
mod topology;
mod usage;
mod verify;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// `--version` of the tool and of each subcommand: "gdrshim-tool [SUBCOMMAND] (gdrshim) 0.3.0", the
/// form every script of the release prints too ("NAME (gdrshim) VERSION").
const VERSION: &str = concat!("(gdrshim) ", env!("CARGO_PKG_VERSION"));

/// The exit codes every subcommand keeps (shown under each `--help`).
pub const EXIT_CODES: &str = "Exit codes:
  0  pass / ready
  1  fail / not ready (a check failed; each FAIL line says why and how to fix it)
  2  could not check here, unusable input, or a usage error (one line on stderr, ending in
     \"(try --help)\")

Every command ends its text with one line, RESULT: PASS, FAIL or COULD NOT CHECK, the checks
counted by status and, where something could not be checked, why.
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
    /// Judge a saved machine state (scripts/gdr-state-record save) by the preflight checks for P2P and GDR
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
    #[command(after_help = report_command::AFTER_HELP, display_name = "gdrshim-tool report")]
    Report(report_command::Args),
    /// What the shim would do with this environment's GDRSHIM_* variables and LD_PRELOAD, checked on any machine (no GPU needed)
    #[command(after_help = env::AFTER_HELP, display_name = "gdrshim-tool env")]
    Env(env::Args),
    /// A Container Device Interface spec: the RDMA NICs (uverbsN and rdma_cm) and the shim, for --device gdrshim/rdma=all
    #[command(after_help = cdi::AFTER_HELP, display_name = "gdrshim-tool cdi")]
    Cdi(cdi::Args),
    /// Each GPU's compute capability and GPU_DIRECT_RDMA_WRITES_ORDERING: whether NCCL's flush must be forced there (deploy.sh asks it before writing /etc/nccl.conf)
    #[command(after_help = gpu_facts::AFTER_HELP, display_name = "gdrshim-tool gpu-facts")]
    GpuFacts(gpu_facts::Args),
    /// Print the tool's version
    #[command(
        after_help = "Exit codes:\n  0  the version printed\n  2  a usage error",
        display_name = "gdrshim-tool version"
    )]
    Version(VersionArgs),
}

/// `gdrshim-tool version`'s arguments.
#[derive(clap::Args, Debug)]
struct VersionArgs {
    /// One JSON object (no checks) instead of the version line
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return usage_error(&e),
    };
    let sub = matches
        .subcommand()
        .map(|(n, m)| (n.to_string(), m.try_get_one::<bool>("json").ok().flatten() == Some(&true)));
    let (sub, json) = sub.unwrap_or_default();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let rc = match cli.cmd {
        Cmd::Doctor(a) => a.run(),
        Cmd::VerifyRun(a) => a.run(),
        Cmd::DmabufProbe(a) => a.run(),
        Cmd::Selftest(a) => a.run(),
        Cmd::Fleet(a) => a.run(),
        Cmd::Report(a) => a.run(),
        Cmd::Env(a) => a.run(),
        Cmd::Cdi(a) => a.run(),
        Cmd::GpuFacts(a) => a.run(),
        Cmd::Version(a) => {
            if a.json {
                println!("{}", report::Report::default().json("version"));
            } else {
                println!("gdrshim-tool {VERSION}");
            }
            Ok(0)
        }
    };
    match rc {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            // an error that stops a command is its report with no checks, and the line on stderr
            let r = report::Report { checks: vec![], unchecked: Some(msg.clone()) };
            if json {
                println!("{}", r.json(&sub));
            } else {
                print!("{}", r.closing_line());
            }
            eprintln!("{}: {msg}", usage::name(Some(&sub)));
            ExitCode::from(2)
        }
    }
}

/// --help and --version print on stdout, exit 0; anything else is a usage error: one line on
/// stderr, exit 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let cmd = Cli::command();
    let names: Vec<&str> =
        cmd.get_subcommands().map(|c| c.get_name()).filter(|n| *n != "help").collect();
    // the subcommand the user named, if any
    let sub = std::env::args().skip(1).find(|a| names.contains(&a.as_str()));
    let what = if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        format!("name a command: {}", names.join(", "))
    } else {
        usage::one_line(&e.render().to_string())
    };
    eprintln!("{}", usage::line(&usage::name(sub.as_deref()), &what));
    ExitCode::from(2)
}
