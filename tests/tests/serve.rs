//! `kvtier serve` end to end: the replay runs in-process behind the real `/metrics` endpoint, a
//! real Prometheus server (Debian package `prometheus`, loopback only, its own temp dir)
//! scrapes it, and its HTTP query API returns the replay's values. Also the endpoint's
//! behaviour (content type, 404, 405, a stalled client) and `replay --log-interval`.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use kvtier::cli::serve::{ServeArgs, start};
use kvtier::cli::{Cli, Command as Sub};
use kvtier::http::{MetricsServer, ServerConfig};
use kvtier_core::stats::catalogue;

fn serve_args(extra: &[&str]) -> ServeArgs {
    let mut argv = vec!["kvtier", "serve", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).unwrap().command {
        Sub::Serve(a) => a,
        other => panic!("parsed {other:?}"),
    }
}

/// One HTTP/1.0 GET on loopback: (status line, head, body).
fn get(addr: SocketAddr, target: &str) -> (String, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    (status, head.to_owned(), body.to_owned())
}

/// Kills and reaps the Prometheus server however the test ends.
struct Reaper(Child, PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The value of the first series of an instant query, once Prometheus has one.
fn query(prom: SocketAddr, expr: &str) -> Option<f64> {
    let (status, _, body) = get(prom, &format!("/api/v1/query?query={expr}"));
    if !status.contains(" 200 ") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
#[ignore = "needs a Prometheus server (Debian package prometheus); run via `cargo xtask test`"]
fn prometheus_scrapes_kvtier_serve() {
    let prometheus_bin = "prometheus";
    if Command::new(prometheus_bin)
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "this test runs a real Prometheus server: install the Debian package `prometheus` \
             (`cargo xtask test` does when it is missing)"
        );
    }
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
    let expected = kvtier::cli::replay::replay(&args.replay, false).unwrap();
    let skipped = expected.counts.stores_skipped.unwrap();
    let usage = expected
        .payload
        .gauge(catalogue::CPU_CACHE_USAGE_PERC, &[])
        .unwrap()
        .to_f64();
    assert!(skipped > 1000, "a filter run skips stores: {skipped}");

    let mut serving = start(&args).unwrap();
    let addr = serving.local_addr();
    assert!(addr.ip().is_loopback());
    let summary = serving.wait_replay().unwrap();
    assert_eq!(summary.counts.stores_skipped, Some(skipped));
    assert_eq!(summary.capacity, 256);

    let dir = std::env::temp_dir().join(format!(
        "kvtier-prometheus-{}-{}",
        std::process::id(),
        addr.port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: kvtier\n    static_configs:\n      \
             - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{}", free_loopback_port())
        .parse()
        .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(prometheus_bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let reaper = Reaper(child, dir.clone());

    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut got_skipped, mut got_usage) = (None, None);
    while Instant::now() < deadline && (got_skipped.is_none() || got_usage.is_none()) {
        thread::sleep(Duration::from_millis(500));
        if TcpStream::connect_timeout(&prom, Duration::from_secs(1)).is_err() {
            continue;
        }
        got_skipped = query(prom, "vllm:kv_offload_stores_skipped_total");
        got_usage = query(prom, "vllm:kv_offload_cpu_cache_usage_perc");
    }
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    assert!(
        got_skipped.is_some() && got_usage.is_some(),
        "Prometheus never had the series; its log:\n{log}"
    );
    #[expect(clippy::cast_precision_loss, reason = "Prometheus holds floats")]
    let skipped_f = skipped as f64;
    assert_eq!(got_skipped, Some(skipped_f));
    assert_eq!(got_usage, Some(usage));
    let failures = query(prom, "vllm:kv_offload_allocation_failure_total");
    #[expect(clippy::cast_precision_loss, reason = "Prometheus holds floats")]
    let failures_f = expected.counts.store_failures as f64;
    assert_eq!(failures, Some(failures_f));
    let chunks = query(prom, "vllm:kv_offload_config_info{cpu_num_chunks=\"256\"}");
    assert_eq!(chunks, Some(1.0));
    drop(reaper);
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
    config.io_timeout = Duration::from_secs(30);
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
    // Far below the stalled clients' 30 s timeout: they hold only their own threads.
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(stalled);
    server.stop();
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
    let a = kvtier::cli::replay::replay(&with.replay, false).unwrap();
    let b = kvtier::cli::replay::replay(&without.replay, false).unwrap();
    // Draining every 300 requests for the log line changes nothing the run reports.
    assert_eq!(a.counts, b.counts);
    assert_eq!(a.payload, b.payload);
    assert!(a.payload.counter(catalogue::STORES_SKIPPED, &[]).unwrap() > 0);
}

#[test]
fn serve_rejects_a_bad_rate() {
    let args = serve_args(&["--rate", "0"]);
    let err = start(&args).unwrap_err();
    assert_eq!(err.to_string(), "--rate must be a positive number, not 0");
}
