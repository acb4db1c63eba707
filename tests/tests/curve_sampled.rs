//! Sampled curves (`kvtier_core::curve::SampledCurves`): at rate 1 a miniature replay is the
//! replay itself and the sampled LRU stack is the exact one; at lower rates the block hit rate
//! stays within the bound the module states for these traces, against exact replays.

#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    reason = "test code: a failed unwrap is a failed test; rates for people"
)]

use kvtier_cli::replay::{ReplayCounts, Replayer};
use kvtier_cli::trace::OwnedRecord;
use kvtier_core::curve::{DEFAULT_SEED, SampledConfig, SampledCurves, Sampler};
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};
use kvtier_tests::curve::{feed, read};

fn replay(records: &[OwnedRecord], capacity: u32, policy: PolicyKind) -> ReplayCounts {
    let mut cfg = ManagerConfig::new(capacity);
    cfg.policy = policy;
    let mut r = Replayer::new(OffloadManager::new(cfg).unwrap(), 16);
    for rec in records {
        r.apply(rec.as_record()).unwrap();
    }
    r.counts()
}

fn sampled(records: &[OwnedRecord], rate: f64, capacities: &[u32], max: u32) -> SampledCurves {
    let cfg = SampledConfig {
        rate,
        max_capacity: max,
        capacities: capacities.to_vec(),
        policies: vec![PolicyKind::Lru, PolicyKind::Arc],
        store_threshold: 1,
        max_tracker_size: 64_000,
        block_tokens: 16,
        max_requests: 1024,
        seed: DEFAULT_SEED,
        stack: true,
    };
    let mut s = SampledCurves::new(&cfg).unwrap();
    feed(records, &mut s).unwrap();
    s
}

/// The sampler keeps close to its rate of distinct keys, and the same keys on every run.
#[test]
fn the_sampler_keeps_its_rate_of_keys() {
    let s = Sampler::new(0.01).unwrap();
    let kept = (0..1_000_000u64).filter(|&k| s.keeps(k)).count();
    assert!((9_000..11_000).contains(&kept), "kept {kept} of 1,000,000");
    let again = Sampler::new(0.01).unwrap();
    assert!((0..10_000u64).all(|k| s.keeps(k) == again.keeps(k)));
    assert_eq!(s.scaled(1000), 10);
    assert_eq!(s.scaled(10), 1);
    assert!(Sampler::new(0.0).is_err() && Sampler::new(1.5).is_err());
}

/// Rate 1 keeps every key: the miniature replays are the replays, counts and all, and the
/// sampled LRU stack's certified points are the replays'.
#[test]
fn at_rate_one_the_miniatures_are_the_replays() {
    let records = read("small-a.kvtrace");
    let caps = [64, 512, 2048];
    let s = sampled(&records, 1.0, &caps, 2048);
    assert_eq!(s.minis().len(), 6);
    for m in s.minis() {
        let r = replay(&records, m.capacity, m.policy);
        let c = m.counts();
        assert_eq!(
            (c.requests, c.request_blocks, c.hit_blocks, c.store_failures),
            (r.requests, r.request_blocks, r.hit_blocks, r.store_failures)
        );
    }
    let curve = s.lru_curve().unwrap().unwrap();
    assert_eq!(
        s.lru_rate(&curve, 64),
        None,
        "64 chunks: in-flight effects, not certified"
    );
    let r = replay(&records, 2048, PolicyKind::Lru);
    let rate = s.lru_rate(&curve, 2048).unwrap();
    assert!(
        (rate - r.block_hit_rate()).abs() < 1e-12,
        "{rate} vs {}",
        r.block_hit_rate()
    );
}

/// The stated bound: at rate 0.25 on small-b (302,290 request-blocks, a few shared prefixes
/// carrying most hits, so the sampling error is that of the few hot keys kept), the sampled
/// LRU and ARC block hit rates lie within 5 percentage points of the replays at four
/// capacities, and the sampled stack's certified points as well.
#[test]
fn sampled_rates_stay_within_the_stated_bound() {
    let records = read("small-b.kvtrace");
    let caps = [256, 1024, 4096, 16_384];
    let s = sampled(&records, 0.25, &caps, 16_384);
    let curve = s.lru_curve().unwrap().unwrap();
    let mut worst = 0f64;
    for &c in &caps {
        let lru = replay(&records, c, PolicyKind::Lru).block_hit_rate();
        let arc = replay(&records, c, PolicyKind::Arc).block_hit_rate();
        let mini = |p| s.mini(p, c).unwrap().counts().block_hit_rate();
        let e_lru = (mini(PolicyKind::Lru) - lru).abs();
        let e_arc = (mini(PolicyKind::Arc) - arc).abs();
        let e_stack = s.lru_rate(&curve, c).map(|r| (r - lru).abs());
        eprintln!("capacity {c}: LRU error {e_lru:.4} (stack {e_stack:?}), ARC error {e_arc:.4}");
        worst = worst.max(e_lru).max(e_arc).max(e_stack.unwrap_or(0.0));
    }
    assert!(worst <= 0.05, "worst error {worst:.4}");
}
