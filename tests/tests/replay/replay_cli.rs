//! `kvtier replay` end to end through its library entry points: arguments parsed by clap, the
//! JSON object's fields, the metrics exposition, and errors that name the line.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::path::PathBuf;

use kvtier_cli::Cli;
use kvtier_cli::replay::{ReplayReport, RunError};

/// The replay of `args`, its error as the message the command prints.
fn replay(args: &Cli, progress: bool) -> Result<ReplayReport, String> {
    kvtier_cli::replay::replay(&args.replay_options().unwrap(), progress).map_err(|e| e.to_string())
}

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
        .display()
        .to_string()
}

/// What `kvtier replay` prints with `extra`.
fn output(extra: &[&str]) -> String {
    let mut out = Vec::new();
    args(extra).run_to(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The JSON object `kvtier replay --json` prints with `extra`.
fn json(extra: &[&str]) -> serde_json::Value {
    let mut argv = extra.to_vec();
    if !argv.contains(&"--json") {
        argv.push("--json");
    }
    serde_json::from_str(&output(&argv)).unwrap()
}

fn args(extra: &[&str]) -> Cli {
    let mut argv = vec!["kvtier", "replay"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

#[test]
fn json_has_every_field_with_vllm_values() {
    let trace = data("small-a.kvtrace");
    let extra = [
        "--trace",
        &trace,
        "--policy",
        "arc",
        "--capacity",
        "256",
        "--store-threshold",
        "2",
        "--json",
    ];
    let v = json(&extra);
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
        "read_s",
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
    let v = json(&["--trace", &trace]);
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
    let text = kvtier::export::render(p, kvtier::export::ExporterConfig::new("m", 1)).unwrap();
    assert!(
        text.contains(
            "vllm:kv_offload_allocation_failure_total{engine=\"0\",model_name=\"m\"} 312.0"
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
        err.contains("line 25: request 8 arrives while 8 requests are in flight")
            && err.ends_with("(raise it with --max-requests)"),
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
    assert!(f("read_s") >= 0.0, "{v}");
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
    let v = json(&["--trace", &trace, "--json"]);
    assert_eq!(v["request_blocks"], 302_290);
    assert!(
        v["parse_s"].as_f64().unwrap() > 0.0,
        "reading a 5 MB file takes time"
    );
    assert!(
        v["read_s"].as_f64().unwrap() > 0.0,
        "the reader thread's time is reported"
    );
    assert_timings(&v);
    // The built-in workload: generating counts as parsing.
    assert_timings(&json(&["--requests", "3000", "--json"]));
    // With log lines, whose time is neither parsing nor replay.
    assert_timings(&json(&["--requests", "3000", "--log-interval", "500"]));
}

#[test]
fn open_blocks_are_bounded_by_an_option_named_in_the_error() {
    let trace = data("small-a.kvtrace");
    // small-a's open requests hold at most 1,265 blocks at once.
    assert!(
        replay(
            &args(&["--trace", &trace, "--max-open-blocks", "1265"]),
            false
        )
        .is_ok()
    );
    let err = replay(
        &args(&["--trace", &trace, "--max-open-blocks", "1264"]),
        false,
    )
    .unwrap_err();
    assert!(err.contains(": line "), "{err}");
    assert!(err.contains("over the limit of 1264"), "{err}");
    assert!(err.ends_with("(raise it with --max-open-blocks)"), "{err}");
    let err = replay(
        &args(&["--trace", &trace, "--max-open-blocks", "500"]),
        false,
    )
    .unwrap_err();
    assert!(
        err.ends_with(
            "line 33: request 16's 55 blocks would bring the open requests to 550 blocks, \
             over the limit of 500 (raise it with --max-open-blocks)"
        ),
        "{err}"
    );
}

#[test]
fn zero_block_tokens_is_refused() {
    let e = Cli::try_parse_from(["kvtier", "replay", "--block-tokens", "0"]).unwrap_err();
    assert!(e.to_string().contains("--block-tokens"), "{e}");
    // Built without clap, the replay refuses it too (positions would all be 0).
    let mut a = args(&["--requests", "10"]).replay_options().unwrap();
    a.block_tokens = Some(0);
    assert_eq!(
        kvtier_cli::replay::replay(&a, false)
            .map_err(|e| e.to_string())
            .unwrap_err(),
        "--block-tokens must be at least 1"
    );
    assert!(matches!(
        kvtier_cli::replay::replay(&a, false),
        Err(RunError::ZeroBlockTokens)
    ));
}

#[test]
fn zero_capacity_stores_nothing_as_in_vllm() {
    // vLLM's CPUOffloadingManager accepts num_chunks = 0: every store offer fails.
    let trace = data("small-a.kvtrace");
    let r = replay(&args(&["--trace", &trace, "--capacity", "0"]), false).unwrap();
    let c = r.counts;
    assert_eq!((c.requests, c.hit_blocks, c.stored_blocks), (1000, 0, 0));
    assert_eq!(c.store_failures, 1000);
    assert_eq!(r.resident_blocks, 0);
    assert_eq!(r.capacity, 0);
}

#[test]
fn a_repeated_hash_names_the_line_of_its_load() {
    let dir = std::env::temp_dir().join(format!("kvtier-replay-rep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("repeat.kvtrace");
    let (a, b) = ("000000000000000a", "000000000000000b");
    std::fs::write(
        &path,
        format!("# format=kvtrace v1\nL 0 1 {a}\nS 0\nC 0\nL 1 3 {a} {b} {b}\nS 1\nC 1\n"),
    )
    .unwrap();
    let p = path.display().to_string();
    let err = replay(&args(&["--trace", &p]), false).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        err,
        format!(
            "{p}: line 5: request 1 repeats block hash 000000000000000b (blocks 2 and 3) in the \
             blocks it would store: a store offer cannot hold a key twice"
        )
    );
}

#[test]
fn rejected_configurations_name_the_options_and_the_policy() {
    let err = |extra: &[&str]| {
        let mut a = vec!["--requests", "10"];
        a.extend_from_slice(extra);
        replay(&args(&a), false).unwrap_err()
    };
    assert_eq!(
        err(&["--max-requests", "0"]),
        "--max-requests must be at least 1"
    );
    // Under ARC, 3 · capacity must fit: the sum with --max-requests is not the reason.
    assert_eq!(
        err(&["--capacity", "1500000000", "--policy", "arc"]),
        "capacity 1500000000 is too large for --policy arc: ARC's key table of the chunks and \
         their 2 · capacity ghosts needs 3 · capacity below 4294967295 (capacity at most \
         1431655764)"
    );
    assert_eq!(
        err(&["--capacity", "4294967000"]),
        "capacity 4294967000 plus --max-requests 65536 must be below 4294967295"
    );
}

/// A trace of `requests` one-block requests (L, S, C each), with `tail` appended verbatim.
fn long_trace(name: &str, requests: u64, tail: &str) -> PathBuf {
    use std::fmt::Write as _;
    let mut text = String::from("# format=kvtrace v1\n# capacity=64\n# block_tokens=16\n");
    for rid in 0..requests {
        let _ = writeln!(text, "L {rid} 1 {:016x}\nS {rid}\nC {rid}", rid % 100);
    }
    text.push_str(tail);
    let path = std::env::temp_dir().join(format!("kvtier-{}-{name}.kvtrace", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_reader_thread_reports_an_error_past_the_first_chunk_with_its_line() {
    // 30,000 requests: 90,000 records, past the first chunk of 65,536.
    let path = long_trace("late-error", 30_000, "L 30000 x\n");
    let p = path.display().to_string();
    let err = replay(&args(&["--trace", &p]), false)
        .unwrap_err()
        .to_string();
    std::fs::remove_file(&path).unwrap();
    assert!(err.contains("line 90004"), "{err}");
    // The same records without the bad line replay whole.
    let path = long_trace("whole", 30_000, "");
    let p = path.display().to_string();
    let r = replay(&args(&["--trace", &p, "--json"]), false).unwrap();
    std::fs::remove_file(&path).unwrap();
    // 100 hashes in turn through a 64-chunk LRU: each is evicted before it comes back.
    let c = r.counts;
    assert_eq!(
        (
            c.requests,
            c.request_blocks,
            c.hit_blocks,
            c.stored_blocks,
            c.evicted_blocks
        ),
        (30_000, 30_000, 0, 30_000, 30_000 - 64)
    );
}

#[test]
fn a_replay_error_in_the_first_chunk_stops_the_reader() {
    // The first `L` passes --max-open-blocks 0 (line 4): the replay stops while the reader
    // still has chunks to fill, and the run returns instead of waiting for it.
    let path = long_trace("early-error", 30_000, "");
    let p = path.display().to_string();
    let err = replay(&args(&["--trace", &p, "--max-open-blocks", "0"]), false)
        .unwrap_err()
        .to_string();
    std::fs::remove_file(&path).unwrap();
    assert!(err.contains("line 4"), "{err}");
    assert!(err.contains("--max-open-blocks"), "{err}");
}
