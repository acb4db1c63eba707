//! What `take_stats` reports: the usage gauges as exact ratios, the allocation-size samples and
//! the reuse filter's skipped stores, drained per call as vLLM's manager reports them; plus what
//! vLLM's offloading scheduler adds per drain (allocation failures, the tier's facts once).

use crate::stats::catalogue;
use crate::stats::{Gauge, Histogram, InfoSeries, Payload};

/// One drained [`take_stats`](super::OffloadManager::take_stats) result of an
/// [`OffloadManager`](super::OffloadManager).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    /// `prepare_store` calls that found no room ([`StoreError::NoRoom`]) since the last call
    /// (vLLM's scheduler counts them as `allocation_failure`).
    ///
    /// [`StoreError::NoRoom`]: super::StoreError::NoRoom
    pub allocation_failures: u64,
    /// The tier's facts ([`config_info`](super::OffloadManager::config_info)) on the first
    /// drain of the manager, `None` on every later one (vLLM's scheduler sends them once).
    pub config_info: Option<InfoSeries>,
}

impl ManagerStats {
    /// `vllm:kv_offload_cpu_cache_usage_perc` = used / capacity (0 for an empty tier).
    /// This is not the fill level: idle cached chunks count as unused.
    #[must_use]
    pub fn usage(&self) -> Gauge {
        Gauge::fraction(self.num_used, self.num_chunks)
    }

    /// `vllm:kv_offload_cpu_cache_write_usage_perc` = pending stores / capacity.
    #[must_use]
    pub fn write_usage(&self) -> Gauge {
        Gauge::fraction(self.write_pending, self.num_chunks)
    }

    /// `vllm:kv_offload_cpu_cache_read_usage_perc` = chunks pinned by loads / capacity.
    ///
    /// vLLM computes `max(usage − write, 0)` in floats, which can differ from this exact value
    /// in the last bit (e.g. 0.3 − 0.1 = 0.19999999999999998 against 2/10).
    #[must_use]
    pub fn read_usage(&self) -> Gauge {
        Gauge::fraction(
            self.num_used.saturating_sub(self.write_pending),
            self.num_chunks,
        )
    }
}

impl ManagerStats {
    /// Adds this drain to `payload` as vLLM's manager does: the three usage gauges, one
    /// allocation-size histogram (only when there were samples) and, with the reuse filter
    /// on, `stores_skipped` (also when 0).
    pub fn write_to(&self, payload: &mut Payload) {
        // Five catalogue series of fixed kinds cannot exceed a payload's limits or conflict
        // with a payload built from the same catalogue; a conflicting payload keeps its own.
        let _ = payload.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], self.usage());
        let _ = payload.set_gauge(
            catalogue::CPU_CACHE_WRITE_USAGE_PERC,
            &[],
            self.write_usage(),
        );
        let _ = payload.set_gauge(catalogue::CPU_CACHE_READ_USAGE_PERC, &[], self.read_usage());
        if !self.allocation_sizes.is_empty() {
            let _ = payload.merge_histogram(
                catalogue::CPU_ALLOCATION_SIZE,
                &[],
                &self.allocation_sizes,
            );
        }
        if let Some(n) = self.stores_skipped {
            let _ = payload.increase_counter(catalogue::STORES_SKIPPED, &[], n);
        }
    }

    /// This drain as a new payload (see [`ManagerStats::write_to`]).
    #[must_use]
    pub fn to_payload(&self) -> Payload {
        let mut p = Payload::new();
        self.write_to(&mut p);
        p
    }

    /// Adds this drain to `payload` as vLLM's offloading scheduler reports a step: what
    /// [`write_to`](Self::write_to) adds, plus `allocation_failure` (only when there were
    /// failures) and, on the manager's first drain, the `config_info` series (even when empty,
    /// so that the metric exists whenever offloading runs).
    pub fn write_step_to(&self, payload: &mut Payload) {
        self.write_to(payload);
        if self.allocation_failures > 0 {
            let _ = payload.increase_counter(
                catalogue::ALLOCATION_FAILURE,
                &[],
                self.allocation_failures,
            );
        }
        if let Some(info) = &self.config_info {
            // One info series always fits.
            let _ = payload.set_info(alloc::vec![info.clone()]);
        }
    }

    /// This drain as a new step payload (see [`ManagerStats::write_step_to`]).
    #[must_use]
    pub fn to_step_payload(&self) -> Payload {
        let mut p = Payload::new();
        self.write_step_to(&mut p);
        p
    }
}
