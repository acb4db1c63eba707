//! Scenario ports of vLLM 0.33.0's block-pool tests (spec A11, C13), error cases where vLLM
//! asserts, and a model-based proptest against `kvtier_tests::block_pool_model`.

use kvtier_core::BlockKey;
use kvtier_core::block_pool::{
    BlockHash, BlockPool, BlockPoolConfig, CacheError, FreeError, GetBlocksError, NewPoolError,
    OutOfRange, PoolEvent, TouchError, Usage,
};
use kvtier_tests::block_pool_model::{PoolModel, PoolOp, PoolOutput, apply_pool, snapshot};
use proptest::prelude::*;

const A: BlockKey = BlockKey::new(0xa, 0);
const B: BlockKey = BlockKey::new(0xb, 0);

fn pool(n: u32) -> BlockPool<BlockKey> {
    let mut c = BlockPoolConfig::new(n, true);
    c.enable_events = true;
    BlockPool::new(c).expect("a 1+ block pool builds")
}

fn get(p: &mut BlockPool<BlockKey>, n: u32) -> Result<Vec<u32>, GetBlocksError> {
    let mut v = Vec::new();
    p.get_new_blocks(n, |b| v.push(b)).map(|()| v)
}

fn queue(p: &BlockPool<BlockKey>) -> Vec<u32> {
    p.free_queue().iter().collect()
}

/// Gives `block` key `key` as the first full block of a request (16 tokens).
fn hash_one(p: &mut BlockPool<BlockKey>, block: u32, key: BlockKey) {
    p.cache_full_blocks(&[block], &[key], 0, 1, 16, None)
        .expect("caching one fresh block succeeds");
}

#[test]
fn c13_pool_of_ten() {
    let mut p = pool(10);
    assert_eq!(p.free_count(), 9);
    assert_eq!(p.usage(), Usage { used: 0, total: 9 });
    assert_eq!(p.usage().as_f64(), 0.0);
    assert_eq!(queue(&p), [1, 2, 3, 4, 5, 6, 7, 8, 9]);

    // get_new_blocks(3) → [1,2,3]; usage 3/9 = 1/3.
    assert_eq!(get(&mut p, 3), Ok(vec![1, 2, 3]));
    assert_eq!(p.usage(), Usage { used: 3, total: 9 });
    assert_eq!(p.usage().as_f64(), 1.0 - 6.0 / 9.0);
    assert!((p.usage().as_f64() - 1.0 / 3.0).abs() < 1e-15);
    assert_eq!(
        (1..4).map(|b| p.ref_count(b)).collect::<Vec<_>>(),
        [Some(1); 3]
    );

    // Block 1 gets hash A; free [1,2,3]: uncached 2,3 to the front, cached 1 to the back.
    hash_one(&mut p, 1, A);
    p.free_blocks(&[1, 2, 3]).unwrap();
    assert_eq!(queue(&p), [2, 3, 4, 5, 6, 7, 8, 9, 1]);
    assert_eq!(p.usage().as_f64(), 0.0);
    assert_eq!(p.get_one_block(&A), Some(1));

    // touch(1): ref 1, out of the queue, usage 1/9 (vLLM's float: 1 − 8/9).
    p.touch(&[1]).unwrap();
    assert_eq!(p.ref_count(1), Some(1));
    assert!(!p.free_queue().contains(1));
    assert_eq!(p.usage(), Usage { used: 1, total: 9 });
    assert_eq!(p.usage().as_f64(), 0.111_111_111_111_111_16);
    assert_eq!(p.usage().as_f64(), 1.0 - 8.0 / 9.0);
    assert!(!p.reset_prefix_cache());

    // Free 1 again: back to the tail. get_new_blocks(9) evicts A.
    p.free_blocks(&[1]).unwrap();
    assert_eq!(queue(&p), [2, 3, 4, 5, 6, 7, 8, 9, 1]);
    let _ = p.take_events().count();
    assert_eq!(get(&mut p, 9), Ok(vec![2, 3, 4, 5, 6, 7, 8, 9, 1]));
    assert_eq!(p.get_one_block(&A), None);
    assert_eq!(p.block_hash(1), None);
    assert_eq!(
        p.take_events().collect::<Vec<_>>(),
        [PoolEvent::Removed { key: A, block: 1 }]
    );
    // One more block → error ("Cannot get 1 free blocks from the pool"); usage 1.0.
    let err = get(&mut p, 1).unwrap_err();
    assert_eq!(
        err,
        GetBlocksError {
            requested: 1,
            free: 0
        }
    );
    assert!(
        err.to_string()
            .starts_with("cannot get 1 free blocks from the pool")
    );
    assert_eq!(p.usage().as_f64(), 1.0);

    // After freeing all, reset succeeds.
    p.free_blocks(&[9, 8, 7, 6, 5, 4, 3, 2, 1]).unwrap();
    assert_eq!(p.free_count(), 9);
    assert!(p.reset_prefix_cache());
    assert_eq!(p.take_events().collect::<Vec<_>>(), [PoolEvent::AllCleared]);
}

#[test]
fn c13_one_block_pool_and_zero_blocks() {
    let p = pool(1);
    assert_eq!(p.free_count(), 0);
    assert_eq!(p.usage(), Usage { used: 0, total: 0 });
    assert_eq!(p.usage().as_f64(), 0.0);
    let mut p = p;
    assert_eq!(
        get(&mut p, 1),
        Err(GetBlocksError {
            requested: 1,
            free: 0
        })
    );
    assert_eq!(get(&mut p, 0), Ok(vec![]));
    assert!(p.reset_prefix_cache());
    assert_eq!(
        BlockPool::<BlockKey>::new(BlockPoolConfig::new(0, true)).unwrap_err(),
        NewPoolError::ZeroBlocks
    );
}

#[test]
fn null_block_is_never_handed_out_and_touch_free_skip_it() {
    let mut p = pool(4);
    assert_eq!(get(&mut p, 3), Ok(vec![1, 2, 3]));
    let before = snapshot(&p);
    p.touch(&[0, 0]).unwrap();
    p.free_blocks(&[0]).unwrap();
    p.evict_blocks(&[0]).unwrap();
    // Caching skips the null block and never hashes it.
    p.cache_full_blocks(&[0], &[A], 0, 1, 16, None).unwrap();
    assert_eq!(snapshot(&p), before);
    assert_eq!(p.ref_count(0), Some(0));
    assert_eq!(p.block_hash(0), None);
}

#[test]
fn free_blocks_orders_uncached_first_and_cached_last() {
    let mut p = pool(8);
    assert_eq!(get(&mut p, 7), Ok(vec![1, 2, 3, 4, 5, 6, 7]));
    // A request's blocks [1,2,3,4] with all four full and cached; 5,6 uncached.
    let keys: Vec<BlockKey> = (0..4).map(|i| BlockKey::new(100 + i, 0)).collect();
    p.cache_full_blocks(&[1, 2, 3, 4], &keys, 0, 4, 16, None)
        .unwrap();
    assert_eq!(
        p.block_hash(3),
        Some(BlockHash {
            key: keys[2],
            num_tokens: 48
        })
    );
    // Freed in reverse (tail first): cached appended in that order, uncached prepended in order.
    p.free_blocks(&[6, 4, 3, 5, 2, 1]).unwrap();
    assert_eq!(queue(&p), [6, 5, 4, 3, 2, 1]);
    p.free_blocks(&[7]).unwrap();
    assert_eq!(queue(&p), [7, 6, 5, 4, 3, 2, 1]);
    // Eviction order: the tail (4 tokens deep) goes before the head.
    assert_eq!(get(&mut p, 4), Ok(vec![7, 6, 5, 4]));
    assert_eq!(p.get_one_block(&keys[3]), None);
    assert_eq!(p.get_one_block(&keys[0]), Some(1));
}

#[test]
fn free_with_shared_refs_returns_only_at_zero() {
    let mut p = pool(4);
    get(&mut p, 2).unwrap();
    p.touch(&[1, 1]).unwrap();
    assert_eq!(p.ref_count(1), Some(3));
    p.free_blocks(&[1, 2]).unwrap();
    assert_eq!(queue(&p), [2, 3]);
    p.free_blocks(&[1, 1]).unwrap();
    assert_eq!(queue(&p), [1, 2, 3]);
}

#[test]
fn caching_disabled_prepends_everything_and_keeps_hashes_on_reuse() {
    let mut p = BlockPool::<BlockKey>::new(BlockPoolConfig::new(5, false)).unwrap();
    get(&mut p, 2).unwrap();
    hash_one(&mut p, 1, A);
    p.free_blocks(&[2, 1]).unwrap();
    assert_eq!(queue(&p), [2, 1, 3, 4]);
    // As in vLLM, handing a block out with caching off does not drop its hash.
    assert_eq!(get(&mut p, 2), Ok(vec![2, 1]));
    assert_eq!(p.get_one_block(&A), Some(1));
    // Events are off by default.
    assert_eq!(p.take_events().count(), 0);
}

#[test]
fn several_blocks_per_key_first_inserted_wins() {
    let mut p = pool(6);
    get(&mut p, 4).unwrap();
    hash_one(&mut p, 2, A);
    hash_one(&mut p, 1, A);
    hash_one(&mut p, 3, A);
    assert_eq!(p.cached_key_count(), 1);
    assert_eq!(p.get_one_block(&A), Some(2));
    p.evict_blocks(&[2]).unwrap();
    assert_eq!(p.get_one_block(&A), Some(1));
    hash_one(&mut p, 2, A);
    assert_eq!(p.get_one_block(&A), Some(1)); // 2 re-inserted after 3
    p.evict_blocks(&[1, 3]).unwrap();
    assert_eq!(p.get_one_block(&A), Some(2));
    p.evict_blocks(&[2]).unwrap();
    assert_eq!(p.get_one_block(&A), None);
    assert_eq!(p.cached_key_count(), 0);
}

#[test]
fn get_cached_block_needs_every_group() {
    let mut p = pool(6);
    get(&mut p, 3).unwrap();
    let (g0, g1) = (BlockKey::new(7, 0), BlockKey::new(7, 1));
    hash_one(&mut p, 3, g0);
    let mut out = Vec::new();
    assert!(!p.get_cached_block(&[g0, g1], |b| out.push(b)));
    assert!(out.is_empty());
    hash_one(&mut p, 1, g1);
    assert!(p.get_cached_block(&[g0, g1], |b| out.push(b)));
    assert_eq!(out, [3, 1]);
    out.clear();
    assert!(p.get_cached_block_for_groups(7, &[1, 0], |b| out.push(b)));
    assert_eq!(out, [1, 3]);
    assert!(!p.get_cached_block_for_groups(8, &[0], |_| {}));
}

#[test]
fn cache_full_blocks_tokens_mask_and_events() {
    let mut p = pool(10);
    get(&mut p, 5).unwrap();
    let keys: Vec<BlockKey> = (0..5).map(|i| BlockKey::new(i, 2)).collect();
    // Already cached 1 block; 4 full now; mask skips the second new one; block 0 (null) skipped.
    p.cache_full_blocks(
        &[1, 2, 3, 0, 5],
        &keys,
        1,
        5,
        32,
        Some(&[true, false, true, true]),
    )
    .unwrap();
    assert_eq!(
        p.block_hash(2),
        Some(BlockHash {
            key: keys[1],
            num_tokens: 64
        })
    );
    assert_eq!(p.block_hash(3), None);
    assert_eq!(p.block_hash(1), None); // below num_cached: untouched
    assert_eq!(
        p.block_hash(5),
        Some(BlockHash {
            key: keys[4],
            num_tokens: 160
        })
    );
    assert_eq!(
        p.take_events().collect::<Vec<_>>(),
        [
            PoolEvent::Stored {
                key: keys[1],
                block: 2,
                num_tokens: 64
            },
            PoolEvent::Stored {
                key: keys[4],
                block: 5,
                num_tokens: 160
            },
        ]
    );
    // num_cached >= num_full: nothing, even with bad arguments.
    p.cache_full_blocks(&[], &[], 3, 3, 0, None).unwrap();
    // A promotion: block 2 re-cached over more tokens replaces its hash (removed, then stored).
    p.cache_full_blocks(&[9, 9, 2], &[A, A, B], 2, 3, 32, None)
        .unwrap();
    assert_eq!(
        p.take_events().collect::<Vec<_>>(),
        [
            PoolEvent::Removed {
                key: keys[1],
                block: 2
            },
            PoolEvent::Stored {
                key: B,
                block: 2,
                num_tokens: 96
            },
        ]
    );
    assert_eq!(p.get_one_block(&keys[1]), None);
}

/// Arguments of `cache_full_blocks` and the error they must produce.
type CacheCase<'a> = (
    &'a [u32],
    &'a [BlockKey],
    u32,
    u32,
    u32,
    Option<&'a [bool]>,
    CacheError,
);

#[test]
fn cache_full_blocks_errors_change_nothing() {
    let mut p = pool(6);
    get(&mut p, 3).unwrap();
    hash_one(&mut p, 1, A); // 16 tokens
    let _ = p.take_events().count();
    let before = snapshot(&p);
    let k = [B, B, B];
    let cases: [CacheCase<'_>; 6] = [
        (&[2], &k, 0, 1, 0, None, CacheError::ZeroBlockSize),
        (
            &[2],
            &k,
            0,
            2,
            16,
            None,
            CacheError::BlocksTooShort {
                num_full_blocks: 2,
                len: 1,
            },
        ),
        (
            &[2, 3],
            &k[..1],
            0,
            2,
            16,
            None,
            CacheError::KeysTooShort {
                num_full_blocks: 2,
                len: 1,
            },
        ),
        (
            &[2, 3],
            &k,
            0,
            2,
            16,
            Some(&[true]),
            CacheError::MaskLength {
                expected: 2,
                len: 1,
            },
        ),
        (
            &[2, 6],
            &k,
            0,
            2,
            16,
            None,
            CacheError::OutOfRange(OutOfRange {
                block: 6,
                num_blocks: 6,
            }),
        ),
        // Block 1 already covers 16 tokens; caching it at index 2 with block size 4 (12 tokens)
        // is refused.
        (
            &[2, 3, 1],
            &k,
            2,
            3,
            4,
            None,
            CacheError::AlreadyHashed {
                block: 1,
                num_tokens: 16,
                new_num_tokens: 12,
            },
        ),
    ];
    for (blocks, keys, c, f, bs, mask, want) in cases {
        assert_eq!(p.cache_full_blocks(blocks, keys, c, f, bs, mask), Err(want));
        assert_eq!(snapshot(&p), before);
    }
    assert_eq!(p.take_events().count(), 0);
    assert_eq!(
        CacheError::AlreadyHashed {
            block: 1,
            num_tokens: 16,
            new_num_tokens: 12
        }
        .to_string(),
        "block 1 already has a hash over 16 tokens; a new hash over 12 tokens cannot replace it"
    );
}

#[test]
fn touch_free_evict_errors_change_nothing() {
    let mut p = pool(5);
    get(&mut p, 2).unwrap();
    let before = snapshot(&p);
    let oor = OutOfRange {
        block: 5,
        num_blocks: 5,
    };
    assert_eq!(p.touch(&[1, 5]), Err(TouchError::OutOfRange(oor)));
    assert_eq!(p.free_blocks(&[1, 5]), Err(FreeError::OutOfRange(oor)));
    assert_eq!(p.evict_blocks(&[5]), Err(oor));
    // Freeing a free block, or a held block more often than it is referenced.
    assert_eq!(
        p.free_blocks(&[1, 3]),
        Err(FreeError::NotInUse { block: 3 })
    );
    assert_eq!(
        p.free_blocks(&[2, 1, 2]),
        Err(FreeError::NotInUse { block: 2 })
    );
    assert_eq!(snapshot(&p), before);
    assert_eq!(
        FreeError::NotInUse { block: 3 }.to_string(),
        "cannot free block 3: it is not in use (reference count 0)"
    );
    assert_eq!(
        oor.to_string(),
        "block id 5 is out of range for a pool of 5 blocks"
    );
}

#[test]
fn event_queue_is_bounded_and_counts_drops() {
    let mut c = BlockPoolConfig::new(6, true);
    c.enable_events = true;
    c.event_capacity = 2;
    let mut p = BlockPool::<BlockKey>::new(c).unwrap();
    get(&mut p, 5).unwrap();
    let keys: Vec<BlockKey> = (0..5).map(|i| BlockKey::new(i, 0)).collect();
    p.cache_full_blocks(&[1, 2, 3, 4, 5], &keys, 0, 5, 16, None)
        .unwrap();
    assert_eq!(p.dropped_events(), 3);
    let got: Vec<_> = p.take_events().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0],
        PoolEvent::Stored {
            key: keys[0],
            block: 1,
            num_tokens: 16
        }
    );
    p.evict_blocks(&[5, 4]).unwrap();
    assert_eq!(
        p.take_events().collect::<Vec<_>>(),
        [
            PoolEvent::Removed {
                key: keys[4],
                block: 5
            },
            PoolEvent::Removed {
                key: keys[3],
                block: 4
            },
        ]
    );
    assert_eq!(p.dropped_events(), 3);
}

#[test]
fn reset_clears_every_hash_only_when_idle() {
    let mut p = pool(4);
    get(&mut p, 2).unwrap();
    hash_one(&mut p, 1, A);
    hash_one(&mut p, 2, B);
    p.free_blocks(&[1]).unwrap();
    assert!(!p.reset_prefix_cache());
    assert_eq!(p.get_one_block(&B), Some(2));
    p.free_blocks(&[2]).unwrap();
    let _ = p.take_events().count();
    assert!(p.reset_prefix_cache());
    assert_eq!((p.get_one_block(&A), p.get_one_block(&B)), (None, None));
    assert_eq!(p.cached_key_count(), 0);
    assert_eq!(p.block_hash(1), None);
    // The queue order is untouched by reset.
    assert_eq!(queue(&p), [3, 1, 2]);
    assert_eq!(p.take_events().collect::<Vec<_>>(), [PoolEvent::AllCleared]);
}

// ---------------------------------------------------------------------------------------------
// Model-based proptest.

const MAX_BLOCKS: u32 = 10;

fn ids(n: u32) -> impl Strategy<Value = Vec<u32>> {
    // Mostly valid ids, sometimes one past the end.
    prop::collection::vec(0..=n, 0..5)
}

fn key() -> impl Strategy<Value = BlockKey> {
    (0u64..4, 0u32..2).prop_map(|(h, g)| BlockKey::new(h, g))
}

/// A `cache_full_blocks` call that passes validation most of the time: keys as long as the
/// blocks, `num_cached < num_full <= len`, and a mask (when any) of the right length.
fn valid_cache(n: u32) -> impl Strategy<Value = PoolOp> {
    (
        prop::collection::vec((1..n.max(2), key()), 1..6),
        any::<bool>(),
    )
        .prop_flat_map(|(pairs, masked)| {
            let len = u32::try_from(pairs.len()).unwrap_or(1);
            (Just(pairs), Just(masked), 1..=len).prop_flat_map(|(pairs, masked, full)| {
                (Just(pairs), Just(masked), Just(full), 0..full)
            })
        })
        .prop_flat_map(|(pairs, masked, full, cached)| {
            let mask_len = (full - cached) as usize;
            let mask = if masked {
                prop::collection::vec(any::<bool>(), mask_len)
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            (Just(pairs), Just(full), Just(cached), mask, 1u32..4)
        })
        .prop_map(
            |(pairs, full, cached, mask, block_size)| PoolOp::CacheFull {
                blocks: pairs.iter().map(|p| p.0).collect(),
                keys: pairs.iter().map(|p| p.1).collect(),
                num_cached: cached,
                num_full: full,
                block_size,
                mask,
            },
        )
}

fn op(n: u32) -> impl Strategy<Value = PoolOp> {
    let cache = (
        prop::collection::vec(0..=n, 0..6),
        prop::collection::vec(key(), 0..6),
        0u32..4,
        0u32..7,
        prop_oneof![Just(0u32), 1u32..4, Just(16u32)],
        prop::option::weighted(0.3, prop::collection::vec(any::<bool>(), 0..6)),
    )
        .prop_map(
            |(blocks, keys, num_cached, num_full, block_size, mask)| PoolOp::CacheFull {
                blocks,
                keys,
                num_cached,
                num_full,
                block_size,
                mask,
            },
        );
    prop_oneof![
        4 => (0..=n).prop_map(PoolOp::GetNew),
        3 => ids(n).prop_map(PoolOp::Touch),
        4 => ids(n).prop_map(PoolOp::Free),
        2 => cache,
        4 => valid_cache(n),
        1 => ids(n).prop_map(PoolOp::Evict),
        1 => Just(PoolOp::Reset),
        1 => Just(PoolOp::TakeEvents),
    ]
}

fn scenario() -> impl Strategy<Value = (u32, bool, u32, Vec<PoolOp>)> {
    (1..=MAX_BLOCKS, prop::bool::weighted(0.8), 0u32..6).prop_flat_map(|(n, caching, cap)| {
        (
            Just(n),
            Just(caching),
            Just(cap),
            prop::collection::vec(op(n), 1..60),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Dense key-index churn: every block held, then blocks re-keyed and evicted one by one
    /// over a tiny key space, so keys share long chains and (in small pools) buckets.
    #[test]
    fn key_index_matches_model(
        (n, ops) in (2u32..40).prop_flat_map(|n| {
            let rekey = (1..n, 0u64..5).prop_map(|(b, h)| (b, Some(h)));
            let evict = (1..n).prop_map(|b| (b, None));
            (Just(n), prop::collection::vec(prop_oneof![3 => rekey, 1 => evict], 1..120))
        })
    ) {
        let mut config = BlockPoolConfig::new(n, true);
        config.enable_events = true;
        config.event_capacity = 8;
        let mut pool = BlockPool::<BlockKey>::new(config).unwrap();
        let mut model = PoolModel::new(n, true, true, 8);
        let all = PoolOp::GetNew(n - 1);
        prop_assert_eq!(apply_pool(&mut pool, &all), model.apply(&all));
        for &(b, h) in &ops {
            let mut steps = vec![PoolOp::Evict(vec![b])];
            if let Some(h) = h {
                steps.push(PoolOp::CacheFull {
                    blocks: vec![b],
                    keys: vec![BlockKey::new(h, 0)],
                    num_cached: 0,
                    num_full: 1,
                    block_size: 16,
                    mask: None,
                });
            }
            steps.push(PoolOp::TakeEvents);
            for op in &steps {
                prop_assert_eq!(apply_pool(&mut pool, op), model.apply(op), "op {:?}", op);
            }
            prop_assert_eq!(snapshot(&pool), model.snapshot());
            for k in 0..5 {
                let key = BlockKey::new(k, 0);
                prop_assert_eq!(pool.get_one_block(&key), model.get_one_block(&key), "key {}", k);
            }
        }
    }

    #[test]
    fn block_pool_matches_model((n, caching, cap, ops) in scenario()) {
        let mut config = BlockPoolConfig::new(n, caching);
        config.enable_events = true;
        config.event_capacity = cap;
        let mut pool = BlockPool::<BlockKey>::new(config).unwrap();
        let mut model = PoolModel::new(n, caching, true, cap as usize);
        let bytes = pool.heap_bytes();
        for op in &ops {
            let before = snapshot(&pool);
            let got = apply_pool(&mut pool, op);
            let want = model.apply(op);
            prop_assert_eq!(&got, &want, "op {:?}", op);
            let now = snapshot(&pool);
            prop_assert_eq!(&now, &model.snapshot(), "after {:?}", op);
            if got.is_err() {
                prop_assert_eq!(&now, &before, "an error changed the pool: {:?}", op);
            }
            // Global invariants, independent of the model.
            if let Ok(PoolOutput::Blocks(b)) = &got {
                prop_assert!(!b.contains(&0), "null block handed out");
            }
            let u = pool.usage().as_f64();
            prop_assert!((0.0..=1.0).contains(&u));
            prop_assert_eq!(pool.heap_bytes(), bytes, "a table grew");
            prop_assert_eq!(pool.ref_count(0), Some(0));
            prop_assert!(!pool.free_queue().contains(0));
            for b in 1..n {
                // Free queue holds exactly the unreferenced blocks.
                prop_assert_eq!(pool.free_queue().contains(b), pool.ref_count(b) == Some(0));
                // Every key resolves to a block that holds it.
                if let Some(h) = pool.block_hash(b) {
                    let first = pool.get_one_block(&h.key);
                    prop_assert!(first.is_some());
                    let holder = first.and_then(|f| pool.block_hash(f)).map(|x| x.key);
                    prop_assert_eq!(holder, Some(h.key));
                    prop_assert_eq!(first, model.get_one_block(&h.key));
                }
            }
        }
    }
}
