//! The `kvtier` command line: `replay`, `capacity`, `serve`, `convert`, `sweep`, `events`. Each module
//! parses its command's options (clap) and prints what the library computes: the replay run
//! ([`crate::replay_run`]), the capacity report ([`crate::sizing`]), serving
//! ([`crate::serve`]), the Mooncake conversion ([`crate::convert`]) and the sweep
//! ([`crate::sweep_run`]).

pub mod capacity;
pub mod convert;
pub mod events;
pub mod output;
pub mod replay;
pub mod replay_simple;
pub mod serve;
pub mod sweep;
pub mod sweep_simple;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub use output::OutputError;

/// kvtier: the bookkeeping of a KV-cache offload tier, vLLM 0.33.0-exact.
#[derive(Debug, Parser)]
// The help's first line, as the command has always printed it (not the package description).
#[command(
    name = "kvtier",
    version,
    about = "std adapter and command for kvtier: trace replay, capacity sizing, Prometheus export."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay a kvtrace (or a built-in workload) through the offload manager.
    Replay(replay::ReplayArgs),
    /// How many KV blocks, tokens and concurrent requests fit in a memory budget.
    Capacity(capacity::CapacityArgs),
    /// Replay one trace under many capacities, policies and thresholds; table and plot.
    Sweep(sweep::SweepArgs),
    /// Convert a Mooncake JSONL trace into a kvtrace.
    Convert(convert::ConvertOptions),
    /// Replay while serving `/metrics` for Prometheus, then keep serving until interrupted.
    Serve(serve::ServeArgs),
    /// Subscribe to a KV-events stream (vLLM's or kvtier's) and print each batch as JSON.
    Events(events::EventsArgs),
}

/// Parses the command line, runs it and maps errors to a non-zero exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), crate::Error> = match cli.command {
        Command::Replay(args) => replay::run(&args),
        Command::Capacity(args) => capacity::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Convert(args) => convert::run(&args).map_err(Into::into),
        Command::Sweep(args) => sweep::run(&args),
        Command::Events(args) => events::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtier: {e}");
            ExitCode::from(2)
        }
    }
}
