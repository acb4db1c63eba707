//! Property tests of the capacity arithmetic: monotonicity laws, a reference model for
//! single-spec layouts, and no panic on any input (extremes included).

use kvtier_core::capacity::{
    CpuTierConfig, GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, check_admission,
    gpu_capacity, max_fitting_len, size_cpu_tier, worker_blocks,
};
use kvtier_tests::capacity_gen::{layer_kind, realistic_spec};
use proptest::prelude::*;

const LO: PoolLayout = PoolLayout::LayerOutermost;

fn small_kind() -> impl Strategy<Value = LayerKind> {
    (0u8..7, 1u64..5000, 0u64..64, 1u64..100_000, 0u64..3).prop_map(|(k, a, b, state, spec)| {
        if k == 4 {
            // Mamba: state bytes and speculative blocks in their own ranges.
            layer_kind(k, state, spec)
        } else {
            layer_kind(k, a, b)
        }
    })
}

fn small_spec() -> impl Strategy<Value = LayerSpec> {
    (
        small_kind(),
        prop::sample::select(vec![1u64, 8, 16, 32]),
        1u64..9,
        prop::sample::select(vec![64u64, 128]),
        1u64..5,
    )
        .prop_map(|(kind, block, heads, head, dtype)| {
            realistic_spec(kind, block, heads, head, dtype)
        })
}

fn attention_spec() -> impl Strategy<Value = LayerSpec> {
    small_spec().prop_filter("attention with tokens", |s| {
        !matches!(
            s.kind,
            LayerKind::Mamba { .. } | LayerKind::Cross | LayerKind::EncoderOnly
        )
    })
}

fn workload() -> impl Strategy<Value = Workload> {
    (1u64..200_000, 0u64..16_384, 1u64..3, 0u64..4000).prop_map(|(l, t, c, enc)| {
        let mut w = Workload::new(l, t);
        w.max_concurrent_batches = c;
        w.max_encoder_tokens = enc;
        w
    })
}

fn any_spec() -> impl Strategy<Value = LayerSpec> {
    (
        any::<u8>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<Option<u64>>(),
        any::<u64>(),
        (any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |(k, block, heads, head, hv, dtype, padded, align, (a, b))| {
                let kind = layer_kind(k, a, b);
                LayerSpec {
                    kind,
                    block_size: block % 4 * (block >> 2),
                    num_kv_heads: heads,
                    head_size: head,
                    head_size_v: hv,
                    dtype_bytes: dtype,
                    page_size_padded: padded,
                    stride_alignment: align,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Single-spec layouts against a reference model in u128.
    #[test]
    fn reference_model_single_spec(spec in attention_spec(), n in 1usize..40, w in workload(), mem in 0u64..(1u64 << 40)) {
        let layout = GroupedLayout::from_layers(&vec![spec; n]).unwrap();
        let page = u128::from(spec.num_kv_heads) * u128::from(spec.block_size)
            * u128::from(spec.head_size + spec.head_size_v) * u128::from(spec.dtype_bytes);
        let bpb = page * n as u128;
        prop_assert_eq!(u128::from(layout.bytes_per_block(LO).unwrap()), bpb);
        let wb = worker_blocks(&layout, LO, mem, None).unwrap();
        prop_assert_eq!(u128::from(wb.num_blocks), u128::from(mem) / bpb);
        let per_req = u128::from(spec.blocks_per_request_ceil(&w).unwrap());
        let admit = check_admission(&layout, LO, &w, mem);
        let fits = u128::from(mem) > bpb && per_req * bpb <= u128::from(mem) - bpb;
        prop_assert_eq!(admit.is_ok(), fits);
        if fits {
            let cap = gpu_capacity(&layout, core::slice::from_ref(&layout), LO, &w, mem, None).unwrap();
            prop_assert_eq!(u128::from(cap.kv_cache_size_tokens), u128::from(cap.num_blocks) * u128::from(w.max_model_len) / per_req);
            prop_assert_eq!(u128::from(cap.max_concurrency.num()) * per_req, u128::from(cap.num_blocks) * u128::from(cap.max_concurrency.den()));
        }
    }

    /// More memory never gives fewer blocks, tokens or concurrency.
    #[test]
    fn more_memory_never_less(specs in prop::collection::vec(small_spec(), 1..8), w in workload(),
                              m1 in 0u64..(1u64 << 36), extra in 0u64..(1u64 << 36)) {
        let layout = GroupedLayout::from_layers(&specs);
        // An MLA page that does not divide the largest page cannot be unified (a typed error).
        prop_assume!(layout.is_ok());
        let layout = layout.unwrap();
        let one = core::slice::from_ref(&layout);
        let a = gpu_capacity(&layout, one, LO, &w, m1, None);
        let b = gpu_capacity(&layout, one, LO, &w, m1 + extra, None);
        if let Ok(a) = a {
            let b = b.unwrap();
            prop_assert!(b.num_blocks >= a.num_blocks);
            prop_assert!(b.kv_cache_size_tokens >= a.kv_cache_size_tokens);
            prop_assert!(u128::from(b.max_concurrency.num()) * u128::from(a.max_concurrency.den())
                >= u128::from(a.max_concurrency.num()) * u128::from(b.max_concurrency.den()));
        }
        let ra = worker_blocks(&layout, LO, m1, None).unwrap();
        let rb = worker_blocks(&layout, LO, m1 + extra, None).unwrap();
        prop_assert!(rb.num_blocks >= ra.num_blocks);
        // The max-length estimate grows with memory too.
        prop_assert!(max_fitting_len(&layout, LO, &w, m1 + extra).unwrap() >= max_fitting_len(&layout, LO, &w, m1).unwrap());
    }

    /// A longer max_model_len never gives more concurrency (more blocks per request).
    #[test]
    fn longer_len_never_more_concurrency(specs in prop::collection::vec(small_spec(), 1..8), w in workload(), extra in 0u64..100_000) {
        let layout = GroupedLayout::from_layers(&specs);
        // An MLA page that does not divide the largest page cannot be unified (a typed error).
        prop_assume!(layout.is_ok());
        let layout = layout.unwrap();
        let longer = w.with_max_model_len(w.max_model_len + extra);
        prop_assert!(layout.blocks_per_request(&longer).unwrap() >= layout.blocks_per_request(&w).unwrap());
    }

    /// More CPU bytes never give fewer chunks or tokens.
    #[test]
    fn more_cpu_bytes_never_less(specs in prop::collection::vec(small_spec(), 0..6), bpb in 0u64..(1 << 26),
                                 c1 in 1u64..(1u64 << 40), extra in 0u64..(1u64 << 40), bpc in 1u64..8,
                                 world in 0u64..4, l in 0u64..200_000) {
        let mut cfg = CpuTierConfig::new(c1);
        cfg.blocks_per_chunk = bpc;
        cfg.world_size = world;
        let a = size_cpu_tier(&cfg, bpb, &specs, l).unwrap();
        cfg.cpu_bytes = c1 + extra;
        let b = size_cpu_tier(&cfg, bpb, &specs, l).unwrap();
        prop_assert!(b.num_chunks >= a.num_chunks);
        prop_assert!(b.kv_cache_size_tokens >= a.kv_cache_size_tokens);
        prop_assert!(a.kv_cache_size_bytes <= c1);
        prop_assert_eq!(a.kv_cache_size_tokens.is_none(), l == 0 || specs.is_empty());
    }

    /// Adding a layer never gives more blocks: single-spec layouts and explicit groups.
    #[test]
    fn adding_a_layer_never_more_blocks(spec in small_spec(), n in 1usize..30, groups in prop::collection::vec((small_spec(), 1usize..6), 1..4),
                                        g in any::<prop::sample::Index>(), mem in 0u64..(1u64 << 40)) {
        let a = GroupedLayout::from_layers(&vec![spec; n]).unwrap();
        let b = GroupedLayout::from_layers(&vec![spec; n + 1]).unwrap();
        prop_assert!(worker_blocks(&b, LO, mem, None).unwrap().num_blocks <= worker_blocks(&a, LO, mem, None).unwrap().num_blocks);
        let mut explicit: Vec<Vec<LayerSpec>> = groups.iter().map(|(s, k)| vec![*s; *k]).collect();
        let a = GroupedLayout::from_groups(&explicit).unwrap();
        let i = g.index(explicit.len());
        let extra = explicit[i][0];
        explicit[i].push(extra);
        let b = GroupedLayout::from_groups(&explicit).unwrap();
        prop_assert!(worker_blocks(&b, LO, mem, None).unwrap().num_blocks <= worker_blocks(&a, LO, mem, None).unwrap().num_blocks);
    }

    /// No panic for any input: every entry point returns a value or a typed error.
    #[test]
    fn no_panic_on_any_input(specs in prop::collection::vec(any_spec(), 0..5), l in any::<u64>(), t in any::<u64>(),
                             c in any::<u64>(), dcp in any::<u64>(), mem in any::<u64>(), ovr in any::<Option<u64>>(),
                             cpu in any::<u64>(), bpc in any::<u64>(), world in any::<u64>(), align in any::<u64>(), bpb in any::<u64>()) {
        let mut w = Workload::new(l, t);
        w.max_concurrent_batches = c;
        w.dcp = dcp;
        w.max_encoder_tokens = t;
        for s in &specs {
            let _ = s.validate();
            let _ = s.page_bytes();
            let _ = s.stride_bytes();
            let _ = s.blocks_per_request_ceil(&w);
            let _ = s.max_memory_bytes(&w);
            let _ = s.window_cap_chunks(bpc);
        }
        for layout in [GroupedLayout::from_layers(&specs), GroupedLayout::from_groups(core::slice::from_ref(&specs))].into_iter().flatten() {
            for pool in [PoolLayout::LayerOutermost, PoolLayout::BlockOutermost] {
                let _ = layout.bytes_per_block(pool);
                let _ = layout.blocks_per_request(&w);
                let _ = worker_blocks(&layout, pool, mem, ovr);
                // Bounded length so the search stays fast in debug builds.
                let short = w.with_max_model_len(l % 100_000);
                let _ = check_admission(&layout, pool, &short, mem);
                if let Ok(stages) = layout.split_pipeline(usize::from(u8::try_from(world % 5).unwrap_or(1)))
                    && let Ok(cap) = gpu_capacity(&layout, &stages, pool, &short, mem, ovr)
                {
                    prop_assert!(cap.max_concurrency.den() >= 1);
                }
            }
        }
        let cfg = CpuTierConfig { cpu_bytes: cpu, blocks_per_chunk: bpc, world_size: world, replicated: c % 2 == 0, page_alignment: align };
        if let Ok(tier) = size_cpu_tier(&cfg, bpb, &specs, l) {
            prop_assert!(tier.kv_cache_size_bytes <= cpu);
        }
    }
}

/// vLLM's group-size heuristic breaks "adding a layer never gives more blocks" for hybrids:
/// 3 full + 4 sliding groups as (3 full), (4 sliding) → 4 pages per block, but 3 full +
/// 5 sliding groups as (3), (3, 2) → 3 pages per block, so one more layer gives more blocks.
#[test]
fn hybrid_regrouping_can_add_blocks() {
    let full = LayerSpec::attention(LayerKind::Full, 16, 2, 64, 4);
    let slide = LayerSpec::attention(
        LayerKind::SlidingWindow {
            window: 128,
            extra_retained_tokens: 0,
        },
        16,
        2,
        64,
        4,
    );
    let page = 16_384;
    let mut layers = vec![full; 3];
    layers.extend(vec![slide; 4]);
    let a = GroupedLayout::from_layers(&layers).unwrap();
    layers.push(slide);
    let b = GroupedLayout::from_layers(&layers).unwrap();
    assert_eq!(a.bytes_per_block(LO), Ok(4 * page));
    assert_eq!(b.bytes_per_block(LO), Ok(3 * page));
    let mem = 120 * page;
    assert_eq!(worker_blocks(&a, LO, mem, None).unwrap().num_blocks, 30);
    assert_eq!(worker_blocks(&b, LO, mem, None).unwrap().num_blocks, 40);
}
