//! [`CpuTierInfo`]: the CPU tier's static facts, the labels of `vllm:kv_offload_config_info`.
//!
//! One type for every source of those facts: the sizing of a tier
//! ([`CpuTier::config_info`](crate::capacity::CpuTier::config_info)) and the manager's
//! [`ManagerConfig::info`](crate::manager::ManagerConfig::info), which
//! [`config_info`](crate::manager::OffloadManager::config_info) reports as an info series.

use super::catalogue::CPU_CONFIG_INFO_LABELS;
use super::{InfoSeries, InfoValue};

/// The CPU tier's static facts, in vLLM's label order (see [`LABEL_NAMES`](Self::LABEL_NAMES)).
///
/// ```
/// use kvtier_core::stats::{CpuTierInfo, InfoValue};
/// let info = CpuTierInfo {
///     num_chunks: 8,
///     blocks_per_chunk: 1,
///     kv_cache_size_bytes: Some(8 * 4096),
///     kv_cache_size_tokens: None,
/// };
/// assert_eq!(info.values(), [Some(8), Some(1), Some(32_768), None]);
/// let series = info.to_info_series();
/// assert_eq!(series.get("cpu_num_chunks"), Some(&InfoValue::Int(8)));
/// assert_eq!(series.get("cpu_kv_cache_size_tokens"), Some(&InfoValue::None));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuTierInfo {
    /// `cpu_num_chunks`.
    pub num_chunks: u64,
    /// `cpu_blocks_per_chunk`.
    pub blocks_per_chunk: u64,
    /// `cpu_kv_cache_size_bytes` (padding included); `None` when unknown (a replay).
    pub kv_cache_size_bytes: Option<u64>,
    /// `cpu_kv_cache_size_tokens`; `None` where vLLM reports `None`.
    pub kv_cache_size_tokens: Option<u64>,
}

impl CpuTierInfo {
    /// The label names in vLLM's order (the catalogue's
    /// [`CPU_CONFIG_INFO_LABELS`]).
    pub const LABEL_NAMES: [&'static str; 4] = CPU_CONFIG_INFO_LABELS;

    /// The label values in [`LABEL_NAMES`](Self::LABEL_NAMES) order; `None` is vLLM's `"None"`.
    #[must_use]
    pub const fn values(&self) -> [Option<u64>; 4] {
        [
            Some(self.num_chunks),
            Some(self.blocks_per_chunk),
            self.kv_cache_size_bytes,
            self.kv_cache_size_tokens,
        ]
    }

    /// The `vllm:kv_offload_config_info` series: each of [`LABEL_NAMES`](Self::LABEL_NAMES)
    /// with its value (`None` rendered "None").
    #[must_use]
    pub fn to_info_series(&self) -> InfoSeries {
        let mut s = InfoSeries::new();
        for (name, value) in Self::LABEL_NAMES.into_iter().zip(self.values()) {
            let value = value.map_or(InfoValue::None, |v| {
                InfoValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
            });
            // Four labels fit any series.
            let _ = s.insert(name, value);
        }
        s
    }
}
