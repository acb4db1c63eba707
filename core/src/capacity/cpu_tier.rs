//! Sizing the CPU offload tier (vLLM 0.33.0 `kv_offload/cpu/spec.py`, `cpu/common.py`,
//! connector `offloading/config.py`) and the facts of `vllm:kv_offload_config_info`.
//!
//! * `kv_bytes_per_chunk = worker_kv_bytes_per_block · copies · blocks_per_chunk`, with
//!   `copies = 1` for the replicated (single-copy MLA) layout, else `world_size`;
//! * `aligned_chunk = round_up(kv_bytes_per_chunk, page_alignment)`;
//! * `num_chunks = ⌊cpu_bytes / aligned_chunk⌋`, 0 when `worker_kv_bytes_per_block = 0` or
//!   `world_size = 0` (a legal zero-capacity tier);
//! * tokens at `L`: `⌊num_chunks · L / Σ_g min(cdiv(L, t_g · b), w_g)⌋` where `w_g` is the
//!   group's window cap in chunks ([`LayerSpec::window_cap_chunks`]); `None` when there is no
//!   group or `L = 0`.
//!
//! Cross-attention and encoder-only groups count as uncapped (vLLM 0.33.0 asserts that such a
//! group is full attention).

use super::arith::{div_ceil, mul_div_floor, round_up};
use super::error::CpuTierError;
use super::spec::LayerSpec;
use crate::stats::CpuTierInfo;

/// The OS page size vLLM aligns CPU chunks to (`mmap.PAGESIZE`, normally 4096).
pub const DEFAULT_PAGE_ALIGNMENT: u64 = 4096;

/// The CPU tier's configuration (`kv_connector_extra_config` plus the parallel layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTierConfig {
    /// `cpu_bytes_to_use`: the tier's size across all ranks (≥ 1).
    pub cpu_bytes: u64,
    /// GPU blocks per offloaded chunk (≥ 1; default 1).
    pub blocks_per_chunk: u64,
    /// Ranks whose blocks one chunk holds (default 1).
    pub world_size: u64,
    /// The replicated single-copy MLA layout (one copy instead of `world_size`).
    pub replicated: bool,
    /// Chunk alignment in bytes (default [`DEFAULT_PAGE_ALIGNMENT`]).
    pub page_alignment: u64,
}

impl CpuTierConfig {
    /// A tier of `cpu_bytes` with one block per chunk, one rank, page-aligned chunks.
    #[must_use]
    pub const fn new(cpu_bytes: u64) -> Self {
        Self {
            cpu_bytes,
            blocks_per_chunk: 1,
            world_size: 1,
            replicated: false,
            page_alignment: DEFAULT_PAGE_ALIGNMENT,
        }
    }
}

/// The CPU tier's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTier {
    /// Bytes of one chunk before alignment (0 for a zero-capacity tier).
    pub kv_bytes_per_chunk: u64,
    /// Bytes of one chunk slot, padding included (0 for a zero-capacity tier).
    pub aligned_chunk_bytes: u64,
    /// Chunk slots.
    pub num_chunks: u64,
    /// `num_chunks · aligned_chunk_bytes`.
    pub kv_cache_size_bytes: u64,
    /// Tokens held for requests of `L` tokens, `None` as vLLM reports it.
    pub kv_cache_size_tokens: Option<u64>,
    /// GPU blocks per chunk.
    pub blocks_per_chunk: u64,
}

impl CpuTier {
    /// The `vllm:kv_offload_config_info` facts.
    #[must_use]
    pub const fn config_info(&self) -> CpuTierInfo {
        CpuTierInfo {
            num_chunks: self.num_chunks,
            blocks_per_chunk: self.blocks_per_chunk,
            kv_cache_size_bytes: Some(self.kv_cache_size_bytes),
            kv_cache_size_tokens: self.kv_cache_size_tokens,
        }
    }
}

/// Sizes the CPU tier. `worker_kv_bytes_per_block` is one GPU worker's bytes per pool block;
/// `groups` holds one representative spec per offloaded group (its `block_size` is the group's
/// tokens per block).
///
/// ```
/// use kvtier_core::capacity::{size_cpu_tier, CpuTierConfig, LayerKind, LayerSpec};
/// let full = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
/// let tier = size_cpu_tier(&CpuTierConfig::new(1 << 30), 131_072 * 32, &[full], 8192)?;
/// assert_eq!(tier.num_chunks, 256);
/// assert_eq!(tier.kv_cache_size_tokens, Some(4096));
/// # Ok::<(), kvtier_core::capacity::CpuTierError>(())
/// ```
///
/// # Errors
/// [`CpuTierError`] on zero `cpu_bytes`, `blocks_per_chunk` or page alignment, a group with 0
/// tokens per block, or overflow.
pub fn size_cpu_tier(
    cfg: &CpuTierConfig,
    worker_kv_bytes_per_block: u64,
    groups: &[LayerSpec],
    max_model_len: u64,
) -> Result<CpuTier, CpuTierError> {
    if cfg.cpu_bytes == 0 {
        return Err(CpuTierError::NoCpuBytes);
    }
    if cfg.blocks_per_chunk == 0 {
        return Err(CpuTierError::ZeroBlocksPerChunk);
    }
    if cfg.page_alignment == 0 {
        return Err(CpuTierError::ZeroPageAlignment);
    }
    let (mut kv_bytes_per_chunk, mut aligned_chunk_bytes, mut num_chunks) = (0, 0, 0);
    if worker_kv_bytes_per_block > 0 && cfg.world_size > 0 {
        let copies = if cfg.replicated { 1 } else { cfg.world_size };
        kv_bytes_per_chunk = worker_kv_bytes_per_block
            .checked_mul(copies)
            .and_then(|x| x.checked_mul(cfg.blocks_per_chunk))
            .ok_or(CpuTierError::Overflow)?;
        aligned_chunk_bytes =
            round_up(kv_bytes_per_chunk, cfg.page_alignment).ok_or(CpuTierError::Overflow)?;
        num_chunks = cfg.cpu_bytes / aligned_chunk_bytes;
    }
    let kv_cache_size_bytes = num_chunks
        .checked_mul(aligned_chunk_bytes)
        .ok_or(CpuTierError::Overflow)?;
    let kv_cache_size_tokens =
        cpu_tokens_floor(num_chunks, cfg.blocks_per_chunk, groups, max_model_len)?;
    Ok(CpuTier {
        kv_bytes_per_chunk,
        aligned_chunk_bytes,
        num_chunks,
        kv_cache_size_bytes,
        kv_cache_size_tokens,
        blocks_per_chunk: cfg.blocks_per_chunk,
    })
}

/// Chunks one request of `L` tokens occupies: `Σ_g min(cdiv(L, t_g · b), w_g)`.
///
/// # Errors
/// [`CpuTierError::ZeroTokensPerBlock`], [`CpuTierError::ZeroBlocksPerChunk`] or overflow.
pub fn chunks_per_request_ceil(
    groups: &[LayerSpec],
    blocks_per_chunk: u64,
    max_model_len: u64,
) -> Result<u64, CpuTierError> {
    if blocks_per_chunk == 0 {
        return Err(CpuTierError::ZeroBlocksPerChunk);
    }
    let mut total = 0u64;
    for (group, spec) in groups.iter().enumerate() {
        if spec.block_size == 0 {
            return Err(CpuTierError::ZeroTokensPerBlock { group });
        }
        let tokens_per_chunk = spec
            .block_size
            .checked_mul(blocks_per_chunk)
            .ok_or(CpuTierError::Overflow)?;
        let full = div_ceil(max_model_len, tokens_per_chunk).ok_or(CpuTierError::Overflow)?;
        let chunks = match spec.window_cap_chunks(tokens_per_chunk)? {
            Some(cap) => full.min(cap),
            None => full,
        };
        total = total.checked_add(chunks).ok_or(CpuTierError::Overflow)?;
    }
    Ok(total)
}

/// `⌊num_chunks · L / chunks_per_request⌋`, `None` when `L = 0` or there is no group.
///
/// # Errors
/// As [`chunks_per_request_ceil`].
pub fn cpu_tokens_floor(
    num_chunks: u64,
    blocks_per_chunk: u64,
    groups: &[LayerSpec],
    max_model_len: u64,
) -> Result<Option<u64>, CpuTierError> {
    if max_model_len == 0 || groups.is_empty() {
        return Ok(None);
    }
    let per_request = chunks_per_request_ceil(groups, blocks_per_chunk, max_model_len)?;
    // per_request ≥ 1: L ≥ 1 makes every cdiv ≥ 1 and every cap ≥ 1 for a valid spec; a zero
    // (invalid spec with window 0 / chunk 0) is reported as overflow rather than divided by.
    mul_div_floor(num_chunks, max_model_len, per_request)
        .map(Some)
        .ok_or(CpuTierError::Overflow)
}
