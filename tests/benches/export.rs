//! Exporter benchmarks (divan): the cost of `observe` (one engine's drained payload into the
//! exporter's totals) and of one scrape (gather + text encoding) with 8 engines.
//!
//! Run with `cargo bench -p kvtier-tests --bench export`.
//!
//! The payload is one offload step of a CPU tier: the manager's three usage gauges, its
//! allocation-size histogram and `stores_skipped`, the connector's load/store bytes, times and
//! size histograms, two lookup-delay histograms, the allocation-failure counter and the config
//! info series (12 series). Each of the 8 engines has observed it once before a scrape.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use divan::{Bencher, black_box};
use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
use kvtier_core::stats::CpuTierInfo;
use kvtier_core::stats::{Gauge, Payload, catalogue};

fn main() {
    divan::main();
}

fn step_payload() -> Payload {
    let mut p = Payload::new();
    p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(3, 16))
        .unwrap();
    p.set_gauge(
        catalogue::CPU_CACHE_WRITE_USAGE_PERC,
        &[],
        Gauge::fraction(1, 8),
    )
    .unwrap();
    p.set_gauge(
        catalogue::CPU_CACHE_READ_USAGE_PERC,
        &[],
        Gauge::fraction(1, 16),
    )
    .unwrap();
    p.observe(catalogue::CPU_ALLOCATION_SIZE, &[], 12).unwrap();
    p.increase_counter(catalogue::STORES_SKIPPED, &[], 4)
        .unwrap();
    p.increase_counter(catalogue::LOAD_BYTES, &[], 12_582_912)
        .unwrap();
    p.increase_counter(catalogue::LOAD_TIME, &[], 1_250_000)
        .unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], 4_194_304).unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], 8_388_608).unwrap();
    p.increase_counter(catalogue::STORE_BYTES, &[], 23_068_672)
        .unwrap();
    p.increase_counter(catalogue::STORE_TIME, &[], 2_500_000)
        .unwrap();
    p.observe(catalogue::STORE_SIZE, &[], 16_777_216).unwrap();
    p.observe(catalogue::LOOKUP_SYNC_DELAY_SECONDS, &[], 12_000)
        .unwrap();
    p.observe(catalogue::LOOKUP_ASYNC_DELAY_SECONDS, &[], 2_350_000)
        .unwrap();
    p.increase_counter(catalogue::ALLOCATION_FAILURE, &[], 1)
        .unwrap();
    let info = CpuTierInfo {
        num_chunks: 16_384,
        blocks_per_chunk: 1,
        kv_cache_size_bytes: Some(34_359_738_368),
        kv_cache_size_tokens: Some(262_144),
    };
    p.set_info(vec![info.to_info_series()]).unwrap();
    p
}

#[divan::bench]
fn observe(bencher: Bencher) {
    let registry = prometheus::Registry::new();
    let ex = OffloadExporter::register(&registry, ExporterConfig::new("m", 1)).unwrap();
    let p = step_payload();
    bencher.bench_local(|| ex.observe(black_box(&p), 0).unwrap());
}

#[divan::bench]
fn scrape_8_engines(bencher: Bencher) {
    let registry = prometheus::Registry::new();
    let ex = OffloadExporter::register(&registry, ExporterConfig::new("m", 8)).unwrap();
    let p = step_payload();
    for engine in 0..8 {
        ex.observe(&p, engine).unwrap();
    }
    let bytes = encode_text(&registry).unwrap().len();
    println!("one scrape with 8 engines: {bytes} bytes of text");
    bencher.bench_local(|| black_box(encode_text(black_box(&registry)).unwrap()));
}
