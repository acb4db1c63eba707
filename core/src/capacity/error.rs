//! The error enums of the capacity operations, one per operation.

use core::fmt;

/// A layer spec that cannot describe a real KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecError {
    /// `block_size` is 0.
    ZeroBlockSize,
    /// `num_kv_heads` is 0 for an attention layer.
    ZeroKvHeads,
    /// `head_size + head_size_v` is 0 for an attention layer.
    ZeroHeadSize,
    /// `dtype_bytes` is 0 for an attention layer.
    ZeroDtypeBytes,
    /// The sliding window is 0 tokens.
    ZeroWindow,
    /// The chunked-local attention chunk is 0 tokens.
    ZeroChunk,
    /// A Mamba layer has 0 state bytes.
    ZeroStateBytes,
    /// `stride_alignment` is 0.
    ZeroStrideAlignment,
    /// `page_size_padded` is smaller than the unpadded page.
    PaddedTooSmall {
        /// The padded page asked for.
        padded: u64,
        /// The page the shape needs.
        unpadded: u64,
    },
    /// The page size does not fit in `u64`.
    Overflow,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBlockSize => f.write_str("block_size must be at least 1"),
            Self::ZeroKvHeads => f.write_str("num_kv_heads must be at least 1"),
            Self::ZeroHeadSize => f.write_str("head_size + head_size_v must be at least 1"),
            Self::ZeroDtypeBytes => f.write_str("dtype_bytes must be at least 1"),
            Self::ZeroWindow => f.write_str("window must be at least 1 token"),
            Self::ZeroChunk => f.write_str("chunk must be at least 1 token"),
            Self::ZeroStateBytes => f.write_str("state_bytes must be at least 1"),
            Self::ZeroStrideAlignment => f.write_str("stride_alignment must be at least 1"),
            Self::PaddedTooSmall { padded, unpadded } => write!(
                f,
                "page_size_padded {padded} is smaller than the unpadded page {unpadded}"
            ),
            Self::Overflow => f.write_str("page size overflows u64"),
        }
    }
}

impl core::error::Error for SpecError {}

/// Grouping layers into KV-cache groups failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupingError {
    /// Layer `layer` (0-based) has an invalid spec.
    Spec {
        /// Index of the layer.
        layer: usize,
        /// What is wrong with it.
        error: SpecError,
    },
    /// More than [`MAX_LAYERS`](super::MAX_LAYERS) layers.
    TooManyLayers,
    /// An explicit group has no layers.
    EmptyGroup {
        /// Index of the group.
        group: usize,
    },
    /// Layer `layer`'s page cannot be unified with the largest page (an MLA layer whose page does
    /// not divide it; vLLM raises `NotImplementedError`).
    NotUnifiable {
        /// Index of the layer.
        layer: usize,
    },
    /// A scaled block size or padded page overflows.
    Overflow,
}

impl fmt::Display for GroupingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spec { layer, error } => write!(f, "layer {layer}: {error}"),
            Self::TooManyLayers => write!(f, "more than {} layers", super::MAX_LAYERS),
            Self::EmptyGroup { group } => write!(f, "group {group} has no layers"),
            Self::NotUnifiable { layer } => write!(
                f,
                "layer {layer}: page size does not divide the largest page and MLA pages cannot be padded"
            ),
            Self::Overflow => f.write_str("page unification overflows u64"),
        }
    }
}

impl core::error::Error for GroupingError {}

/// A [`Workload`](super::Workload) that no vLLM scheduler accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkloadError {
    /// `max_model_len` is 0.
    ZeroMaxModelLen,
    /// `max_num_batched_tokens` is 0 (vLLM's scheduler config requires at least 1).
    ZeroMaxNumBatchedTokens,
    /// `max_concurrent_batches` is 0: no batch would ever run.
    ZeroMaxConcurrentBatches,
    /// The decode-context-parallel size is 0.
    ZeroDcp,
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroMaxModelLen => "max_model_len must be at least 1",
            Self::ZeroMaxNumBatchedTokens => "max_num_batched_tokens must be at least 1",
            Self::ZeroMaxConcurrentBatches => "max_concurrent_batches must be at least 1",
            Self::ZeroDcp => "decode context parallel size must be at least 1",
        })
    }
}

impl core::error::Error for WorkloadError {}

/// Local-attention layers could not be allocated as full attention
/// ([`promote_local_layers`](super::promote_local_layers)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PromotionError {
    /// Layer `layer` is a Mamba layer: vLLM 0.33.0 needs its hybrid KV-cache manager for those.
    StateLayer {
        /// Index of the layer.
        layer: usize,
    },
    /// After promotion the layers are still of more than one type (e.g. sliding and chunked
    /// layers without a full one); vLLM raises "Failed to promote local KV cache specs".
    NotOneType,
    /// A promoted padded page overflows.
    Overflow,
}

impl fmt::Display for PromotionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StateLayer { layer } => write!(
                f,
                "layer {layer} is a Mamba layer, which needs the hybrid KV-cache manager"
            ),
            Self::NotOneType => f.write_str(
                "the layers cannot be allocated as one KV-cache type without the hybrid KV-cache manager",
            ),
            Self::Overflow => f.write_str("a promoted page overflows u64"),
        }
    }
}

impl core::error::Error for PromotionError {}

/// A per-request size (blocks, bytes) could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizingError {
    /// `max_model_len` is 0.
    ZeroMaxModelLen,
    /// The decode-context-parallel size is 0.
    ZeroDcp,
    /// A layer spec is invalid.
    Spec(SpecError),
    /// The result does not fit in `u64`.
    Overflow,
}

impl fmt::Display for SizingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroMaxModelLen => f.write_str("max_model_len must be at least 1"),
            Self::ZeroDcp => f.write_str("decode context parallel size must be at least 1"),
            Self::Spec(e) => write!(f, "{e}"),
            Self::Overflow => f.write_str("per-request size overflows u64"),
        }
    }
}

impl core::error::Error for SizingError {}

/// The number of pool blocks could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlocksError {
    /// Bytes per block is 0 (every page is empty), so memory cannot be divided into blocks.
    ZeroBytesPerBlock,
    /// No worker was given.
    NoWorkers,
    /// `override · bytes_per_block` does not fit in `u64`.
    Overflow,
}

impl fmt::Display for BlocksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBytesPerBlock => f.write_str("bytes per block is 0"),
            Self::NoWorkers => f.write_str("at least one worker is needed"),
            Self::Overflow => f.write_str("override times bytes per block overflows u64"),
        }
    }
}

impl core::error::Error for BlocksError {}

/// The admission check ("can one request of `max_model_len` tokens fit?") failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionError {
    /// Nothing is left once the null block is reserved (vLLM: "No available memory for the cache
    /// blocks").
    NoMemory {
        /// The memory given.
        available: u64,
        /// One pool block, reserved for the null block.
        bytes_per_block: u64,
    },
    /// One request of `max_model_len` tokens needs more than the memory left.
    TooLong {
        /// Bytes one request needs.
        needed: u64,
        /// Bytes left after reserving the null block.
        available: u64,
        /// The length asked for.
        max_model_len: u64,
        /// The largest length that fits (binary search as vLLM); 0 if not even one token fits.
        max_fitting_len: u64,
    },
    /// Sizing a request failed.
    Sizing(SizingError),
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoMemory {
                available,
                bytes_per_block,
            } => write!(
                f,
                "no available memory for the cache blocks: {available} bytes leave nothing after reserving the null block ({bytes_per_block} bytes)"
            ),
            Self::TooLong {
                needed,
                available,
                max_model_len,
                max_fitting_len,
            } => {
                write!(
                    f,
                    "one request of max_model_len {max_model_len} needs {needed} bytes of KV cache, more than the {available} bytes available"
                )?;
                if *max_fitting_len > 0 {
                    write!(
                        f,
                        "; the estimated maximum model length is {max_fitting_len}"
                    )?;
                }
                Ok(())
            }
            Self::Sizing(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for AdmissionError {}

impl From<SizingError> for AdmissionError {
    fn from(e: SizingError) -> Self {
        Self::Sizing(e)
    }
}

/// Max concurrency or KV cache size in tokens could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyError {
    /// No request needs any block (no device group, or only encoder-only layers): the ratio
    /// has a zero denominator (vLLM divides by zero).
    ZeroBlocksPerRequest,
    /// Sizing a request failed.
    Sizing(SizingError),
    /// The token count does not fit in `u64`.
    Overflow,
}

impl fmt::Display for ConcurrencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBlocksPerRequest => f.write_str("a request needs 0 blocks"),
            Self::Sizing(e) => write!(f, "{e}"),
            Self::Overflow => f.write_str("KV cache size in tokens overflows u64"),
        }
    }
}

impl core::error::Error for ConcurrencyError {}

impl From<SizingError> for ConcurrencyError {
    fn from(e: SizingError) -> Self {
        Self::Sizing(e)
    }
}

/// The CPU tier could not be sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuTierError {
    /// `cpu_bytes_to_use` is 0 (vLLM: "cpu_bytes_to_use must be specified").
    NoCpuBytes,
    /// `blocks_per_chunk` is 0.
    ZeroBlocksPerChunk,
    /// The OS page alignment is 0.
    ZeroPageAlignment,
    /// A group has 0 tokens per block (vLLM 0.33.0 divides by zero).
    ZeroTokensPerBlock {
        /// Index of the group.
        group: usize,
    },
    /// A chunk size or token count does not fit in `u64`.
    Overflow,
}

impl fmt::Display for CpuTierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoCpuBytes => f.write_str("cpu_bytes_to_use must be at least 1"),
            Self::ZeroBlocksPerChunk => f.write_str("blocks_per_chunk must be at least 1"),
            Self::ZeroPageAlignment => f.write_str("page alignment must be at least 1"),
            Self::ZeroTokensPerBlock { group } => {
                write!(f, "group {group} has 0 tokens per block")
            }
            Self::Overflow => f.write_str("CPU tier size overflows u64"),
        }
    }
}

impl core::error::Error for CpuTierError {}
