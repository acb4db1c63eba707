//! `kvtier sweep`: parses the options, runs [`crate::sweep_run::sweep`] and prints the
//! hit-rate table, CSV or one JSON object (the plot is drawn by the run).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};

pub use crate::sweep_run::{SweepOptions, SweepReport, SweepRow, sweep};

use super::OutputError;
use crate::numfmt::thousands;

/// Options of `kvtier sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// What to sweep.
    #[command(flatten)]
    pub options: SweepOptions,
    /// Print CSV instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// The table for people.
#[must_use]
pub fn table(r: &SweepReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kvtier sweep: {} ({}, {} requests, {} request blocks of {} tokens)",
        r.trace,
        r.format,
        thousands(r.requests),
        thousands(r.request_blocks),
        r.block_tokens
    );
    if let (Some(m), Some(b)) = (&r.model, r.bytes_per_chunk) {
        let _ = writeln!(
            s,
            "model {m}: {} bytes of CPU memory per chunk",
            thousands(b)
        );
    }
    let _ = writeln!(
        s,
        "infinite-cache bound: {} of blocks (every repeated block hits)",
        pct(r.infinite_cache_hit_rate)
    );
    let _ = writeln!(
        s,
        "{} configurations on {} threads ({} replayed, method {}): trace parsed once in \
         {:.3} s, rows {:.3} s, wall {:.3} s",
        r.rows.len(),
        r.jobs,
        r.replayed,
        r.method_name(),
        r.parse_s,
        r.sweep_s,
        r.wall_s
    );
    if let Some(rate) = r.sample_rate {
        let _ = writeln!(
            s,
            "sampled curves (rate {rate}): block hit rates are estimates; exact replays at \
             {} checkpoints, largest error {}",
            r.checkpoints.len(),
            r.max_checkpoint_error
                .map_or_else(|| "-".to_owned(), |e| format!("{e:.2} points"))
        );
        for c in &r.checkpoints {
            let _ = writeln!(
                s,
                "  {:>10} {:>6} threshold {}: sampled {} exact {} ({:+.2} points)",
                thousands(u64::from(c.capacity)),
                c.policy,
                c.store_threshold,
                pct(c.sampled_block_hit_rate),
                pct(c.exact_block_hit_rate),
                c.error_points
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>10} {:>9} {:>6} {:>9} {:>7} {:>10} {:>11} {:>15} {:>11} {:>14} {:>14}",
        "capacity",
        "GiB",
        "policy",
        "threshold",
        "source",
        "block hit",
        "request hit",
        "prefill saved",
        "evictions",
        "stores skipped",
        "store failures"
    );
    for row in &r.rows {
        let gib = row
            .gib
            .map_or_else(|| "-".to_owned(), |g| format!("{g:.1}"));
        let dash = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), thousands);
        let _ = writeln!(
            s,
            "{:>10} {:>9} {:>6} {:>9} {:>7} {:>10} {:>11} {:>15} {:>11} {:>14} {:>14}",
            thousands(u64::from(row.capacity)),
            gib,
            row.policy,
            row.store_threshold,
            row.source,
            pct(row.block_hit_rate),
            row.request_hit_rate.map_or_else(|| "-".to_owned(), pct),
            thousands(row.prefill_tokens_saved),
            dash(row.evicted_blocks),
            dash(row.stores_skipped),
            dash(row.store_failures)
        );
    }
    if let Some(k) = &r.knee {
        let gib = k.gib.map_or_else(String::new, |g| format!(" = {g:.1} GiB"));
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "smallest capacity within 1 point of the best: {} chunks{gib} ({}, threshold {}, \
             {} of blocks)",
            thousands(u64::from(k.capacity)),
            k.policy,
            k.store_threshold,
            pct(k.block_hit_rate)
        );
    }
    s
}

/// The rows as CSV, with a header line.
#[must_use]
pub fn csv(r: &SweepReport) -> String {
    let mut s = String::from(
        "capacity,gib,policy,store_threshold,source,block_hit_rate,request_hit_rate,\
         prefill_tokens_saved,evicted_blocks,stores_skipped,store_failures,requests,\
         request_blocks,hit_blocks,hit_requests,stored_blocks,stopped_at_pending,\
         resident_blocks,digest\n",
    );
    for row in &r.rows {
        let opt = |v: Option<String>| v.unwrap_or_default();
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            row.capacity,
            opt(row.gib.map(|g| format!("{g:.3}"))),
            row.policy,
            row.store_threshold,
            row.source,
            row.block_hit_rate,
            opt(row.request_hit_rate.map(|v| v.to_string())),
            row.prefill_tokens_saved,
            opt(row.evicted_blocks.map(|v| v.to_string())),
            opt(row.stores_skipped.map(|v| v.to_string())),
            opt(row.store_failures.map(|v| v.to_string())),
            row.requests,
            row.request_blocks,
            row.hit_blocks,
            opt(row.hit_requests.map(|v| v.to_string())),
            opt(row.stored_blocks.map(|v| v.to_string())),
            opt(row.stopped_at_pending.map(|v| v.to_string())),
            opt(row.resident_blocks.map(|v| v.to_string())),
            opt(row.digest.clone())
        );
    }
    s
}

/// Runs `kvtier sweep`.
///
/// # Errors
/// See [`sweep`]; or printing the report failed.
pub fn run(args: &SweepArgs) -> Result<(), crate::Error> {
    let text = if args.options.tier.simple() {
        let r = super::sweep_simple::sweep_simple(&args.options)?;
        if args.json {
            let mut t = serde_json::to_string_pretty(&r).map_err(OutputError::Json)?;
            t.push('\n');
            t
        } else if args.csv {
            super::sweep_simple::csv(&r)
        } else {
            super::sweep_simple::table(&r)
        }
    } else {
        offloading_text(args)?
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(OutputError::Write)?;
    Ok(())
}

/// The OffloadingConnector's sweep, printed as asked.
fn offloading_text(args: &SweepArgs) -> Result<String, crate::Error> {
    let r = sweep(&args.options, std::io::stderr().is_terminal())?;
    let text = if args.json {
        let mut t = serde_json::to_string_pretty(&r).map_err(OutputError::Json)?;
        t.push('\n');
        t
    } else if args.csv {
        csv(&r)
    } else {
        table(&r)
    };
    Ok(text)
}
