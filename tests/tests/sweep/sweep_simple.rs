//! `kvtier sweep --offloader simple` and `--cpu-bytes`: each sweep row is the single
//! `kvtier replay --offloader simple` of the same pool size; every block loaded is one
//! external hit of 16 tokens (the engine's own count); the CPU pool sized from a byte budget
//! is the count computed by hand from the model's shape as vLLM's `_derive_cpu_config` does.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_cli::Cli;
use kvtier_cli::replay::{SimpleRunError, replay_simple};
use kvtier_cli::sweep::sweep_simple;
use kvtier_core::stats::simple_offload::SaveOutcome;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
const ENGINE: [&str; 6] = [
    "--gpu-blocks",
    "300",
    "--max-num-seqs",
    "32",
    "--decode-tokens",
    "8",
];

fn replay_args(extra: &[&str]) -> Cli {
    let mut argv = vec![
        "kvtier",
        "replay",
        "--trace",
        TRACE,
        "--offloader",
        "simple",
    ];
    argv.extend_from_slice(&ENGINE);
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

/// What the command prints to stdout for `cli`.
fn output(cli: Cli) -> String {
    let mut out = Vec::new();
    cli.run_to(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn sweep_args(extra: &[&str]) -> Cli {
    let mut argv = vec!["kvtier", "sweep", "--trace", TRACE, "--offloader", "simple"];
    argv.extend_from_slice(&ENGINE);
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap()
}

#[test]
fn each_sweep_row_is_the_single_replay_of_its_pool_size() {
    for lazy in [false, true] {
        let mut extra = vec!["--capacities", "64,512,4096", "--jobs", "2"];
        if lazy {
            extra.push("--lazy");
        }
        let mut with_model = extra.clone();
        with_model.extend(["--model", "llama-3-8b"]);
        let r = sweep_simple(sweep_args(&with_model).sweep_options().unwrap()).unwrap();
        assert_eq!(r.rows.len(), 3);
        assert_eq!(r.requests, 1000);
        // Llama-3-8B: 32 layers · 8 KV heads · 128 dims · K and V · 2 bytes · 16 tokens.
        assert_eq!(r.bytes_per_block, Some(32 * 8 * 128 * 2 * 2 * 16));
        for (row, cap) in r.rows.iter().zip([64u32, 512, 4096]) {
            let cap_s = cap.to_string();
            let mut one = vec!["--capacity", cap_s.as_str()];
            if lazy {
                one.push("--lazy");
            }
            let a = replay_args(&one);
            let single =
                replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
            assert_eq!(row.cpu_blocks, cap);
            assert_eq!(row.load_blocks, single.load_blocks, "lazy {lazy} cap {cap}");
            assert_eq!(row.outcomes, single.outcomes);
            assert_eq!(
                row.external_hit_tokens,
                single.gpu.counts.external_prefix_cache_hits
            );
            assert_eq!(row.steps, single.gpu.counts.steps);
            assert_eq!(row.cached_blocks, single.cached_blocks);
            assert_eq!(row.load_blocks * 16, row.external_hit_tokens);
            assert_eq!((row.used_blocks, row.pending_store_blocks), (1, 0));
            // The pool holds at most its blocks but the null block.
            assert!(row.cached_blocks < cap as usize);
            let gib = f64::from(cap) * 2_097_152.0 / f64::from(1u32 << 30);
            assert_eq!(row.gib, Some(gib));
        }
        // A larger pool loads more in this trace (the same requests, more of them kept).
        assert!(r.rows[0].load_blocks < r.rows[1].load_blocks);
        assert!(r.rows[1].load_blocks < r.rows[2].load_blocks);
        with_model.push("--csv");
        let text = output(sweep_args(&with_model));
        let header = text.lines().next().unwrap();
        let labels: Vec<&str> = header.split(',').skip(2).take(7).collect();
        assert_eq!(labels, SaveOutcome::ALL.map(SaveOutcome::label));
        assert_eq!(text.lines().count(), 4);
    }
}

#[test]
fn sweep_offloader_simple_refuses_what_it_does_not_take() {
    for (extra, says) in [
        (
            vec!["--capacities", "64", "--thresholds", "2"],
            "--thresholds",
        ),
        (
            vec!["--capacities", "64", "--policies", "arc"],
            "--policies",
        ),
        (vec!["--capacities", "64", "--method", "stack"], "--method"),
    ] {
        let err = sweep_simple(sweep_args(&extra).sweep_options().unwrap()).unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let argv = [
        "kvtier",
        "sweep",
        "--trace",
        TRACE,
        "--offloader",
        "simple",
        "--capacities",
        "64",
    ];
    let a = Cli::try_parse_from(argv).unwrap();
    let err = sweep_simple(a.sweep_options().unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--gpu-blocks"), "{err}");
}

#[test]
fn cpu_bytes_sizes_the_pool_per_rank_as_vllm_does() {
    // 1000 MiB over Llama-3-8B's 2 MiB blocks: 500 blocks. Over 4 ranks, each holds 250 MiB
    // and a quarter of every block (the KV heads split): 500 blocks again.
    for (ws, blocks) in [("1", 500), ("4", 500), ("8", 500)] {
        let a = replay_args(&[
            "--cpu-bytes",
            "1000MiB",
            "--model",
            "llama-3-8b",
            "--world-size",
            ws,
        ]);
        let r = replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
        assert_eq!(r.cpu_blocks, blocks, "world size {ws}");
        // Every worker reports each store in its step: the stores complete, none is left.
        assert_eq!((r.used_blocks, r.pending_store_blocks), (1, 0));
        let plain = replay_args(&["--capacity", "500"]);
        let p = replay_simple(
            &plain.replay_options().unwrap(),
            plain.simple_options().unwrap(),
        )
        .unwrap();
        assert_eq!(r.load_blocks, p.load_blocks);
        assert_eq!(r.gpu.counts, p.gpu.counts);
    }
    // 1 GiB + 3 MiB: floor(1027 MiB / 2 MiB) = 513.
    let a = replay_args(&["--cpu-bytes", "1076887552", "--model", "llama-3-8b"]);
    let r = replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
    assert_eq!(r.cpu_blocks, 513);
    // --capacity is the explicit num_cpu_blocks, within the budget.
    let a = replay_args(&[
        "--cpu-bytes",
        "1000MiB",
        "--model",
        "llama-3-8b",
        "--capacity",
        "400",
    ]);
    let r = replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
    assert_eq!(r.cpu_blocks, 400);
    let a = replay_args(&[
        "--cpu-bytes",
        "1000MiB",
        "--model",
        "llama-3-8b",
        "--capacity",
        "501",
    ]);
    let err = replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("local offload capacity 500"), "{err}");
    // The split must be even; a budget needs a model.
    let a = replay_args(&[
        "--cpu-bytes",
        "1000MiB",
        "--model",
        "llama-3-8b",
        "--world-size",
        "3",
    ]);
    assert!(matches!(
        replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()),
        Err(SimpleRunError::UnevenSplit { world_size: 3, .. })
    ));
    let a = replay_args(&["--cpu-bytes", "1000MiB"]);
    assert!(matches!(
        replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()),
        Err(SimpleRunError::NeedsModel)
    ));
}

#[test]
fn a_hybrid_sweep_row_is_the_single_hybrid_replay() {
    let r = sweep_simple(
        sweep_args(&["--capacities", "64,4096", "--hybrid"])
            .sweep_options()
            .unwrap(),
    )
    .unwrap();
    assert!(r.hybrid);
    for (row, cap) in r.rows.iter().zip(["64", "4096"]) {
        let a = replay_args(&["--capacity", cap, "--hybrid"]);
        let single =
            replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
        assert!(single.gpu.hybrid);
        assert_eq!(row.outcomes, single.outcomes, "cap {cap}");
        assert_eq!(row.load_blocks, single.load_blocks, "cap {cap}");
        assert_eq!(row.steps, single.gpu.counts.steps);
        // The Mamba group's states are handed off and stored.
        assert!(row.outcomes[SaveOutcome::Stored.label()] > 0, "cap {cap}");
        assert_eq!((row.used_blocks, row.pending_store_blocks), (1, 0));
    }
    // A hybrid model needs the simple offloader: the offloading connector's tier refuses it.
    let mut argv = vec!["kvtier", "replay", "--trace", TRACE];
    argv.extend_from_slice(&ENGINE);
    argv.push("--hybrid");
    let a = Cli::try_parse_from(argv).unwrap();
    let e = kvtier_cli::replay::replay(&a.replay_options().unwrap(), false).unwrap_err();
    assert!(
        e.to_string().contains("--hybrid needs --offloader simple"),
        "{e}"
    );
}
