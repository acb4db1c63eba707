//! `kvtier serve --offloader simple` end to end: the replay runs through the simple CPU
//! offloader behind the engine model's GPU front, and its real `/metrics` endpoint serves
//! vLLM's five `vllm:simple_kv_offload_*` families with vLLM's types and labels, updated as the
//! replay goes. The values are checked against the same steps driven by hand (the engine and
//! the offloader built here, not through the command) and against the engine's own counts:
//! every block loaded from the CPU is one external prefix-cache hit of 16 tokens.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    reason = "test code: a failed unwrap is a failed test; small numbers"
)]

use std::thread;
use std::time::{Duration, Instant};

use kvtier_cli::Cli;
use kvtier_cli::serve::start;
use kvtier_cli::tier::SimpleTier;
use kvtier_core::simple::SimpleScheduler;
use kvtier_core::stats::catalogue::SIMPLE_LOAD_BLOCKS;
use kvtier_tests::prometheus_server::http_get;
use kvtier_tests::simple_drive::{
    BLOCK_TOKENS, SMALL_A, engine, feed, offloader_config, small_a_requests,
};

/// The engine and pool of every run here.
const ENGINE: [&str; 8] = [
    "--gpu-blocks",
    "300",
    "--max-num-seqs",
    "32",
    "--decode-tokens",
    "8",
    "--model-name",
    "m",
];

fn serve_args(extra: &[&str]) -> Cli {
    let mut argv = vec![
        "kvtier",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        SMALL_A,
        "--offloader",
        "simple",
        "--export-interval-ms",
        "20",
    ];
    argv.extend_from_slice(&ENGINE);
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

/// The blocks loaded by the same steps driven by hand, and the engine's external hit tokens.
fn loads_by_hand(cpu_blocks: u32, lazy: bool) -> (u64, u64) {
    let mut engine = engine();
    let mut sc = offloader_config(cpu_blocks, lazy);
    sc.max_requests = 32 * 4 + 64;
    let mut tier = SimpleTier::new(SimpleScheduler::new(sc).unwrap(), BLOCK_TOKENS, 1);
    feed(&mut engine, &mut tier, &small_a_requests());
    let mut t = engine.counts().steps;
    while tier.busy() {
        tier.idle_step(engine.gpu_mut().pool_mut(), t).unwrap();
        t += 1;
    }
    let loads = tier
        .scheduler()
        .get_stats()
        .counter(SIMPLE_LOAD_BLOCKS, &[])
        .unwrap();
    (loads, engine.counts().external_prefix_cache_hits)
}

/// The value of the sample `name{labels}` in an exposition, if there is one.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let head = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .map(|v| v.parse().unwrap())
}

const E: &str = "engine=\"0\",model_name=\"m\"";

#[test]
fn serve_offloader_simple_serves_the_five_series_of_its_replay() {
    for lazy in [false, true] {
        let mut extra = vec!["--capacity", "512"];
        if lazy {
            extra.push("--lazy");
        }
        let args = serve_args(&extra);
        let mut serving = start(&args.serve_options().unwrap()).unwrap();
        let summary = serving.wait_replay().unwrap();
        let (status, _, text) = http_get(serving.local_addr(), "/metrics").unwrap();
        serving.stop();
        assert_eq!(status, "HTTP/1.1 200 OK");

        let (loads, external_hits) = loads_by_hand(512, lazy);
        assert!(loads > 0, "lazy {lazy}: nothing loaded");
        // Each loaded block is one external hit of 16 tokens (the engine's own count).
        assert_eq!(loads * 16, external_hits);
        let s = summary.simple.unwrap();
        assert_eq!(s.load_blocks, loads);
        assert_eq!(summary.capacity, 512);
        for (name, kind) in [
            ("vllm:simple_kv_offload_load_blocks_total", "counter"),
            ("vllm:simple_kv_offload_used_blocks", "gauge"),
            ("vllm:simple_kv_offload_pending_store_blocks", "gauge"),
            ("vllm:simple_kv_offload_info", "gauge"),
        ] {
            assert!(
                text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
                "lazy {lazy}: no {kind} {name} in\n{text}"
            );
        }
        let load = sample(&text, "vllm:simple_kv_offload_load_blocks_total", E);
        assert_eq!(load, Some(loads as f64), "lazy {lazy}");
        let hits = sample(&text, "vllm:external_prefix_cache_hits_total", E);
        assert_eq!(hits, Some(external_hits as f64), "lazy {lazy}");
        // Idle at the end: no transfer pins a CPU block, only the null block is used.
        let used = sample(&text, "vllm:simple_kv_offload_used_blocks", E);
        assert_eq!(used, Some(1.0), "lazy {lazy}");
        let pending = sample(&text, "vllm:simple_kv_offload_pending_store_blocks", E);
        assert_eq!(pending, Some(0.0), "lazy {lazy}");
        let mode = if lazy { "true" } else { "false" };
        let info_labels = format!(
            "backend=\"cpu\",capacity_blocks=\"512\",engine=\"0\",lazy_offload=\"{mode}\",\
             model_name=\"m\",page_cache=\"false\""
        );
        let info = sample(&text, "vllm:simple_kv_offload_info", &info_labels);
        assert_eq!(info, Some(1.0), "lazy {lazy}:\n{text}");
        // One full-attention group hands off no boundary state: vLLM emits no outcome.
        assert_eq!(s.outcomes.iter().map(|o| o.1).sum::<u64>(), 0);
        assert!(
            !text.contains("vllm:simple_kv_offload_save_outcomes_total{"),
            "lazy {lazy}: an outcome sample without a hand-off"
        );
        assert_eq!(sample(&text, "vllm:num_requests_running", E), Some(0.0));
    }
}

#[test]
fn serve_offloader_simple_updates_the_series_as_the_replay_goes() {
    // 1000 requests at 400 per second: about 2.5 s, scraped every 20 ms.
    let args = serve_args(&["--capacity", "512", "--rate", "400"]);
    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    let addr = serving.local_addr();
    let (final_loads, _) = loads_by_hand(512, false);
    let mut seen = Vec::new();
    let mut running = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, _, text) = http_get(addr, "/metrics").unwrap();
        let load = sample(&text, "vllm:simple_kv_offload_load_blocks_total", E);
        seen.push(load.unwrap_or(0.0));
        running.push(sample(&text, "vllm:num_requests_running", E).unwrap());
        if load == Some(final_loads as f64) || Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    serving.wait_replay().unwrap();
    serving.stop();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&(final_loads as f64)), "{seen:?}");
    // Scrapes in the middle of the replay saw part of the loads and requests running.
    assert!(
        seen.iter().any(|&v| v > 0.0 && v < final_loads as f64),
        "{seen:?}"
    );
    assert!(running.iter().any(|&r| r > 0.0), "{running:?}");
    assert!(running.iter().all(|&r| r <= 32.0), "{running:?}");
}

#[test]
fn serve_offloader_simple_needs_a_gpu_and_publishes_kv_events() {
    let argv = [
        "kvtier",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        SMALL_A,
        "--offloader",
        "simple",
    ];
    let args = Cli::try_parse_from(argv).unwrap();
    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    let err = serving.wait_replay().unwrap_err().to_string();
    serving.stop();
    assert!(err.contains("needs a GPU in front"), "{err}");
    // With an endpoint, the offloader's events go out on the server's publisher (what they
    // are is tests/tests/serve/kv_events_simple.rs's): every store is one BlockStored.
    let args = serve_args(&[
        "--kv-events-endpoint",
        "inproc://simple-serve",
        "--capacity",
        "64",
    ]);
    let mut serving = start(&args.serve_options().unwrap()).unwrap();
    serving.wait_replay().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = serving.kv_events().unwrap().stats();
    while sent.events <= 100 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
        sent = serving.kv_events().unwrap().stats();
    }
    serving.stop();
    assert!(sent.batches > 10 && sent.events > 100, "{sent:?}");
    assert_eq!(sent.dropped, 0);
}

#[test]
fn serve_offloader_simple_takes_the_gpu_of_gpu_memory_and_a_cpu_budget() {
    let argv = [
        "kvtier",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        SMALL_A,
        "--offloader",
        "simple",
        "--model",
        "llama-3-8b",
        "--gpu-memory",
        "4GiB",
        "--cpu-bytes",
        "3GiB",
    ];
    let args = Cli::try_parse_from(argv).unwrap();
    let opts = args.serve_options().unwrap();
    // 4 GiB of Llama-3-8B's 2 MiB blocks, as `kvtier capacity --memory 4GiB` prints them.
    let gpu = opts.replay.gpu.unwrap();
    assert_eq!(gpu.num_gpu_blocks, 2048);
    let cap = kvtier_cli::sizing::report(opts.gpu.as_ref().unwrap()).unwrap();
    assert_eq!(cap.num_blocks, Some(2048));
    let mut serving = start(&opts).unwrap();
    let summary = serving.wait_replay().unwrap();
    let (_, _, text) = http_get(serving.local_addr(), "/metrics").unwrap();
    serving.stop();
    // 3 GiB over 2 MiB blocks.
    assert_eq!(summary.capacity, 1536);
    assert!(text.contains("capacity_blocks=\"1536\""), "{text}");
    assert!(text.contains("num_gpu_blocks=\"2048\""), "{text}");
    let s = summary.simple.unwrap();
    assert_eq!(s.load_blocks * 16, s.engine.external_prefix_cache_hits);
}
