//! vLLM 0.33.0's `tests/v1/simple_kv_offload/test_scheduler.py`, ported (stores and loads):
//! each test is the vLLM test of the same name (one full-attention group of 16-token blocks,
//! the CPU pool sized from `_BYTES_PER_BLOCK · num_cpu_blocks`, `max_num_batched_tokens =
//! 64`), asserting the values vLLM asserts. Where vLLM reads a private attribute the assertion
//! goes through the public equivalent named in the test; vLLM hashes tokens with sha256, these
//! prompts use distinct 64-bit hashes. Finishing, reset and sizing: `simple_scenarios_lifecycle`.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::BlockKey;
use kvtier_core::simple::LookupRequest;
use kvtier_tests::simple_fixture::*;

#[test]
fn test_eager_store_and_load_roundtrip() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    let ids = f.register(&mut req, 2);
    let meta = f.step(&[(&req, Some(&ids), true, 32)], &[]);
    assert!(meta.store_event.is_some());
    assert_eq!((meta.store_gpu.len(), meta.store_cpu.len()), (2, 2));
    f.complete_store(meta.store_event);
    let req2 = same_prompt(&req, 2);
    assert_eq!(f.lookup(&req2, 0), (32, true));
    let ids2 = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &ids2, 32)
        .unwrap();
    let meta2 = f.step(&[(&req2, Some(&ids2), true, 1)], &[]);
    assert!(meta2.load_event.is_some());
    assert_eq!(meta2.load_gpu.len(), 2);
}

#[test]
fn test_prompt_logprobs_skip_cpu_cache_lookup() {
    // vLLM reads `_pending_cpu_hits`; the pins are read here off the CPU pool's ref counts.
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    f.store_request(&mut req, 2);
    let retry = same_prompt(&req, 2);
    assert_eq!(f.lookup(&retry, 0), (32, true));
    let pinned: Vec<u32> = req
        .hashes
        .iter()
        .map(|&h| f.s.cpu_pool().get_one_block(&BlockKey::new(h, 0)).unwrap())
        .collect();
    assert!(
        pinned
            .iter()
            .all(|&b| f.s.cpu_pool().ref_count(b) == Some(1))
    );
    let l = LookupRequest {
        req: 2,
        block_hashes: &retry.hashes,
        num_tokens: retry.num_tokens,
        skip_reading_prefix_cache: true,
    };
    assert_eq!(f.s.get_num_new_matched_tokens(&l, 0), Ok((0, false)));
    assert!(
        pinned
            .iter()
            .all(|&b| f.s.cpu_pool().ref_count(b) == Some(0))
    );
}

#[test]
fn test_max_hit_len_cap_drops_last_full_block() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 0);
    assert_eq!(req.num_tokens, 32);
    f.store_request(&mut req, 2);
    assert_eq!(f.lookup(&same_prompt(&req, 2), 0), (16, true));
}

#[test]
fn test_lazy_store_and_load_roundtrip() {
    let mut f = make_scheduler(8, 8, true);
    assert_eq!(f.s.target_free(), 8);
    let old = make_request(1, 2, 1);
    let (meta, fillers) = lazy_offload_old(&mut f, &old);
    assert!(meta.store_event.is_some());
    assert_eq!(meta.store_gpu.len(), 2);
    f.complete_store(meta.store_event);
    f.gpu.free_blocks(&fillers).unwrap();
    let again = same_prompt(&old, 2);
    assert_eq!(f.lookup(&again, 0), (32, true));
    let ids = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &ids, 32)
        .unwrap();
    let meta2 = f.step(&[(&again, None, false, 1)], &[]);
    assert!(meta2.load_event.is_some());
    assert!(!meta2.load_gpu.is_empty());
}

#[test]
fn test_eager_duplicate_store_skipped() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    f.store_request(&mut req, 2);
    let free = f.cpu_free();
    let mut req2 = same_prompt(&req, 2);
    let ids2 = f.register(&mut req2, 2);
    let meta2 = f.step(&[(&req2, Some(&ids2), true, 32)], &[]);
    assert!(meta2.store_cpu.is_empty());
    assert_eq!(f.cpu_free(), free);
}

#[test]
fn test_eager_in_flight_store_dedup_across_steps() {
    // vLLM reads `_in_flight_store_gpu_blocks`; `is_in_flight` is its public reading.
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    let ids = f.register(&mut req, 2);
    let meta1 = f.step(&[(&req, Some(&ids), true, 32)], &[]);
    assert_eq!(meta1.store_cpu.len(), 2);
    assert!(meta1.store_gpu.iter().all(|&b| f.s.is_in_flight(b)));
    let free = f.cpu_free();
    let mut req2 = same_prompt(&req, 2);
    req2.computed = 32;
    f.s.update_state_after_alloc(&mut f.gpu, 2, &ids, 0)
        .unwrap();
    let meta2 = f.step(&[(&req2, Some(&ids), true, 32)], &[]);
    assert!(meta2.store_cpu.is_empty());
    assert_eq!(f.cpu_free(), free);
    f.complete_store(meta1.store_event);
    assert!(ids.iter().all(|&b| !f.s.is_in_flight(b)));
}

#[test]
fn test_lazy_duplicate_store_skipped() {
    let mut f = make_scheduler(8, 8, true);
    let req = make_request(1, 2, 1);
    let (meta1, fillers) = lazy_offload_old(&mut f, &req);
    f.complete_store(meta1.store_event);
    f.gpu.free_blocks(&fillers).unwrap();
    let free = f.cpu_free();
    let (meta2, fillers2) = lazy_offload_old(&mut f, &same_prompt(&req, 2));
    f.gpu.free_blocks(&fillers2).unwrap();
    assert!(meta2.store_cpu.is_empty());
    assert_eq!(f.cpu_free(), free);
}

/// Requests a and b stored into a 5-block pool (4 usable), then c: which two of them remain.
fn evict_with(touch_a: bool) -> [bool; 3] {
    let mut f = make_scheduler(5, 16, false);
    let (mut a, mut b) = (make_request(1, 2, 1), make_request(2, 2, 1));
    let (ta, tb) = (f.register(&mut a, 2), f.register(&mut b, 2));
    let meta = f.step(&[(&a, Some(&ta), true, 32), (&b, Some(&tb), true, 32)], &[]);
    f.complete_store(meta.store_event);
    assert!(a.hashes.iter().chain(&b.hashes).all(|&h| f.cached(h)));
    if touch_a {
        // vLLM touches and frees a's CPU blocks directly; a lookup and a finish do the same.
        assert_eq!(f.lookup(&same_prompt(&a, 9), 0), (32, true));
        f.s.request_finished(&mut f.gpu, 9);
    }
    let mut c = make_request(3, 2, 1);
    let tc = f.register(&mut c, 2);
    let meta2 = f.step(&[(&c, Some(&tc), true, 32)], &[]);
    f.complete_store(meta2.store_event);
    [&a, &b, &c].map(|r| r.hashes.iter().all(|&h| f.cached(h)))
}

#[test]
fn test_lru_eviction_order() {
    assert_eq!(evict_with(false), [false, true, true]);
}

#[test]
fn test_touched_blocks_survive_eviction() {
    assert_eq!(evict_with(true), [true, false, true]);
}

#[test]
fn test_multi_group_null_blocks_skipped() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 2, 1);
    let real = f.alloc_cached(&req, 2);
    let mixed = [real[0], 0];
    req.computed = 32;
    f.s.update_state_after_alloc(&mut f.gpu, 1, &mixed, 0)
        .unwrap();
    let meta = f.step(&[(&req, Some(&mixed), true, 32)], &[]);
    // The nulled slot's hash is still cached on the GPU: that block is stored too.
    assert!(!meta.store_gpu.contains(&0));
    assert_eq!(meta.store_gpu, real);
    f.complete_store(meta.store_event);
    let req2 = same_prompt(&req, 2);
    assert_eq!(f.lookup(&req2, 0), (32, true));
    let ids2 = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &ids2, 32)
        .unwrap();
    let meta2 = f.step(&[(&req2, None, false, 1)], &[]);
    assert!(!meta2.load_gpu.contains(&0));
}

#[test]
fn test_chunked_prefill_reads_live_block_ids() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 4, 1);
    let first = f.register(&mut req, 2);
    let meta1 = f.step(&[(&req, Some(&first), true, 32)], &[]);
    assert_eq!(meta1.store_gpu.len(), 2);
    f.complete_store(meta1.store_event);
    // The second chunk's two new blocks arrive as a cached request's new block ids.
    let keys: Vec<BlockKey> = req.hashes.iter().map(|&h| BlockKey::new(h, 0)).collect();
    let mut table = first.clone();
    table.extend(f.get_new(2));
    f.gpu
        .cache_full_blocks(&table, &keys, 2, 4, BS, None)
        .unwrap();
    req.computed = 64;
    f.s.update_state_after_alloc(&mut f.gpu, 1, &table, 0)
        .unwrap();
    let meta2 = f.step(&[(&req, Some(&table[2..]), false, 32)], &[]);
    assert_eq!(meta2.store_gpu, &table[2..]);
}

/// vLLM runs this for both model runners; each hands the resumed request's whole table
/// (`is_full_table`), so both are the same input here.
fn cursor_after_preemption(same_output: bool) -> Vec<u32> {
    let mut f = make_scheduler(8, 8, false);
    let mut req = make_request(1, 3, 1);
    let initial = f.register(&mut req, 2);
    let m = f.step(&[(&req, Some(&initial), true, 32)], &[]);
    assert_eq!(m.store_gpu.len(), 2);
    f.complete_store(m.store_event);
    if !same_output {
        f.step(&[], &[1]);
    }
    f.gpu.free_blocks(&initial).unwrap();
    let resumed = f.register(&mut req, 3);
    let preempted: &[u64] = if same_output { &[1] } else { &[] };
    let m = f.step(&[(&req, Some(&resumed), true, 48)], preempted);
    assert_eq!(m.store_gpu, [resumed[2]]);
    m.store_gpu
}

#[test]
fn test_eager_store_resets_block_cursor_after_preemption() {
    for same_output in [false, true] {
        assert_eq!(cursor_after_preemption(same_output).len(), 1);
    }
}

#[test]
fn test_eager_store_streaming_session_stores_new_chunks() {
    let mut f = make_scheduler(8, 8, false);
    let mut req = make_request(1, 4, 1);
    let mut table = f.alloc_cached(&req, 2);
    req.computed = 32;
    f.s.update_state_after_alloc(&mut f.gpu, 1, &table, 0)
        .unwrap();
    let first = f.step(&[(&req, Some(&table), true, 32)], &[]);
    assert_eq!(first.store_gpu.len(), 2);
    f.complete_store(first.store_event);
    table.extend(f.get_new(2));
    let keys: Vec<BlockKey> = req.hashes.iter().map(|&h| BlockKey::new(h, 0)).collect();
    f.gpu
        .cache_full_blocks(&table, &keys, 2, 4, BS, None)
        .unwrap();
    req.computed = 64;
    f.s.update_state_after_alloc(&mut f.gpu, 1, &table, 0)
        .unwrap();
    let second = f.step(&[(&req, Some(&table), true, 32)], &[]);
    assert_eq!(second.store_gpu, &table[2..]);
}

#[test]
fn test_partial_gpu_prefix_plus_cpu_load() {
    let mut f = make_scheduler(8, 16, false);
    let mut req = make_request(1, 6, 1);
    f.store_request(&mut req, 6);
    let req2 = same_prompt(&req, 2);
    assert_eq!(f.lookup(&req2, 32), (64, true));
    let mut table = f.alloc_cached(&req2, 2);
    let ext_and_new = f.get_new(4);
    table.extend(&ext_and_new);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &table, 32)
        .unwrap();
    let meta2 = f.step(&[(&req2, Some(&table), true, 32)], &[]);
    assert!(meta2.load_event.is_some());
    assert_eq!(meta2.load_gpu, &ext_and_new[..2]);
}

#[test]
fn test_toctou_cpu_hit_evicted_between_phases_no_crash() {
    let mut f = make_scheduler(5, 16, false);
    let mut a = make_request(1, 2, 1);
    f.store_request(&mut a, 2);
    let b = same_prompt(&a, 2);
    assert_eq!(f.lookup(&b, 0), (32, true));
    let (mut c, mut d) = (make_request(3, 2, 1), make_request(4, 2, 1));
    let (tc, td) = (f.register(&mut c, 2), f.register(&mut d, 2));
    let pressure = f.step(&[(&c, Some(&tc), true, 32), (&d, Some(&td), true, 32)], &[]);
    assert!(pressure.store_event.is_some());
    f.complete_store(pressure.store_event);
    let tb = f.get_new(2);
    f.s.update_state_after_alloc(&mut f.gpu, 2, &tb, 32)
        .unwrap();
    let meta_b = f.step(&[(&b, Some(&tb), true, 1)], &[]);
    assert!(meta_b.load_event.is_some());
    assert_eq!(meta_b.load_gpu.len(), 2);
}
