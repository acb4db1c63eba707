//! Scenario ports of spec (c) C11 (OffloadingConnectorStats) and C12 (SimpleCPUOffloadStats),
//! plus the Prometheus exposition of such payloads.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::collections::BTreeMap;

use kvtier::export::RenderError;
use kvtier::export::{ExporterConfig, ObserveError, render};
use kvtier_core::stats::catalogue::SeriesMismatch;
use kvtier_core::stats::catalogue::*;
use kvtier_core::stats::simple_offload::{SaveOutcome, SimpleOffloadConfig, SimpleOffloadStats};
use kvtier_core::stats::{AggregateError, Gauge, InfoSeries, InfoValue, MetricKind, Payload};

fn reduced(p: &Payload) -> BTreeMap<String, f64> {
    let r = p.reduce();
    let map: BTreeMap<String, f64> = r.iter().cloned().collect();
    assert_eq!(map.len(), r.len(), "duplicate reduce keys");
    map
}

fn expect(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

const X: &str = "x";

/// C11's payload `s`.
fn c11_s() -> Payload {
    let mut s = Payload::new();
    s.increase_counter(LOAD_BYTES, &[], 100).unwrap();
    s.increase_counter(LOAD_TIME, &[], 500_000_000).unwrap(); // 0.5 s
    s.observe(LOAD_SIZE, &[], 100).unwrap();
    s.set_gauge(CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4))
        .unwrap();
    s.increase_counter(X, &["a"], 2).unwrap();
    s
}

#[test]
fn c11_new_payload_is_empty() {
    let p = Payload::new();
    assert!(p.is_empty());
    assert!(p.reduce().is_empty());
    assert_eq!(p.len(), 0);
    assert_eq!(p.info(), None);
}

#[test]
fn c11_reduce_of_s() {
    assert_eq!(
        reduced(&c11_s()),
        expect(&[
            ("vllm:kv_offload_load_bytes", 100.0),
            ("vllm:kv_offload_load_time", 0.5),
            ("vllm:kv_offload_load_size_count", 1.0),
            ("vllm:kv_offload_load_size_sum", 100.0),
            ("vllm:kv_offload_cpu_cache_usage_perc", 0.25),
            ("x:('a',)", 2.0),
        ])
    );
}

#[test]
fn c11_aggregate_sums_counters_merges_histograms_and_takes_the_latest_gauge() {
    let mut s = c11_s();
    let mut o = Payload::new();
    o.increase_counter(LOAD_BYTES, &[], 50).unwrap();
    o.observe(LOAD_SIZE, &[], 50).unwrap();
    o.set_gauge(CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(3, 4))
        .unwrap();
    o.increase_counter(X, &["a"], 3).unwrap();
    o.increase_counter(X, &["b"], 1).unwrap();
    s.aggregate(&o).unwrap();
    assert_eq!(
        reduced(&s),
        expect(&[
            ("vllm:kv_offload_load_bytes", 150.0),
            ("vllm:kv_offload_load_time", 0.5),
            ("vllm:kv_offload_load_size_count", 2.0),
            ("vllm:kv_offload_load_size_sum", 150.0),
            ("vllm:kv_offload_cpu_cache_usage_perc", 0.75),
            ("x:('a',)", 5.0),
            ("x:('b',)", 1.0),
        ])
    );
    // Integer-exact underneath.
    assert_eq!(s.counter(LOAD_TIME, &[]), Some(500_000_000));
    assert_eq!(s.gauge(CPU_CACHE_USAGE_PERC, &[]), Gauge::ratio(3, 4));
    let h = s.histogram(LOAD_SIZE, &[]).unwrap();
    assert_eq!(h.bucket_counts()[0], 2, "50 and 100 bytes are both ≤ 1e6");
}

fn cpu_info() -> Vec<InfoSeries> {
    let series = InfoSeries::new()
        .with("cpu_num_chunks", InfoValue::Int(4))
        .unwrap()
        .with("cpu_kv_cache_size_tokens", InfoValue::None)
        .unwrap();
    vec![series]
}

#[test]
fn c11_info_only_payload_is_not_empty_and_survives() {
    let mut info = Payload::new();
    info.set_info(cpu_info()).unwrap();
    assert!(!info.is_empty());
    assert!(info.reduce().is_empty());

    let mut acc = Payload::new();
    acc.aggregate(&info).unwrap();
    assert_eq!(acc.info(), Some(cpu_info().as_slice()));
    acc.aggregate(&Payload::new()).unwrap();
    acc.aggregate(&c11_s()).unwrap();
    assert_eq!(
        acc.info(),
        Some(cpu_info().as_slice()),
        "a payload without info keeps it"
    );
    assert_eq!(acc.len(), 5);
}

#[test]
fn c11_type_conflict_is_a_typed_error_and_changes_nothing() {
    // vLLM: a data key without a type raises AssertionError("Unknown offloading stats key: k").
    // A kvtier payload cannot hold a value without a kind; what can go wrong is a conflict.
    let mut s = c11_s();
    let mut o = Payload::new();
    o.increase_counter(LOAD_BYTES, &[], 1).unwrap();
    o.set_gauge(X, &["z"], Gauge::int(1)).unwrap();
    let before = s.clone();
    let err = s.aggregate(&o).unwrap_err();
    assert_eq!(
        err,
        AggregateError::KindConflict {
            name: X.into(),
            existing: MetricKind::Counter,
            other: MetricKind::Gauge
        }
    );
    assert_eq!(
        err.to_string(),
        "stats key x is a counter here and a gauge in the other payload"
    );
    assert_eq!(s, before, "load_bytes was not half-applied");
}

fn simple(pairs: &[(&str, u64)], used: i64) -> Payload {
    let mut p = Payload::new();
    for (outcome, n) in pairs {
        p.increase_counter(SIMPLE_SAVE_OUTCOMES, &[outcome], *n)
            .unwrap();
    }
    p.set_gauge(SIMPLE_USED_BLOCKS, &[], Gauge::int(used))
        .unwrap();
    p
}

#[test]
fn c12_empty_and_aggregate() {
    assert!(Payload::new().is_empty());
    assert!(Payload::new().reduce().is_empty());
    let mut s1 = simple(&[("stored", 3), ("dropped_cpu_full", 1)], 7);
    let s2 = simple(&[("stored", 4)], 2);
    s1.aggregate(&s2).unwrap();
    assert_eq!(s1.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(7));
    assert_eq!(
        s1.counter(SIMPLE_SAVE_OUTCOMES, &["dropped_cpu_full"]),
        Some(1)
    );
    assert_eq!(s1.gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(2)));
    assert_eq!(s1.len(), 3);
}

#[test]
fn c12_reduce_leaves_out_the_info_gauge() {
    let mut p = Payload::new();
    p.increase_counter(SIMPLE_SAVE_OUTCOMES, &["stored"], 3)
        .unwrap();
    p.set_gauge(SIMPLE_PENDING_STORE_BLOCKS, &[], Gauge::int(4))
        .unwrap();
    p.increase_counter(SIMPLE_LOAD_BLOCKS, &[], 9).unwrap();
    p.set_gauge(SIMPLE_INFO, &["cpu", "false", "false", "8"], Gauge::int(1))
        .unwrap();
    assert_eq!(
        reduced(&p),
        expect(&[
            (
                "vllm:simple_kv_offload_save_outcomes_total:('stored',)",
                3.0
            ),
            ("vllm:simple_kv_offload_pending_store_blocks", 4.0),
            ("vllm:simple_kv_offload_load_blocks_total", 9.0),
        ])
    );
    p.clear();
    assert!(p.is_empty());
}

#[test]
fn c12_drains_report_deltas_once() {
    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    s.record(SaveOutcome::Stored, 3);
    s.record(SaveOutcome::DroppedCpuFull, 2);
    s.record(SaveOutcome::SkippedInFlight, 1);
    let first = s.drain(7, 0);
    let outcomes: Vec<(String, u64)> = first
        .series()
        .iter()
        .filter(|x| x.name() == SIMPLE_SAVE_OUTCOMES)
        .map(|x| {
            let v = first
                .counter(SIMPLE_SAVE_OUTCOMES, &[x.labels().iter().next().unwrap()])
                .unwrap();
            (x.labels().iter().next().unwrap().to_owned(), v)
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("dropped_cpu_full".to_owned(), 2),
            ("skipped_in_flight".to_owned(), 1),
            ("stored".to_owned(), 3)
        ]
    );
    let second = s.drain(7, 0);
    assert_eq!(second.kind(SIMPLE_SAVE_OUTCOMES), None);
    assert_eq!(s.total(SaveOutcome::Stored), 3);
    assert_eq!(s.published(), 6);

    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    s.record(SaveOutcome::Stored, 3);
    s.reset();
    let p = s.drain(7, 0);
    assert_eq!(p.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(3));
}

#[test]
fn c12_reset_carries_only_undrained_deltas() {
    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    s.record(SaveOutcome::Stored, 5);
    let _ = s.drain(7, 0);
    s.record(SaveOutcome::Stored, 2);
    s.reset();
    assert_eq!(s.total(SaveOutcome::Stored), 2);
    let p = s.drain(7, 0);
    assert_eq!(p.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(2));
}

#[test]
fn c12_gauges_and_info() {
    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    // One in-flight store event, one queued finish flush, one abandoned store: 1 block each.
    let pending = 1 + 1 + 1;
    for free in [7, 5] {
        let p = s.drain(free, pending);
        assert_eq!(
            p.gauge(SIMPLE_PENDING_STORE_BLOCKS, &[]),
            Some(Gauge::int(3))
        );
        assert_eq!(
            p.gauge(SIMPLE_USED_BLOCKS, &[]),
            Some(Gauge::int(8 - i64::from(free)))
        );
        assert_eq!(
            p.gauge(SIMPLE_INFO, &["cpu", "false", "false", "8"]),
            Some(Gauge::int(1))
        );
    }
}

#[test]
fn c12_load_blocks_count_on_completion_even_after_reset() {
    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    // An issued load of 2 blocks: nothing before completion.
    assert_eq!(s.drain(7, 0).counter(SIMPLE_LOAD_BLOCKS, &[]), None);
    s.record_load_completed(2);
    assert_eq!(s.drain(7, 0).counter(SIMPLE_LOAD_BLOCKS, &[]), Some(2));
    assert_eq!(s.drain(7, 0).counter(SIMPLE_LOAD_BLOCKS, &[]), None);
    // The same when a reset abandoned the load before it completed.
    s.reset();
    s.record_load_completed(2);
    assert_eq!(s.drain(7, 0).counter(SIMPLE_LOAD_BLOCKS, &[]), Some(2));
}

/// The text `kvtier replay --metrics` prints for `p` (engine 0 of model `m`).
fn text_of(p: &Payload) -> Result<String, RenderError> {
    render(p, ExporterConfig::new("m", 1))
}

#[test]
fn exposition_of_a_native_payload() {
    let mut p = c11_s();
    p.set_info(cpu_info()).unwrap();
    let mut wrong = p.clone();
    // `x` is not a vLLM family: rejected before anything is written.
    assert!(matches!(
        text_of(&p),
        Err(RenderError::Observe(ObserveError::Series(SeriesMismatch::UnknownMetric(x)))) if x == "x"
    ));
    p.clear();
    p.set_info(cpu_info()).unwrap();
    p.increase_counter(LOAD_BYTES, &[], 100).unwrap();
    p.increase_counter(LOAD_TIME, &[], 500_000_000).unwrap();
    p.observe(LOOKUP_SYNC_DELAY_SECONDS, &[], 20_000).unwrap();
    p.set_gauge(CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4))
        .unwrap();
    let text = text_of(&p).unwrap();
    let e = "engine=\"0\"";
    let m = "model_name=\"m\"";
    let expected_lines = [
        "# TYPE vllm:kv_offload_config_info gauge".to_owned(),
        format!(
            "vllm:kv_offload_config_info{{cpu_blocks_per_chunk=\"\",cpu_kv_cache_size_bytes=\"\",cpu_kv_cache_size_tokens=\"None\",cpu_num_chunks=\"4\",{e},{m}}} 1.0"
        ),
        "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge".to_owned(),
        format!("vllm:kv_offload_cpu_cache_usage_perc{{{e},{m}}} 0.25"),
        "# HELP vllm:kv_offload_load_bytes_total Bytes copied from the offload tier into GPU memory, summed over ranks.".to_owned(),
        "# TYPE vllm:kv_offload_load_bytes_total counter".to_owned(),
        format!("vllm:kv_offload_load_bytes_total{{{e},{m}}} 100.0"),
        format!("vllm:kv_offload_load_time_total{{{e},{m}}} 0.5"),
        "# TYPE vllm:kv_offload_lookup_sync_delay_seconds histogram".to_owned(),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_bucket{{{e},le=\"1e-05\",{m}}} 0.0"),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_bucket{{{e},le=\"5e-05\",{m}}} 1.0"),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_bucket{{{e},le=\"1.0\",{m}}} 1.0"),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_bucket{{{e},le=\"+Inf\",{m}}} 1.0"),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_count{{{e},{m}}} 1.0"),
        format!("vllm:kv_offload_lookup_sync_delay_seconds_sum{{{e},{m}}} 2e-05"),
        // Not in the payload, shown from the start at zero.
        format!("vllm:kv_offload_stores_skipped_total{{{e},{m}}} 0.0"),
        format!("vllm:kv_offload_store_size_count{{{e},{m}}} 0.0"),
        format!("vllm:num_requests_running{{{e},{m}}} 0.0"),
    ];
    for line in &expected_lines {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // A histogram's count comes before its sum, as prometheus_client writes them.
    let at = |l: &str| text.lines().position(|x| x == l).unwrap();
    assert!(
        at(&format!(
            "vllm:kv_offload_lookup_sync_delay_seconds_count{{{e},{m}}} 1.0"
        )) < at(&format!(
            "vllm:kv_offload_lookup_sync_delay_seconds_sum{{{e},{m}}} 2e-05"
        ))
    );
    // The 17 offloading-connector families and vllm:num_requests_running, shown from the
    // start, and config_info, each once with HELP and TYPE; nothing of the simple offloader or
    // the engine's other families.
    assert_eq!(text.lines().filter(|l| l.starts_with("# HELP")).count(), 19);
    assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 19);
    assert!(!text.contains("simple_kv_offload"));
    assert!(!text.contains("vllm:prefix_cache"));

    wrong.clear();
    wrong
        .increase_counter(SIMPLE_SAVE_OUTCOMES, &[], 1)
        .unwrap();
    assert_eq!(
        text_of(&wrong).unwrap_err().to_string(),
        "metric vllm:simple_kv_offload_save_outcomes_total expects 1 labels, got 0"
    );
}

#[test]
fn exposition_of_simple_offload_stats() {
    let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
    s.record(SaveOutcome::Stored, 3);
    let p = s.drain(7, 2);
    let text = render(&p, ExporterConfig::new("m", 1)).unwrap();
    let e = "engine=\"0\",model_name=\"m\"";
    for line in [
        "# TYPE vllm:simple_kv_offload_save_outcomes_total counter".to_owned(),
        format!("vllm:simple_kv_offload_save_outcomes_total{{{e},outcome=\"stored\"}} 3.0"),
        format!("vllm:simple_kv_offload_used_blocks{{{e}}} 1.0"),
        format!("vllm:simple_kv_offload_pending_store_blocks{{{e}}} 2.0"),
        "vllm:simple_kv_offload_info{backend=\"cpu\",capacity_blocks=\"8\",engine=\"0\",lazy_offload=\"false\",model_name=\"m\",page_cache=\"false\"} 1.0".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[test]
fn exposition_mirrors_deprecated_transfer_series() {
    let mut p = Payload::new();
    p.increase_counter(LOAD_BYTES, &[], 7).unwrap();
    // On by default, as a vLLM server with the CPU offloading spec shows them.
    let text = render(&p, ExporterConfig::new("m", 1)).unwrap();
    let e = "engine=\"0\",model_name=\"m\"";
    for line in [
        format!("vllm:kv_offload_total_bytes_total{{{e},transfer_type=\"CPU_to_GPU\"}} 7.0"),
        format!("vllm:kv_offload_total_bytes_total{{{e},transfer_type=\"GPU_to_CPU\"}} 0.0"),
        "vllm:kv_offload_size_bucket{engine=\"0\",le=\"1e+06\",model_name=\"m\",transfer_type=\"GPU_to_CPU\"} 0.0".to_owned(),
        format!("vllm:kv_offload_total_time_total{{{e},transfer_type=\"CPU_to_GPU\"}} 0.0"),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    let mut off = ExporterConfig::new("m", 1);
    off.deprecated_transfer_series = false;
    let text = render(&p, off).unwrap();
    assert!(!text.contains("transfer_type"), "{text}");
    assert!(text.contains(&format!("vllm:kv_offload_load_bytes_total{{{e}}} 7.0\n")));
}
