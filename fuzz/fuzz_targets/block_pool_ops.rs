//! `block_pool_ops`: arbitrary operation sequences (the shared
//! `kvtier_tests::block_pool_model::PoolOp`) on vLLM's GPU-style `BlockPool`, each step compared
//! with the reference model. After every step: the same outcome and state as the model; an
//! error left the pool unchanged; the null block is never handed out, never queued, never
//! referenced; usage within [0, 1]; the free queue holds exactly the unreferenced blocks; the
//! hash map points only at blocks that hold that hash, and every hashed block is reachable
//! through its key; no table grew.
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::BlockKey;
use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
use kvtier_tests::block_pool_model::{PoolModel, PoolOp, PoolOutput, apply_pool, snapshot};
use libfuzzer_sys::fuzz_target;

/// Largest pool fuzzed (the null block included).
const MAX_BLOCKS: u32 = 24;

#[derive(Arbitrary, Debug)]
struct Input {
    num_blocks: u8,
    caching: bool,
    events: bool,
    event_capacity: u8,
    ops: Vec<PoolOp>,
}

/// Every key the hand-written `Arbitrary` for `PoolOp` can produce.
fn universe() -> impl Iterator<Item = BlockKey> {
    (0..4u64).flat_map(|h| (0..2u32).map(move |g| BlockKey::new(h, g)))
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.num_blocks) % MAX_BLOCKS + 1;
    let cap = u32::from(input.event_capacity % 8);
    let mut config = BlockPoolConfig::new(n, input.caching);
    config.enable_events = input.events;
    config.event_capacity = cap;
    let Ok(mut pool) = BlockPool::<BlockKey>::new(config) else {
        return;
    };
    let mut model = PoolModel::new(n, input.caching, input.events, cap as usize);
    let bytes = pool.heap_bytes();
    for (step, op) in input.ops.iter().enumerate() {
        let before = snapshot(&pool);
        let got = apply_pool(&mut pool, op);
        let want = model.apply(op);
        assert_eq!(got, want, "step {step}: {op:?}");
        let now = snapshot(&pool);
        assert_eq!(now, model.snapshot(), "step {step}: {op:?}");
        if got.is_err() {
            assert_eq!(
                now, before,
                "step {step}: {op:?} failed but changed the pool"
            );
        }
        if let Ok(PoolOutput::Blocks(b)) = &got {
            assert!(!b.contains(&0), "null block handed out");
        }
        let u = pool.usage();
        assert!(u.used <= u.total, "usage {}/{} above 1", u.used, u.total);
        assert!((0.0..=1.0).contains(&u.as_f64()));
        assert_eq!(pool.heap_bytes(), bytes, "a table grew");
        assert_eq!(pool.ref_count(0), Some(0), "the null block was referenced");
        assert!(!pool.free_queue().contains(0), "the null block is queued");
        for b in 1..n {
            assert_eq!(
                pool.free_queue().contains(b),
                pool.ref_count(b) == Some(0),
                "block {b}: queued iff unreferenced"
            );
            if let Some(h) = pool.block_hash(b) {
                assert!(
                    pool.get_one_block(&h.key).is_some(),
                    "block {b}'s key is unreachable"
                );
            }
        }
        for key in universe() {
            let first = pool.get_one_block(&key);
            assert_eq!(first, model.get_one_block(&key), "key {key:?}");
            if let Some(f) = first {
                assert_ne!(f, 0, "a key maps to the null block");
                assert_eq!(
                    pool.block_hash(f).map(|h| h.key),
                    Some(key),
                    "the map points at block {f}, which does not hold {key:?}"
                );
            }
        }
    }
});
