//! `kvtier replay`: replays a kvtrace (or the built-in workload) through the offload manager
//! and reports hit rates, evictions, skipped stores, the hit digest and the throughput.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvtier_core::manager::{ConfigError, ManagerConfig, OffloadManager, PolicyKind};
use kvtier_core::stats::CpuTierInfo;
use kvtier_core::stats::{Payload, catalogue};

use super::input::FormatArgs;
use crate::replay::{DEFAULT_MAX_OPEN_BLOCKS, ReplayCounts, ReplayError, Replayer};
use crate::replay_stats::{ReplayStats, TransferArgs};
use crate::trace::{CompactLimits, CompactTrace, RecordKind, RecordSource};
use crate::workload::{Generator, GeneratorConfig};

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
    /// Eviction policy: lru or arc, as vLLM names them.
    #[arg(long, default_value = "lru", value_parser = parse_policy)]
    pub policy: PolicyKind,
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
    /// error naming the line).
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub max_requests: u32,
    /// Blocks the replayer holds over the requests open at once, 8 bytes each (a trace with
    /// more is an error naming the line).
    #[arg(long, default_value_t = DEFAULT_MAX_OPEN_BLOCKS, value_name = "N")]
    pub max_open_blocks: u64,
    /// The most bytes the manager may allocate (default: the machine's available memory); a
    /// configuration that needs more is refused before anything is allocated.
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Tokens per block, at least 1 (default: the trace header's `block_tokens`; 512 for
    /// Mooncake).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
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
    /// The transfer model of the `vllm:kv_offload_load_*` / `_store_*` families.
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// Parses a policy name as vLLM names it (`lru`, `arc`) into the core's [`PolicyKind`].
///
/// # Errors
/// The core's message for any other name.
pub fn parse_policy(name: &str) -> Result<PolicyKind, String> {
    PolicyKind::from_name(name).map_err(|e| e.to_string())
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
    /// Seconds spent reading and parsing the trace (or generating the workload) into the
    /// in-memory chunks.
    pub parse_s: f64,
    /// Seconds of the replay loop over the parsed chunks: the manager calls of the replay
    /// protocol and the replayer's bookkeeping, nothing else (no parsing, no log lines).
    pub replay_s: f64,
    /// The rest of `wall_s`: building the manager, log lines, the final stats.
    pub other_s: f64,
    /// Wall-clock seconds of the whole run, from opening the trace to the report's numbers
    /// (`parse_s + replay_s + other_s`).
    pub wall_s: f64,
    /// `request_blocks / replay_s`: the manager's throughput.
    pub replay_request_blocks_per_s: f64,
    /// `request_blocks / wall_s`: the end-to-end throughput.
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
        let config = crate::export::ExporterConfig::new(&args.model_name, 1);
        let exposition = crate::export::render(&report.payload, config)
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
    let started = Instant::now();
    match &args.trace {
        Some(path) => {
            let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let bar = bar(progress, len, "bytes");
            let reader =
                args.input
                    .open_path(path, args.block_tokens, args.capacity.is_some(), |file| {
                        bar.wrap_read(file)
                    })?;
            let parse_s = started.elapsed();
            let run = Run {
                args,
                name: path.display().to_string(),
                bar: &bar,
                count_requests: false,
                started,
                parse_s,
            };
            let r = run
                .replay(reader)
                .map_err(|e| format!("{}: {e}", path.display()));
            bar.finish_and_clear();
            r
        }
        None => {
            let gen_cfg = GeneratorConfig::new(args.seed, args.requests);
            let generator = Generator::new(gen_cfg).map_err(|e| e.to_string())?;
            let parse_s = started.elapsed();
            let bar = bar(progress, args.requests, "requests");
            let run = Run {
                args,
                name: format!("builtin(seed={}, requests={})", args.seed, args.requests),
                bar: &bar,
                count_requests: true,
                started,
                parse_s,
            };
            let r = run.replay(generator);
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

/// One replay run: where its records come from and the clock started before the source was
/// opened.
struct Run<'a> {
    args: &'a ReplayArgs,
    name: String,
    bar: &'a ProgressBar,
    /// Whether the bar counts requests (the generator) rather than bytes read.
    count_requests: bool,
    started: Instant,
    /// Time spent opening the source (reading the header, or setting up the generator).
    parse_s: Duration,
}

/// `what` per second of `secs`, 0 for no time.
#[expect(clippy::cast_precision_loss, reason = "a rate for people")]
fn per_second(what: u64, secs: f64) -> f64 {
    if secs > 0.0 { what as f64 / secs } else { 0.0 }
}

impl Run<'_> {
    /// Reads `source` a chunk at a time into one reused [`CompactTrace`] and replays each chunk:
    /// parsing (or generating) and the replay loop are timed apart.
    fn replay<S: RecordSource>(self, mut source: S) -> Result<ReplayReport, String>
    where
        S::Error: std::fmt::Display,
    {
        let args = self.args;
        let (manager, capacity) = args.manager(source.header().capacity)?;
        let block_tokens = args.block_tokens.unwrap_or(source.header().block_tokens);
        if block_tokens == 0 {
            return Err("--block-tokens must be at least 1".into());
        }
        let mut replayer = Replayer::new(manager, u64::from(block_tokens))
            .with_max_open_blocks(args.max_open_blocks);
        let mut stats = ReplayStats::new(args.transfer.model(block_tokens)?);
        let mut chunk = CompactTrace::new(source.header().clone(), CompactLimits::REPLAY_CHUNK);
        let mut log = IntervalLog::new(args.log_interval);
        let mut parse = self.parse_s;
        let mut replay = Duration::ZERO;
        let mut records: u64 = 0;
        loop {
            let t = Instant::now();
            let read = chunk.refill_from(&mut source).map_err(|e| e.to_string())?;
            parse += t.elapsed();
            if read == 0 {
                break;
            }
            let t = Instant::now();
            let mut logging = Duration::ZERO;
            let mut cursor = chunk.cursor();
            while let Some((rec, line)) = cursor.next_with_line() {
                records += 1;
                let is_load = rec.kind() == RecordKind::Load;
                stats.apply(&mut replayer, rec).map_err(|e| {
                    let hint = option_hint(&e);
                    match line {
                        Some(line) => format!("line {line}: {e}{hint}"),
                        None => format!("record {records}: {e}{hint}"),
                    }
                })?;
                if is_load && log.due() {
                    let l = Instant::now();
                    log.write(&mut replayer, self.bar)?;
                    logging += l.elapsed();
                }
            }
            replay += t.elapsed().saturating_sub(logging);
            if self.count_requests {
                self.bar.set_position(replayer.counts().requests);
            }
        }
        let counts = replayer.counts();
        let mut payload = log.total;
        payload
            .aggregate(&replayer.drain_stats().to_step_payload())
            .map_err(|e| e.to_string())?;
        payload
            .aggregate(&stats.drain(&replayer))
            .map_err(|e| e.to_string())?;
        // The report lists allocation_failure even when there was none (a catalogue counter
        // fits any payload).
        let _ = payload.increase_counter(catalogue::ALLOCATION_FAILURE, &[], 0);
        let wall_s = self.started.elapsed().as_secs_f64();
        let parse_s = parse.as_secs_f64();
        let replay_s = replay.as_secs_f64();
        Ok(ReplayReport {
            source: self.name,
            counts,
            resident_blocks: replayer.manager().inspect().allocated(),
            manager_heap_bytes: replayer.manager().inspect().heap_bytes() as u64,
            policy: args.policy.name(),
            capacity,
            store_threshold: args.store_threshold,
            parse_s,
            replay_s,
            other_s: (wall_s - parse_s - replay_s).max(0.0),
            wall_s,
            replay_request_blocks_per_s: per_second(counts.request_blocks, replay_s),
            request_blocks_per_s: per_second(counts.request_blocks, wall_s),
            payload,
        })
    }
}

/// The option that raises the limit a replay error hit, as a sentence's end.
fn option_hint(e: &ReplayError) -> &'static str {
    match e {
        ReplayError::TooManyRequests { .. } => " (raise it with --max-requests)",
        ReplayError::TooManyOpenBlocks { .. } => " (raise it with --max-open-blocks)",
        _ => "",
    }
}

/// vLLM's `KV Transfer metrics` line every N requests, from the stats drained since the
/// previous line (reset after each line, as vLLM's KVConnectorLogging does); `total` keeps
/// every drain for the report.
struct IntervalLog {
    every: Option<u64>,
    requests: u64,
    total: Payload,
}

impl IntervalLog {
    fn new(every: Option<u64>) -> Self {
        IntervalLog {
            every: every.filter(|n| *n > 0),
            requests: 0,
            total: Payload::new(),
        }
    }

    /// Counts one request; whether a line is due.
    fn due(&mut self) -> bool {
        self.requests += 1;
        self.every
            .is_some_and(|every| self.requests.is_multiple_of(every))
    }

    /// Drains the manager's stats into the totals and prints the interval's line.
    fn write(&mut self, replayer: &mut Replayer, bar: &ProgressBar) -> Result<(), String> {
        let drained = replayer.drain_stats().to_step_payload();
        self.total.aggregate(&drained).map_err(|e| e.to_string())?;
        let mut interval = Payload::new();
        interval.aggregate(&drained).map_err(|e| e.to_string())?;
        if let Some(line) = crate::export::log_line(&interval) {
            bar.suspend(|| eprintln!("{line}"));
        }
        Ok(())
    }
}

impl ReplayArgs {
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
        cfg.policy = self.policy;
        cfg.store_threshold = self.store_threshold;
        cfg.max_tracker_size = self.max_tracker_size;
        cfg.max_requests = self.max_requests;
        cfg.memory_limit = self.memory_limit.or_else(crate::memory::available_bytes);
        let manager = OffloadManager::new(cfg).map_err(|e| self.config_message(e, capacity))?;
        Ok((manager, capacity))
    }

    /// A rejected manager configuration in the words of the options that set it.
    fn config_message(&self, e: ConfigError, capacity: u32) -> String {
        let max_requests = self.max_requests;
        match e {
            ConfigError::ZeroMaxRequests => "--max-requests must be at least 1".into(),
            ConfigError::ArcTooLarge { .. } => format!(
                "capacity {capacity} is too large for --policy arc: ARC's ghost lists need \
                 2 · capacity below 4294967295 (capacity at most 2147483647)"
            ),
            ConfigError::TooLarge { .. } => format!(
                "capacity {capacity} plus --max-requests {max_requests} must be below 4294967295"
            ),
            e => e.to_string(),
        }
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
         parse time            {parse:>12.3} s   (reading the trace or generating it)\n\
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
        replay = r.replay_s,
        other = r.other_s,
        wall = r.wall_s,
        replay_rate = r.replay_request_blocks_per_s / 1e6,
        rate = r.request_blocks_per_s / 1e6,
    )
}
