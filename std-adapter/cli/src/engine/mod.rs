//! vLLM's GPU KV cache in front of the tier: a deterministic model of an engine's scheduling
//! steps over the core's [`BlockPool`](kvtier_core::block_pool::BlockPool) as the GPU prefix
//! cache, driving a KV connector's scheduler side.
//!
//! The model is stated in `docs/engine-model.md`; in short: arrivals in trace order (`L`
//! records; `S` and `C` are ignored), a saturated engine that steps whenever
//! `max_num_seqs` requests wait, admission by `max_num_batched_tokens`, `max_num_seqs` and free
//! GPU blocks, chunked prefill, one token per decode step, preemption of the running tail when
//! blocks lack, and transfers that complete at the end of the step `transfer_steps` after the
//! one that issued them.
//!
//! | file | holds |
//! |---|---|
//! | `gpu` | [`GpuCache`]: the block pool with vLLM's allocation, caching and free order |
//! | `mamba` | a hybrid model's Mamba group (align mode) in the same pool: state tables, hits, boundary hand-offs |
//! | `connector` | [`Connector`], the hooks a step calls, and [`StepRecord`] |
//! | `request` | a request in the engine: its tables, its lookup query, its allocation over both groups |
//! | `sched` | [`Engine`]: the queues and the step |

mod connector;
mod gpu;
mod mamba;
mod request;
mod sched;

use core::fmt;

pub use connector::{
    Connector, FinishedRequest, LookupQuery, NoConnector, ScheduledRequest, StepRecord,
};
pub use gpu::{GpuCache, GpuError, Other};
pub use mamba::{GroupTables, MAMBA_GROUP, layout};
pub use sched::Engine;

/// The engine model's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// GPU blocks, the null block included (vLLM's `num_gpu_blocks`); at least 2.
    pub num_gpu_blocks: u32,
    /// Tokens per block; at least 1.
    pub block_tokens: u32,
    /// Tokens one step may compute (vLLM's `max_num_batched_tokens`); at least 1.
    pub max_num_batched_tokens: u64,
    /// Requests running at once (vLLM's `max_num_seqs`); at least 1.
    pub max_num_seqs: usize,
    /// Output tokens of every request (its `max_tokens`); at least 1.
    pub decode_tokens: u32,
    /// Steps a transfer takes: issued in step `t`, it completes at the end of step
    /// `t + transfer_steps`.
    pub transfer_steps: u64,
    /// A hybrid model: a Mamba group in vLLM's `align` mode beside the attention group, with
    /// the same block size, in the same GPU pool (group [`MAMBA_GROUP`]); prefill chunks end
    /// on block boundaries and each boundary's state is handed off (default false).
    pub hybrid: bool,
}

impl EngineConfig {
    /// The default of [`EngineConfig::max_num_batched_tokens`] (vLLM's for online serving on
    /// a large GPU).
    pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: u64 = 8192;
    /// The default of [`EngineConfig::max_num_seqs`] (vLLM's).
    pub const DEFAULT_MAX_NUM_SEQS: usize = 256;
    /// The default of [`EngineConfig::decode_tokens`].
    pub const DEFAULT_DECODE_TOKENS: u32 = 16;
    /// The default of [`EngineConfig::transfer_steps`].
    pub const DEFAULT_TRANSFER_STEPS: u64 = 1;

    /// `num_gpu_blocks` blocks of `block_tokens` tokens, the other parameters at their
    /// defaults.
    #[must_use]
    pub const fn new(num_gpu_blocks: u32, block_tokens: u32) -> Self {
        EngineConfig {
            num_gpu_blocks,
            block_tokens,
            max_num_batched_tokens: Self::DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_num_seqs: Self::DEFAULT_MAX_NUM_SEQS,
            decode_tokens: Self::DEFAULT_DECODE_TOKENS,
            transfer_steps: Self::DEFAULT_TRANSFER_STEPS,
            hybrid: false,
        }
    }

    fn check<E>(&self) -> Result<(), EngineError<E>> {
        let bad = |what: &'static str| Err(EngineError::Config(what));
        if self.num_gpu_blocks < 2 {
            return bad("--gpu-blocks must be at least 2 (block 0 is the null block)");
        }
        if self.block_tokens == 0 {
            return bad("--block-tokens must be at least 1");
        }
        if self.max_num_batched_tokens == 0 {
            return bad("--max-num-batched-tokens must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("--max-num-seqs must be at least 1");
        }
        if self.decode_tokens == 0 {
            return bad("--decode-tokens must be at least 1");
        }
        if self.hybrid && self.max_num_batched_tokens < u64::from(self.block_tokens) {
            // Align-mode chunks end on block boundaries: a smaller budget schedules no prefill.
            return bad("--hybrid needs --max-num-batched-tokens of at least one block");
        }
        Ok(())
    }
}

/// The engine options of `kvtier replay --gpu-blocks` (the GPU's size is given apart).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct EngineArgs {
    /// With a GPU in front: tokens one engine step may compute (vLLM's
    /// max_num_batched_tokens).
    #[arg(long, default_value_t = EngineConfig::DEFAULT_MAX_NUM_BATCHED_TOKENS, value_name = "N")]
    pub max_num_batched_tokens: u64,
    /// With a GPU in front: requests running at once (vLLM's max_num_seqs).
    #[arg(long, default_value_t = EngineConfig::DEFAULT_MAX_NUM_SEQS, value_name = "N")]
    pub max_num_seqs: usize,
    /// With a GPU in front: output tokens of every request.
    #[arg(long, default_value_t = EngineConfig::DEFAULT_DECODE_TOKENS, value_name = "N")]
    pub decode_tokens: u32,
    /// With a GPU in front: engine steps an offload transfer takes.
    #[arg(long, default_value_t = EngineConfig::DEFAULT_TRANSFER_STEPS, value_name = "N")]
    pub transfer_steps: u64,
    /// With a GPU in front and --offloader simple: a hybrid model, with a Mamba KV-cache group
    /// in vLLM's align mode beside the attention group (same block size); its boundary
    /// states are handed off to the offloader and fill the save-outcome counter.
    #[arg(long)]
    pub hybrid: bool,
}

impl EngineArgs {
    /// The configuration of a GPU of `num_gpu_blocks` blocks of `block_tokens` tokens.
    #[must_use]
    pub const fn config(&self, num_gpu_blocks: u32, block_tokens: u32) -> EngineConfig {
        EngineConfig {
            num_gpu_blocks,
            block_tokens,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            decode_tokens: self.decode_tokens,
            transfer_steps: self.transfer_steps,
            hybrid: self.hybrid,
        }
    }
}

/// What the engine counted; token counts are what vLLM's series of the same name add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineCounts {
    /// Steps run.
    pub steps: u64,
    /// Tokens computed over all steps.
    pub scheduled_tokens: u64,
    /// Requests that finished and freed their blocks.
    pub finished: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests whose admission started a load from the tier.
    pub loads: u64,
    /// `vllm:prefix_cache_queries`: tokens of the requests admitted (not preempted before).
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits`: their tokens found in the GPU prefix cache.
    pub prefix_cache_hits: u64,
    /// The same as `prefix_cache_queries` for re-admitted preempted requests (vLLM counts
    /// them apart and publishes them nowhere).
    pub preempted_queries: u64,
    /// Their hit tokens.
    pub preempted_hits: u64,
    /// `vllm:external_prefix_cache_queries`: tokens past the GPU's hit at a request's first
    /// admission.
    pub external_prefix_cache_queries: u64,
    /// `vllm:external_prefix_cache_hits`: of those, tokens the tier loaded.
    pub external_prefix_cache_hits: u64,
    /// The most GPU blocks in use after a step's scheduling (the null block excluded).
    pub peak_used_blocks: u64,
}

/// Why the engine stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError<E> {
    /// A parameter out of range (the message names the option).
    Config(&'static str),
    /// A request id arrived twice while the first was in the engine.
    DuplicateRequest(u64),
    /// A request whose prompt and outputs need more blocks than the GPU has.
    RequestTooLarge {
        /// The request.
        rid: u64,
        /// Blocks it needs at its longest.
        blocks: u64,
        /// `--gpu-blocks` (the null block included).
        gpu_blocks: u32,
    },
    /// A step could schedule nothing and no transfer was in flight: the waiting requests
    /// hold or need more blocks than the rest leave.
    Stalled {
        /// The step.
        step: u64,
    },
    /// The GPU pool refused a call the engine's bookkeeping allows (a bug).
    Gpu(GpuError),
    /// The connector's error.
    Connector(E),
}

impl<E> From<GpuError> for EngineError<E> {
    fn from(e: GpuError) -> Self {
        EngineError::Gpu(e)
    }
}

impl<E> EngineError<E> {
    /// The same error with the connector's error mapped by `f`.
    pub fn map_connector<F>(self, f: impl FnOnce(E) -> F) -> EngineError<F> {
        match self {
            EngineError::Config(s) => EngineError::Config(s),
            EngineError::DuplicateRequest(r) => EngineError::DuplicateRequest(r),
            EngineError::RequestTooLarge {
                rid,
                blocks,
                gpu_blocks,
            } => EngineError::RequestTooLarge {
                rid,
                blocks,
                gpu_blocks,
            },
            EngineError::Stalled { step } => EngineError::Stalled { step },
            EngineError::Gpu(e) => EngineError::Gpu(e),
            EngineError::Connector(e) => EngineError::Connector(f(e)),
        }
    }
}

impl<E: fmt::Display> fmt::Display for EngineError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Config(s) => f.write_str(s),
            EngineError::DuplicateRequest(r) => write!(f, "request {r} arrived twice"),
            EngineError::RequestTooLarge {
                rid,
                blocks,
                gpu_blocks,
            } => write!(
                f,
                "request {rid} needs {blocks} GPU blocks for its prompt and outputs, more than \
                 the {} usable of --gpu-blocks {gpu_blocks}",
                gpu_blocks - 1
            ),
            EngineError::Stalled { step } => write!(
                f,
                "the engine stalled at step {step}: the waiting requests need more GPU blocks \
                 than the others leave (raise --gpu-blocks)"
            ),
            EngineError::Gpu(e) => e.fmt(f),
            EngineError::Connector(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for EngineError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Gpu(e) => Some(e),
            EngineError::Connector(e) => Some(e),
            _ => None,
        }
    }
}
