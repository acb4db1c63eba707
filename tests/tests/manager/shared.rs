//! `SharedManager` under several threads: random operations from each thread, then the core's
//! invariants hold and the drained counters equal the sum of what every thread did; lookup and
//! pin are one critical section; a poisoned lock is recovered; shards are independent.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::sync::Arc;
use std::thread;

use kvtier::shared::{ShardedManager, SharedManager};
use kvtier_core::manager::StoreOutcome;
use kvtier_core::manager::{LookupResult, ManagerConfig, OffloadManager};
use kvtier_core::stats::{Payload, catalogue};
use kvtier_tests::store::{outcome, store_or_no_room};
use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};

const THREADS: u64 = 4;
const OPS: u64 = 3_000;

/// What one thread did, as the exported counters should see it.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Did {
    /// `prepare_store` calls that had candidates (allocation-size samples).
    samples: u64,
    /// Their candidates (allocation-size sum).
    candidates: u64,
    /// Candidates turned away by the reuse filter.
    skipped: u64,
    /// Chunks pinned by `lookup_and_pin`.
    pinned: u64,
}

fn shared(capacity: u32, threshold: u32) -> Arc<SharedManager<u64>> {
    let mut cfg = ManagerConfig::new(capacity);
    cfg.store_threshold = threshold;
    Arc::new(SharedManager::new(OffloadManager::new(cfg).unwrap()))
}

/// Random stores, lookups with pins and drains from one thread.
fn hammer(m: &SharedManager<u64>, seed: u64, drained: &mut Payload) -> Did {
    let mut seed_bytes = [0; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let mut did = Did::default();
    for _ in 0..OPS {
        let start = rng.random_range(0..200);
        let len = rng.random_range(1..7);
        let keys: Vec<u64> = (start..start + len).collect();
        match rng.random_range(0..10) {
            0..=4 => m.with(|mgr| {
                let req = mgr.on_new_request().unwrap();
                // Under the same lock: what the manager will count for this offer.
                let absent = keys
                    .iter()
                    .filter(|k| mgr.lookup(k) == LookupResult::Miss)
                    .count() as u64;
                let before = mgr.inspect().stores_skipped_undrained();
                let out = store_or_no_room(mgr, req, &keys, None).unwrap();
                let stored: Option<Vec<u64>> = out.map(|o| o.keys().to_vec());
                let skipped = mgr.inspect().stores_skipped_undrained() - before;
                did.skipped += skipped;
                let candidates = absent - skipped;
                if candidates > 0 {
                    did.samples += 1;
                    did.candidates += candidates;
                }
                if let Some(stored) = stored {
                    mgr.complete_store(&stored, outcome(rng.random_range(0..8) != 0));
                }
                mgr.on_request_finished(req).unwrap();
            }),
            5..=8 => {
                let req = m.with(|mgr| mgr.on_new_request()).unwrap();
                let pinned = m.lookup_and_pin(req, &keys, None).unwrap();
                assert_eq!(pinned.slots.len(), pinned.hits);
                did.pinned += pinned.hits as u64;
                m.with(|mgr| {
                    // Still resident: nothing could evict a pinned chunk.
                    for k in &keys[..pinned.hits] {
                        assert_eq!(mgr.lookup(k), LookupResult::Hit);
                    }
                    mgr.complete_load(&keys[..pinned.hits]).unwrap();
                    mgr.on_request_finished(req).unwrap();
                });
            }
            _ => drained.aggregate(&m.drain_payload()).unwrap(),
        }
    }
    did
}

fn run_threads(m: &Arc<SharedManager<u64>>) -> (Did, Payload) {
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let m = Arc::clone(m);
            thread::spawn(move || {
                let mut drained = Payload::new();
                let did = hammer(&m, 0x5eed + t, &mut drained);
                (did, drained)
            })
        })
        .collect();
    let mut total = Did::default();
    let mut drained = Payload::new();
    for h in handles {
        let (d, p) = h.join().unwrap();
        total.samples += d.samples;
        total.candidates += d.candidates;
        total.skipped += d.skipped;
        total.pinned += d.pinned;
        drained.aggregate(&p).unwrap();
    }
    drained.aggregate(&m.drain_payload()).unwrap();
    (total, drained)
}

#[test]
fn threads_hammering_one_manager_keep_invariants_and_counters() {
    let m = shared(64, 2);
    let (did, drained) = run_threads(&m);
    m.with(|mgr| {
        mgr.inspect().check_invariants().unwrap();
        assert_eq!(mgr.live_requests(), 0);
        // Every load completed, every successful store completed or failed: nothing pinned.
        assert_eq!(
            mgr.inspect().allocated(),
            mgr.inspect().evictable() + mgr.inspect().write_pending()
        );
        assert_eq!(mgr.inspect().write_pending(), 0);
    });
    let h = drained
        .histogram(catalogue::CPU_ALLOCATION_SIZE, &[])
        .unwrap();
    assert_eq!(h.count(), did.samples);
    assert_eq!(h.sum(), did.candidates);
    assert_eq!(
        drained.counter(catalogue::STORES_SKIPPED, &[]),
        Some(did.skipped)
    );
    assert!(
        did.samples > 100 && did.pinned > 100 && did.skipped > 100,
        "{did:?}"
    );
    // Nothing pinned at the end: usage 0.
    assert_eq!(
        drained
            .gauge(catalogue::CPU_CACHE_USAGE_PERC, &[])
            .unwrap()
            .numerator(),
        0
    );
}

#[test]
fn lookup_and_pin_never_loses_a_hit_to_a_concurrent_eviction() {
    // A tiny tier: stores from the other threads evict all the time, yet every HIT the scan
    // finds is pinned (prepare_load would fail on an evicted key).
    let m = shared(8, 0);
    let (did, _) = run_threads(&m);
    assert!(did.pinned > 0);
    m.with(|mgr| mgr.inspect().check_invariants().unwrap());
}

#[test]
fn a_poisoned_lock_is_recovered() {
    let m = shared(4, 0);
    let m2 = Arc::clone(&m);
    let r = thread::spawn(move || {
        m2.with(|mgr| {
            let req = mgr.on_new_request().unwrap();
            store_or_no_room(mgr, req, &[1, 2], None).unwrap();
            panic!("a worker dies holding the lock");
        })
    })
    .join();
    assert!(r.is_err());
    let (lookup, poisoned) = m.with_reporting(|mgr| mgr.lookup(&1));
    assert!(poisoned);
    assert_eq!(lookup, LookupResult::HitPending);
    let (_, poisoned) = m.with_reporting(|mgr| mgr.inspect().check_invariants());
    assert!(!poisoned, "the poison is cleared once recovered");
    m.with(|mgr| mgr.complete_store(&[1, 2], StoreOutcome::Stored));
    assert_eq!(m.lookup(&2), LookupResult::Hit);
}

#[test]
fn shards_are_independent_engines() {
    let managers = (0..3)
        .map(|_| OffloadManager::<u64>::new(ManagerConfig::new(4)).unwrap())
        .collect();
    let sharded = Arc::new(ShardedManager::new(managers));
    let handles: Vec<_> = (0..3usize)
        .map(|e| {
            let s = Arc::clone(&sharded);
            thread::spawn(move || {
                s.with(e, |m| {
                    let req = m.on_new_request().unwrap();
                    let keys: Vec<u64> = (0..=e as u64).collect();
                    store_or_no_room(m, req, &keys, None).unwrap();
                    m.complete_store(&keys, StoreOutcome::Stored);
                    m.on_request_finished(req).unwrap();
                })
                .unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(sharded.with(3, |_| ()).is_none());
    let drained = sharded.drain_payloads();
    for (e, p) in drained.iter().enumerate() {
        let h = p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap();
        assert_eq!((h.count(), h.sum()), (1, e as u64 + 1));
        assert_eq!(
            u64::from(sharded.get(e).unwrap().with(|m| m.inspect().allocated())),
            e as u64 + 1
        );
    }
}
