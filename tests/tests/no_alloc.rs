//! Steady-state manager calls allocate nothing: a counting global allocator watches a warm
//! manager run thousands of request cycles (store with eviction, load, touch, finish, events,
//! stats) under both policies with the reuse filter on.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvtier_core::BlockKey;
use kvtier_core::manager::{
    ManagerConfig, OffloadManager, PolicyKind, StoreError, StoreOutcome, StorePlan,
};
use kvtier_tests::xorshift::xorshift;

struct Counting;

thread_local! {
    /// Allocations made by this thread (each test counts its own, whatever runs beside it).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

fn count() {
    // A thread being torn down has no counter left; its allocations are not a test's.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts calls. (This test crate is
// not kvtier-core, whose no-unsafe rule this does not touch.)
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
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
        let before = allocs();
        let mut sink = 0;
        for i in 2_000..12_000 {
            sink += cycle(&mut m, i, &mut keys, &pos, &mut plan);
        }
        let after = allocs();
        assert!(sink > 0);
        assert!(
            m.inspect().evictable() > 0,
            "the workload must keep the pool full and evicting"
        );
        assert_eq!(after - before, 0, "{policy}: steady-state calls allocated");
        m.inspect().check_invariants().unwrap();
    }
}

/// The key indexes never grow past their construction size under long churn. Removed keys
/// leave tombstones that use up a hash table's room; left alone, hashbrown then doubles a
/// table more than half full (an allocation in a store call, and more memory than
/// `required_bytes` counts). The manager rebuilds such an index in place instead.
#[test]
fn churn_never_grows_the_key_indexes() {
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        for (n, filter) in [(64u32, false), (1000, false), (1000, true)] {
            let mut cfg = ManagerConfig::new(n);
            cfg.policy = policy;
            if filter {
                cfg.store_threshold = 2;
                cfg.max_tracker_size = 2 * n;
            }
            let mut m = OffloadManager::<BlockKey>::new(cfg).unwrap();
            let mut plan = StorePlan::new();
            let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
            let mut keys = Vec::with_capacity(8);
            let mut run = |m: &mut OffloadManager<BlockKey>, cycles: u32| {
                for i in 0..cycles {
                    keys.clear();
                    keys.extend((0..4).map(|_| BlockKey::new(next() % (4 * u64::from(n)), 0)));
                    keys.sort_unstable();
                    keys.dedup();
                    let r = m.on_new_request().unwrap();
                    if m.prepare_store(r, &keys, None, &mut plan).is_ok() {
                        let outcome = match i % 7 {
                            0 => StoreOutcome::Failed,
                            _ => StoreOutcome::Stored,
                        };
                        m.complete_store(plan.keys(), outcome);
                    }
                    m.on_request_finished(r).unwrap();
                    let _ = m.take_stats();
                }
            };
            // Warm-up: the per-call buffers reach their working size (offers of up to four
            // keys, as many victims).
            run(&mut m, 50_000);
            let (warm, before) = (m.inspect().heap_bytes(), allocs());
            run(&mut m, 100_000);
            let after = allocs();
            let what = format!("{policy}, {n} chunks, filter {filter}");
            assert_eq!(after - before, 0, "{what}: allocated");
            // Beyond `required_bytes`, only the per-call buffers (688 bytes here); a doubled
            // index would add at least 656 more (the smallest, 128 buckets of 5 bytes).
            let need = OffloadManager::<BlockKey>::required_bytes(m.config());
            let held = m.inspect().heap_bytes();
            assert_eq!(held, warm, "{what}");
            assert!(
                (held as u64) < need + 1024,
                "{what}: {held} bytes held, {need} required"
            );
            m.inspect().check_invariants().unwrap();
        }
    }
}
