//! One layer's KV-cache spec: its kind, its page size and the blocks one request needs.
//!
//! Mirrors vLLM 0.33.0's `kv_cache_interface.py` (`FullAttentionSpec`, `MLAAttentionSpec`,
//! `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`, `MambaSpec`, `CrossAttentionSpec`,
//! `EncoderOnlyAttentionSpec`) with `tokens_per_state = 1` and one state tensor per Mamba layer
//! given by its byte size.

use super::arith::{div_ceil, round_up};
use super::error::{CpuTierError, SizingError, SpecError, WorkloadError};

/// The kind of a layer's KV cache, with the facts that only that kind has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Full attention: a request keeps every token.
    Full,
    /// Multi-head latent attention (DeepSeek): full attention with one latent "head" and
    /// `head_size_v = 0`. Its page can be scaled but never padded during unification.
    Mla,
    /// Sliding-window attention over the last `window` tokens, keeping
    /// `extra_retained_tokens` more below the window (multi-module speculative decoding).
    SlidingWindow {
        /// Window in tokens (≥ 1).
        window: u64,
        /// Extra trailing tokens retained below the window.
        extra_retained_tokens: u64,
    },
    /// Chunked local attention (Llama 4): attention never reaches back past one chunk.
    ChunkedLocal {
        /// Chunk in tokens (≥ 1).
        chunk: u64,
    },
    /// A Mamba / linear-attention state layer.
    Mamba {
        /// Bytes of one state (the sum over state tensors of `prod(shape) · dtype bytes`).
        state_bytes: u64,
        /// Extra state blocks kept for speculative decoding.
        speculative_blocks: u64,
        /// Prefill checkpoint blocks (only counted in `mamba_cache_mode = "align"`).
        prefill_checkpoint_blocks: u64,
    },
    /// Cross attention of an encoder-decoder model: caches the encoder's tokens.
    Cross,
    /// Encoder-only attention: needs no KV cache per request.
    EncoderOnly,
}

impl LayerKind {
    /// A short lowercase name (`full`, `mla`, `sliding_window`, `chunked_local`, `mamba`,
    /// `cross`, `encoder_only`), as the layout file spells it.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Mla => "mla",
            Self::SlidingWindow { .. } => "sliding_window",
            Self::ChunkedLocal { .. } => "chunked_local",
            Self::Mamba { .. } => "mamba",
            Self::Cross => "cross",
            Self::EncoderOnly => "encoder_only",
        }
    }
}

/// The scheduler facts a per-request size depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// `L`: the longest request, in tokens (≥ 1).
    pub max_model_len: u64,
    /// Token budget of one scheduler step.
    pub max_num_batched_tokens: u64,
    /// Batches in flight at once (see [`max_concurrent_batches`]); 1 when synchronous.
    pub max_concurrent_batches: u64,
    /// Encoder tokens a cross-attention layer caches (`max_num_encoder_input_tokens`).
    pub max_encoder_tokens: u64,
    /// Decode-context-parallel size (1 = none).
    pub dcp: u64,
    /// `mamba_cache_mode = "align"`.
    pub mamba_align: bool,
}

impl Workload {
    /// A synchronous, single-batch workload without DCP or encoder.
    #[must_use]
    pub const fn new(max_model_len: u64, max_num_batched_tokens: u64) -> Self {
        Self {
            max_model_len,
            max_num_batched_tokens,
            max_concurrent_batches: 1,
            max_encoder_tokens: 0,
            dcp: 1,
            mamba_align: false,
        }
    }

    /// `T_inflight = max_concurrent_batches · max_num_batched_tokens`.
    ///
    /// # Errors
    /// [`SizingError::Overflow`] when the product does not fit in `u64`.
    pub const fn inflight_tokens(&self) -> Result<u64, SizingError> {
        match self
            .max_concurrent_batches
            .checked_mul(self.max_num_batched_tokens)
        {
            Some(t) => Ok(t),
            None => Err(SizingError::Overflow),
        }
    }

    /// Checks what vLLM's scheduler requires of these facts: `max_model_len`,
    /// `max_num_batched_tokens`, `max_concurrent_batches` and `dcp` at least 1. The sizing
    /// methods accept a zero token budget (a window then retains `W − 1` tokens); callers that
    /// take these facts from a user check them here first.
    ///
    /// ```
    /// use kvtier_core::capacity::{Workload, WorkloadError};
    /// assert_eq!(Workload::new(8192, 2048).validate(), Ok(()));
    /// assert_eq!(Workload::new(8192, 0).validate(), Err(WorkloadError::ZeroMaxNumBatchedTokens));
    /// ```
    ///
    /// # Errors
    /// The first [`WorkloadError`] found, in field order.
    pub const fn validate(&self) -> Result<(), WorkloadError> {
        if self.max_model_len == 0 {
            Err(WorkloadError::ZeroMaxModelLen)
        } else if self.max_num_batched_tokens == 0 {
            Err(WorkloadError::ZeroMaxNumBatchedTokens)
        } else if self.max_concurrent_batches == 0 {
            Err(WorkloadError::ZeroMaxConcurrentBatches)
        } else if self.dcp == 0 {
            Err(WorkloadError::ZeroDcp)
        } else {
            Ok(())
        }
    }

    /// The same workload with another `max_model_len`.
    #[must_use]
    pub const fn with_max_model_len(mut self, max_model_len: u64) -> Self {
        self.max_model_len = max_model_len;
        self
    }
}

/// vLLM's `max_concurrent_batches`: `pp + 1` with async scheduling on model runner V2, 2 with
/// async scheduling and `pp ≤ 1` on V1, `pp` otherwise (saturating).
#[must_use]
pub const fn max_concurrent_batches(pp: u64, async_scheduling: bool, runner_v2: bool) -> u64 {
    if async_scheduling && runner_v2 {
        pp.saturating_add(1)
    } else if async_scheduling && pp <= 1 {
        2
    } else {
        pp
    }
}

/// The KV-cache spec of one layer.
///
/// Build with [`LayerSpec::attention`] or [`LayerSpec::mamba`], then set the optional public
/// fields. Checked by [`LayerSpec::validate`] (every computing method checks what it needs).
///
/// ```
/// use kvtier_core::capacity::{LayerKind, LayerSpec};
/// // Block 16, 2 KV heads, head 64, fp32.
/// let spec = LayerSpec::attention(LayerKind::Full, 16, 2, 64, 4);
/// assert_eq!(spec.page_bytes(), Ok(16_384));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerSpec {
    /// The kind and its own facts.
    pub kind: LayerKind,
    /// Tokens per block (≥ 1).
    pub block_size: u64,
    /// KV heads on this worker (attention kinds; 1 for MLA).
    pub num_kv_heads: u64,
    /// Key head size (for MLA: `kv_lora_rank + qk_rope_head_dim`).
    pub head_size: u64,
    /// Value head size (`head_size` by default; 0 for MLA).
    pub head_size_v: u64,
    /// Bytes per element of the cache dtype.
    pub dtype_bytes: u64,
    /// Page size to use instead of the computed one; must be ≥ it.
    pub page_size_padded: Option<u64>,
    /// Bytes the stride between physical blocks must be a multiple of (1 = none).
    pub stride_alignment: u64,
}

impl LayerSpec {
    /// An attention layer (every kind but Mamba). `head_size_v` is `head_size`, or 0 for
    /// [`LayerKind::Mla`].
    #[must_use]
    pub const fn attention(
        kind: LayerKind,
        block_size: u64,
        num_kv_heads: u64,
        head_size: u64,
        dtype_bytes: u64,
    ) -> Self {
        let head_size_v = match kind {
            LayerKind::Mla => 0,
            _ => head_size,
        };
        Self {
            kind,
            block_size,
            num_kv_heads,
            head_size,
            head_size_v,
            dtype_bytes,
            page_size_padded: None,
            stride_alignment: 1,
        }
    }

    /// A Mamba layer whose state takes `state_bytes`.
    #[must_use]
    pub const fn mamba(block_size: u64, state_bytes: u64) -> Self {
        Self {
            kind: LayerKind::Mamba {
                state_bytes,
                speculative_blocks: 0,
                prefill_checkpoint_blocks: 0,
            },
            block_size,
            num_kv_heads: 0,
            head_size: 0,
            head_size_v: 0,
            dtype_bytes: 0,
            page_size_padded: None,
            stride_alignment: 1,
        }
    }

    /// Checks every fact and the page size.
    ///
    /// # Errors
    /// The first [`SpecError`] found.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.block_size == 0 {
            return Err(SpecError::ZeroBlockSize);
        }
        if self.stride_alignment == 0 {
            return Err(SpecError::ZeroStrideAlignment);
        }
        match self.kind {
            LayerKind::SlidingWindow { window: 0, .. } => return Err(SpecError::ZeroWindow),
            LayerKind::ChunkedLocal { chunk: 0 } => return Err(SpecError::ZeroChunk),
            _ => {}
        }
        self.page_bytes().map(|_| ())
    }

    /// The page without padding: `num_kv_heads · block_size · (head_size + head_size_v) ·
    /// dtype_bytes` for attention, the state bytes for Mamba.
    ///
    /// # Errors
    /// A zero factor or [`SpecError::Overflow`].
    pub fn unpadded_page_bytes(&self) -> Result<u64, SpecError> {
        if let LayerKind::Mamba { state_bytes, .. } = self.kind {
            return if state_bytes == 0 {
                Err(SpecError::ZeroStateBytes)
            } else {
                Ok(state_bytes)
            };
        }
        if self.block_size == 0 {
            return Err(SpecError::ZeroBlockSize);
        }
        if self.num_kv_heads == 0 {
            return Err(SpecError::ZeroKvHeads);
        }
        if self.dtype_bytes == 0 {
            return Err(SpecError::ZeroDtypeBytes);
        }
        let head = self
            .head_size
            .checked_add(self.head_size_v)
            .ok_or(SpecError::Overflow)?;
        if head == 0 {
            return Err(SpecError::ZeroHeadSize);
        }
        self.num_kv_heads
            .checked_mul(self.block_size)
            .and_then(|x| x.checked_mul(head))
            .and_then(|x| x.checked_mul(self.dtype_bytes))
            .ok_or(SpecError::Overflow)
    }

    /// Bytes of one block of this layer: `page_size_padded` when set, else the unpadded page.
    ///
    /// # Errors
    /// As [`unpadded_page_bytes`](Self::unpadded_page_bytes), or
    /// [`SpecError::PaddedTooSmall`].
    pub fn page_bytes(&self) -> Result<u64, SpecError> {
        let unpadded = self.unpadded_page_bytes()?;
        match self.page_size_padded {
            Some(padded) if padded < unpadded => {
                Err(SpecError::PaddedTooSmall { padded, unpadded })
            }
            Some(padded) => Ok(padded),
            None => Ok(unpadded),
        }
    }

    /// The page rounded up to the stride alignment (a layer-outermost block stride).
    ///
    /// # Errors
    /// As [`page_bytes`](Self::page_bytes), or a zero alignment / overflow.
    pub fn stride_bytes(&self) -> Result<u64, SpecError> {
        if self.stride_alignment == 0 {
            return Err(SpecError::ZeroStrideAlignment);
        }
        round_up(self.page_bytes()?, self.stride_alignment).ok_or(SpecError::Overflow)
    }

    /// Blocks one request of `w.max_model_len` tokens holds at most in this layer's group
    /// (`cdiv(max_memory_usage_bytes, page)`):
    ///
    /// | kind | blocks |
    /// |---|---|
    /// | full, MLA | `cdiv(L′, block)`, `L′ = cdiv(L, dcp)` when `dcp > 1` |
    /// | sliding window W, extra e | `cdiv(min(W − 1 + e + T_inflight, L), block) + 1` |
    /// | chunked local C | `cdiv(min(C + T_inflight, L), block)` |
    /// | Mamba | `1 + spec`, or `2 + spec + checkpoints` when aligned |
    /// | cross | `cdiv(max_encoder_tokens, block)` |
    /// | encoder-only | 0 |
    ///
    /// # Errors
    /// [`SizingError`] on `L = 0`, `dcp = 0`, a zero block size or a zero window (as
    /// [`SizingError::Spec`]), or overflow.
    pub fn blocks_per_request_ceil(&self, w: &Workload) -> Result<u64, SizingError> {
        if w.max_model_len == 0 {
            return Err(SizingError::ZeroMaxModelLen);
        }
        if w.dcp == 0 {
            return Err(SizingError::ZeroDcp);
        }
        let block = self.block_size;
        let cdiv_block = |tokens: u64| {
            div_ceil(tokens, block).ok_or(SizingError::Spec(SpecError::ZeroBlockSize))
        };
        let l = w.max_model_len;
        match self.kind {
            LayerKind::Full | LayerKind::Mla => {
                let len = if w.dcp > 1 {
                    div_ceil(l, w.dcp).ok_or(SizingError::ZeroDcp)?
                } else {
                    l
                };
                cdiv_block(len)
            }
            LayerKind::SlidingWindow {
                window,
                extra_retained_tokens,
            } => {
                let retained = window
                    .checked_sub(1)
                    .ok_or(SizingError::Spec(SpecError::ZeroWindow))?
                    .checked_add(extra_retained_tokens)
                    .and_then(|x| x.checked_add(w.inflight_tokens().ok()?))
                    .ok_or(SizingError::Overflow)?;
                cdiv_block(retained.min(l))?
                    .checked_add(1)
                    .ok_or(SizingError::Overflow)
            }
            LayerKind::ChunkedLocal { chunk } => {
                if chunk == 0 {
                    return Err(SizingError::Spec(SpecError::ZeroChunk));
                }
                let held = chunk
                    .checked_add(w.inflight_tokens()?)
                    .ok_or(SizingError::Overflow)?;
                cdiv_block(held.min(l))
            }
            LayerKind::Mamba {
                speculative_blocks,
                prefill_checkpoint_blocks,
                ..
            } => {
                let sum = if w.mamba_align {
                    2u64.checked_add(speculative_blocks)
                        .and_then(|x| x.checked_add(prefill_checkpoint_blocks))
                } else {
                    1u64.checked_add(speculative_blocks)
                };
                sum.ok_or(SizingError::Overflow)
            }
            LayerKind::Cross => cdiv_block(w.max_encoder_tokens),
            LayerKind::EncoderOnly => Ok(0),
        }
    }

    /// vLLM's `max_memory_usage_bytes`: [`blocks_per_request_ceil`](Self::blocks_per_request_ceil)
    /// times the page.
    ///
    /// # Errors
    /// As `blocks_per_request_ceil`, an invalid page, or overflow.
    pub fn max_memory_bytes(&self, w: &Workload) -> Result<u64, SizingError> {
        let page = self.page_bytes().map_err(SizingError::Spec)?;
        self.blocks_per_request_ceil(w)?
            .checked_mul(page)
            .ok_or(SizingError::Overflow)
    }

    /// The CPU tier's window cap for this layer's group, in chunks of `tokens_per_chunk` tokens:
    /// `max(cdiv(W, tc), cdiv(W − 1 + e, tc))` for a sliding window, `cdiv(C, tc)` for chunked
    /// local attention, 1 for Mamba, `None` (no cap) otherwise.
    ///
    /// # Errors
    /// [`CpuTierError::Overflow`] on `tokens_per_chunk = 0` or overflow.
    pub fn window_cap_chunks(&self, tokens_per_chunk: u64) -> Result<Option<u64>, CpuTierError> {
        let cdiv = |t: u64| div_ceil(t, tokens_per_chunk).ok_or(CpuTierError::Overflow);
        match self.kind {
            LayerKind::SlidingWindow {
                window,
                extra_retained_tokens,
            } => {
                let retained = window
                    .saturating_sub(1)
                    .checked_add(extra_retained_tokens)
                    .ok_or(CpuTierError::Overflow)?;
                Ok(Some(cdiv(window)?.max(cdiv(retained)?)))
            }
            LayerKind::ChunkedLocal { chunk } => Ok(Some(cdiv(chunk)?)),
            LayerKind::Mamba { .. } => Ok(Some(1)),
            LayerKind::Full | LayerKind::Mla | LayerKind::Cross | LayerKind::EncoderOnly => {
                Ok(None)
            }
        }
    }

    /// The class that decides whether layers can share one group of "uniform type" (same
    /// number of token slots per request): same block size and same kind, with the same
    /// window / chunk / Mamba facts. Full and MLA are one class.
    #[must_use]
    pub(crate) fn same_type_as(&self, other: &Self) -> bool {
        if self.block_size != other.block_size {
            return false;
        }
        match (self.kind, other.kind) {
            (LayerKind::Full | LayerKind::Mla, LayerKind::Full | LayerKind::Mla) => true,
            (
                LayerKind::SlidingWindow { window: a, .. },
                LayerKind::SlidingWindow { window: b, .. },
            ) => a == b,
            (LayerKind::ChunkedLocal { chunk: a }, LayerKind::ChunkedLocal { chunk: b }) => a == b,
            (
                LayerKind::Mamba {
                    speculative_blocks: s1,
                    prefill_checkpoint_blocks: c1,
                    ..
                },
                LayerKind::Mamba {
                    speculative_blocks: s2,
                    prefill_checkpoint_blocks: c2,
                    ..
                },
            ) => s1 == s2 && c1 == c2 && self.page_bytes().ok() == other.page_bytes().ok(),
            (LayerKind::Cross, LayerKind::Cross)
            | (LayerKind::EncoderOnly, LayerKind::EncoderOnly) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn workload_validate_names_the_zero_fact() {
        let ok = Workload::new(8192, 2048);
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(
            Workload::new(0, 2048).validate(),
            Err(WorkloadError::ZeroMaxModelLen)
        );
        assert_eq!(
            Workload::new(8192, 0).validate(),
            Err(WorkloadError::ZeroMaxNumBatchedTokens)
        );
        let mut w = ok;
        w.max_concurrent_batches = 0;
        assert_eq!(w.validate(), Err(WorkloadError::ZeroMaxConcurrentBatches));
        assert_eq!(
            WorkloadError::ZeroMaxConcurrentBatches.to_string(),
            "max_concurrent_batches must be at least 1"
        );
        let mut w = ok;
        w.dcp = 0;
        assert_eq!(w.validate(), Err(WorkloadError::ZeroDcp));
    }
}
