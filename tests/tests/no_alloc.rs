//! Steady-state manager calls allocate nothing: a counting global allocator watches a warm
//! manager run thousands of request cycles (store with eviction, load, touch, finish, events,
//! stats) under both policies with the reuse filter on.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::BlockKey;
use kvtier_core::manager::{
    ManagerConfig, OffloadManager, PolicyKind, StoreError, StoreOutcome, StorePlan,
};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls. (This test crate is
// not kvtier-core, whose no-unsafe rule this does not touch.)
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Request `i` shares a 16-block prefix family with others and adds its own tail.
fn request_keys(i: u64, out: &mut Vec<BlockKey>) {
    out.clear();
    let family = i % 7;
    out.extend((0..16).map(|b| BlockKey::new(family * 1000 + b, 0)));
    out.extend((0..16).map(|b| BlockKey::new(1_000_000 + (i % 97) * 100 + b, 0)));
}

fn cycle(
    m: &mut OffloadManager,
    i: u64,
    keys: &mut Vec<BlockKey>,
    pos: &[u64],
    plan: &mut StorePlan<BlockKey>,
) -> u64 {
    request_keys(i, keys);
    let r = m.on_new_request().unwrap();
    let hits = m
        .pin_hit_prefix(r, keys, Some(&pos[..keys.len()]))
        .unwrap()
        .hits;
    m.complete_load(&keys[..hits]).unwrap();
    match m.prepare_store(r, &keys[hits..], Some(&pos[hits..keys.len()]), plan) {
        Ok(()) | Err(StoreError::NoRoom { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    m.complete_store(plan.keys(), StoreOutcome::Stored);
    m.touch(&keys[..4]);
    m.on_request_finished(r).unwrap();
    let mut n = 0;
    m.drain_events(|e| n += e.keys.len() as u64);
    let s = m.take_stats();
    n + s.num_used
}

#[test]
fn steady_state_calls_do_not_allocate() {
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        let mut cfg = ManagerConfig::new(256);
        cfg.policy = policy;
        cfg.store_threshold = 2;
        cfg.max_tracker_size = 4096;
        cfg.enable_events = true;
        let mut m = OffloadManager::new(cfg).unwrap();
        let mut keys = Vec::with_capacity(64);
        let mut plan = StorePlan::new();
        let pos: Vec<u64> = (1..=64).map(|i| i * 16).collect();
        // Warm-up: every buffer reaches its working size.
        for i in 0..2_000 {
            cycle(&mut m, i, &mut keys, &pos, &mut plan);
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut sink = 0;
        for i in 2_000..12_000 {
            sink += cycle(&mut m, i, &mut keys, &pos, &mut plan);
        }
        let after = ALLOCS.load(Ordering::Relaxed);
        assert!(sink > 0);
        assert!(
            m.inspect().evictable() > 0,
            "the workload must keep the pool full and evicting"
        );
        assert_eq!(after - before, 0, "{policy}: steady-state calls allocated");
        m.inspect().check_invariants().unwrap();
    }
}
