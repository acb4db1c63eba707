//! The GPU front (`kvtier_cli::engine`): the engine against the reference model of
//! `kvtier_tests::engine_model` on random request sequences (dense and hybrid models: the
//! hybrid one's state tables and hand-offs compared call for call too), scenarios with
//! hand-computed numbers, and a replay whose GPU holds everything.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::BTreeSet;

use kvtier_cli::engine::{Engine, EngineConfig, EngineError};
use kvtier_cli::trace::Record;
use kvtier_tests::engine_model::{Call, ModelEngine, Recorder};
use proptest::prelude::*;

fn config(blocks: u32, bt: u32, mbt: u64, seqs: usize, dec: u32, ts: u64) -> EngineConfig {
    let mut c = EngineConfig::new(blocks, bt);
    c.max_num_batched_tokens = mbt;
    c.max_num_seqs = seqs;
    c.decode_tokens = dec;
    c.transfer_steps = ts;
    c
}

/// Runs `reqs` through the engine with a recording tier seeded with `tier`.
fn run_engine(
    cfg: EngineConfig,
    reqs: &[Vec<u64>],
    tier: &[u64],
) -> (Engine, Recorder, Result<(), Option<u64>>) {
    let mut e = Engine::new(cfg).unwrap();
    let mut rec = Recorder::with_tier(tier);
    let stalled = |err: EngineError<core::convert::Infallible>| match err {
        EngineError::Stalled { step } => Some(step),
        _ => None,
    };
    for (rid, h) in reqs.iter().enumerate() {
        let r = Record::Load {
            rid: rid as u64,
            hashes: h,
        };
        if let Err(err) = e.apply(r, &mut rec) {
            return (e, rec, Err(stalled(err)));
        }
    }
    let r = e.finish(&mut rec).map_err(stalled);
    (e, rec, r)
}

#[test]
fn two_requests_share_a_prefix_and_free_tail_first() {
    let cfg = config(9, 16, 8192, 256, 1, 1);
    let (e, rec, r) = run_engine(cfg, &[vec![1, 2, 3], vec![1, 2, 4]], &[]);
    r.unwrap();
    let c = e.counts();
    // r1 finds hashes 1 and 2 in blocks 1 and 2; its last block is computed.
    assert_eq!((c.prefix_cache_queries, c.prefix_cache_hits), (96, 32));
    assert_eq!(
        (
            c.external_prefix_cache_queries,
            c.external_prefix_cache_hits
        ),
        (64, 0)
    );
    assert_eq!((c.steps, c.finished, c.preemptions), (2, 2, 0));
    // Freed in reverse order, cached blocks to the back: r0 frees 3 (2 and 1 still held by r1),
    // then r1 frees 4, 2, 1.
    assert!(
        e.gpu()
            .pool()
            .free_queue()
            .iter()
            .eq([5, 6, 7, 8, 3, 4, 2, 1])
    );
    assert_eq!(rec.log[0], Call::Lookup(0, 0, 2, 0));
    assert_eq!(rec.log[2], Call::Lookup(1, 2, 0, 0));
    assert_eq!(rec.log[3], Call::Allocated(1, vec![1, 2, 4], 0));
}

#[test]
fn a_tier_hit_loads_then_the_rest_is_computed() {
    let cfg = config(9, 16, 8192, 256, 2, 1);
    let (e, rec, r) = run_engine(cfg, &[vec![1, 2, 3]], &[1, 2]);
    r.unwrap();
    let step = |t, s: Vec<(u64, u64, u64, Vec<u32>, usize, bool)>| Call::Step(t, s, vec![]);
    assert_eq!(
        rec.log,
        [
            Call::Lookup(0, 0, 2, 2),
            Call::Allocated(0, vec![1, 2], 2),
            step(0, vec![]),
            step(1, vec![]),
            Call::LoadDone(0),
            step(2, vec![(0, 32, 16, vec![1, 2, 3], 1, true)]),
            Call::Prefill(0),
            step(3, vec![(0, 48, 1, vec![1, 2, 3, 4], 1, false)]),
            Call::Finished(0, vec![1, 2, 3, 4]),
        ]
    );
    let c = e.counts();
    assert_eq!((c.steps, c.loads), (4, 1));
    assert_eq!(
        (
            c.external_prefix_cache_queries,
            c.external_prefix_cache_hits
        ),
        (48, 32)
    );
    // Block 4 (a decode block, no hash) goes to the front.
    assert!(
        e.gpu()
            .pool()
            .free_queue()
            .iter()
            .eq([4, 5, 6, 7, 8, 3, 2, 1])
    );
}

#[test]
fn a_block_short_preempts_the_tail_once_its_stores_are_done() {
    let cfg = config(5, 1, 8192, 256, 3, 1);
    let (e, rec, r) = run_engine(cfg, &[vec![1, 2], vec![3, 4]], &[]);
    r.unwrap();
    let c = e.counts();
    assert_eq!((c.steps, c.preemptions, c.finished), (6, 1, 2));
    // Step 1 cannot preempt r1 (its stores end with step 1); step 2 does.
    assert!(rec.log.contains(&Call::Step(1, vec![], vec![])));
    assert!(rec.log.contains(&Call::Step(
        2,
        vec![(0, 2, 1, vec![1, 2, 4], 1, false)],
        vec![1]
    )));
    // r1 comes back with its one output: 3 tokens, hit cap 2 blocks, nothing cached.
    assert_eq!((c.preempted_queries, c.preempted_hits), (3, 0));
    assert!(rec.log.contains(&Call::Finished(1, vec![3, 4, 2, 1])));
    assert!(e.gpu().pool().free_queue().iter().eq([1, 2, 4, 3]));
}

#[test]
fn a_request_larger_than_the_gpu_is_refused() {
    let mut e = Engine::new(config(4, 16, 8192, 256, 1, 1)).unwrap();
    let err = e
        .apply(
            Record::Load {
                rid: 7,
                hashes: &[1, 2, 3, 4],
            },
            &mut Recorder::default(),
        )
        .unwrap_err();
    assert_eq!(
        err,
        EngineError::RequestTooLarge {
            rid: 7,
            blocks: 4,
            gpu_blocks: 4
        }
    );
}

fn requests() -> impl Strategy<Value = Vec<Vec<u64>>> {
    // Requests share prefixes of a few base sequences, then end in hashes of their own.
    prop::collection::vec((0u64..3, 0usize..5, 0usize..3), 1..24).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (base, shared, own))| {
                let mut h: Vec<u64> = (0..shared as u64).map(|j| base * 100 + j).collect();
                h.extend((0..own as u64).map(|j| 10_000 + i as u64 * 10 + j));
                if h.is_empty() {
                    h.push(20_000 + i as u64);
                }
                h
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_engine_matches_the_reference_model(
        reqs in requests(),
        blocks in 10u32..40,
        bt in 1u32..4,
        mbt in 1u64..24,
        seqs in 1usize..6,
        dec in 1u32..5,
        ts in 0u64..3,
        seeded in prop::collection::vec(0u64..300, 0..6),
        hybrid: bool,
    ) {
        let mut cfg = config(blocks, bt, mbt, seqs, dec, ts);
        // Align-mode chunks need a budget of at least one block (the engine refuses less).
        let hybrid = hybrid && mbt >= u64::from(bt);
        cfg.hybrid = hybrid;
        // A hybrid request holds two state blocks at most besides its table.
        let states = 2 * u64::from(hybrid);
        let fits = |h: &Vec<u64>| {
            (h.len() as u64 * u64::from(bt) + u64::from(dec) - 1).div_ceil(u64::from(bt))
                + states
                <= u64::from(blocks - 1)
        };
        let reqs: Vec<Vec<u64>> = reqs.into_iter().filter(fits).collect();
        let (e, rec, r) = run_engine(cfg, &reqs, &seeded);
        let mut m = ModelEngine::new(cfg);
        let mut mrec = Recorder::with_tier(&seeded);
        let mut mr = Ok(());
        for (rid, h) in reqs.iter().enumerate() {
            mr = m.arrive(rid as u64, h, &mut mrec);
            if mr.is_err() {
                break;
            }
        }
        if mr.is_ok() {
            mr = m.finish(&mut mrec);
        }
        prop_assert_eq!(r, mr.map_err(Some));
        prop_assert_eq!(&rec.log, &mrec.log);
        let c = e.counts();
        prop_assert_eq!(
            [c.steps, c.preemptions, c.prefix_cache_queries, c.prefix_cache_hits,
             c.external_prefix_cache_queries, c.external_prefix_cache_hits, c.finished],
            m.counts
        );
        prop_assert_eq!(e.gpu().pool().free_queue().iter().collect::<Vec<_>>(), m.free_list());
        if e.open_requests() == 0 {
            // Idle: every block but the null block is free, every request finished.
            prop_assert_eq!(e.gpu().usage().used, 0);
            prop_assert_eq!(c.finished, reqs.len() as u64);
        }
        prop_assert!(c.prefix_cache_hits <= c.prefix_cache_queries);
        prop_assert!(c.external_prefix_cache_hits <= c.external_prefix_cache_queries);
    }
}

/// With a GPU that never evicts and never chunks a prefill, a request's GPU hit is the
/// longest prefix (short of its last block) of the hashes of the requests before it, and the
/// tier behind it never hits: everything it stored is still on the GPU.
#[test]
fn a_gpu_that_holds_everything_leaves_the_tier_only_first_time_blocks() {
    use kvtier_cli::Cli;
    use kvtier_cli::replay::replay;

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
    let argv = [
        "kvtier",
        "replay",
        "--trace",
        path,
        "--capacity",
        "1000",
        "--gpu-blocks",
        "1000000",
        "--max-num-batched-tokens",
        "1000000000",
    ];
    let args = Cli::try_parse_from(argv).unwrap();
    let report = replay(&args.replay_options().unwrap(), false).unwrap();
    let gpu = report.gpu.unwrap();

    let text = std::fs::read_to_string(path).unwrap();
    let (mut seen, mut tier_blocks, mut gpu_hit_blocks, mut tokens) = (BTreeSet::new(), 0, 0, 0);
    for line in text.lines().filter(|l| l.starts_with("L ")) {
        let hashes: Vec<u64> = line
            .split(' ')
            .skip(3)
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .collect();
        let g = hashes[..hashes.len() - 1]
            .iter()
            .take_while(|h| seen.contains(*h))
            .count();
        gpu_hit_blocks += g as u64;
        tier_blocks += (hashes.len() - g) as u64;
        tokens += hashes.len() as u64 * 16;
        seen.extend(hashes);
    }
    assert_eq!(report.counts.hit_blocks, 0);
    assert_eq!(gpu.counts.external_prefix_cache_hits, 0);
    assert_eq!(gpu.counts.preemptions, 0);
    assert_eq!(report.counts.requests, 1000);
    assert_eq!(report.counts.request_blocks, tier_blocks);
    assert_eq!(gpu.counts.prefix_cache_hits, gpu_hit_blocks * 16);
    assert_eq!(gpu.counts.prefix_cache_queries, tokens);
    assert!(gpu_hit_blocks > 0);
}

fn parse(argv: &[&str]) -> kvtier_cli::Cli {
    let mut full = vec!["kvtier"];
    full.extend_from_slice(argv);
    kvtier_cli::Cli::try_parse_from(full).unwrap()
}

/// The GPU series `serve --gpu-blocks` exports (one payload per drain, deltas) add up to the
/// totals `replay --gpu-blocks --metrics` prints.
#[test]
fn serve_and_replay_export_the_same_gpu_series() {
    let argv = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--requests",
        "3000",
        "--capacity",
        "128",
        "--gpu-blocks",
        "600",
        "--model-name",
        "m",
    ];
    let args = parse(&argv);
    let report = kvtier_cli::replay::replay(&args.replay_options().unwrap(), false).unwrap();
    let gpu = report.gpu.unwrap();
    assert!(gpu.counts.prefix_cache_hits > 0 && gpu.counts.external_prefix_cache_hits > 0);
    let config = kvtier::export::ExporterConfig::new("m", 1);
    let printed = kvtier::export::render(&report.payload, config).unwrap();
    let mut serving = kvtier_cli::serve::start(&args.serve_options().unwrap()).unwrap();
    serving.wait_replay().unwrap();
    let served = kvtier::export::encode_text(serving.registry()).unwrap();
    serving.stop();
    let gpu_lines = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| {
                [
                    "vllm:prefix_cache_",
                    "vllm:external_prefix_cache_",
                    "vllm:kv_cache_usage_perc",
                ]
                .iter()
                .any(|p| l.starts_with(p))
                    || l.starts_with("vllm:prompt_tokens_cached_by_source_total{")
                        && l.contains("source=\"device\"")
            })
            .map(str::to_owned)
            .collect()
    };
    let printed = gpu_lines(&printed);
    assert_eq!(printed.len(), 6, "{printed:?}");
    let value = |name: &str| -> f64 {
        let line = printed.iter().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    #[expect(clippy::cast_precision_loss, reason = "small counts, exact in f64")]
    let hits = gpu.counts.prefix_cache_hits as f64;
    assert_eq!(value("vllm:prefix_cache_hits_total{"), hits);
    assert_eq!(printed, gpu_lines(&served));
}

/// `sweep --gpu-blocks` puts the same front before every case: with a GPU that holds
/// everything, no case's tier hits, and every case sees the same GPU misses.
#[test]
fn sweep_behind_a_gpu_that_holds_everything_never_hits() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
    let args = parse(&[
        "sweep",
        "--trace",
        path,
        "--capacities",
        "64,4096",
        "--gpu-blocks",
        "1000000",
        "--max-num-batched-tokens",
        "1000000000",
    ]);
    let r = kvtier_cli::sweep::sweep(args.sweep_options().unwrap(), false).unwrap();
    assert_eq!(r.rows.len(), 4);
    for row in &r.rows {
        assert_eq!(row.hit_blocks, 0, "{row:?}");
        assert_eq!(row.request_blocks, r.rows[0].request_blocks);
    }
    // Without the GPU, the large tier hits.
    let plain = parse(&["sweep", "--trace", path, "--capacities", "4096"]);
    let p = kvtier_cli::sweep::sweep(plain.sweep_options().unwrap(), false).unwrap();
    assert!(p.rows.iter().all(|row| row.hit_blocks > 0));
    assert!(r.rows[0].request_blocks < p.rows[0].request_blocks);
}
