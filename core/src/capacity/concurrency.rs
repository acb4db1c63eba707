//! Max concurrency as an exact ratio and the KV cache size in tokens.
//!
//! vLLM 0.33.0 computes `max_concurrency = num_blocks / blocks_per_request` as a float and
//! `kv_cache_size_tokens = int(max_concurrency · L)`. kvtier keeps the ratio exact (reduced
//! `num/den`) and the token count as the exact floor `⌊num_blocks · L / blocks_per_request⌋`.
//! The two differ when the float quotient rounds down and the product lands just below an
//! integer: e.g. 29 blocks, 100 blocks per request, L = 100 gives exactly 29 tokens, but
//! `29/100` is `0.28999…` in binary and `0.29 · 100 = 28.999999999999996`, so vLLM reports 28.

use super::arith::mul_div_floor;
use super::blocks::{PoolError, PoolLayout, pool_blocks};
use super::error::{ConcurrencyError, SizingError};
use super::grouping::GroupedLayout;
use super::spec::Workload;
use crate::ratio::Ratio;

/// `num_blocks / blocks_per_request`, exact.
///
/// # Errors
/// [`ConcurrencyError::ZeroBlocksPerRequest`].
pub const fn max_concurrency(
    num_blocks: u64,
    blocks_per_request: u64,
) -> Result<Ratio, ConcurrencyError> {
    match Ratio::new(num_blocks, blocks_per_request) {
        Some(r) => Ok(r),
        None => Err(ConcurrencyError::ZeroBlocksPerRequest),
    }
}

/// `⌊num_blocks · L / blocks_per_request⌋`: the tokens the pool holds for requests of `L`
/// tokens.
///
/// # Errors
/// [`ConcurrencyError::ZeroBlocksPerRequest`] or [`ConcurrencyError::Overflow`].
pub fn kv_cache_size_tokens_floor(
    num_blocks: u64,
    max_model_len: u64,
    blocks_per_request: u64,
) -> Result<u64, ConcurrencyError> {
    if blocks_per_request == 0 {
        return Err(ConcurrencyError::ZeroBlocksPerRequest);
    }
    mul_div_floor(num_blocks, max_model_len, blocks_per_request).ok_or(ConcurrencyError::Overflow)
}

/// The GPU figures vLLM logs and puts in `vllm:cache_config_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCapacity {
    /// Bytes per pool block on worker 0.
    pub bytes_per_block: u64,
    /// Blocks in the pool (minimum across workers, the null block included): `num_gpu_blocks`.
    pub num_blocks: u64,
    /// Blocks one request of `L` tokens needs, summed over groups.
    pub blocks_per_request: u64,
    /// `num_blocks / blocks_per_request`.
    pub max_concurrency: Ratio,
    /// `⌊num_blocks · L / blocks_per_request⌋`.
    pub kv_cache_size_tokens: u64,
}

/// Why [`gpu_capacity`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuCapacityError {
    /// Sizing the pool (blocks or admission) failed.
    Pool(PoolError),
    /// Sizing a request failed.
    Sizing(SizingError),
    /// The ratio or the token count failed.
    Concurrency(ConcurrencyError),
}

impl core::fmt::Display for GpuCapacityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Pool(e) => write!(f, "{e}"),
            Self::Sizing(e) => write!(f, "{e}"),
            Self::Concurrency(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for GpuCapacityError {}

/// Everything at once: per-worker blocks and admission (`workers` are the pipeline stages' views,
/// e.g. from [`GroupedLayout::split_pipeline`]; pass `core::slice::from_ref(&layout)` for one
/// worker), the minimum across workers, then per-request blocks from `layout`, the exact max
/// concurrency and the KV cache size in tokens.
///
/// ```
/// use kvtier_core::capacity::{gpu_capacity, GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload};
/// let spec = LayerSpec::attention(LayerKind::Full, 16, 2, 64, 4); // page 16 384
/// let layout = GroupedLayout::from_layers(&[spec, spec])?;
/// let w = Workload::new(128, 2048);
/// let cap = gpu_capacity(&layout, core::slice::from_ref(&layout), PoolLayout::LayerOutermost, &w, 2 * 32 * 16_384, None)?;
/// assert_eq!(cap.num_blocks, 32);
/// assert_eq!(cap.blocks_per_request, 8);
/// assert_eq!((cap.max_concurrency.num(), cap.max_concurrency.den()), (4, 1));
/// assert_eq!(cap.kv_cache_size_tokens, 512);
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
///
/// # Errors
/// [`GpuCapacityError`].
pub fn gpu_capacity(
    layout: &GroupedLayout,
    workers: &[GroupedLayout],
    pool: PoolLayout,
    w: &Workload,
    available: u64,
    num_gpu_blocks_override: Option<u64>,
) -> Result<GpuCapacity, GpuCapacityError> {
    let (num_blocks, per_worker) =
        pool_blocks(workers, pool, w, available, num_gpu_blocks_override)
            .map_err(GpuCapacityError::Pool)?;
    let bytes_per_block = per_worker.first().map_or(0, |wb| wb.bytes_per_block);
    let blocks_per_request = layout
        .blocks_per_request(w)
        .map_err(GpuCapacityError::Sizing)?;
    let max_concurrency =
        max_concurrency(num_blocks, blocks_per_request).map_err(GpuCapacityError::Concurrency)?;
    let kv_cache_size_tokens =
        kv_cache_size_tokens_floor(num_blocks, w.max_model_len, blocks_per_request)
            .map_err(GpuCapacityError::Concurrency)?;
    Ok(GpuCapacity {
        bytes_per_block,
        num_blocks,
        blocks_per_request,
        max_concurrency,
        kv_cache_size_tokens,
    })
}
