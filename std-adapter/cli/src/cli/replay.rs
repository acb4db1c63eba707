//! `kvtier replay`: parses the options, runs [`crate::replay::replay`] (or
//! [`crate::replay::replay_simple`] with `--offloader simple`) and prints the
//! report (hit rates, evictions, skipped stores, the hit digest and the throughput) for people
//! or as one JSON object, with the manager's final stats in the Prometheus text format.

use std::io::{IsTerminal, Write};

use super::OutputError;
use crate::engine::EngineArgs;
use crate::replay::{
    GpuFront, GpuReport, ReplayOptions, ReplayReport, SimpleReport, replay, replay_simple,
};
use crate::tier::{Offloader, OffloaderArgs, SimpleOptions};
use kvtier_core::stats::Payload;
use kvtier_core::stats::simple_offload::SaveOutcome;

/// Options of `kvtier replay`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReplayArgs {
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
    /// Put a GPU prefix cache of N blocks (the null block included) in front of the tier,
    /// with the engine model of docs/engine-model.md: the tier then sees only the GPU's
    /// misses, and the report adds the GPU's series. In `kvtier serve`, also the GPU blocks
    /// of `vllm:cache_config_info` (as `kvtier capacity --num-gpu-blocks-override`).
    #[arg(long, value_name = "N")]
    pub gpu_blocks: Option<u32>,
    /// The engine model's options (used with --gpu-blocks).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The offloader and the simple offloader's mode.
    #[command(flatten)]
    pub tier: OffloaderArgs,
    /// With --offloader simple: the server-wide CPU budget (vLLM's cpu_bytes_to_use, e.g.
    /// 8GiB), sized per rank as vLLM sizes it from the model's bytes per block (--model,
    /// --layout or --hf-config); --capacity is then the explicit num_cpu_blocks within it.
    #[arg(long, value_name = "SIZE", value_parser = crate::sizing::parse_size_floor)]
    pub cpu_bytes: Option<u64>,
}

impl ReplayArgs {
    /// The simple offloader's options (`--lazy`, `--world-size`, `--cpu-bytes`).
    #[must_use]
    pub(crate) fn simple_options(&self) -> SimpleOptions {
        self.tier.options(self.cpu_bytes)
    }

    /// The replay options, with the GPU front of `--gpu-blocks` when given.
    #[must_use]
    pub(crate) fn replay_options(&self) -> ReplayOptions {
        let mut o = self.options.clone();
        o.gpu = self.gpu_blocks.map(|num_gpu_blocks| GpuFront {
            num_gpu_blocks,
            engine: self.engine,
        });
        o
    }
}

/// Runs `kvtier replay` with the offloader of `--offloader`.
///
/// # Errors
/// Any error of reading or replaying the trace, or of printing the report.
pub(crate) fn run(args: &ReplayArgs, out: &mut dyn Write) -> Result<(), crate::Error> {
    match args.tier.offloader {
        Offloader::Offloading => {
            let report = replay(&args.replay_options(), std::io::stderr().is_terminal())?;
            print_kv_events(report.kv_events);
            let json = || serde_json::to_string(&json_value(&report));
            print_report(args, json, || human(&report), &report.payload, out)?;
        }
        Offloader::Simple => {
            let report = replay_simple(&args.replay_options(), args.simple_options())?;
            print_kv_events(report.kv_events);
            let json = || serde_json::to_string(&report);
            print_report(args, json, || human_simple(&report), &report.payload, out)?;
        }
    }
    Ok(())
}

/// Prints what the KV-events publisher sent, when there was one, to stderr.
pub(crate) fn print_kv_events(stats: Option<kvtier::kv_events::PublisherStats>) {
    if let Some(k) = stats {
        eprintln!(
            "kvtier replay: kv events: {} batches, {} events published, {} dropped",
            k.batches, k.events, k.dropped
        );
    }
}

/// Prints a replay's report to `out`: one JSON line (`--json`) or the text for people, then
/// with `--metrics` the Prometheus exposition of `payload` under `--model-name`.
///
/// # Errors
/// [`OutputError`] when the JSON, the exposition or the write fails.
fn print_report(
    args: &ReplayArgs,
    json: impl FnOnce() -> Result<String, serde_json::Error>,
    human: impl FnOnce() -> String,
    payload: &Payload,
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let mut text = if args.json {
        let mut s = json().map_err(OutputError::Json)?;
        s.push('\n');
        s
    } else {
        human()
    };
    if args.metrics {
        let config = kvtier::export::ExporterConfig::new(&args.model_name, 1);
        let exposition = kvtier::export::render(payload, config).map_err(OutputError::Metrics)?;
        if !args.json {
            text.push('\n');
        }
        text.push_str(&exposition);
    }
    out.write_all(text.as_bytes()).map_err(OutputError::Write)
}

/// The JSON object of a report: every count, `digest` as 16 hex digits, `stores_skipped`
/// null without a filter.
#[must_use]
pub(crate) fn json_value(r: &ReplayReport) -> serde_json::Value {
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
pub(crate) fn human(r: &ReplayReport) -> String {
    let mut s = tier_report(r);
    if let Some(g) = &r.gpu {
        s.push_str(&gpu_report(g));
    }
    s
}

/// The GPU front's section of the report.
fn gpu_report(g: &GpuReport) -> String {
    let c = &g.counts;
    format!(
        "\n\
         GPU front (engine model, docs/engine-model.md): {blocks} blocks, \
         max_num_batched_tokens {mbt}, max_num_seqs {seqs}, {dec} output tokens, \
         transfers {ts} steps\n\
         engine steps          {steps:>14}\n\
         finished requests     {fin:>14}\n\
         preemptions           {pre:>14}\n\
         loads from the tier   {loads:>14}\n\
         prefix cache queries  {q:>14} tokens\n\
         prefix cache hits     {h:>14} tokens ({rate:.2}%)\n\
         external queries      {eq:>14} tokens\n\
         external hits         {eh:>14} tokens\n\
         peak used blocks      {peak:>14}\n\
         cached blocks (end)   {cached:>14}\n\
         kv cache usage (end)  {usage:>14.4}\n",
        blocks = g.gpu_blocks,
        mbt = g.max_num_batched_tokens,
        seqs = g.max_num_seqs,
        dec = g.decode_tokens,
        ts = g.transfer_steps,
        steps = c.steps,
        fin = c.finished,
        pre = c.preemptions,
        loads = c.loads,
        q = c.prefix_cache_queries,
        h = c.prefix_cache_hits,
        rate = 100.0 * g.prefix_cache_hit_rate,
        eq = c.external_prefix_cache_queries,
        eh = c.external_prefix_cache_hits,
        peak = c.peak_used_blocks,
        cached = g.cached_blocks,
        usage = g.kv_cache_usage_perc,
    )
}

/// The tier's report (all of it without `--gpu-blocks`).
fn tier_report(r: &ReplayReport) -> String {
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

/// The report of `--offloader simple` for people.
#[must_use]
pub(crate) fn human_simple(r: &SimpleReport) -> String {
    let g = &r.gpu;
    let mut s = format!(
        "kvtier replay --offloader simple: {source}\n\
         {mode} mode, {cpu} CPU blocks, world size {ws}; GPU front (engine model, \
         docs/engine-model.md): {gpu} blocks{hybrid}\n\
         \n",
        source = r.source,
        mode = if r.lazy { "lazy" } else { "eager" },
        cpu = r.cpu_blocks,
        ws = r.world_size,
        gpu = g.gpu_blocks,
        hybrid = if g.hybrid {
            ", hybrid (attention + Mamba in align mode)"
        } else {
            ""
        },
    );
    for o in SaveOutcome::ALL {
        let n = r.outcomes.get(o.label()).copied().unwrap_or(0);
        s.push_str(&format!("save {:<22} {n:>14}\n", o.label()));
    }
    s.push_str(&format!(
        "load blocks                 {load:>14}\n\
         used blocks (end)           {used:>14}\n\
         pending store blocks (end)  {pend:>14}\n\
         cached CPU blocks (end)     {cached:>14}\n\
         engine steps                {steps:>14}\n\
         preemptions                 {pre:>14}\n\
         prefix cache hits           {h:>14} of {q} tokens\n\
         external hits               {eh:>14} of {eq} tokens\n\
         wall time                   {wall:>12.3} s\n",
        load = r.load_blocks,
        used = r.used_blocks,
        pend = r.pending_store_blocks,
        cached = r.cached_blocks,
        steps = g.counts.steps,
        pre = g.counts.preemptions,
        h = g.counts.prefix_cache_hits,
        q = g.counts.prefix_cache_queries,
        eh = g.counts.external_prefix_cache_hits,
        eq = g.counts.external_prefix_cache_queries,
        wall = r.wall_s,
    ));
    s
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "test code: a failed unwrap is a failed test"
    )]

    use super::*;

    #[test]
    fn human_report_shows_each_time_and_both_rates() {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/small-a.kvtrace"
        );
        let cli = crate::Cli::try_parse_from(["kvtier", "replay", "--trace", trace]).unwrap();
        let r = replay(&cli.replay_options().unwrap(), false).unwrap();
        let text = human(&r);
        for label in [
            "parse time",
            "read time",
            "replay time",
            "other time",
            "wall time",
            "replay throughput",
            "wall throughput",
        ] {
            assert!(text.contains(label), "{label} missing in\n{text}");
        }
        assert!(text.contains(&format!("{:>12.3} s", r.replay_s)), "{text}");
    }
}
