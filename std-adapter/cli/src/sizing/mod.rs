//! The capacity report model (`kvtier capacity`): how many KV blocks, tokens and concurrent
//! requests fit, on the GPU and in the CPU tier, from a layout alone.
//!
//! [`ModelArgs`] resolves a model layout (a preset, a layout file or a config.json);
//! [`report`] computes a [`CapacityReport`] from [`CapacityOptions`] (a value, for tests and
//! programs; the command prints it as a table or JSON); [`ModelArgs::bytes_per_block`] gives the
//! bytes of one block alone (for the replay's transfer model and the sweep's CPU memory).
//! [`parse_size_floor`] and [`parse_dtype`] read the options' sizes and dtypes.

mod model;
mod size;

pub use model::{DtypeError, ModelArgs, parse_dtype};
pub use size::{SizeError, parse_size_floor};

use std::fmt;

use kvtier::export::CacheConfigInfo;
use kvtier_core::capacity::{
    CpuTierConfig, GpuCapacityError, GroupedLayout, GroupingError, PoolLayout, Ratio, SizingError,
    Workload, WorkloadError, gpu_capacity, size_cpu_tier,
};
use serde::Serialize;

use crate::layout::{LayoutError, LayoutShape};
use crate::numfmt::thousands;

/// Default `max_num_batched_tokens` when neither the option nor the layout file gives one.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: u64 = 8192;

/// What to size (the options of `kvtier capacity` but its output format).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CapacityOptions {
    /// The model.
    #[command(flatten)]
    pub source: ModelArgs,
    /// GPU memory for the KV cache per worker: bytes, or with a unit (70GiB, 500MB, 1.5TiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_floor, allow_hyphen_values = true)]
    pub memory: Option<u64>,
    /// Longest request in tokens (default: the layout's max_model_len or max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// Tokens per scheduler step (default: the layout file's, else 8192).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u64>,
    /// Batches in flight (1 synchronous; 2 with async scheduling).
    #[arg(long)]
    pub max_concurrent_batches: Option<u64>,
    /// Tokens per block for presets and config.json.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// As vLLM's --disable-hybrid-kv-cache-manager: sliding-window and chunked-local layers
    /// next to full-attention ones are allocated as full attention (one group).
    #[arg(long)]
    pub disable_hybrid_kv_cache_manager: bool,
    /// Use this many GPU blocks instead of dividing the memory.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<u64>,
    /// Pipeline-parallel workers: layers are split into stages, each with --memory; the pool
    /// is the minimum.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Pool layout: layer-outermost (default) or block-outermost.
    #[arg(long, value_enum, default_value_t = PoolLayoutArg::LayerOutermost)]
    pub pool_layout: PoolLayoutArg,
    /// CPU tier size (cpu_bytes_to_use): bytes or with a unit.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_floor, allow_hyphen_values = true)]
    pub cpu_bytes: Option<u64>,
    /// GPU blocks per CPU chunk.
    #[arg(long, default_value_t = 1)]
    pub blocks_per_chunk: u64,
    /// Ranks whose blocks a CPU chunk holds.
    #[arg(long, default_value_t = 1)]
    pub world_size: u32,
}

/// `--pool-layout` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PoolLayoutArg {
    /// Each layer owns a region of blocks (vLLM's "LBNHC").
    #[default]
    LayerOutermost,
    /// One block holds every layer of the widest group.
    BlockOutermost,
}

impl PoolLayoutArg {
    /// The core's pool layout.
    #[must_use]
    pub const fn layout(self) -> PoolLayout {
        match self {
            Self::LayerOutermost => PoolLayout::LayerOutermost,
            Self::BlockOutermost => PoolLayout::BlockOutermost,
        }
    }

    /// The value's name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::LayerOutermost => "layer-outermost",
            Self::BlockOutermost => "block-outermost",
        }
    }
}

/// Why the capacity report (or a model's block bytes) could not be computed; every message
/// names the option or field at fault.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReportError {
    /// A command-line option is missing, conflicting or malformed.
    Option {
        /// The option, e.g. `--memory`.
        option: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A file could not be read.
    Io {
        /// The path.
        path: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// A `--layout` or `--hf-config` file is larger than [`MAX_LAYOUT_FILE_BYTES`](crate::layout::MAX_LAYOUT_FILE_BYTES).
    TooLarge {
        /// The option that named it.
        option: &'static str,
        /// The path.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The layout could not be read.
    Layout(LayoutError),
    /// The layout's layers could not be grouped.
    Grouping(GroupingError),
    /// A block or request size could not be computed.
    Sizing(SizingError),
    /// The GPU pool could not be sized.
    Gpu(GpuCapacityError),
    /// The bytes of one request (bytes per block · blocks per request) pass `u64`.
    RequestBytesOverflow,
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Option { option, problem } => write!(f, "{option}: {problem}"),
            Self::Io { path, error } => write!(f, "{path}: {error}"),
            Self::TooLarge {
                option,
                path,
                limit,
            } => write!(
                f,
                "{path}: larger than {} MiB ({} bytes), the limit for {option} files",
                limit >> 20,
                thousands(*limit)
            ),
            Self::Layout(e) => e.fmt(f),
            Self::Grouping(e) => e.fmt(f),
            Self::Sizing(e) => e.fmt(f),
            Self::Gpu(e) => e.fmt(f),
            Self::RequestBytesOverflow => f.write_str("request bytes overflow u64"),
        }
    }
}

impl std::error::Error for ReportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { error, .. } => Some(error),
            Self::Layout(e) => Some(e),
            Self::Grouping(e) => Some(e),
            Self::Sizing(e) => Some(e),
            Self::Gpu(e) => Some(e),
            Self::Option { .. } | Self::TooLarge { .. } | Self::RequestBytesOverflow => None,
        }
    }
}

crate::from_variants::from_variants!(
    ReportError:
    LayoutError => Layout,
    GroupingError => Grouping,
    SizingError => Sizing,
);

pub(super) fn opt(option: &'static str, problem: impl Into<String>) -> ReportError {
    ReportError::Option {
        option,
        problem: problem.into(),
    }
}

/// One KV-cache group in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupReport {
    /// Group index.
    pub index: usize,
    /// Kind of its layers.
    pub kind: String,
    /// Layers in the group.
    pub layers: usize,
    /// Tokens per block (after page unification).
    pub block_size: u64,
    /// Page bytes of one layer.
    pub page_bytes: u64,
    /// Bytes of one block of the whole group.
    pub group_bytes: u64,
    /// Blocks one request of max_model_len needs in this group.
    pub blocks_per_request: u64,
}

/// The CPU tier in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuReport {
    /// cpu_bytes_to_use.
    pub cpu_bytes: u64,
    /// GPU blocks per chunk.
    pub blocks_per_chunk: u64,
    /// Bytes of a chunk before alignment.
    pub kv_bytes_per_chunk: u64,
    /// Bytes of a chunk slot (page aligned).
    pub aligned_chunk_bytes: u64,
    /// Chunk slots.
    pub num_chunks: u64,
    /// num_chunks · aligned_chunk_bytes.
    pub kv_cache_size_bytes: u64,
    /// Tokens at max_model_len (null where vLLM reports None).
    pub kv_cache_size_tokens: Option<u64>,
}

/// Everything `kvtier capacity` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityReport {
    /// The layout's name.
    pub model: String,
    /// Layers in the model.
    pub num_layers: usize,
    /// L.
    pub max_model_len: u64,
    /// Tokens per step.
    pub max_num_batched_tokens: u64,
    /// Batches in flight.
    pub max_concurrent_batches: u64,
    /// Pipeline workers.
    pub workers: u64,
    /// "layer-outermost" or "block-outermost".
    pub pool_layout: String,
    /// Bytes per pool block (worker 0).
    pub bytes_per_block: u64,
    /// Blocks in the pool (min across workers, null block included); null without GPU memory.
    pub num_blocks: Option<u64>,
    /// Blocks one request of max_model_len needs.
    pub blocks_per_request: u64,
    /// Bytes one request needs (bytes_per_block · blocks_per_request).
    pub request_bytes: u64,
    /// num_blocks / blocks_per_request as a number.
    pub max_concurrency: Option<f64>,
    /// The same, exact: "num/den".
    pub max_concurrency_exact: Option<String>,
    /// ⌊num_blocks · L / blocks_per_request⌋.
    pub kv_cache_size_tokens: Option<u64>,
    /// What vLLM 0.33.0 reports: int(float(num_blocks / blocks_per_request) · L).
    pub kv_cache_size_tokens_vllm: Option<u64>,
    /// The groups.
    pub groups: Vec<GroupReport>,
    /// The CPU tier, when --cpu-bytes is given.
    pub cpu: Option<CpuReport>,
}

impl CapacityReport {
    /// The engine's `vllm:cache_config_info` attributes this report gives (`block_size`,
    /// `num_gpu_blocks`, `kv_cache_size_tokens`, `kv_cache_max_concurrency`, the same numbers
    /// the report prints), or `None` without GPU figures.
    #[must_use]
    pub fn cache_config_info(&self, block_size: u32) -> Option<CacheConfigInfo> {
        let blocks = self.num_blocks?;
        let tokens = self.kv_cache_size_tokens?;
        let concurrency = Ratio::new(blocks, self.blocks_per_request)?;
        let mut info = CacheConfigInfo::new();
        info.set_capacity(tokens, concurrency);
        // Both are attributes of the family: `set` cannot refuse them.
        let _ = info.set("block_size", block_size.to_string());
        let _ = info.set("num_gpu_blocks", blocks.to_string());
        Some(info)
    }
}

/// vLLM's `int(max_concurrency * max_model_len)` with f64 arithmetic, for comparison.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "reproduces vLLM's float product on purpose"
)]
pub fn vllm_float_tokens(
    num_blocks: u64,
    max_model_len: u64,
    blocks_per_request: u64,
) -> Option<u64> {
    let mc = Ratio::new(num_blocks, blocks_per_request)?.to_f64();
    Some((mc * max_model_len as f64) as u64)
}

fn group_reports(g: &GroupedLayout, w: &Workload) -> Result<Vec<GroupReport>, ReportError> {
    (0..g.num_groups())
        .map(|i| {
            let spec = g.group_spec(i).copied();
            Ok(GroupReport {
                index: i,
                kind: g.group_kind(i).unwrap_or("?").to_owned(),
                layers: g.groups().get(i).map_or(0, |x| x.layers().len()),
                block_size: spec.map_or(0, |s| s.block_size),
                page_bytes: spec.and_then(|s| s.page_bytes().ok()).unwrap_or(0),
                group_bytes: g.group_page_bytes(i)?,
                blocks_per_request: g.group_blocks_per_request(i, w)?,
            })
        })
        .collect()
}

/// Computes the report for `args` without printing anything.
///
/// # Errors
/// [`ReportError`] naming the option or field at fault.
pub fn report(args: &CapacityOptions) -> Result<CapacityReport, ReportError> {
    let (model, source) = args
        .source
        .layout(args.block_size, args.disable_hybrid_kv_cache_manager)?;
    let pool = args.pool_layout.layout();
    let max_model_len = args.max_model_len.or(model.max_model_len).ok_or_else(|| {
        opt(
            "--max-model-len",
            "required: the layout gives no max_model_len",
        )
    })?;
    let max_num_batched_tokens = args
        .max_num_batched_tokens
        .or(model.max_num_batched_tokens)
        .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS);
    let max_concurrent_batches = args
        .max_concurrent_batches
        .or(model.max_concurrent_batches)
        .unwrap_or(1);
    let mut w = Workload::new(max_model_len, max_num_batched_tokens);
    w.max_concurrent_batches = max_concurrent_batches;
    w.validate().map_err(|e| {
        // Name the option when it gave the value, else the layout's field.
        let (option, given, field) = match e {
            WorkloadError::ZeroMaxNumBatchedTokens => (
                "--max-num-batched-tokens",
                args.max_num_batched_tokens.is_some(),
                "max_num_batched_tokens",
            ),
            WorkloadError::ZeroMaxConcurrentBatches => (
                "--max-concurrent-batches",
                args.max_concurrent_batches.is_some(),
                "max_concurrent_batches",
            ),
            _ => (
                "--max-model-len",
                args.max_model_len.is_some(),
                "max_position_embeddings",
            ),
        };
        if given {
            opt(option, "must be at least 1")
        } else {
            ReportError::Layout(LayoutError::new(
                source.field(field, option),
                format!("{e} (give {option})"),
            ))
        }
    })?;
    let workers = usize::try_from(args.workers)
        .ok()
        .filter(|&n| (1..=1024).contains(&n))
        .ok_or_else(|| opt("--workers", "must be between 1 and 1024"))?;
    if args.world_size == 0 {
        return Err(opt("--world-size", "must be at least 1"));
    }
    let (memory, cpu_bytes) = (args.memory, args.cpu_bytes);
    if memory.is_none() && args.num_gpu_blocks_override.is_none() && cpu_bytes.is_none() {
        return Err(opt(
            "--memory",
            "give --memory or --num-gpu-blocks-override for GPU figures, or --cpu-bytes for the CPU tier",
        ));
    }

    let grouped = model.grouped()?;
    let num_layers = model.num_layers();
    if workers > num_layers {
        return Err(opt(
            "--workers",
            format!(
                "{workers} pipeline workers for {num_layers} layers: every worker needs at least one layer"
            ),
        ));
    }
    let stages = grouped
        .split_pipeline(workers)
        .map_err(|e| opt("--workers", e.to_string()))?;
    let bytes_per_block = stages.first().unwrap_or(&grouped).bytes_per_block(pool)?;
    let blocks_per_request = grouped.blocks_per_request(&w)?;
    if blocks_per_request == 0 {
        return Err(ReportError::Layout(LayoutError::new(
            source.field(
                match model.shape {
                    LayoutShape::Layers(_) => "layers",
                    LayoutShape::Groups(_) => "groups",
                },
                "--model",
            ),
            "no layer keeps KV cache per request (only encoder_only layers), so a request needs 0 blocks",
        )));
    }
    let request_bytes = bytes_per_block
        .checked_mul(blocks_per_request)
        .ok_or(ReportError::RequestBytesOverflow)?;

    let gpu = if memory.is_some() || args.num_gpu_blocks_override.is_some() {
        Some(
            gpu_capacity(
                &grouped,
                &stages,
                pool,
                &w,
                memory.unwrap_or(0),
                args.num_gpu_blocks_override,
            )
            .map_err(ReportError::Gpu)?,
        )
    } else {
        None
    };

    let cpu = match cpu_bytes {
        Some(cpu_bytes) => {
            let cfg = CpuTierConfig {
                blocks_per_chunk: args.blocks_per_chunk,
                world_size: u64::from(args.world_size),
                ..CpuTierConfig::new(cpu_bytes)
            };
            let reps: Vec<_> = (0..grouped.num_groups())
                .filter_map(|g| grouped.group_spec(g).copied())
                .collect();
            let tier = size_cpu_tier(&cfg, bytes_per_block, &reps, max_model_len).map_err(|e| {
                use kvtier_core::capacity::CpuTierError;
                match e {
                    CpuTierError::ZeroBlocksPerChunk => opt("--blocks-per-chunk", e.to_string()),
                    CpuTierError::Overflow => opt(
                        "--blocks-per-chunk",
                        format!(
                            "{e}: a chunk of {} GPU block(s) of {} bytes for {} rank(s) is too large",
                            args.blocks_per_chunk, bytes_per_block, args.world_size
                        ),
                    ),
                    _ => opt("--cpu-bytes", e.to_string()),
                }
            })?;
            Some(CpuReport {
                cpu_bytes,
                blocks_per_chunk: tier.blocks_per_chunk,
                kv_bytes_per_chunk: tier.kv_bytes_per_chunk,
                aligned_chunk_bytes: tier.aligned_chunk_bytes,
                num_chunks: tier.num_chunks,
                kv_cache_size_bytes: tier.kv_cache_size_bytes,
                kv_cache_size_tokens: tier.kv_cache_size_tokens,
            })
        }
        None => None,
    };

    Ok(CapacityReport {
        model: model.name.clone(),
        num_layers,
        max_model_len,
        max_num_batched_tokens,
        max_concurrent_batches,
        workers: u64::from(args.workers),
        pool_layout: args.pool_layout.name().to_owned(),
        bytes_per_block,
        num_blocks: gpu.map(|g| g.num_blocks),
        blocks_per_request,
        request_bytes,
        max_concurrency: gpu.map(|g| g.max_concurrency.to_f64()),
        max_concurrency_exact: gpu.map(|g| g.max_concurrency.to_string()),
        kv_cache_size_tokens: gpu.map(|g| g.kv_cache_size_tokens),
        kv_cache_size_tokens_vllm: gpu
            .and_then(|g| vllm_float_tokens(g.num_blocks, max_model_len, g.blocks_per_request)),
        groups: group_reports(&grouped, &w)?,
        cpu,
    })
}
