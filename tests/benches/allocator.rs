//! Allocator and block-pool benchmarks (divan).
//!
//! Run with `cargo bench -p kvtier-tests --bench allocator`. Each bench is run at a pool of
//! 16,384 and of 4,194,304 ids, set up in a steady state (half the ids held) so the operations
//! measured are the ones a running server repeats. Setup is outside the timed closure.

use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use kvtier_core::BlockKey;
use kvtier_core::allocator::{FreeQueue, SlotPool};
use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};

fn main() {
    divan::main();
}

const SIZES: [u32; 2] = [16_384, 4_194_304];
const BATCH: u32 = 64;

/// Spreads successive calls over all ids (a bijection on `0..n` for power-of-two `n`), so the
/// large sizes pay their real cache misses instead of hitting one hot line.
fn scatter(i: u32, n: u32) -> u32 {
    i.wrapping_mul(0x9E37_79B1) & (n - 1)
}

/// A slot pool with every fresh id used and the even ids freed (LIFO reuse from here on).
fn steady_slot_pool(n: u32) -> SlotPool {
    let mut pool = SlotPool::new(n);
    let _ = pool.alloc_n(n, |_| {});
    for id in (0..n).step_by(2) {
        let _ = pool.free(scatter(id, n));
    }
    pool
}

#[divan::bench(args = SIZES)]
fn slot_pool_alloc_free_one(bencher: Bencher, n: u32) {
    let mut pool = steady_slot_pool(n);
    bencher.bench_local(|| {
        if let Ok(id) = pool.alloc() {
            let _ = pool.free(black_box(id));
        }
    });
}

#[divan::bench(args = SIZES)]
fn slot_pool_alloc_n_free_batch(bencher: Bencher, n: u32) {
    let mut pool = steady_slot_pool(n);
    let mut ids = Vec::with_capacity(BATCH as usize);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        ids.clear();
        let _ = pool.alloc_n(BATCH, |id| ids.push(id));
        for &id in ids.iter().rev() {
            let _ = pool.free(id);
        }
    });
}

#[divan::bench(args = SIZES)]
fn free_queue_pop_front_push_back(bencher: Bencher, n: u32) {
    let Ok(mut q) = FreeQueue::new_full(n) else {
        return;
    };
    bencher.bench_local(|| {
        if let Ok(id) = q.pop_front() {
            let _ = q.push_back(black_box(id));
        }
    });
}

#[divan::bench(args = SIZES)]
fn free_queue_remove_middle_push_back(bencher: Bencher, n: u32) {
    let Ok(mut q) = FreeQueue::new_full(n) else {
        return;
    };
    let mut i = 0u32;
    bencher.bench_local(|| {
        let id = scatter(i, n);
        i = i.wrapping_add(1);
        if q.remove(black_box(id)).is_ok() {
            let _ = q.push_back(id);
        }
    });
}

#[divan::bench(args = SIZES)]
fn free_queue_pop_front_n_push_back_n(bencher: Bencher, n: u32) {
    let Ok(mut q) = FreeQueue::new_full(n) else {
        return;
    };
    let mut ids = Vec::with_capacity(BATCH as usize);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        ids.clear();
        let _ = q.pop_front_n(BATCH, |id| ids.push(id));
        let _ = q.push_back_n(&ids);
    });
}

/// A caching pool with half its blocks held and the other half cached-and-free, in LRU order
/// at the back of the free queue.
fn steady_block_pool(n: u32) -> Option<BlockPool<BlockKey>> {
    let mut pool = BlockPool::new(BlockPoolConfig::new(n, true)).ok()?;
    let mut held = Vec::new();
    pool.get_new_blocks(n - 1, |b| held.push(b)).ok()?;
    let keys: Vec<BlockKey> = (0..held.len() as u64)
        .map(|h| BlockKey::new(h, 0))
        .collect();
    pool.cache_full_blocks(&held, &keys, 0, n - 1, 16, None)
        .ok()?;
    let half = held.len() / 2;
    pool.free_blocks(held.get(..half)?).ok()?;
    Some(pool)
}

/// Uncached blocks: handed out and freed; they return to the front, so this is LIFO reuse with
/// no eviction after the first iteration.
#[divan::bench(args = SIZES)]
fn block_pool_get_new_free_batch(bencher: Bencher, n: u32) {
    let Some(mut pool) = steady_block_pool(n) else {
        return;
    };
    let mut got = Vec::with_capacity(BATCH as usize);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        got.clear();
        let _ = pool.get_new_blocks(BATCH, |b| got.push(b));
        got.reverse(); // a request's blocks are freed tail first
        let _ = pool.free_blocks(&got);
    });
}

#[divan::bench(args = SIZES)]
fn block_pool_touch_free_cached(bencher: Bencher, n: u32) {
    let Some(mut pool) = steady_block_pool(n) else {
        return;
    };
    // Prefix-cache hits: touch free cached blocks scattered through the queue, then free them.
    let cached: Vec<u32> = pool.free_queue().iter().collect();
    let mut i = 0usize;
    let mut batch = Vec::with_capacity(BATCH as usize);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        batch.clear();
        for _ in 0..BATCH {
            let k = scatter(u32::try_from(i).unwrap_or(0), n) as usize % cached.len();
            i = i.wrapping_add(1);
            // Repeats are fine: each touch is matched by one free.
            batch.push(cached.get(k).copied().unwrap_or(0));
        }
        let _ = pool.touch(&batch);
        let _ = pool.free_blocks(&batch);
    });
}

/// A request's whole life per iteration: get 64 blocks (each evicting the oldest cached block's
/// hash), cache them all under fresh keys, free them tail first (appended as cached). Every
/// iteration therefore evicts 64 hashes and inserts 64.
#[divan::bench(args = SIZES)]
fn block_pool_request_lifecycle(bencher: Bencher, n: u32) {
    let Some(mut pool) = steady_block_pool(n) else {
        return;
    };
    let mut got = Vec::with_capacity(BATCH as usize);
    let mut keys = Vec::with_capacity(BATCH as usize);
    let mut next_hash = u64::from(n);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        got.clear();
        keys.clear();
        let _ = pool.get_new_blocks(BATCH, |b| got.push(b));
        keys.extend((next_hash..next_hash + u64::from(BATCH)).map(|h| BlockKey::new(h, 0)));
        next_hash += u64::from(BATCH);
        let _ = pool.cache_full_blocks(&got, &keys, 0, BATCH, 16, None);
        got.reverse();
        let _ = pool.free_blocks(&got);
    });
}
