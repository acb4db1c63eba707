//! Scenario ports of vLLM 0.33.0's behaviour (`docs/vllm-behaviour.md`): C1, C3, C4, C5, C7,
//! C9 and ARC's basics, with vLLM 0.33.0's exact ids, victims, events and gauges.
//!
//! `no_std` + `alloc` on purpose: the host tests (`tests/tests/manager/manager_scenarios.rs`)
//! and the Cortex-M firmware (`tests/firmware`, which includes this file by path) run the same
//! bodies.
//! Each function panics at the first value that differs from vLLM's. Also here, for the same
//! two audiences: [`capacity_llama_3_8b`] (the hand check of `docs/sizing.md`) and
//! [`workload`], a deterministic request stream whose digest must be equal on every target.

#![allow(
    clippy::unwrap_used,
    reason = "scenario code: a failed unwrap is a failed scenario"
)]

use alloc::vec;
use alloc::vec::Vec;

use kvtier_core::BlockKey;
use kvtier_core::capacity::{
    CpuTierConfig, GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, gpu_capacity,
    size_cpu_tier,
};
use kvtier_core::manager::{
    EventKind, LookupResult, ManagerConfig, ManagerStats, OffloadManager, PolicyKind, StoreOutcome,
};
use kvtier_core::stats::{Gauge, catalogue};

use crate::store::{outcome, store, store_or_no_room};

/// Every scenario by name, in spec order (what the firmware runs).
pub const ALL: [(&str, fn()); 12] = [
    (
        "c1_lru_capacity_4_with_events",
        c1_lru_capacity_4_with_events,
    ),
    (
        "c1_metadata_only_event_keeps_only_keys_still_absent",
        c1_metadata_only_event_keeps_only_keys_still_absent,
    ),
    (
        "c3_prepare_load_keeps_key_order",
        c3_prepare_load_keeps_key_order,
    ),
    (
        "c4_usage_gauges_and_allocation_histogram",
        c4_usage_gauges_and_allocation_histogram,
    ),
    ("c4_through_the_stats_payload", c4_through_the_stats_payload),
    ("config_info_series", config_info_series),
    (
        "c4_zero_capacity_and_protected_failures_still_sample",
        c4_zero_capacity_and_protected_failures_still_sample,
    ),
    ("c5_stores_skipped", c5_stores_skipped),
    ("c7_evictable_count", c7_evictable_count),
    ("c9_lru_request_scoped_order", c9_lru_request_scoped_order),
    (
        "c9_request_rank_sorts_tails_first_while_in_flight",
        c9_request_rank_sorts_tails_first_while_in_flight,
    ),
    ("arc_policy_basics", arc_policy_basics),
];

fn k(i: u64) -> BlockKey {
    BlockKey::new(i, 0)
}

fn ks(ids: &[u64]) -> Vec<BlockKey> {
    ids.iter().map(|&i| k(i)).collect()
}

/// A manager plus one throwaway request context per call, like vLLM's tests.
struct H {
    m: OffloadManager,
}

/// `(keys to store, slots, evicted)` as plain ids.
type Out = Option<(Vec<u64>, Vec<u32>, Vec<u64>)>;

impl H {
    fn new(capacity: u32) -> Self {
        Self::with(ManagerConfig::new(capacity))
    }

    fn with(cfg: ManagerConfig) -> Self {
        H {
            m: OffloadManager::new(cfg).unwrap(),
        }
    }

    fn ps(&mut self, ids: &[u64]) -> Out {
        let req = self.m.on_new_request().unwrap();
        let out = store_or_no_room(&mut self.m, req, &ks(ids), None)
            .unwrap()
            .map(|o| {
                (
                    o.keys().iter().map(|k| k.hash).collect(),
                    o.slots().to_vec(),
                    o.evicted().iter().map(|k| k.hash).collect(),
                )
            });
        self.m.drop_request(req).unwrap();
        self.m.inspect().check_invariants().unwrap();
        out
    }

    fn cs(&mut self, ids: &[u64], success: bool) {
        self.m.complete_store(&ks(ids), outcome(success));
        self.m.inspect().check_invariants().unwrap();
    }

    fn pl(&mut self, ids: &[u64]) -> Vec<u32> {
        let req = self.m.on_new_request().unwrap();
        let slots = self.m.prepare_load(req, &ks(ids), None).unwrap().to_vec();
        self.m.drop_request(req).unwrap();
        self.m.inspect().check_invariants().unwrap();
        slots
    }

    fn cl(&mut self, ids: &[u64]) {
        self.m.complete_load(&ks(ids)).unwrap();
        self.m.inspect().check_invariants().unwrap();
    }

    fn look(&self, i: u64) -> LookupResult {
        self.m.lookup(&k(i))
    }

    fn events(&mut self) -> Vec<(EventKind, Vec<u64>)> {
        self.m
            .take_events()
            .into_iter()
            .map(|(kind, keys)| (kind, keys.iter().map(|k| k.hash).collect()))
            .collect()
    }
}

fn stored(ids: Vec<u64>, slots: Vec<u32>, evicted: Vec<u64>) -> Out {
    Some((ids, slots, evicted))
}

/// C1: LRU over 4 chunks with events: slots, victims, refusals and the event stream.
pub fn c1_lru_capacity_4_with_events() {
    let mut cfg = ManagerConfig::new(4);
    cfg.enable_events = true;
    let mut h = H::with(cfg);
    use EventKind::*;
    use LookupResult::*;

    assert_eq!(h.ps(&[1, 2]), stored(vec![1, 2], vec![0, 1], vec![]));
    assert_eq!((h.look(1), h.look(2)), (HitPending, HitPending));
    assert_eq!(h.events(), vec![]);

    h.cs(&[1, 2], true);
    assert_eq!(h.events(), vec![(Stored, vec![1, 2])]);
    assert_eq!((h.look(1), h.look(2), h.look(3)), (Hit, Hit, Miss));

    assert_eq!(
        h.ps(&[2, 3, 4, 5]),
        stored(vec![3, 4, 5], vec![2, 3, 0], vec![1])
    );
    assert_eq!(h.events(), vec![(Removed, vec![1])]);

    assert_eq!(h.ps(&[1, 6]), None);

    h.cs(&[2, 3, 4, 5], true);
    assert_eq!(
        [1, 2, 3, 4, 5, 0].map(|i| h.look(i)),
        [Miss, Hit, Hit, Hit, Hit, Miss]
    );

    assert_eq!(h.pl(&[2, 3]), vec![1, 2]);
    assert_eq!(h.ps(&[6, 7, 8]), None);

    h.cl(&[2, 3]);
    assert_eq!(
        h.ps(&[6, 7, 8]),
        stored(vec![6, 7, 8], vec![3, 2, 1], vec![2, 3, 4])
    );

    h.cs(&[6, 7, 8], true);
    h.m.touch(&ks(&[5, 6, 7]));
    assert_eq!(h.ps(&[9]), stored(vec![9], vec![1], vec![8]));

    h.cs(&[7, 9], false);
    assert_eq!((h.look(7), h.look(9)), (Hit, Miss));

    assert_eq!(
        h.events(),
        vec![
            (Stored, vec![3, 4, 5]),
            (Removed, vec![2, 3, 4]),
            (Stored, vec![6, 7, 8]),
            (Removed, vec![8]),
            (RemovedMetadataOnly, vec![9]),
        ]
    );
    assert!(RemovedMetadataOnly.removed() && RemovedMetadataOnly.metadata_only());
    assert!(!Stored.removed() && Removed.removed() && !Removed.metadata_only());
}

/// C1: a failed store's cleanup event keeps only the keys still absent when drained.
pub fn c1_metadata_only_event_keeps_only_keys_still_absent() {
    let mut cfg = ManagerConfig::new(4);
    cfg.enable_events = true;
    let mut h = H::with(cfg);
    h.ps(&[1, 2]);
    h.cs(&[1, 2], false);
    // A retry re-allocates key 1 before the cleanup event is drained.
    h.ps(&[1]);
    assert_eq!(h.events(), vec![(EventKind::RemovedMetadataOnly, vec![2])]);
    h.cs(&[1], false);
    h.ps(&[1]);
    // Everything the cleanup named is back: the event is dropped.
    assert_eq!(h.events(), vec![]);
}

/// C3: `prepare_load` returns slots in key order.
pub fn c3_prepare_load_keeps_key_order() {
    let mut h = H::new(4);
    assert_eq!(
        h.ps(&[0, 1, 2]),
        stored(vec![0, 1, 2], vec![0, 1, 2], vec![])
    );
    h.cs(&[0, 1, 2], true);
    assert_eq!(h.pl(&[1, 2, 0]), vec![1, 2, 0]);
}

fn gauges(s: &ManagerStats) -> (f64, f64, f64) {
    (
        s.usage().to_f64(),
        s.write_usage().to_f64(),
        s.read_usage().to_f64(),
    )
}

fn hist(s: &ManagerStats) -> Option<(u64, u64)> {
    let h = &s.allocation_sizes;
    (h.count() > 0).then(|| (h.count(), h.sum()))
}

/// C4: the usage gauges as exact ratios and the allocation-size histogram, per drain.
pub fn c4_usage_gauges_and_allocation_histogram() {
    let mut z = H::new(0);
    let s = z.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.0, 0.0, 0.0), None));
    assert_eq!(s.usage(), Gauge::fraction(0, 0));
    assert_eq!(s.usage().to_f64(), 0.0);

    let mut h = H::new(4);
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.0, 0.0, 0.0), None));

    h.ps(&[1, 2]);
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.5, 0.5, 0.0), Some((1, 2))));
    assert_eq!((s.usage().numerator(), s.usage().denominator()), (1, 2));

    h.ps(&[3, 4]);
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((1.0, 1.0, 0.0), Some((1, 2))));

    h.cs(&[1, 2, 3, 4], true);
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.0, 0.0, 0.0), None));

    h.pl(&[1]);
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.25, 0.0, 0.25), None));

    // Evicts the idle LRU key 2 (1 is pinned).
    assert_eq!(h.ps(&[5]), stored(vec![5], vec![1], vec![2]));
    let s = h.m.take_stats();
    assert_eq!((gauges(&s), hist(&s)), ((0.5, 0.25, 0.25), Some((1, 1))));
    assert_eq!(
        s.allocation_sizes.bucket_counts()[0],
        1,
        "1 chunk falls in the le=1 bucket"
    );
}

/// C4: the same through the stats payload (series present, drained, `stores_skipped`).
pub fn c4_through_the_stats_payload() {
    let mut h = H::new(4);
    h.ps(&[1, 2]);
    let p = h.m.take_stats_payload();
    let hist = p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap();
    assert_eq!((hist.count(), hist.sum()), (1, 2));
    assert_eq!(
        p.gauge(catalogue::CPU_CACHE_USAGE_PERC, &[])
            .unwrap()
            .to_f64(),
        0.5
    );
    assert_eq!(
        p.gauge(catalogue::CPU_CACHE_WRITE_USAGE_PERC, &[])
            .unwrap()
            .to_f64(),
        0.5
    );
    assert_eq!(
        p.gauge(catalogue::CPU_CACHE_READ_USAGE_PERC, &[])
            .unwrap()
            .to_f64(),
        0.0
    );
    assert_eq!(
        p.counter(catalogue::STORES_SKIPPED, &[]),
        None,
        "no filter, no series"
    );
    // Drained: the next payload has the gauges but no histogram.
    let p = h.m.take_stats_payload();
    assert!(p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).is_none());
    assert_eq!(p.len(), 3);
    let reduced = p.reduce();
    assert!(
        reduced
            .iter()
            .any(|(k, v)| k == catalogue::CPU_CACHE_USAGE_PERC && *v == 0.5)
    );

    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    let mut h = H::with(cfg);
    h.ps(&[1, 2, 3]);
    assert_eq!(
        h.m.take_stats_payload()
            .counter(catalogue::STORES_SKIPPED, &[]),
        Some(3)
    );
    assert_eq!(
        h.m.take_stats_payload()
            .counter(catalogue::STORES_SKIPPED, &[]),
        Some(0)
    );
}

/// C4: the `config_info` series, and its absence without tier facts.
pub fn config_info_series() {
    use kvtier_core::stats::CpuTierInfo;
    use kvtier_core::stats::InfoValue;
    let mut cfg = ManagerConfig::new(8);
    cfg.info = Some(CpuTierInfo {
        num_chunks: 8,
        blocks_per_chunk: 1,
        kv_cache_size_bytes: Some(8 * 4096),
        kv_cache_size_tokens: None,
    });
    let m: OffloadManager = OffloadManager::new(cfg).unwrap();
    let info = m.config_info();
    assert_eq!(info.get("cpu_num_chunks"), Some(&InfoValue::Int(8)));
    assert_eq!(
        info.get("cpu_kv_cache_size_bytes"),
        Some(&InfoValue::Int(32768))
    );
    assert_eq!(info.get("cpu_kv_cache_size_tokens"), Some(&InfoValue::None));
    let bare: OffloadManager = OffloadManager::new(ManagerConfig::new(8)).unwrap();
    assert!(bare.config_info().is_empty());
}

/// C4: refused stores (zero capacity, protected keys) still sample the histogram.
pub fn c4_zero_capacity_and_protected_failures_still_sample() {
    let mut z = H::new(0);
    assert_eq!(z.ps(&[1]), None);
    assert_eq!(hist(&z.m.take_stats()), Some((1, 1)));
    assert_eq!(z.ps(&[]), stored(vec![], vec![], vec![]));
    assert_eq!(hist(&z.m.take_stats()), None);

    let mut h = H::new(2);
    h.ps(&[1, 2]);
    h.cs(&[1, 2], true);
    // The only idle keys are offered, hence protected.
    assert_eq!(h.ps(&[1, 2, 3]), None);
    assert_eq!(hist(&h.m.take_stats()), Some((2, 3)));
    // The protection ends with the call: both are idle again, and an offer of one of them
    // evicts the other.
    assert_eq!(h.m.inspect().evictable(), 2);
    assert_eq!(h.ps(&[1, 3]), stored(vec![3], vec![1], vec![2]));
    assert_eq!(
        (
            h.m.inspect().evictable(),
            h.m.lookup(&k(1)),
            h.m.lookup(&k(3))
        ),
        (1, LookupResult::Hit, LookupResult::HitPending)
    );
}

/// C5: the reuse filter skips first offers and counts them in `stores_skipped`.
pub fn c5_stores_skipped() {
    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    let mut h = H::with(cfg);
    assert_eq!(h.ps(&[1, 2, 3]), stored(vec![], vec![], vec![]));
    assert_eq!(h.m.take_stats().stores_skipped, Some(3));
    assert_eq!(h.m.take_stats().stores_skipped, Some(0));
    assert_eq!(
        h.ps(&[1, 2, 3]),
        stored(vec![1, 2, 3], vec![0, 1, 2], vec![])
    );
    let s = h.m.take_stats();
    assert_eq!(
        (
            s.usage().to_f64(),
            s.write_usage().to_f64(),
            s.stores_skipped
        ),
        (0.75, 0.75, Some(0))
    );
    assert_eq!(h.m.inspect().tracker_count(&k(1)), 2);

    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 1;
    let mut h = H::with(cfg);
    h.ps(&[1]);
    assert_eq!(h.m.take_stats().stores_skipped, None);
}

/// C7: the evictable count through pins, failures, a reset and evictions.
pub fn c7_evictable_count() {
    let mut h = H::new(4);
    let ev = |h: &H| h.m.inspect().evictable();
    h.ps(&[1, 2, 3]);
    assert_eq!(ev(&h), 0);
    h.cs(&[1, 2, 3], true);
    assert_eq!(ev(&h), 3);
    h.pl(&[1]);
    assert_eq!(ev(&h), 2);
    h.pl(&[1]);
    assert_eq!(ev(&h), 2);
    h.cl(&[1]);
    assert_eq!(ev(&h), 2);
    h.cl(&[1]);
    assert_eq!(ev(&h), 3);
    assert_eq!(
        h.ps(&[4, 5, 6]),
        stored(vec![4, 5, 6], vec![3, 1, 0], vec![1, 2])
    );
    assert_eq!(ev(&h), 1);
    h.cs(&[4, 5, 6], false);
    assert_eq!(ev(&h), 1);
    h.m.reset_cache();
    h.m.inspect().check_invariants().unwrap();
    assert_eq!(ev(&h), 0);
    h.ps(&[10, 11, 12]);
    h.cs(&[10, 11, 12], true);
    h.pl(&[10, 11, 12]);
    assert_eq!(ev(&h), 0);
    assert_eq!(h.ps(&[14, 15]), None);
    h.cl(&[10, 11, 12]);
    assert_eq!(ev(&h), 3);
    assert_eq!(h.ps(&[14, 15]), stored(vec![14, 15], vec![3, 0], vec![10]));
    assert_eq!(ev(&h), 2);
    h.cs(&[14, 15], true);
    assert_eq!(ev(&h), 4);
}

/// C9: a finished request's tail is evicted first; without positions, insertion order.
pub fn c9_lru_request_scoped_order() {
    // A finished request with positions: its tail is evicted first.
    let mut m: OffloadManager = OffloadManager::new(ManagerConfig::new(4)).unwrap();
    let req = m.on_new_request().unwrap();
    let keys = ks(&[1, 2, 3]);
    store(&mut m, req, &keys, Some(&[16, 32, 48])).unwrap();
    m.complete_store(&keys, StoreOutcome::Stored);
    m.on_request_finished(req).unwrap();
    assert_eq!(m.inspect().eviction_order(), ks(&[3, 2, 1]));
    let anon = m.on_new_request().unwrap();
    let out = store(&mut m, anon, &ks(&[4, 5]), None).unwrap();
    assert_eq!(out.evicted(), ks(&[3]).as_slice());
    m.inspect().check_invariants().unwrap();

    // Without positions: insertion order.
    let mut h = H::new(4);
    h.ps(&[1, 2, 3]);
    h.cs(&[1, 2, 3], true);
    assert_eq!(h.ps(&[4, 5]).unwrap().2, vec![1]);

    // After reset_cache: ids restart at 0, old keys miss.
    h.m.reset_cache();
    assert_eq!(h.look(1), LookupResult::Miss);
    assert_eq!(h.ps(&[7]), stored(vec![7], vec![0], vec![]));
}

/// C9: in-flight requests order their keys tail first, request by request.
pub fn c9_request_rank_sorts_tails_first_while_in_flight() {
    let mut m: OffloadManager = OffloadManager::new(ManagerConfig::new(8)).unwrap();
    let a = m.on_new_request().unwrap();
    let b = m.on_new_request().unwrap();
    // A's keys arrive head to tail; B's rank is allocated after A's.
    store(&mut m, a, &ks(&[1, 2]), Some(&[16, 32])).unwrap();
    store(&mut m, b, &ks(&[10]), Some(&[16])).unwrap();
    store(&mut m, a, &ks(&[3]), Some(&[48])).unwrap();
    // Request A's bucket (tail first) precedes request B's.
    assert_eq!(m.inspect().eviction_order(), ks(&[3, 2, 1, 10]));
    m.inspect().check_invariants().unwrap();
}

/// ARC: promotion to T2 on reuse, eviction into B1, adaptation on a ghost hit.
pub fn arc_policy_basics() {
    let mut cfg = ManagerConfig::new(2);
    cfg.policy = PolicyKind::Arc;
    let mut h = H::with(cfg);
    h.ps(&[1, 2]);
    h.cs(&[1, 2], true);
    assert_eq!(h.m.inspect().arc_sizes(), Some((2, 0, 0, 0)));
    // Reusing 1 in a request promotes it to T2 when the request finishes.
    let req = h.m.on_new_request().unwrap();
    h.m.prepare_load(req, &ks(&[1]), None).unwrap();
    h.m.complete_load(&ks(&[1])).unwrap();
    h.m.on_request_finished(req).unwrap();
    assert_eq!(h.m.inspect().arc_sizes(), Some((1, 1, 0, 0)));
    // target 0 <= |T1|: the T1 entry (2) is evicted into B1.
    assert_eq!(h.ps(&[3]).unwrap().2, vec![2]);
    assert_eq!(h.m.inspect().arc_sizes(), Some((1, 1, 1, 0)));
    h.cs(&[3], true);
    // A store miss on ghost 2 raises the target by max(1, |B2|/|B1|) = 1.
    assert_eq!(h.ps(&[2]).unwrap().2, vec![3]);
    assert_eq!(h.m.inspect().arc_target(), Some(1.0));
    h.m.inspect().check_invariants().unwrap();
}

/// The hand check of Llama-3-8B in docs/sizing.md (32 full-attention layers, 8 KV heads of
/// 128, bf16, 16-token blocks): 2 MiB per block; 70 GiB hold 35,840 blocks, 70 requests of
/// 8,192 tokens (573,440 tokens); a 100 GiB CPU tier holds 51,200 chunks (819,200 tokens).
pub fn capacity_llama_3_8b() {
    let spec = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
    let layout = GroupedLayout::from_layers(&[spec; 32]).unwrap();
    let pool = PoolLayout::LayerOutermost;
    assert_eq!(layout.bytes_per_block(pool), Ok(2_097_152));
    let w = Workload::new(8192, 2048);
    let gpu = gpu_capacity(
        &layout,
        core::slice::from_ref(&layout),
        pool,
        &w,
        70 << 30,
        None,
    )
    .unwrap();
    assert_eq!(gpu.bytes_per_block, 2_097_152);
    assert_eq!(gpu.num_blocks, 35_840);
    assert_eq!(gpu.blocks_per_request, 512);
    assert_eq!(
        (gpu.max_concurrency.num(), gpu.max_concurrency.den()),
        (70, 1)
    );
    assert_eq!(gpu.kv_cache_size_tokens, 573_440);
    let tier = size_cpu_tier(&CpuTierConfig::new(100 << 30), 2_097_152, &[spec], 8192).unwrap();
    assert_eq!(tier.num_chunks, 51_200);
    assert_eq!(tier.kv_cache_size_tokens, Some(819_200));
}

/// What [`workload`] counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadReport {
    /// Requests run.
    pub requests: u32,
    /// Leading blocks found readable and loaded.
    pub hit_blocks: u64,
    /// Blocks stored.
    pub stored_blocks: u64,
    /// Blocks evicted.
    pub evicted_blocks: u64,
    /// Stores refused for want of room.
    pub store_failures: u64,
    /// Lookup scans that stopped at a pending key.
    pub stopped_at_pending: u64,
    /// The kvtrace-style hit digest: `d = d · 1000003 + k` per request.
    pub digest: u64,
    /// Resident chunks at the end.
    pub resident: u32,
}

/// A deterministic request stream (seeded [`OpRng`](crate::allocator_model::OpRng)) through a
/// manager of `num_chunks` chunks under `policy`: 40 shared prefixes of 4–16 blocks plus 1–12
/// unique blocks per request, two requests in flight (a request's stores complete after the
/// next one has looked up and stored), each following the kvtrace protocol (leading hits
/// loaded, the rest offered, positions `(i + 1) · 16`). The invariants are checked every 64
/// requests. Returns the counts and the heap the manager holds at the end.
pub fn workload(policy: PolicyKind, num_chunks: u32, requests: u32) -> (WorkloadReport, usize) {
    let mut cfg = ManagerConfig::new(num_chunks);
    cfg.policy = policy;
    cfg.max_requests = 4;
    let mut m: OffloadManager = OffloadManager::new(cfg).unwrap();
    let mut rng = crate::allocator_model::OpRng::new(0x6b76_7469_6572);
    let mut r = WorkloadReport {
        requests,
        hit_blocks: 0,
        stored_blocks: 0,
        evicted_blocks: 0,
        store_failures: 0,
        stopped_at_pending: 0,
        digest: 0,
        resident: 0,
    };
    let (mut keys, mut ends) = (Vec::new(), Vec::new());
    let mut previous: Option<(kvtier_core::manager::RequestId, Vec<BlockKey>)> = None;
    for i in 0..requests {
        let family = u64::from(rng.below(40));
        let prefix = 4 + family % 13;
        let suffix = u64::from(1 + rng.below(12));
        keys.clear();
        keys.extend((0..prefix).map(|b| BlockKey::new((family << 32) | b, 0)));
        keys.extend((0..suffix).map(|b| BlockKey::new((1 << 63) | (u64::from(i) << 8) | b, 0)));
        ends.clear();
        ends.extend((1..=keys.len() as u64).map(|b| b * 16));
        let req = m.on_new_request().unwrap();
        let hit = m.pin_hit_prefix(req, &keys, Some(&ends)).unwrap();
        let k = hit.hits;
        r.stopped_at_pending += u64::from(hit.stopped_at_pending);
        if k > 0 {
            m.complete_load(&keys[..k]).unwrap();
        }
        r.hit_blocks += k as u64;
        r.digest = r.digest.wrapping_mul(1_000_003).wrapping_add(k as u64);
        let stored = match store_or_no_room(&mut m, req, &keys[k..], Some(&ends[k..])).unwrap() {
            Some(plan) => {
                r.stored_blocks += plan.keys().len() as u64;
                r.evicted_blocks += plan.evicted().len() as u64;
                plan.keys().to_vec()
            }
            None => {
                r.store_failures += 1;
                Vec::new()
            }
        };
        if let Some((prev, prev_keys)) = previous.replace((req, stored)) {
            m.complete_store(&prev_keys, StoreOutcome::Stored);
            m.on_request_finished(prev).unwrap();
        }
        if i % 64 == 63 {
            m.inspect().check_invariants().unwrap();
        }
    }
    if let Some((prev, prev_keys)) = previous {
        m.complete_store(&prev_keys, StoreOutcome::Stored);
        m.on_request_finished(prev).unwrap();
    }
    m.inspect().check_invariants().unwrap();
    r.resident = m.inspect().allocated();
    (r, m.inspect().heap_bytes())
}
