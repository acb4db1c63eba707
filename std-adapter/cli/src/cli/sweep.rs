//! `kvtier sweep`: parses the options, runs [`crate::sweep::sweep`] (or
//! [`crate::sweep::sweep_simple`] with `--offloader simple`) and prints the
//! hit-rate table, CSV or one JSON object (the plot is drawn by the run).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};

use kvtier_core::stats::simple_offload::SaveOutcome;

use crate::sweep::{
    SimpleSweepReport, SimpleSweepRow, SweepOptions, SweepReport, sweep, sweep_simple,
};
use crate::tier::Offloader;

use super::OutputError;
use crate::numfmt::thousands;

/// Options of `kvtier sweep`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SweepArgs {
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
pub(crate) fn table(r: &SweepReport) -> String {
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
pub(crate) fn csv(r: &SweepReport) -> String {
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
pub(crate) fn run(args: &SweepArgs, out: &mut dyn Write) -> Result<(), crate::Error> {
    let text = match args.options.tier.offloader {
        Offloader::Offloading => offloading_text(args)?,
        Offloader::Simple => {
            let r = sweep_simple(&args.options)?;
            if args.json {
                let mut t = serde_json::to_string_pretty(&r).map_err(OutputError::Json)?;
                t.push('\n');
                t
            } else if args.csv {
                csv_simple(&r)
            } else {
                table_simple(&r)
            }
        }
    };
    out.write_all(text.as_bytes()).map_err(OutputError::Write)?;
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

fn outcome(row: &SimpleSweepRow, o: SaveOutcome) -> u64 {
    row.outcomes.get(o.label()).copied().unwrap_or(0)
}

/// The table for people.
#[must_use]
pub(crate) fn table_simple(r: &SimpleSweepReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kvtier sweep --offloader simple: {} ({}, {} requests, blocks of {} tokens)",
        r.trace,
        r.format,
        thousands(r.requests),
        r.block_tokens
    );
    let _ = writeln!(
        s,
        "{} mode, world size {}; GPU front (engine model, docs/engine-model.md): {} blocks{}",
        if r.lazy { "lazy" } else { "eager" },
        r.world_size,
        thousands(u64::from(r.gpu_blocks)),
        if r.hybrid {
            ", hybrid (attention + Mamba in align mode)"
        } else {
            ""
        }
    );
    if let (Some(m), Some(b)) = (&r.model, r.bytes_per_block) {
        let _ = writeln!(s, "model {m}: {} bytes per block", thousands(b));
    }
    let _ = writeln!(
        s,
        "{} pool sizes on {} threads: trace parsed once in {:.3} s, rows {:.3} s, wall {:.3} s",
        r.rows.len(),
        r.jobs,
        r.parse_s,
        r.sweep_s,
        r.wall_s
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>10} {:>7} {:>10} {:>8} {:>12} {:>12} {:>9} {:>8} {:>8} {:>12} {:>8}",
        "CPU blocks",
        "GiB",
        "stored",
        "dropped",
        "skipped",
        "load blocks",
        "ext. hit",
        "used",
        "pending",
        "GPU hit tok",
        "steps"
    );
    for row in &r.rows {
        let dropped = outcome(row, SaveOutcome::DroppedCpuFull)
            + outcome(row, SaveOutcome::DroppedRequestGone)
            + outcome(row, SaveOutcome::DroppedNullBlock)
            + outcome(row, SaveOutcome::DroppedNotHashed);
        let skipped = outcome(row, SaveOutcome::SkippedAlreadyCached)
            + outcome(row, SaveOutcome::SkippedInFlight);
        let _ = writeln!(
            s,
            "{:>10} {:>7} {:>10} {:>8} {:>12} {:>12} {:>8.2}% {:>8} {:>8} {:>12} {:>8}",
            thousands(u64::from(row.cpu_blocks)),
            row.gib
                .map_or_else(|| "-".to_owned(), |g| format!("{g:.1}")),
            thousands(outcome(row, SaveOutcome::Stored)),
            thousands(dropped),
            thousands(skipped),
            thousands(row.load_blocks),
            100.0 * row.external_hit_rate,
            row.used_blocks,
            thousands(row.pending_store_blocks),
            thousands(row.gpu_hit_tokens),
            thousands(row.steps)
        );
    }
    let note = if r.hybrid {
        "save outcomes classify the Mamba group's boundary hand-offs (lazy mode reads none)"
    } else {
        "save outcomes classify boundary hand-offs (Mamba \"align\" groups in vLLM); a dense \
         model's single full-attention group has none, so they stay 0, as in vLLM (--hybrid \
         models one)"
    };
    let _ = writeln!(s, "\n{note}");
    s
}

/// The rows as CSV, with a header line: the seven outcomes by vLLM's label, then the loads,
/// the pool at the end and the GPU's figures.
#[must_use]
pub(crate) fn csv_simple(r: &SimpleSweepReport) -> String {
    let mut s = String::from("cpu_blocks,gib");
    for o in SaveOutcome::ALL {
        s.push(',');
        s.push_str(o.label());
    }
    s.push_str(
        ",load_blocks,used_blocks,pending_store_blocks,cached_blocks,external_hit_tokens,\
         external_query_tokens,external_hit_rate,gpu_hit_tokens,gpu_query_tokens,steps,\
         preemptions\n",
    );
    for row in &r.rows {
        let _ = write!(
            s,
            "{},{}",
            row.cpu_blocks,
            row.gib.map(|g| format!("{g:.3}")).unwrap_or_default()
        );
        for o in SaveOutcome::ALL {
            let _ = write!(s, ",{}", outcome(row, o));
        }
        let _ = writeln!(
            s,
            ",{},{},{},{},{},{},{},{},{},{},{}",
            row.load_blocks,
            row.used_blocks,
            row.pending_store_blocks,
            row.cached_blocks,
            row.external_hit_tokens,
            row.external_query_tokens,
            row.external_hit_rate,
            row.gpu_hit_tokens,
            row.gpu_query_tokens,
            row.steps,
            row.preemptions
        );
    }
    s
}
