//! `OffloadManager::for_each_held_key` passes exactly the keys the manager can still find:
//! resident, ARC ghosts, the reuse tracker, live requests and undrained events.

use std::collections::BTreeSet;

use kvtier_core::manager::{
    ManagerConfig, OffloadManager, PolicyKind, StoreError, StoreOutcome, StorePlan,
};

fn held(m: &OffloadManager<u64>) -> BTreeSet<u64> {
    let mut s = BTreeSet::new();
    m.for_each_held_key(|k| {
        s.insert(*k);
    });
    s
}

fn set(keys: &[u64]) -> BTreeSet<u64> {
    keys.iter().copied().collect()
}

#[test]
fn lru_holds_resident_request_and_event_keys_until_released() {
    let mut cfg = ManagerConfig::new(2);
    cfg.enable_events = true;
    let mut m: OffloadManager<u64> = OffloadManager::new(cfg).unwrap();
    let mut plan = StorePlan::new();
    let a = m.on_new_request().unwrap();
    m.prepare_store(a, &[1, 2], None, &mut plan).unwrap();
    m.complete_store(&[1, 2], StoreOutcome::Stored);
    m.on_request_finished(a).unwrap();
    // Resident 1 and 2; the Stored event names them too.
    assert_eq!(held(&m), set(&[1, 2]));

    let b = m.on_new_request().unwrap();
    m.prepare_store(b, &[3], None, &mut plan).unwrap();
    // a's end refreshed 2 then 1 (tail to head), so 2 is the least recent.
    assert_eq!(plan.evicted(), &[2]);
    // 2 is evicted but still named by the undrained events; 3 is resident and in b.
    assert_eq!(held(&m), set(&[1, 2, 3]));
    let _ = m.take_events();
    assert_eq!(held(&m), set(&[1, 3]));

    let c = m.on_new_request().unwrap();
    assert!(m.prepare_load(c, &[9], None).is_err());
    m.prepare_store(c, &[1], None, &mut plan).unwrap();
    m.touch(&[7]);
    assert_eq!(held(&m), set(&[1, 3]));
    // A failed store removes 3; its metadata-only event still names it.
    m.complete_store(&[3], StoreOutcome::Failed);
    m.on_request_finished(b).unwrap();
    m.on_request_finished(c).unwrap();
    assert_eq!(held(&m), set(&[1, 3]));
    let _ = m.take_events();
    assert_eq!(held(&m), set(&[1]));
    m.reset_cache();
    assert_eq!(held(&m), set(&[]));
}

#[test]
fn arc_ghosts_are_held_until_trimmed() {
    let mut cfg = ManagerConfig::new(1);
    cfg.policy = PolicyKind::Arc;
    let mut m: OffloadManager<u64> = OffloadManager::new(cfg).unwrap();
    let mut plan = StorePlan::new();
    let mut store = |m: &mut OffloadManager<u64>, k: u64| {
        let r = m.on_new_request().unwrap();
        m.prepare_store(r, &[k], None, &mut plan).unwrap();
        m.complete_store(&[k], StoreOutcome::Stored);
        m.on_request_finished(r).unwrap();
    };
    store(&mut m, 1);
    store(&mut m, 2);
    // 1 went to B1 (capacity 1).
    assert_eq!(held(&m), set(&[1, 2]));
    store(&mut m, 3);
    // 2 replaced 1 in B1.
    assert_eq!(held(&m), set(&[2, 3]));
}

#[test]
fn the_reuse_tracker_holds_offered_keys() {
    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    cfg.max_tracker_size = 2;
    let mut m: OffloadManager<u64> = OffloadManager::new(cfg).unwrap();
    let mut plan = StorePlan::new();
    let r = m.on_new_request().unwrap();
    m.prepare_store(r, &[5, 6], None, &mut plan).unwrap();
    assert!(plan.keys().is_empty());
    m.on_request_finished(r).unwrap();
    assert_eq!(held(&m), set(&[5, 6]));
    let r = m.on_new_request().unwrap();
    m.prepare_store(r, &[8], None, &mut plan).unwrap();
    m.on_request_finished(r).unwrap();
    // The tracker holds two keys: 5, the least recent, made room for 8.
    assert_eq!(held(&m), set(&[6, 8]));
}

#[test]
fn a_key_only_a_live_request_names_is_held_until_it_ends() {
    let mut m: OffloadManager<u64> = OffloadManager::new(ManagerConfig::new(0)).unwrap();
    let mut plan = StorePlan::new();
    let r = m.on_new_request().unwrap();
    // No slot at all: the offer fails, but the request has seen 42.
    let e = m.prepare_store(r, &[42], None, &mut plan).unwrap_err();
    assert!(matches!(e, StoreError::NoRoom { need: 1, .. }));
    assert_eq!(held(&m), set(&[42]));
    m.drop_request(r).unwrap();
    assert_eq!(held(&m), set(&[]));
}
