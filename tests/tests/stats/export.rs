//! The Prometheus exporter: vLLM's names and values (spec B1–B3, scenarios C4, C5, C11),
//! validation before any change, counters that never go backwards, cache config info from the
//! capacity module, private registries, and `promtool check metrics` on the output.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::Write as _;
use std::process::{Command, Stdio};

use kvtier::export::{
    CacheConfigInfo, Engine, ExporterConfig, ExporterError, ObserveError, OffloadExporter,
    encode_text, log_line,
};
use kvtier_core::capacity::{
    GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, gpu_capacity,
};
use kvtier_core::manager::StoreOutcome;
use kvtier_core::manager::{ManagerConfig, OffloadManager};
use kvtier_core::stats::CpuTierInfo;
use kvtier_core::stats::catalogue::SeriesMismatch;
use kvtier_core::stats::{Gauge, Histogram, MetricKind, Payload, catalogue};
use kvtier_tests::store::{store, store_or_no_room};
use prometheus_text::sample;

/// Finds samples in a text exposition.
mod prometheus_text {
    /// The value of the sample `name{…}` whose label set contains every `labels` pair.
    pub(crate) fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
                if n != name {
                    return None;
                }
                let all = labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
                all.then(|| value.parse().ok()).flatten()
            })
    }
}

fn exporter(engines: u32) -> (prometheus::Registry, OffloadExporter) {
    let registry = prometheus::Registry::new();
    let e = OffloadExporter::register(&registry, ExporterConfig::new("m", engines)).unwrap();
    (registry, e)
}

fn manager(capacity: u32, threshold: u32) -> OffloadManager<u64> {
    let mut cfg = ManagerConfig::new(capacity);
    cfg.store_threshold = threshold;
    cfg.info = Some(CpuTierInfo {
        num_chunks: u64::from(capacity),
        blocks_per_chunk: 1,
        kv_cache_size_bytes: None,
        kv_cache_size_tokens: None,
    });
    OffloadManager::new(cfg).unwrap()
}

fn e0() -> [(&'static str, &'static str); 2] {
    [("model_name", "m"), ("engine", "0")]
}

#[test]
fn c5_stores_skipped_and_usage_reach_prometheus_with_vllm_names() {
    let (registry, ex) = exporter(1);
    let mut m = manager(4, 2);
    let req = m.on_new_request().unwrap();
    // C5: the first offer of [1,2,3] is skipped whole.
    assert_eq!(
        store(&mut m, req, &[1, 2, 3], None).unwrap().keys().len(),
        0
    );
    let mut first = m.take_stats_payload();
    first.set_info(vec![m.config_info()]).unwrap();
    ex.observe(&first, 0).unwrap();
    let text = encode_text(&registry).unwrap();
    assert_eq!(
        sample(&text, "vllm:kv_offload_stores_skipped_total", &e0()),
        Some(3.0)
    );
    // The next drain reports 0 (emitted), the total stays 3.
    ex.observe(&m.take_stats_payload(), 0).unwrap();
    // The second offer stores: usage 0.75, write 0.75, skipped still 3.
    let out = store(&mut m, req, &[1, 2, 3], None).unwrap();
    assert_eq!(out.slots(), &[0, 1, 2]);
    ex.observe(&m.take_stats_payload(), 0).unwrap();
    let text = encode_text(&registry).unwrap();
    assert_eq!(
        sample(&text, "vllm:kv_offload_stores_skipped_total", &e0()),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_cache_usage_perc", &e0()),
        Some(0.75)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_cache_write_usage_perc", &e0()),
        Some(0.75)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_cache_read_usage_perc", &e0()),
        Some(0.0)
    );
    // One allocation-size sample of 3 chunks (the skipped offer had no candidates).
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_allocation_size_count", &e0()),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_allocation_size_sum", &e0()),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_cpu_allocation_size_bucket",
            &[("le", "1.0")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_cpu_allocation_size_bucket",
            &[("le", "4.0")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_cpu_allocation_size_bucket",
            &[("le", "+Inf")]
        ),
        Some(1.0)
    );
    // config_info carries the manager's facts, None as "None".
    let info = [
        ("cpu_num_chunks", "4"),
        ("cpu_blocks_per_chunk", "1"),
        ("cpu_kv_cache_size_bytes", "None"),
        ("cpu_kv_cache_size_tokens", "None"),
    ];
    assert_eq!(
        sample(&text, "vllm:kv_offload_config_info", &info),
        Some(1.0)
    );
    assert!(text.contains("# TYPE vllm:kv_offload_stores_skipped_total counter\n"));
    assert!(text.contains("# TYPE vllm:kv_offload_cpu_allocation_size histogram\n"));
    assert!(text.contains("# TYPE vllm:kv_offload_config_info gauge\n"));
}

#[test]
fn counters_never_go_backwards_across_reset_cache() {
    let (registry, ex) = exporter(1);
    let mut m = manager(4, 2);
    let mut skipped_seen = 0.0;
    for round in 0..3u64 {
        let req = m.on_new_request().unwrap();
        let keys = [10 * round + 1, 10 * round + 2];
        store_or_no_room(&mut m, req, &keys, None).unwrap();
        store_or_no_room(&mut m, req, &keys, None).unwrap();
        m.complete_store(&keys, StoreOutcome::Stored);
        m.on_request_finished(req).unwrap();
        ex.observe(&m.take_stats_payload(), 0).unwrap();
        m.reset_cache();
        ex.observe(&m.take_stats_payload(), 0).unwrap();
        let text = encode_text(&registry).unwrap();
        let skipped = sample(&text, "vllm:kv_offload_stores_skipped_total", &e0()).unwrap();
        assert!(
            skipped >= skipped_seen,
            "went back from {skipped_seen} to {skipped}"
        );
        skipped_seen = skipped;
        // Two skipped per round, two chunks allocated per round.
        #[expect(clippy::cast_precision_loss, reason = "small test counts")]
        let expected = 2.0 * (round + 1) as f64;
        assert_eq!(skipped, expected);
        assert_eq!(
            sample(&text, "vllm:kv_offload_cpu_allocation_size_sum", &e0()),
            Some(expected)
        );
        // After the reset nothing is pinned.
        assert_eq!(
            sample(&text, "vllm:kv_offload_cpu_cache_usage_perc", &e0()),
            Some(0.0)
        );
    }
}

#[test]
fn observe_checks_the_whole_payload_before_applying_anything() {
    let (registry, ex) = exporter(1);
    let mut good = Payload::new();
    good.increase_counter(catalogue::LOAD_BYTES, &[], 7)
        .unwrap();

    let mut unknown = good.clone();
    unknown
        .increase_counter("vllm:no_such_metric", &[], 1)
        .unwrap();
    assert_eq!(
        ex.observe(&unknown, 0),
        Err(ObserveError::Series(SeriesMismatch::UnknownMetric(
            "vllm:no_such_metric".into()
        )))
    );

    let mut labels = good.clone();
    labels
        .increase_counter(catalogue::SIMPLE_SAVE_OUTCOMES, &[], 1)
        .unwrap();
    let err = ex.observe(&labels, 0).unwrap_err();
    assert_eq!(
        err,
        ObserveError::Series(SeriesMismatch::LabelCount {
            name: catalogue::SIMPLE_SAVE_OUTCOMES.into(),
            expected: 1,
            got: 0
        })
    );
    assert_eq!(
        err.to_string(),
        "metric vllm:simple_kv_offload_save_outcomes_total expects 1 labels, got 0"
    );

    let mut kind = good.clone();
    kind.set_gauge(catalogue::STORES_SKIPPED, &[], Gauge::int(1))
        .unwrap();
    assert_eq!(
        ex.observe(&kind, 0),
        Err(ObserveError::Series(SeriesMismatch::KindMismatch {
            name: catalogue::STORES_SKIPPED.into(),
            expected: MetricKind::Counter,
            found: MetricKind::Gauge,
        }))
    );

    let mut bounds = good.clone();
    let h = Histogram::new(&[1, 2]).unwrap();
    bounds
        .merge_histogram(catalogue::LOAD_SIZE, &[], &h)
        .unwrap();
    assert_eq!(
        ex.observe(&bounds, 0),
        Err(ObserveError::Series(SeriesMismatch::BoundsMismatch(
            catalogue::LOAD_SIZE.into()
        )))
    );
    assert_eq!(ex.observe(&good, 1), Err(ObserveError::UnknownEngine(1)));

    // Nothing of the rejected payloads was applied: load_bytes is still at its start value,
    // and so is its deprecated mirror.
    let text = encode_text(&registry).unwrap();
    assert_eq!(
        sample(&text, "vllm:kv_offload_load_bytes_total", &e0()),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_total_bytes_total",
            &[("transfer_type", "CPU_to_GPU")]
        ),
        Some(0.0)
    );
    ex.observe(&good, 0).unwrap();
    let text = encode_text(&registry).unwrap();
    assert_eq!(
        sample(&text, "vllm:kv_offload_load_bytes_total", &e0()),
        Some(7.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_total_bytes_total",
            &[("transfer_type", "CPU_to_GPU")]
        ),
        Some(7.0)
    );
}

#[test]
fn engines_are_labelled_and_kept_apart() {
    let (registry, ex) = exporter(2);
    let mut p = Payload::new();
    p.increase_counter(catalogue::STORES_SKIPPED, &[], 5)
        .unwrap();
    p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4))
        .unwrap();
    ex.observe(&p, 0).unwrap();
    let mut q = Payload::new();
    q.increase_counter(catalogue::STORES_SKIPPED, &[], 2)
        .unwrap();
    q.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 2))
        .unwrap();
    ex.observe(&q, 1).unwrap();
    ex.observe(&q, 1).unwrap();
    let text = encode_text(&registry).unwrap();
    let e1 = [("model_name", "m"), ("engine", "1")];
    assert_eq!(
        sample(&text, "vllm:kv_offload_stores_skipped_total", &e0()),
        Some(5.0)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_stores_skipped_total", &e1),
        Some(4.0)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_cache_usage_perc", &e0()),
        Some(0.25)
    );
    assert_eq!(
        sample(&text, "vllm:kv_offload_cpu_cache_usage_perc", &e1),
        Some(0.5)
    );
    let added = ex.add_engine(Engine::new("other", "0")).unwrap();
    assert_eq!(added, 2);
    assert_eq!(
        ex.add_engine(Engine::new("m", "1")),
        Err(ExporterError::DuplicateEngine(Engine::new("m", "1")))
    );
    assert_eq!(
        ex.totals(1)
            .unwrap()
            .counter(catalogue::STORES_SKIPPED, &[]),
        Some(4)
    );
}

#[test]
fn registries_are_private_and_families_register_once() {
    let (r1, a) = exporter(1);
    let (r2, _b) = exporter(1);
    let mut p = Payload::new();
    p.increase_counter(catalogue::ALLOCATION_FAILURE, &[], 1)
        .unwrap();
    a.observe(&p, 0).unwrap();
    let t1 = encode_text(&r1).unwrap();
    let t2 = encode_text(&r2).unwrap();
    assert_eq!(
        sample(&t1, "vllm:kv_offload_allocation_failure_total", &e0()),
        Some(1.0)
    );
    assert_eq!(
        sample(&t2, "vllm:kv_offload_allocation_failure_total", &e0()),
        Some(0.0)
    );
    assert!(matches!(
        OffloadExporter::register(&r1, ExporterConfig::new("m", 1)),
        Err(ExporterError::Register(_))
    ));
    // Nothing went to the global default registry.
    assert!(
        prometheus::gather()
            .iter()
            .all(|f| !f.name().starts_with("vllm:"))
    );
}

#[test]
fn cache_config_info_carries_per_engine_capacity() {
    let (registry, ex) = exporter(2);
    // Qwen1.5-7B-like: 1536 GPU blocks, 1024 blocks per 16,384-token request → 1.5x.
    let spec = LayerSpec::attention(LayerKind::Full, 16, 32, 128, 2);
    let layout = GroupedLayout::from_layers(&[spec; 32]).unwrap();
    let w = Workload::new(16_384, 1024);
    let cap = gpu_capacity(
        &layout,
        core::slice::from_ref(&layout),
        PoolLayout::LayerOutermost,
        &w,
        0,
        Some(1536),
    )
    .unwrap();
    let info = CacheConfigInfo::from_gpu_capacity(16, &cap);
    ex.set_cache_config(0, &info).unwrap();
    ex.set_cache_config(1, &info).unwrap();
    let text = encode_text(&registry).unwrap();
    for engine in ["0", "1"] {
        let labels = [
            ("engine", engine),
            ("kv_cache_size_tokens", "24576"),
            ("kv_cache_max_concurrency", "1.5"),
            ("block_size", "16"),
            ("num_gpu_blocks", "1536"),
            ("cache_dtype", ""),
        ];
        assert_eq!(
            sample(&text, "vllm:cache_config_info", &labels),
            Some(1.0),
            "{text}"
        );
    }
    assert!(text.contains("not summed across engines"));
    assert!(!text.contains("vllm:cache_config_info{model_name"));
}

#[test]
fn log_line_is_vllms_for_c11() {
    let mut s = Payload::new();
    s.increase_counter(catalogue::LOAD_BYTES, &[], 100).unwrap();
    s.increase_counter(catalogue::LOAD_TIME, &[], 500_000_000)
        .unwrap();
    s.observe(catalogue::LOAD_SIZE, &[], 100).unwrap();
    s.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4))
        .unwrap();
    s.increase_counter("x", &["a"], 2).unwrap();
    assert_eq!(
        log_line(&s).unwrap(),
        "KV Transfer metrics: vllm:kv_offload_cpu_cache_usage_perc=0.25, \
         vllm:kv_offload_load_bytes=100, vllm:kv_offload_load_size_count=1, \
         vllm:kv_offload_load_size_sum=100, vllm:kv_offload_load_time=0.5, x:('a',)=2"
    );
    let mut info_only = Payload::new();
    info_only
        .set_info(vec![manager(4, 0).config_info()])
        .unwrap();
    assert_eq!(log_line(&info_only), None);
    let mut zero = Payload::new();
    zero.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::ZERO)
        .unwrap();
    assert_eq!(
        log_line(&zero).unwrap(),
        "KV Transfer metrics: vllm:kv_offload_cpu_cache_usage_perc=0.0"
    );
}

/// A payload with every kind, labelled families, info and odd label text.
fn rich_payload() -> Payload {
    let mut p = Payload::new();
    p.increase_counter(catalogue::LOAD_BYTES, &[], 3_000_000)
        .unwrap();
    p.increase_counter(catalogue::LOAD_TIME, &[], 1_500_000_000)
        .unwrap();
    p.increase_counter(catalogue::STORE_BYTES, &[], 12_000_000)
        .unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], 3_000_000).unwrap();
    p.observe(catalogue::STORE_SIZE, &[], 250_000_000).unwrap();
    p.observe(catalogue::LOOKUP_SYNC_DELAY_SECONDS, &[], 20_000)
        .unwrap();
    p.observe(catalogue::LOOKUP_ASYNC_DELAY_SECONDS, &[], 2_000_000_000)
        .unwrap();
    p.observe(catalogue::CPU_ALLOCATION_SIZE, &[], 5).unwrap();
    p.increase_counter(catalogue::ALLOCATION_FAILURE, &[], 2)
        .unwrap();
    p.increase_counter(catalogue::STORES_SKIPPED, &[], 9)
        .unwrap();
    p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 3))
        .unwrap();
    p.increase_counter(catalogue::SIMPLE_SAVE_OUTCOMES, &["stored"], 4)
        .unwrap();
    p.increase_counter(catalogue::SIMPLE_SAVE_OUTCOMES, &["dropped_cpu_full"], 1)
        .unwrap();
    p.set_gauge(catalogue::SIMPLE_USED_BLOCKS, &[], Gauge::int(7))
        .unwrap();
    p.set_gauge(
        catalogue::SIMPLE_INFO,
        &["cpu", "false", "false", "8"],
        Gauge::int(1),
    )
    .unwrap();
    p.increase_counter(catalogue::PROMPT_TOKENS_CACHED_BY_SOURCE, &["host"], 64)
        .unwrap();
    p.set_gauge(catalogue::KV_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 2))
        .unwrap();
    let mut info = manager(8, 0).config_info();
    info.insert(
        "cpu_kv_cache_size_bytes",
        kvtier_core::stats::InfoValue::Text("a \"q\"\\n".into()),
    )
    .unwrap();
    p.set_info(vec![info]).unwrap();
    p
}

#[test]
#[ignore = "needs promtool (Debian package prometheus); run via `cargo xtask test`"]
fn promtool_accepts_the_exposition() {
    let registry = prometheus::Registry::new();
    let mut cfg = ExporterConfig::new("model \"x\"", 2);
    cfg.engines.push(Engine::new("other\nmodel", "7"));
    let ex = OffloadExporter::register(&registry, cfg).unwrap();
    for engine in 0..3 {
        ex.observe(&rich_payload(), engine).unwrap();
        ex.observe(&rich_payload(), engine).unwrap();
    }
    let mut info = CacheConfigInfo::new();
    info.set("cache_dtype", "auto").unwrap();
    ex.set_cache_config(0, &info).unwrap();
    let text = encode_text(&registry).unwrap();
    assert_eq!(
        sample(&text, "vllm:kv_offload_load_time_total", &[("engine", "7")]),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_cpu_cache_usage_perc",
            &[("engine", "0")]
        ),
        Some(1.0 / 3.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:simple_kv_offload_save_outcomes_total",
            &[("engine", "1"), ("outcome", "stored")]
        ),
        Some(8.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_store_size_bucket",
            &[("engine", "1"), ("le", "+Inf")]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "vllm:kv_offload_store_size_bucket",
            &[("engine", "1"), ("le", "2e+08")]
        ),
        Some(0.0)
    );

    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!(
            "promtool is needed by this test ({e}); install the Debian package `prometheus` \
             (`cargo xtask test` does)"
        ),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // vLLM's own names hold ':' (`vllm:…`), which promtool's naming lint flags (it reserves
    // colons for recording rules); the names are the contract, so that one lint is expected
    // for each family and any other complaint (a parse error, a type or suffix problem, a
    // duplicate series) fails the test.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() >= 20, "{text}");
    let mut flagged = Vec::new();
    for line in complaints.lines().filter(|l| !l.trim().is_empty()) {
        let name = line
            .strip_suffix(" metric names should not contain ':'")
            .unwrap_or_else(|| panic!("promtool complained: {line}\n{complaints}\n{text}"));
        assert!(families.contains(&name), "{line}");
        flagged.push(name);
    }
    flagged.sort_unstable();
    let mut expected = families.clone();
    expected.sort_unstable();
    assert_eq!(flagged, expected, "{complaints}");
}

/// What `prometheus_client` 0.26.0's `generate_latest` prints (created series off) for a Counter
/// `vllm:kv_offload_stores_skipped` at 6, a Histogram `vllm:kv_offload_load_size` with vLLM's
/// buckets and observations 3e6 and 209,715,200, a Histogram
/// `vllm:kv_offload_lookup_sync_delay_seconds` with one observation of 0.000123, and a Gauge
/// `vllm:kv_offload_cpu_cache_usage_perc` at 0.25, each with labels `model_name="m"`,
/// `engine="0"` and kvtier's help texts.
const PROMETHEUS_CLIENT_TEXT: &str = r#"# HELP vllm:kv_offload_stores_skipped_total Store candidates turned away because they had not been offered often enough yet.
# TYPE vllm:kv_offload_stores_skipped_total counter
vllm:kv_offload_stores_skipped_total{engine="0",model_name="m"} 6.0
# HELP vllm:kv_offload_load_size Size of each load transfer in bytes.
# TYPE vllm:kv_offload_load_size histogram
vllm:kv_offload_load_size_bucket{engine="0",le="1e+06",model_name="m"} 0.0
vllm:kv_offload_load_size_bucket{engine="0",le="5e+06",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="1e+07",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="2e+07",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="4e+07",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="6e+07",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="8e+07",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="1e+08",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="1.5e+08",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="2e+08",model_name="m"} 1.0
vllm:kv_offload_load_size_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:kv_offload_load_size_count{engine="0",model_name="m"} 2.0
vllm:kv_offload_load_size_sum{engine="0",model_name="m"} 2.127152e+08
# HELP vllm:kv_offload_lookup_sync_delay_seconds Seconds spent in one lookup call.
# TYPE vllm:kv_offload_lookup_sync_delay_seconds histogram
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="1e-05",model_name="m"} 0.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="5e-05",model_name="m"} 0.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.0001",model_name="m"} 0.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.0005",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.001",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.005",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.05",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="0.5",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_count{engine="0",model_name="m"} 1.0
vllm:kv_offload_lookup_sync_delay_seconds_sum{engine="0",model_name="m"} 0.000123
# HELP vllm:kv_offload_cpu_cache_usage_perc Share of CPU chunks held by transfers in flight (0 idle, 1 saturated); not the fill level.
# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge
vllm:kv_offload_cpu_cache_usage_perc{engine="0",model_name="m"} 0.25
"#;

/// The `# HELP` … block of family `name` in `text` (up to the next family).
fn family_block<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("# HELP {name} "))?;
    let rest = &text[start..];
    let end = rest[1..].find("# HELP ").map_or(rest.len(), |i| i + 1);
    Some(&rest[..end])
}

#[test]
fn text_is_what_prometheus_client_prints() {
    let (registry, ex) = exporter(1);
    let mut p = Payload::new();
    p.increase_counter(catalogue::STORES_SKIPPED, &[], 6)
        .unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], 3_000_000).unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], 209_715_200).unwrap();
    p.observe(catalogue::LOOKUP_SYNC_DELAY_SECONDS, &[], 123_000)
        .unwrap();
    p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4))
        .unwrap();
    ex.observe(&p, 0).unwrap();
    let text = encode_text(&registry).unwrap();
    for family in [
        "vllm:kv_offload_stores_skipped_total",
        "vllm:kv_offload_load_size",
        "vllm:kv_offload_lookup_sync_delay_seconds",
        "vllm:kv_offload_cpu_cache_usage_perc",
    ] {
        assert_eq!(
            family_block(&text, family),
            family_block(PROMETHEUS_CLIENT_TEXT, family),
            "{family} in\n{text}"
        );
    }
    // `replay --metrics` prints the same text for the same totals.
    let rendered = kvtier::export::render(&p, ExporterConfig::new("m", 1)).unwrap();
    assert_eq!(rendered, text);
}

#[test]
fn every_family_of_the_connector_is_shown_from_the_start() {
    let (registry, _ex) = exporter(2);
    let text = encode_text(&registry).unwrap();
    let mut shown = 0;
    for def in catalogue::all() {
        let exposed = match def.kind {
            MetricKind::Counter if !def.name.ends_with("_total") => format!("{}_total", def.name),
            _ => def.name.to_owned(),
        };
        let typed = text.contains(&format!("# TYPE {exposed} {}\n", def.kind));
        assert_eq!(typed, def.zero_at_start, "{}\n{text}", def.name);
        if !def.zero_at_start {
            continue;
        }
        shown += 1;
        let sample_name = match def.kind {
            MetricKind::Histogram => format!("{}_count", def.name),
            _ => exposed.clone(),
        };
        let transfer_types: &[&str] = if def.labels.is_empty() {
            &[""]
        } else {
            &catalogue::TRANSFER_TYPES
        };
        for engine in ["0", "1"] {
            for t in transfer_types {
                let mut labels = vec![("model_name", "m"), ("engine", engine)];
                if !t.is_empty() {
                    labels.push(("transfer_type", t));
                }
                assert_eq!(
                    sample(&text, &sample_name, &labels),
                    Some(0.0),
                    "{sample_name} {labels:?}\n{text}"
                );
            }
        }
    }
    // The connector's 17 families and vllm:num_requests_running.
    assert_eq!(shown, 18);
    assert!(text.contains("vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0.0\n"));
}

/// The family names a scrape shows, in order.
fn scraped_families(registry: &prometheus::Registry) -> Vec<String> {
    encode_text(registry)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_simple_offloader_engine_shows_no_offloading_connector_family() {
    // The default: vLLM's OffloadingConnector families at zero from the start, the
    // deprecated transfer_type ones among them.
    let (registry, _e) = exporter(1);
    let names = scraped_families(&registry);
    assert!(
        names
            .iter()
            .any(|n| n == "vllm:kv_offload_store_bytes_total")
    );
    assert!(
        names
            .iter()
            .any(|n| n == "vllm:kv_offload_total_bytes_total")
    );
    assert!(names.iter().any(|n| n == "vllm:num_requests_running"));

    // An engine with the SimpleCPUOffloadConnector: none of them, before and after an
    // observation of the simple offloader's series; the rest unchanged.
    let registry = prometheus::Registry::new();
    let mut config = ExporterConfig::new("m", 1);
    config.offloading_connector_series = false;
    let e = OffloadExporter::register(&registry, config).unwrap();
    let added = e.add_engine(Engine::new("m", "1")).unwrap();
    let mut p = Payload::new();
    p.increase_counter(catalogue::SIMPLE_LOAD_BLOCKS, &[], 3)
        .unwrap();
    e.observe(&p, added).unwrap();
    let names = scraped_families(&registry);
    assert!(
        names.iter().all(|n| !n.starts_with("vllm:kv_offload_")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "vllm:num_requests_running"));
    assert!(
        names
            .iter()
            .any(|n| n == "vllm:simple_kv_offload_load_blocks_total")
    );
}
