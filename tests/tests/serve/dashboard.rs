//! vLLM's own Grafana dashboard (`vllm_kv_cache.json`, unchanged) on `kvtier serve`: a real
//! Prometheus server (Debian package `prometheus`) scrapes a running replay every second, the
//! dashboard's template variables are expanded as Grafana expands them, and every query of its
//! "KV offloading" row must return data through Prometheus's query API; on `kvtier serve
//! --offloader simple --hybrid` (a hybrid model, whose Mamba group in "align" mode hands off
//! its boundary states), all four queries of its "Simple CPU offload" row must too. With a
//! dense model (no `--hybrid`) the save-outcome panel has no data: vLLM 0.33.0 classifies only
//! boundary hand-offs, so a dense model's server never emits that counter (checked as such).
//!
//! The queries are written here; [`queries_match_the_dashboard_file`] checks them against the
//! dashboard file when the shared folder is there (`../shared` beside the workspace).

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use kvtier_cli::Cli;
use kvtier_cli::serve::{Serving, start};
use kvtier_tests::prometheus_server::{PrometheusServer, require_prometheus};

/// The dashboard's query variables, in order: (name, query).
const VARIABLES: [(&str, &str); 4] = [
    ("job", r#"label_values(vllm:num_requests_running, job)"#),
    (
        "model_name",
        r#"label_values(vllm:num_requests_running{job=~"$job"}, model_name)"#,
    ),
    (
        "instance",
        r#"label_values(vllm:num_requests_running{job=~"$job", model_name=~"$model_name"}, instance)"#,
    ),
    (
        "engine",
        r#"label_values(vllm:num_requests_running{job=~"$job", model_name=~"$model_name", instance=~"$instance"}, engine)"#,
    ),
];

/// Every target of the "KV offloading" row: (panel title, expression).
const KV_OFFLOADING_ROW: [(&str, &str); 13] = [
    (
        "Offload throughput",
        r#"sum(rate(vllm:kv_offload_load_bytes_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
    (
        "Offload throughput",
        r#"sum(rate(vllm:kv_offload_store_bytes_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
    (
        "Offload transfer bandwidth",
        r#"sum(rate(vllm:kv_offload_load_bytes_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) / (sum(rate(vllm:kv_offload_load_time_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) > 0)"#,
    ),
    (
        "Offload transfer bandwidth",
        r#"sum(rate(vllm:kv_offload_store_bytes_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) / (sum(rate(vllm:kv_offload_store_time_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) > 0)"#,
    ),
    (
        "Mean offload transfer size",
        r#"sum(rate(vllm:kv_offload_load_size_sum{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) / (sum(rate(vllm:kv_offload_load_size_count{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) > 0)"#,
    ),
    (
        "Mean offload transfer size",
        r#"sum(rate(vllm:kv_offload_store_size_sum{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) / (sum(rate(vllm:kv_offload_store_size_count{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])) > 0)"#,
    ),
    (
        "Offload lookup latency p99",
        r#"histogram_quantile(0.99, sum by (le) (rate(vllm:kv_offload_lookup_sync_delay_seconds_bucket{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])))"#,
    ),
    (
        "Offload lookup latency p99",
        r#"histogram_quantile(0.99, sum by (le) (rate(vllm:kv_offload_lookup_async_delay_seconds_bucket{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval])))"#,
    ),
    (
        "CPU offload buffer usage",
        r#"max(vllm:kv_offload_cpu_cache_usage_perc{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"})"#,
    ),
    (
        "CPU offload buffer usage",
        r#"max(vllm:kv_offload_cpu_cache_write_usage_perc{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"})"#,
    ),
    (
        "CPU offload buffer usage",
        r#"max(vllm:kv_offload_cpu_cache_read_usage_perc{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"})"#,
    ),
    (
        "Failed and skipped stores / s",
        r#"sum(rate(vllm:kv_offload_allocation_failure_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
    (
        "Failed and skipped stores / s",
        r#"sum(rate(vllm:kv_offload_stores_skipped_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
];

/// Every target of the "Simple CPU offload" row: (panel title, expression).
const SIMPLE_ROW: [(&str, &str); 4] = [
    (
        "Store admission outcomes",
        r#"sum by (outcome) (rate(vllm:simple_kv_offload_save_outcomes_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
    (
        "Blocks restored from offload / s",
        r#"sum(rate(vllm:simple_kv_offload_load_blocks_total{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"}[$__rate_interval]))"#,
    ),
    (
        "Offload pool blocks",
        r#"sum(vllm:simple_kv_offload_used_blocks{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"})"#,
    ),
    (
        "Offload pool blocks",
        r#"sum(vllm:simple_kv_offload_pending_store_blocks{job=~"$job", model_name=~"$model_name", instance=~"$instance", engine=~"$engine"})"#,
    ),
];

/// Seconds between two scrapes.
const SCRAPE_INTERVAL_S: u32 = 1;
/// Grafana's `$__rate_interval` at this scrape interval: four scrape intervals (its floor).
const RATE_INTERVAL: &str = "4s";
/// Llama-3-8B's bytes per 16-token bf16 block (as `kvtier capacity --model llama-3-8b` says).
const LLAMA3_8B_BLOCK_BYTES: f64 = 2_097_152.0;

/// Where the dashboard file is, if the shared folder is here.
fn dashboard_file() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let beside = root
        .parent()
        .and_then(|w| w.parent())
        .map(|p| p.join("shared"));
    beside
        .map(|s| s.join("dashboards/vllm_kv_cache.json"))
        .filter(|p| p.is_file())
}

/// `(name or panel title, query)` pairs.
type Queries = Vec<(String, String)>;

/// The dashboard's query variables and the targets of its row whose title starts with `row`
/// (nested in the row when it is collapsed, else the panels after it up to the next row).
fn queries_of(dashboard: &serde_json::Value, row: &str) -> (Queries, Queries) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = &v["query"];
            let q = if q.is_object() { &q["query"] } else { q };
            (text(&v["name"]), text(q))
        })
        .collect();
    let panels = dashboard["panels"].as_array().unwrap();
    let is_row = |p: &serde_json::Value| p["type"] == "row";
    let at = panels
        .iter()
        .position(|p| is_row(p) && text(&p["title"]).starts_with(row))
        .unwrap();
    let nested = panels[at]["panels"].as_array().filter(|n| !n.is_empty());
    let row: Vec<&serde_json::Value> = match nested {
        Some(n) => n.iter().collect(),
        None => panels[at + 1..].iter().take_while(|p| !is_row(p)).collect(),
    };
    let targets = row
        .iter()
        .flat_map(|p| {
            let title = text(&p["title"]);
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), text(&t["expr"])))
        })
        .collect();
    (variables, targets)
}

#[test]
fn queries_match_the_dashboard_file() {
    let Some(path) = dashboard_file() else {
        eprintln!(
            "SKIPPED: the dashboard cross-check: no shared/dashboards/vllm_kv_cache.json beside \
             the workspace"
        );
        return;
    };
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (variables, targets) = queries_of(&dashboard, "KV offloading");
    let own = |l: &[(&str, &str)]| -> Queries {
        l.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(variables, own(&VARIABLES), "{}", path.display());
    assert_eq!(targets, own(&KV_OFFLOADING_ROW), "{}", path.display());
    let (_, simple) = queries_of(&dashboard, "Simple CPU offload");
    assert_eq!(simple, own(&SIMPLE_ROW), "{}", path.display());
}

/// `value` as Grafana puts a multi-value variable's value into a Prometheus regex: regex
/// metacharacters escaped with a PromQL-escaped backslash.
fn regex_escape(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if "\\$^*{}[]'+?.()|".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// `expr` with every `$name` replaced (longest names first, so `$model_name` is not `$model`).
fn expand(expr: &str, values: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = values.iter().collect();
    sorted.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_owned();
    for (name, value) in sorted {
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// `label_values(selector, label)` → `(selector, label)`.
fn label_values_parts(query: &str) -> (&str, &str) {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap();
    let (selector, label) = inner.rsplit_once(',').unwrap();
    (selector.trim(), label.trim())
}

/// `kvtier serve` with `extra` options after a long paced replay's (it is still running
/// while the queries run, so every rate has data), scraped by a real Prometheus: the server,
/// Prometheus once it scraped five times, and the dashboard's variables as Grafana fills
/// them (each checked to be this server's).
fn serve_and_scrape(extra: &[&str]) -> (Serving, PrometheusServer, Queries) {
    let mut argv = vec![
        "kvtier",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--requests",
        "1000000",
        "--rate",
        "3000",
        "--export-interval-ms",
        "100",
    ];
    argv.extend_from_slice(extra);
    let args = Cli::try_parse_from(argv).unwrap();
    let serving = start(&args.serve_options().unwrap()).unwrap();
    let addr = serving.local_addr();
    let prom = PrometheusServer::start(addr, "kvtier", SCRAPE_INTERVAL_S).unwrap();

    // Wait for five scrapes: more than a rate window of samples.
    let deadline = Instant::now() + Duration::from_secs(45);
    let scrapes = "count_over_time(vllm:num_requests_running[30s])";
    while prom.value(scrapes).is_none_or(|n| n < 5.0) {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape five times; its log:\n{}",
            prom.log()
        );
        thread::sleep(Duration::from_millis(250));
    }

    // The variables, as Grafana fills them: each query's label values, all selected
    // (`$__all`: the escaped values joined with `|`).
    let mut values: Queries = vec![("__rate_interval".into(), RATE_INTERVAL.into())];
    let mut found = Vec::new();
    for (name, query) in VARIABLES {
        let (selector, label) = label_values_parts(query);
        let result = prom.query(&expand(selector, &values)).unwrap();
        let mut labels: Vec<String> = result
            .iter()
            .filter_map(|s| s["metric"][label].as_str().map(str::to_owned))
            .collect();
        labels.sort_unstable();
        labels.dedup();
        assert!(!labels.is_empty(), "variable {name}: {query} has no values");
        let all: Vec<String> = labels.iter().map(|l| regex_escape(l)).collect();
        values.push((name.to_owned(), format!("({})", all.join("|"))));
        found.push(labels);
    }
    assert_eq!(
        found,
        [
            vec!["kvtier".to_owned()],
            vec!["kvtier-replay".to_owned()],
            vec![addr.to_string()],
            vec!["0".to_owned()],
        ]
    );
    (serving, prom, values)
}

/// Each query of `row` expanded with `values`: its first sample's value (`None`: no data).
fn run_row(prom: &PrometheusServer, row: &[(&str, &str)], values: &Queries) -> Vec<Option<String>> {
    row.iter()
        .map(|(_, expr)| {
            let result = prom.query(&expand(expr, values)).unwrap();
            result
                .first()
                .and_then(|s| s["value"][1].as_str())
                .map(str::to_owned)
        })
        .collect()
}

/// `kvtier serve --offloader simple` with 2,048 GPU and 8,192 CPU blocks and `extra`
/// options, scraped: the server, Prometheus, the variables and the Simple row's results.
fn simple_row(extra: &[&str]) -> (Serving, PrometheusServer, Queries, Vec<Option<String>>) {
    require_prometheus();
    let mut args = vec![
        "--offloader",
        "simple",
        "--gpu-blocks",
        "2048",
        "--capacity",
        "8192",
    ];
    args.extend_from_slice(extra);
    let (serving, prom, values) = serve_and_scrape(&args);
    let results = run_row(&prom, &SIMPLE_ROW, &values);
    (serving, prom, values, results)
}

#[test]
#[ignore = "needs a Prometheus server (Debian package prometheus); run via `cargo xtask test`"]
fn the_simple_cpu_offload_row_has_data_on_kvtier_serve_offloader_simple() {
    let (serving, prom, values, results) = simple_row(&[]);
    let got: Vec<bool> = results.iter().map(Option::is_some).collect();
    // The outcome panel: no hand-off, no series (as on vLLM with a dense model); the
    // other three panels have data.
    assert_eq!(
        got,
        [false, true, true, true],
        "{results:?}\nPrometheus log:\n{}",
        prom.log()
    );
    let outcomes = "vllm:simple_kv_offload_save_outcomes_total";
    assert!(prom.query(outcomes).unwrap().is_empty());
    let v = |i: usize| -> f64 { results[i].as_deref().unwrap().parse().unwrap() };
    // Blocks are restored from the CPU while the replay runs.
    assert!(v(1) > 0.0, "{results:?}");
    // The pool's used blocks count at least the null block, at most the pool.
    assert!((1.0..=8192.0).contains(&v(2)), "{results:?}");
    assert!(v(3) >= 0.0, "{results:?}");
    // The KV offloading row reads the OffloadingConnector's families, which an engine with
    // the simple offloader does not have: no data, as on vLLM.
    let offloading = run_row(&prom, &KV_OFFLOADING_ROW, &values);
    assert!(offloading.iter().all(Option::is_none), "{offloading:?}");
    drop(prom);
    serving.stop();
}

#[test]
#[ignore = "needs a Prometheus server (Debian package prometheus); run via `cargo xtask test`"]
fn the_simple_cpu_offload_row_fills_on_a_hybrid_model() {
    let (serving, prom, _, results) = simple_row(&["--hybrid"]);
    let got: Vec<bool> = results.iter().map(Option::is_some).collect();
    assert_eq!(
        got,
        [true, true, true, true],
        "{results:?}\nPrometheus log:\n{}",
        prom.log()
    );
    // The outcome panel's series: states stored while the replay runs.
    let stored = r#"vllm:simple_kv_offload_save_outcomes_total{outcome="stored"}"#;
    assert!(prom.value(stored).is_some_and(|v| v > 0.0), "{results:?}");
    let v = |i: usize| -> f64 { results[i].as_deref().unwrap().parse().unwrap() };
    assert!(v(0) > 0.0 && v(1) > 0.0, "{results:?}");
    assert!((1.0..=8192.0).contains(&v(2)), "{results:?}");
    drop(prom);
    serving.stop();
}

#[test]
#[ignore = "needs a Prometheus server (Debian package prometheus); run via `cargo xtask test`"]
fn the_kv_offloading_row_has_data_on_kvtier_serve() {
    require_prometheus();
    let (serving, prom, values) =
        serve_and_scrape(&["--store-threshold", "2", "--model", "llama-3-8b"]);
    let mut empty = Vec::new();
    let mut results = Vec::new();
    for (title, expr) in KV_OFFLOADING_ROW {
        let query = expand(expr, &values);
        let result = prom.query(&query).unwrap();
        if result.is_empty() {
            empty.push(format!("{title}: {query}"));
        }
        let first = result
            .first()
            .and_then(|s| s["value"][1].as_str())
            .unwrap_or("")
            .to_owned();
        results.push(first);
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}\nPrometheus log:\n{}",
        empty.join("\n"),
        prom.log()
    );
    let v = |i: usize| -> f64 { results[i].parse().unwrap() };
    // Loads and stores move bytes.
    assert!(v(0) > 0.0 && v(1) > 0.0, "{results:?}");
    // The bandwidth panel shows the modelled 25 GB/s (nanosecond rounding aside).
    for i in [2, 3] {
        assert!((v(i) / 25e9 - 1.0).abs() < 1e-3, "{results:?}");
    }
    // Transfers are whole blocks of Llama-3-8B.
    assert!(
        v(4) >= LLAMA3_8B_BLOCK_BYTES && v(5) >= LLAMA3_8B_BLOCK_BYTES,
        "{results:?}"
    );
    // Measured lookup scans: a p99 under the top bucket; no deferred lookups (NaN).
    assert!(v(6) > 0.0 && v(6) <= 1.0, "{results:?}");
    assert!(v(7).is_nan(), "{results:?}");
    // The threshold turns stores away.
    assert!(v(12) > 0.0, "{results:?}");
    drop(prom);
    serving.stop();
}
