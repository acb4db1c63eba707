//! Sizing-curve benchmarks (divan): one stack pass (the LRU curve at every capacity up to
//! 65,536 chunks) against one replay of the same generated workload at 65,536 chunks, and the
//! sampled curves (rate 0.01: the sampled LRU stack plus miniature LRU and ARC replays at 64
//! capacities; and with the 4,096 hottest keys counted exactly, as `kvtier sweep --method
//! sample` runs it), records already parsed.
//!
//! Run: `cargo bench -p kvtier-tests --bench curve`. Throughput is in request-blocks per
//! second (divan's `items`); the ratios are read side by side from one run.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use divan::{Bencher, counter::ItemsCount};
use kvtier_cli::replay::Replayer;
use kvtier_cli::sweep::geometric_capacities;
use kvtier_cli::trace::OwnedRecord;
use kvtier_core::curve::{LruStack, SampledConfig, SampledCurves, StackConfig};
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};
use kvtier_tests::curve::feed;

fn main() {
    divan::main();
}

const MAX: u32 = 65_536;

fn workload() -> (Vec<OwnedRecord>, u64) {
    kvtier_tests::generated::records(20_000)
}

/// One replay at 65,536 chunks (LRU).
#[divan::bench(sample_count = 5, sample_size = 1)]
fn replay_once(bencher: Bencher) {
    let (recs, blocks) = workload();
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| Replayer::new(OffloadManager::new(ManagerConfig::new(MAX)).unwrap(), 16))
        .bench_local_values(|mut r| {
            for rec in &recs {
                r.apply(rec.as_record()).unwrap();
            }
            r
        });
}

/// One stack pass: the LRU curve at every capacity 1..=65,536.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn stack_pass(bencher: Bencher) {
    let (recs, blocks) = workload();
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| LruStack::new(StackConfig::new(MAX)).unwrap())
        .bench_local_values(|mut s| {
            feed(&recs, &mut s).unwrap();
            s.curve().unwrap()
        });
}

/// Sampled curves at rate 0.01: the sampled stack and miniature LRU and ARC replays at 64
/// log-spaced capacities.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn sampled_64(bencher: Bencher) {
    let (recs, blocks) = workload();
    let capacities = geometric_capacities(64, MAX, 64).unwrap();
    let cfg = SampledConfig {
        stack: true,
        ..SampledConfig::new(0.01, capacities, vec![PolicyKind::Lru, PolicyKind::Arc])
    };
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| SampledCurves::new(&cfg).unwrap())
        .bench_local_values(|mut s| {
            feed(&recs, &mut s).unwrap();
            s
        });
}

/// As [`sampled_64`] with the default first pass of `kvtier sweep --method sample`: the 4,096
/// hottest keys counted exactly, the miniatures without the sampled stack.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn sampled_64_hot(bencher: Bencher) {
    let (recs, blocks) = workload();
    let mut counter = kvtier_core::curve::HotCounter::new(4096).unwrap();
    for rec in &recs {
        if let kvtier_cli::trace::Record::Load { hashes, .. } = rec.as_record() {
            counter.add_all(hashes);
        }
    }
    let cfg = SampledConfig {
        hot: counter.finish().unwrap(),
        ..SampledConfig::new(
            0.01,
            geometric_capacities(64, MAX, 64).unwrap(),
            vec![PolicyKind::Lru, PolicyKind::Arc],
        )
    };
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| SampledCurves::new(&cfg).unwrap())
        .bench_local_values(|mut s| {
            feed(&recs, &mut s).unwrap();
            s
        });
}
