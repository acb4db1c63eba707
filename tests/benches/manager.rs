//! Manager benchmarks (divan): whole-protocol replay of an in-memory generated workload (the
//! manager alone, records already parsed), and the store / load / lookup paths.
//!
//! Run: `cargo bench -p kvtier-tests --bench manager`. Throughput is reported in
//! request-blocks per second (divan's `items`).

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use divan::{Bencher, counter::ItemsCount};
use kvtier_cli::replay::Replayer;
use kvtier_cli::trace::OwnedRecord;
use kvtier_core::BlockKey;
use kvtier_core::manager::StoreOutcome;
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};
use kvtier_tests::store::store_or_no_room;

fn main() {
    divan::main();
}

fn workload(requests: u64) -> (Vec<OwnedRecord>, u64) {
    kvtier_tests::generated::records(requests)
}

fn manager(capacity: u32, policy: PolicyKind) -> OffloadManager {
    let mut cfg = ManagerConfig::new(capacity);
    cfg.policy = policy;
    OffloadManager::new(cfg).unwrap()
}

/// The kvtrace protocol over 20,000 generated requests (~950,000 request-blocks), per pool size.
#[divan::bench(args = [16_384, 262_144, 4_194_304], sample_count = 5, sample_size = 1)]
fn replay_lru(bencher: Bencher, capacity: u32) {
    let (recs, blocks) = workload(20_000);
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| Replayer::new(manager(capacity, PolicyKind::Lru), 16))
        .bench_local_values(|mut r| {
            for rec in &recs {
                r.apply(rec.as_record()).unwrap();
            }
            r
        });
}

/// The same replay under ARC.
#[divan::bench(args = [16_384, 4_194_304], sample_count = 5, sample_size = 1)]
fn replay_arc(bencher: Bencher, capacity: u32) {
    let (recs, blocks) = workload(20_000);
    bencher
        .counter(ItemsCount::new(blocks))
        .with_inputs(|| Replayer::new(manager(capacity, PolicyKind::Arc), 16))
        .bench_local_values(|mut r| {
            for rec in &recs {
                r.apply(rec.as_record()).unwrap();
            }
            r
        });
}

fn keys(base: u64, n: u64) -> Vec<BlockKey> {
    (base..base + n)
        .map(|h| BlockKey::new(h.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0))
        .collect()
}

/// One 32-block store cycle on a full 16,384-chunk pool: prepare_store (evicting 32),
/// complete_store, finish.
#[divan::bench]
fn store_cycle_32(bencher: Bencher) {
    let mut m = manager(16_384, PolicyKind::Lru);
    let warm = keys(0, 16_384);
    for chunk in warm.chunks(32) {
        let r = m.on_new_request().unwrap();
        store_or_no_room(&mut m, r, chunk, None).unwrap();
        m.complete_store(chunk, StoreOutcome::Stored);
        m.on_request_finished(r).unwrap();
    }
    let mut next = 1_000_000u64;
    let pos: Vec<u64> = (1..=32).map(|i| i * 16).collect();
    bencher.counter(ItemsCount::new(32u32)).bench_local(|| {
        let ks = keys(next, 32);
        next += 32;
        let r = m.on_new_request().unwrap();
        let n = store_or_no_room(&mut m, r, &ks, Some(&pos))
            .unwrap()
            .map_or(0, |o| o.keys().len());
        m.complete_store(&ks, StoreOutcome::Stored);
        m.on_request_finished(r).unwrap();
        n
    });
}

/// 32 lookups + prepare_load + complete_load of resident keys.
#[divan::bench]
fn load_cycle_32(bencher: Bencher) {
    let mut m = manager(16_384, PolicyKind::Lru);
    let ks = keys(0, 32);
    let r = m.on_new_request().unwrap();
    store_or_no_room(&mut m, r, &ks, None).unwrap();
    m.complete_store(&ks, StoreOutcome::Stored);
    m.on_request_finished(r).unwrap();
    let pos: Vec<u64> = (1..=32).map(|i| i * 16).collect();
    bencher.counter(ItemsCount::new(32u32)).bench_local(|| {
        let r = m.on_new_request().unwrap();
        let hits = ks
            .iter()
            .take_while(|k| m.lookup(k) == kvtier_core::manager::LookupResult::Hit)
            .count();
        m.prepare_load(r, &ks[..hits], Some(&pos[..hits])).unwrap();
        m.complete_load(&ks[..hits]).unwrap();
        m.on_request_finished(r).unwrap();
        hits
    });
}

/// One lookup of a resident key and one of an absent key in a full 16,384-chunk pool.
#[divan::bench]
fn lookup_pair(bencher: Bencher) {
    let mut m = manager(16_384, PolicyKind::Lru);
    let ks = keys(0, 16_384);
    for chunk in ks.chunks(64) {
        let r = m.on_new_request().unwrap();
        store_or_no_room(&mut m, r, chunk, None).unwrap();
        m.complete_store(chunk, StoreOutcome::Stored);
        m.drop_request(r).unwrap();
    }
    let absent = keys(1 << 40, 1)[0];
    let mut i = 0usize;
    bencher.bench_local(|| {
        i = (i + 7919) % ks.len();
        (
            m.lookup(divan::black_box(&ks[i])),
            m.lookup(divan::black_box(&absent)),
        )
    });
}
