//! `verify-run`: judges a NCCL Tests run (and optionally the shim's and perftest's logs and the
//! kernel log) by docs/runbook.md's acceptance checklist. Every check prints the line that decided it.
//!
//! What counts as proof: data rows with `#wrong` 0 in and out of place, `Out of bounds values : 0
//! OK`, the closing `Collective test concluded` line, and for GDR the per-connection
//! `Channel … via NET/…/GDRDMA` lines — never `GDR 1`, which NCCL prints also when no network
//! connection exists at all.

mod checks;
mod cli;
mod exit;
#[cfg(test)]
mod tests;

pub use checks::net_connections;
pub use cli::{Args, AFTER_HELP};
