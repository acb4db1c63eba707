//! The engine model's steps drive the core's simple CPU offloader (`kvtier_core::simple`)
//! through the same [`Connector`] hooks as the OffloadingConnector tier: a check that the step
//! interface carries what `SimpleCPUOffloadScheduler` reads. Over a shared trace, eager and
//! lazy, the invariants hold: the seven outcomes sum to the hand-offs published, the pool
//! reports at least the null block used, nothing is pending once every transfer completed, and
//! the GPU pool is idle at the end (every pin the offloader took is released).

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test code: a failed unwrap is a failed test; small numbers"
)]

use kvtier_cli::engine::{Engine, EngineConfig};
use kvtier_cli::tier::SimpleTier;
use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::SimpleScheduler;
use kvtier_core::stats::Gauge;
use kvtier_core::stats::catalogue::{
    SIMPLE_LOAD_BLOCKS, SIMPLE_PENDING_STORE_BLOCKS, SIMPLE_USED_BLOCKS,
};
use kvtier_core::stats::simple_offload::SaveOutcome;
use kvtier_tests::simple_drive::{BLOCK_TOKENS, engine, feed, offloader_config, small_a_requests};

fn drive(lazy: bool, cpu_blocks: u32) -> (SimpleTier, Engine) {
    let mut engine = engine();
    let sc = offloader_config(cpu_blocks, lazy);
    let mut tier = SimpleTier::new(
        SimpleScheduler::new(sc).unwrap(),
        BLOCK_TOKENS,
        EngineConfig::DEFAULT_TRANSFER_STEPS,
    );
    feed(&mut engine, &mut tier, &small_a_requests());
    // The engine is idle; the offloader may still hold queued flushes and stores in flight.
    let mut t = engine.counts().steps;
    while tier.busy() {
        let pool = engine_pool(&mut engine);
        tier.idle_step(pool, t).unwrap();
        t += 1;
        assert!(t < engine.counts().steps + 100, "stores never drain");
    }
    (tier, engine)
}

/// The engine's GPU pool, for the offloader's calls after the engine's last step.
fn engine_pool(engine: &mut Engine) -> &mut BlockPool<BlockKey> {
    engine.gpu_mut().pool_mut()
}

#[test]
fn the_engine_drives_the_simple_offloader_eager_and_lazy() {
    for lazy in [false, true] {
        for cpu_blocks in [512, 4096] {
            let (mut tier, engine) = drive(lazy, cpu_blocks);
            let outcomes: u64 = SaveOutcome::ALL
                .iter()
                .map(|&o| tier.scheduler().boundary_total(o))
                .sum();
            assert_eq!(
                outcomes,
                tier.scheduler().published(),
                "lazy {lazy} cpu {cpu_blocks}"
            );
            let stats = tier.scheduler().get_stats();
            let used = stats.gauge(SIMPLE_USED_BLOCKS, &[]).unwrap();
            assert!(used.numerator() >= 1);
            assert_eq!(
                stats.gauge(SIMPLE_PENDING_STORE_BLOCKS, &[]),
                Some(Gauge::int(0))
            );
            assert_eq!(tier.scheduler().pending_store_blocks(), 0);
            // Every GPU pin the offloader took is released: the GPU is idle.
            assert_eq!(engine.gpu().usage().used, 0, "lazy {lazy} cpu {cpu_blocks}");
            // Idle, the pool is the null block in use; what was stored stays cached.
            assert_eq!(used, Gauge::int(1));
            // One full-attention group has no boundary hand-offs (vLLM's come from Mamba
            // "align" groups only): eager stores come from the cursor scan and the flushes.
            assert_eq!(tier.scheduler().published(), 0);
            let cached = tier.scheduler().cpu_pool().cached_key_count();
            assert!(cached > 0, "lazy {lazy} cpu {cpu_blocks}: nothing stored");
            let loads = stats.counter(SIMPLE_LOAD_BLOCKS, &[]).unwrap_or(0);
            assert!(loads > 0, "lazy {lazy} cpu {cpu_blocks}: nothing loaded");
            assert_eq!(loads * 16, engine.counts().external_prefix_cache_hits);
        }
    }
}

/// `kvtier replay --offloader simple` runs the same steps: its report gives the numbers of the
/// direct drive above, and it needs a GPU.
#[test]
fn replay_offloader_simple_reports_what_the_steps_give() {
    use kvtier_cli::Cli;
    use kvtier_cli::replay::{SimpleRunError, replay_simple};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
    let parse = |extra: &[&str]| {
        let mut argv = vec!["kvtier", "replay", "--trace", path, "--offloader", "simple"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap()
    };
    for lazy in [false, true] {
        let mut extra = vec![
            "--capacity",
            "4096",
            "--gpu-blocks",
            "300",
            "--max-num-seqs",
            "32",
            "--decode-tokens",
            "8",
        ];
        if lazy {
            extra.push("--lazy");
        }
        let a = parse(&extra);
        let r = replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()).unwrap();
        let (mut tier, engine) = drive(lazy, 4096);
        let stats = tier.scheduler().get_stats();
        assert_eq!(
            r.load_blocks,
            stats.counter(SIMPLE_LOAD_BLOCKS, &[]).unwrap_or(0)
        );
        assert!(r.load_blocks > 0);
        assert_eq!(r.gpu.counts, engine.counts());
        assert_eq!((r.used_blocks, r.pending_store_blocks), (1, 0));
        assert_eq!(r.outcomes.len(), 7);
        assert_eq!(r.outcomes.values().sum::<u64>(), 0);
        assert_eq!(
            r.payload.counter(SIMPLE_LOAD_BLOCKS, &[]),
            Some(r.load_blocks)
        );
    }
    let a = parse(&["--capacity", "64"]);
    assert!(matches!(
        replay_simple(&a.replay_options().unwrap(), a.simple_options().unwrap()),
        Err(SimpleRunError::NeedsGpu)
    ));
}
