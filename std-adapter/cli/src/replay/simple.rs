//! `kvtier replay --offloader simple`: the core's simple CPU offloader
//! ([`kvtier_core::simple::SimpleScheduler`], vLLM's `SimpleCPUOffloadScheduler`) behind the
//! engine model's GPU front ([`crate::engine`], `docs/engine-model.md`), one step at a time.
//!
//! [`SimpleRun`] is one such run, record by record (`kvtier serve --offloader simple` drains
//! its stats as it goes); [`replay_simple`] runs a whole trace into a [`SimpleReport`].
//!
//! The CPU pool is `--capacity` blocks, or sized from `--cpu-bytes` as vLLM's
//! `_derive_cpu_config` sizes it: the budget split over `world_size` ranks
//! (`cpu_bytes_to_use // world_size`), then `num_gpu_blocks · per_rank_bytes //
//! gpu_total_bytes` blocks (at least 1), `gpu_total_bytes` being one rank's GPU KV cache:
//! `num_gpu_blocks` blocks of the model's bytes per block split over the ranks (tensor
//! parallel: each rank holds `1/world_size` of every block). With both, `--capacity` is vLLM's
//! explicit `num_cpu_blocks`, which must lie within what the budget holds.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use kvtier_core::simple::{
    NewError, PoolSize, PoolSizing, SimpleConfig, SimpleScheduler, per_rank_bytes,
};
use kvtier_core::stats::catalogue::{NUM_REQUESTS_RUNNING, SIMPLE_LOAD_BLOCKS};
use kvtier_core::stats::simple_offload::SaveOutcome;
use kvtier_core::stats::{Gauge, Payload, UpdateError};

use kvtier::kv_events::{PublishError, Publisher, PublisherStats};

use crate::engine::{self, Engine, EngineCounts, EngineError};
use crate::replay::{GpuFront, GpuReport, ReplayOptions, RunError, add_gpu_series};
use crate::sizing::ReportError;
use crate::tier::{EventStream, SimpleOptions, SimpleTier, SimpleTierError};
use crate::trace::{Header, Record, RecordSource};
use kvtier_core::capacity::PoolLayout;

/// Why `replay --offloader simple` failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimpleRunError {
    /// Opening or reading the trace, or building the GPU front.
    Run(RunError),
    /// `--offloader simple` without a GPU (`--gpu-blocks`, or `--gpu-memory` with a model).
    NeedsGpu,
    /// `--cpu-bytes` without a model to give the bytes of a block.
    NeedsModel,
    /// The model's bytes per block could not be computed (the message names the option).
    Sizing(ReportError),
    /// The model's bytes per block do not split evenly over `world_size` ranks.
    UnevenSplit {
        /// The model's bytes per block.
        bytes_per_block: u64,
        /// `--world-size`.
        world_size: u32,
    },
    /// The KV-events publisher (`--kv-events-endpoint`) could not start.
    Publish(PublishError),
    /// The offloader's configuration.
    Config(NewError),
    /// The engine or the offloader stopped at a record (`None` after the trace's end).
    Engine {
        /// The record's line, when the source has lines.
        line: Option<u64>,
        /// Why.
        error: EngineError<SimpleTierError>,
    },
}

impl fmt::Display for SimpleRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimpleRunError::Run(e) => e.fmt(f),
            SimpleRunError::NeedsGpu => f.write_str(
                "--offloader simple needs a GPU in front: give --gpu-blocks (or, in kvtier \
                 serve, --gpu-memory with a model)",
            ),
            SimpleRunError::NeedsModel => f.write_str(
                "--cpu-bytes needs the model's bytes per block: give --model, --layout or \
                 --hf-config",
            ),
            SimpleRunError::Sizing(e) => e.fmt(f),
            SimpleRunError::UnevenSplit {
                bytes_per_block,
                world_size,
            } => write!(
                f,
                "--world-size {world_size}: the model's {bytes_per_block} bytes per block do \
                 not split evenly over the ranks"
            ),
            SimpleRunError::Publish(e) => e.fmt(f),
            SimpleRunError::Config(e) => e.fmt(f),
            SimpleRunError::Engine {
                line: Some(l),
                error,
            } => write!(f, "line {l}: {error}"),
            SimpleRunError::Engine { error, .. } => error.fmt(f),
        }
    }
}

impl std::error::Error for SimpleRunError {}

impl From<RunError> for SimpleRunError {
    fn from(e: RunError) -> Self {
        SimpleRunError::Run(e)
    }
}

impl From<UpdateError> for SimpleRunError {
    fn from(e: UpdateError) -> Self {
        SimpleRunError::Run(e.into())
    }
}

/// What `replay --offloader simple` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimpleReport {
    /// Where the records came from.
    pub source: String,
    /// CPU blocks, the null block included.
    pub cpu_blocks: u32,
    /// Lazy mode.
    pub lazy: bool,
    /// `world_size`.
    pub world_size: u32,
    /// The seven save outcomes of the boundary hand-offs, by vLLM's label.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Blocks of completed loads (`vllm:simple_kv_offload_load_blocks_total`).
    pub load_blocks: u64,
    /// `vllm:simple_kv_offload_used_blocks` at the end.
    pub used_blocks: i64,
    /// `vllm:simple_kv_offload_pending_store_blocks` at the end.
    pub pending_store_blocks: u64,
    /// Blocks in the CPU prefix cache at the end.
    pub cached_blocks: usize,
    /// The GPU front.
    pub gpu: GpuReport,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// The offloader's stats and the GPU series, as vLLM's payload.
    #[serde(skip)]
    pub payload: Payload,
    /// What the KV-events publisher sent (with `--kv-events-endpoint`).
    #[serde(skip)]
    pub kv_events: Option<PublisherStats>,
}

/// The CPU pool's size for `opts` and `simple`: `--capacity` blocks (default: the trace
/// header's, else 1024), or sized from `--cpu-bytes` as vLLM's `_derive_cpu_config` sizes it.
///
/// # Errors
/// [`SimpleRunError`] for `--cpu-bytes` without a model, or a model whose bytes per block
/// cannot be computed or split over the ranks.
pub fn pool_sizing(
    opts: &ReplayOptions,
    simple: SimpleOptions,
    header: &Header,
    block_tokens: u32,
    num_gpu_blocks: u32,
) -> Result<PoolSizing, SimpleRunError> {
    let Some(cpu_bytes) = simple.cpu_bytes else {
        let blocks = match (opts.capacity, header.capacity) {
            (Some(c), _) => c,
            (None, Some(c)) => u32::try_from(c).unwrap_or(u32::MAX),
            (None, None) => 1024,
        };
        return Ok(SimpleConfig::with_cpu_blocks(block_tokens, num_gpu_blocks, blocks).sizing);
    };
    let source = &opts.transfer.source;
    if !source.is_given() {
        return Err(SimpleRunError::NeedsModel);
    }
    let bytes = source
        .bytes_per_block(block_tokens, PoolLayout::LayerOutermost)
        .map_err(SimpleRunError::Sizing)?;
    let ws = simple.world_size.max(1);
    if bytes % u64::from(ws) != 0 {
        return Err(SimpleRunError::UnevenSplit {
            bytes_per_block: bytes,
            world_size: simple.world_size,
        });
    }
    let rank_block = bytes / u64::from(ws);
    Ok(PoolSizing {
        capacity_bytes: per_rank_bytes(cpu_bytes, ws, None).unwrap_or(0),
        gpu_total_bytes: rank_block.saturating_mul(u64::from(num_gpu_blocks)),
        size: opts
            .capacity
            .map_or(PoolSize::FromBytes, PoolSize::Explicit),
    })
}

/// One run of the simple offloader behind the engine model, record by record.
#[derive(Debug)]
pub struct SimpleRun {
    engine: Engine,
    tier: SimpleTier,
    simple: SimpleOptions,
    /// The engine's counts at the last drain.
    last: EngineCounts,
    /// Blocks loaded over all drains.
    load_blocks: u64,
}

impl SimpleRun {
    /// The run of `opts` (its `gpu` front is required) and `simple` over a trace with `header`.
    ///
    /// # Errors
    /// [`SimpleRunError`]: no GPU, a zero block size, a pool that cannot be sized, or a
    /// configuration the engine or the offloader refuses.
    pub fn new(
        opts: &ReplayOptions,
        simple: SimpleOptions,
        header: &Header,
        events: Option<Arc<Publisher>>,
    ) -> Result<Self, SimpleRunError> {
        let front = opts.gpu.ok_or(SimpleRunError::NeedsGpu)?;
        let bt = opts.block_tokens.unwrap_or(header.block_tokens);
        if bt == 0 {
            return Err(RunError::ZeroBlockTokens.into());
        }
        let sizing = pool_sizing(opts, simple, header, bt, front.num_gpu_blocks)?;
        let stream = events.map(|p| EventStream::new(p, bt, opts.kv_events.hash_form()));
        Self::with_events(front, bt, sizing, simple, stream)
    }

    /// The run behind the GPU `front` with `block_tokens`-token blocks and a CPU pool sized
    /// by `sizing`.
    ///
    /// # Errors
    /// [`SimpleRunError`]: a configuration the engine or the offloader refuses.
    pub fn from_parts(
        front: GpuFront,
        bt: u32,
        sizing: PoolSizing,
        simple: SimpleOptions,
    ) -> Result<Self, SimpleRunError> {
        Self::with_events(front, bt, sizing, simple, None)
    }

    /// [`from_parts`](Self::from_parts), the offloader's events (when `stream` is given)
    /// recorded and published at the end of every engine step.
    ///
    /// # Errors
    /// As [`from_parts`](Self::from_parts).
    pub fn with_events(
        front: GpuFront,
        bt: u32,
        sizing: PoolSizing,
        simple: SimpleOptions,
        stream: Option<EventStream>,
    ) -> Result<Self, SimpleRunError> {
        if bt == 0 {
            return Err(RunError::ZeroBlockTokens.into());
        }
        let engine = front.engine(bt)?;
        let mut cfg = SimpleConfig::new(bt, front.num_gpu_blocks, sizing);
        cfg.lazy_offload = simple.lazy;
        cfg.world_size = simple.world_size;
        cfg.max_num_batched_tokens =
            u32::try_from(front.engine.max_num_batched_tokens).unwrap_or(u32::MAX);
        // Pending hits, loads and store states: at most the engine's requests in flight.
        let seqs = u32::try_from(front.engine.max_num_seqs).unwrap_or(u32::MAX);
        cfg.max_requests = seqs.saturating_mul(4).saturating_add(64);
        cfg.enable_events = stream.is_some();
        cfg.layout = engine::layout(front.engine.hybrid);
        let s = SimpleScheduler::new(cfg).map_err(SimpleRunError::Config)?;
        let mut tier = SimpleTier::new(s, bt, front.engine.transfer_steps);
        if let Some(stream) = stream {
            tier = tier.with_events(stream);
        }
        Ok(SimpleRun {
            tier,
            engine,
            simple,
            last: EngineCounts::default(),
            load_blocks: 0,
        })
    }

    /// Feeds one record to the engine (which runs the steps it makes due).
    ///
    /// # Errors
    /// The engine's or the offloader's error.
    pub fn apply(&mut self, rec: Record<'_>) -> Result<(), EngineError<SimpleTierError>> {
        self.engine.apply(rec, &mut self.tier)
    }

    /// After the trace's last record: runs the engine to its end, then hands the offloader's
    /// finished requests over and completes its transfers ([`SimpleTier::drain`]).
    ///
    /// # Errors
    /// The engine's or the offloader's error.
    pub fn finish(&mut self) -> Result<(), EngineError<SimpleTierError>> {
        self.engine.finish(&mut self.tier)?;
        let t = self.engine.counts().steps;
        let gpu = self.engine.gpu_mut().pool_mut();
        self.tier.drain(gpu, t).map_err(EngineError::Connector)?;
        Ok(())
    }

    /// The stats since the previous drain, as one payload: the offloader's five series
    /// (`get_stats`), the GPU's series and `vllm:num_requests_running` (the engine's running
    /// requests now).
    ///
    /// # Errors
    /// [`UpdateError`] when the payload refuses a series.
    pub fn drain(&mut self) -> Result<Payload, UpdateError> {
        let mut payload = self.tier.scheduler().get_stats();
        self.load_blocks += payload.counter(SIMPLE_LOAD_BLOCKS, &[]).unwrap_or(0);
        add_gpu_series(&mut payload, &self.engine, &self.last)?;
        self.last = self.engine.counts();
        let running = i64::try_from(self.engine.running()).unwrap_or(i64::MAX);
        payload.set_gauge(NUM_REQUESTS_RUNNING, &[], Gauge::int(running))?;
        Ok(payload)
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The offloader.
    #[must_use]
    pub fn offloader(&self) -> &SimpleScheduler {
        self.tier.offloader()
    }

    /// Blocks of the loads completed up to the last [`SimpleRun::drain`].
    #[must_use]
    pub fn load_blocks(&self) -> u64 {
        self.load_blocks
    }

    /// The cumulative count of each save outcome, by vLLM's label.
    #[must_use]
    pub fn outcomes(&self) -> BTreeMap<&'static str, u64> {
        let s = self.tier.offloader();
        SaveOutcome::ALL
            .iter()
            .map(|&o| (o.label(), s.boundary_total(o)))
            .collect()
    }

    /// The report of the run after its last drain, whose payload is `payload`.
    #[must_use]
    pub fn report(&self, source: String, payload: Payload, wall_s: f64) -> SimpleReport {
        let s = self.tier.offloader();
        let free = s.cpu_pool().free_count();
        SimpleReport {
            source,
            cpu_blocks: s.num_cpu_blocks(),
            lazy: self.simple.lazy,
            world_size: self.simple.world_size,
            outcomes: self.outcomes(),
            load_blocks: self.load_blocks,
            used_blocks: i64::from(s.num_cpu_blocks()) - i64::from(free),
            pending_store_blocks: s.pending_store_blocks(),
            cached_blocks: s.cpu_pool().cached_key_count(),
            gpu: GpuReport::new(&self.engine),
            wall_s,
            payload,
            kv_events: None,
        }
    }

    /// Stops publishing (the publisher sends what is queued and stops, unless another owner
    /// holds it) and answers what it sent; `None` without events.
    pub fn finish_events(&mut self) -> Option<PublisherStats> {
        self.tier.take_events().map(EventStream::finish)
    }
}

/// Replays `opts` through the simple offloader behind `opts.gpu`.
///
/// # Errors
/// [`SimpleRunError`]: no GPU, a trace that cannot be read, a configuration the offloader
/// refuses, or a step that failed.
pub fn replay_simple(
    opts: &ReplayOptions,
    simple: SimpleOptions,
) -> Result<SimpleReport, SimpleRunError> {
    let started = Instant::now();
    match &opts.trace {
        Some(path) => {
            let reader = opts
                .input
                .open_path(path, opts.block_tokens, opts.capacity.is_some(), |f| f)
                .map_err(RunError::from)?;
            drive(opts, simple, reader, path.display().to_string(), started)
        }
        None => {
            let name = format!("builtin(seed={}, requests={})", opts.seed, opts.requests);
            let generator = opts.generator().map_err(RunError::from)?;
            drive(opts, simple, generator, name, started)
        }
    }
}

fn drive<S: RecordSource>(
    opts: &ReplayOptions,
    simple: SimpleOptions,
    mut source: S,
    name: String,
    started: Instant,
) -> Result<SimpleReport, SimpleRunError>
where
    S::Error: Into<RunError>,
{
    let header = source.header().clone();
    let publisher = opts
        .kv_events
        .publisher()
        .map_err(SimpleRunError::Publish)?;
    if let Some(p) = &publisher {
        let replay = p.replay_endpoint().unwrap_or("none");
        eprintln!(
            "kvtier replay: kv events on {} (replay {replay})",
            p.endpoint()
        );
    }
    let mut run = SimpleRun::new(opts, simple, &header, publisher.map(Arc::new))?;
    let fail = |line, error| SimpleRunError::Engine { line, error };
    while let Some(rec) = source.next_record().map_err(Into::into)? {
        if let Err(e) = run.apply(rec) {
            return Err(fail(source.line(), e));
        }
    }
    run.finish().map_err(|e| fail(None, e))?;
    let payload = run.drain()?;
    let kv_events = run.finish_events();
    let mut report = run.report(name, payload, started.elapsed().as_secs_f64());
    report.kv_events = kv_events;
    Ok(report)
}
