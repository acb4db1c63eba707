//! `prepare_store_specs`: the store half of `build_connector_meta`, its stores carried into
//! the next store event (vLLM leaves them in none) or released by `reset`.

use alloc::vec::Vec;

use super::hybrid::{BS, cached, gpu};
use crate::simple::*;

const HASHES: [u64; 3] = [11, 12, 13];

/// Request 1 (hashes `HASHES`, three cached GPU blocks) tracked and request 2 tracked with
/// one hand-off block of its own; the step scheduling request 1's whole table and handing
/// request 2's block and request 1's last block off.
fn setup() -> (SimpleScheduler, BlockPool<BlockKey>, Vec<u32>, u32) {
    let mut g = gpu(16);
    let mut s = SimpleScheduler::new(SimpleConfig::with_cpu_blocks(BS, 16, 8)).unwrap();
    let keys: Vec<BlockKey> = HASHES.iter().map(|&h| BlockKey::new(h, 0)).collect();
    let ids = cached(&mut g, &keys);
    let other = cached(&mut g, &[BlockKey::new(99, 0)])[0];
    s.update_state_after_alloc(&mut g, 1, &ids, 0).unwrap();
    s.update_state_after_alloc(&mut g, 2, &[], 0).unwrap();
    (s, g, ids, other)
}

/// Request 1 scheduled with its whole table, its three blocks computed.
fn scan<'a>(tables: &'a [&'a [u32]]) -> Scheduled<'a> {
    Scheduled {
        req: 1,
        new_block_ids: Some(tables),
        full_table: true,
        num_scheduled_tokens: 1,
        progress: Progress {
            num_computed_tokens: 3 * u64::from(BS),
            num_output_placeholders: 0,
            block_hashes: &HASHES,
        },
    }
}

#[test]
fn prepare_plans_what_build_stores_and_the_next_event_issues_it() {
    let (mut a, mut ga, ids, other) = setup();
    let (mut b, mut gb) = (a.clone(), ga.clone());
    let tables: [&[u32]; 1] = [&ids];
    let h = [
        Handoff {
            req: 2,
            gpu_blocks: &[other],
        },
        Handoff {
            req: 1,
            gpu_blocks: &ids[2..],
        },
    ];
    let sc = [scan(&tables)];
    let input = StepInput {
        handoffs: &h,
        scheduled: &sc,
        ..Default::default()
    };
    let built = b.build_connector_meta(&mut gb, &input).unwrap();
    let (want_gpu, want_cpu) = (
        built.store_gpu_blocks.to_vec(),
        built.store_cpu_blocks.to_vec(),
    );
    assert_eq!(built.store_event, Some(0));
    // Request 2's hand-off, request 1's hand-off (its last block), then request 1's scan of
    // the two blocks before it (the last is in flight).
    assert_eq!(want_gpu, [other, ids[2], ids[0], ids[1]]);
    let p = a.prepare_store_specs(&mut ga, &input).unwrap();
    assert_eq!(p.gpu_blocks, want_gpu);
    assert_eq!(p.cpu_blocks, want_cpu);
    assert_eq!(p.requests, [2, 1]);
    // Planned, pinned and counted as pending, but in no event yet.
    assert_eq!(a.pending_store_blocks(), b.pending_store_blocks());
    assert_eq!(a.cpu_pool().free_count(), b.cpu_pool().free_count());
    assert_eq!(ga.ref_count(ids[0]), gb.ref_count(ids[0]));
    assert_eq!(a.boundary_total(SaveOutcome::Stored), 2);
    assert_eq!(a.store_event_state(0), None);
    // The next step (nothing new to store) issues them as store event 0.
    let empty = StepInput::default();
    let next = a.build_connector_meta(&mut ga, &empty).unwrap();
    assert_eq!(next.store_event, Some(0));
    assert_eq!(next.store_gpu_blocks, want_gpu);
    assert_eq!(next.store_cpu_blocks, want_cpu);
    assert_eq!(
        b.build_connector_meta(&mut gb, &empty).unwrap().store_event,
        None
    );
    // Completing it leaves both schedulers alike.
    for (s, g) in [(&mut a, &mut ga), (&mut b, &mut gb)] {
        let done = [(0, 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &done,
        };
        s.update_connector_output(g, &out).unwrap();
        assert_eq!(s.pending_store_blocks(), 0);
    }
    assert_eq!(a.cpu_pool().free_count(), b.cpu_pool().free_count());
    assert_eq!(a.get_stats(), b.get_stats());
    for k in [99, 11, 12, 13] {
        assert!(
            a.cpu_pool().get_one_block(&BlockKey::new(k, 0)).is_some(),
            "{k}"
        );
    }
    assert_eq!(ga.free_count(), gb.free_count());
}

#[test]
fn reset_releases_prepared_stores() {
    let (mut s, mut g, ids, _) = setup();
    let (cpu_free, gpu_free) = (s.cpu_pool().free_count(), g.free_count());
    let tables: [&[u32]; 1] = [&ids];
    let sc = [scan(&tables)];
    let input = StepInput {
        scheduled: &sc,
        ..Default::default()
    };
    assert_eq!(
        s.prepare_store_specs(&mut g, &input)
            .unwrap()
            .gpu_blocks
            .len(),
        3
    );
    assert_eq!(s.pending_store_blocks(), 3);
    assert_eq!(s.cpu_pool().free_count(), cpu_free - 3);
    assert!(s.reset(&mut g));
    assert_eq!(s.pending_store_blocks(), 0);
    assert_eq!(s.cpu_pool().free_count(), cpu_free);
    assert_eq!(g.free_count(), gpu_free);
    assert!(!s.has_pending_stores());
}

#[test]
fn prepare_refuses_what_build_refuses_and_changes_nothing() {
    let (mut s, mut g, _, _) = setup();
    let before = s.clone();
    let bad = [Handoff {
        req: 1,
        gpu_blocks: &[999],
    }];
    let input = StepInput {
        handoffs: &bad,
        ..Default::default()
    };
    assert_eq!(
        s.prepare_store_specs(&mut g, &input).err(),
        Some(InputError::GpuBlockOutOfRange { block: 999 })
    );
    assert_eq!(s.pending_store_blocks(), before.pending_store_blocks());
    assert_eq!(s.cpu_pool().free_count(), before.cpu_pool().free_count());
}
