//! `manager_ops`: arbitrary sequences of every `OffloadManager` call (the shared
//! `kvtier_tests::manager_model::Op`), both policies, with and without the store threshold, on
//! small capacities so eviction and failure paths are hot. After every step:
//!
//! * `check_invariants()` holds, `allocated − free = write_pending + pinned + evictable` (i.e.
//!   `allocated = pending + pinned + idle`, `allocated + free = capacity`), no slot holds two
//!   keys, the three usage gauges are within [0, 1];
//! * an op that returned a typed error left the manager as a clone taken before it: the same
//!   observable snapshot, the same pending events and the same stats drain;
//! * LRU: the same outcome and snapshot as the reference model (vLLM 0.33.0's manager);
//!   ARC: `prepare_store` is legal (stored = absent admitted offered keys in order, exactly the
//!   victims needed, each idle and not offered).
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::manager::{ChunkState, OffloadManager, PolicyKind};
use kvtier_core::stats::Gauge;
use kvtier_tests::manager_model::{Config, KEYS, Model, Op, Outcome, Real, SLOTS, Snapshot};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    arc: bool,
    store_threshold: u8,
    max_tracker_size: u8,
    small_event_queue: bool,
    max_requests: u8,
    /// Each op with a flag: steer its keys towards keys in a useful state.
    ops: Vec<(Op, bool)>,
}

impl Input {
    fn config(&self) -> Config {
        Config {
            capacity: u32::from(self.capacity % 8),
            policy: if self.arc {
                PolicyKind::Arc
            } else {
                PolicyKind::Lru
            },
            store_threshold: u32::from(self.store_threshold % 4),
            max_tracker_size: u32::from(self.max_tracker_size % 6),
            max_event_keys: if self.small_event_queue { 3 } else { 64 },
            max_requests: u32::from(self.max_requests % 4) + 1,
        }
    }
}

/// Positions mostly small and as long as the keys (a wrong length or a value above `i64::MAX`
/// stays reachable through the raw bytes when not steered).
fn steer_positions(keys: &[u8], positions: Option<Vec<u64>>) -> Option<Vec<u64>> {
    positions.map(|p| {
        (0..keys.len())
            .map(|i| p.get(i).map_or(i as u64, |v| v % 8))
            .collect()
    })
}

/// Sends a request op to the live request, maps a load's keys onto readable keys, a load
/// completion's onto pinned keys and a store completion's onto pending keys (key id `k` becomes
/// the `k mod n`-th such key), so those calls succeed often.
fn steer(op: Op, snap: &Snapshot, live: Option<u8>) -> Op {
    let with = |pred: fn(ChunkState) -> bool| -> Vec<u8> {
        (0..KEYS)
            .filter(|&k| snap.chunks[usize::from(k)].is_some_and(|(_, s)| pred(s)))
            .collect()
    };
    let pick = |keys: Vec<u8>, pool: &[u8]| -> Vec<u8> {
        if pool.is_empty() {
            return keys;
        }
        keys.iter()
            .map(|&k| pool[usize::from(k) % pool.len()])
            .collect()
    };
    let to_live = |slot: u8| live.unwrap_or(slot);
    match op {
        Op::PrepareStore {
            slot,
            keys,
            positions,
        } => Op::PrepareStore {
            slot: to_live(slot),
            positions: steer_positions(&keys, positions),
            keys,
        },
        Op::PrepareLoad {
            slot,
            keys,
            positions,
        } => {
            let keys = pick(keys, &with(|s| s != ChunkState::Pending));
            Op::PrepareLoad {
                slot: to_live(slot),
                positions: steer_positions(&keys, positions),
                keys,
            }
        }
        Op::CompleteLoad { keys } => Op::CompleteLoad {
            keys: pick(keys, &with(|s| matches!(s, ChunkState::Pinned(_)))),
        },
        Op::CompleteStore { keys, success } => Op::CompleteStore {
            keys: pick(keys, &with(|s| s == ChunkState::Pending)),
            success,
        },
        other => other,
    }
}

/// The slot of the latest request created and not yet finished or dropped, after `op`.
fn track_live(live: Option<u8>, op: &Op, got: &Outcome) -> Option<u8> {
    match (op, got) {
        (Op::NewRequest { slot }, Outcome::Request(Ok(()))) => {
            u8::try_from(usize::from(*slot) % SLOTS).ok()
        }
        (Op::Finish { slot } | Op::Drop { slot }, Outcome::Request(Ok(())))
            if live.map(usize::from) == Some(usize::from(*slot) % SLOTS) =>
        {
            None
        }
        _ => live,
    }
}

fn gauge_in_unit_range(g: Gauge, what: &str) {
    let (n, d) = (g.numerator(), g.denominator());
    assert!(
        n >= 0 && n.unsigned_abs() <= d,
        "{what} gauge {n}/{d} outside [0, 1]"
    );
}

/// Checks that hold for any policy after every step.
fn check_state(real: &Real, snap: &Snapshot, cap: u32) {
    if let Err(e) = real.manager.check_invariants() {
        panic!("check_invariants: {e}");
    }
    let mut slots = Vec::new();
    let (mut pending, mut idle, mut pinned) = (0u32, 0u32, 0u32);
    for &(s, state) in snap.chunks.iter().flatten() {
        assert!(s < cap, "slot {s} out of range {cap}");
        slots.push(s);
        match state {
            ChunkState::Pending => pending += 1,
            ChunkState::Idle => idle += 1,
            ChunkState::Pinned(n) => {
                assert!(n > 0, "pinned by 0 loads");
                pinned += 1;
            }
        }
    }
    let resident = slots.len();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), resident, "a slot is held by two keys");
    assert_eq!(snap.allocated, pending + idle + pinned);
    assert_eq!(
        snap.allocated,
        snap.write_pending + pinned + snap.evictable,
        "allocated − free != write_pending + pinned + evictable"
    );
    assert_eq!(snap.write_pending, pending, "write_pending");
    assert_eq!(snap.evictable, idle, "evictable");
    assert_eq!(
        snap.allocated + snap.free,
        cap,
        "allocated + free != capacity"
    );
    // Drain a clone so the check does not change what the next get_stats reports.
    let stats = real.manager.clone().get_stats();
    gauge_in_unit_range(stats.usage(), "usage");
    gauge_in_unit_range(stats.write_usage(), "write usage");
    gauge_in_unit_range(stats.read_usage(), "read usage");
}

/// An op that failed must leave everything as the clone taken before it.
fn check_unchanged(
    op: &Op,
    real: &Real,
    snap: &Snapshot,
    before: &Snapshot,
    clone: &OffloadManager,
) {
    assert_eq!(snap, before, "{op:?} failed but changed the state");
    let (mut now, mut then) = (real.manager.clone(), clone.clone());
    assert_eq!(
        now.take_events(),
        then.take_events(),
        "{op:?} failed but changed the events"
    );
    assert_eq!(
        now.get_stats(),
        then.get_stats(),
        "{op:?} failed but changed the stats"
    );
}

/// The legality of one ARC `prepare_store`, judged from the states before and after.
fn check_arc_store(
    cfg: &Config,
    offered: &[u8],
    got: &Outcome,
    before: &Snapshot,
    after: &Snapshot,
) {
    let Outcome::Store(Ok(decision)) = got else {
        return;
    };
    let absent: Vec<u8> = offered
        .iter()
        .copied()
        .filter(|&k| before.chunks[usize::from(k)].is_none())
        .collect();
    let admitted: Vec<u8> = absent
        .into_iter()
        .filter(|&k| {
            cfg.store_threshold < 2 || after.tracker_counts[usize::from(k)] >= cfg.store_threshold
        })
        .collect();
    let eligible = (0..KEYS)
        .filter(|k| {
            !offered.contains(k)
                && matches!(before.chunks[usize::from(*k)], Some((_, ChunkState::Idle)))
        })
        .count();
    let need = admitted.len().saturating_sub(before.free as usize);
    match decision {
        None => {
            assert!(
                need > 0 && eligible < need,
                "None with {eligible} eligible for {need}"
            );
            assert_eq!(after.chunks, before.chunks, "a failed store changed chunks");
        }
        Some(d) => {
            assert_eq!(d.keys, admitted, "stored keys");
            assert_eq!(d.evicted.len(), need, "victim count");
            let mut victims = d.evicted.clone();
            victims.sort_unstable();
            victims.dedup();
            assert_eq!(victims.len(), need, "a key evicted twice");
            for &v in &d.evicted {
                assert!(!offered.contains(&v), "evicted offered key {v}");
                assert!(
                    matches!(before.chunks[usize::from(v)], Some((_, ChunkState::Idle))),
                    "evicted non-idle key {v}"
                );
                assert!(
                    after.chunks[usize::from(v)].is_none(),
                    "victim {v} still resident"
                );
            }
            for (k, s) in d.keys.iter().zip(&d.slots) {
                assert_eq!(
                    after.chunks[usize::from(*k)],
                    Some((*s, ChunkState::Pending)),
                    "stored key {k}"
                );
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let cfg = input.config();
    let Ok(mut real) = Real::new(&cfg) else {
        return;
    };
    let mut model = (cfg.policy == PolicyKind::Lru).then(|| Model::new(cfg));
    // Every run starts with a live request in slot 0, so stores and loads can succeed from the
    // first op (the fuzzer can still finish or drop it).
    let first = (Op::NewRequest { slot: 0 }, false);
    let mut live = None;
    for (step, (op, steered)) in core::iter::once(first).chain(input.ops).enumerate() {
        let before = real.snapshot();
        let clone = real.manager.clone();
        let op = if steered {
            steer(op, &before, live)
        } else {
            op
        };
        let got = real.apply(&op);
        live = track_live(live, &op, &got);
        let snap = real.snapshot();
        check_state(&real, &snap, cfg.capacity);
        if got.is_failure() {
            check_unchanged(&op, &real, &snap, &before, &clone);
        }
        match &mut model {
            Some(model) => {
                let want = model.apply(&op);
                assert_eq!(got, want, "step {step}: {op:?}");
                assert_eq!(snap, model.snapshot(), "step {step}: {op:?}");
            }
            None => {
                if let Op::PrepareStore { keys, .. } = &op {
                    let offered: Vec<u8> = keys.iter().map(|&k| k % KEYS).collect();
                    check_arc_store(&cfg, &offered, &got, &before, &snap);
                }
            }
        }
    }
});
