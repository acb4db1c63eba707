//! Capacity arithmetic: KV layouts, page sizes, blocks from a memory budget, the CPU tier's size.
//!
//! How many KV blocks, tokens and concurrent full-length requests fit — on the GPU and in the
//! CPU tier — computed exactly from a layout, as vLLM 0.33.0 does at start-up (spec sections A8
//! and A12). Integer-only and checked: every overflow or zero divisor is a typed error, and
//! every rounding is named (`_ceil`, `_floor`).
//!
//! | module | holds |
//! |---|---|
//! | [`spec`] | [`LayerSpec`] / [`LayerKind`]: page sizes, per-request blocks, CPU window caps; [`Workload`] |
//! | [`grouping`] | [`GroupedLayout`]: vLLM's hybrid grouping and page unification, pipeline projection; [`promote_local_layers`] (hybrid manager off) |
//! | [`blocks`] | bytes per pool block ([`PoolLayout`]), blocks from memory, the admission check and max-length search |
//! | [`concurrency`] | max concurrency (a [`Ratio`]), `kv_cache_size_tokens`, [`gpu_capacity`] |
//! | [`cpu_tier`] | [`size_cpu_tier`]: chunks, bytes and tokens of the CPU tier, its [`CpuTierInfo`](crate::stats::CpuTierInfo) |
//! | [`arith`] | checked `div_ceil`, `round_up`, `gcd`, `lcm`, `mul_div_floor` |
//! | [`error`] | one error enum per operation |
//!
//! ```
//! use kvtier_core::capacity::{gpu_capacity, GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload};
//! // Qwen1.5-7B-like: 32 layers, block 16, 32 KV heads, head 128, fp16 → page 262 144 bytes.
//! let spec = LayerSpec::attention(LayerKind::Full, 16, 32, 128, 2);
//! let layout = GroupedLayout::from_layers(&[spec; 32])?;
//! let w = Workload::new(16_384, 1024);
//! let cap = gpu_capacity(&layout, core::slice::from_ref(&layout), PoolLayout::LayerOutermost, &w, 0, Some(1536))?;
//! assert_eq!(cap.blocks_per_request, 1024);
//! assert_eq!((cap.max_concurrency.num(), cap.max_concurrency.den()), (3, 2)); // 1.5x
//! assert_eq!(cap.kv_cache_size_tokens, 24_576);
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```

pub mod arith;
pub mod blocks;
pub mod concurrency;
pub mod cpu_tier;
pub mod error;
pub mod grouping;
pub mod spec;

pub use crate::ratio::Ratio;
pub use blocks::{
    PoolError, PoolLayout, WorkerBlocks, check_admission, max_fitting_len, min_across_workers,
    num_blocks_floor, pool_blocks, worker_blocks,
};
pub use concurrency::{
    GpuCapacity, GpuCapacityError, gpu_capacity, kv_cache_size_tokens_floor, max_concurrency,
};
pub use cpu_tier::{
    CpuTier, CpuTierConfig, DEFAULT_PAGE_ALIGNMENT, chunks_per_request_ceil, cpu_tokens_floor,
    size_cpu_tier,
};
pub use error::{
    AdmissionError, BlocksError, ConcurrencyError, CpuTierError, GroupingError, PromotionError,
    SizingError, SpecError, WorkloadError,
};
pub use grouping::{GroupedLayout, KvGroup, MAX_LAYERS, promote_local_layers};
pub use spec::{LayerKind, LayerSpec, Workload, max_concurrent_batches};
