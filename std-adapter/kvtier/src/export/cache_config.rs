//! The labels of `vllm:cache_config_info`: vLLM's cache-config attributes as text.

use std::collections::BTreeMap;
use std::fmt;

use kvtier_core::capacity::{GpuCapacity, Ratio};
use kvtier_core::stats::catalogue::CACHE_CONFIG_INFO_LABELS;

use super::python_float_str;

/// The attributes of one engine's `vllm:cache_config_info` series.
///
/// vLLM renders every `CacheConfig` attribute with Python's `str()`; kvtier knows the ones it
/// computes (block size, GPU blocks, `kv_cache_size_tokens`, `kv_cache_max_concurrency`) and
/// whatever the caller sets. An attribute nobody set is exposed as `""`. The `engine` label is
/// filled by the exporter.
///
/// ```
/// use kvtier::export::CacheConfigInfo;
/// use kvtier_core::capacity::Ratio;
///
/// let mut info = CacheConfigInfo::new();
/// info.set_capacity(1_153_000, Ratio::new(3, 1).unwrap());
/// assert_eq!(info.get("kv_cache_max_concurrency"), Some("3.0"));
/// assert_eq!(info.get("kv_cache_size_tokens"), Some("1153000"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheConfigInfo {
    values: BTreeMap<&'static str, String>,
}

/// The label is not one of `vllm:cache_config_info`'s attributes (or is `engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownAttribute;

impl fmt::Display for UnknownAttribute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a cache-config attribute of vllm:cache_config_info")
    }
}

impl std::error::Error for UnknownAttribute {}

impl CacheConfigInfo {
    /// No attribute set.
    #[must_use]
    pub fn new() -> Self {
        CacheConfigInfo::default()
    }

    /// From the capacity module's GPU figures: `block_size`, `num_gpu_blocks`,
    /// `kv_cache_size_tokens` and `kv_cache_max_concurrency` (per engine).
    #[must_use]
    pub fn from_gpu_capacity(block_size: u64, cap: &GpuCapacity) -> Self {
        let mut info = CacheConfigInfo::new();
        info.values.insert("block_size", block_size.to_string());
        info.values
            .insert("num_gpu_blocks", cap.num_blocks.to_string());
        info.set_capacity(cap.kv_cache_size_tokens, cap.max_concurrency);
        info
    }

    /// Sets `kv_cache_size_tokens` (decimal) and `kv_cache_max_concurrency` (the ratio as
    /// Python's `str(float)`, e.g. `"3.0"`).
    pub fn set_capacity(&mut self, kv_cache_size_tokens: u64, max_concurrency: Ratio) {
        let ratio = max_concurrency.to_f64();
        self.values
            .insert("kv_cache_size_tokens", kv_cache_size_tokens.to_string());
        self.values
            .insert("kv_cache_max_concurrency", python_float_str(ratio));
    }

    /// Sets one attribute's text.
    ///
    /// # Errors
    /// [`UnknownAttribute`] when `label` is not an attribute of the family (or is `engine`).
    pub fn set(&mut self, label: &str, value: impl Into<String>) -> Result<(), UnknownAttribute> {
        let key = CACHE_CONFIG_INFO_LABELS
            .iter()
            .find(|k| **k == label && **k != "engine")
            .ok_or(UnknownAttribute)?;
        self.values.insert(key, value.into());
        Ok(())
    }

    /// An attribute's text, if set.
    #[must_use]
    pub fn get(&self, label: &str) -> Option<&str> {
        self.values.get(label).map(String::as_str)
    }

    /// Every label value in the family's label order, `engine` filled in.
    pub(crate) fn label_values(&self, engine: &str) -> Vec<String> {
        CACHE_CONFIG_INFO_LABELS
            .iter()
            .map(|k| {
                if *k == "engine" {
                    engine.to_owned()
                } else {
                    self.values.get(k).cloned().unwrap_or_default()
                }
            })
            .collect()
    }
}
