//! Capacity arithmetic: the C14 cases of the spec and hand-computed cases for every spec kind,
//! grouping, the admission check and max-length search, and the CPU tier (A8, A12).

use kvtier_core::capacity::{
    AdmissionError, BlocksError, CpuTierConfig, CpuTierError, GroupedLayout, GroupingError,
    LayerKind, LayerSpec, PoolLayout, SizingError, SpecError, Workload, check_admission,
    chunks_per_request_ceil, gpu_capacity, kv_cache_size_tokens_floor, max_concurrency,
    max_concurrent_batches, max_fitting_len, min_across_workers, size_cpu_tier, worker_blocks,
};

const LO: PoolLayout = PoolLayout::LayerOutermost;
const BO: PoolLayout = PoolLayout::BlockOutermost;

/// Spec A of C14: full attention, block 16, 2 KV heads, head 64, fp32 → page 16 384.
fn spec_a() -> LayerSpec {
    LayerSpec::attention(LayerKind::Full, 16, 2, 64, 4)
}
const P: u64 = 16_384;

fn sw(block: u64, heads: u64, head: u64, dtype: u64, window: u64, extra: u64) -> LayerSpec {
    LayerSpec::attention(
        LayerKind::SlidingWindow {
            window,
            extra_retained_tokens: extra,
        },
        block,
        heads,
        head,
        dtype,
    )
}

fn one(layout: &GroupedLayout) -> [GroupedLayout; 1] {
    [layout.clone()]
}

// ---- C14 ----

#[test]
fn c14_two_full_layers_32_blocks() {
    assert_eq!(spec_a().page_bytes(), Ok(P));
    let layout = GroupedLayout::from_layers(&[spec_a(), spec_a()]).unwrap();
    assert_eq!(layout.num_groups(), 1);
    let w = worker_blocks(&layout, LO, 2 * 32 * P, None).unwrap();
    assert_eq!(w.bytes_per_block, 2 * P);
    assert_eq!(w.num_blocks, 32);
}

#[test]
fn c14_full_plus_swa_hybrid_64_blocks() {
    let layout = GroupedLayout::from_layers(&[spec_a(), sw(16, 2, 64, 4, 1, 0)]).unwrap();
    assert_eq!(layout.num_groups(), 2);
    assert_eq!(layout.groups()[0].layers(), &[0]);
    assert_eq!(layout.groups()[1].layers(), &[1]);
    let w = worker_blocks(&layout, LO, 2 * 32 * P, None).unwrap();
    assert_eq!(w.bytes_per_block, P);
    assert_eq!(w.num_blocks, 64);
    let cap = gpu_capacity(
        &layout,
        &one(&layout),
        LO,
        &Workload::new(128, 2048),
        2 * 32 * P,
        None,
    )
    .unwrap();
    assert_eq!(cap.num_blocks, 64);
    // full: cdiv(128,16) = 8; window 1: cdiv(min(0 + 2048, 128), 16) + 1 = 9.
    assert_eq!(cap.blocks_per_request, 17);
}

#[test]
fn c14_override_16() {
    let layout = GroupedLayout::from_layers(&[spec_a(), spec_a()]).unwrap();
    let w = worker_blocks(&layout, LO, 2 * 32 * P, Some(16)).unwrap();
    assert_eq!(w.num_blocks, 16);
    assert_eq!(w.effective_memory, 16 * 2 * P);
}

#[test]
fn c14_attention_free_one_block() {
    let layout = GroupedLayout::from_layers(&[]).unwrap();
    assert_eq!(layout.num_groups(), 0);
    let w = worker_blocks(&layout, LO, 1 << 30, None).unwrap();
    assert_eq!(w.num_blocks, 1);
    assert_eq!(
        worker_blocks(&layout, LO, 0, Some(99)).unwrap().num_blocks,
        1
    );
}

#[test]
fn c14_qwen15_7b_concurrency_1_5() {
    let spec = LayerSpec::attention(LayerKind::Full, 16, 32, 128, 2);
    assert_eq!(spec.page_bytes(), Ok(262_144));
    let layout = GroupedLayout::from_layers(&[spec; 32]).unwrap();
    let w = Workload::new(16_384, 1024);
    let cap = gpu_capacity(&layout, &one(&layout), LO, &w, 0, Some(1536)).unwrap();
    assert_eq!(cap.blocks_per_request, 1024);
    assert_eq!(
        (cap.max_concurrency.num(), cap.max_concurrency.den()),
        (3, 2)
    );
    assert_eq!(cap.kv_cache_size_tokens, 24_576);
}

// ---- per-kind pages and blocks per request ----

#[test]
fn mla_page_and_blocks() {
    // DeepSeek-V3-like: latent 512 + rope 64, one head, bf16, head_size_v = 0.
    let mla = LayerSpec::attention(LayerKind::Mla, 16, 1, 576, 2);
    assert_eq!(mla.head_size_v, 0);
    assert_eq!(mla.page_bytes(), Ok(18_432));
    let layout = GroupedLayout::from_layers(&[mla; 61]).unwrap();
    assert_eq!(layout.bytes_per_block(LO), Ok(61 * 18_432));
    assert_eq!(
        layout.blocks_per_request(&Workload::new(163_840, 8192)),
        Ok(10_240)
    );
}

#[test]
fn sliding_window_blocks() {
    let s = sw(16, 8, 128, 2, 4096, 0);
    // cdiv(min(4095 + 2048, 8192), 16) + 1 = 384 + 1
    assert_eq!(
        s.blocks_per_request_ceil(&Workload::new(8192, 2048)),
        Ok(385)
    );
    // L caps it: cdiv(4000, 16) + 1
    assert_eq!(
        s.blocks_per_request_ceil(&Workload::new(4000, 2048)),
        Ok(251)
    );
    // Extra retained tokens: window 10, extra 5, T 0, block 4: cdiv(14, 4) + 1 = 5.
    assert_eq!(
        sw(4, 1, 8, 2, 10, 5).blocks_per_request_ceil(&Workload::new(100, 0)),
        Ok(5)
    );
    // Async scheduling doubles T_inflight: cdiv(4095 + 4096, 16) + 1 = 512 + 1.
    let mut w = Workload::new(32_768, 2048);
    w.max_concurrent_batches = max_concurrent_batches(1, true, false);
    assert_eq!(w.max_concurrent_batches, 2);
    assert_eq!(s.blocks_per_request_ceil(&w), Ok(513));
    assert_eq!(s.max_memory_bytes(&w), Ok(513 * 65_536));
}

#[test]
fn chunked_local_blocks() {
    let c = LayerSpec::attention(LayerKind::ChunkedLocal { chunk: 8192 }, 16, 8, 128, 2);
    assert_eq!(
        c.blocks_per_request_ceil(&Workload::new(32_768, 2048)),
        Ok(640)
    );
    assert_eq!(
        c.blocks_per_request_ceil(&Workload::new(4096, 2048)),
        Ok(256)
    );
}

#[test]
fn mamba_blocks_and_align_mode() {
    let mut m = LayerSpec::mamba(16, 1000);
    m.kind = LayerKind::Mamba {
        state_bytes: 1000,
        speculative_blocks: 2,
        prefill_checkpoint_blocks: 1,
    };
    assert_eq!(m.page_bytes(), Ok(1000));
    let mut w = Workload::new(8192, 2048);
    assert_eq!(m.blocks_per_request_ceil(&w), Ok(3));
    w.mamba_align = true;
    assert_eq!(m.blocks_per_request_ceil(&w), Ok(5));
    assert_eq!(m.max_memory_bytes(&w), Ok(5000));
}

#[test]
fn cross_and_encoder_only_blocks() {
    let cross = LayerSpec::attention(LayerKind::Cross, 16, 20, 64, 2);
    let mut w = Workload::new(448, 2048);
    w.max_encoder_tokens = 1500;
    assert_eq!(cross.blocks_per_request_ceil(&w), Ok(94));
    let enc = LayerSpec::attention(LayerKind::EncoderOnly, 16, 20, 64, 2);
    assert_eq!(enc.blocks_per_request_ceil(&w), Ok(0));
}

#[test]
fn full_attention_with_dcp() {
    let mut w = Workload::new(1000, 2048);
    w.dcp = 4;
    // cdiv(cdiv(1000, 4), 16) = cdiv(250, 16) = 16
    assert_eq!(spec_a().blocks_per_request_ceil(&w), Ok(16));
    w.dcp = 0;
    assert_eq!(
        spec_a().blocks_per_request_ceil(&w),
        Err(SizingError::ZeroDcp)
    );
}

#[test]
fn padded_pages_and_alignment() {
    let mut s = spec_a();
    s.page_size_padded = Some(P + 100);
    assert_eq!(s.page_bytes(), Ok(P + 100));
    s.stride_alignment = 4096;
    assert_eq!(s.stride_bytes(), Ok(P + 4096));
    let layout = GroupedLayout::from_layers(&[s, s]).unwrap();
    // layer-outermost: Σ round_up(page, 4096); block-outermost: round_up(Σ page, 4096).
    assert_eq!(layout.bytes_per_block(LO), Ok(2 * (P + 4096)));
    assert_eq!(layout.bytes_per_block(BO), Ok(2 * P + 4096));
    s.page_size_padded = Some(P - 1);
    assert_eq!(
        s.page_bytes(),
        Err(SpecError::PaddedTooSmall {
            padded: P - 1,
            unpadded: P
        })
    );
}

#[test]
fn invalid_specs_are_typed_errors() {
    assert_eq!(
        LayerSpec::attention(LayerKind::Full, 0, 2, 64, 4).validate(),
        Err(SpecError::ZeroBlockSize)
    );
    assert_eq!(
        LayerSpec::attention(LayerKind::Full, 16, 0, 64, 4).validate(),
        Err(SpecError::ZeroKvHeads)
    );
    assert_eq!(
        sw(16, 2, 64, 4, 0, 0).validate(),
        Err(SpecError::ZeroWindow)
    );
    assert_eq!(
        LayerSpec::mamba(16, 0).validate(),
        Err(SpecError::ZeroStateBytes)
    );
    assert_eq!(
        LayerSpec::attention(LayerKind::Full, u64::MAX, 2, 64, 4).validate(),
        Err(SpecError::Overflow)
    );
    assert_eq!(
        GroupedLayout::from_layers(&[
            spec_a(),
            LayerSpec::attention(LayerKind::Full, 16, 0, 64, 4)
        ]),
        Err(GroupingError::Spec {
            layer: 1,
            error: SpecError::ZeroKvHeads
        })
    );
    assert_eq!(
        spec_a().blocks_per_request_ceil(&Workload::new(0, 1)),
        Err(SizingError::ZeroMaxModelLen)
    );
}

// ---- grouping ----

#[test]
fn gemma3_like_pattern_groups() {
    // Gemma-3-27B-like: 62 layers, every 6th full: 10 full, 52 sliding (window 1024), 16 KV heads, head 256.
    let full = LayerSpec::attention(LayerKind::Full, 16, 16, 256, 2);
    let slide = sw(16, 16, 256, 2, 1024, 0);
    let layers: Vec<LayerSpec> = (0..62)
        .map(|i| if (i + 1) % 6 == 0 { full } else { slide })
        .collect();
    let layout = GroupedLayout::from_layers(&layers).unwrap();
    // group_size = 10 (52 ≥ 1.5·10): 6 sliding groups (9,9,9,9,8,8) and 1 full group of 10.
    let sizes: Vec<usize> = layout.groups().iter().map(|g| g.layers().len()).collect();
    assert_eq!(sizes, vec![9, 9, 9, 9, 8, 8, 10]);
    // Strided split: the first sliding group takes sliding layers 0, 6, 12, … of the bucket.
    assert_eq!(&layout.groups()[0].layers()[..3], &[0, 7, 14]);
    let page = 16 * 16 * 512 * 2;
    assert_eq!(layout.bytes_per_block(LO), Ok(10 * page));
    // full: 131072/16 = 8192; sliding: cdiv(1023 + 8192, 16) + 1 = 577, six groups.
    assert_eq!(
        layout.blocks_per_request(&Workload::new(131_072, 8192)),
        Ok(8192 + 6 * 577)
    );
}

#[test]
fn group_size_rule_uses_max_when_close() {
    let full = spec_a();
    let slide = sw(16, 2, 64, 4, 128, 0);
    // 12 sliding + 13 full: 13 < 1.5·12 → group size 13, one group each.
    let mut layers = vec![slide; 12];
    layers.extend(vec![full; 13]);
    let layout = GroupedLayout::from_layers(&layers).unwrap();
    let sizes: Vec<usize> = layout.groups().iter().map(|g| g.layers().len()).collect();
    assert_eq!(sizes, vec![12, 13]);
    // 20 full + 30 sliding: 30 is not < 30 → group size 20: full 1 group, sliding 2 of 15.
    let mut layers = vec![full; 20];
    layers.extend(vec![slide; 30]);
    let layout = GroupedLayout::from_layers(&layers).unwrap();
    let sizes: Vec<usize> = layout.groups().iter().map(|g| g.layers().len()).collect();
    assert_eq!(sizes, vec![20, 15, 15]);
}

#[test]
fn page_unification_scales_or_pads() {
    // Sliding layer with half the page (1 head): block size scaled ×2 to 32.
    let layout = GroupedLayout::from_layers(&[spec_a(), sw(16, 1, 64, 4, 64, 0)]).unwrap();
    assert_eq!(layout.layers()[1].block_size, 32);
    assert_eq!(layout.page_bytes(1), Some(P));
    // 3 heads vs 2 heads: 2·x does not divide 3·x → padded to the larger page.
    let big = sw(16, 3, 64, 4, 64, 0);
    let layout = GroupedLayout::from_layers(&[spec_a(), big]).unwrap();
    assert_eq!(layout.layers()[0].page_size_padded, Some(3 * P / 2));
    assert_eq!(layout.layers()[0].block_size, 16);
    // Mamba is always padded.
    let layout = GroupedLayout::from_layers(&[spec_a(), LayerSpec::mamba(16, 1000)]).unwrap();
    assert_eq!(layout.layers()[1].page_size_padded, Some(P));
    // MLA that does not divide: typed error.
    let mla = LayerSpec::attention(LayerKind::Mla, 16, 1, 100, 4);
    assert_eq!(
        GroupedLayout::from_layers(&[sw(16, 2, 64, 4, 64, 0), mla]),
        Err(GroupingError::NotUnifiable { layer: 1 })
    );
}

#[test]
fn uniform_type_group_sums_member_pages() {
    let a = LayerSpec::attention(LayerKind::Full, 16, 16, 128, 2);
    let b = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
    let layout = GroupedLayout::from_layers(&[a, b, a, b]).unwrap();
    assert_eq!(layout.num_groups(), 1);
    assert_eq!(layout.group_page_bytes(0), Ok(2 * 131_072 + 2 * 65_536));
    assert_eq!(layout.blocks_per_request(&Workload::new(1000, 8)), Ok(63));
}

#[test]
fn explicit_groups() {
    let layout =
        GroupedLayout::from_groups(&[vec![spec_a(); 3], vec![sw(16, 2, 64, 4, 32, 0); 3]]).unwrap();
    assert_eq!(layout.num_groups(), 2);
    assert_eq!(layout.bytes_per_block(LO), Ok(3 * P));
    assert_eq!(
        GroupedLayout::from_groups(&[vec![spec_a()], vec![]]),
        Err(GroupingError::EmptyGroup { group: 1 })
    );
}

// ---- admission, max length, workers ----

fn llama8b_like() -> GroupedLayout {
    GroupedLayout::from_layers(&[LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2); 32])
        .expect("valid layout")
}

#[test]
fn admission_too_long_carries_max_fitting_len() {
    let layout = llama8b_like();
    let bpb = 2_097_152; // 32 · 65 536
    assert_eq!(layout.bytes_per_block(LO), Ok(bpb));
    let w = Workload::new(8192, 8192);
    // 512 MiB: 256 blocks, 255 after the null block → 255 · 16 = 4080 tokens fit.
    let err = check_admission(&layout, LO, &w, 1 << 29).unwrap_err();
    assert_eq!(
        err,
        AdmissionError::TooLong {
            needed: 512 * bpb,
            available: (1 << 29) - bpb,
            max_model_len: 8192,
            max_fitting_len: 4080
        }
    );
    assert_eq!(max_fitting_len(&layout, LO, &w, (1 << 29) - bpb), Ok(4080));
    // Exactly 513 blocks: the request fits.
    assert_eq!(check_admission(&layout, LO, &w, 513 * bpb), Ok(512 * bpb));
    assert!(check_admission(&layout, LO, &w, 512 * bpb).is_err());
    // Not even one token: 0.
    assert_eq!(max_fitting_len(&layout, LO, &w, bpb - 1), Ok(0));
    // Nothing after the null block.
    assert_eq!(
        check_admission(&layout, LO, &w, bpb),
        Err(AdmissionError::NoMemory {
            available: bpb,
            bytes_per_block: bpb
        })
    );
    assert!(
        err.to_string()
            .contains("estimated maximum model length is 4080")
    );
}

#[test]
fn max_fitting_len_with_sliding_window_plateau() {
    // A sliding window stops growing at W − 1 + T: any length fits once the plateau fits.
    let layout = GroupedLayout::from_layers(&[sw(16, 2, 64, 4, 64, 0)]).unwrap();
    let w = Workload::new(1_000_000, 64);
    // blocks = cdiv(min(127, L), 16) + 1 ≤ 9 for every L.
    assert_eq!(max_fitting_len(&layout, LO, &w, 9 * P), Ok(1_000_000));
    // 8 blocks of memory: cdiv(L,16)+1 ≤ 8 ⇔ L ≤ 112.
    assert_eq!(max_fitting_len(&layout, LO, &w, 8 * P), Ok(112));
}

#[test]
fn pipeline_workers_take_the_minimum() {
    // 3 layers over 2 stages: the remainder goes to the second-to-last stage → [2, 1].
    let layout = GroupedLayout::from_layers(&[spec_a(); 3]).unwrap();
    let stages = layout.split_pipeline(2).unwrap();
    assert_eq!(stages[0].bytes_per_block(LO), Ok(2 * P));
    assert_eq!(stages[1].bytes_per_block(LO), Ok(P));
    let cap = gpu_capacity(&layout, &stages, LO, &Workload::new(160, 16), 100 * P, None).unwrap();
    assert_eq!(cap.num_blocks, 50);
    assert_eq!(min_across_workers(&[]), Err(BlocksError::NoWorkers));
}

// ---- concurrency and tokens ----

#[test]
fn concurrency_ratio_is_reduced() {
    let r = max_concurrency(1536, 1024).unwrap();
    assert_eq!((r.num(), r.den()), (3, 2));
    assert_eq!(r.to_string(), "3/2");
    assert_eq!(r.mul_floor(16_384), Some(24_576));
}

#[test]
fn float_product_differs_from_exact_floor() {
    // Full attention, block 16, L = 12 000 → 750 blocks per request; 784 blocks.
    // Exact: 784 · 12 000 / 750 = 12 544. vLLM: int(784/750 · 12000) = 12 543.
    let layout = GroupedLayout::from_layers(&[spec_a()]).unwrap();
    let w = Workload::new(12_000, 2048);
    let cap = gpu_capacity(&layout, &one(&layout), LO, &w, 0, Some(784)).unwrap();
    assert_eq!(cap.blocks_per_request, 750);
    assert_eq!(cap.kv_cache_size_tokens, 12_544);
    assert_eq!(
        kvtier_cli::sizing::vllm_float_tokens(784, 12_000, 750),
        Some(12_543)
    );
    // Another: 1001 blocks, L = 4000 (250 per request): exact 16 016, float 16 015.
    assert_eq!(kv_cache_size_tokens_floor(1001, 4000, 250), Ok(16_016));
    assert_eq!(
        kvtier_cli::sizing::vllm_float_tokens(1001, 4000, 250),
        Some(16_015)
    );
}

// ---- CPU tier ----

#[test]
fn cpu_tier_llama8b_like() {
    // Only the group's block size matters for tokens; the bytes per block come from the GPU pool.
    let full = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
    let bpb = 32 * 65_536; // 2 MiB per block
    let mut cfg = CpuTierConfig::new(1 << 30);
    let t = size_cpu_tier(&cfg, bpb, &[full], 8192).unwrap();
    assert_eq!(
        (t.kv_bytes_per_chunk, t.aligned_chunk_bytes, t.num_chunks),
        (bpb, bpb, 512)
    );
    assert_eq!(t.kv_cache_size_bytes, 1 << 30);
    assert_eq!(t.kv_cache_size_tokens, Some(8192));
    cfg.world_size = 2;
    let t = size_cpu_tier(&cfg, bpb, &[full], 8192).unwrap();
    assert_eq!(t.num_chunks, 256);
    assert_eq!(t.kv_cache_size_tokens, Some(4096));
    cfg.replicated = true;
    assert_eq!(
        size_cpu_tier(&cfg, bpb, &[full], 8192).unwrap().num_chunks,
        512
    );
}

#[test]
fn cpu_tier_page_alignment_padding() {
    let t = size_cpu_tier(&CpuTierConfig::new(100_000), 5000, &[spec_a()], 16).unwrap();
    assert_eq!(t.kv_bytes_per_chunk, 5000);
    assert_eq!(t.aligned_chunk_bytes, 8192);
    assert_eq!(t.num_chunks, 12);
    assert_eq!(t.kv_cache_size_bytes, 98_304);
    let info = t.config_info();
    // One chunk per request of 16 tokens: 12 · 16 / 1.
    assert_eq!(info.values(), [Some(12), Some(1), Some(98_304), Some(192)]);
}

#[test]
fn cpu_tier_window_caps() {
    let full = spec_a();
    let slide = sw(16, 2, 64, 4, 4096, 0);
    // b = 4 → 64 tokens per chunk; L = 32768: full 512 chunks, window cap max(64, 64) = 64.
    assert_eq!(chunks_per_request_ceil(&[full, slide], 4, 32_768), Ok(576));
    assert_eq!(slide.window_cap_chunks(64), Ok(Some(64)));
    // Extra retained 100: cdiv(4195, 64) = 66.
    assert_eq!(
        sw(16, 2, 64, 4, 4096, 100).window_cap_chunks(64),
        Ok(Some(66))
    );
    // Chunked local 8192 at 16 tokens per chunk: 512; Mamba: 1; full: none.
    let chunked = LayerSpec::attention(LayerKind::ChunkedLocal { chunk: 8192 }, 16, 2, 64, 4);
    assert_eq!(chunked.window_cap_chunks(16), Ok(Some(512)));
    assert_eq!(LayerSpec::mamba(16, 100).window_cap_chunks(16), Ok(Some(1)));
    assert_eq!(full.window_cap_chunks(16), Ok(None));
    let mut cfg = CpuTierConfig::new(1000 * 4096);
    cfg.blocks_per_chunk = 4;
    let t = size_cpu_tier(&cfg, 1024, &[full, slide], 32_768).unwrap();
    assert_eq!(t.num_chunks, 1000);
    // ⌊1000 · 32768 / 576⌋ = 56 888
    assert_eq!(t.kv_cache_size_tokens, Some(56_888));
}

#[test]
fn cpu_tier_zero_capacity_and_none() {
    let cfg = CpuTierConfig::new(1 << 30);
    let t = size_cpu_tier(&cfg, 0, &[spec_a()], 1024).unwrap();
    assert_eq!(
        (t.num_chunks, t.kv_bytes_per_chunk, t.kv_cache_size_bytes),
        (0, 0, 0)
    );
    assert_eq!(t.kv_cache_size_tokens, Some(0));
    let mut zero_world = cfg;
    zero_world.world_size = 0;
    assert_eq!(
        size_cpu_tier(&zero_world, 5000, &[spec_a()], 1024)
            .unwrap()
            .num_chunks,
        0
    );
    // Smaller than one chunk: 0 chunks.
    assert_eq!(
        size_cpu_tier(&CpuTierConfig::new(4095), 1, &[spec_a()], 1024)
            .unwrap()
            .num_chunks,
        0
    );
    // None where vLLM reports None: no group, or L = 0.
    assert_eq!(
        size_cpu_tier(&cfg, 5000, &[], 1024)
            .unwrap()
            .kv_cache_size_tokens,
        None
    );
    assert_eq!(
        size_cpu_tier(&cfg, 5000, &[spec_a()], 0)
            .unwrap()
            .kv_cache_size_tokens,
        None
    );
    assert_eq!(
        size_cpu_tier(&cfg, 5000, &[], 1024)
            .unwrap()
            .config_info()
            .values()[3],
        None
    );
    // Errors.
    assert_eq!(
        size_cpu_tier(&CpuTierConfig::new(0), 5000, &[], 1024),
        Err(CpuTierError::NoCpuBytes)
    );
    let mut c = cfg;
    c.blocks_per_chunk = 0;
    assert_eq!(
        size_cpu_tier(&c, 5000, &[], 1024),
        Err(CpuTierError::ZeroBlocksPerChunk)
    );
    let zero_block = LayerSpec::attention(LayerKind::Full, 0, 2, 64, 4);
    assert_eq!(
        size_cpu_tier(&cfg, 5000, &[zero_block], 1024),
        Err(CpuTierError::ZeroTokensPerBlock { group: 0 })
    );
}

/// The Llama-3-8B hand check the firmware also runs (`tests/firmware`).
#[test]
fn llama_3_8b_hand_check_shared_with_the_firmware() {
    kvtier_tests::scenarios::capacity_llama_3_8b();
}
