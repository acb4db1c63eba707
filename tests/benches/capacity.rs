//! Capacity arithmetic benchmarks (divan). Run with `cargo bench -p kvtier-tests --bench capacity`.

use divan::{Bencher, black_box};
use kvtier_core::capacity::{
    CpuTierConfig, GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, gpu_capacity,
    max_fitting_len, size_cpu_tier,
};

fn main() {
    divan::main();
}

fn gemma3_like() -> Vec<LayerSpec> {
    let full = LayerSpec::attention(LayerKind::Full, 16, 16, 128, 2);
    let slide = LayerSpec::attention(
        LayerKind::SlidingWindow {
            window: 1024,
            extra_retained_tokens: 0,
        },
        16,
        16,
        128,
        2,
    );
    (0..62)
        .map(|i| if (i + 1) % 6 == 0 { full } else { slide })
        .collect()
}

/// Grouping 62 hybrid layers (7 groups).
#[divan::bench]
fn group_gemma3_like(b: Bencher) {
    let layers = gemma3_like();
    b.bench(|| GroupedLayout::from_layers(black_box(&layers)));
}

/// Everything `kvtier capacity` computes for the GPU: blocks, admission, ratio, tokens.
#[divan::bench]
fn gpu_capacity_gemma3_like(b: Bencher) {
    let layout = GroupedLayout::from_layers(&gemma3_like()).expect("valid layout");
    let w = Workload::new(131_072, 8192);
    b.bench(|| {
        gpu_capacity(
            black_box(&layout),
            core::slice::from_ref(&layout),
            PoolLayout::LayerOutermost,
            &w,
            black_box(80 << 30),
            None,
        )
    });
}

/// The max-length binary search over [1, 131 072] when memory is short.
#[divan::bench]
fn max_fitting_len_gemma3_like(b: Bencher) {
    let layout = GroupedLayout::from_layers(&gemma3_like()).expect("valid layout");
    let w = Workload::new(131_072, 8192);
    b.bench(|| {
        max_fitting_len(
            black_box(&layout),
            PoolLayout::LayerOutermost,
            &w,
            black_box(4 << 30),
        )
    });
}

/// The CPU tier's size and token capacity with window caps.
#[divan::bench]
fn cpu_tier_gemma3_like(b: Bencher) {
    let layout = GroupedLayout::from_layers(&gemma3_like()).expect("valid layout");
    let reps: Vec<LayerSpec> = (0..layout.num_groups())
        .filter_map(|g| layout.group_spec(g).copied())
        .collect();
    let cfg = CpuTierConfig::new(64 << 30);
    b.bench(|| {
        size_cpu_tier(
            black_box(&cfg),
            black_box(1_310_720),
            black_box(&reps),
            131_072,
        )
    });
}
