//! `--gpu-blocks`: the replay's CPU tier behind the engine model's GPU prefix cache
//! ([`crate::engine`]). The tier sees only the GPU's misses: a request's lookup starts after
//! the blocks the GPU holds, and its store offers the blocks the GPU computed.
//!
//! The engine's hooks become the kvtrace records of the replay protocol, so the tier, its
//! counts and its stats are those of [`Replayer`]: `L` (the keys past the GPU's hit, the scan
//! capped short of the last token) at the request's first admission, `S` when its prompt is
//! computed, `C` when it finished and its stores completed.

use kvtier_core::BlockKey;
use kvtier_core::stats::{Gauge, Payload, UpdateError, catalogue};

use super::RunError;
use crate::engine::{Engine, EngineArgs, EngineCounts, EngineError};
use crate::replay::ReplayStats;
use crate::replay::Replayer;
use crate::tier::TierConnector;

/// The GPU in front of a replay's tier: its size and the engine model's options.
#[derive(Clone, Copy, Debug)]
pub struct GpuFront {
    /// GPU blocks, the null block included.
    pub num_gpu_blocks: u32,
    /// The engine model's options.
    pub engine: EngineArgs,
}

impl GpuFront {
    /// The engine of this GPU with `block_tokens` tokens per block.
    ///
    /// # Errors
    /// [`RunError::Engine`] for a configuration out of range or a pool that cannot be built.
    pub fn engine(&self, block_tokens: u32) -> Result<Engine, RunError> {
        let config = self.engine.config(self.num_gpu_blocks, block_tokens);
        Engine::new(config).map_err(|error| RunError::Engine {
            line: None,
            record: 0,
            error: error.map_connector(|never| match never {}),
        })
    }

    /// [`GpuFront::engine`] for the offloading connector's tier, which has no hybrid model:
    /// `--hybrid` is refused.
    ///
    /// # Errors
    /// As [`GpuFront::engine`]; [`RunError::Engine`] for `--hybrid`.
    pub fn offloading_engine(&self, block_tokens: u32) -> Result<Engine, RunError> {
        if self.engine.hybrid {
            return Err(RunError::Engine {
                line: None,
                record: 0,
                error: EngineError::Config(
                    "--hybrid needs --offloader simple (the offloading connector's tier models \
                     one full-attention group)",
                ),
            });
        }
        self.engine(block_tokens)
    }
}

/// Runs `engine` to its end over the replay's tier (after the trace's last of `records`).
pub(crate) fn finish(
    engine: &mut Engine,
    stats: &mut ReplayStats,
    replayer: &mut Replayer,
    keys: &mut Vec<BlockKey>,
    records: u64,
) -> Result<(), RunError> {
    let mut tier = TierConnector::new(Some(stats), replayer, keys);
    engine.finish(&mut tier).map_err(|error| RunError::Engine {
        line: None,
        record: records,
        error,
    })
}

/// What the GPU front adds to a replay report.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct GpuReport {
    /// GPU blocks, the null block included.
    pub gpu_blocks: u32,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u64,
    /// `--max-num-seqs`.
    pub max_num_seqs: usize,
    /// `--decode-tokens`.
    pub decode_tokens: u32,
    /// `--transfer-steps`.
    pub transfer_steps: u64,
    /// `--hybrid`: a Mamba group in align mode beside the attention group.
    pub hybrid: bool,
    /// The engine's counts.
    #[serde(flatten)]
    pub counts: EngineCounts,
    /// `prefix_cache_hits / prefix_cache_queries` (0 without queries).
    pub prefix_cache_hit_rate: f64,
    /// `vllm:kv_cache_usage_perc` at the end (0 once every request has freed its blocks).
    pub kv_cache_usage_perc: f64,
    /// Blocks in the GPU prefix cache at the end.
    pub cached_blocks: usize,
}

impl GpuReport {
    /// The report of `engine` after its run.
    #[must_use]
    pub fn new(engine: &Engine) -> Self {
        let c = engine.counts();
        let cfg = engine.config();
        #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
        let rate = if c.prefix_cache_queries == 0 {
            0.0
        } else {
            c.prefix_cache_hits as f64 / c.prefix_cache_queries as f64
        };
        GpuReport {
            gpu_blocks: cfg.num_gpu_blocks,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            decode_tokens: cfg.decode_tokens,
            transfer_steps: cfg.transfer_steps,
            hybrid: cfg.hybrid,
            counts: c,
            prefix_cache_hit_rate: rate,
            kv_cache_usage_perc: engine.gpu().usage().as_f64(),
            cached_blocks: engine.gpu().pool().cached_key_count(),
        }
    }
}

/// Adds the GPU prefix-cache series of `engine` to `payload`: `vllm:kv_cache_usage_perc` (now),
/// `vllm:prefix_cache_queries` / `_hits`, `vllm:external_prefix_cache_queries` / `_hits` and
/// `vllm:prompt_tokens_cached_by_source{source="device"}` (what the engine counted since
/// `since`, its counts at the previous call; the default for totals).
///
/// # Errors
/// [`UpdateError`] when the payload refuses a series.
pub(crate) fn add_gpu_series(
    payload: &mut Payload,
    engine: &Engine,
    since: &EngineCounts,
) -> Result<(), UpdateError> {
    let now = engine.counts();
    let c = EngineCounts {
        prefix_cache_queries: now.prefix_cache_queries - since.prefix_cache_queries,
        prefix_cache_hits: now.prefix_cache_hits - since.prefix_cache_hits,
        external_prefix_cache_queries: now.external_prefix_cache_queries
            - since.external_prefix_cache_queries,
        external_prefix_cache_hits: now.external_prefix_cache_hits
            - since.external_prefix_cache_hits,
        ..now
    };
    let u = engine.gpu().usage();
    payload.set_gauge(
        catalogue::KV_CACHE_USAGE_PERC,
        &[],
        Gauge::fraction(u64::from(u.used), u64::from(u.total)),
    )?;
    payload.increase_counter(catalogue::PREFIX_CACHE_QUERIES, &[], c.prefix_cache_queries)?;
    payload.increase_counter(catalogue::PREFIX_CACHE_HITS, &[], c.prefix_cache_hits)?;
    payload.increase_counter(
        catalogue::EXTERNAL_PREFIX_CACHE_QUERIES,
        &[],
        c.external_prefix_cache_queries,
    )?;
    payload.increase_counter(
        catalogue::EXTERNAL_PREFIX_CACHE_HITS,
        &[],
        c.external_prefix_cache_hits,
    )?;
    payload.increase_counter(
        catalogue::PROMPT_TOKENS_CACHED_BY_SOURCE,
        &["device"],
        c.prefix_cache_hits,
    )?;
    Ok(())
}
