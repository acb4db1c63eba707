//! Model-based proptests of the `OffloadManager`: random operation sequences run on
//! the real manager and on the reference model of `kvtier_tests::manager_model`, checking after
//! every step that
//! * both return the same outcome (slots, victims, events, stats, typed errors),
//! * `check_invariants()` holds and `allocated − free` bookkeeping adds up
//!   (`allocated = write_pending + pinned + evictable`, `allocated + free = capacity`),
//! * no slot is held by two keys,
//! * every key's slot and state, the tracker, the counters and `eviction_order()` (LRU: rank
//!   order; ARC: T1 then T2, plus ARC's target and ghost-list lengths) equal the model's,
//! * an op that returned a typed error changed nothing,
//! * under ARC, each `prepare_store` is also legal on its own (stored keys = absent admitted
//!   offered keys in order; exactly `need` victims, each idle and not offered; `None` only when
//!   fewer than `need` were eligible).
//!
//! The per-step driver and checks are `kvtier_tests::manager_checks::run_ops`, shared with the
//! `manager_ops` fuzz target.
//!
//! 256 cases per test by default (at least 1,024 for the scheduler-like one); run more with
//! `PROPTEST_CASES=10000 cargo test -p kvtier-tests --release --test manager -- manager_model::`.

use kvtier_core::manager::PolicyKind;
use kvtier_core::manager::StoreOutcome;
use kvtier_tests::manager_checks::run_ops;
use kvtier_tests::manager_model::{Config, KEYS, Op, SLOTS};
use kvtier_tests::store::store;
use proptest::prelude::*;

fn config(policy: PolicyKind) -> impl Strategy<Value = Config> {
    (
        0u32..6,
        prop_oneof![Just(0u32), Just(1), Just(2), Just(3)],
        0u32..6,
        prop_oneof![Just(3u32), Just(64)],
        1u32..=4,
    )
        .prop_map(
            move |(capacity, store_threshold, max_tracker_size, max_event_keys, max_requests)| {
                Config {
                    capacity,
                    policy,
                    store_threshold,
                    max_tracker_size,
                    max_event_keys,
                    max_requests,
                }
            },
        )
}

/// A key id, biased towards a hot half of the universe so offers overlap resident keys.
fn key_id() -> impl Strategy<Value = u8> {
    prop_oneof![3 => 0u8..KEYS / 2, 1 => 0u8..KEYS]
}

/// Mostly distinct keys (an offer that repeats a key is an error), sometimes with repeats.
fn keys() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::btree_set(key_id(), 0..5)
            .prop_map(|s| s.into_iter().collect::<Vec<_>>())
            .prop_shuffle(),
        1 => prop::collection::vec(key_id(), 0..5),
    ]
}

/// Positions for `n` keys: none, the right length (ties allowed), or a wrong length / a value
/// above `i64::MAX` now and then.
fn positions(n: usize) -> impl Strategy<Value = Option<Vec<u64>>> {
    prop_oneof![
        3 => Just(None),
        10 => prop::collection::vec(0u64..8, n).prop_map(Some),
        1 => prop::collection::vec(0u64..8, 0..4).prop_map(Some),
        1 => Just(Some(vec![u64::MAX; n])),
    ]
}

fn keys_and_positions() -> impl Strategy<Value = (Vec<u8>, Option<Vec<u64>>)> {
    keys().prop_flat_map(|k| {
        let n = k.len();
        (Just(k), positions(n))
    })
}

fn slot() -> impl Strategy<Value = u8> {
    0u8..u8::try_from(SLOTS).expect("few slots")
}

/// Relative weights of the ops in [`op_mix`], in the order of its arms.
type Weights = [u32; 13];

/// Every op, a general mix.
const GENERAL: Weights = [3, 1, 1, 1, 6, 4, 3, 3, 2, 1, 1, 2, 80];

fn op() -> impl Strategy<Value = Op> {
    op_mix(GENERAL)
}

/// Every op with the weights `w`; `w[12]` is the percentage of store completions that succeed.
fn op_mix(w: Weights) -> impl Strategy<Value = Op> {
    let success = f64::from(w[12]) / 100.0;
    prop_oneof![
        w[0] => slot().prop_map(|slot| Op::NewRequest { slot }),
        w[1] => slot().prop_map(|slot| Op::Finish { slot }),
        w[2] => slot().prop_map(|slot| Op::Drop { slot }),
        w[3] => key_id().prop_map(|key| Op::Lookup { key }),
        w[4] => (slot(), keys_and_positions())
            .prop_map(|(slot, (keys, positions))| Op::PrepareStore { slot, keys, positions }),
        w[5] => (keys(), prop::bool::weighted(success))
            .prop_map(|(keys, success)| Op::CompleteStore { keys, success }),
        w[6] => (slot(), keys_and_positions())
            .prop_map(|(slot, (keys, positions))| Op::PrepareLoad { slot, keys, positions }),
        w[7] => keys().prop_map(|keys| Op::CompleteLoad { keys }),
        w[8] => keys().prop_map(|keys| Op::Touch { keys }),
        w[9] => Just(Op::ResetCache),
        w[10] => Just(Op::GetStats),
        w[11] => Just(Op::TakeEvents),
    ]
}

/// Ops, each with a flag: steer its keys towards keys in a useful state (see [`steer`]).
fn ops() -> impl Strategy<Value = Vec<(Op, bool)>> {
    prop::collection::vec((op(), prop::bool::weighted(0.7)), 0..60)
}

/// A roomier LRU manager (most of the key universe fits) and a call mix close to a
/// scheduler's: requests that load hits, complete the loads, store and finish while others
/// are in flight. Here a request's loads mostly leave chunks displaced (`Lru::on_access`), and
/// eviction scans meet request anchors, which must place them.
fn roomy_lru() -> impl Strategy<Value = Config> {
    (6u32..=11, 2u32..=4).prop_map(|(capacity, max_requests)| Config {
        capacity,
        policy: PolicyKind::Lru,
        store_threshold: 0,
        max_tracker_size: 0,
        max_event_keys: 64,
        max_requests,
    })
}

/// Mostly loads, their completions, stores and finishes; few resets.
const SCHEDULER_LIKE: Weights = [6, 4, 2, 1, 12, 10, 12, 10, 1, 1, 1, 1, 95];

proptest! {
    // More cases than the others: 1,024 of them left a chunk displaced 254 times and placed
    // one at an anchor 44 times (counted once by hand).
    #![proptest_config({
        let default = ProptestConfig::default();
        ProptestConfig { cases: default.cases.max(1024), ..default }
    })]

    #[test]
    fn lru_manager_matches_the_model_on_scheduler_like_calls(
        cfg in roomy_lru(),
        ops in prop::collection::vec((op_mix(SCHEDULER_LIKE), prop::bool::weighted(0.9)), 0..120),
    ) {
        run_ops(cfg, ops).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #[test]
    fn lru_manager_matches_the_model(cfg in config(PolicyKind::Lru), ops in ops()) {
        run_ops(cfg, ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arc_manager_matches_the_model(
        cfg in config(PolicyKind::Arc),
        ops in ops(),
    ) {
        run_ops(cfg, ops).map_err(TestCaseError::fail)?;
    }
}

/// A divergence the model found (fixed in the core): a request that lives across `reset_cache`
/// keeps its end-token positions in vLLM (they sit in the request context, set once per key by
/// the connector), so a key offered after the reset without positions still ranks
/// `(request_rank, −position)` rather than a fresh rank.
#[test]
fn positions_given_before_a_reset_still_rank_the_request() {
    use kvtier_core::BlockKey;
    use kvtier_core::manager::{ManagerConfig, OffloadManager};
    let k = |i: u64| BlockKey::new(i, 0);
    let mut m = OffloadManager::new(ManagerConfig::new(3)).unwrap();
    let r = m.on_new_request().unwrap();
    store(&mut m, r, &[k(1)], Some(&[16])).unwrap();
    m.reset_cache();
    // vLLM: request rank 1 is allocated by this access; k(2) has no position: fresh (2, 0).
    store(&mut m, r, &[k(2)], None).unwrap();
    // vLLM: k(1) still has position 16: rank (1, −16), below k(2).
    store(&mut m, r, &[k(1)], None).unwrap();
    m.complete_store(&[k(1), k(2)], StoreOutcome::Stored);
    assert_eq!(m.inspect().eviction_order(), [k(1), k(2)]);
    let r2 = m.on_new_request().unwrap();
    let out = store(&mut m, r2, &[k(3), k(4)], None).unwrap();
    assert_eq!(out.evicted(), &[k(1)]);
}

/// A key a `prepare_load` names twice with two positions ranks by the last one, as in vLLM,
/// whose request context holds one position per key (the model found a build that ranked it
/// by the first).
#[test]
fn a_key_loaded_twice_in_one_call_ranks_by_its_last_position() {
    use kvtier_core::BlockKey;
    use kvtier_core::manager::{ManagerConfig, OffloadManager};
    let k = |i: u64| BlockKey::new(i, 0);
    let mut m = OffloadManager::new(ManagerConfig::new(3)).unwrap();
    let w = m.on_new_request().unwrap();
    store(&mut m, w, &[k(2), k(9)], None).unwrap();
    m.complete_store(&[k(2), k(9)], StoreOutcome::Stored);
    m.on_request_finished(w).unwrap();
    let r = m.on_new_request().unwrap();
    m.prepare_load(r, &[k(2), k(9), k(9)], Some(&[32, 48, 16]))
        .unwrap();
    // Ranks (r, −32) for k(2) and (r, −16) for k(9): k(2) is older.
    m.complete_load(&[k(2), k(9), k(9)]).unwrap();
    assert_eq!(m.inspect().eviction_order(), [k(2), k(9)]);
}
