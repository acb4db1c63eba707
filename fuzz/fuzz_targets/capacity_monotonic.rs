//! `capacity_monotonic`: arbitrary KV layouts, workloads and budgets through the capacity
//! arithmetic. No entry point panics (each returns a value or a typed error), and the
//! monotonicity laws hold:
//!
//! * more GPU memory → not fewer blocks, not fewer KV-cache tokens, not less concurrency, not a
//!   shorter longest-fitting `max_model_len` (and a budget that sizes never stops sizing when it
//!   grows);
//! * a longer `max_model_len` → not fewer blocks per request, not more concurrency;
//! * more CPU bytes → not fewer chunks or tokens, and never more bytes used than given.
//!
//! Fields are decoded either "realistic" (small block sizes, head counts, windows) or raw
//! `u64`s, per spec, so both the common paths and the overflow paths are reached.
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::capacity::{
    ConcurrencyError, CpuTierConfig, CpuTierError, GpuCapacityError, GroupedLayout, LayerSpec,
    PoolLayout, Ratio, Workload, gpu_capacity, max_fitting_len, size_cpu_tier, worker_blocks,
};
use kvtier_tests::capacity_gen::{layer_kind, realistic_spec};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct RawSpec {
    raw: bool,
    kind: u8,
    block: u64,
    heads: u64,
    head: u64,
    head_v: u64,
    dtype: u64,
    padded: Option<u64>,
    align: u64,
    a: u64,
    b: u64,
}

impl RawSpec {
    fn spec(&self) -> LayerSpec {
        let kind = |a: u64, b: u64| layer_kind(self.kind, a, b);
        if self.raw {
            return LayerSpec {
                kind: kind(self.a, self.b),
                block_size: self.block,
                num_kv_heads: self.heads,
                head_size: self.head,
                head_size_v: self.head_v,
                dtype_bytes: self.dtype,
                page_size_padded: self.padded,
                stride_alignment: self.align,
            };
        }
        let block = [1u64, 8, 16, 32][(self.block % 4) as usize];
        // Mamba state bytes range wider than windows and chunks.
        let a = if self.kind % 7 == 4 {
            self.a % 100_000 + 1
        } else {
            self.a % 5000 + 1
        };
        realistic_spec(
            kind(a, self.b % 64),
            block,
            self.heads % 8 + 1,
            [64, 128][(self.head % 2) as usize],
            self.dtype % 4 + 1,
        )
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    specs: Vec<RawSpec>,
    /// Explicit groups (`from_groups`, one group per spec run of this length) instead of vLLM's
    /// grouping.
    group_len: Option<u8>,
    block_outermost: bool,
    max_model_len: u64,
    batched_tokens: u64,
    batches: u8,
    encoder_tokens: u64,
    memory: u64,
    extra_memory: u64,
    extra_len: u64,
    cpu_bytes: u64,
    extra_cpu_bytes: u64,
    blocks_per_chunk: u64,
    world_size: u8,
    replicated: bool,
    page_alignment: u64,
    bytes_per_block: u64,
}

/// `a ≤ b` as exact ratios.
fn ratio_le(a: Ratio, b: Ratio) -> bool {
    u128::from(a.num()) * u128::from(b.den()) <= u128::from(b.num()) * u128::from(a.den())
}

fn gpu_laws(layout: &GroupedLayout, pool: PoolLayout, w: &Workload, m1: u64, m2: u64) {
    let one = core::slice::from_ref(layout);
    let (a, b) = (
        gpu_capacity(layout, one, pool, w, m1, None),
        gpu_capacity(layout, one, pool, w, m2, None),
    );
    // More memory may make the token count pass u64: an overflow error is the honest answer
    // there ("more than any u64"), not a broken law. Any other error is.
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert!(b.num_blocks >= a.num_blocks, "more memory, fewer blocks");
            assert!(
                b.kv_cache_size_tokens >= a.kv_cache_size_tokens,
                "more memory, fewer tokens"
            );
            assert!(
                ratio_le(a.max_concurrency, b.max_concurrency),
                "more memory, less concurrency"
            );
            assert!(a.max_concurrency.den() >= 1);
        }
        (Ok(_), Err(GpuCapacityError::Concurrency(ConcurrencyError::Overflow))) | (Err(_), _) => {}
        (Ok(_), Err(e)) => panic!("{m1} bytes size the pool but {m2} fail: {e:?}"),
    }
    if let Ok(a) = worker_blocks(layout, pool, m1, None) {
        let b = worker_blocks(layout, pool, m2, None)
            .unwrap_or_else(|e| panic!("worker_blocks: {m1} bytes size but {m2} fail: {e:?}"));
        assert!(
            b.num_blocks >= a.num_blocks,
            "worker_blocks: more memory, fewer blocks"
        );
    }
    if let (Ok(a), Ok(b)) = (
        max_fitting_len(layout, pool, w, m1),
        max_fitting_len(layout, pool, w, m2),
    ) {
        assert!(b >= a, "more memory, shorter max_fitting_len ({a} → {b})");
        assert!(a <= w.max_model_len);
    }
}

fn length_laws(layout: &GroupedLayout, pool: PoolLayout, w: &Workload, longer: &Workload, m: u64) {
    if let (Ok(a), Ok(b)) = (
        layout.blocks_per_request(w),
        layout.blocks_per_request(longer),
    ) {
        assert!(
            b >= a,
            "longer max_model_len, fewer blocks per request ({a} → {b})"
        );
    }
    let one = core::slice::from_ref(layout);
    if let (Ok(a), Ok(b)) = (
        gpu_capacity(layout, one, pool, w, m, None),
        gpu_capacity(layout, one, pool, longer, m, None),
    ) {
        assert!(
            ratio_le(b.max_concurrency, a.max_concurrency),
            "longer max_model_len, more concurrency"
        );
    }
}

fuzz_target!(|input: Input| {
    let specs: Vec<LayerSpec> = input.specs.iter().take(8).map(RawSpec::spec).collect();
    let mut w = Workload::new(input.max_model_len, input.batched_tokens);
    w.max_concurrent_batches = u64::from(input.batches % 4);
    w.max_encoder_tokens = input.encoder_tokens;
    let longer = w.with_max_model_len(input.max_model_len.saturating_add(input.extra_len));
    let pool = if input.block_outermost {
        PoolLayout::BlockOutermost
    } else {
        PoolLayout::LayerOutermost
    };
    for s in &specs {
        let _ = s.validate();
        let _ = s.page_bytes();
        let _ = s.stride_bytes();
        let _ = s.blocks_per_request_ceil(&w);
        let _ = s.max_memory_bytes(&w);
        let _ = s.window_cap_chunks(input.blocks_per_chunk);
    }
    let layout = match input.group_len {
        None => GroupedLayout::from_layers(&specs),
        Some(k) => {
            let k = usize::from(k % 4) + 1;
            let groups: Vec<Vec<LayerSpec>> = specs.chunks(k).map(<[LayerSpec]>::to_vec).collect();
            GroupedLayout::from_groups(&groups)
        }
    };
    if let Ok(layout) = &layout {
        let _ = layout.bytes_per_block(pool);
        if let Some(m2) = input.memory.checked_add(input.extra_memory) {
            gpu_laws(layout, pool, &w, input.memory, m2);
        }
        length_laws(layout, pool, &w, &longer, input.memory);
        if let Ok(stages) = layout.split_pipeline(usize::from(input.world_size % 4) + 1) {
            let _ = gpu_capacity(layout, &stages, pool, &w, input.memory, None);
        }
    }

    let mut cfg = CpuTierConfig::new(input.cpu_bytes);
    cfg.blocks_per_chunk = input.blocks_per_chunk;
    cfg.world_size = u64::from(input.world_size);
    cfg.replicated = input.replicated;
    cfg.page_alignment = input.page_alignment;
    let a = size_cpu_tier(&cfg, input.bytes_per_block, &specs, input.max_model_len);
    if let Ok(a) = &a {
        assert!(
            a.kv_cache_size_bytes <= input.cpu_bytes,
            "used more CPU bytes than given"
        );
    }
    if let Some(more) = input.cpu_bytes.checked_add(input.extra_cpu_bytes) {
        cfg.cpu_bytes = more;
        let b = size_cpu_tier(&cfg, input.bytes_per_block, &specs, input.max_model_len);
        // As for the GPU pool: a token count past u64 is an honest overflow error.
        match (a, b) {
            (Ok(a), Ok(b)) => {
                assert!(b.num_chunks >= a.num_chunks, "more CPU bytes, fewer chunks");
                assert!(
                    b.kv_cache_size_tokens >= a.kv_cache_size_tokens,
                    "more CPU bytes, fewer tokens"
                );
                assert!(
                    b.kv_cache_size_bytes <= more,
                    "used more CPU bytes than given"
                );
            }
            (Ok(_), Err(CpuTierError::Overflow)) | (Err(_), _) => {}
            (Ok(_), Err(e)) => panic!("{} CPU bytes size but {more} fail: {e:?}", input.cpu_bytes),
        }
    }
});
