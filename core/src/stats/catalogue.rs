//! The metric families of vLLM 0.33.0 that kvtier reports, in one place.
//!
//! Every family is a [`MetricDef`]: its exposed name, its [`MetricKind`], a help text, the extra
//! label names (the engine labels `model_name` and `engine` are not listed: the exporter adds them
//! first), the histogram bucket bounds in integer base units, and the [`Unit`] those values are
//! counted in. Times are nanoseconds in the core and seconds on export, so a family measured in
//! [`Unit::Nanoseconds`] has an export divisor of `1_000_000_000`.
//!
//! [`CATALOGUE`] is sorted by name; [`lookup`] finds a family by binary search.
//!
//! ```
//! use kvtier_core::stats::catalogue::{self, MetricKind, Unit};
//!
//! let def = catalogue::lookup(catalogue::LOOKUP_SYNC_DELAY_SECONDS).unwrap();
//! assert_eq!(def.kind, MetricKind::Histogram);
//! assert_eq!(def.unit, Unit::Nanoseconds);
//! assert_eq!(def.bounds[0], 10_000); // 1e-5 s
//! assert!(catalogue::lookup("vllm:no_such_metric").is_none());
//! ```

use core::fmt;

/// The three kinds of metric a payload carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetricKind {
    /// A monotonically increasing total; payloads carry per-interval increments that sum.
    Counter,
    /// A value that is overwritten; the latest one wins.
    Gauge,
    /// Observations counted into fixed buckets; merged bucket by bucket.
    Histogram,
}

impl MetricKind {
    /// The name vLLM's payload uses for this kind (`"counter"`, `"gauge"`, `"histogram"`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The base unit of a family's integer values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Nanoseconds in the core; exported as seconds.
    Nanoseconds,
    /// CPU-tier chunks.
    Chunks,
    /// KV blocks.
    Blocks,
    /// Tokens.
    Tokens,
    /// Plain event counts.
    Count,
    /// A fraction in `[0, 1]`, held as an exact ratio.
    Fraction,
    /// An info series: the value is always 1, the facts are in the labels.
    Info,
}

impl Unit {
    /// What a value in this unit is divided by on export (`1_000_000_000` for nanoseconds →
    /// seconds, 1 otherwise).
    #[must_use]
    pub const fn export_divisor(self) -> u64 {
        match self {
            Unit::Nanoseconds => 1_000_000_000,
            _ => 1,
        }
    }
}

/// One metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricDef {
    /// The name as vLLM registers it (counters get `_total` on exposition unless they end in it).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// What the family measures.
    pub help: &'static str,
    /// Extra label names, after the engine labels.
    pub labels: &'static [&'static str],
    /// Finite histogram bucket bounds in base units (empty for counters and gauges).
    pub bounds: &'static [u64],
    /// The base unit of the values.
    pub unit: Unit,
    /// The exporter shows this family from the start, at zero, for every engine (an empty
    /// histogram; both `transfer_type` values for a deprecated family), so a dashboard panel
    /// that reads it has a series before the first observation. True for every family of the
    /// offloading connector except its info series, and for `vllm:num_requests_running`.
    pub zero_at_start: bool,
}

impl MetricDef {
    /// The divisor that turns a base-unit value into the exported value.
    #[must_use]
    pub const fn export_divisor(&self) -> u64 {
        self.unit.export_divisor()
    }
}

// ---- B1: the native OffloadingConnector ----

/// Bytes loaded from the offload tier into GPU memory, summed over ranks.
pub const LOAD_BYTES: &str = "vllm:kv_offload_load_bytes";
/// Time spent loading, summed over ranks (nanoseconds here, seconds on export).
pub const LOAD_TIME: &str = "vllm:kv_offload_load_time";
/// Bytes per load transfer.
pub const LOAD_SIZE: &str = "vllm:kv_offload_load_size";
/// Bytes stored from GPU memory into the offload tier, summed over ranks.
pub const STORE_BYTES: &str = "vllm:kv_offload_store_bytes";
/// Time spent storing, summed over ranks (nanoseconds here, seconds on export).
pub const STORE_TIME: &str = "vllm:kv_offload_store_time";
/// Bytes per store transfer.
pub const STORE_SIZE: &str = "vllm:kv_offload_store_size";
/// Duration of one lookup call.
pub const LOOKUP_SYNC_DELAY_SECONDS: &str = "vllm:kv_offload_lookup_sync_delay_seconds";
/// From a request's first deferred lookup to the lookup that resolves (or the finish).
pub const LOOKUP_ASYNC_DELAY_SECONDS: &str = "vllm:kv_offload_lookup_async_delay_seconds";
/// `prepare_store` calls that found no room.
pub const ALLOCATION_FAILURE: &str = "vllm:kv_offload_allocation_failure";
/// Fraction of CPU chunks pinned by in-flight stores or loads.
pub const CPU_CACHE_USAGE_PERC: &str = "vllm:kv_offload_cpu_cache_usage_perc";
/// Fraction of CPU chunks pinned by pending stores.
pub const CPU_CACHE_WRITE_USAGE_PERC: &str = "vllm:kv_offload_cpu_cache_write_usage_perc";
/// Fraction of CPU chunks pinned by in-flight loads.
pub const CPU_CACHE_READ_USAGE_PERC: &str = "vllm:kv_offload_cpu_cache_read_usage_perc";
/// Chunks requested per `prepare_store` that had candidates.
pub const CPU_ALLOCATION_SIZE: &str = "vllm:kv_offload_cpu_allocation_size";
/// Store candidates turned away by the reuse threshold.
pub const STORES_SKIPPED: &str = "vllm:kv_offload_stores_skipped";
/// Static facts of the offload tier, one series per configuration (value 1).
pub const CONFIG_INFO: &str = "vllm:kv_offload_config_info";
/// Deprecated mirror of load/store bytes, labelled by `transfer_type`.
pub const DEPRECATED_TOTAL_BYTES: &str = "vllm:kv_offload_total_bytes";
/// Deprecated mirror of load/store time, labelled by `transfer_type`.
pub const DEPRECATED_TOTAL_TIME: &str = "vllm:kv_offload_total_time";
/// Deprecated mirror of the load/store size histograms, labelled by `transfer_type`.
pub const DEPRECATED_SIZE: &str = "vllm:kv_offload_size";

// ---- B2: the SimpleCPUOffloadConnector ----

/// Admission decisions for eager boundary hand-off stores, labelled by `outcome`.
pub const SIMPLE_SAVE_OUTCOMES: &str = "vllm:simple_kv_offload_save_outcomes_total";
/// KV blocks restored to GPU memory, counted when a load finishes.
pub const SIMPLE_LOAD_BLOCKS: &str = "vllm:simple_kv_offload_load_blocks_total";
/// Pool blocks not free (capacity − free, the null block included).
pub const SIMPLE_USED_BLOCKS: &str = "vllm:simple_kv_offload_used_blocks";
/// Blocks in queued, issued or reset-abandoned stores.
pub const SIMPLE_PENDING_STORE_BLOCKS: &str = "vllm:simple_kv_offload_pending_store_blocks";
/// Deployment facts of the simple offloader (value 1).
pub const SIMPLE_INFO: &str = "vllm:simple_kv_offload_info";

// ---- B3: core engine metrics ----

/// GPU block-pool usage as a fraction.
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// Tokens queried against the local prefix cache.
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries";
/// Tokens found in the local prefix cache.
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits";
/// Tokens queried against the KV connector's external cache.
pub const EXTERNAL_PREFIX_CACHE_QUERIES: &str = "vllm:external_prefix_cache_queries";
/// Tokens found in the KV connector's external cache.
pub const EXTERNAL_PREFIX_CACHE_HITS: &str = "vllm:external_prefix_cache_hits";
/// Hit tokens by the tier that supplied them, labelled by `source`.
pub const PROMPT_TOKENS_CACHED_BY_SOURCE: &str = "vllm:prompt_tokens_cached_by_source";
/// Static cache configuration of the engine (value 1).
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// Requests the engine is running (in `kvtier serve` and `replay`: requests between their
/// `L` and `C` records).
pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";

/// Bucket bounds of the transfer-size histograms, in bytes.
pub const TRANSFER_SIZE_BOUNDS: [u64; 10] = [
    1_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    40_000_000,
    60_000_000,
    80_000_000,
    100_000_000,
    150_000_000,
    200_000_000,
];
/// Bucket bounds of the lookup-call duration, in nanoseconds (1e-5 s … 1 s).
pub const LOOKUP_SYNC_DELAY_BOUNDS: [u64; 11] = [
    10_000,
    50_000,
    100_000,
    500_000,
    1_000_000,
    5_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
];
/// Bucket bounds of the deferred-lookup delay, in nanoseconds (1e-4 s … 10 s).
pub const LOOKUP_ASYNC_DELAY_BOUNDS: [u64; 11] = [
    100_000,
    500_000,
    1_000_000,
    5_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
    5_000_000_000,
    10_000_000_000,
];
/// Bucket bounds of the allocation-size histogram, in chunks.
pub const ALLOCATION_SIZE_BOUNDS: [u64; 10] =
    [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262_144];

/// The info labels the CPU offloading spec declares for [`CONFIG_INFO`].
pub const CPU_CONFIG_INFO_LABELS: [&str; 4] = [
    "cpu_num_chunks",
    "cpu_blocks_per_chunk",
    "cpu_kv_cache_size_bytes",
    "cpu_kv_cache_size_tokens",
];
/// The labels of [`SIMPLE_INFO`], in order.
pub const SIMPLE_INFO_LABELS: [&str; 4] =
    ["backend", "page_cache", "lazy_offload", "capacity_blocks"];
/// The values of the `transfer_type` label of the deprecated families: load, then store.
pub const TRANSFER_TYPES: [&str; 2] = ["CPU_to_GPU", "GPU_to_CPU"];
/// The values of the `source` label of [`PROMPT_TOKENS_CACHED_BY_SOURCE`].
pub const CACHE_HIT_SOURCES: [&str; 5] = ["device", "host", "p2p", "disk", "external_unspecified"];

/// The CacheConfig attributes vLLM 0.33.0 puts on [`CACHE_CONFIG_INFO`] (the set varies by
/// release; `engine` is among them, and `model_name` is not).
pub const CACHE_CONFIG_INFO_LABELS: [&str; 37] = [
    "block_size",
    "user_specified_block_size",
    "kv_cache_layout",
    "prefix_match_unit",
    "gpu_memory_utilization",
    "cache_dtype",
    "is_attention_free",
    "num_gpu_blocks_override",
    "sliding_window",
    "enable_prefix_caching",
    "prefix_caching_hash_algo",
    "prefix_cache_retention_interval",
    "kv_cache_dtype_skip_layers",
    "mamba_page_size_padded",
    "skip_page_size_padded",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
    "mamba_cache_mode",
    "enable_mamba_shared_prefix_checkpoint",
    "replayssm_buffer_len",
    "use_replayssm",
    "use_kda_recoverssm",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "simple_cpu_offload_num_blocks",
    "effective_attention_block_size",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "hash_block_size",
    "cache_hit_alignment_tokens",
    "kv_sharing_fast_prefill",
    "swa_bounded_replay",
    "kv_cache_memory_bytes",
    "kv_offloading_size",
    "kv_offloading_backend",
    "engine",
];

/// Whether a family is shown from the start ([`MetricDef::zero_at_start`]).
#[derive(Clone, Copy)]
enum Start {
    /// At zero from the start.
    Zero,
    /// Only once observed.
    Observed,
}

const fn def(
    name: &'static str,
    kind: MetricKind,
    unit: Unit,
    labels: &'static [&'static str],
    bounds: &'static [u64],
    start: Start,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind,
        help,
        labels,
        bounds,
        unit,
        zero_at_start: matches!(start, Start::Zero),
    }
}

use MetricKind::{Counter, Gauge, Histogram};
use Start::{Observed, Zero};

const OUTCOME: &[&str] = &["outcome"];
const TRANSFER_TYPE: &[&str] = &["transfer_type"];
const SOURCE: &[&str] = &["source"];

/// Every family kvtier knows, sorted by name (byte order).
pub static CATALOGUE: [MetricDef; 31] = DEFS;

/// The last (up to) eight bytes of a name as an integer. With the length, unique across the
/// catalogue, so a lookup compares integers and confirms one candidate with one string
/// comparison.
const fn tail8(b: &[u8]) -> u64 {
    let mut j = b.len().saturating_sub(8);
    let mut v = 0u64;
    while j < b.len() {
        v = (v << 8) | b[j] as u64;
        j += 1;
    }
    v
}

const fn tails_of(defs: &[MetricDef; 31]) -> [(usize, u64); 31] {
    let mut out = [(0usize, 0u64); 31];
    let mut i = 0;
    while i < 31 {
        out[i] = (defs[i].name.len(), tail8(defs[i].name.as_bytes()));
        i += 1;
    }
    out
}

static TAILS: [(usize, u64); 31] = tails_of(&DEFS);

#[rustfmt::skip]
const DEFS: [MetricDef; 31] = [
    def(CACHE_CONFIG_INFO, Gauge, Unit::Info, &CACHE_CONFIG_INFO_LABELS, &[], Observed,
        "Cache configuration of the engine as labels; the value is always 1."),
    def(EXTERNAL_PREFIX_CACHE_HITS, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens served from the KV connector's external prefix cache."),
    def(EXTERNAL_PREFIX_CACHE_QUERIES, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens looked up in the KV connector's external prefix cache."),
    def(KV_CACHE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Observed,
        "Share of GPU KV blocks in use, the null block excluded (1 means full)."),
    def(ALLOCATION_FAILURE, Counter, Unit::Count, &[], &[], Zero,
        "Store preparations that could not find room in the offload tier."),
    def(CONFIG_INFO, Gauge, Unit::Info, &CPU_CONFIG_INFO_LABELS, &[], Observed,
        "Static facts of each offload tier of this engine as labels; the value is always 1."),
    def(CPU_ALLOCATION_SIZE, Histogram, Unit::Chunks, &[], &ALLOCATION_SIZE_BOUNDS, Zero,
        "CPU chunks requested by each store preparation that had candidates."),
    def(CPU_CACHE_READ_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by loads still in flight."),
    def(CPU_CACHE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by transfers in flight (0 idle, 1 saturated); not the fill level."),
    def(CPU_CACHE_WRITE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by stores not yet completed."),
    def(LOAD_BYTES, Counter, Unit::Bytes, &[], &[], Zero,
        "Bytes copied from the offload tier into GPU memory, summed over ranks."),
    def(LOAD_SIZE, Histogram, Unit::Bytes, &[], &TRANSFER_SIZE_BOUNDS, Zero,
        "Size of each load transfer in bytes."),
    def(LOAD_TIME, Counter, Unit::Nanoseconds, &[], &[], Zero,
        "Seconds spent copying from the offload tier into GPU memory, summed over ranks."),
    def(LOOKUP_ASYNC_DELAY_SECONDS, Histogram, Unit::Nanoseconds, &[], &LOOKUP_ASYNC_DELAY_BOUNDS, Zero,
        "Seconds from a request's first deferred lookup to the lookup that resolves it, or to its finish."),
    def(LOOKUP_SYNC_DELAY_SECONDS, Histogram, Unit::Nanoseconds, &[], &LOOKUP_SYNC_DELAY_BOUNDS, Zero,
        "Seconds spent in one lookup call."),
    def(DEPRECATED_SIZE, Histogram, Unit::Bytes, TRANSFER_TYPE, &TRANSFER_SIZE_BOUNDS, Zero,
        "Deprecated: size of each transfer in bytes, by direction."),
    def(STORE_BYTES, Counter, Unit::Bytes, &[], &[], Zero,
        "Bytes copied from GPU memory into the offload tier, summed over ranks."),
    def(STORE_SIZE, Histogram, Unit::Bytes, &[], &TRANSFER_SIZE_BOUNDS, Zero,
        "Size of each store transfer in bytes."),
    def(STORE_TIME, Counter, Unit::Nanoseconds, &[], &[], Zero,
        "Seconds spent copying from GPU memory into the offload tier, summed over ranks."),
    def(STORES_SKIPPED, Counter, Unit::Count, &[], &[], Zero,
        "Store candidates turned away because they had not been offered often enough yet."),
    def(DEPRECATED_TOTAL_BYTES, Counter, Unit::Bytes, TRANSFER_TYPE, &[], Zero,
        "Deprecated: bytes moved by the offload connector, by direction."),
    def(DEPRECATED_TOTAL_TIME, Counter, Unit::Nanoseconds, TRANSFER_TYPE, &[], Zero,
        "Deprecated: seconds spent in offload transfers, by direction."),
    def(NUM_REQUESTS_RUNNING, Gauge, Unit::Count, &[], &[], Zero,
        "Requests the engine is running."),
    def(PREFIX_CACHE_HITS, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens found in the local prefix cache."),
    def(PREFIX_CACHE_QUERIES, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens looked up in the local prefix cache."),
    def(PROMPT_TOKENS_CACHED_BY_SOURCE, Counter, Unit::Tokens, SOURCE, &[], Observed,
        "Prompt tokens served from a cache, by the tier that held them."),
    def(SIMPLE_INFO, Gauge, Unit::Info, &SIMPLE_INFO_LABELS, &[], Observed,
        "Deployment facts of the simple CPU offloader as labels; the value is always 1."),
    def(SIMPLE_LOAD_BLOCKS, Counter, Unit::Blocks, &[], &[], Observed,
        "KV blocks copied back into GPU memory, counted when each load finishes."),
    def(SIMPLE_PENDING_STORE_BLOCKS, Gauge, Unit::Blocks, &[], &[], Observed,
        "Blocks in stores that are queued, issued or left over from a reset; steady growth means a stuck transfer."),
    def(SIMPLE_SAVE_OUTCOMES, Counter, Unit::Count, OUTCOME, &[], Observed,
        "What became of each block handed over for an eager store, by outcome."),
    def(SIMPLE_USED_BLOCKS, Gauge, Unit::Blocks, &[], &[], Observed,
        "Offload pool blocks not free: pinned by transfers or pending hits, plus the null block."),
];

/// Finds a family by its exact name.
#[must_use]
pub fn lookup(name: &str) -> Option<&'static MetricDef> {
    lookup_bytes(name.as_bytes())
}

/// [`lookup`] on raw bytes (the wire decoder interns names before validating UTF-8).
pub(crate) fn lookup_bytes(name: &[u8]) -> Option<&'static MetricDef> {
    let key = (name.len(), tail8(name));
    CATALOGUE
        .iter()
        .zip(TAILS.iter())
        .find(|(d, k)| **k == key && d.name.as_bytes() == name)
        .map(|(d, _)| d)
}

/// Every family, in name order.
pub fn all() -> impl Iterator<Item = &'static MetricDef> {
    CATALOGUE.iter()
}

/// Label values that occur in kvtier's own payloads, so a decoder or an update can borrow them
/// instead of allocating.
pub(crate) static KNOWN_LABEL_VALUES: [&str; 18] = [
    "CPU_to_GPU",
    "GPU_to_CPU",
    "cpu",
    "device",
    "disk",
    "dropped_cpu_full",
    "dropped_not_hashed",
    "dropped_null_block",
    "dropped_request_gone",
    "external_unspecified",
    "false",
    "host",
    "p2p",
    "skipped_already_cached",
    "skipped_in_flight",
    "stored",
    "true",
    "None",
];

/// The `'static` copy of `value` if it is one of [`KNOWN_LABEL_VALUES`].
pub(crate) fn known_label(value: &str) -> Option<&'static str> {
    known_label_bytes(value.as_bytes())
}

/// [`known_label`] on raw bytes.
pub(crate) fn known_label_bytes(value: &[u8]) -> Option<&'static str> {
    KNOWN_LABEL_VALUES
        .iter()
        .copied()
        .find(|k| k.as_bytes() == value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_sorted_and_complete() {
        let names: alloc::vec::Vec<&str> = all().map(|d| d.name).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        assert_eq!(names.len(), 31);
        let mut tails: alloc::vec::Vec<(usize, u64)> = TAILS.to_vec();
        tails.sort_unstable();
        tails.dedup();
        assert_eq!(tails.len(), 31, "name tails must be unique");
        for d in all() {
            assert_eq!(lookup(d.name), Some(d));
            assert_eq!(
                d.kind == MetricKind::Histogram,
                !d.bounds.is_empty(),
                "{}",
                d.name
            );
            assert!(d.bounds.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn offloading_families_and_running_requests_are_shown_from_the_start() {
        let zero: alloc::vec::Vec<&str> =
            all().filter(|d| d.zero_at_start).map(|d| d.name).collect();
        assert_eq!(zero.len(), 18, "{zero:?}");
        assert!(
            zero.iter()
                .all(|n| n.starts_with("vllm:kv_offload_") || *n == NUM_REQUESTS_RUNNING),
            "{zero:?}"
        );
        assert!(!zero.contains(&CONFIG_INFO));
        assert!(zero.contains(&NUM_REQUESTS_RUNNING));
    }

    #[test]
    fn seconds_families_are_nanoseconds() {
        for d in all() {
            let seconds = d.name.ends_with("_seconds") || d.name.ends_with("_time");
            assert_eq!(seconds, d.unit == Unit::Nanoseconds, "{}", d.name);
        }
        assert_eq!(lookup(LOAD_TIME).unwrap().export_divisor(), 1_000_000_000);
    }
}

/// Why a payload series does not fit the catalogue (checked before anything is applied by an
/// exporter or a renderer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeriesMismatch {
    /// The catalogue has no family of that name.
    UnknownMetric(alloc::string::String),
    /// The payload's kind differs from the catalogue's.
    KindMismatch {
        /// The metric name.
        name: alloc::string::String,
        /// The catalogue's kind.
        expected: MetricKind,
        /// The payload's kind.
        found: MetricKind,
    },
    /// A series has a different number of labels than the family declares.
    LabelCount {
        /// The metric name.
        name: alloc::string::String,
        /// Labels the family declares.
        expected: usize,
        /// Labels the series has.
        got: usize,
    },
    /// A histogram's bounds differ from the catalogue's.
    BoundsMismatch(alloc::string::String),
}

impl fmt::Display for SeriesMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeriesMismatch::UnknownMetric(n) => write!(f, "unknown offloading stats key: {n}"),
            SeriesMismatch::KindMismatch {
                name,
                expected,
                found,
            } => {
                write!(
                    f,
                    "metric {name} is a {expected}, the payload has a {found}"
                )
            }
            SeriesMismatch::LabelCount {
                name,
                expected,
                got,
            } => {
                write!(f, "metric {name} expects {expected} labels, got {got}")
            }
            SeriesMismatch::BoundsMismatch(n) => {
                write!(
                    f,
                    "histogram {n} has other bucket bounds than the catalogue"
                )
            }
        }
    }
}

impl core::error::Error for SeriesMismatch {}

/// Checks one payload series against its catalogue family (name, kind, label count, histogram
/// bounds) and returns the family.
///
/// # Errors
/// [`SeriesMismatch`] saying what does not fit.
pub fn check_series(s: &super::Series) -> Result<&'static MetricDef, SeriesMismatch> {
    use alloc::borrow::ToOwned;
    let name = || s.name().to_owned();
    let def = lookup(s.name()).ok_or_else(|| SeriesMismatch::UnknownMetric(name()))?;
    if def.kind != s.kind() {
        return Err(SeriesMismatch::KindMismatch {
            name: name(),
            expected: def.kind,
            found: s.kind(),
        });
    }
    if def.labels.len() != s.labels().len() {
        return Err(SeriesMismatch::LabelCount {
            name: name(),
            expected: def.labels.len(),
            got: s.labels().len(),
        });
    }
    if let super::Value::Histogram(h) = s.value()
        && h.bounds() != def.bounds
    {
        return Err(SeriesMismatch::BoundsMismatch(name()));
    }
    Ok(def)
}

/// The values a deprecated `transfer_type` family (`DEPRECATED_TOTAL_BYTES`,
/// `DEPRECATED_TOTAL_TIME`, `DEPRECATED_SIZE`) mirrors from `payload`'s unlabeled load and store
/// series, as `(transfer_type, value)` for `CPU_to_GPU` then `GPU_to_CPU`; absent series read
/// as zero (an empty histogram). `None` for any other family.
#[must_use]
pub fn deprecated_mirror(
    payload: &super::Payload,
    def: &MetricDef,
) -> Option<[(&'static str, super::Value); 2]> {
    use super::Value;
    let counter = |name: &str| Value::Counter(payload.counter(name, &[]).unwrap_or(0));
    let histogram = |name: &str| {
        let h = payload.histogram(name, &[]).cloned();
        // The catalogue's bounds are valid, so the empty fallback never needs `default`.
        let h = h.unwrap_or_else(|| super::Histogram::new(def.bounds).unwrap_or_default());
        Value::Histogram(alloc::boxed::Box::new(h))
    };
    let [load, store] = TRANSFER_TYPES;
    match def.name {
        DEPRECATED_TOTAL_BYTES => {
            Some([(load, counter(LOAD_BYTES)), (store, counter(STORE_BYTES))])
        }
        DEPRECATED_TOTAL_TIME => Some([(load, counter(LOAD_TIME)), (store, counter(STORE_TIME))]),
        DEPRECATED_SIZE => Some([(load, histogram(LOAD_SIZE)), (store, histogram(STORE_SIZE))]),
        _ => None,
    }
}
