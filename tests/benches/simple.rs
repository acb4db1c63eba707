//! The simple offloader behind the engine model (divan): the engine alone (no tier) against
//! the engine driving the core's simple scheduler, for a dense model and for a hybrid one
//! (`--hybrid`: a Mamba group in align mode, its boundary states handed off), on small-a's
//! 1,000 requests at 300 GPU blocks, 256 tokens a step, 4,096 CPU blocks, eager.
//!
//! Run: `cargo bench -p kvtier-tests --bench simple`. Throughput is in requests; the
//! scheduler's share is the difference to `engine_alone`, read side by side from one run.

#![allow(
    clippy::unwrap_used,
    reason = "bench code: a failed unwrap is a failed bench"
)]

use divan::{Bencher, counter::ItemsCount};
use kvtier_cli::engine::{self, Engine, EngineConfig, NoConnector};
use kvtier_cli::tier::SimpleTier;
use kvtier_core::simple::{SimpleConfig, SimpleScheduler};
use kvtier_tests::simple_drive::{feed, small_a_requests};

fn main() {
    divan::main();
}

fn config(hybrid: bool) -> EngineConfig {
    let mut cfg = EngineConfig::new(300, 16);
    cfg.max_num_seqs = 32;
    cfg.decode_tokens = 8;
    cfg.max_num_batched_tokens = 256;
    cfg.hybrid = hybrid;
    cfg
}

fn tier(cfg: &EngineConfig) -> SimpleTier {
    let mut sc = SimpleConfig::with_cpu_blocks(16, cfg.num_gpu_blocks, 4096);
    sc.max_num_batched_tokens = 256;
    sc.layout = engine::layout(cfg.hybrid);
    SimpleTier::new(SimpleScheduler::new(sc).unwrap(), 16, 1)
}

/// The engine model with no tier behind it.
#[divan::bench(args = [false, true], sample_count = 10, sample_size = 1)]
fn engine_alone(bencher: Bencher, hybrid: bool) {
    let requests = small_a_requests();
    bencher
        .counter(ItemsCount::new(requests.len()))
        .with_inputs(|| Engine::new(config(hybrid)).unwrap())
        .bench_local_values(|mut e| {
            feed(&mut e, &mut NoConnector, &requests);
            e
        });
}

/// The engine driving the simple offloader (dense: `false`; hybrid: `true`).
#[divan::bench(args = [false, true], sample_count = 10, sample_size = 1)]
fn engine_and_simple(bencher: Bencher, hybrid: bool) {
    let requests = small_a_requests();
    bencher
        .counter(ItemsCount::new(requests.len()))
        .with_inputs(|| {
            let cfg = config(hybrid);
            (Engine::new(cfg).unwrap(), tier(&cfg))
        })
        .bench_local_values(|(mut e, mut t)| {
            feed(&mut e, &mut t, &requests);
            (e, t)
        });
}
