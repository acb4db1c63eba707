//! Where vLLM asserts, kvtier returns a typed error and changes nothing.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::BlockKey;
use kvtier_core::manager::StoreOutcome;
use kvtier_core::manager::{
    ChunkState, CompleteLoadError, ConfigError, LoadError, ManagerConfig, OffloadManager,
    PolicyKind, PositionError, RequestError, RequestId, StoreError,
};
use kvtier_tests::store::{store, store_or_no_room};

fn k(i: u64) -> BlockKey {
    BlockKey::new(i, 0)
}

/// Everything observable about keys 0..16 and the counters.
fn snapshot(m: &OffloadManager) -> Vec<String> {
    let mut v: Vec<String> = (0..16)
        .map(|i| format!("{:?}", m.inspect().chunk(&k(i))))
        .collect();
    v.push(format!(
        "{} {} {} {} {:?}",
        m.inspect().allocated(),
        m.inspect().free_chunks(),
        m.inspect().evictable(),
        m.inspect().write_pending(),
        m.inspect().eviction_order()
    ));
    v
}

fn setup(policy: PolicyKind) -> (OffloadManager, RequestId) {
    let mut cfg = ManagerConfig::new(4);
    cfg.policy = policy;
    cfg.max_requests = 2;
    let mut m = OffloadManager::new(cfg).unwrap();
    let r = m.on_new_request().unwrap();
    // 1, 2 readable; 3 pending.
    store(&mut m, r, &[k(1), k(2)], None).unwrap();
    m.complete_store(&[k(1), k(2)], StoreOutcome::Stored);
    store(&mut m, r, &[k(3)], None).unwrap();
    (m, r)
}

#[test]
fn load_errors_change_nothing() {
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        let (mut m, r) = setup(policy);
        let before = snapshot(&m);
        assert_eq!(
            m.prepare_load(r, &[k(1), k(9)], None).unwrap_err(),
            LoadError::NotPresent { index: 1 }
        );
        assert_eq!(
            m.prepare_load(r, &[k(2), k(3)], None).unwrap_err(),
            LoadError::NotReady { index: 1 }
        );
        assert_eq!(
            m.prepare_load(r, &[k(1)], Some(&[16, 32])).unwrap_err(),
            LoadError::Positions(PositionError::LengthMismatch {
                keys: 1,
                positions: 2
            })
        );
        assert_eq!(
            m.prepare_load(r, &[k(1)], Some(&[u64::MAX])).unwrap_err(),
            LoadError::Positions(PositionError::TooLarge { index: 0 })
        );
        assert_eq!(snapshot(&m), before, "{policy}");
        m.inspect().check_invariants().unwrap();
    }
}

#[test]
fn complete_load_counts_repeats_and_changes_nothing_on_error() {
    let (mut m, r) = setup(PolicyKind::Lru);
    m.prepare_load(r, &[k(1)], None).unwrap();
    let before = snapshot(&m);
    // One pin on 1, but the call names it twice.
    assert_eq!(
        m.complete_load(&[k(1), k(1)]).unwrap_err(),
        CompleteLoadError::NotPinned { index: 1 }
    );
    assert_eq!(
        m.complete_load(&[k(2)]).unwrap_err(),
        CompleteLoadError::NotPinned { index: 0 }
    );
    assert_eq!(
        m.complete_load(&[k(1), k(7)]).unwrap_err(),
        CompleteLoadError::NotPresent { index: 1 }
    );
    assert_eq!(snapshot(&m), before);
    // Two pins, released in one call: evictable counts the chunk once.
    m.prepare_load(r, &[k(1)], None).unwrap();
    assert_eq!(m.inspect().chunk(&k(1)).unwrap().1, ChunkState::Pinned(2));
    let ev = m.inspect().evictable();
    m.complete_load(&[k(1), k(1)]).unwrap();
    assert_eq!(
        (m.inspect().chunk(&k(1)).unwrap().1, m.inspect().evictable()),
        (ChunkState::Idle, ev + 1)
    );
    m.inspect().check_invariants().unwrap();
}

#[test]
fn store_errors_change_nothing() {
    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    let mut m: OffloadManager = OffloadManager::new(cfg).unwrap();
    let r = m.on_new_request().unwrap();
    let before = snapshot(&m);
    assert_eq!(
        store(&mut m, r, &[k(1), k(2), k(1)], None).unwrap_err(),
        StoreError::DuplicateKey { index: 2 }
    );
    assert_eq!(
        m.inspect().tracker_count(&k(1)),
        0,
        "a rejected offer is not counted"
    );
    assert_eq!(m.inspect().stores_skipped_undrained(), 0);
    assert_eq!(snapshot(&m), before);
}

#[test]
fn stale_and_exhausted_requests() {
    let (mut m, r) = setup(PolicyKind::Lru);
    let r2 = m.on_new_request().unwrap();
    assert_eq!(
        m.on_new_request().unwrap_err(),
        RequestError::TooManyRequests { max_requests: 2 }
    );
    m.on_request_finished(r2).unwrap();
    let before = snapshot(&m);
    assert_eq!(
        m.on_request_finished(r2).unwrap_err(),
        RequestError::Unknown(r2)
    );
    assert_eq!(m.drop_request(r2).unwrap_err(), RequestError::Unknown(r2));
    assert_eq!(
        m.prepare_load(r2, &[k(1)], None).unwrap_err(),
        LoadError::Request(RequestError::Unknown(r2))
    );
    assert_eq!(
        store(&mut m, r2, &[k(5)], None).unwrap_err(),
        StoreError::Request(RequestError::Unknown(r2))
    );
    // A forged handle from raw bits is just unknown.
    let forged = RequestId::from_u64(0xdead_beef_0000_0007);
    assert!(matches!(
        m.prepare_load(forged, &[k(1)], None),
        Err(LoadError::Request(_))
    ));
    assert_eq!(snapshot(&m), before);
    // The slot is reused with a new generation; the old handle stays stale.
    let r3 = m.on_new_request().unwrap();
    assert_ne!(r3, r2);
    assert_eq!(RequestId::from_u64(r3.to_u64()), r3);
    m.on_request_finished(r).unwrap();
}

#[test]
fn config_errors() {
    let mut cfg = ManagerConfig::new(8);
    cfg.max_requests = 0;
    assert_eq!(
        OffloadManager::<BlockKey>::new(cfg).unwrap_err(),
        ConfigError::ZeroMaxRequests
    );
    let mut cfg = ManagerConfig::new(u32::MAX - 10);
    cfg.max_requests = 100;
    assert!(matches!(
        OffloadManager::<BlockKey>::new(cfg),
        Err(ConfigError::TooLarge { .. })
    ));
    assert_eq!(
        PolicyKind::from_name("lfu").unwrap_err().to_string(),
        "unknown cache policy: expected \"lru\" or \"arc\""
    );
    assert_eq!(
        StoreError::DuplicateKey { index: 2 }.to_string(),
        "prepare_store: key at index 2 repeats an earlier key of the same offer"
    );
}

#[test]
fn events_overflow_is_counted_not_half_applied() {
    let mut cfg = ManagerConfig::new(8);
    cfg.enable_events = true;
    cfg.max_event_keys = 3;
    let mut m: OffloadManager = OffloadManager::new(cfg).unwrap();
    let r = m.on_new_request().unwrap();
    store_or_no_room(&mut m, r, &[k(1), k(2)], None).unwrap();
    m.complete_store(&[k(1), k(2)], StoreOutcome::Stored); // 2 keys queued
    store_or_no_room(&mut m, r, &[k(3), k(4)], None).unwrap();
    m.complete_store(&[k(3), k(4)], StoreOutcome::Stored); // would make 4: dropped whole
    assert_eq!(m.events_dropped(), (1, 2));
    let ev = m.take_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].1, vec![k(1), k(2)]);
}

#[test]
fn no_room_is_an_error_that_changes_no_chunk_and_counts_a_failure() {
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        // 4 slots: 1, 2 readable, 3 pending; pin 1 and 2 so nothing is evictable.
        let (mut m, r) = setup(policy);
        m.prepare_load(r, &[k(1), k(2)], None).unwrap();
        let first = m.take_stats();
        assert_eq!(first.allocation_failures, 0);
        assert_eq!(first.config_info, Some(m.config_info()));
        let before = snapshot(&m);
        let mut plan = kvtier_core::manager::StorePlan::new();
        m.prepare_store(r, &[k(3), k(10)], None, &mut plan).unwrap();
        assert_eq!(plan.keys(), &[k(10)], "{policy:?}: one free slot left");
        m.complete_store(plan.keys(), StoreOutcome::Failed);
        let err = m
            .prepare_store(r, &[k(11), k(12)], None, &mut plan)
            .unwrap_err();
        assert_eq!(
            err,
            StoreError::NoRoom {
                need: 1,
                evictable: 0
            }
        );
        assert_eq!(
            err.to_string(),
            "prepare_store: no room: 1 chunks must be evicted and 0 are idle (idle chunks \
             offered by this call cannot be evicted)"
        );
        assert!(plan.keys().is_empty() && plan.slots().is_empty() && plan.evicted().is_empty());
        assert_eq!(snapshot(&m), before, "{policy:?}: no chunk changed");
        let s = m.take_stats();
        assert_eq!((s.allocation_failures, s.config_info.is_none()), (1, true));
        let step = s.to_step_payload();
        assert_eq!(
            step.counter(kvtier_core::stats::catalogue::ALLOCATION_FAILURE, &[]),
            Some(1)
        );
        assert_eq!(
            step.info(),
            None,
            "config_info is reported on the first drain only"
        );
        assert_eq!(m.take_stats().allocation_failures, 0, "drained");
    }
}

#[test]
fn complete_store_counts_what_it_completed_and_skips_the_rest() {
    let (mut m, _) = setup(PolicyKind::Lru);
    // 1 is readable, 3 pending, 9 absent: only 3 completes.
    assert_eq!(
        m.complete_store(&[k(1), k(3), k(9)], StoreOutcome::Stored),
        1
    );
    assert_eq!(m.complete_store(&[k(3)], StoreOutcome::Stored), 0);
    assert_eq!(m.inspect().chunk(&k(3)), Some((2, ChunkState::Idle)));
}

#[test]
fn pin_hit_prefix_pins_the_readable_prefix_and_stops_at_pending() {
    let (mut m, r) = setup(PolicyKind::Lru);
    let p = m
        .pin_hit_prefix(r, &[k(1), k(2), k(3), k(1)], Some(&[16, 32, 48, 64]))
        .unwrap();
    assert_eq!(
        (p.hits, p.stopped_at_pending, p.slots),
        (2, true, &[0, 1][..])
    );
    assert_eq!(m.inspect().chunk(&k(2)), Some((1, ChunkState::Pinned(1))));
    let p = m.pin_hit_prefix(r, &[k(9), k(1)], None).unwrap();
    assert_eq!((p.hits, p.stopped_at_pending), (0, false));
    let before = snapshot(&m);
    assert_eq!(
        m.pin_hit_prefix(r, &[k(1)], Some(&[16, 32])).unwrap_err(),
        LoadError::Positions(PositionError::LengthMismatch {
            keys: 1,
            positions: 2
        })
    );
    assert_eq!(snapshot(&m), before);
    m.on_request_finished(r).unwrap();
    let after_finish = snapshot(&m);
    assert_eq!(
        m.pin_hit_prefix(r, &[k(1)], None).unwrap_err(),
        LoadError::Request(RequestError::Unknown(r))
    );
    assert_eq!(snapshot(&m), after_finish, "a refused pin changes nothing");
}
