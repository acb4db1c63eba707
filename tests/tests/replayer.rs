//! The replayer: a refused record changes nothing (counts, open requests, the manager's state
//! and stats), and its memory is bounded by the open requests' blocks, 8 bytes each plus the
//! arena's slack.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier::replay::{DEFAULT_MAX_OPEN_BLOCKS, ReplayCounts, ReplayError, Replayer};
use kvtier::trace::Record;
use kvtier_core::BlockKey;
use kvtier_core::manager::{ChunkState, ManagerConfig, ManagerStats, OffloadManager};

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
        allocated: m.allocated(),
        free: m.free_chunks(),
        evictable: m.evictable(),
        write_pending: m.write_pending(),
        live_requests: m.live_requests(),
        eviction_order: m.eviction_order(),
        stats: m.clone().get_stats(),
        chunks: hashes
            .iter()
            .map(|&h| m.chunk(&BlockKey::new(h, 0)))
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
    assert_eq!(r.manager().evictable(), 3);
    r.manager().check_invariants().unwrap();
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
    // The arena: at most 4 × 8 B per open block; scratch: one request's keys (16 B) and
    // positions (8 B); the maps: a few KiB.
    let bound = 4 * 8 * peak_open + 24 * blocks + 64 * 1024;
    assert!(heap_at[1] as u64 <= bound, "{} > {bound}", heap_at[1]);
    // Reused, not grown: as much after 2,000 requests as after 1,000.
    assert_eq!(heap_at[0], heap_at[1]);
}
