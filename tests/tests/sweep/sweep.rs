//! `kvtier sweep`: every row equals the single `kvtier replay` of its configuration (on a
//! Mooncake and a kvtrace trace, on one thread and several), the infinite-cache bound and the
//! knee, the model's GiB, and the plot as a valid SVG and a PNG of the requested size.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_cli::Cli;
use kvtier_cli::replay::ReplayReport;
use kvtier_cli::sweep::SweepReport;
use kvtier_tests::expected::data;

/// The replay of `args`, its error as the message the command prints.
fn replay(args: &Cli, progress: bool) -> Result<ReplayReport, String> {
    kvtier_cli::replay::replay(&args.replay_options().unwrap(), progress).map_err(|e| e.to_string())
}

/// The sweep of `args`, its error as the message the command prints.
fn sweep(args: &Cli, progress: bool) -> Result<SweepReport, String> {
    kvtier_cli::sweep::sweep(args.sweep_options().unwrap(), progress).map_err(|e| e.to_string())
}

fn sweep_args(extra: &[&str]) -> Cli {
    let mut argv = vec!["kvtier", "sweep"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

/// What the command prints to stdout for `cli`.
fn output(cli: Cli) -> String {
    let mut out = Vec::new();
    cli.run_to(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Every row against a separate `kvtier replay` run (parsed by clap from the same options).
fn rows_equal_single_replays(r: &SweepReport, trace: &str, extra: &[&str]) {
    for row in &r.rows {
        let capacity = row.capacity.to_string();
        let threshold = row.store_threshold.to_string();
        let mut argv = vec![
            "kvtier",
            "replay",
            "--trace",
            trace,
            "--capacity",
            &capacity,
            "--policy",
            row.policy,
            "--store-threshold",
            &threshold,
        ];
        argv.extend_from_slice(extra);
        let a = Cli::try_parse_from(argv).unwrap();
        let single = replay(&a, false).unwrap();
        let c = single.counts;
        let got = (
            row.requests,
            row.request_blocks,
            row.hit_blocks,
            row.hit_requests,
            row.stored_blocks,
            row.evicted_blocks,
            row.store_failures,
            row.stopped_at_pending,
            row.stores_skipped,
            row.resident_blocks,
            row.digest.clone(),
        );
        let want = (
            c.requests,
            c.request_blocks,
            c.hit_blocks,
            Some(c.hit_requests),
            Some(c.stored_blocks),
            Some(c.evicted_blocks),
            Some(c.store_failures),
            Some(c.stopped_at_pending),
            c.stores_skipped,
            Some(single.resident_blocks),
            Some(format!("{:016x}", c.digest)),
        );
        assert_eq!(row.source, "replay");
        assert_eq!(
            got, want,
            "{} {} {}",
            row.policy, row.capacity, row.store_threshold
        );
        assert_eq!(row.block_hit_rate, c.block_hit_rate());
        assert_eq!(
            row.prefill_tokens_saved,
            c.hit_blocks * u64::from(r.block_tokens)
        );
    }
}

#[test]
fn mooncake_rows_equal_single_replays_and_vllm() {
    let trace = data("mooncake-synthetic.jsonl");
    let trace = trace.to_str().unwrap();
    let a = sweep_args(&[
        "--trace",
        trace,
        "--capacities",
        "512,2048",
        "--policies",
        "lru,arc",
        "--thresholds",
        "1,2",
        "--jobs",
        "3",
    ]);
    let r = sweep(&a, false).unwrap();
    assert_eq!(r.rows.len(), 8);
    assert_eq!(
        (r.format, r.block_tokens, r.requests),
        ("mooncake", 512, 2886)
    );
    rows_equal_single_replays(&r, trace, &[]);
    // Two of the rows are in vLLM's own results.
    let find = |policy: &str, capacity: u32, threshold: u32| {
        r.rows
            .iter()
            .find(|x| {
                x.policy == policy && x.capacity == capacity && x.store_threshold == threshold
            })
            .unwrap()
    };
    assert_eq!(
        find("lru", 2048, 1).digest.as_deref(),
        Some("80267ea8e8704c8d")
    );
    assert_eq!(
        find("arc", 512, 1).digest.as_deref(),
        Some("ba2a36546e537c0f")
    );
    assert_eq!(find("arc", 512, 1).store_failures, Some(47));
    // The bound: every repeated id hits (the sample has 40,148 distinct ids in 117,888 blocks,
    // none repeated within a request).
    assert_eq!(r.repeated_blocks, 117_888 - 40_148);
    assert!(r.rows.iter().all(|x| x.hit_blocks <= r.repeated_blocks));
    // Without a model there is no GiB.
    assert!(r.rows.iter().all(|x| x.gib.is_none()) && r.bytes_per_chunk.is_none());
}

#[test]
fn kvtrace_rows_equal_single_replays_on_one_thread_or_many() {
    let trace = data("small-a.kvtrace");
    let trace = trace.to_str().unwrap();
    let base = [
        "--trace", trace, "--from", "64", "--to", "1024", "--steps", "5",
    ];
    let one = sweep(&sweep_args(&[&base[..], &["--jobs", "1"]].concat()), false).unwrap();
    let many = sweep(&sweep_args(&[&base[..], &["--jobs", "4"]].concat()), false).unwrap();
    assert_eq!(one.rows, many.rows);
    assert_eq!(
        one.rows.iter().map(|r| r.capacity).collect::<Vec<_>>(),
        [64, 128, 256, 512, 1024, 64, 128, 256, 512, 1024]
    );
    rows_equal_single_replays(&one, trace, &[]);
    // The knee: the smallest capacity within one point of the best.
    let best = one
        .rows
        .iter()
        .map(|r| r.block_hit_rate)
        .fold(0.0, f64::max);
    let knee = one.knee.as_ref().unwrap();
    assert!(knee.block_hit_rate >= best - 0.01);
    assert!(
        one.rows
            .iter()
            .all(|r| r.capacity >= knee.capacity || r.block_hit_rate < best - 0.01)
    );
}

#[test]
fn a_model_turns_capacities_into_exact_gib() {
    let trace = data("mooncake-synthetic.jsonl");
    let a = sweep_args(&[
        "--trace",
        trace.to_str().unwrap(),
        "--capacities",
        "256",
        "--policies",
        "lru",
        "--model",
        "llama-3.1-8b",
    ]);
    let r = sweep(&a, false).unwrap();
    // Llama-3.1-8B: 32 layers · 8 KV heads · 128 dims · 2 (K, V) · 2 bytes = 128 KiB per
    // token; a 512-token id = 32 GPU blocks of 16 tokens = 64 MiB.
    assert_eq!(r.bytes_per_chunk, Some(64 << 20));
    assert_eq!(r.rows[0].gib, Some(16.0));
    let table = output(a);
    assert!(
        table.contains("67,108,864 bytes of CPU memory per chunk"),
        "{table}"
    );
    // A chunk must be whole GPU blocks.
    let a = sweep_args(&[
        "--trace",
        trace.to_str().unwrap(),
        "--capacities",
        "256",
        "--model",
        "llama-3.1-8b",
        "--block-size",
        "48",
    ]);
    assert!(sweep(&a, false).unwrap_err().contains("--block-size 48"));
    assert!(matches!(
        kvtier_cli::sweep::sweep(a.sweep_options().unwrap(), false),
        Err(kvtier_cli::sweep::SweepRunError::Model(
            kvtier_cli::sweep::ChunkBytesError::BlockSize { block_size: 48, .. }
        ))
    ));
}

#[test]
fn options_are_checked() {
    let trace = data("small-a.kvtrace");
    let trace = trace.to_str().unwrap();
    let e = sweep(&sweep_args(&["--trace", trace]), false).unwrap_err();
    assert!(e.contains("--capacities"), "{e}");
    let e = sweep(
        &sweep_args(&[
            "--trace", trace, "--from", "10", "--to", "5", "--steps", "3",
        ]),
        false,
    )
    .unwrap_err();
    assert!(e.contains("--from/--to/--steps"), "{e}");
    assert!(parse_fails(trace, &["--capacities", "1", "--from", "1"]));
    assert!(parse_fails(
        trace,
        &["--capacities", "1", "--plot-size", "12"]
    ));
    let e = sweep(
        &sweep_args(&[
            "--trace",
            trace,
            "--capacities",
            "64",
            "--plot",
            "/tmp/x.jpg",
        ]),
        false,
    )
    .unwrap_err();
    assert!(e.contains(".svg or .png"), "{e}");
    let e = sweep(
        &sweep_args(&[
            "--trace",
            trace,
            "--capacities",
            "64",
            "--plot",
            "/tmp/x.png",
            "--plot-size",
            "100x9000",
        ]),
        false,
    )
    .unwrap_err();
    assert!(e.contains("100x9000"), "{e}");
}

/// Whether clap rejects `kvtier sweep --trace TRACE EXTRA…`.
fn parse_fails(trace: &str, extra: &[&str]) -> bool {
    let mut argv = vec!["kvtier", "sweep", "--trace", trace];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).is_err()
}

fn plot_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn plots_are_a_valid_svg_and_a_png_of_the_requested_size() {
    let trace = data("mooncake-synthetic.jsonl");
    let dir = plot_dir();
    let svg = dir.join("curve.svg");
    let png_path = dir.join("curve.png");
    for (path, size) in [(&svg, "900x600"), (&png_path, "640x480")] {
        let a = sweep_args(&[
            "--trace",
            trace.to_str().unwrap(),
            "--capacities",
            "512,2048,8192",
            "--model",
            "llama-3.1-8b",
            "--plot",
            path.to_str().unwrap(),
            "--plot-size",
            size,
        ]);
        sweep(&a, false).unwrap();
    }

    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        (root.attribute("width"), root.attribute("height")),
        (Some("900"), Some("600"))
    );
    let texts: Vec<String> = root
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").to_string())
        .collect();
    let has = |needle: &str| texts.iter().any(|t| t.contains(needle));
    for needle in [
        "CPU-tier block hit rate: mooncake-synthetic.jsonl, llama-3.1-8b",
        "CPU tier capacity (chunks of 512 tokens, log scale)",
        "CPU memory for llama-3.1-8b (GiB, log scale)",
        "block hit rate (% of request blocks)",
        "LRU",
        "ARC",
        "infinite cache (every repeated block hits): 65.9%",
        "smallest within 1 pt of best",
    ] {
        assert!(has(needle), "no text {needle:?} in {texts:?}");
    }
    // One polyline per policy, and the dashed bound drawn as segments.
    let lines = root
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= 2, "{lines} polylines");

    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let info = reader.info();
    assert_eq!((info.width, info.height), (640, 480));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let mut buf = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).unwrap();
    let bytes = &buf[..frame.buffer_size()];
    // Text rendered: the title band (top 5%) holds dark pixels.
    let row_bytes = frame.line_size;
    let title_band = &bytes[..row_bytes * 24];
    let dark = title_band
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 100))
        .count();
    assert!(dark > 50, "{dark} dark pixels in the title band");
}
