//! A whole replay run: a kvtrace or Mooncake file ([`crate::input`]), or the built-in workload,
//! replayed through a manager built from [`ReplayOptions`] into a [`ReplayReport`] (hit rates,
//! evictions, skipped stores, the hit digest, the time split and the manager's stats), with an
//! optional progress bar and vLLM's `KV Transfer metrics` line every N requests.
//!
//! [`replay`] reads the source a chunk at a time ([`crate::trace::CompactTrace`]),
//! applies every record through [`ReplayStats`] to a [`Replayer`] and times parsing and the
//! replay loop apart. [`ManagerArgs`] are the manager options every replaying command shares.

mod error;

pub use error::RunError;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvtier_core::manager::{OffloadManager, PolicyKind};
use kvtier_core::stats::{Payload, catalogue};

use kvtier::kv_events::PublisherStats;

use crate::engine::EngineCounts;
use crate::input::FormatArgs;
use crate::replay::{
    GpuFront, GpuReport, ManagerArgs, ManagerError, ReplayCounts, Replayer, add_gpu_series,
    finish_engine, parse_policy,
};
use crate::replay::{ReplayStats, TransferArgs};
use crate::tier::TierConnector;
use crate::tier::{EventStream, KvEventsArgs, STEP_REQUESTS};
use crate::trace::{CompactError, CompactLimits, CompactTrace, RecordKind, RecordSource};
use crate::workload::{Generator, GeneratorConfig, GeneratorError};

/// What to replay and how (the options of `kvtier replay` but its output format).
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayOptions {
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
    /// The manager's limits.
    #[command(flatten)]
    pub manager: ManagerArgs,
    /// Tokens per block, at least 1 (default: the trace header's `block_tokens`; 512 for
    /// Mooncake).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub block_tokens: Option<u32>,
    /// Every N requests, print vLLM's `KV Transfer metrics: k=v, …` line (from the stats
    /// drained since the previous line) on stderr.
    #[arg(long, value_name = "N")]
    pub log_interval: Option<u64>,
    /// The transfer model of the `vllm:kv_offload_load_*` / `_store_*` families.
    #[command(flatten)]
    pub transfer: TransferArgs,
    /// A GPU prefix cache in front of the tier (`kvtier replay --gpu-blocks`); set by the
    /// command, not parsed here.
    #[arg(skip)]
    pub gpu: Option<GpuFront>,
    /// Publishing the tier's events as vLLM's KV-events stream.
    #[command(flatten)]
    pub kv_events: KvEventsArgs,
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
    /// Seconds the replay waited for records: opening the source, then whatever reading and
    /// parsing the trace (or generating the workload) did not hide. They run on a second
    /// thread, one chunk ahead of the replay loop.
    pub parse_s: f64,
    /// Seconds of reading and parsing (or generating) in all, on the reader thread and
    /// overlapping the replay.
    pub read_s: f64,
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
    /// The GPU front's figures, with `--gpu-blocks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuReport>,
    /// What the KV-events publisher sent, when `--kv-events-endpoint` was given.
    #[serde(skip)]
    pub kv_events: Option<PublisherStats>,
}

impl ReplayOptions {
    /// The manager these options describe, and its capacity: `--capacity`, else the trace
    /// header's `capacity`, else 1024 chunks (see [`ManagerArgs::manager`]).
    ///
    /// # Errors
    /// [`ManagerError`]: a header capacity that does not fit in `u32`, or a rejected manager
    /// configuration.
    pub fn manager(
        &self,
        header_capacity: Option<u64>,
    ) -> Result<(OffloadManager, u32), ManagerError> {
        let capacity = match self.capacity {
            Some(c) => c,
            None => match header_capacity {
                Some(c) => u32::try_from(c).map_err(|_| ManagerError::HeaderCapacity(c))?,
                None => 1024,
            },
        };
        let mut manager_args = self.manager.clone();
        manager_args.events |= self.kv_events.enabled();
        let manager = manager_args.manager(self.policy, capacity, self.store_threshold)?;
        Ok((manager, capacity))
    }

    /// The name of the workload of these options: `builtin(seed=…, requests=…)`.
    fn builtin_name(&self) -> String {
        format!("builtin(seed={}, requests={})", self.seed, self.requests)
    }

    /// The built-in workload of these options.
    ///
    /// # Errors
    /// The generator's [`GeneratorError`].
    pub fn generator(&self) -> Result<Generator, GeneratorError> {
        Generator::new(GeneratorConfig::new(self.seed, self.requests))
    }
}

/// Replays as `args` say; `progress` shows a bar on stderr.
///
/// # Errors
/// [`RunError`]: any error of reading or replaying the trace (naming the file and line).
pub fn replay(args: &ReplayOptions, progress: bool) -> Result<ReplayReport, RunError> {
    let started = Instant::now();
    match &args.trace {
        Some(path) => {
            let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let bar = progress_bar(progress, "replay", len, "bytes");
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
            let r = run.replay(reader).map_err(|e| e.in_trace(path.clone()));
            bar.finish_and_clear();
            r
        }
        None => {
            let generator = args.generator()?;
            let parse_s = started.elapsed();
            let bar = progress_bar(progress, "replay", args.requests, "requests");
            let run = Run {
                args,
                name: args.builtin_name(),
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

/// A progress bar on stderr of `len` `unit`s for the run called `what` (`replay`, `sweep`),
/// hidden unless `show`.
pub(crate) fn progress_bar(show: bool, what: &str, len: u64, unit: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    let template = format!("{{spinner}} {what} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        b.set_style(style);
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// One replay run: where its records come from and the clock started before the source was
/// opened.
struct Run<'a> {
    args: &'a ReplayOptions,
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
    fn replay<S: RecordSource + Send>(self, mut source: S) -> Result<ReplayReport, RunError>
    where
        CompactError<S::Error>: Into<RunError>,
    {
        let args = self.args;
        let (manager, capacity) = args.manager(source.header().capacity)?;
        let block_tokens = args.block_tokens.unwrap_or(source.header().block_tokens);
        if block_tokens == 0 {
            return Err(RunError::ZeroBlockTokens);
        }
        let mut replayer = args.manager.replayer(manager, block_tokens);
        let mut stats = ReplayStats::new(args.transfer.model(block_tokens)?);
        let mut engine = args
            .gpu
            .map(|g| g.offloading_engine(block_tokens))
            .transpose()?;
        let mut keys = Vec::new();
        let mut stream = match args.kv_events.publisher()? {
            Some(p) => {
                let replay = p.replay_endpoint().unwrap_or("none");
                let line = format!(
                    "kvtier replay: kv events on {} (replay {replay})",
                    p.endpoint()
                );
                self.bar.suspend(|| eprintln!("{line}"));
                let form = args.kv_events.hash_form();
                Some(EventStream::new(std::sync::Arc::new(p), block_tokens, form))
            }
            None => None,
        };
        let header = source.header().clone();
        let mut log = IntervalLog::new(args.log_interval);
        let mut waited = self.parse_s;
        let mut replay = Duration::ZERO;
        let mut records: u64 = 0;
        // Two chunks circulate: the reader thread fills one while this thread replays the
        // other, so reading and parsing overlap the replay and memory stays at two chunks.
        let (empty_tx, empty_rx) = mpsc::sync_channel::<CompactTrace>(2);
        let (full_tx, full_rx) = mpsc::sync_channel::<Result<CompactTrace, RunError>>(1);
        for _ in 0..2 {
            let chunk = CompactTrace::new(header.clone(), CompactLimits::REPLAY_CHUNK);
            // The channel holds two: these sends cannot block or fail.
            let _ = empty_tx.send(chunk);
        }
        let read = std::thread::scope(|scope| -> Result<Duration, RunError> {
            let reader = scope.spawn(move || {
                let mut read = Duration::ZERO;
                // Ends when the replay stops handing chunks back (done or failed).
                while let Ok(mut chunk) = empty_rx.recv() {
                    let t = Instant::now();
                    let filled = chunk.refill_from(&mut source).map_err(Into::into);
                    read += t.elapsed();
                    let end = !matches!(filled, Ok(n) if n > 0);
                    if full_tx.send(filled.map(|_| chunk)).is_err() || end {
                        break;
                    }
                }
                read
            });
            let outcome = (|| -> Result<(), RunError> {
                loop {
                    let t = Instant::now();
                    let Ok(filled) = full_rx.recv() else {
                        return Ok(());
                    };
                    waited += t.elapsed();
                    let chunk = filled?;
                    if chunk.records() == 0 {
                        return Ok(());
                    }
                    let t = Instant::now();
                    let mut logging = Duration::ZERO;
                    let mut cursor = chunk.cursor();
                    while let Some((rec, line)) = cursor.next_with_line() {
                        records += 1;
                        let is_load = rec.kind() == RecordKind::Load;
                        if let Some(engine) = engine.as_mut() {
                            let mut tier =
                                TierConnector::new(Some(&mut stats), &mut replayer, &mut keys);
                            engine
                                .apply(rec, &mut tier)
                                .map_err(|error| RunError::Engine {
                                    line,
                                    record: records,
                                    error,
                                })?;
                        } else {
                            stats
                                .apply(&mut replayer, rec)
                                .map_err(|error| RunError::Record {
                                    line,
                                    record: records,
                                    error,
                                })?;
                        }
                        let step =
                            is_load && replayer.counts().requests.is_multiple_of(STEP_REQUESTS);
                        if let Some(s) = stream.as_mut().filter(|_| step) {
                            s.step(replayer.manager_mut())?;
                        }
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
                    // The reader may already have ended; the chunk is then simply dropped.
                    let _ = empty_tx.send(chunk);
                }
            })();
            // Stop the reader (it waits for a chunk or for room to hand one over).
            drop(empty_tx);
            drop(full_rx);
            let read = reader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            outcome.map(|()| read)
        })?;
        let finish = Instant::now();
        if let Some(engine) = engine.as_mut() {
            finish_engine(engine, &mut stats, &mut replayer, &mut keys, records)?;
        }
        replay += finish.elapsed();
        let kv_events = match stream {
            Some(mut s) => {
                s.step(replayer.manager_mut())?;
                Some(s.finish())
            }
            None => None,
        };
        let counts = replayer.counts();
        let mut payload = log.total;
        if let Some(engine) = &engine {
            add_gpu_series(&mut payload, engine, &EngineCounts::default())?;
        }
        payload.aggregate(&replayer.drain_stats().to_step_payload())?;
        payload.aggregate(&stats.drain(&replayer))?;
        // The report lists allocation_failure even when there was none (a catalogue counter
        // fits any payload).
        let _ = payload.increase_counter(catalogue::ALLOCATION_FAILURE, &[], 0);
        let wall_s = self.started.elapsed().as_secs_f64();
        let parse_s = waited.as_secs_f64();
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
            read_s: self.parse_s.saturating_add(read).as_secs_f64(),
            replay_s,
            other_s: (wall_s - parse_s - replay_s).max(0.0),
            wall_s,
            replay_request_blocks_per_s: per_second(counts.request_blocks, replay_s),
            request_blocks_per_s: per_second(counts.request_blocks, wall_s),
            payload,
            gpu: engine.as_ref().map(GpuReport::new),
            kv_events,
        })
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
    fn write(&mut self, replayer: &mut Replayer, bar: &ProgressBar) -> Result<(), RunError> {
        let drained = replayer.drain_stats().to_step_payload();
        self.total.aggregate(&drained)?;
        let mut interval = Payload::new();
        interval.aggregate(&drained)?;
        if let Some(line) = kvtier::export::log_line(&interval) {
            bar.suspend(|| eprintln!("{line}"));
        }
        Ok(())
    }
}
