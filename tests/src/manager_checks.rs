//! The per-step checks of the manager's model-based tests, shared by the proptest
//! (`tests/tests/manager/manager_model.rs`) and the fuzz target
//! (`fuzz/fuzz_targets/manager_ops.rs`), so both drive the same ops through the same checks:
//! [`run_ops`].
//!
//! After every step: `check_invariants()` holds, `allocated − free = write_pending + pinned +
//! evictable` (i.e. `allocated = pending + pinned + idle`, `allocated + free = capacity`), no
//! slot holds two keys, the three usage gauges are within [0, 1]; an op that returned a typed
//! error left the manager as a clone taken before it (snapshot, pending events, stats drain);
//! the outcome and the snapshot (slots, states, counters, tracker, the policy's eviction order)
//! equal the reference model's (vLLM 0.33.0's manager with its LRU or ARC policy); under ARC
//! every `prepare_store` is also checked for legality on its own (stored = absent admitted
//! offered keys in order, exactly the victims needed, each idle and not offered).

use kvtier_core::manager::{ChunkState, OffloadManager, PolicyKind};
use kvtier_core::stats::Gauge;

use crate::manager_model::{Config, KEYS, Model, Op, Outcome, Real, SLOTS, Snapshot};

/// `assert!` that returns the failure as an `Err(String)`.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// `assert_eq!` that returns the failure as an `Err(String)`.
macro_rules! ensure_eq {
    ($a:expr, $b:expr $(,)?) => {
        ensure_eq!($a, $b, "values differ")
    };
    ($a:expr, $b:expr, $($fmt:tt)+) => {
        match (&$a, &$b) {
            (a, b) => {
                if a != b {
                    return Err(format!("{}: left {:?}, right {:?}", format!($($fmt)+), a, b));
                }
            }
        }
    };
}

/// Runs `ops` (each with a flag: steer its keys towards keys in a useful state) from a fresh
/// manager built from `cfg`, checking everything listed in the module docs after every step.
///
/// # Errors
/// The first check that failed, with the step and the op.
pub fn run_ops(cfg: Config, ops: impl IntoIterator<Item = (Op, bool)>) -> Result<(), String> {
    let Ok(mut real) = Real::new(&cfg) else {
        return Ok(());
    };
    let mut model = Model::new(cfg);
    let mut live = None;
    for (step, (op, steered)) in ops.into_iter().enumerate() {
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
        let at = |e: String| format!("step {step}: {op:?}: {e}");
        check_state(&real, &snap, cfg.capacity).map_err(at)?;
        if got.is_failure() {
            check_unchanged(&op, &real, &snap, &before, &clone).map_err(at)?;
        }
        let want = model.apply(&op);
        ensure_eq!(got, want, "step {step}: {op:?}: outcome");
        ensure_eq!(snap, model.snapshot(), "step {step}: {op:?}: snapshot");
        if cfg.policy == PolicyKind::Arc
            && let Op::PrepareStore { keys, .. } = &op
        {
            let offered: Vec<u8> = keys.iter().map(|&k| k % KEYS).collect();
            check_arc_store(&cfg, &offered, &got, &before, &snap).map_err(at)?;
        }
    }
    Ok(())
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
pub fn steer(op: Op, snap: &Snapshot, live: Option<u8>) -> Op {
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
pub fn track_live(live: Option<u8>, op: &Op, got: &Outcome) -> Option<u8> {
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

fn gauge_in_unit_range(g: Gauge, what: &str) -> Result<(), String> {
    let (n, d) = (g.numerator(), g.denominator());
    ensure!(
        n >= 0 && n.unsigned_abs() <= d,
        "{what} gauge {n}/{d} outside [0, 1]"
    );
    Ok(())
}

/// Checks that hold for any policy after every step.
pub fn check_state(real: &Real, snap: &Snapshot, cap: u32) -> Result<(), String> {
    if let Err(e) = real.manager.inspect().check_invariants() {
        return Err(format!("check_invariants: {e}"));
    }
    let mut slots = Vec::new();
    let (mut pending, mut idle, mut pinned) = (0u32, 0u32, 0u32);
    for &(s, state) in snap.chunks.iter().flatten() {
        ensure!(s < cap, "slot {s} out of range {cap}");
        slots.push(s);
        match state {
            ChunkState::Pending => pending += 1,
            ChunkState::Idle => idle += 1,
            ChunkState::Pinned(n) => {
                ensure!(n > 0, "pinned by 0 loads");
                pinned += 1;
            }
        }
    }
    let resident = slots.len();
    slots.sort_unstable();
    slots.dedup();
    ensure_eq!(slots.len(), resident, "a slot is held by two keys");
    ensure_eq!(snap.allocated, pending + idle + pinned);
    ensure_eq!(
        snap.allocated,
        snap.write_pending + pinned + snap.evictable,
        "allocated − free != write_pending + pinned + evictable"
    );
    ensure_eq!(snap.write_pending, pending, "write_pending");
    ensure_eq!(snap.evictable, idle, "evictable");
    ensure_eq!(
        snap.allocated + snap.free,
        cap,
        "allocated + free != capacity"
    );
    // Drain a clone so the check does not change what the next get_stats reports.
    let stats = real.manager.clone().take_stats();
    gauge_in_unit_range(stats.usage(), "usage")?;
    gauge_in_unit_range(stats.write_usage(), "write usage")?;
    gauge_in_unit_range(stats.read_usage(), "read usage")?;
    Ok(())
}

/// An op that failed must leave everything as the clone taken before it.
pub fn check_unchanged(
    op: &Op,
    real: &Real,
    snap: &Snapshot,
    before: &Snapshot,
    clone: &OffloadManager,
) -> Result<(), String> {
    ensure_eq!(snap, before, "{op:?} failed but changed the state");
    let (mut now, mut then) = (real.manager.clone(), clone.clone());
    ensure_eq!(
        now.take_events(),
        then.take_events(),
        "{op:?} failed but changed the events"
    );
    ensure_eq!(
        now.take_stats(),
        then.take_stats(),
        "{op:?} failed but changed the stats"
    );
    Ok(())
}

/// The legality of one ARC `prepare_store`, judged from the states before and after.
pub fn check_arc_store(
    cfg: &Config,
    offered: &[u8],
    got: &Outcome,
    before: &Snapshot,
    after: &Snapshot,
) -> Result<(), String> {
    let Outcome::Store(Ok(decision)) = got else {
        return Ok(());
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
            ensure!(
                need > 0 && eligible < need,
                "None with {eligible} eligible for {need}"
            );
            ensure_eq!(after.chunks, before.chunks, "a failed store changed chunks");
        }
        Some(d) => {
            ensure_eq!(d.keys, admitted, "stored keys");
            ensure_eq!(d.evicted.len(), need, "victim count");
            let mut victims = d.evicted.clone();
            victims.sort_unstable();
            victims.dedup();
            ensure_eq!(victims.len(), need, "a key evicted twice");
            for &v in &d.evicted {
                ensure!(!offered.contains(&v), "evicted offered key {v}");
                ensure!(
                    matches!(before.chunks[usize::from(v)], Some((_, ChunkState::Idle))),
                    "evicted non-idle key {v}"
                );
                ensure!(
                    after.chunks[usize::from(v)].is_none(),
                    "victim {v} still resident"
                );
            }
            for (k, s) in d.keys.iter().zip(&d.slots) {
                ensure_eq!(
                    after.chunks[usize::from(*k)],
                    Some((*s, ChunkState::Pending)),
                    "stored key {k}"
                );
            }
        }
    }
    Ok(())
}
