//! Each decision of the simple scheduler, with the numbers vLLM 0.33.0's code gives.

mod eagle;
mod fine;
mod hybrid;
mod layout;
mod prepare;

use alloc::vec::Vec;

use super::*;
use crate::stats::Gauge;
use crate::stats::catalogue::{
    SIMPLE_INFO, SIMPLE_LOAD_BLOCKS, SIMPLE_PENDING_STORE_BLOCKS, SIMPLE_SAVE_OUTCOMES,
    SIMPLE_USED_BLOCKS,
};

const BS: u32 = 16;

fn gpu(n: u32) -> BlockPool<BlockKey> {
    BlockPool::new(BlockPoolConfig::new(n, true)).unwrap()
}

/// Allocates `hashes.len()` GPU blocks and caches them under `hashes` (group 0).
fn alloc_cached(g: &mut BlockPool<BlockKey>, hashes: &[u64]) -> Vec<u32> {
    let mut ids = Vec::new();
    g.get_new_blocks(len32(hashes.len()), |b| ids.push(b))
        .unwrap();
    let keys: Vec<BlockKey> = hashes.iter().map(|&h| BlockKey::new(h, 0)).collect();
    g.cache_full_blocks(&ids, &keys, 0, len32(ids.len()), BS, None)
        .unwrap();
    ids
}

/// One step with only boundary hand-offs: its store event and store list.
fn handoff_step(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    h: &[Handoff<'_>],
) -> (Option<u64>, Vec<u32>) {
    let step = StepInput {
        handoffs: h,
        ..Default::default()
    };
    let p = s.build_connector_meta(g, &step).unwrap();
    (p.store_event, p.store_gpu_blocks.to_vec())
}

fn sched(cpu_blocks: u32, gpu_blocks: u32) -> SimpleScheduler {
    SimpleScheduler::new(SimpleConfig::with_cpu_blocks(BS, gpu_blocks, cpu_blocks)).unwrap()
}

fn progress(hashes: &[u64], computed: u64) -> Progress<'_> {
    Progress {
        num_computed_tokens: computed,
        num_output_placeholders: 0,
        block_hashes: hashes,
    }
}

fn complete(s: &mut SimpleScheduler, g: &mut BlockPool<BlockKey>, event: u64, count: u32) {
    let stores = [(event, count)];
    let out = WorkerOutput {
        finished_recving: &[],
        completed_stores: &stores,
    };
    s.update_connector_output(g, &out).unwrap();
}

/// Stores `hashes` for request `req` through the eager positional scan, completed.
fn store_all(s: &mut SimpleScheduler, g: &mut BlockPool<BlockKey>, req: u64, hashes: &[u64]) {
    let ids = alloc_cached(g, hashes);
    s.update_state_after_alloc(g, req, &ids, 0).unwrap();
    let sc = [Scheduled {
        req,
        new_block_ids: Some(&[&ids]),
        full_table: true,
        num_scheduled_tokens: 1,
        progress: progress(hashes, u64::from(BS) * hashes.len() as u64),
    }];
    let step = StepInput {
        scheduled: &sc,
        ..Default::default()
    };
    let e = s
        .build_connector_meta(g, &step)
        .unwrap()
        .store_event
        .unwrap();
    complete(s, g, e, 1);
    g.free_blocks(&ids).unwrap();
}

#[test]
fn lookup_caps_aligns_and_pins() {
    let (mut s, mut g) = (sched(8, 16), gpu(16));
    store_all(&mut s, &mut g, 1, &[10, 11]);
    let lookup = |hashes: &'static [u64], num_tokens| LookupRequest {
        req: 2,
        block_hashes: hashes,
        num_tokens,
        skip_reading_prefix_cache: false,
    };
    // 33 tokens: both blocks hit; 32 tokens: the last token is recomputed, one block.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&[10, 11], 33), 0),
        Ok((32, true))
    );
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&[10, 11], 32), 0),
        Ok((16, true))
    );
    // Unaligned computed tokens and a skipping request find nothing.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&[10, 11], 33), 8),
        Ok((0, false))
    );
    let mut skip = lookup(&[10, 11], 33);
    skip.skip_reading_prefix_cache = true;
    assert_eq!(s.get_num_new_matched_tokens(&skip, 0), Ok((0, false)));
    // After 16 computed tokens the remaining hash 11 hits.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&[10, 11], 33), 16),
        Ok((16, true))
    );
    // The retry released the earlier pins: one block pinned, 8 − 1 − 1 free.
    assert_eq!(s.cpu_pool().free_count(), 6);
    // Allocation with 16 external tokens loads one block and releases the pin.
    s.update_state_after_alloc(&mut g, 2, &[0, 5], 16).unwrap();
    assert_eq!(s.cpu_pool().free_count(), 6);
    assert_eq!(g.ref_count(5), Some(1));
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!((plan.load_event, plan.load_gpu_blocks), (Some(0), &[5][..]));
    assert_eq!(s.load_event_requests().collect::<Vec<_>>(), [(0, 2)]);
    let recv = [2];
    let out = WorkerOutput {
        finished_recving: &recv,
        completed_stores: &[],
    };
    s.update_connector_output(&mut g, &out).unwrap();
    let p = s.get_stats();
    assert_eq!(p.counter(SIMPLE_LOAD_BLOCKS, &[]), Some(1));
    assert_eq!(s.cpu_pool().free_count(), 7);
}

#[test]
fn boundary_outcomes_in_vllm_order() {
    // A pool of 3 CPU blocks: 2 usable.
    let (mut s, mut g) = (sched(3, 16), gpu(16));
    let ids = alloc_cached(&mut g, &[1, 2, 3, 4]);
    let mut unhashed = Vec::new();
    g.get_new_blocks(1, |b| unhashed.push(b)).unwrap();
    s.update_state_after_alloc(&mut g, 7, &ids, 0).unwrap();
    // Block ids[0] is already on the CPU: store it first.
    let h0 = [Handoff {
        req: 7,
        gpu_blocks: &ids[..1],
    }];
    let e = handoff_step(&mut s, &mut g, &h0).0.unwrap();
    complete(&mut s, &mut g, e, 1);
    let blocks = [0, unhashed[0], ids[1], ids[1], ids[0], ids[2], ids[3]];
    let h = [
        Handoff {
            req: 7,
            gpu_blocks: &blocks,
        },
        Handoff {
            req: 99,
            gpu_blocks: &ids[..2],
        },
    ];
    let (_, stored) = handoff_step(&mut s, &mut g, &h);
    // Both usable CPU blocks count as free (one holds hash 1, idle): ids[1] is stored, its
    // repeat is in flight, ids[0] is cached, ids[2] takes the last block (evicting hash 1),
    // ids[3] finds the pool full.
    assert_eq!(stored, [ids[1], ids[2]]);
    let p = s.get_stats();
    let c = |o: &str| p.counter(SIMPLE_SAVE_OUTCOMES, &[o]);
    assert_eq!(c("stored"), Some(3));
    assert_eq!(c("dropped_null_block"), Some(1));
    assert_eq!(c("dropped_not_hashed"), Some(1));
    assert_eq!(c("skipped_in_flight"), Some(1));
    assert_eq!(c("skipped_already_cached"), Some(1));
    assert_eq!(c("dropped_cpu_full"), Some(1));
    assert_eq!(c("dropped_request_gone"), Some(2));
    assert_eq!(s.published(), 10);
    assert_eq!(
        p.gauge(SIMPLE_PENDING_STORE_BLOCKS, &[]),
        Some(Gauge::int(2))
    );
    assert_eq!(p.gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(3)));
    // The next drain has no outcome series.
    assert_eq!(s.get_stats().len(), 3);
}

#[test]
fn cursor_scan_confirmed_blocks_and_final_flush() {
    let (mut s, mut g) = (sched(8, 16), gpu(16));
    let hashes = [1, 2, 3, 4];
    let ids = alloc_cached(&mut g, &hashes);
    s.update_state_after_alloc(&mut g, 1, &ids, 0).unwrap();
    // 40 computed tokens: 2 blocks confirmed.
    let sc = |new: Option<Tables<'static>>, computed| Scheduled {
        req: 1,
        new_block_ids: new,
        full_table: false,
        num_scheduled_tokens: 8,
        progress: progress(&hashes, computed),
    };
    let first = [Scheduled {
        new_block_ids: Some(&[&ids]),
        full_table: true,
        ..sc(None, 40)
    }];
    let plan = s
        .build_connector_meta(
            &mut g,
            &StepInput {
                scheduled: &first,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        (plan.store_event, plan.store_gpu_blocks),
        (Some(0), &ids[..2])
    );
    assert_eq!(s.pending_store_blocks(), 2);
    // The finishing request's third confirmed block is flushed with the next step.
    let fin = Finished {
        req: 1,
        block_ids: &[&ids],
        num_prompt_tokens: 48,
        progress: progress(&hashes, 48),
    };
    s.request_finished_all_groups(&mut g, &fin).unwrap();
    assert_eq!(s.pending_store_blocks(), 3);
    assert!(s.is_in_flight(ids[2]));
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(
        (plan.store_event, plan.store_gpu_blocks),
        (Some(1), &ids[2..3])
    );
    complete(&mut s, &mut g, 0, 1);
    complete(&mut s, &mut g, 1, 1);
    assert_eq!(s.pending_store_blocks(), 0);
    assert_eq!(s.cpu_pool().free_count(), 7);
    assert!(!s.is_in_flight(ids[2]));
}

#[test]
fn stores_complete_after_every_worker() {
    let mut c = SimpleConfig::with_cpu_blocks(BS, 16, 8);
    c.world_size = 2;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu(16));
    let ids = alloc_cached(&mut g, &[5]);
    s.update_state_after_alloc(&mut g, 1, &ids, 0).unwrap();
    let h = [Handoff {
        req: 1,
        gpu_blocks: &ids,
    }];
    let e = handoff_step(&mut s, &mut g, &h).0.unwrap();
    complete(&mut s, &mut g, e, 1);
    assert_eq!(s.pending_store_blocks(), 1);
    complete(&mut s, &mut g, e, 1);
    assert_eq!(s.pending_store_blocks(), 0);
    assert_eq!(s.cpu_pool().get_one_block(&BlockKey::new(5, 0)), Some(1));
    let never = [(9, 1)];
    let out = WorkerOutput {
        finished_recving: &[],
        completed_stores: &never,
    };
    assert_eq!(
        s.update_connector_output(&mut g, &out),
        Err(OutputError::UnknownStoreEvent { event: 9 })
    );
}

#[test]
fn reset_abandons_transfers_and_carries_outcomes() {
    let (mut s, mut g) = (sched(8, 16), gpu(16));
    let ids = alloc_cached(&mut g, &[5, 6]);
    s.update_state_after_alloc(&mut g, 1, &ids, 0).unwrap();
    let h = [Handoff {
        req: 1,
        gpu_blocks: &ids[..1],
    }];
    assert_eq!(handoff_step(&mut s, &mut g, &h).0, Some(0));
    // A store in flight: the reset abandons it and reports false.
    assert!(!s.reset(&mut g));
    assert_eq!(s.pending_store_blocks(), 1);
    assert!(!s.is_in_flight(ids[0]));
    // The outcome counted before the reset is still in the next drain.
    let p = s.get_stats();
    assert_eq!(p.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(1));
    // The abandoned store completes: pins released, nothing cached.
    complete(&mut s, &mut g, 0, 1);
    assert_eq!(s.pending_store_blocks(), 0);
    assert_eq!(s.cpu_pool().get_one_block(&BlockKey::new(5, 0)), None);
    assert_eq!(g.ref_count(ids[0]), Some(1));
    // The request's store state is gone: its hand-offs are dropped.
    let h = [Handoff {
        req: 1,
        gpu_blocks: &ids[1..],
    }];
    handoff_step(&mut s, &mut g, &h);
    assert_eq!(s.boundary_total(SaveOutcome::DroppedRequestGone), 1);
    // Nothing outstanding: the pool's cache reset succeeds.
    assert!(s.reset(&mut g));
}

#[test]
fn lazy_walks_the_free_queue_to_target() {
    let mut c = SimpleConfig::with_cpu_blocks(BS, 8, 8);
    c.lazy_offload = true;
    c.max_num_batched_tokens = 64;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu(8));
    assert_eq!(s.target_free(), 8);
    let ids = alloc_cached(&mut g, &[1, 2]);
    g.free_blocks(&ids).unwrap();
    let mut fillers = Vec::new();
    g.get_new_blocks(5, |b| fillers.push(b)).unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.store_gpu_blocks, &ids[..]);
    assert_eq!(plan.store_cpu_blocks, &[1, 2]);
    assert_eq!(s.lazy_cursor(), Some(ids[1]));
    // Both blocks are pinned, out of the queue: the cursor is stale, the walk restarts at the
    // front of an empty queue.
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.store_event, None);
    complete(&mut s, &mut g, 0, 1);
    assert_eq!(s.cpu_pool().get_one_block(&BlockKey::new(2, 0)), Some(2));
    // Lazy stores are not classified.
    assert_eq!(s.published(), 0);
}

#[test]
fn events_name_the_medium() {
    let mut c = SimpleConfig::with_cpu_blocks(BS, 16, 2);
    c.enable_events = true;
    c.backend = Backend::Disk;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu(16));
    store_all(&mut s, &mut g, 1, &[1]);
    let got: Vec<_> = s.take_events().collect();
    let stored = SimpleEvent::Stored {
        key: BlockKey::new(1, 0),
        block_size: BS,
        meta: Some(StoredMeta {
            req: 1,
            parent_hash: None,
            token_start: 0,
        }),
        medium: Medium::Storage,
    };
    assert_eq!(got, [stored]);
    // The next store evicts hash 1 from the one usable block.
    store_all(&mut s, &mut g, 2, &[7]);
    let got: Vec<_> = s.take_events().collect();
    assert_eq!(
        got[0],
        SimpleEvent::Removed {
            key: BlockKey::new(1, 0),
            medium: Medium::Storage
        }
    );
    assert!(s.reset(&mut g));
    assert_eq!(s.take_events().next_back(), Some(SimpleEvent::AllCleared));
    let p = s.get_stats();
    assert_eq!(p.gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(1)));
    assert!(p.series().iter().any(|x| x.name == SIMPLE_INFO));
}

#[test]
fn errors_change_nothing() {
    let (mut s, mut g) = (sched(8, 16), gpu(16));
    let h = [Handoff {
        req: 1,
        gpu_blocks: &[99],
    }];
    assert_eq!(
        s.build_connector_meta(
            &mut g,
            &StepInput {
                handoffs: &h,
                ..Default::default()
            }
        ),
        Err(InputError::GpuBlockOutOfRange { block: 99 })
    );
    assert_eq!(s.published(), 0);
    let mut large = gpu(64);
    assert!(
        s.build_connector_meta(&mut large, &StepInput::default())
            .is_err()
    );
    store_all(&mut s, &mut g, 1, &[1, 2]);
    let look = LookupRequest {
        req: 2,
        block_hashes: &[1, 2],
        num_tokens: 40,
        skip_reading_prefix_cache: false,
    };
    assert_eq!(s.get_num_new_matched_tokens(&look, 0), Ok((32, true)));
    let free = s.cpu_pool().free_count();
    assert_eq!(
        s.update_state_after_alloc(&mut g, 2, &[3, 4], 8),
        Err(AllocStateError::Unaligned {
            num_external_tokens: 8
        })
    );
    assert_eq!(
        s.update_state_after_alloc(&mut g, 2, &[3], 32),
        Err(AllocStateError::TableTooShort { req: 2 })
    );
    assert_eq!(s.cpu_pool().free_count(), free);
    let bytes = s.heap_bytes();
    s.update_state_after_alloc(&mut g, 2, &[3, 4], 32).unwrap();
    assert_eq!(s.heap_bytes(), bytes);
}

#[test]
fn tables_never_grow_under_churn() {
    // Requests and store events come and go far more often than the tables hold entries, with
    // the request table kept near full: tombstones are cleared in place, so the heap stays
    // what construction took.
    const WINDOW: u64 = 27;
    let mut c = SimpleConfig::with_cpu_blocks(BS, 16, 64);
    c.max_requests = 28;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu(16));
    let bytes = s.heap_bytes();
    for r in 0..2000u64 {
        let h = [r % 200 + 1];
        store_all(&mut s, &mut g, r, &h);
        s.request_finished(&mut g, r);
        let look = LookupRequest {
            req: r + 10_000,
            block_hashes: &h,
            num_tokens: 17,
            skip_reading_prefix_cache: false,
        };
        assert_eq!(s.get_num_new_matched_tokens(&look, 0), Ok((16, true)));
        if r >= WINDOW {
            s.request_finished(&mut g, r - WINDOW + 10_000);
        }
        assert_eq!(s.heap_bytes(), bytes, "request {r}");
    }
    assert_eq!(s.pending_store_blocks(), 0);
}

#[test]
fn the_cpu_pool_can_be_seeded_as_vllm_tests_seed_it() {
    // vLLM's scheduler exposes its CPU pool raw; its tests allocate, cache and free blocks
    // there to seed hits. The same through cpu_get_new_blocks, cpu_cache_full_blocks and
    // cpu_free_blocks.
    let mut c = SimpleConfig::with_cpu_blocks(BS, 32, 8);
    c.enable_events = true;
    let mut s = SimpleScheduler::new(c).unwrap();
    let mut got = Vec::new();
    s.cpu_get_new_blocks(3, |b| got.push(b)).unwrap();
    assert_eq!(got, [1, 2, 3]);
    assert!(s.cpu_get_new_blocks(5, |_| {}).is_err(), "4 free");
    let keys: Vec<BlockKey> = [7, 8, 9].iter().map(|&h| BlockKey::new(h, 0)).collect();
    s.cpu_cache_full_blocks(&got, &keys, 0, 2, BS).unwrap();
    s.cpu_free_blocks(&got).unwrap();
    assert_eq!(s.cpu_pool().free_count(), 7);
    let stored: Vec<SimpleEvent> = s.take_events().collect();
    assert_eq!(stored.len(), 2);
    // Blocks 0 and 1 cached: a request of these hashes hits 2 blocks.
    let lookup = LookupRequest {
        req: 1,
        block_hashes: &[7, 8, 9],
        num_tokens: 3 * u64::from(BS) + 1,
        skip_reading_prefix_cache: false,
    };
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup, 0),
        Ok((2 * u64::from(BS), true))
    );
    // A GPU pool smaller than configured is read as it is; a larger one is refused.
    let (mut small, mut large) = (gpu(16), gpu(33));
    assert!(
        s.build_connector_meta(&mut small, &StepInput::default())
            .is_ok()
    );
    assert_eq!(
        s.build_connector_meta(&mut large, &StepInput::default())
            .err(),
        Some(InputError::GpuPoolSize { num_blocks: 33 })
    );
    assert_eq!(
        s.update_state_after_alloc(&mut small, 1, &[16], 0),
        Err(AllocStateError::Input(InputError::GpuBlockOutOfRange {
            block: 16
        }))
    );
}
