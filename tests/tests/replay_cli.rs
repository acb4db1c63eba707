//! `kvtier replay` end to end through its library entry points: arguments parsed by clap, the
//! JSON object's fields, the metrics exposition, and errors that name the line.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::path::PathBuf;

use clap::Parser;
use kvtier::cli::replay::{ReplayArgs, json_value, replay};
use kvtier::cli::{Cli, Command};

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
        .display()
        .to_string()
}

fn args(extra: &[&str]) -> ReplayArgs {
    let mut argv = vec!["kvtier", "replay"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Replay(a) => a,
        other => panic!("parsed {other:?}"),
    }
}

#[test]
fn json_has_every_field_with_vllm_values() {
    let trace = data("small-a.kvtrace");
    let a = args(&[
        "--trace",
        &trace,
        "--policy",
        "arc",
        "--capacity",
        "256",
        "--store-threshold",
        "2",
        "--json",
    ]);
    let r = replay(&a, false).unwrap();
    let v = json_value(&r);
    let o = v.as_object().unwrap();
    for field in [
        "requests",
        "request_blocks",
        "hit_blocks",
        "hit_requests",
        "stored_blocks",
        "evicted_blocks",
        "store_failures",
        "stopped_at_pending",
        "resident_blocks",
        "stores_skipped",
        "digest",
        "policy",
        "capacity",
        "store_threshold",
        "parse_s",
        "replay_s",
        "other_s",
        "wall_s",
        "replay_request_blocks_per_s",
        "request_blocks_per_s",
    ] {
        assert!(o.contains_key(field), "missing {field}");
    }
    // expected.tsv: small-a arc 256 2 → 4878 hits, 86 failures, 9832 skipped, d4d2dbd421043f88.
    assert_eq!(o["hit_blocks"], 4878);
    assert_eq!(o["store_failures"], 86);
    assert_eq!(o["stores_skipped"], 9832);
    assert_eq!(o["digest"], "d4d2dbd421043f88");
    assert_eq!(o["policy"], "arc");
    assert_eq!(o["resident_blocks"], 256);
    let compact = serde_json::to_string(&v).unwrap();
    assert!(!compact.contains('\n'));
}

#[test]
fn no_filter_means_null_stores_skipped_and_header_capacity_is_the_default() {
    let trace = data("small-a.kvtrace");
    let r = replay(&args(&["--trace", &trace]), false).unwrap();
    let v = json_value(&r);
    assert!(v["stores_skipped"].is_null());
    assert_eq!(v["capacity"], 1024, "from the trace header");
    assert_eq!(v["digest"], "bcfa623160a0a602");
}

#[test]
fn metrics_payload_carries_the_run() {
    let trace = data("small-a.kvtrace");
    let r = replay(
        &args(&["--trace", &trace, "--capacity", "256", "--metrics"]),
        false,
    )
    .unwrap();
    let p = &r.payload;
    use kvtier_core::stats::catalogue;
    assert_eq!(p.counter(catalogue::ALLOCATION_FAILURE, &[]), Some(312));
    // Failed attempts are sampled too, so only without failures does the sum equal the
    // stored blocks: small-a at 1024 chunks has none and stores 17,726 (expected.tsv).
    let full = replay(&args(&["--trace", &trace]), false).unwrap();
    let h = full
        .payload
        .histogram(catalogue::CPU_ALLOCATION_SIZE, &[])
        .unwrap();
    assert_eq!(full.counts.store_failures, 0);
    assert_eq!(h.sum(), 17_726);
    let text = kvtier::exposition::render(
        p,
        &kvtier::exposition::EngineLabels::new("m", "0"),
        &kvtier::exposition::ExpositionOptions::default(),
    )
    .unwrap();
    assert!(
        text.contains(
            "vllm:kv_offload_allocation_failure_total{model_name=\"m\",engine=\"0\"} 312.0"
        )
    );
    assert!(text.contains("cpu_num_chunks=\"256\""));
}

#[test]
fn builtin_workload_is_deterministic() {
    let a = replay(&args(&["--requests", "2000", "--seed", "5"]), false).unwrap();
    let b = replay(&args(&["--requests", "2000", "--seed", "5"]), false).unwrap();
    let c = replay(&args(&["--requests", "2000", "--seed", "6"]), false).unwrap();
    assert_eq!(a.counts, b.counts);
    assert_ne!(a.counts.digest, c.counts.digest);
    assert_eq!(a.counts.requests, 2000);
    assert!(a.counts.hit_blocks > 0 && a.counts.evicted_blocks > 0);
}

#[test]
fn malformed_trace_is_an_error_naming_the_line() {
    let dir = std::env::temp_dir().join(format!("kvtier-replay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.kvtrace");
    std::fs::write(&path, "# format=kvtrace v1\nL 0 1 00000000000000zz\n").unwrap();
    let p = path.display().to_string();
    let err = replay(&args(&["--trace", &p]), false).unwrap_err();
    assert!(err.contains("line 2"), "{err}");
    let missing = replay(&args(&["--trace", "/nonexistent/x.kvtrace"]), false).unwrap_err();
    assert!(missing.contains("/nonexistent/x.kvtrace"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn too_many_open_requests_is_an_error_naming_the_line() {
    let trace = data("small-a.kvtrace");
    // small-a keeps up to 33 requests open; its ninth `L` is line 25.
    let err = replay(&args(&["--trace", &trace, "--max-requests", "8"]), false).unwrap_err();
    assert!(
        err.contains("line 25:") && err.contains("8 request slots"),
        "{err}"
    );
    assert!(replay(&args(&["--trace", &trace, "--max-requests", "33"]), false).is_ok());
}

/// Asserts the timing fields of a report's JSON: present, non-negative, parse + replay within
/// wall (their sum with `other_s` is wall), and each rate the request blocks over its time.
fn assert_timings(v: &serde_json::Value) {
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"))
    };
    let (parse, replay, other, wall) = (f("parse_s"), f("replay_s"), f("other_s"), f("wall_s"));
    for (name, t) in [("parse_s", parse), ("replay_s", replay), ("other_s", other)] {
        assert!(t >= 0.0, "{name} = {t}");
    }
    assert!(replay > 0.0 && wall > 0.0, "{v}");
    assert!(parse + replay <= wall + 1e-9, "{parse} + {replay} > {wall}");
    assert!(
        (parse + replay + other - wall).abs() <= 1e-9 * wall.max(1.0),
        "{v}"
    );
    let blocks = v["request_blocks"].as_u64().unwrap() as f64;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(
        close(f("replay_request_blocks_per_s"), blocks / replay),
        "{v}"
    );
    assert!(close(f("request_blocks_per_s"), blocks / wall), "{v}");
}

#[test]
fn json_times_parsing_and_replay_apart() {
    let trace = data("small-b.kvtrace");
    let r = replay(&args(&["--trace", &trace, "--json"]), false).unwrap();
    let v = json_value(&r);
    assert_eq!(v["request_blocks"], 302_290);
    assert!(
        v["parse_s"].as_f64().unwrap() > 0.0,
        "reading a 5 MB file takes time"
    );
    assert_timings(&v);
    // The built-in workload: generating counts as parsing.
    let r = replay(&args(&["--requests", "3000", "--json"]), false).unwrap();
    assert_timings(&json_value(&r));
    // With log lines, whose time is neither parsing nor replay.
    let r = replay(
        &args(&["--requests", "3000", "--log-interval", "500"]),
        false,
    )
    .unwrap();
    assert_timings(&json_value(&r));
}

#[test]
fn human_report_shows_each_time_and_both_rates() {
    let trace = data("small-a.kvtrace");
    let r = replay(&args(&["--trace", &trace]), false).unwrap();
    let text = kvtier::cli::replay::human(&r);
    for label in [
        "parse time",
        "replay time",
        "other time",
        "wall time",
        "replay throughput",
        "wall throughput",
    ] {
        assert!(text.contains(label), "{label} missing in\n{text}");
    }
    assert!(text.contains(&format!("{:>12.3} s", r.replay_s)), "{text}");
}
