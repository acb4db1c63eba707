//! vLLM 0.33.0's `tests/v1/simple_kv_offload/test_scheduler.py`, ported (finishing requests,
//! reset, hand-offs of departing requests, pool sizing, lazy `target_free`); see
//! `simple_scenarios` for the conventions.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::BlockKey;
use kvtier_core::simple::{
    ConfigError, GroupSpec, Handoff, NewError, PoolSize, PoolSizing, SimpleConfig, SimpleScheduler,
    StepInput, lazy_target_blocks,
};
use kvtier_core::stats::simple_offload::SaveOutcome;
use kvtier_tests::simple_fixture::*;

#[test]
fn test_finished_eager_stores_are_batched() {
    let mut f = make_scheduler(8, 16, false);
    let mut reqs = [make_request(1, 2, 1), make_request(2, 2, 1)];
    let tables: Vec<Vec<u32>> = reqs.iter_mut().map(|r| f.register(r, 2)).collect();
    for (r, t) in reqs.iter().zip(&tables) {
        f.finish_all(r, t);
    }
    let meta = f.empty_step();
    assert_eq!((meta.store_gpu.len(), meta.store_cpu.len()), (4, 4));
    f.complete_store(meta.store_event);
    assert!(reqs.iter().all(|r| r.hashes.iter().all(|&h| f.cached(h))));
    let cached = same_prompt(&reqs[0], 3);
    assert_eq!(f.lookup(&cached, 0), (32, true));
    let ids = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 3, &ids, 32)
        .unwrap();
    let load = f.step(&[(&cached, Some(&ids), true, 1)], &[]);
    assert!(load.load_event.is_some());
    assert_eq!(load.load_gpu.len(), 2);
}

#[test]
fn test_finished_eager_store_skips_existing_cpu_cache_entries() {
    let mut f = make_scheduler(8, 16, false);
    let mut first = make_request(1, 2, 1);
    let t = f.register(&mut first, 2);
    f.finish_all(&first, &t);
    let e = f.empty_step().store_event;
    f.complete_store(e);
    let free = f.cpu_free();
    let mut dup = same_prompt(&first, 2);
    let t2 = f.register(&mut dup, 2);
    f.finish_all(&dup, &t2);
    assert_eq!(f.empty_step().store_event, None);
    assert_eq!(f.cpu_free(), free);
}

#[test]
fn test_finished_eager_store_is_reported_pending_before_metadata_build() {
    // vLLM also reads `_pending_finished_stores` (empty after the build).
    let mut f = make_scheduler(8, 16, false);
    let mut r = make_request(1, 2, 1);
    let t = f.register(&mut r, 2);
    f.finish_all(&r, &t);
    assert!(f.s.has_pending_stores());
    let meta = f.empty_step();
    assert!(meta.store_event.is_some());
    assert!(f.s.has_pending_stores());
    f.complete_store(meta.store_event);
    assert!(!f.s.has_pending_stores());
}

#[test]
fn test_finished_eager_store_respects_cpu_capacity() {
    let mut f = make_scheduler(3, 16, false);
    let mut r = make_request(1, 3, 1);
    let t = f.register(&mut r, 3);
    let available = f.cpu_free() as usize;
    f.finish_all(&r, &t);
    let meta = f.empty_step();
    assert_eq!(
        (meta.store_gpu.len(), meta.store_cpu.len()),
        (available, available)
    );
    assert_eq!(available, 2);
}

#[test]
fn test_reset_releases_unsubmitted_finished_stores() {
    let mut f = make_scheduler(8, 16, false);
    let mut r = make_request(1, 2, 1);
    let t = f.register(&mut r, 2);
    f.finish_all(&r, &t);
    assert!(f.s.reset(&mut f.gpu));
}

#[test]
fn test_reset_pending_eager_stores() {
    // vLLM also reads the abandoned-store and store-state dicts (private).
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    let ids = f.register(&mut req, 2);
    let meta = f.step(&[(&req, Some(&ids), true, 32)], &[]);
    assert!(meta.store_gpu.iter().all(|&b| f.gpu.ref_count(b) > Some(0)));
    f.gpu.free_blocks(&ids).unwrap();
    assert!(!f.s.reset(&mut f.gpu));
    assert!(f.gpu_used() > 1);
    f.complete_store(meta.store_event);
    assert_eq!(f.gpu_used(), 1);
    assert!(f.gpu.reset_prefix_cache());
    assert!(f.s.reset(&mut f.gpu));
}

#[test]
fn test_reset_pending_lazy_stores() {
    let mut f = make_scheduler(8, 8, true);
    let req = make_request(1, 2, 1);
    let (meta, fillers) = lazy_offload_old(&mut f, &req);
    assert!(meta.store_event.is_some());
    f.gpu.free_blocks(&fillers).unwrap();
    assert!(!f.s.reset(&mut f.gpu));
    assert_eq!(f.s.lazy_cursor(), None);
    f.complete_store(meta.store_event);
    assert!(f.s.reset(&mut f.gpu));
    assert_eq!(f.lookup(&same_prompt(&req, 2), 0), (0, false));
}

#[test]
fn test_reset_releases_pending_cpu_hits() {
    // vLLM fills the CPU pool directly; here the blocks arrive through a completed store.
    for lazy in [false, true] {
        // The lazy walk needs the old blocks within `target_free` of the queue's front.
        let mut f = make_scheduler(8, if lazy { 8 } else { 16 }, lazy);
        let mut req = make_request(1, 2, 1);
        if lazy {
            let (meta, fillers) = lazy_offload_old(&mut f, &req);
            f.complete_store(meta.store_event);
            f.gpu.free_blocks(&fillers).unwrap();
        } else {
            f.store_request(&mut req, 2);
        }
        let r = same_prompt(&req, 2);
        assert_eq!(f.lookup(&r, 0), (32, true));
        let blocks: Vec<u32> = r
            .hashes
            .iter()
            .map(|&h| f.s.cpu_pool().get_one_block(&BlockKey::new(h, 0)).unwrap())
            .collect();
        assert!(
            blocks
                .iter()
                .all(|&b| f.s.cpu_pool().ref_count(b) == Some(1))
        );
        assert!(f.s.reset(&mut f.gpu));
        assert!(
            blocks
                .iter()
                .all(|&b| f.s.cpu_pool().ref_count(b) == Some(0))
        );
        assert_eq!(f.lookup(&r, 0), (0, false));
        assert!(f.s.reset(&mut f.gpu));
    }
}

#[test]
fn test_reset_pending_loads() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    let ids = f.store_request(&mut req, 2);
    let req2 = same_prompt(&req, 2);
    let (hit, _) = f.lookup(&req2, 0);
    assert!(hit > 0);
    let ids2 = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &ids2, hit)
        .unwrap();
    let meta2 = f.step(&[(&req2, Some(&ids2), true, 1)], &[]);
    assert!(meta2.load_event.is_some());
    f.gpu.free_blocks(&ids).unwrap();
    f.gpu.free_blocks(&ids2).unwrap();
    assert!(!f.s.reset(&mut f.gpu));
    assert!(f.gpu_used() > 1);
    assert_eq!(f.s.load_event_requests().count(), 1);
    f.complete_load(2);
    assert_eq!(f.s.load_event_requests().count(), 0);
    assert_eq!(f.gpu_used(), 1);
    assert!(f.s.reset(&mut f.gpu));
}

#[test]
fn test_boundary_handoff_dropped_for_departing_request() {
    // vLLM's test hands off a Mamba block of a hybrid model; here the full-attention block.
    for gone_via in ["preempted", "finished", "unregistered"] {
        let mut f = make_scheduler(8, 16, false);
        let mut req = make_request(1, 2, 1);
        let ids = if gone_via == "unregistered" {
            f.alloc_cached(&req, 2)
        } else {
            f.register(&mut req, 2)
        };
        let h = [Handoff {
            req: 1,
            gpu_blocks: &ids[1..],
        }];
        let one = [1];
        let mut step = StepInput {
            handoffs: &h,
            ..Default::default()
        };
        match gone_via {
            "preempted" => step.preempted = &one,
            "finished" => step.finished = &one,
            _ => {}
        }
        let p = f.s.build_connector_meta(&mut f.gpu, &step).unwrap();
        assert!(!p.store_gpu_blocks.contains(&ids[1]));
        assert_eq!(f.s.boundary_total(SaveOutcome::DroppedRequestGone), 1);
        assert_eq!(f.s.boundary_total(SaveOutcome::Stored), 0);
    }
}

#[test]
fn test_connector_rejects_invalid_explicit_cpu_blocks() {
    // The Python-typed counts (-1, True, 1.5, "4") have no Rust counterpart.
    let sizing = |count, capacity_bytes| PoolSizing {
        capacity_bytes,
        gpu_total_bytes: BYTES_PER_BLOCK * 16,
        size: PoolSize::Explicit(count),
    };
    for (count, capacity) in [
        (0, BYTES_PER_BLOCK * 8),
        (9, BYTES_PER_BLOCK * 8),
        (1, BYTES_PER_BLOCK / 2),
    ] {
        let c = SimpleConfig::new(BS, 16, sizing(count, capacity));
        assert!(matches!(
            SimpleScheduler::new(c),
            Err(NewError::Config(ConfigError::ExplicitBlocks { .. }))
        ));
    }
}

#[test]
fn test_connector_explicit_cpu_blocks_align_uneven_stages() {
    for num_layers in [1, 2] {
        let sizing = PoolSizing {
            capacity_bytes: BYTES_PER_BLOCK * 8,
            gpu_total_bytes: BYTES_PER_BLOCK * 16 * num_layers,
            size: PoolSize::Explicit(4),
        };
        let s = SimpleScheduler::new(SimpleConfig::new(BS, 16, sizing)).unwrap();
        assert_eq!((s.num_cpu_blocks(), s.cpu_pool().num_blocks()), (4, 4));
    }
}

#[test]
fn test_scheduler_uses_worker_aligned_num_cpu_blocks() {
    let sizing = PoolSizing {
        capacity_bytes: 4 * BYTES_PER_BLOCK,
        gpu_total_bytes: 16 * BYTES_PER_BLOCK,
        size: PoolSize::Aligned(1),
    };
    assert_eq!(
        SimpleScheduler::new(SimpleConfig::new(BS, 16, sizing))
            .unwrap()
            .num_cpu_blocks(),
        1
    );
}

#[test]
fn test_cp_lazy_target_blocks_scaling() {
    let fa = [GroupSpec::FullAttention {
        block_size: BS,
        dcp_sharded: true,
    }];
    let base = lazy_target_blocks(&fa, 64, 1).unwrap();
    assert_eq!(base, 8);
    for cp in [2, 4] {
        assert!(lazy_target_blocks(&fa, 64, cp).unwrap() < base);
    }
}
