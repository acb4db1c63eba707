//! `kvtier sweep --offloader simple`: one trace, parsed once, replayed through the simple CPU
//! offloader behind the engine model's GPU front (as `kvtier replay --offloader simple`) at
//! each CPU pool size of `--capacities` (or `--from/--to/--steps`), in CPU blocks, on
//! threads. Each row is exactly the single replay of the same options: the seven save
//! outcomes, the blocks loaded, the pool at the end and the GPU's figures.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kvtier_core::capacity::PoolLayout;
use kvtier_core::manager::PolicyKind;
use kvtier_core::simple::SimpleConfig;
use serde::Serialize;

use crate::replay::GpuFront;
use crate::replay::{SimpleRun, SimpleRunError};
use crate::sweep::Method;
use crate::sweep::{SweepOptions, SweepRunError};
use crate::tier::SimpleOptions;
use crate::trace::{CompactLimits, CompactTrace};

/// One pool size of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimpleSweepRow {
    /// CPU blocks, the null block included.
    pub cpu_blocks: u32,
    /// The pool as CPU memory in GiB (with a model: its bytes per block).
    pub gib: Option<f64>,
    /// The seven save outcomes, by vLLM's label.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Blocks of completed loads.
    pub load_blocks: u64,
    /// `vllm:simple_kv_offload_used_blocks` at the end.
    pub used_blocks: i64,
    /// `vllm:simple_kv_offload_pending_store_blocks` at the end.
    pub pending_store_blocks: u64,
    /// Blocks in the CPU prefix cache at the end.
    pub cached_blocks: usize,
    /// `vllm:external_prefix_cache_hits`: tokens loaded from the CPU.
    pub external_hit_tokens: u64,
    /// `vllm:external_prefix_cache_queries`: tokens past the GPU's hits.
    pub external_query_tokens: u64,
    /// `external_hit_tokens / external_query_tokens` (0 without queries).
    pub external_hit_rate: f64,
    /// `vllm:prefix_cache_hits`: tokens the GPU prefix cache held.
    pub gpu_hit_tokens: u64,
    /// `vllm:prefix_cache_queries`.
    pub gpu_query_tokens: u64,
    /// Engine steps.
    pub steps: u64,
    /// Preemptions.
    pub preemptions: u64,
}

/// Everything `kvtier sweep --offloader simple` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimpleSweepReport {
    /// The trace file.
    pub trace: String,
    /// `kvtrace` or `mooncake`.
    pub format: &'static str,
    /// Tokens per block.
    pub block_tokens: u32,
    /// GPU blocks, the null block included.
    pub gpu_blocks: u32,
    /// Lazy mode.
    pub lazy: bool,
    /// `--hybrid`: the engine's Mamba group hands off its boundary states.
    pub hybrid: bool,
    /// `world_size`.
    pub world_size: u32,
    /// The model, when given.
    pub model: Option<String>,
    /// The model's bytes per block, when given.
    pub bytes_per_block: Option<u64>,
    /// Requests of the trace.
    pub requests: u64,
    /// Threads used.
    pub jobs: usize,
    /// Seconds parsing the trace (once).
    pub parse_s: f64,
    /// Seconds replaying every pool size.
    pub sweep_s: f64,
    /// Seconds in all.
    pub wall_s: f64,
    /// The rows, by pool size as given.
    pub rows: Vec<SimpleSweepRow>,
}

/// Refuses what `--offloader simple` does not take: the OffloadingConnector's policies,
/// thresholds and curve methods, the plot, and a missing GPU.
fn check(args: &SweepOptions) -> Result<GpuFront, SweepRunError> {
    let bad = |what| Err(SweepRunError::SimpleOption(what));
    if args.policies != [PolicyKind::Lru, PolicyKind::Arc] {
        return bad("--policies do not apply to --offloader simple (its pool is vLLM's LRU)");
    }
    if args.thresholds != [1] {
        return bad("--thresholds do not apply to --offloader simple (it stores every block)");
    }
    if args.method != Method::Exact {
        return bad("--offloader simple replays every pool size: --method exact only");
    }
    if args.plot.is_some() {
        return bad(
            "--plot draws the OffloadingConnector's hit-rate curve, not --offloader simple",
        );
    }
    let Some(num_gpu_blocks) = args.gpu_blocks else {
        return bad("--offloader simple needs a GPU in front: give --gpu-blocks");
    };
    Ok(GpuFront {
        num_gpu_blocks,
        engine: args.engine,
    })
}

fn row(run: &SimpleRun, bytes: Option<u64>) -> SimpleSweepRow {
    let r = run.report(String::new(), kvtier_core::stats::Payload::default(), 0.0);
    let c = r.gpu.counts;
    #[expect(clippy::cast_precision_loss, reason = "rates and sizes for people")]
    let (rate, gib) = (
        if c.external_prefix_cache_queries == 0 {
            0.0
        } else {
            c.external_prefix_cache_hits as f64 / c.external_prefix_cache_queries as f64
        },
        bytes.map(|b| f64::from(r.cpu_blocks) * b as f64 / f64::from(1u32 << 30)),
    );
    SimpleSweepRow {
        cpu_blocks: r.cpu_blocks,
        gib,
        outcomes: r.outcomes,
        load_blocks: r.load_blocks,
        used_blocks: r.used_blocks,
        pending_store_blocks: r.pending_store_blocks,
        cached_blocks: r.cached_blocks,
        external_hit_tokens: c.external_prefix_cache_hits,
        external_query_tokens: c.external_prefix_cache_queries,
        external_hit_rate: rate,
        gpu_hit_tokens: c.prefix_cache_hits,
        gpu_query_tokens: c.prefix_cache_queries,
        steps: c.steps,
        preemptions: c.preemptions,
    }
}

/// One pool size over the parsed trace.
fn replay_one(
    trace: &CompactTrace,
    front: GpuFront,
    bt: u32,
    cpu_blocks: u32,
    simple: SimpleOptions,
    bytes: Option<u64>,
) -> Result<SimpleSweepRow, SimpleRunError> {
    let sizing = SimpleConfig::with_cpu_blocks(bt, front.num_gpu_blocks, cpu_blocks).sizing;
    let mut run = SimpleRun::from_parts(front, bt, sizing, simple)?;
    let mut cursor = trace.cursor();
    while let Some((rec, line)) = cursor.next_with_line() {
        run.apply(rec)
            .map_err(|error| SimpleRunError::Engine { line, error })?;
    }
    run.finish()
        .map_err(|error| SimpleRunError::Engine { line: None, error })?;
    // The last drain makes the loads complete in the counts.
    run.drain()?;
    Ok(row(&run, bytes))
}

/// Runs `kvtier sweep --offloader simple` as `args` say.
///
/// # Errors
/// [`SweepRunError`]: an option it does not take, the trace, the model or a case.
pub fn sweep_simple(args: &SweepOptions) -> Result<SimpleSweepReport, SweepRunError> {
    let started = Instant::now();
    let front = check(args)?;
    let capacities = args.capacity_list()?;
    let path: &Path = &args.trace;
    let mut input = args.input.open_path(path, args.block_tokens, true, |f| f)?;
    let format = input.format();
    let limits = CompactLimits::new(args.max_records, args.max_hashes);
    let trace =
        CompactTrace::read_from(&mut input, limits).map_err(|error| SweepRunError::Read {
            path: path.to_path_buf(),
            error,
        })?;
    drop(input);
    let parse_s = started.elapsed().as_secs_f64();
    let bt = args.block_tokens.unwrap_or(trace.header().block_tokens);
    let src = &args.source;
    let model = if src.is_given() {
        let bytes = src
            .bytes_per_block(bt, PoolLayout::LayerOutermost)
            .map_err(SweepRunError::SimpleModel)?;
        let name = match (&src.model, &src.layout, &src.hf_config) {
            (Some(m), _, _) => m.to_string(),
            (None, Some(p), _) | (None, None, Some(p)) => p.to_string(),
            (None, None, None) => String::new(),
        };
        Some((name, bytes))
    } else {
        None
    };
    let bytes = model.as_ref().map(|m| m.1);
    let simple = args.tier.options(None);
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .clamp(1, capacities.len().max(1));
    let t = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimpleSweepRow, SimpleRunError>>>> =
        Mutex::new((0..capacities.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&cap) = capacities.get(i) else { break };
                    let r = replay_one(&trace, front, bt, cap, simple, bytes);
                    let mut all = results.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(slot) = all.get_mut(i) {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    let sweep_s = t.elapsed().as_secs_f64();
    let mut rows = Vec::with_capacity(capacities.len());
    let all = results.into_inner().unwrap_or_else(|p| p.into_inner());
    // Every index below the list's length was taken by a thread.
    for (r, &capacity) in all.into_iter().zip(&capacities) {
        match r {
            Some(Ok(row)) => rows.push(row),
            None => {}
            Some(Err(error)) => {
                return Err(SweepRunError::Simple {
                    path: path.to_path_buf(),
                    capacity,
                    error,
                });
            }
        }
    }
    Ok(SimpleSweepReport {
        trace: path.display().to_string(),
        format: format.name(),
        block_tokens: bt,
        gpu_blocks: front.num_gpu_blocks,
        lazy: args.tier.lazy,
        hybrid: front.engine.hybrid,
        world_size: args.tier.world_size,
        model: model.map(|m| m.0),
        bytes_per_block: bytes,
        requests: trace.requests(),
        jobs,
        parse_s,
        sweep_s,
        wall_s: started.elapsed().as_secs_f64(),
        rows,
    })
}
