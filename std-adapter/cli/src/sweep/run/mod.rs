//! A whole sweep run (`kvtier sweep`): one trace (kvtrace or Mooncake JSONL) replayed under
//! many capacities, policies and store thresholds, in parallel, into a [`SweepReport`] (the
//! hit-rate rows, the infinite-cache bound, the knee) and the curve's plot: "how many GiB of
//! CPU tier, with which policy?".
//!
//! The trace is parsed once into a [`CompactTrace`]; every configuration replays its own
//! cursor over it ([`run`](fn@crate::sweep::run)), with the manager [`ManagerArgs::manager`] builds (as
//! `kvtier replay` does for the same options), so each row equals that single replay.

mod error;

pub use error::{ChunkBytesError, GridError, SweepRunError};

use std::path::PathBuf;
use std::time::Instant;

use kvtier_core::curve::DEFAULT_SEED;
use kvtier_core::manager::PolicyKind;
use serde::Serialize;

use crate::engine::{Engine, EngineArgs};
use crate::input::FormatArgs;
use crate::replay::{ManagerArgs, parse_policy};
use crate::sizing::{CapacityOptions, ModelArgs, report};
use crate::sweep::plot::{KNEE_MARGIN, PlotSpec, draw, parse_size};
use crate::sweep::{
    CaseError, CaseReplay, Sweep, SweepCase, SweepGrid, SweepPoint, geometric_capacities,
    repeat_bound,
};
use crate::sweep::{Checkpoint, Method, MethodError, MethodSpec, Source, points};
use crate::tier::OffloaderArgs;
use crate::trace::{CompactLimits, CompactTrace};

/// The most requests in flight the curve passes and miniature managers hold (each miniature
/// manager sizes its request pool by it).
const MINI_MAX_REQUESTS: u32 = 8192;

/// What to sweep (the options of `kvtier sweep` but its output format).
#[derive(Debug, Clone, clap::Args)]
pub struct SweepOptions {
    /// The trace, kvtrace or Mooncake JSONL (see --format).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The trace's format and the Mooncake timing model.
    #[command(flatten)]
    pub input: FormatArgs,
    /// Tokens per block (default: the trace header's `block_tokens`; 512 for Mooncake).
    #[arg(long, value_name = "N")]
    pub block_tokens: Option<u32>,
    /// Capacities in chunks, comma-separated (or --from/--to/--steps).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", conflicts_with_all = ["from", "to", "steps"])]
    pub capacities: Vec<u32>,
    /// Smallest capacity of a geometric range, in chunks.
    #[arg(long, value_name = "N", requires_all = ["to", "steps"])]
    pub from: Option<u32>,
    /// Largest capacity of a geometric range, in chunks.
    #[arg(long, value_name = "N", requires_all = ["from", "steps"])]
    pub to: Option<u32>,
    /// Capacities in the geometric range (evenly spaced on a log scale).
    #[arg(long, value_name = "N", requires_all = ["from", "to"])]
    pub steps: Option<u32>,
    /// Eviction policies, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "lru,arc", value_parser = parse_policy)]
    pub policies: Vec<PolicyKind>,
    /// Store thresholds, comma-separated (0 or 1: no filter).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1",
        value_name = "T,T,..."
    )]
    pub thresholds: Vec<u32>,
    /// Each case's manager limits (as `kvtier replay` takes them).
    #[command(flatten)]
    pub manager: ManagerArgs,
    /// The most records of the trace held in memory (24 bytes each).
    #[arg(long, default_value_t = 100_000_000, value_name = "N")]
    pub max_records: u64,
    /// The most block hashes of the trace held in memory (8 bytes each).
    #[arg(long, default_value_t = 400_000_000, value_name = "N")]
    pub max_hashes: u64,
    /// Threads (default: every core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// The model, to show each capacity as CPU memory (as `kvtier capacity` takes it).
    #[command(flatten)]
    pub source: ModelArgs,
    /// The model's GPU block size in tokens (a chunk of the trace is `block_tokens /
    /// block_size` GPU blocks).
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Draw the hit-rate curve to this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The plot's size in pixels.
    #[arg(long, default_value = "1200x750", value_parser = parse_size, value_name = "WxH")]
    pub plot_size: (u32, u32),
    /// Put a GPU prefix cache of N blocks in front of every case's tier (as `kvtier replay
    /// --gpu-blocks`): the curve is then the tier's behind the GPU.
    #[arg(long, value_name = "N")]
    pub gpu_blocks: Option<u32>,
    /// The engine model's options (used with --gpu-blocks).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// How the rows are computed: `exact` replays every configuration (every column exact);
    /// `stack` takes LRU rows (threshold 0 or 1) from one pass at the capacities it certifies
    /// (hit blocks, hit requests and digest equal to the replay's) and replays the rest;
    /// `sample` estimates every row from miniature replays of sampled keys and replays
    /// `--verify` checkpoints beside them.
    #[arg(long, value_enum, default_value_t = Method::Exact)]
    pub method: Method,
    /// The sampling rate of `--method sample` (fraction of keys kept).
    #[arg(long, default_value_t = 0.01, value_name = "R")]
    pub sample: f64,
    /// Exact replays beside a sampled curve: capacities spread over the list.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub verify: usize,
    /// The offloader and the simple offloader's mode.
    #[command(flatten)]
    pub tier: OffloaderArgs,
    /// `--method sample`: counters of the first pass that finds the hottest keys (16 bytes
    /// each); at each capacity the keys re-referenced on average within that many references
    /// are counted exactly rather than sampled (0: sample every key alike).
    #[arg(long, default_value_t = 4096, value_name = "K")]
    pub hot_keys: u32,
    /// `--method sample`: seeds the sampling hash, so another seed keeps other keys (the
    /// spread of the estimates over a few seeds is the sampling error on the trace at
    /// hand); without it, the library's fixed default.
    #[arg(long, value_name = "S")]
    pub sample_seed: Option<u64>,
}

/// One row of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepRow {
    /// Capacity in chunks.
    pub capacity: u32,
    /// The capacity as CPU memory in GiB (with a model).
    pub gib: Option<f64>,
    /// The policy.
    pub policy: &'static str,
    /// The store threshold.
    pub store_threshold: u32,
    /// Where the numbers come from: `replay`, `stack` or `sample` (an estimate).
    pub source: &'static str,
    /// hit blocks / request blocks.
    pub block_hit_rate: f64,
    /// hit requests / requests (null for a sampled row).
    pub request_hit_rate: Option<f64>,
    /// hit blocks · tokens per chunk.
    pub prefill_tokens_saved: u64,
    /// Blocks evicted (null where not replayed).
    pub evicted_blocks: Option<u64>,
    /// Stores the reuse filter rejected (null without a filter or where not replayed).
    pub stores_skipped: Option<u64>,
    /// `prepare_store` calls that failed (null where not replayed).
    pub store_failures: Option<u64>,
    /// Requests.
    pub requests: u64,
    /// Request blocks.
    pub request_blocks: u64,
    /// Hit blocks (an estimate for a sampled row).
    pub hit_blocks: u64,
    /// Hit requests (null for a sampled row).
    pub hit_requests: Option<u64>,
    /// Stored blocks (null where not replayed).
    pub stored_blocks: Option<u64>,
    /// Lookups that stopped at a pending block (null where not replayed).
    pub stopped_at_pending: Option<u64>,
    /// Chunks resident at the end (null where not replayed).
    pub resident_blocks: Option<u32>,
    /// The hit digest, 16 hex digits (null for a sampled row).
    pub digest: Option<String>,
}

/// Everything `kvtier sweep` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    /// The trace file.
    pub trace: String,
    /// `kvtrace` or `mooncake`.
    pub format: &'static str,
    /// Tokens per chunk.
    pub block_tokens: u32,
    /// The model, when given.
    pub model: Option<String>,
    /// Exact CPU bytes per chunk of the model (page aligned), when given.
    pub bytes_per_chunk: Option<u64>,
    /// Requests of the trace.
    pub requests: u64,
    /// Request blocks of the trace.
    pub request_blocks: u64,
    /// Request blocks whose key appeared before (the infinite-cache bound's hits).
    pub repeated_blocks: u64,
    /// repeated_blocks / request_blocks.
    pub infinite_cache_hit_rate: f64,
    /// The smallest capacity within one point of the best block hit rate.
    pub knee: Option<SweepRow>,
    /// Threads used.
    pub jobs: usize,
    /// Seconds parsing the trace (once).
    pub parse_s: f64,
    /// Seconds replaying every configuration.
    pub sweep_s: f64,
    /// Seconds in all, plot included.
    pub wall_s: f64,
    /// Heap bytes of the parsed trace.
    pub trace_heap_bytes: u64,
    /// How the rows were computed.
    pub method: Method,
    /// The sampling rate (`sample` only).
    pub sample_rate: Option<f64>,
    /// Configurations replayed in full.
    pub replayed: usize,
    /// A sampled curve's estimates beside exact replays.
    pub checkpoints: Vec<Checkpoint>,
    /// The largest checkpoint error, in percentage points (absolute).
    pub max_checkpoint_error: Option<f64>,
    /// The rows, per policy and threshold, by capacity.
    pub rows: Vec<SweepRow>,
    /// The sweep itself.
    #[serde(skip)]
    pub sweep: Sweep,
}

impl SweepReport {
    /// The method's name (`exact`, `stack`, `sample`).
    #[must_use]
    pub const fn method_name(&self) -> &'static str {
        match self.method {
            Method::Exact => "exact",
            Method::Stack => "stack",
            Method::Sample => "sample",
        }
    }
}

impl SweepOptions {
    /// The capacities: `--capacities`, or the geometric `--from/--to/--steps`.
    ///
    /// # Errors
    /// [`GridError`] naming the option at fault.
    pub fn capacity_list(&self) -> Result<Vec<u32>, GridError> {
        match (self.from, self.to, self.steps) {
            (Some(from), Some(to), Some(steps)) => {
                geometric_capacities(from, to, steps).map_err(GridError::Range)
            }
            _ if self.capacities.is_empty() => Err(GridError::NoCapacities),
            _ => Ok(self.capacities.clone()),
        }
    }

    /// The grid of configurations.
    ///
    /// # Errors
    /// [`GridError`] naming the option at fault.
    pub fn grid(&self) -> Result<SweepGrid, GridError> {
        if self.gpu_blocks.is_some() && self.method != Method::Exact {
            return Err(GridError::GpuFrontNeedsExact);
        }
        if self.policies.is_empty() {
            return Err(GridError::NoPolicies);
        }
        if self.thresholds.is_empty() {
            return Err(GridError::NoThresholds);
        }
        Ok(SweepGrid {
            capacities: self.capacity_list()?,
            policies: self.policies.clone(),
            thresholds: self.thresholds.clone(),
        })
    }

    /// The model's exact CPU bytes per chunk of `block_tokens` tokens, through `kvtier
    /// capacity`'s layout loading and the core's CPU-tier sizing; `None` without a model.
    ///
    /// # Errors
    /// [`ChunkBytesError`] for a bad model, or `block_tokens` not a multiple of `--block-size`.
    pub fn bytes_per_chunk(
        &self,
        block_tokens: u32,
    ) -> Result<Option<(String, u64)>, ChunkBytesError> {
        if !self.source.is_given() {
            return Ok(None);
        }
        if self.block_size == 0 || !block_tokens.is_multiple_of(self.block_size) {
            return Err(ChunkBytesError::BlockSize {
                block_size: self.block_size,
                block_tokens,
            });
        }
        let args = CapacityOptions {
            source: self.source.clone(),
            block_size: self.block_size,
            max_model_len: Some(u64::from(block_tokens)),
            cpu_bytes: Some(1 << 40),
            blocks_per_chunk: u64::from(block_tokens / self.block_size),
            workers: 1,
            world_size: 1,
            ..CapacityOptions::default()
        };
        let r = report(&args).map_err(ChunkBytesError::Model)?;
        let cpu = r.cpu.ok_or(ChunkBytesError::NoCpuTier)?;
        if cpu.aligned_chunk_bytes == 0 {
            return Err(ChunkBytesError::EmptyChunk { model: r.model });
        }
        Ok(Some((r.model, cpu.aligned_chunk_bytes)))
    }
}

fn row(
    p: &SweepPoint,
    source: Source,
    block_tokens: u32,
    bytes_per_chunk: Option<u64>,
) -> SweepRow {
    let c = &p.counts;
    let replayed = source == Source::Replay;
    let exact = source != Source::Sample;
    let when = |v: u64| replayed.then_some(v);
    #[expect(clippy::cast_precision_loss, reason = "a size for people")]
    let gib =
        bytes_per_chunk.map(|b| f64::from(p.case.capacity) * b as f64 / f64::from(1u32 << 30));
    SweepRow {
        capacity: p.case.capacity,
        gib,
        policy: p.case.policy.name(),
        store_threshold: p.case.threshold,
        source: source.name(),
        block_hit_rate: c.block_hit_rate(),
        request_hit_rate: exact.then(|| c.request_hit_rate()),
        prefill_tokens_saved: c.hit_blocks.saturating_mul(u64::from(block_tokens)),
        evicted_blocks: when(c.evicted_blocks),
        stores_skipped: c.stores_skipped.filter(|_| replayed),
        store_failures: when(c.store_failures),
        requests: c.requests,
        request_blocks: c.request_blocks,
        hit_blocks: c.hit_blocks,
        hit_requests: exact.then_some(c.hit_requests),
        stored_blocks: when(c.stored_blocks),
        stopped_at_pending: when(c.stopped_at_pending),
        resident_blocks: replayed.then_some(p.resident_blocks),
        digest: exact.then(|| format!("{:016x}", c.digest)),
    }
}

/// Runs the sweep `args` describe and draws the plot if asked; `progress` shows a bar on
/// stderr.
///
/// # Errors
/// [`SweepRunError`]: any error of the options, the trace, a replay or the plot.
pub fn sweep(args: &SweepOptions, progress: bool) -> Result<SweepReport, SweepRunError> {
    let started = Instant::now();
    let grid = args.grid()?;
    let cases = grid.cases();
    let path = &args.trace;
    let mut input = args.input.open_path(path, args.block_tokens, true, |f| f)?;
    let format = input.format();
    let limits = CompactLimits::new(args.max_records, args.max_hashes);
    let trace =
        CompactTrace::read_from(&mut input, limits).map_err(|error| SweepRunError::Read {
            path: path.clone(),
            error,
        })?;
    drop(input);
    let parse_s = started.elapsed().as_secs_f64();
    let block_tokens = args.block_tokens.unwrap_or(trace.header().block_tokens);
    let model = args.bytes_per_chunk(block_tokens)?;
    let bytes_per_chunk = model.as_ref().map(|(_, b)| *b);

    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let make_replayer = |case: &SweepCase| -> Result<CaseReplay, CaseError> {
        let manager = args
            .manager
            .manager(case.policy, case.capacity, case.threshold)?;
        let engine = args
            .gpu_blocks
            .map(|n| Engine::new(args.engine.config(n, block_tokens)))
            .transpose()?;
        Ok(CaseReplay {
            replayer: args.manager.replayer(manager, block_tokens),
            engine,
        })
    };
    let t = Instant::now();
    let spec = MethodSpec {
        method: args.method,
        rate: args.sample,
        verify: args.verify,
        hot_keys: args.hot_keys,
        seed: args.sample_seed.unwrap_or(DEFAULT_SEED),
        jobs,
        block_tokens: u64::from(block_tokens),
        max_requests: args.manager.max_requests.min(MINI_MAX_REQUESTS),
        progress,
    };
    // The repeat bound is one more pass over the parsed trace, independent of the points:
    // it runs beside them, on a core the single-threaded phases (the hot-key pass) leave idle
    // (`sample` computes it itself, for its control variate).
    let (by_method, bound_pass) = std::thread::scope(|scope| {
        let bound_pass =
            (spec.method != Method::Sample).then(|| scope.spawn(|| repeat_bound(trace.cursor())));
        let by_method = points(&spec, &cases, &make_replayer, &trace);
        (by_method, bound_pass.map(|h| h.join()))
    });
    let by_method = by_method.map_err(|e| match e {
        MethodError::Curve(e) => SweepRunError::Curve(e),
        MethodError::Sweep(error) => SweepRunError::Sweep {
            path: path.clone(),
            error,
        },
    })?;
    let sources: Vec<Source> = by_method.points.iter().map(|(_, s)| *s).collect();
    let sweep = Sweep {
        points: by_method.points.into_iter().map(|(p, _)| p).collect(),
    };
    let sweep_s = t.elapsed().as_secs_f64();
    let (repeated, blocks) = match (by_method.bound, bound_pass) {
        (Some(rb), _) | (None, Some(Ok(rb))) => rb,
        _ => repeat_bound(trace.cursor()),
    };
    #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
    let bound = if blocks == 0 {
        0.0
    } else {
        repeated as f64 / blocks as f64
    };

    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if let Some(plot) = &args.plot {
        let spec = PlotSpec {
            sweep: &sweep,
            trace: name.clone(),
            block_tokens: u64::from(block_tokens),
            bound: Some(bound),
            model: model.clone(),
            size: args.plot_size,
            sampled: (args.method == Method::Sample).then_some(args.sample),
            checkpoints: &by_method.checkpoints,
        };
        draw(&spec, plot)?;
    }
    let rows: Vec<SweepRow> = sweep
        .points
        .iter()
        .zip(&sources)
        .map(|(p, &s)| row(p, s, block_tokens, bytes_per_chunk))
        .collect();
    let knee = sweep.knee(KNEE_MARGIN).map(|k| {
        let i = sweep.points.iter().position(|p| p == k).unwrap_or(0);
        row(
            k,
            sources.get(i).copied().unwrap_or(Source::Replay),
            block_tokens,
            bytes_per_chunk,
        )
    });
    let max_checkpoint_error = by_method
        .checkpoints
        .iter()
        .map(|c| c.error_points.abs())
        .reduce(f64::max);
    Ok(SweepReport {
        trace: path.display().to_string(),
        format: format.name(),
        block_tokens,
        model: model.map(|(m, _)| m),
        bytes_per_chunk,
        requests: trace.requests(),
        request_blocks: blocks,
        repeated_blocks: repeated,
        infinite_cache_hit_rate: bound,
        knee,
        jobs,
        parse_s,
        sweep_s,
        wall_s: started.elapsed().as_secs_f64(),
        trace_heap_bytes: trace.heap_bytes(),
        method: args.method,
        sample_rate: (args.method == Method::Sample).then_some(args.sample),
        replayed: by_method.replayed,
        checkpoints: by_method.checkpoints,
        max_checkpoint_error,
        rows,
        sweep,
    })
}
