//! `kvtier replay`: parses the options, runs [`crate::replay_run::replay`] and prints the
//! report (hit rates, evictions, skipped stores, the hit digest and the throughput) for people
//! or as one JSON object, with the manager's final stats in the Prometheus text format.

use std::io::{IsTerminal, Write};

pub use crate::replay_run::{ManagerArgs, ReplayOptions, parse_policy};

use super::OutputError;
use crate::replay_run::{ReplayReport, replay};

/// Options of `kvtier replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// What to replay and how.
    #[command(flatten)]
    pub options: ReplayOptions,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Also print the manager's final stats in the Prometheus text format, under the names a
    /// vLLM server exposes.
    #[arg(long)]
    pub metrics: bool,
    /// The `model_name` label of `--metrics`.
    #[arg(long, default_value = "kvtier-replay", value_name = "NAME")]
    pub model_name: String,
}

/// Runs `kvtier replay`.
///
/// # Errors
/// Any error of reading or replaying the trace, or of printing the report.
pub fn run(args: &ReplayArgs) -> Result<(), crate::Error> {
    let report = replay(&args.options, std::io::stderr().is_terminal())?;
    if let Some(k) = report.kv_events {
        eprintln!(
            "kvtier replay: kv events: {} batches, {} events published, {} dropped",
            k.batches, k.events, k.dropped
        );
    }
    let mut out = std::io::stdout().lock();
    let mut text = if args.json {
        let mut s = serde_json::to_string(&json_value(&report)).map_err(OutputError::Json)?;
        s.push('\n');
        s
    } else {
        human(&report)
    };
    if args.metrics {
        let config = kvtier::export::ExporterConfig::new(&args.model_name, 1);
        let exposition =
            kvtier::export::render(&report.payload, config).map_err(OutputError::Metrics)?;
        if !args.json {
            text.push('\n');
        }
        text.push_str(&exposition);
    }
    out.write_all(text.as_bytes()).map_err(OutputError::Write)?;
    Ok(())
}

/// The JSON object of a report: every count, `digest` as 16 hex digits, `stores_skipped`
/// null without a filter.
#[must_use]
pub fn json_value(r: &ReplayReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("digest".into(), format!("{:016x}", r.counts.digest).into());
        o.insert("block_hit_rate".into(), r.counts.block_hit_rate().into());
        o.insert(
            "request_hit_rate".into(),
            r.counts.request_hit_rate().into(),
        );
    }
    v
}

#[expect(clippy::cast_precision_loss, reason = "a size for people")]
fn per_chunk(r: &ReplayReport) -> f64 {
    if r.capacity == 0 {
        0.0
    } else {
        r.manager_heap_bytes as f64 / f64::from(r.capacity)
    }
}

/// The report for people.
#[must_use]
pub fn human(r: &ReplayReport) -> String {
    let c = &r.counts;
    let skipped = c
        .stores_skipped
        .map_or_else(|| "- (no filter)".to_string(), |v| v.to_string());
    format!(
        "kvtier replay: {source}\n\
         policy {policy}, capacity {cap} chunks, store threshold {thr}\n\
         \n\
         requests              {req:>14}\n\
         request blocks        {blocks:>14}\n\
         hit blocks            {hit:>14}   ({bhr:.2}% of blocks)\n\
         hit requests          {hreq:>14}   ({rhr:.2}% of requests)\n\
         stored blocks         {stored:>14}\n\
         evicted blocks        {evicted:>14}\n\
         store failures        {fail:>14}\n\
         stopped at pending    {pend:>14}\n\
         stores skipped        {skipped:>14}\n\
         resident blocks       {resident:>14}\n\
         manager heap          {heap:>14} bytes ({per:.1} per chunk)\n\
         hit digest            {digest:>14}\n\
         \n\
         parse time            {parse:>12.3} s   (the replay waiting for the trace reader)\n\
         read time             {read:>12.3} s   (reading the trace or generating it, on its own thread)\n\
         replay time           {replay:>12.3} s   (the manager calls of the replay loop)\n\
         other time            {other:>12.3} s   (setup, log lines, final stats)\n\
         wall time             {wall:>12.3} s\n\
         replay throughput     {replay_rate:>12.2} M request-blocks/s\n\
         wall throughput       {rate:>12.2} M request-blocks/s\n",
        source = r.source,
        policy = r.policy,
        cap = r.capacity,
        thr = r.store_threshold,
        req = c.requests,
        blocks = c.request_blocks,
        hit = c.hit_blocks,
        bhr = 100.0 * c.block_hit_rate(),
        hreq = c.hit_requests,
        rhr = 100.0 * c.request_hit_rate(),
        stored = c.stored_blocks,
        evicted = c.evicted_blocks,
        fail = c.store_failures,
        pend = c.stopped_at_pending,
        resident = r.resident_blocks,
        heap = r.manager_heap_bytes,
        per = per_chunk(r),
        digest = format!("{:016x}", c.digest),
        parse = r.parse_s,
        read = r.read_s,
        replay = r.replay_s,
        other = r.other_s,
        wall = r.wall_s,
        replay_rate = r.replay_request_blocks_per_s / 1e6,
        rate = r.request_blocks_per_s / 1e6,
    )
}
