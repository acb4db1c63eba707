//! Groups with their own block sizes and fine-grained (hash-block) hits: the hit search at
//! hash granularity, per-group loads, secondary hashes copied with a store (and their events),
//! and the finishing request's partial tail. Numbers derived by hand from vLLM 0.33.0's
//! coordinator, managers and `SimpleCPUOffloadScheduler`.

use alloc::vec::Vec;

use super::hybrid::{first_step, hand_off, lookup};
use crate::simple::*;

/// The hash block.
const H: u32 = 16;
const FA: GroupKind = GroupKind::FullAttention;
const MAMBA: GroupKind = GroupKind::Mamba;

/// Full attention and Mamba, each with `fa` / `mamba` tokens per block, the scheduler's block
/// the larger, hashed every `H` tokens.
fn config(fa: u32, mamba: u32, cpu_blocks: u32) -> SimpleConfig {
    let mut c = SimpleConfig::with_cpu_blocks(fa.max(mamba), 64, cpu_blocks);
    c.hash_block_size = Some(H);
    c.layout = Layout::new(&[FA, MAMBA])
        .and_then(|l| l.with_block_size(0, fa))
        .and_then(|l| l.with_block_size(1, mamba))
        .unwrap();
    c
}

fn gpu_pool(n: u32, secondary: u32) -> BlockPool<BlockKey> {
    let mut c = BlockPoolConfig::new(n, true);
    c.secondary_capacity = secondary;
    BlockPool::new(c).unwrap()
}

fn a(h: u64) -> BlockKey {
    BlockKey::new(h, 0)
}
fn m(h: u64) -> BlockKey {
    BlockKey::new(h, 1)
}

fn cpu_block(s: &SimpleScheduler, k: BlockKey) -> u32 {
    s.cpu_pool().get_one_block(&k).unwrap()
}

/// Turns `req`'s pending hit into a load of `external` tokens into `tables` and issues it:
/// the load's GPU and CPU blocks.
fn load(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    req: u64,
    tables: Tables<'_>,
    external: u64,
) -> (Vec<u32>, Vec<u32>) {
    s.update_state_after_alloc_groups(g, req, tables, external)
        .unwrap();
    let plan = s.build_connector_meta(g, &StepInput::default()).unwrap();
    (plan.load_gpu_blocks.to_vec(), plan.load_cpu_blocks.to_vec())
}

/// Hashes 1..=8: 128 tokens.
const HASHES: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

#[test]
fn block_sizes_and_fine_hits_follow_vllm_checks() {
    let fine = |c: &SimpleConfig| c.validate().map(|v| v.partial_hash_hits);
    // A Mamba block larger than the hash block: fine-grained hits in eager mode only.
    let mut c = config(64, 64, 8);
    assert_eq!(fine(&c), Ok(true));
    assert_eq!(c.validate().map(|v| v.hash_blocks_per_block), Ok(4));
    assert_eq!(c.validate().map(|v| v.secondary_capacity), Ok(8 * 3));
    c.lazy_offload = true;
    assert_eq!(fine(&c), Ok(false));
    // A Mamba block of the hash block: only under DCP.
    let mut c = config(128, 16, 8);
    assert_eq!(fine(&c), Ok(false));
    c.dcp_world_size = 2;
    assert_eq!(fine(&c), Ok(true));
    // A sliding window looks up whole blocks: fine hits only when its block is the hash's.
    let sw = GroupKind::SlidingWindow { window: 64 };
    let mut c = config(64, 64, 8);
    c.layout = Layout::new(&[FA, MAMBA, sw]).unwrap();
    assert_eq!(fine(&c), Ok(false));
    c.layout = c.layout.with_block_size(2, 16).unwrap();
    assert_eq!(fine(&c), Ok(true));
    let bad = |c: &SimpleConfig| matches!(c.validate(), Err(ConfigError::BlockSizes { .. }));
    // Hash block not dividing the scheduler's; a group block not dividing it; a group block
    // not a multiple of the hash block; a chunked-local block off the alignment.
    let mut c = config(64, 64, 8);
    c.hash_block_size = Some(24);
    assert!(bad(&c));
    let mut c = config(64, 64, 8);
    c.layout = c.layout.with_block_size(0, 48).unwrap();
    assert!(bad(&c));
    let mut c = config(64, 64, 8);
    c.hash_block_size = Some(32);
    c.layout = c.layout.with_block_size(0, 16).unwrap();
    assert!(bad(&c));
    // A chunked-local group of 64-token blocks keeps fine hits off (alignment 64); of 16, with
    // fine hits on, it is the alignment; without Mamba it is not.
    let chunked = GroupKind::ChunkedLocal { chunk: 64 };
    let mut c = config(64, 64, 8);
    c.layout = Layout::new(&[FA, MAMBA, chunked]).unwrap();
    assert_eq!(fine(&c), Ok(false));
    c.layout = c.layout.with_block_size(2, 16).unwrap();
    assert_eq!(fine(&c), Ok(true));
    c.layout = Layout::new(&[FA, chunked])
        .and_then(|l| l.with_block_size(1, 16))
        .unwrap();
    assert!(bad(&c), "chunk block 16 is not the alignment 64");
    // One group hashes at its block size.
    let mut c = SimpleConfig::with_cpu_blocks(64, 64, 8);
    c.hash_block_size = Some(16);
    assert!(bad(&c));
    assert_eq!(
        Layout::dense().with_block_size(1, 16),
        Err(ConfigError::Layout {
            why: "a block size for a group the layout does not have"
        })
    );
}

#[test]
fn a_fine_hit_ends_inside_the_attention_block_at_a_mamba_state() {
    let mut s = SimpleScheduler::new(config(64, 64, 16)).unwrap();
    let mut g = gpu_pool(32, 0);
    // Attention: block 0 whole (key at 64 tokens) and a partial entry at 96 tokens; Mamba:
    // the state at 96 tokens.
    hand_off(&mut s, &mut g, 1, &[a(4), a(6), m(6)]);
    // 129 tokens: at most 128. Attention: block 0, then block 1's boundaries from 112 down:
    // 96 held. Mamba: the last state at or below 96: 96.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 129), 0),
        Ok((96, true))
    );
    for k in [a(4), a(6), m(6)] {
        assert_eq!(s.cpu_pool().ref_count(cpu_block(&s, k)), Some(1), "pinned");
    }
    // All 96 tokens: attention's two entries into blocks 10, 11; Mamba's entry 1 (entry 0 is
    // padding) into block 21.
    let want = [a(4), a(6), m(6)].map(|k| cpu_block(&s, k));
    let (gpu, cpu) = load(&mut s, &mut g, 9, &[&[10, 11], &[20, 21]], 96);
    assert_eq!(gpu, [10, 11, 21]);
    assert_eq!(cpu, want);
    // The scheduler takes 32 tokens of it (hash-aligned): attention's first entry only, and
    // no Mamba state (its entry 0 is padding).
    hand_off(&mut s, &mut g, 1, &[]);
    assert_eq!(
        s.get_num_new_matched_tokens(
            &LookupRequest {
                req: 8,
                ..lookup(&HASHES, 129)
            },
            0
        ),
        Ok((96, true))
    );
    let (gpu, _) = load(&mut s, &mut g, 8, &[&[12, 13], &[22, 23]], 32);
    assert_eq!(gpu, [12]);
    assert_eq!(
        s.cpu_pool().ref_count(cpu_block(&s, a(6))),
        Some(1),
        "only the first load holds it now"
    );
    // External tokens must be hash-aligned.
    assert_eq!(
        s.get_num_new_matched_tokens(
            &LookupRequest {
                req: 7,
                ..lookup(&HASHES, 129)
            },
            0
        ),
        Ok((96, true))
    );
    assert_eq!(
        s.update_state_after_alloc_groups(&mut g, 7, &[&[14, 15], &[24, 25]], 40),
        Err(AllocStateError::Unaligned {
            num_external_tokens: 40
        })
    );
}

#[test]
fn without_fine_hits_the_hit_ends_on_a_scheduler_block() {
    let mut c = config(64, 64, 16);
    c.lazy_offload = true;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu_pool(32, 0));
    // Seeded through the CPU pool's public methods (lazy mode has no hand-offs).
    let keys = [a(4), a(6), m(6), m(4)];
    let mut got = Vec::new();
    s.cpu_get_new_blocks(4, |b| got.push(b)).unwrap();
    for (b, k) in got.iter().zip(keys) {
        s.cpu_cache_full_blocks(&[*b], &[k], 0, 1, 64).unwrap();
    }
    s.cpu_free_blocks(&got).unwrap();
    // Attention stops at block 0 (64 tokens); Mamba's state at 96 is not a block end, 64 is.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 129), 0),
        Ok((64, true))
    );
    let _ = &mut g;
}

#[test]
fn a_mamba_cut_keeps_the_attention_blocks_the_search_found() {
    let mut s = SimpleScheduler::new(config(64, 64, 16)).unwrap();
    let mut g = gpu_pool(32, 0);
    // Attention holds both blocks whole (and the partial entry at 96, never reached); Mamba
    // the state at 96.
    hand_off(&mut s, &mut g, 1, &[a(4), a(8), a(6), m(6)]);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 129), 0),
        Ok((96, true))
    );
    // Attention's list is cut to cdiv(96, 64) = 2 entries: the whole block 1 found by the
    // search, not the partial entry.
    let want = [a(4), a(8), m(6)].map(|k| cpu_block(&s, k));
    let (_, cpu) = load(&mut s, &mut g, 9, &[&[10, 11], &[20, 21]], 96);
    assert_eq!(cpu, want);
    assert_eq!(s.cpu_pool().ref_count(cpu_block(&s, a(6))), Some(0));
    // After 64 computed tokens the remaining hashes start at hash 4 (64 / 16).
    hand_off(&mut s, &mut g, 1, &[m(7)]);
    assert_eq!(
        s.get_num_new_matched_tokens(
            &LookupRequest {
                req: 8,
                ..lookup(&HASHES, 129)
            },
            64
        ),
        Ok((48, true))
    );
}

/// The DCP geometry of vLLM's partial-tail tests: attention blocks of 128 tokens (64 · DCP 2),
/// Mamba and hash blocks of 16, a 5-hash-block prompt (81 tokens).
fn dcp_tail() -> (SimpleScheduler, BlockPool<BlockKey>, u32, Vec<u32>) {
    let mut c = config(128, 16, 32);
    c.dcp_world_size = 2;
    let mut s = SimpleScheduler::new(c).unwrap();
    let mut g = gpu_pool(32, 0);
    // The attention block holds the prompt's last boundary (80 tokens) as its hash.
    let mut got = Vec::new();
    g.get_new_blocks(6, |b| got.push(b)).unwrap();
    let (attention, mamba) = (got[0], got[1..].to_vec());
    g.insert_hash(attention, a(5), 80).unwrap();
    let mk: Vec<BlockKey> = (1..=5).map(m).collect();
    g.cache_full_blocks(&mamba, &mk, 0, 5, H, None).unwrap();
    s.update_state_after_alloc_groups(&mut g, 1, &[&[attention], &mamba], 0)
        .unwrap();
    (s, g, attention, mamba)
}

fn finish(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    tables: Tables<'_>,
    computed: u64,
) -> Vec<u32> {
    let fin = Finished {
        req: 1,
        block_ids: tables,
        num_prompt_tokens: 81,
        progress: Progress {
            num_computed_tokens: computed,
            num_output_placeholders: 0,
            block_hashes: &HASHES[..5],
        },
    };
    s.request_finished_all_groups(g, &fin).unwrap();
    let plan = s.build_connector_meta(g, &StepInput::default()).unwrap();
    let stored = plan.store_gpu_blocks.to_vec();
    if let Some(e) = plan.store_event {
        let done = [(e, 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &done,
        };
        s.update_connector_output(g, &out).unwrap();
    }
    stored
}

#[test]
fn a_finished_prompt_flushes_its_partial_attention_tail() {
    let (mut s, mut g, attention, mamba) = dcp_tail();
    assert!(s.config().dcp_world_size == 2);
    // The last Mamba state arrives as a hand-off.
    let h = [Handoff {
        req: 1,
        gpu_blocks: &mamba[4..],
    }];
    let step = StepInput {
        handoffs: &h,
        ..Default::default()
    };
    let e = s.build_connector_meta(&mut g, &step).unwrap().store_event;
    let done = [(e.unwrap(), 1)];
    let out = WorkerOutput {
        finished_recving: &[],
        completed_stores: &done,
    };
    s.update_connector_output(&mut g, &out).unwrap();
    // 80 computed tokens: no whole attention block, but the prompt's boundary at 80 ends
    // inside block 0, which holds its key: flushed.
    assert_eq!(
        finish(&mut s, &mut g, &[&[attention], &mamba], 80),
        [attention]
    );
    // A request with the same prompt now hits all 80 tokens.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES[..5], 81), 0),
        Ok((80, true))
    );
}

#[test]
fn a_tail_the_scan_stored_is_not_flushed_twice() {
    let (mut s, mut g, attention, mamba) = dcp_tail();
    // Decode carried the request past the block edge: the scan selects the block, and the
    // partial tail names the same block.
    let stored = finish(&mut s, &mut g, &[&[attention], &mamba], 128);
    assert_eq!(stored, [attention]);
    // Without fine hits (lazy mode has no flush at all; a non-fine eager layout has no tail).
    let mut c = config(64, 64, 8);
    c.hash_block_size = Some(64);
    let v = c.validate().unwrap();
    assert!(!v.partial_hash_hits);
}

#[test]
fn a_store_copies_the_gpu_blocks_secondary_hashes_with_their_payloads() {
    for (room, kept) in [(None, 2usize), (Some(1), 1)] {
        let mut c = config(64, 64, 8);
        c.enable_events = true;
        c.secondary_hashes = room;
        let mut s = SimpleScheduler::new(c).unwrap();
        let mut g = gpu_pool(32, 4);
        let mut got = Vec::new();
        g.get_new_blocks(2, |b| got.push(b)).unwrap();
        let (block, state) = (got[0], got[1]);
        g.cache_full_blocks(&[block], &[a(4)], 0, 1, 64, None)
            .unwrap();
        // A boundary inside the block (32 tokens) and a key of another prefix.
        g.insert_secondary_hash(block, a(2), 0).unwrap();
        g.insert_secondary_hash(block, a(99), 0).unwrap();
        s.update_state_after_alloc_groups(&mut g, 1, &[&[block], &[state]], 0)
            .unwrap();
        let (event, stored, cpu) =
            first_step(&mut s, &mut g, 1, &[&[block], &[state]], 64, &HASHES[..4]);
        assert_eq!(stored, [block]);
        let c_block = cpu[0];
        let done = [(event.unwrap(), 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &done,
        };
        s.update_connector_output(&mut g, &out).unwrap();
        let stored: Vec<SimpleEvent> = s
            .take_events()
            .filter(|e| matches!(e, SimpleEvent::Stored { .. }))
            .collect();
        let ev = |key, block_size, meta| SimpleEvent::Stored {
            key,
            block_size,
            meta,
            medium: Medium::Cpu,
        };
        let want = [
            ev(
                a(4),
                64,
                Some(StoredMeta {
                    req: 1,
                    parent_hash: None,
                    token_start: 0,
                }),
            ),
            // The request's own hash block ending at 32: tokens 16..32, after hash 1.
            ev(
                a(2),
                16,
                Some(StoredMeta {
                    req: 1,
                    parent_hash: Some(1),
                    token_start: 16,
                }),
            ),
            ev(a(99), 0, None),
        ];
        assert_eq!(stored, want[..=kept]);
        assert_eq!(s.dropped_secondary_hashes(), 2 - kept as u64);
        assert_eq!(s.cpu_pool().get_one_block(&a(2)), Some(c_block));
        assert_eq!(
            s.cpu_pool().secondary_hashes(c_block).collect::<Vec<_>>(),
            [a(2), a(99)][..kept]
        );
        assert_eq!(
            s.cpu_pool().block_hash(c_block).map(|h| h.num_tokens),
            Some(64)
        );
        // Handing every free block out evicts the block's hash and secondary hashes, an
        // event each (the pool's queue has room for every key it can hold).
        let free = s.cpu_pool().free_count();
        s.cpu_get_new_blocks(free, |_| {}).unwrap();
        let removed: Vec<BlockKey> = s
            .take_events()
            .filter_map(|e| match e {
                SimpleEvent::Removed { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        assert_eq!(removed, [a(4), a(2), a(99)][..=kept]);
    }
}
