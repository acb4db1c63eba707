//! The names of the catalogue: family names, histogram bucket bounds, the label names the
//! families declare, and the label values kvtier's own payloads use.

use super::index::StrIndex;

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

/// Label values that occur in kvtier's own payloads, so a decoder or an update can borrow them
/// instead of allocating.
const KNOWN_LABEL_VALUES: [&str; 18] = [
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

const fn concat<const A: usize, const B: usize, const N: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; N] {
    assert!(A + B == N);
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

/// The texts a decoder or an update borrows instead of allocating: the known label values and
/// the info label names of [`CONFIG_INFO`].
static KNOWN_TEXTS: [&str; 22] = concat(KNOWN_LABEL_VALUES, CPU_CONFIG_INFO_LABELS);

static KNOWN_INDEX: StrIndex<64> = StrIndex::new(&KNOWN_TEXTS);

/// The `'static` copy of `value` if it is one of the known label values or info label names.
pub(crate) fn known_label(value: &str) -> Option<&'static str> {
    known_label_bytes(value.as_bytes())
}

/// [`known_label`] on raw bytes.
#[inline]
pub(crate) fn known_label_bytes(value: &[u8]) -> Option<&'static str> {
    KNOWN_INDEX.find(value).and_then(|i| KNOWN_INDEX.key(i))
}
