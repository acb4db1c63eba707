//! Serving `/metrics` while a replay runs (`kvtier serve`): [`start`] replays a kvtrace (or the
//! built-in workload) on its own thread and serves the stats it produces until stopped.
//!
//! The replay runs on its own thread and sends the manager's drained stats (plus the
//! `allocation_failure` increments, once the tier's `config_info`, and the replay's own stats:
//! modelled transfers, lookup-scan times, requests running, see [`crate::replay`]) to a
//! [`StatsCollector`], which feeds an [`OffloadExporter`] on a private registry; the
//! [`MetricsServer`] encodes that registry on every scrape. Every family of the offloading
//! connector and `vllm:num_requests_running` is served from the first scrape on.

mod simple;

pub use simple::SimpleSummary;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use prometheus::Registry;

use crate::engine::{Engine, EngineCounts};
use crate::replay::ReplayStats;
use crate::replay::SimpleRunError;
use crate::replay::{ReplayCounts, Replayer};
use crate::replay::{ReplayOptions, RunError, add_gpu_series, finish_engine};
use crate::sizing::{self, CapacityOptions, ReportError};
use crate::tier::EventStream;
use crate::tier::TierConnector;
use crate::tier::{Offloader, SimpleOptions};
use crate::trace::{Record, RecordSource};
use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
use kvtier::http::{MetricsServer, ServerConfig};
use kvtier::kv_events::Publisher;
use kvtier::shared::{CollectorConfig, PayloadSender, StatsCollector};
use kvtier::sync::Arc;

/// Requests between two stats drains of the replay.
const DRAIN_EVERY_REQUESTS: u64 = 256;
/// The longest time between two stats drains of the replay.
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// What to serve: the replay, the `model_name` label, where to listen and how fast to go.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The replay.
    pub replay: ReplayOptions,
    /// The `model_name` label of every series.
    pub model_name: String,
    /// Where `/metrics` listens.
    pub listen: String,
    /// Requests per second of the replay (`None`: as fast as it goes).
    pub rate: Option<f64>,
    /// Milliseconds between two exports of the collected stats.
    pub export_interval_ms: u64,
    /// The GPU the engine is said to have, sized as `kvtier capacity` sizes it (a model and a
    /// memory budget or a block count): `vllm:cache_config_info` then carries the GPU blocks,
    /// `kv_cache_size_tokens` and `kv_cache_max_concurrency` that `kvtier capacity` prints for
    /// the same options. `None`: no `vllm:cache_config_info`.
    pub gpu: Option<CapacityOptions>,
    /// The offloader the replay drives: the offloading connector's manager, or the simple CPU
    /// offloader (`--offloader simple`, behind [`ReplayOptions::gpu`]).
    pub offloader: Offloader,
    /// The simple offloader's options (used with [`Offloader::Simple`]).
    pub simple: SimpleOptions,
}

/// Why [`start`] or [`Serving::wait_replay`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// `--rate` is not a pace.
    Rate(f64),
    /// The replay was already waited for.
    AlreadyWaited,
    /// The replay thread panicked.
    Panicked,
    /// The replay failed.
    Run(RunError),
    /// The replay through the simple offloader failed.
    Simple(SimpleRunError),
    /// The service layer failed: the exporter, the collector, binding the endpoint or
    /// spawning a thread.
    Service(kvtier::Error),
    /// The GPU of [`ServeOptions::gpu`] could not be sized (the message names the option).
    Gpu(ReportError),
    /// [`ServeOptions::gpu`] gives no GPU figures: neither a memory budget nor a block count.
    NoGpuFigures,
}

impl From<RunError> for ServeError {
    fn from(e: RunError) -> Self {
        ServeError::Run(e)
    }
}

impl From<SimpleRunError> for ServeError {
    fn from(e: SimpleRunError) -> Self {
        ServeError::Simple(e)
    }
}

impl<E: Into<kvtier::Error>> From<E> for ServeError {
    fn from(e: E) -> Self {
        ServeError::Service(e.into())
    }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Rate(r) => {
                // Tiny and huge values in exponent form (1e-300, not 300 digits).
                let shown = if *r != 0.0 && !(1e-4..1e16).contains(&r.abs()) {
                    format!("{r:e}")
                } else {
                    format!("{r}")
                };
                write!(
                    f,
                    "--rate takes requests per second: a finite number from {MIN_RATE:e} up, \
                     not {shown}"
                )
            }
            ServeError::AlreadyWaited => f.write_str("the replay was already waited for"),
            ServeError::Panicked => f.write_str("the replay thread panicked"),
            ServeError::Run(e) => e.fmt(f),
            ServeError::Simple(e) => e.fmt(f),
            ServeError::Service(e) => e.fmt(f),
            ServeError::Gpu(e) => e.fmt(f),
            ServeError::NoGpuFigures => f.write_str(
                "--gpu-memory or --gpu-blocks: one is needed to size vllm:cache_config_info",
            ),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Rate(_)
            | ServeError::AlreadyWaited
            | ServeError::Panicked
            | ServeError::NoGpuFigures => None,
            ServeError::Run(e) => Some(e),
            ServeError::Simple(e) => Some(e),
            ServeError::Service(e) => Some(e),
            ServeError::Gpu(e) => Some(e),
        }
    }
}

/// What the replay of `kvtier serve` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeSummary {
    /// The replay's counts (all 0 through the simple offloader, which has no manager: see
    /// [`ServeSummary::simple`]).
    pub counts: ReplayCounts,
    /// The tier size in chunks (in CPU blocks through the simple offloader).
    pub capacity: u32,
    /// What the simple offloader did, when it ran.
    pub simple: Option<SimpleSummary>,
}

/// A running `kvtier serve`: the endpoint, the collector and the replay thread.
#[derive(Debug)]
pub struct Serving {
    server: MetricsServer,
    collector: StatsCollector,
    replay: Option<JoinHandle<Result<ServeSummary, ServeError>>>,
    stop: Arc<AtomicBool>,
    registry: Registry,
    kv_events: Option<std::sync::Arc<Publisher>>,
}

impl Serving {
    /// The address `/metrics` is served on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The KV-events publisher, when `--kv-events-endpoint` was given.
    #[must_use]
    pub fn kv_events(&self) -> Option<&Publisher> {
        self.kv_events.as_deref()
    }

    /// The registry the endpoint encodes.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Waits for the replay to end, then exports everything it reported.
    ///
    /// # Errors
    /// The replay's error, or a stopped collector.
    pub fn wait_replay(&mut self) -> Result<ServeSummary, ServeError> {
        let handle = self.replay.take().ok_or(ServeError::AlreadyWaited)?;
        let summary = handle.join().map_err(|_| ServeError::Panicked)??;
        self.collector.flush()?;
        Ok(summary)
    }

    /// Stops the replay (if still running), the collector and the endpoint.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.replay.take() {
            let _ = h.join();
        }
        let _ = self.collector.shutdown();
        self.server.stop();
    }
}

struct Drive<'a> {
    sender: &'a PayloadSender,
    replayer: Replayer,
    stats: ReplayStats,
    /// The GPU front (`--gpu-blocks`) and its counts at the last drain.
    engine: Option<(Engine, EngineCounts)>,
    keys: Vec<kvtier_core::BlockKey>,
    events: Option<EventStream>,
}

impl Drive<'_> {
    /// One step: the tier's events to the publisher, the stats to the collector.
    fn drain(&mut self) -> Result<(), RunError> {
        if let Some(e) = &mut self.events {
            e.step(self.replayer.manager_mut())?;
        }
        let mut payload = self.replayer.drain_stats().to_step_payload();
        payload.aggregate(&self.stats.drain(&self.replayer))?;
        if let Some((engine, last)) = &mut self.engine {
            add_gpu_series(&mut payload, engine, last)?;
            *last = engine.counts();
        }
        Ok(self.sender.send(0, payload)?)
    }

    fn apply(&mut self, rec: Record<'_>, n: u64) -> Result<(), RunError> {
        let Some((engine, _)) = &mut self.engine else {
            return self
                .stats
                .apply(&mut self.replayer, rec)
                .map_err(|error| RunError::Record {
                    line: None,
                    record: n,
                    error,
                });
        };
        let mut tier =
            TierConnector::new(Some(&mut self.stats), &mut self.replayer, &mut self.keys);
        engine
            .apply(rec, &mut tier)
            .map_err(|error| RunError::Engine {
                line: None,
                record: n,
                error,
            })
    }
}

fn drive<S: RecordSource>(
    args: &ReplayOptions,
    mut source: S,
    ctx: &ReplayContext<'_>,
) -> Result<ServeSummary, RunError>
where
    S::Error: Into<RunError>,
{
    let header = source.header().clone();
    let (manager, capacity) = args.manager(header.capacity)?;
    let block_tokens = args.block_tokens.unwrap_or(header.block_tokens);
    if block_tokens == 0 {
        return Err(RunError::ZeroBlockTokens);
    }
    let (rate, stop) = (ctx.rate, ctx.stop);
    let mut d = Drive {
        sender: ctx.sender,
        replayer: args.manager.replayer(manager, block_tokens),
        stats: ReplayStats::new(args.transfer.model(block_tokens)?),
        engine: match args.gpu {
            Some(g) => Some((g.offloading_engine(block_tokens)?, EngineCounts::default())),
            None => None,
        },
        keys: Vec::new(),
        events: ctx
            .kv_events
            .clone()
            .map(|p| EventStream::new(p, block_tokens, args.kv_events.hash_form())),
    };
    let start = Instant::now();
    let mut last_drain = Instant::now();
    let mut requests = 0u64;
    let mut n = 0u64;
    loop {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let rec = match source.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => return Err(e.into()),
        };
        let is_load = matches!(rec, Record::Load { .. });
        n += 1;
        d.apply(rec, n)?;
        if !is_load {
            continue;
        }
        requests += 1;
        pace(rate, requests, start, stop);
        if drain_due(requests, last_drain) {
            d.drain()?;
            last_drain = Instant::now();
        }
    }
    if let Some((engine, _)) = &mut d.engine {
        finish_engine(engine, &mut d.stats, &mut d.replayer, &mut d.keys, n)?;
    }
    d.drain()?;
    Ok(ServeSummary {
        counts: d.replayer.counts(),
        capacity,
        simple: None,
    })
}

/// Waits until the `requests`-th request is due at `rate` requests per second from `start`
/// (no wait without a rate), in slices, so that a stop is seen at any rate.
pub(crate) fn pace(rate: Option<f64>, requests: u64, start: Instant, stop: &AtomicBool) {
    let Some(r) = rate else { return };
    #[expect(clippy::cast_precision_loss, reason = "a pace, not a count")]
    let due = Duration::try_from_secs_f64(requests as f64 / r).unwrap_or(Duration::MAX);
    while let Some(wait) = due.checked_sub(start.elapsed()).filter(|w| !w.is_zero()) {
        if stop.load(Ordering::Acquire) {
            break;
        }
        thread::sleep(wait.min(DRAIN_EVERY));
    }
}

/// Whether the stats are due for a drain after `requests` requests, the last drain at
/// `last_drain`: every [`DRAIN_EVERY_REQUESTS`] requests, or [`DRAIN_EVERY`] after the last.
pub(crate) fn drain_due(requests: u64, last_drain: Instant) -> bool {
    requests.is_multiple_of(DRAIN_EVERY_REQUESTS) || last_drain.elapsed() >= DRAIN_EVERY
}

/// What the replay thread shares with the rest of `kvtier serve`.
pub(crate) struct ReplayContext<'a> {
    /// `--rate`, checked.
    pub(crate) rate: Option<f64>,
    /// Where the stats go.
    pub(crate) sender: &'a PayloadSender,
    /// Set when the replay must stop.
    pub(crate) stop: &'a AtomicBool,
    /// The KV-events publisher.
    pub(crate) kv_events: Option<std::sync::Arc<Publisher>>,
}

fn replay_thread(args: &ServeOptions, ctx: &ReplayContext<'_>) -> Result<ServeSummary, ServeError> {
    let replay = &args.replay;
    if args.offloader == Offloader::Simple {
        return Ok(simple::replay_thread(replay, args.simple, ctx)?);
    }
    Ok(match &replay.trace {
        Some(path) => {
            let reader = replay
                .input
                .open_path(
                    path,
                    replay.block_tokens,
                    replay.capacity.is_some(),
                    |file| file,
                )
                .map_err(RunError::from)?;
            drive(replay, reader, ctx).map_err(|e| e.in_trace(path.clone()))?
        }
        None => drive(replay, replay.generator().map_err(RunError::from)?, ctx)?,
    })
}

/// The slowest `--rate`: one request per 10^19 s, the longest pause a [`Duration`] holds
/// with room to spare.
pub const MIN_RATE: f64 = 1e-19;

/// `--rate` as given, if it is a pace: finite, at least [`MIN_RATE`], its pause between two
/// requests a [`Duration`].
fn checked_rate(r: f64) -> Result<f64, ServeError> {
    if r.is_finite() && r >= MIN_RATE && Duration::try_from_secs_f64(1.0 / r).is_ok() {
        Ok(r)
    } else {
        Err(ServeError::Rate(r))
    }
}

/// Starts serving as `args` say: binds `/metrics`, starts the collector and the replay.
///
/// # Errors
/// [`ServeError`] for a bad `--rate`, an address that cannot be bound, or a thread that
/// cannot be spawned.
pub fn start(args: &ServeOptions) -> Result<Serving, ServeError> {
    let rate = args.rate.map(checked_rate).transpose()?;
    let registry = Registry::new();
    let mut config = ExporterConfig::new(&args.model_name, 1);
    // vLLM's SimpleCPUOffloadConnector registers none of the offloading connector's families.
    config.offloading_connector_series = args.offloader == Offloader::Offloading;
    let exporter = OffloadExporter::register(&registry, config)?;
    if let Some(gpu) = &args.gpu {
        let report = sizing::report(gpu).map_err(ServeError::Gpu)?;
        let info = report
            .cache_config_info(gpu.block_size)
            .ok_or(ServeError::NoGpuFigures)?;
        exporter.set_cache_config(0, &info)?;
    }
    let collector = StatsCollector::spawn::<kvtier_core::BlockKey>(
        exporter,
        Vec::new(),
        CollectorConfig::new(Duration::from_millis(args.export_interval_ms)),
    )?;
    // The collector's own health (queue levels, rejected payloads) on the same endpoint.
    collector.register_metrics(&registry)?;
    let scrape = registry.clone();
    let server = MetricsServer::bind(args.listen.as_str(), ServerConfig::default(), move || {
        encode_text(&scrape)
    })?;
    let kv_events = args.replay.kv_events.publisher()?.map(std::sync::Arc::new);
    if let Some(p) = &kv_events {
        p.register_metrics(&registry)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sender = collector.sender();
    let thread_events = kv_events.clone();
    let replay_args = args.clone();
    let stop_flag = Arc::clone(&stop);
    let replay = thread::Builder::new()
        .name("kvtier-replay".into())
        .spawn(move || {
            let ctx = ReplayContext {
                rate,
                sender: &sender,
                stop: &stop_flag,
                kv_events: thread_events,
            };
            replay_thread(&replay_args, &ctx)
        })?;
    Ok(Serving {
        server,
        collector,
        replay: Some(replay),
        stop,
        registry,
        kv_events,
    })
}
