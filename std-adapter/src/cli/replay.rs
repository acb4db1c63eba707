//! `kvtier replay`: replays a kvtrace (or the built-in workload) through the offload manager
//! and reports hit rates, evictions, skipped stores, the hit digest and the throughput.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvtier_core::manager::{CpuTierInfo, ManagerConfig, OffloadManager, PolicyKind};
use kvtier_core::stats::{Payload, catalogue};

use crate::exposition::{EngineLabels, ExpositionOptions, render};

use super::input::FormatArgs;
use crate::replay::{ReplayCounts, Replayer};
use crate::trace::{Generator, GeneratorConfig, RecordSource};

/// Options of `kvtier replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The trace to replay, kvtrace or Mooncake JSONL (see --format); without it, a built-in
    /// deterministic workload (shared prefixes with Zipf popularity, multi-turn follow-ups, 32
    /// requests in flight).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The trace's format and the Mooncake timing model.
    #[command(flatten)]
    pub input: FormatArgs,
    /// Requests of the built-in workload.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub requests: u64,
    /// Seed of the built-in workload.
    #[arg(long, default_value_t = 1, value_name = "S")]
    pub seed: u64,
    /// Eviction policy.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    pub policy: PolicyArg,
    /// Tier size in chunks (default: the trace header's `capacity`, else 1024).
    #[arg(long, value_name = "N")]
    pub capacity: Option<u32>,
    /// Admit a block on its T-th store offer (0 or 1: no filter).
    #[arg(long, default_value_t = 0, value_name = "T")]
    pub store_threshold: u32,
    /// Size of the reuse tracker.
    #[arg(long, default_value_t = 64_000, value_name = "M")]
    pub max_tracker_size: u32,
    /// Requests in flight the manager can hold at once (a trace with more open requests is an
    /// error naming the record).
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub max_requests: u32,
    /// Tokens per block (default: the trace header's `block_tokens`; 512 for Mooncake).
    #[arg(long, value_name = "N")]
    pub block_tokens: Option<u32>,
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
    /// Every N requests, print vLLM's `KV Transfer metrics: k=v, …` line (from the stats
    /// drained since the previous line) on stderr.
    #[arg(long, value_name = "N")]
    pub log_interval: Option<u64>,
}

/// The policies on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// vLLM's request-scoped LRU.
    Lru,
    /// vLLM's ARC.
    Arc,
}

impl From<PolicyArg> for PolicyKind {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Lru => PolicyKind::Lru,
            PolicyArg::Arc => PolicyKind::Arc,
        }
    }
}

/// The result of a replay run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayReport {
    /// Where the records came from (a file name or `builtin(seed=…, requests=…)`).
    pub source: String,
    /// The counts.
    #[serde(flatten)]
    pub counts: ReplayCounts,
    /// Chunks resident at the end (allocated − free).
    pub resident_blocks: u32,
    /// Heap bytes the manager holds (fixed at construction, plus warm per-request buffers).
    pub manager_heap_bytes: u64,
    /// The policy name.
    pub policy: &'static str,
    /// The tier size in chunks.
    pub capacity: u32,
    /// The store threshold.
    pub store_threshold: u32,
    /// Wall-clock seconds of the replay loop (reading or generating records included).
    pub wall_s: f64,
    /// `request_blocks / wall_s`.
    pub request_blocks_per_s: f64,
    /// The manager's stats over the whole run, as vLLM's payload: the usage gauges at the
    /// end, every allocation-size sample, `stores_skipped` and `allocation_failure` totals,
    /// and the tier's info series.
    #[serde(skip)]
    pub payload: Payload,
}

/// Runs `kvtier replay`.
///
/// # Errors
/// Any error of reading or replaying the trace, as text.
pub fn run(args: &ReplayArgs) -> Result<(), String> {
    let report = replay(args, std::io::stderr().is_terminal())?;
    let mut out = std::io::stdout().lock();
    let mut text = if args.json {
        let mut s = serde_json::to_string(&json_value(&report)).map_err(|e| e.to_string())?;
        s.push('\n');
        s
    } else {
        human(&report)
    };
    if args.metrics {
        let engine = EngineLabels::new(&args.model_name, "0");
        let exposition = render(&report.payload, &engine, &ExpositionOptions::default())
            .map_err(|e| format!("rendering the metrics: {e}"))?;
        if !args.json {
            text.push('\n');
        }
        text.push_str(&exposition);
    }
    out.write_all(text.as_bytes())
        .map_err(|e| format!("writing the report: {e}"))
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

/// Replays as `args` say; `progress` shows a bar on stderr.
///
/// # Errors
/// Any error of reading or replaying the trace, as text.
pub fn replay(args: &ReplayArgs, progress: bool) -> Result<ReplayReport, String> {
    match &args.trace {
        Some(path) => {
            let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let bar = bar(progress, len, "bytes");
            let reader =
                args.input
                    .open_path(path, args.block_tokens, args.capacity.is_some(), |file| {
                        bar.wrap_read(file)
                    })?;
            let r = run_source(args, reader, path.display().to_string(), &bar, false)
                .map_err(|e| format!("{}: {e}", path.display()));
            bar.finish_and_clear();
            r
        }
        None => {
            let gen_cfg = GeneratorConfig::new(args.seed, args.requests);
            let generator = Generator::new(gen_cfg).map_err(|e| e.to_string())?;
            let bar = bar(progress, args.requests, "requests");
            let source = format!("builtin(seed={}, requests={})", args.seed, args.requests);
            let r = run_source(args, generator, source, &bar, true);
            bar.finish_and_clear();
            r
        }
    }
}

fn bar(show: bool, len: u64, unit: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    let template = format!("{{spinner}} replay [{{bar:40}}] {{pos}}/{{len}} {unit} ({{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        b.set_style(style);
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

fn run_source<S: RecordSource>(
    args: &ReplayArgs,
    mut source: S,
    name: String,
    bar: &ProgressBar,
    count_requests: bool,
) -> Result<ReplayReport, String>
where
    S::Error: std::fmt::Display,
{
    let header = source.header().clone();
    let (manager, capacity) = args.manager(header.capacity)?;
    let block_tokens = args.block_tokens.unwrap_or(header.block_tokens);
    let mut replayer = Replayer::new(manager, u64::from(block_tokens));
    let log_every = args.log_interval.filter(|n| *n > 0);
    // With a log interval, drains happen during the run: `total` keeps every drain for the
    // report, `interval` what the next log line covers (reset after each line, as vLLM's
    // KVConnectorLogging does).
    let mut total = Payload::new();
    let mut interval = Payload::new();
    let mut failures_logged = 0u64;
    let mut requests = 0u64;
    let start = Instant::now();
    let mut n: u64 = 0;
    loop {
        let rec = match source.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => return Err(e.to_string()),
        };
        let is_load = matches!(rec, crate::trace::Record::Load { .. });
        replayer
            .apply(rec)
            .map_err(|e| format!("record {}: {e}", n + 1))?;
        n += 1;
        if count_requests && is_load && n.is_multiple_of(4096) {
            bar.set_position(replayer.counts().requests);
        }
        if is_load {
            requests += 1;
            if let Some(every) = log_every
                && requests.is_multiple_of(every)
            {
                let mut drained = replayer.drain_stats().to_payload();
                let failures = replayer.counts().store_failures;
                if failures > failures_logged {
                    drained
                        .increase_counter(
                            catalogue::ALLOCATION_FAILURE,
                            &[],
                            failures - failures_logged,
                        )
                        .map_err(|e| e.to_string())?;
                    failures_logged = failures;
                }
                total.aggregate(&drained).map_err(|e| e.to_string())?;
                interval.aggregate(&drained).map_err(|e| e.to_string())?;
                if let Some(line) = crate::export::log_line(&interval) {
                    bar.suspend(|| eprintln!("{line}"));
                }
                interval = Payload::new();
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let counts = replayer.counts();
    let mut payload = total;
    payload
        .aggregate(&replayer.drain_stats().to_payload())
        .map_err(|e| e.to_string())?;
    // Without a log interval nothing was drained before, so this is the whole run's count.
    let counts_failures = counts.store_failures.saturating_sub(failures_logged);
    // Catalogue counters and one info series fit any payload.
    let _ = payload.increase_counter(catalogue::ALLOCATION_FAILURE, &[], counts_failures);
    let _ = payload.set_info(vec![replayer.manager().config_info()]);
    #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
    let rate = if wall > 0.0 {
        counts.request_blocks as f64 / wall
    } else {
        0.0
    };
    Ok(ReplayReport {
        source: name,
        counts,
        resident_blocks: replayer.manager().allocated(),
        manager_heap_bytes: replayer.manager().heap_bytes() as u64,
        policy: args.policy_kind().name(),
        capacity,
        store_threshold: args.store_threshold,
        wall_s: wall,
        request_blocks_per_s: rate,
        payload,
    })
}

impl ReplayArgs {
    fn policy_kind(&self) -> PolicyKind {
        self.policy.into()
    }

    /// The manager these options describe, and its capacity: `--capacity`, else the trace
    /// header's `capacity`, else 1024 chunks. Its `config_info` reports the capacity and
    /// `None` for the sizes a replay cannot know.
    ///
    /// # Errors
    /// A header capacity that does not fit in `u32`, or a rejected manager configuration.
    pub fn manager(&self, header_capacity: Option<u64>) -> Result<(OffloadManager, u32), String> {
        let capacity = match self.capacity {
            Some(c) => c,
            None => match header_capacity {
                Some(c) => u32::try_from(c)
                    .map_err(|_| format!("trace header capacity {c} does not fit in u32"))?,
                None => 1024,
            },
        };
        let mut cfg = ManagerConfig::new(capacity);
        cfg.info = Some(CpuTierInfo {
            num_chunks: u64::from(capacity),
            blocks_per_chunk: 1,
            kv_cache_size_bytes: None,
            kv_cache_size_tokens: None,
        });
        cfg.policy = self.policy_kind();
        cfg.store_threshold = self.store_threshold;
        cfg.max_tracker_size = self.max_tracker_size;
        cfg.max_requests = self.max_requests;
        Ok((
            OffloadManager::new(cfg).map_err(|e| e.to_string())?,
            capacity,
        ))
    }
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
         wall time             {wall:>12.3} s\n\
         throughput            {rate:>12.2} M request-blocks/s\n",
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
        wall = r.wall_s,
        rate = r.request_blocks_per_s / 1e6,
    )
}
