//! The one-pass LRU curve (`kvtier_core::curve::LruStack`) against the replayer: at every
//! capacity the stack certifies exact, its hit blocks, hit requests and digest equal one
//! `Replayer` run at that capacity, on random interleaved traces (chained and unchained key
//! lists, repeats, shared prefixes) and on the shared traces.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test code: a failed unwrap is a failed test; sizes are small"
)]

use kvtier_cli::replay::{ReplayCounts, Replayer};
use kvtier_cli::trace::OwnedRecord;
use kvtier_core::curve::{Curve, LruStack, StackConfig};
use kvtier_core::manager::{ManagerConfig, OffloadManager};
use kvtier_tests::curve::{feed, read};
use kvtier_tests::trace_order::interleave;
use proptest::prelude::*;

fn replay(records: &[OwnedRecord], capacity: u32) -> ReplayCounts {
    let mut r = Replayer::new(
        OffloadManager::new(ManagerConfig::new(capacity)).unwrap(),
        16,
    );
    for rec in records {
        r.apply(rec.as_record()).unwrap();
    }
    r.counts()
}

fn stack_curve(records: &[OwnedRecord], max: u32) -> Curve {
    let mut s = LruStack::new(StackConfig::new(max)).unwrap();
    feed(records, &mut s).unwrap();
    s.curve().unwrap()
}

/// Checks every `step`-th capacity up to `upto` that the curve certifies exact against a
/// replay; returns how many were checked.
fn check_exact_points(
    records: &[OwnedRecord],
    curve: &Curve,
    step: u32,
    upto: u32,
) -> Result<u32, String> {
    let mut checked = 0;
    for c in (1..=upto.min(curve.len())).step_by(step as usize) {
        let p = curve.at(c).unwrap();
        if !p.exact {
            continue;
        }
        let r = replay(records, c);
        if (r.hit_blocks, r.hit_requests, r.digest) != (p.hit_blocks, p.hit_requests, p.digest) {
            return Err(format!(
                "capacity {c}: replay hits {} requests {} digest {:016x}, stack {} {} {:016x}",
                r.hit_blocks, r.hit_requests, r.digest, p.hit_blocks, p.hit_requests, p.digest
            ));
        }
        checked += 1;
    }
    Ok(checked)
}

/// A trace of `lists.len()` requests, interleaved by `order`, each request's blocks drawn
/// from a small key space: a shared prefix chain (block `i` of prefix `p` is always the same
/// key) followed by keys of its own or from a small pool (so repeats and unchained lists
/// happen too).
fn trace(lists: &[(u8, u8, Vec<u8>)], order: &[u32]) -> Vec<OwnedRecord> {
    let blocks: Vec<Vec<u64>> = lists
        .iter()
        .enumerate()
        .map(|(rid, (prefix, len, tail))| {
            let mut keys: Vec<u64> = (0..u64::from(*len))
                .map(|i| 1000 * u64::from(*prefix) + i)
                .collect();
            for &t in tail {
                // Pool keys (< 16) repeat across requests; the others are the request's own.
                let k = if t < 16 {
                    50_000 + u64::from(t)
                } else {
                    1 << 32 | (rid as u64) << 8 | u64::from(t)
                };
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            if keys.is_empty() {
                keys.push(1 << 40 | rid as u64);
            }
            keys
        })
        .collect();
    interleave(order)
        .into_iter()
        .map(|(op, rid)| match op {
            0 => OwnedRecord::Load {
                rid,
                hashes: blocks[rid as usize].clone(),
            },
            1 => OwnedRecord::Start { rid },
            _ => OwnedRecord::Complete { rid },
        })
        .collect()
}

fn lists() -> impl Strategy<Value = Vec<(u8, u8, Vec<u8>)>> {
    prop::collection::vec(
        (0u8..6, 0u8..8, prop::collection::vec(0u8..40, 0..5)),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every capacity 1..=64 the stack certifies equals the replay there, and so does the
    /// largest, which holds twice every key of the trace: nothing is evicted there, every
    /// request fits, and the stack certifies it.
    #[test]
    fn certified_capacities_equal_replays(
        (lists, order) in lists().prop_flat_map(|l| {
            let n = l.len() * 3;
            (Just(l), prop::collection::vec(any::<u32>(), n))
        })
    ) {
        let records = trace(&lists, &order);
        let max = distinct(&records) * 2 + 64;
        let curve = stack_curve(&records, max);
        check_exact_points(&records, &curve, 1, 64).map_err(TestCaseError::fail)?;
        prop_assert!(curve.at(max).unwrap().exact);
        check_exact_points(&records, &curve, max, max).map_err(TestCaseError::fail)?;
    }

    /// One request at a time (no overlap): nothing is in flight when another request looks
    /// up or stores, and every capacity from twice the longest request up is certified.
    #[test]
    fn sequential_traces_are_exact_from_a_request(lists in lists()) {
        let order: Vec<u32> = (0..lists.len() as u32 * 3).collect();
        let records = trace(&lists, &order);
        let curve = stack_curve(&records, 64);
        check_exact_points(&records, &curve, 1, 64).map_err(TestCaseError::fail)?;
        let longest = lists.iter().map(|(_, l, t)| usize::from(*l) + t.len()).max().unwrap_or(1).max(1);
        prop_assert!(curve.exact_from() as usize <= longest * 2 + 2, "exact from {}", curve.exact_from());
    }
}

fn distinct(records: &[OwnedRecord]) -> u32 {
    let mut keys: Vec<u64> = records
        .iter()
        .flat_map(|r| match r {
            OwnedRecord::Load { hashes, .. } => hashes.clone(),
            _ => Vec::new(),
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.len() as u32
}

/// small-a (1,000 requests, 32 in flight): every 61st certified capacity up to 8,192 equals
/// the replay, and the largest capacity (past every key: no eviction) is certified.
#[test]
fn small_a_certified_capacities_equal_replays() {
    let records = read("small-a.kvtrace");
    let curve = stack_curve(&records, 8192);
    let checked = check_exact_points(&records, &curve, 61, 8192).unwrap();
    assert!(checked >= 10, "only {checked} capacities certified");
    let top = curve.at(8192).unwrap();
    assert!(top.exact);
    let r = replay(&records, 8192);
    assert_eq!((top.hit_blocks, top.digest), (r.hit_blocks, r.digest));
}
