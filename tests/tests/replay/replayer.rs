//! The replayer: a refused record changes nothing (counts, open requests, the manager's state
//! and stats), and its memory is bounded by the open requests' blocks, 12 bytes each plus the
//! arena's slack.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test code: a failed unwrap is a failed test; sizes are small"
)]

use kvtier_cli::replay::{DEFAULT_MAX_OPEN_BLOCKS, ReplayCounts, ReplayError, Replayer};
use kvtier_cli::trace::Record;
use kvtier_core::BlockKey;
use kvtier_core::manager::{ChunkState, ManagerConfig, ManagerStats, OffloadManager, StoreOutcome};
use kvtier_tests::store::store_or_no_room;

fn replayer(capacity: u32, max_requests: u32) -> Replayer {
    let mut cfg = ManagerConfig::new(capacity);
    cfg.max_requests = max_requests;
    Replayer::new(OffloadManager::new(cfg).unwrap(), 16)
}

/// Everything a caller can observe of a replayer.
#[derive(Debug, PartialEq)]
struct Snapshot {
    counts: ReplayCounts,
    open_requests: usize,
    open_blocks: u64,
    allocated: u32,
    free: u32,
    evictable: u32,
    write_pending: u32,
    live_requests: usize,
    eviction_order: Vec<BlockKey>,
    stats: ManagerStats,
    chunks: Vec<Option<(u32, ChunkState)>>,
}

fn snapshot(r: &Replayer, hashes: &[u64]) -> Snapshot {
    let m = r.manager();
    Snapshot {
        counts: r.counts(),
        open_requests: r.open_requests(),
        open_blocks: r.open_blocks(),
        allocated: m.inspect().allocated(),
        free: m.inspect().free_chunks(),
        evictable: m.inspect().evictable(),
        write_pending: m.inspect().write_pending(),
        live_requests: m.live_requests(),
        eviction_order: m.inspect().eviction_order(),
        stats: m.clone().take_stats(),
        chunks: hashes
            .iter()
            .map(|&h| m.inspect().chunk(&BlockKey::new(h, 0)))
            .collect(),
    }
}

/// Applies `records` in order; at the first error, checks that the record changed nothing and
/// returns the error with the record's index.
fn first_error(r: &mut Replayer, records: &[Record<'_>]) -> Option<(usize, ReplayError)> {
    let every: Vec<u64> = records
        .iter()
        .flat_map(|rec| match *rec {
            Record::Load { hashes, .. } => hashes.to_vec(),
            _ => Vec::new(),
        })
        .collect();
    for (i, &rec) in records.iter().enumerate() {
        let before = snapshot(r, &every);
        if let Err(e) = r.apply(rec) {
            assert_eq!(
                snapshot(r, &every),
                before,
                "record {i} ({rec}) changed state: {e}"
            );
            return Some((i, e));
        }
    }
    None
}

const A: u64 = 0xa;
const B: u64 = 0xb;
const C: u64 = 0xc;

/// Request 0 stores A, then request 1 arrives with `hashes`, starts and completes.
fn after_a_is_stored(hashes: &[u64]) -> [Record<'_>; 6] {
    [
        Record::Load {
            rid: 0,
            hashes: &[A],
        },
        Record::Start { rid: 0 },
        Record::Complete { rid: 0 },
        Record::Load { rid: 1, hashes },
        Record::Start { rid: 1 },
        Record::Complete { rid: 1 },
    ]
}

#[test]
fn a_repeated_hash_in_the_store_part_is_refused_at_the_load_unchanged() {
    let mut r = replayer(8, 16);
    // Request 1 hits A and would offer [B, B] to prepare_store.
    let records = after_a_is_stored(&[A, B, B]);
    let (at, e) = first_error(&mut r, &records).unwrap();
    assert_eq!(at, 3, "refused at the L, before any pin");
    assert_eq!(
        e,
        ReplayError::RepeatedHash {
            rid: 1,
            hash: B,
            first: 2,
            repeat: 3
        }
    );
    // The refused request never opened: its S is unknown, and a fixed request replays.
    assert_eq!(
        r.apply(Record::Start { rid: 1 }),
        Err(ReplayError::UnknownRequest(1))
    );
    for rec in [
        Record::Load {
            rid: 1,
            hashes: &[A, B, C],
        },
        Record::Start { rid: 1 },
        Record::Complete { rid: 1 },
    ] {
        r.apply(rec).unwrap();
    }
    let c = r.counts();
    assert_eq!((c.requests, c.hit_blocks, c.stored_blocks), (2, 1, 3));
    assert_eq!(r.manager().inspect().evictable(), 3);
    r.manager().inspect().check_invariants().unwrap();
}

#[test]
fn a_repeat_within_the_hits_is_not_an_offer_and_replays() {
    let mut r = replayer(8, 16);
    // A, A hit (k = 2); the offer is [B] alone.
    let records = after_a_is_stored(&[A, A, B]);
    assert_eq!(first_error(&mut r, &records), None);
    assert_eq!(r.counts().hit_blocks, 2);
    assert_eq!(r.counts().stored_blocks, 2);
}

#[test]
fn limits_and_order_errors_change_nothing() {
    // max_requests 1: a second request in flight is refused.
    let mut r = replayer(8, 1);
    let records = [
        Record::Load {
            rid: 0,
            hashes: &[A],
        },
        Record::Load {
            rid: 1,
            hashes: &[B],
        },
    ];
    assert_eq!(
        first_error(&mut r, &records),
        Some((
            1,
            ReplayError::TooManyRequests {
                rid: 1,
                max_requests: 1
            }
        ))
    );
    // Open blocks: 3 allowed, the second request would make 4.
    let mut r = replayer(8, 16).with_max_open_blocks(3);
    let records = [
        Record::Load {
            rid: 0,
            hashes: &[A, B],
        },
        Record::Load {
            rid: 1,
            hashes: &[C, 0xd],
        },
    ];
    assert_eq!(
        first_error(&mut r, &records),
        Some((
            1,
            ReplayError::TooManyOpenBlocks {
                rid: 1,
                blocks: 2,
                open: 2,
                max_open_blocks: 3
            }
        ))
    );
    // Order errors.
    let mut r = replayer(8, 16);
    let records = [
        Record::Load {
            rid: 0,
            hashes: &[A],
        },
        Record::Complete { rid: 0 },
    ];
    assert_eq!(
        first_error(&mut r, &records),
        Some((1, ReplayError::OutOfOrder(0)))
    );
    let records = [Record::Load {
        rid: 0,
        hashes: &[B],
    }];
    assert_eq!(
        first_error(&mut r, &records),
        Some((0, ReplayError::DuplicateRequest(0)))
    );
    assert_eq!(DEFAULT_MAX_OPEN_BLOCKS, 16 * 1024 * 1024);
}

#[test]
fn memory_is_eight_bytes_per_open_block_plus_slack_and_does_not_grow_with_the_trace() {
    // 32 requests in flight, 2,048 unique blocks each, for 2,000 requests.
    let mut r = replayer(1024, 64);
    let blocks = 2048u64;
    let hashes = |rid: u64| -> Vec<u64> { (0..blocks).map(|i| (rid << 20) | i).collect() };
    let mut peak_open = 0;
    let mut heap_at = Vec::new();
    for rid in 0..2000u64 {
        r.apply(Record::Load {
            rid,
            hashes: &hashes(rid),
        })
        .unwrap();
        if rid >= 16 {
            r.apply(Record::Start { rid: rid - 16 }).unwrap();
        }
        if rid >= 32 {
            r.apply(Record::Complete { rid: rid - 32 }).unwrap();
        }
        peak_open = peak_open.max(r.open_blocks());
        if rid == 1000 || rid == 1999 {
            heap_at.push(r.heap_bytes());
        }
    }
    // Measured after each step's C: 32 open; 33 for a moment after each L.
    assert_eq!(peak_open, 32 * blocks);
    let peak_open = 33 * blocks;
    // The arena: at most 4 × 12 B (hash and slot) per open block; scratch: one request's keys (16 B) and
    // positions (8 B); the maps: a few KiB.
    let bound = 4 * 12 * peak_open + 24 * blocks + 64 * 1024;
    assert!(heap_at[1] as u64 <= bound, "{} > {bound}", heap_at[1]);
    // Reused, not grown: as much after 2,000 requests as after 1,000.
    assert_eq!(heap_at[0], heap_at[1]);
}

// ---------------------------------------------------------------------------------------------
// Proptest: the replayer against a plain reference (per-request vectors of keys, the protocol
// of docs/formats/kvtrace.md written out), on random interleavings with few distinct hashes, so that
// hits, pending stops, evictions, store failures, repeated hashes and the open-block limit all
// occur.

use std::collections::BTreeMap;

use kvtier_core::manager::{LookupResult, PolicyKind, RequestId};
use proptest::prelude::*;

struct RefOpen {
    req: RequestId,
    keys: Vec<BlockKey>,
    hits: usize,
    started: bool,
    stored: Vec<BlockKey>,
}

/// The reference replayer.
struct Reference {
    m: OffloadManager,
    open: BTreeMap<u64, RefOpen>,
    counts: ReplayCounts,
    max_open_blocks: u64,
}

impl Reference {
    fn open_blocks(&self) -> u64 {
        self.open.values().map(|o| o.keys.len() as u64).sum()
    }

    /// Whether the record was accepted.
    fn apply(&mut self, rec: Record<'_>) -> bool {
        let pos = |from: usize, to: usize| -> Vec<u64> {
            (from as u64 + 1..=to as u64).map(|i| i * 16).collect()
        };
        match rec {
            Record::Load { rid, hashes } => {
                if self.open.contains_key(&rid)
                    || self.open_blocks() + hashes.len() as u64 > self.max_open_blocks
                {
                    return false;
                }
                let keys: Vec<BlockKey> = hashes.iter().map(|&h| BlockKey::new(h, 0)).collect();
                let mut k = 0;
                let mut pending = false;
                for key in &keys {
                    match self.m.lookup(key) {
                        LookupResult::Hit => k += 1,
                        LookupResult::HitPending => {
                            pending = true;
                            break;
                        }
                        LookupResult::Miss => break,
                    }
                }
                let offer = &hashes[k..];
                if (0..offer.len()).any(|i| offer[..i].contains(&offer[i])) {
                    return false;
                }
                let req = self.m.on_new_request().unwrap();
                if k > 0 {
                    self.m
                        .prepare_load(req, &keys[..k], Some(&pos(0, k)))
                        .unwrap();
                    self.counts.hit_requests += 1;
                }
                self.counts.stopped_at_pending += u64::from(pending);
                self.counts.requests += 1;
                self.counts.request_blocks += keys.len() as u64;
                self.counts.hit_blocks += k as u64;
                self.counts.digest = self
                    .counts
                    .digest
                    .wrapping_mul(1_000_003)
                    .wrapping_add(k as u64);
                self.open.insert(
                    rid,
                    RefOpen {
                        req,
                        keys,
                        hits: k,
                        started: false,
                        stored: Vec::new(),
                    },
                );
                true
            }
            Record::Start { rid } => {
                let Some(o) = self.open.get_mut(&rid) else {
                    return false;
                };
                if o.started {
                    return false;
                }
                o.started = true;
                let k = o.hits;
                if k > 0 {
                    self.m.complete_load(&o.keys[..k]).unwrap();
                }
                if k < o.keys.len() {
                    let n = o.keys.len();
                    match store_or_no_room(&mut self.m, o.req, &o.keys[k..], Some(&pos(k, n)))
                        .unwrap()
                    {
                        Some(plan) => {
                            self.counts.stored_blocks += plan.keys().len() as u64;
                            self.counts.evicted_blocks += plan.evicted().len() as u64;
                            o.stored = plan.keys().to_vec();
                        }
                        None => self.counts.store_failures += 1,
                    }
                }
                true
            }
            Record::Complete { rid } => {
                if !self.open.get(&rid).is_some_and(|o| o.started) {
                    return false;
                }
                let o = self.open.remove(&rid).unwrap();
                if !o.stored.is_empty() {
                    self.m.complete_store(&o.stored, StoreOutcome::Stored);
                }
                self.m.on_request_finished(o.req).unwrap();
                true
            }
        }
    }
}

/// A random trace: each of `rids` requests' L (with 1 to 6 hashes from `0..alphabet`), S and C
/// at random but ordered positions.
fn random_trace(rids: u64, alphabet: u64) -> impl Strategy<Value = Vec<(u8, u64, Vec<u64>)>> {
    (
        proptest::collection::vec(any::<u32>(), (rids * 3) as usize),
        proptest::collection::vec(proptest::collection::vec(0..alphabet, 1..7), rids as usize),
    )
        .prop_map(|(keys, hashes)| {
            kvtier_tests::trace_order::interleave(&keys)
                .into_iter()
                .map(|(op, rid)| (op, rid, hashes[rid as usize].clone()))
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replayer_matches_the_reference(
        trace in random_trace(24, 14),
        capacity in 2u32..10,
        arc in any::<bool>(),
        max_open_blocks in 6u64..40,
    ) {
        let mut cfg = ManagerConfig::new(capacity);
        cfg.policy = if arc { PolicyKind::Arc } else { PolicyKind::Lru };
        cfg.max_requests = 64;
        let mut r = Replayer::new(OffloadManager::new(cfg).unwrap(), 16)
            .with_max_open_blocks(max_open_blocks);
        let mut reference = Reference {
            m: OffloadManager::new(cfg).unwrap(),
            open: BTreeMap::new(),
            counts: ReplayCounts::default(),
            max_open_blocks,
        };
        for (op, rid, hashes) in &trace {
            let rec = match op {
                0 => Record::Load { rid: *rid, hashes },
                1 => Record::Start { rid: *rid },
                _ => Record::Complete { rid: *rid },
            };
            let accepted = r.apply(rec).is_ok();
            prop_assert_eq!(accepted, reference.apply(rec), "{}", rec);
            prop_assert_eq!(r.counts(), reference.counts);
            prop_assert_eq!(r.open_requests(), reference.open.len());
            prop_assert_eq!(r.open_blocks(), reference.open_blocks());
            let (m, want) = (r.manager(), &reference.m);
            prop_assert_eq!(m.inspect().allocated(), want.inspect().allocated());
            prop_assert_eq!(m.inspect().evictable(), want.inspect().evictable());
            prop_assert_eq!(m.inspect().write_pending(), want.inspect().write_pending());
            prop_assert_eq!(m.inspect().eviction_order(), want.inspect().eviction_order());
            m.inspect().check_invariants().unwrap();
        }
    }
}

#[test]
fn a_repeated_hash_in_a_long_store_part_is_found_as_in_a_short_one() {
    // Past 256 hashes the replayer checks through a map instead of its bit filter: the same
    // first repeat is reported either way.
    for len in [8u64, 32, 33, 200, 254, 255, 256, 600] {
        let mut hashes: Vec<u64> = (0..len).map(|i| 1_000 + i).collect();
        hashes.push(1_000 + len / 2);
        hashes.push(1_000 + 1);
        let mut r = replayer(1024, 16);
        let e = r.apply(Record::Load {
            rid: 7,
            hashes: &hashes,
        });
        assert_eq!(
            e,
            Err(ReplayError::RepeatedHash {
                rid: 7,
                hash: 1_000 + len / 2,
                first: len / 2 + 1,
                repeat: len + 1
            }),
            "{len} distinct hashes before the repeats"
        );
        assert_eq!(r.open_requests(), 0);
    }
}
