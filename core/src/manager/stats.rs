//! What `get_stats` reports: the usage gauges as exact ratios, the allocation-size samples and
//! the reuse filter's skipped stores, drained per call as in vLLM.

use crate::stats::Histogram;

/// Bucket bounds of `vllm:kv_offload_cpu_allocation_size` (chunks per `prepare_store`).
pub const ALLOCATION_SIZE_BOUNDS: [u64; 10] =
    [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262_144];

/// An exact ratio `num / den` (`den > 0`), converted to a float only on export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ratio {
    /// Numerator.
    pub num: u64,
    /// Denominator, never 0.
    pub den: u64,
}

impl Ratio {
    /// `num / den`, or `0 / 1` when `den` is 0 (vLLM reports 0.0 for an empty tier).
    #[must_use]
    pub fn new_or_zero(num: u64, den: u64) -> Self {
        if den == 0 {
            Ratio { num: 0, den: 1 }
        } else {
            Ratio { num, den }
        }
    }

    /// The nearest `f64`.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "export to float is the point")]
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

/// One drained `get_stats` result of an [`OffloadManager`](super::OffloadManager).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerStats {
    /// Chunks pinned by a pending store or an in-flight load (`allocated − free − evictable`).
    pub num_used: u64,
    /// Chunks whose store is pending.
    pub write_pending: u64,
    /// The tier's capacity in chunks.
    pub num_chunks: u64,
    /// `#candidates` of every `prepare_store` that had candidates since the last call
    /// (failed ones included).
    pub allocation_sizes: Histogram,
    /// Candidates the reuse filter rejected since the last call; `None` when the filter is
    /// off (vLLM then emits no `stores_skipped` at all; with the filter on it emits 0 too).
    pub stores_skipped: Option<u64>,
}

impl ManagerStats {
    /// `vllm:kv_offload_cpu_cache_usage_perc` = used / capacity (0 for an empty tier).
    /// This is not the fill level: idle cached chunks count as unused.
    #[must_use]
    pub fn usage(&self) -> Ratio {
        Ratio::new_or_zero(self.num_used, self.num_chunks)
    }

    /// `vllm:kv_offload_cpu_cache_write_usage_perc` = pending stores / capacity.
    #[must_use]
    pub fn write_usage(&self) -> Ratio {
        Ratio::new_or_zero(self.write_pending, self.num_chunks)
    }

    /// `vllm:kv_offload_cpu_cache_read_usage_perc` = chunks pinned by loads / capacity.
    ///
    /// vLLM computes `max(usage − write, 0)` in floats, which can differ from this exact value
    /// in the last bit (e.g. 0.3 − 0.1 = 0.19999999999999998 against 2/10).
    #[must_use]
    pub fn read_usage(&self) -> Ratio {
        Ratio::new_or_zero(
            self.num_used.saturating_sub(self.write_pending),
            self.num_chunks,
        )
    }
}
