//! The `kvtier` command line: `replay`, `capacity`, `serve`, `convert`, `sweep`, `events`. Each module
//! parses its command's options (clap) and prints what the library computes: the replay run
//! ([`crate::replay`]), the capacity report ([`crate::sizing`]), serving
//! ([`crate::serve`]), the Mooncake conversion ([`crate::convert`]) and the sweep
//! ([`crate::sweep`]).

mod capacity;
mod convert;
mod events;
mod output;
mod replay;
mod serve;
mod sweep;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use output::OutputError;

use crate::convert::ConvertOptions;
use crate::replay::ReplayOptions;
use crate::serve::ServeOptions;
use crate::sizing::CapacityOptions;
use crate::sweep::SweepOptions;
use crate::tier::SimpleOptions;

/// kvtier: the bookkeeping of a KV-cache offload tier, vLLM 0.33.0-exact.
#[derive(Debug, Parser)]
// The help's first line says what the command is (not the package description).
#[command(
    name = "kvtier",
    version,
    about = "kvtier: replay KV-cache traces through a vLLM-exact offload tier, size a CPU tier, \
             sweep capacities, serve /metrics."
)]
struct Args {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a kvtrace (or a built-in workload) through the offload manager.
    Replay(replay::ReplayArgs),
    /// How many KV blocks, tokens and concurrent requests fit in a memory budget.
    Capacity(capacity::CapacityArgs),
    /// Replay one trace under many capacities, policies and thresholds; table and plot.
    Sweep(sweep::SweepArgs),
    /// Convert a Mooncake JSONL trace into a kvtrace.
    Convert(ConvertOptions),
    /// Replay while serving `/metrics` for Prometheus, then keep serving until interrupted.
    Serve(serve::ServeArgs),
    /// Subscribe to a KV-events stream (vLLM's or kvtier's) and print each batch as JSON.
    Events(events::EventsArgs),
}

/// The `kvtier` command: a command line parsed, ready to [`run`](Cli::run).
///
/// The `*_options` methods give what the command line asks of the library (the options
/// [`crate::replay::replay`], [`crate::serve::start`], [`crate::sweep::sweep`],
/// [`crate::sizing::report`] and [`crate::convert::convert`] take), for a program that runs
/// the library itself with `kvtier`'s flags.
///
/// ```
/// let cli = kvtier_cli::Cli::try_parse_from(["kvtier", "replay", "--requests", "50"])?;
/// let report = kvtier_cli::replay::replay(&cli.replay_options().unwrap(), false)?;
/// assert_eq!(report.counts.requests, 50);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Cli {
    command: Command,
}

impl Cli {
    /// Parses the process's arguments; on a malformed command line (or `--help`,
    /// `--version`) prints clap's message and exits, as the command does.
    #[must_use]
    pub fn parse() -> Self {
        Cli {
            command: Args::parse().command,
        }
    }

    /// Parses `args`, the program's name first.
    ///
    /// # Errors
    /// clap's error for a malformed command line (and for `--help` and `--version`).
    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Args::try_parse_from(args).map(|a| Cli { command: a.command })
    }

    /// Runs the command, printing what it prints; an error is printed to stderr and exits 2.
    #[must_use]
    pub fn run(self) -> ExitCode {
        match self.run_to(&mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvtier: {e}");
                ExitCode::from(2)
            }
        }
    }

    /// Runs the command with what it prints to stdout written to `out` instead (progress,
    /// notes and errors still go to stderr).
    ///
    /// # Errors
    /// The error the command prints before exiting 2.
    pub fn run_to(self, out: &mut dyn Write) -> Result<(), crate::Error> {
        match self.command {
            Command::Replay(args) => replay::run(&args, out),
            Command::Capacity(args) => capacity::run(&args, out),
            Command::Serve(args) => serve::run(&args),
            Command::Convert(args) => convert::run(&args).map_err(Into::into),
            Command::Sweep(args) => sweep::run(&args, out),
            Command::Events(args) => events::run(&args, out),
        }
    }

    /// `replay` or `serve`: what is replayed, with the GPU front of `--gpu-blocks`.
    #[must_use]
    pub fn replay_options(&self) -> Option<ReplayOptions> {
        match &self.command {
            Command::Replay(a) => Some(a.replay_options()),
            Command::Serve(a) => Some(a.replay.replay_options()),
            _ => None,
        }
    }

    /// `replay` or `serve` with `--offloader simple`: the simple offloader's options
    /// (`--lazy`, `--world-size`, `--cpu-bytes`).
    #[must_use]
    pub fn simple_options(&self) -> Option<SimpleOptions> {
        let a = match &self.command {
            Command::Replay(a) => a,
            Command::Serve(a) => &a.replay,
            _ => return None,
        };
        a.tier.simple().then(|| a.simple_options())
    }

    /// `serve`: what is served.
    #[must_use]
    pub fn serve_options(&self) -> Option<ServeOptions> {
        match &self.command {
            Command::Serve(a) => Some(a.options()),
            _ => None,
        }
    }

    /// `sweep`: what is swept.
    #[must_use]
    pub fn sweep_options(&self) -> Option<&SweepOptions> {
        match &self.command {
            Command::Sweep(a) => Some(&a.options),
            _ => None,
        }
    }

    /// `capacity`: what is sized.
    #[must_use]
    pub fn capacity_options(&self) -> Option<&CapacityOptions> {
        match &self.command {
            Command::Capacity(a) => Some(&a.options),
            _ => None,
        }
    }

    /// `convert`: what is converted.
    #[must_use]
    pub fn convert_options(&self) -> Option<&ConvertOptions> {
        match &self.command {
            Command::Convert(a) => Some(a),
            _ => None,
        }
    }
}
