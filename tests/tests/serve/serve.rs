//! `kvtier serve` end to end: the replay runs in-process behind the real `/metrics` endpoint, a
//! real Prometheus server (Debian package `prometheus`, loopback only, its own temp dir)
//! scrapes it, and its HTTP query API returns the replay's values. Also the endpoint's
//! behaviour (content type, 404, 405, a stalled client) and `replay --log-interval`.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use kvtier::http::{MetricsServer, ServerConfig};
use kvtier_cli::Cli;
use kvtier_cli::serve::MIN_RATE;
use kvtier_cli::serve::start;
use kvtier_core::stats::catalogue;
use kvtier_tests::prometheus_server::{PrometheusServer, http_get, require_prometheus};

fn serve_args(extra: &[&str]) -> Cli {
    let mut argv = vec!["kvtier", "serve", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

/// One HTTP/1.0 GET on loopback: (status line, head, body).
fn get(addr: SocketAddr, target: &str) -> (String, String, String) {
    http_get(addr, target).unwrap()
}

#[test]
#[ignore = "needs a Prometheus server (Debian package prometheus); run via `cargo xtask test`"]
fn prometheus_scrapes_kvtier_serve() {
    require_prometheus();
    let args = serve_args(&[
        "--requests",
        "3000",
        "--capacity",
        "256",
        "--store-threshold",
        "2",
        "--export-interval-ms",
        "50",
    ]);
    // The same replay on its own gives the values Prometheus must read back.
    let expected = kvtier_cli::replay::replay(&args.replay_options().unwrap(), false).unwrap();
    let skipped = expected.counts.stores_skipped.unwrap();
    let usage = expected
        .payload
        .gauge(catalogue::CPU_CACHE_USAGE_PERC, &[])
        .unwrap()
        .to_f64();
    assert!(skipped > 1000, "a filter run skips stores: {skipped}");

    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    let addr = serving.local_addr();
    assert!(addr.ip().is_loopback());
    let summary = serving.wait_replay().unwrap();
    assert_eq!(summary.counts.stores_skipped, Some(skipped));
    assert_eq!(summary.capacity, 256);

    let prom = PrometheusServer::start(addr, "kvtier", 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut got_skipped, mut got_usage) = (None, None);
    while Instant::now() < deadline && (got_skipped.is_none() || got_usage.is_none()) {
        thread::sleep(Duration::from_millis(500));
        if !prom.is_up() {
            continue;
        }
        got_skipped = prom.value("vllm:kv_offload_stores_skipped_total");
        got_usage = prom.value("vllm:kv_offload_cpu_cache_usage_perc");
    }
    assert!(
        got_skipped.is_some() && got_usage.is_some(),
        "Prometheus never had the series; its log:\n{}",
        prom.log()
    );
    #[expect(clippy::cast_precision_loss, reason = "Prometheus holds floats")]
    let skipped_f = skipped as f64;
    assert_eq!(got_skipped, Some(skipped_f));
    assert_eq!(got_usage, Some(usage));
    let failures = prom.value("vllm:kv_offload_allocation_failure_total");
    #[expect(clippy::cast_precision_loss, reason = "Prometheus holds floats")]
    let failures_f = expected.counts.store_failures as f64;
    assert_eq!(failures, Some(failures_f));
    let chunks = prom.value("vllm:kv_offload_config_info{cpu_num_chunks=\"256\"}");
    assert_eq!(chunks, Some(1.0));
    drop(prom);
    serving.stop();
}

#[test]
fn endpoint_answers_scrapes_and_nothing_else() {
    let server = MetricsServer::bind("127.0.0.1:0", ServerConfig::default(), || {
        Ok("# TYPE x gauge\nx 1\n".to_owned())
    })
    .unwrap();
    let addr = server.local_addr();
    let (status, head, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4\r\n"),
        "{head}"
    );
    assert_eq!(body, "# TYPE x gauge\nx 1\n");
    assert_eq!(get(addr, "/metrics?x=1").0, "HTTP/1.1 200 OK");
    assert_eq!(get(addr, "/").0, "HTTP/1.1 404 Not Found");
    assert_eq!(get(addr, "/metricsx").0, "HTTP/1.1 404 Not Found");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 405 "), "{raw}");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"\x00\x01garbage\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 400 "), "{raw}");
    server.stop();
}

#[test]
fn a_stalled_client_does_not_stall_other_scrapes() {
    let mut config = ServerConfig::default();
    config.head_deadline = Duration::from_secs(30);
    let server = MetricsServer::bind("127.0.0.1:0", config, || Ok("x 1\n".to_owned())).unwrap();
    let addr = server.local_addr();
    // Several clients that send half a request and then nothing.
    let stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /met").unwrap();
            s
        })
        .collect();
    let t = Instant::now();
    let (status, _, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, "x 1\n");
    // Far below the stalled clients' 30 s head deadline: they hold only their own threads.
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(stalled);
    server.stop();
}

/// A payload's series but the measured (wall-clock) lookup times.
fn deterministic(p: &kvtier_core::stats::Payload) -> Vec<&kvtier_core::stats::Series> {
    p.series()
        .iter()
        .filter(|s| s.name() != catalogue::LOOKUP_SYNC_DELAY_SECONDS)
        .collect()
}

#[test]
fn log_interval_keeps_the_whole_run_in_the_report() {
    let with = serve_args(&[
        "--requests",
        "2000",
        "--capacity",
        "128",
        "--store-threshold",
        "2",
        "--log-interval",
        "300",
    ]);
    let without = serve_args(&[
        "--requests",
        "2000",
        "--capacity",
        "128",
        "--store-threshold",
        "2",
    ]);
    let a = kvtier_cli::replay::replay(&with.replay_options().unwrap(), false).unwrap();
    let b = kvtier_cli::replay::replay(&without.replay_options().unwrap(), false).unwrap();
    // Draining every 300 requests for the log line changes nothing the run reports (but the
    // measured lookup times, of which only the count is fixed).
    assert_eq!(a.counts, b.counts);
    assert_eq!(deterministic(&a.payload), deterministic(&b.payload));
    assert_eq!(a.payload.info(), b.payload.info());
    let lookups = |p: &kvtier_core::stats::Payload| {
        p.histogram(catalogue::LOOKUP_SYNC_DELAY_SECONDS, &[])
            .map(kvtier_core::stats::Histogram::count)
    };
    assert_eq!(lookups(&a.payload), Some(2000));
    assert_eq!(lookups(&b.payload), Some(2000));
    assert!(a.payload.counter(catalogue::STORES_SKIPPED, &[]).unwrap() > 0);
}

#[test]
fn serve_rejects_a_rate_that_is_not_a_pace() {
    // Each once panicked or slipped through: 1e-300 passed the check and its 1e300 s pause
    // panicked in the replay thread.
    for rate in ["1e-300", "0", "-1", "NaN", "inf", "-inf", "5e-20", "-1e300"] {
        let args = serve_args(&[&format!("--rate={rate}")]);
        let err = start(&args.serve_options().unwrap())
            .map(|s| s.stop())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("--rate takes requests per second: a finite number from 1e-19 up, not {rate}")
        );
    }
}

#[test]
fn the_slowest_rate_is_accepted_and_stops_at_once() {
    let args = serve_args(&["--requests", "10", &format!("--rate={MIN_RATE:e}")]);
    let serving = start(&args.serve_options().unwrap()).unwrap();
    // The replay is paused for 10^19 s before its first request: a stop still ends it.
    serving.stop();
}

#[test]
fn replay_metrics_and_serve_print_the_same_families_and_values() {
    let args = serve_args(&[
        "--requests",
        "2000",
        "--capacity",
        "128",
        "--store-threshold",
        "2",
        "--model",
        "llama-3-8b",
        "--model-name",
        "m",
    ]);
    // `kvtier replay --metrics` prints `render` of the run's payload.
    let report = kvtier_cli::replay::replay(&args.replay_options().unwrap(), false).unwrap();
    let replay_text =
        kvtier::export::render(&report.payload, kvtier::export::ExporterConfig::new("m", 1))
            .unwrap();
    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    serving.wait_replay().unwrap();
    let served = kvtier::export::encode_text(serving.registry()).unwrap();
    let (status, _, scraped) = get(serving.local_addr(), "/metrics");
    serving.stop();
    assert_eq!(status, "HTTP/1.1 200 OK");
    // The collector's own health families (its export count moves between two reads) are
    // served next to the replay's; `replay --metrics` has no collector.
    let replay_families = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.contains("kvtier_collector_"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(replay_families(&scraped), replay_families(&served));
    assert!(served.contains("# TYPE kvtier_collector_rejected_payloads_total counter"));
    // Everything but the measured lookup times (their count is fixed) is the same text.
    let fixed = |t: &str| -> Vec<String> {
        replay_families(t)
            .into_iter()
            .filter(|l| {
                !(l.starts_with("vllm:kv_offload_lookup_sync_delay_seconds_bucket")
                    || l.starts_with("vllm:kv_offload_lookup_sync_delay_seconds_sum"))
            })
            .collect()
    };
    assert_eq!(fixed(&served), fixed(&replay_text));
    let e = "{engine=\"0\",model_name=\"m\"}";
    // Every loaded and stored block is one 2 MiB block of Llama-3-8B.
    let c = report.counts;
    assert_eq!((c.hit_blocks, c.stored_blocks), (5134, 10_085));
    #[expect(clippy::cast_precision_loss, reason = "Prometheus holds floats")]
    let bytes = |blocks: u64| kvtier::export::format_float((blocks * 2_097_152) as f64);
    assert_eq!(bytes(c.hit_blocks), "1.0766778368e+10");
    assert_eq!(bytes(c.stored_blocks), "2.114977792e+10");
    for line in [
        format!("vllm:kv_offload_lookup_sync_delay_seconds_count{e} 2000.0"),
        format!("vllm:kv_offload_allocation_failure_total{e} 500.0"),
        format!("vllm:kv_offload_stores_skipped_total{e} 17531.0"),
        format!("vllm:kv_offload_load_bytes_total{e} 1.0766778368e+10"),
        format!("vllm:kv_offload_store_bytes_total{e} 2.114977792e+10"),
        "vllm:kv_offload_total_bytes_total{engine=\"0\",model_name=\"m\",transfer_type=\"CPU_to_GPU\"} 1.0766778368e+10".to_owned(),
        format!("vllm:num_requests_running{e} 0.0"),
    ] {
        assert!(
            served.lines().any(|l| l == line),
            "missing {line:?} in\n{served}"
        );
    }
}

#[test]
fn serve_holds_the_replayer_to_max_open_blocks() {
    // serve once built its replayer without the option: a trace past it replayed anyway.
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
    let args = serve_args(&["--trace", trace, "--max-open-blocks", "10"]);
    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    let err = serving.wait_replay().unwrap_err().to_string();
    serving.stop();
    assert!(err.contains("over the limit of 10"), "{err}");
    assert!(err.contains("--max-open-blocks"), "{err}");
}

/// The value of label `name` in the one `vllm:cache_config_info` line of `text`.
fn cache_config_label(text: &str, name: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no vllm:cache_config_info in\n{text}"));
    let key = format!("{name}=\"");
    let at = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + key.len();
    line[at..].split('"').next().unwrap().to_owned()
}

#[test]
fn serve_exposes_the_gpu_cache_config_that_capacity_prints() {
    for (serve_extra, capacity_extra) in [
        (
            &["--model", "llama-3.1-8b", "--gpu-memory", "70GiB"][..],
            &["--model", "llama-3.1-8b", "--memory", "70GiB"][..],
        ),
        (
            &[
                "--model",
                "qwen3-8b",
                "--gpu-blocks",
                "5000",
                "--max-model-len",
                "32768",
            ],
            &[
                "--model",
                "qwen3-8b",
                "--num-gpu-blocks-override",
                "5000",
                "--max-model-len",
                "32768",
            ],
        ),
    ] {
        let mut serve = vec!["--requests", "4"];
        serve.extend_from_slice(serve_extra);
        let mut serving = start(&serve_args(&serve).serve_options().unwrap()).unwrap();
        serving.wait_replay().unwrap();
        let (_, _, text) = get(serving.local_addr(), "/metrics");
        serving.stop();
        let mut argv = vec!["kvtier", "capacity", "--json"];
        argv.extend_from_slice(capacity_extra);
        let mut out = Vec::new();
        Cli::try_parse_from(argv).unwrap().run_to(&mut out).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let tokens = json["kv_cache_size_tokens"].as_u64().unwrap();
        assert!(tokens > 0, "{json}");
        assert_eq!(
            cache_config_label(&text, "kv_cache_size_tokens"),
            tokens.to_string()
        );
        let concurrency: f64 = cache_config_label(&text, "kv_cache_max_concurrency")
            .parse()
            .unwrap();
        assert_eq!(concurrency, json["max_concurrency"].as_f64().unwrap());
        assert_eq!(
            cache_config_label(&text, "num_gpu_blocks"),
            json["num_blocks"].as_u64().unwrap().to_string()
        );
        assert_eq!(cache_config_label(&text, "block_size"), "16");
    }
    // Without a GPU budget there is no cache config; a budget without a model names the option.
    let mut serving = start(&serve_args(&["--requests", "1"]).serve_options().unwrap()).unwrap();
    serving.wait_replay().unwrap();
    assert!(
        !get(serving.local_addr(), "/metrics")
            .2
            .contains("vllm:cache_config_info")
    );
    serving.stop();
    let e = start(
        &serve_args(&["--requests", "1", "--gpu-memory", "1GiB"])
            .serve_options()
            .unwrap(),
    )
    .map(|s| s.stop())
    .unwrap_err();
    assert!(e.to_string().contains("--model"), "{e}");
}
