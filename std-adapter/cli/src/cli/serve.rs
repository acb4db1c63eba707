//! `kvtier serve`: parses the options, starts [`crate::serve::start`] and serves until the
//! process is interrupted.

use std::thread;

pub use crate::serve::{MIN_RATE, ServeOptions, ServeSummary, Serving};

use super::replay::ReplayArgs;
use crate::serve::start;

/// Options of `kvtier serve`: every `replay` option, plus where to listen and how fast to go.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The replay.
    #[command(flatten)]
    pub replay: ReplayArgs,
    /// Where `/metrics` listens (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "ADDR")]
    pub listen: String,
    /// Requests per second of the replay (default: as fast as it goes).
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Milliseconds between two exports of the collected stats.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub export_interval_ms: u64,
}

impl ServeArgs {
    /// What these options ask to serve.
    #[must_use]
    pub fn options(&self) -> ServeOptions {
        ServeOptions {
            replay: self.replay.options.clone(),
            model_name: self.replay.model_name.clone(),
            listen: self.listen.clone(),
            rate: self.rate,
            export_interval_ms: self.export_interval_ms,
        }
    }
}

/// Runs `kvtier serve`: serves until the process is interrupted.
///
/// # Errors
/// Any error of starting or of the replay.
pub fn run(args: &ServeArgs) -> Result<(), crate::Error> {
    let mut serving = start(&args.options())?;
    eprintln!(
        "kvtier serve: metrics at http://{}/metrics",
        serving.local_addr()
    );
    let summary = serving.wait_replay()?;
    let c = summary.counts;
    eprintln!(
        "kvtier serve: replay done ({} requests, {} hit blocks of {}, {} stored, {} evicted); \
         serving until interrupted",
        c.requests, c.hit_blocks, c.request_blocks, c.stored_blocks, c.evicted_blocks
    );
    loop {
        thread::park();
    }
}
