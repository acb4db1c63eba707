//! Wire-codec benchmarks (divan): kvtier's canonical encoding against vLLM's IPC transport
//! (msgpack of the stats dict), on a 30-series payload shaped like one offload step.
//!
//! Run with `cargo bench -p kvtier-tests --bench wire`. The byte sizes of both encodings are
//! printed before the timings.
//!
//! The payload: the CPU manager's three usage gauges, its allocation-size histogram and
//! `stores_skipped`; the connector's load/store bytes, times and size histograms, the two lookup
//! delay histograms and the allocation-failure counter; the config info series; the simple
//! offloader's seven outcomes, loads, used and pending gauges and info gauge; and the five
//! `prompt_tokens_cached_by_source` counters. In vLLM's dict, histograms are the raw observation
//! lists of the step (2 loads, 3 stores, 1 allocation, 8 sync lookups, 1 deferred lookup), and
//! times and gauges are Python floats.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::collections::BTreeMap;

use divan::{Bencher, black_box};
use kvtier_core::stats::catalogue::*;
use kvtier_core::stats::simple_offload::{SaveOutcome, SimpleOffloadConfig, SimpleOffloadStats};
use kvtier_core::stats::{Gauge, InfoSeries, InfoValue, Payload, wire};
use serde::{Deserialize, Serialize};

const LOAD_SIZES: [u64; 2] = [4_194_304, 8_388_608];
const STORE_SIZES: [u64; 3] = [2_097_152, 4_194_304, 16_777_216];
const SYNC_DELAYS_NS: [u64; 8] = [12_000, 8_500, 31_000, 9_900, 15_250, 7_800, 44_100, 10_300];
const ASYNC_DELAY_NS: u64 = 2_350_000;

fn step_payload() -> Payload {
    let mut p = Payload::new();
    let g = |n, d| Gauge::fraction(n, d);
    p.set_gauge(CPU_CACHE_USAGE_PERC, &[], g(37, 16_384))
        .unwrap();
    p.set_gauge(CPU_CACHE_WRITE_USAGE_PERC, &[], g(21, 16_384))
        .unwrap();
    p.set_gauge(CPU_CACHE_READ_USAGE_PERC, &[], g(16, 16_384))
        .unwrap();
    p.observe(CPU_ALLOCATION_SIZE, &[], 21).unwrap();
    p.increase_counter(STORES_SKIPPED, &[], 3).unwrap();
    p.increase_counter(LOAD_BYTES, &[], LOAD_SIZES.iter().sum())
        .unwrap();
    p.increase_counter(LOAD_TIME, &[], 1_730_000).unwrap();
    for s in LOAD_SIZES {
        p.observe(LOAD_SIZE, &[], s).unwrap();
    }
    p.increase_counter(STORE_BYTES, &[], STORE_SIZES.iter().sum())
        .unwrap();
    p.increase_counter(STORE_TIME, &[], 2_915_000).unwrap();
    for s in STORE_SIZES {
        p.observe(STORE_SIZE, &[], s).unwrap();
    }
    for d in SYNC_DELAYS_NS {
        p.observe(LOOKUP_SYNC_DELAY_SECONDS, &[], d).unwrap();
    }
    p.observe(LOOKUP_ASYNC_DELAY_SECONDS, &[], ASYNC_DELAY_NS)
        .unwrap();
    p.increase_counter(ALLOCATION_FAILURE, &[], 0).unwrap();
    let info = InfoSeries::new()
        .with("cpu_num_chunks", InfoValue::Int(16_384))
        .and_then(|s| s.with("cpu_blocks_per_chunk", InfoValue::Int(1)))
        .and_then(|s| s.with("cpu_kv_cache_size_bytes", InfoValue::Int(4_294_967_296)))
        .and_then(|s| s.with("cpu_kv_cache_size_tokens", InfoValue::Int(262_144)))
        .unwrap();
    p.set_info(vec![info]).unwrap();

    let mut simple = SimpleOffloadStats::new(SimpleOffloadConfig::new(65_536));
    for (i, o) in SaveOutcome::ALL.into_iter().enumerate() {
        simple.record(o, 1 + i as u64 * 3);
    }
    simple.record_load_completed(48);
    p.aggregate(&simple.drain(65_000, 24)).unwrap();

    for (i, source) in CACHE_HIT_SOURCES.into_iter().enumerate() {
        p.increase_counter(PROMPT_TOKENS_CACHED_BY_SOURCE, &[source], 1024 * i as u64)
            .unwrap();
    }
    assert_eq!(p.len(), 30);
    p
}

// ---- vLLM's dict, as serde structs for rmp-serde (msgpack) ----

/// A value in vLLM's `data` section: an int, a float, or a histogram's observation list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum PyValue {
    Int(u64),
    Float(f64),
    Ints(Vec<u64>),
    Floats(Vec<f64>),
}

/// `{"types": {...}, "data": {name: {labeltuple: value}}, "info": [...] | None}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct VllmStats {
    types: BTreeMap<String, String>,
    data: BTreeMap<String, BTreeMap<Vec<String>, PyValue>>,
    info: Option<Vec<BTreeMap<String, u64>>>,
}

fn vllm_dict() -> VllmStats {
    let mut types = BTreeMap::new();
    let mut data: BTreeMap<String, BTreeMap<Vec<String>, PyValue>> = BTreeMap::new();
    let mut put = |name: &str, kind: &str, labels: &[&str], v: PyValue| {
        types.insert(name.to_owned(), kind.to_owned());
        data.entry(name.to_owned())
            .or_default()
            .insert(labels.iter().map(|s| (*s).to_owned()).collect(), v);
    };
    let secs = |ns: u64| ns as f64 / 1e9;
    put(
        CPU_CACHE_USAGE_PERC,
        "gauge",
        &[],
        PyValue::Float(37.0 / 16_384.0),
    );
    put(
        CPU_CACHE_WRITE_USAGE_PERC,
        "gauge",
        &[],
        PyValue::Float(21.0 / 16_384.0),
    );
    put(
        CPU_CACHE_READ_USAGE_PERC,
        "gauge",
        &[],
        PyValue::Float(16.0 / 16_384.0),
    );
    put(
        CPU_ALLOCATION_SIZE,
        "histogram",
        &[],
        PyValue::Ints(vec![21]),
    );
    put(STORES_SKIPPED, "counter", &[], PyValue::Int(3));
    put(
        LOAD_BYTES,
        "counter",
        &[],
        PyValue::Int(LOAD_SIZES.iter().sum()),
    );
    put(LOAD_TIME, "counter", &[], PyValue::Float(secs(1_730_000)));
    put(
        LOAD_SIZE,
        "histogram",
        &[],
        PyValue::Ints(LOAD_SIZES.to_vec()),
    );
    put(
        STORE_BYTES,
        "counter",
        &[],
        PyValue::Int(STORE_SIZES.iter().sum()),
    );
    put(STORE_TIME, "counter", &[], PyValue::Float(secs(2_915_000)));
    put(
        STORE_SIZE,
        "histogram",
        &[],
        PyValue::Ints(STORE_SIZES.to_vec()),
    );
    let sync = SYNC_DELAYS_NS.iter().map(|d| secs(*d)).collect();
    put(
        LOOKUP_SYNC_DELAY_SECONDS,
        "histogram",
        &[],
        PyValue::Floats(sync),
    );
    let asyn = vec![secs(ASYNC_DELAY_NS)];
    put(
        LOOKUP_ASYNC_DELAY_SECONDS,
        "histogram",
        &[],
        PyValue::Floats(asyn),
    );
    put(ALLOCATION_FAILURE, "counter", &[], PyValue::Int(0));
    for (i, o) in SaveOutcome::ALL.into_iter().enumerate() {
        put(
            SIMPLE_SAVE_OUTCOMES,
            "counter",
            &[o.label()],
            PyValue::Int(1 + i as u64 * 3),
        );
    }
    put(SIMPLE_LOAD_BLOCKS, "counter", &[], PyValue::Int(48));
    put(SIMPLE_USED_BLOCKS, "gauge", &[], PyValue::Int(536));
    put(SIMPLE_PENDING_STORE_BLOCKS, "gauge", &[], PyValue::Int(24));
    put(
        SIMPLE_INFO,
        "gauge",
        &["cpu", "false", "false", "65536"],
        PyValue::Int(1),
    );
    for (i, source) in CACHE_HIT_SOURCES.into_iter().enumerate() {
        put(
            PROMPT_TOKENS_CACHED_BY_SOURCE,
            "counter",
            &[source],
            PyValue::Int(1024 * i as u64),
        );
    }
    let info = BTreeMap::from([
        ("cpu_num_chunks".to_owned(), 16_384),
        ("cpu_blocks_per_chunk".to_owned(), 1),
        ("cpu_kv_cache_size_bytes".to_owned(), 4_294_967_296),
        ("cpu_kv_cache_size_tokens".to_owned(), 262_144),
    ]);
    VllmStats {
        types,
        data,
        info: Some(vec![info]),
    }
}

fn main() {
    let p = step_payload();
    let kv = wire::encoded_len(&p);
    let mp = rmp_serde::to_vec(&vllm_dict()).unwrap().len();
    let mp_named = rmp_serde::to_vec_named(&vllm_dict()).unwrap().len();
    println!(
        "30-series step payload: kvtier wire {kv} bytes; vLLM dict as msgpack {mp_named} bytes \
         (struct-as-map, as msgspec writes a dict), {mp} bytes (struct-as-array)"
    );
    divan::main();
}

#[divan::bench]
fn kvtier_encode(bencher: Bencher) {
    let p = step_payload();
    let mut buf = vec![0u8; wire::encoded_len(&p)];
    bencher.bench_local(|| wire::encode(black_box(&p), black_box(&mut buf)));
}

#[divan::bench]
fn kvtier_decode(bencher: Bencher) {
    let bytes = wire::encode_to_vec(&step_payload());
    bencher.bench_local(|| wire::decode(black_box(&bytes)));
}

#[divan::bench]
fn kvtier_encode_decode(bencher: Bencher) {
    let p = step_payload();
    let mut buf = vec![0u8; wire::encoded_len(&p)];
    bencher.bench_local(|| {
        let n = wire::encode(black_box(&p), &mut buf).unwrap_or(0);
        wire::decode(black_box(&buf[..n]))
    });
}

/// The borrowed view: validated as `decode` validates, series walked, nothing allocated.
#[divan::bench]
fn kvtier_decode_view(bencher: Bencher) {
    let bytes = wire::encode_to_vec(&step_payload());
    bencher.bench_local(|| {
        wire::decode_view(black_box(&bytes))
            .map(|v| v.series().map(|s| s.labels.len()).sum::<usize>())
    });
}

#[divan::bench]
fn kvtier_encode_decode_view(bencher: Bencher) {
    let p = step_payload();
    let mut buf = vec![0u8; wire::encoded_len(&p)];
    bencher.bench_local(|| {
        let n = wire::encode(black_box(&p), &mut buf).unwrap_or(0);
        wire::decode_view(black_box(&buf[..n])).map(|v| v.len())
    });
}

#[divan::bench]
fn kvtier_aggregate(bencher: Bencher) {
    let p = step_payload();
    let mut acc = step_payload();
    acc.aggregate(&p).unwrap();
    bencher
        .with_inputs(|| acc.clone())
        .bench_local_refs(|a| a.aggregate(black_box(&p)));
}

#[divan::bench]
fn msgpack_encode(bencher: Bencher) {
    let d = vllm_dict();
    bencher.bench_local(|| rmp_serde::to_vec_named(black_box(&d)));
}

#[divan::bench]
fn msgpack_decode(bencher: Bencher) {
    let bytes = rmp_serde::to_vec_named(&vllm_dict()).unwrap();
    bencher.bench_local(|| rmp_serde::from_slice::<VllmStats>(black_box(&bytes)));
}

#[divan::bench]
fn msgpack_encode_decode(bencher: Bencher) {
    let d = vllm_dict();
    bencher.bench_local(|| {
        let bytes = rmp_serde::to_vec_named(black_box(&d)).unwrap_or_default();
        rmp_serde::from_slice::<VllmStats>(black_box(&bytes))
    });
}
