//! A loom model of `SharedManager`'s lookup-then-pin atomicity: whatever the interleaving, a key
//! that `lookup_and_pin` reports as a HIT is pinned before any other thread's store can evict
//! it, and the manager's invariants hold at the end.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p kvtier --release
//! --test loom_shared` (optional: not part of `.ci/run`, to keep CI within its time budget).

#![cfg(loom)]
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier::shared::SharedManager;
use kvtier::sync::Arc;
use kvtier_core::BlockKey;
use kvtier_core::manager::{
    ChunkState, ManagerConfig, OffloadManager, StoreError, StoreOutcome, StorePlan,
};

fn k(i: u64) -> BlockKey {
    BlockKey::new(i, 0)
}

#[test]
fn a_hit_is_pinned_before_any_eviction() {
    loom::model(|| {
        // One slot, holding key 1 (idle, evictable).
        let mut m: OffloadManager = OffloadManager::new(ManagerConfig::new(1)).unwrap();
        let r = m.on_new_request().unwrap();
        m.prepare_store(r, &[k(1)], None, &mut StorePlan::new())
            .unwrap();
        m.complete_store(&[k(1)], StoreOutcome::Stored);
        m.on_request_finished(r).unwrap();
        let shared = Arc::new(SharedManager::new(m));

        let reader = {
            let shared = shared.clone();
            loom::thread::spawn(move || {
                let req = shared.with(|m| m.on_new_request()).unwrap();
                let pinned = shared.lookup_and_pin(req, &[k(1)], None).unwrap();
                if pinned.hits == 1 {
                    // Pinned inside the same critical section as the lookup: still resident.
                    let state = shared.with(|m| m.inspect().chunk(&k(1)).map(|c| c.1));
                    assert_eq!(state, Some(ChunkState::Pinned(1)));
                    shared.with(|m| m.complete_load(&[k(1)])).unwrap();
                }
                shared.with(|m| m.on_request_finished(req)).unwrap();
                pinned.hits
            })
        };
        let writer = {
            let shared = shared.clone();
            loom::thread::spawn(move || {
                shared.with(|m| {
                    let req = m.on_new_request().unwrap();
                    // Needs key 1's slot: evicts it only if it is not pinned.
                    let mut plan = StorePlan::new();
                    let stored = match m.prepare_store(req, &[k(2)], None, &mut plan) {
                        Ok(()) => Some(plan.keys().len()),
                        Err(StoreError::NoRoom { .. }) => None,
                        Err(e) => panic!("{e}"),
                    };
                    m.complete_store(&[k(2)], StoreOutcome::Stored);
                    m.on_request_finished(req).unwrap();
                    stored
                })
            })
        };
        let hits = reader.join().unwrap();
        let stored = writer.join().unwrap();
        shared.with(|m| m.inspect().check_invariants()).unwrap();
        // The reader pinned first (the store fails while the pin lasts, or evicts key 1 after
        // the load completed), or the store evicted key 1 first and the reader misses. A
        // lookup-then-pin that was not atomic would instead fail its `prepare_load` (unwrap).
        match (hits, stored) {
            (1, None) | (1, Some(1)) | (0, Some(1)) => {}
            other => panic!("hit and store outcomes {other:?} break lookup-then-pin atomicity"),
        }
    });
}
