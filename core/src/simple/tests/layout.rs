//! Layouts with sliding-window and chunked-local groups: the hit every group accepts (vLLM's
//! fixed point), its pins and loads per group, and the eager scan over every positional group
//! with null entries recovered from the GPU cache. Numbers derived by hand from vLLM 0.33.0's
//! managers.

use alloc::vec::Vec;

use super::hybrid::{BS, cached, gpu, hand_off, lookup};
use crate::simple::*;

fn sched(cpu_blocks: u32, gpu_blocks: u32, kinds: &[GroupKind]) -> SimpleScheduler {
    let mut c = SimpleConfig::with_cpu_blocks(BS, gpu_blocks, cpu_blocks);
    c.layout = Layout::new(kinds).unwrap();
    SimpleScheduler::new(c).unwrap()
}

const FA: GroupKind = GroupKind::FullAttention;
/// A 64-token window: a hit needs cdiv(63, 16) = 4 contiguous blocks before its end.
const SW: GroupKind = GroupKind::SlidingWindow { window: 64 };

fn keys(group: u32, hashes: &[u64]) -> Vec<BlockKey> {
    hashes.iter().map(|&h| BlockKey::new(h, group)).collect()
}

/// The CPU blocks pinned for `hashes` in `group`, in order.
fn cpu_blocks(s: &SimpleScheduler, group: u32, hashes: &[u64]) -> Vec<u32> {
    keys(group, hashes)
        .iter()
        .map(|k| s.cpu_pool().get_one_block(k).unwrap())
        .collect()
}

#[test]
fn a_sliding_window_hit_ends_after_a_full_window_of_held_blocks() {
    let hashes = [1, 2, 3, 4, 5, 6];
    // 97 tokens: at most 6 blocks. Attention holds all six, the window group blocks 1..=4.
    let build = |sw: &[u64]| {
        let (mut s, mut g) = (sched(32, 64, &[FA, SW]), gpu(64));
        let mut k = keys(0, &hashes);
        k.extend(keys(1, sw));
        hand_off(&mut s, &mut g, 1, &k);
        (s, g)
    };
    let (mut s, mut g) = build(&[2, 3, 4, 5]);
    // Right to left from block 5: 5 misses, 4..1 are four in a row: the hit ends at 5 blocks.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 97), 0),
        Ok((80, true))
    );
    let fa = cpu_blocks(&s, 0, &hashes[..5]);
    let sw = cpu_blocks(&s, 1, &hashes[1..5]);
    for &c in fa.iter().chain(&sw) {
        assert_eq!(s.cpu_pool().ref_count(c), Some(1), "pinned");
    }
    // Block 0 of the window group is not part of the hit (null padding): not pinned.
    let fa_tables: [&[u32]; 2] = [&[10, 11, 12, 13, 14, 15], &[20, 21, 22, 23, 24, 25]];
    s.update_state_after_alloc_groups(&mut g, 9, &fa_tables, 80)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    // Group after group: attention's five, then the window's four from position 1.
    assert_eq!(plan.load_gpu_blocks, &[10, 11, 12, 13, 14, 21, 22, 23, 24]);
    let mut want = fa.clone();
    want.extend(&sw);
    assert_eq!(plan.load_cpu_blocks, &want[..]);

    // Only blocks 0 and 1 held: no run of four, so the hit is the run from the start.
    let (mut s, _) = build(&[1, 2]);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 97), 0),
        Ok((32, true))
    );
    // Blocks 1..=3 held but not 0: a hit of 3 blocks would need block 0, a longer one four
    // in a row: none.
    let (mut s, _) = build(&[2, 3, 4]);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 97), 0),
        Ok((0, false))
    );
}

#[test]
fn the_groups_cut_the_hit_until_every_one_accepts_it() {
    let hashes = [1, 2, 3, 4, 5, 6];
    let (mut s, mut g) = (sched(32, 64, &[FA, SW, GroupKind::Mamba]), gpu(64));
    let mut k = keys(0, &hashes);
    k.extend(keys(1, &[1, 2, 3, 4, 5]));
    // The only Mamba state: after block 2.
    k.extend(keys(2, &[3]));
    hand_off(&mut s, &mut g, 1, &k);
    // Window: 5 blocks (1..=4 in a row). Mamba within 5: the state at block 2, 3 blocks.
    // Window again at 3: blocks 0..=2 all held, fewer than four: accepted. Mamba at 3: yes.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 97), 0),
        Ok((48, true))
    );
    let mut pinned = cpu_blocks(&s, 0, &hashes[..3]);
    pinned.extend(cpu_blocks(&s, 1, &hashes[..3]));
    pinned.extend(cpu_blocks(&s, 2, &hashes[2..3]));
    for &c in &pinned {
        assert_eq!(s.cpu_pool().ref_count(c), Some(1));
    }
    let used = s.cpu_pool().num_blocks() - 1 - s.cpu_pool().free_count();
    assert_eq!(used, 7, "the hit's 7 blocks are out of the free queue");
    // Taking 2 of the 3 blocks: attention and window load 2 each, the Mamba state stays.
    let tables: [&[u32]; 3] = [&[10, 11, 12], &[20, 21, 22], &[0, 0, 30]];
    s.update_state_after_alloc_groups(&mut g, 9, &tables, 32)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[10, 11, 20, 21]);
    assert_eq!(s.cpu_pool().ref_count(pinned[6]), Some(0));
}

#[test]
fn a_chunked_local_group_needs_only_its_last_chunk() {
    // vLLM's test_chunked_local_cpu_lookup_requires_chunk_aligned_prefix: 5 blocks + 1 token,
    // a 64-token chunk (4 blocks); attention holds all 5, the chunked group 4 or 5.
    let hashes = [1, 2, 3, 4, 5];
    let cases = [
        (0, 4, 64),
        (0, 5, 80),
        (16, 4, 0),
        (16, 5, 0),
        (64, 4, 0),
        (64, 5, 16),
    ];
    for (local, chunked, want) in cases {
        let chunk = GroupKind::ChunkedLocal { chunk: 64 };
        let (mut s, mut g) = (sched(32, 64, &[FA, chunk]), gpu(64));
        let mut k = keys(0, &hashes);
        k.extend(keys(1, &hashes[..chunked]));
        hand_off(&mut s, &mut g, 1, &k);
        let free = s.cpu_pool().free_count();
        assert_eq!(
            s.get_num_new_matched_tokens(&lookup(&hashes, 81), local),
            Ok((want, want > 0)),
            "{local} local tokens, {chunked} chunked blocks"
        );
        s.request_finished(&mut g, 9);
        assert_eq!(s.cpu_pool().free_count(), free);
    }
    // 64 tokens found by attention and a whole chunk before them: the chunked group needs
    // nothing (all null), so the load is attention's alone.
    let chunk = GroupKind::ChunkedLocal { chunk: 64 };
    let (mut s, mut g) = (sched(32, 64, &[FA, chunk]), gpu(64));
    hand_off(&mut s, &mut g, 1, &keys(0, &hashes[..4]));
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 81), 0),
        Ok((64, true))
    );
    let tables: [&[u32]; 2] = [&[10, 11, 12, 13, 14], &[20, 21, 22, 23, 24]];
    s.update_state_after_alloc_groups(&mut g, 9, &tables, 64)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[10, 11, 12, 13]);
}

/// Request 1 with `tables` and 64 computed tokens of `hashes` finishes; the next step's store.
fn flush(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    tables: Tables<'_>,
    hashes: &[u64],
) -> (Option<u64>, Vec<u32>) {
    s.update_state_after_alloc_groups(g, 1, tables, 0).unwrap();
    let fin = Finished {
        req: 1,
        block_ids: tables,
        num_prompt_tokens: 64,
        progress: Progress {
            num_computed_tokens: 64,
            num_output_placeholders: 0,
            block_hashes: hashes,
        },
    };
    s.request_finished_all_groups(g, &fin).unwrap();
    let plan = s.build_connector_meta(g, &StepInput::default()).unwrap();
    (plan.store_event, plan.store_gpu_blocks.to_vec())
}

#[test]
fn the_final_flush_stores_every_group_and_recovers_a_nulled_window_tail() {
    // vLLM's test_finished_eager_store_recovers_nulled_window_tail: 4 blocks, the window
    // group's two oldest pages freed (still cached on the GPU) and nulled in its table.
    let hashes = [1, 2, 3, 4];
    let (mut s, mut g) = (sched(16, 32, &[FA, SW]), gpu(32));
    let fa = cached(&mut g, &keys(0, &hashes));
    let sw = cached(&mut g, &keys(1, &hashes));
    g.free_blocks(&sw[..2]).unwrap();
    let sw_table = [0, 0, sw[2], sw[3]];
    let tables: [&[u32]; 2] = [&fa, &sw_table];
    let plan = flush(&mut s, &mut g, &tables, &hashes);
    let mut want = fa.clone();
    want.extend(&sw);
    assert_eq!(plan.1, want);
    let e = plan.0.unwrap();
    let out = WorkerOutput {
        finished_recving: &[],
        completed_stores: &[(e, 1)],
    };
    s.update_connector_output(&mut g, &out).unwrap();
    // The whole window is on the CPU: another request with these hashes hits all 4 blocks.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 65), 0),
        Ok((64, true))
    );

    // A nulled page the GPU no longer caches is skipped; the flush stops at the CPU's free
    // blocks, attention's first.
    let (mut s, mut g) = (sched(6, 32, &[FA, SW]), gpu(32));
    let fa = cached(&mut g, &keys(0, &hashes));
    let sw = cached(&mut g, &keys(1, &hashes));
    g.free_blocks(&sw[..1]).unwrap();
    // Evict the freed page: take every free block.
    let mut taken = Vec::new();
    g.get_new_blocks(g.free_count(), |b| taken.push(b)).unwrap();
    let sw_table = [0, sw[1], sw[2], sw[3]];
    let tables: [&[u32]; 2] = [&fa, &sw_table];
    let plan = flush(&mut s, &mut g, &tables, &hashes);
    // 5 free CPU blocks: attention's 4, then the window's first stored page.
    assert_eq!(plan.1, [fa[0], fa[1], fa[2], fa[3], sw[1]]);
}

#[test]
fn the_eager_scan_follows_each_positional_group_and_skips_scratch_and_mamba() {
    let hashes = [1, 2, 3];
    let kinds = [FA, GroupKind::Scratch, SW, GroupKind::Mamba];
    // A clone (its tables cloned empty, without their reserve) decides as the original.
    let (mut s, mut g) = (sched(16, 32, &kinds).clone(), gpu(32));
    let fa = cached(&mut g, &keys(0, &hashes));
    let sw = cached(&mut g, &keys(2, &hashes));
    let m = cached(&mut g, &keys(3, &hashes));
    let scratch = [0u32; 3];
    let tables: [&[u32]; 4] = [&fa, &scratch, &sw, &m];
    s.update_state_after_alloc_groups(&mut g, 1, &tables, 0)
        .unwrap();
    // 40 computed tokens: 2 blocks confirmed in each positional group.
    let sc = [Scheduled {
        req: 1,
        new_block_ids: Some(&tables),
        full_table: true,
        num_scheduled_tokens: 8,
        progress: Progress {
            num_computed_tokens: 40,
            num_output_placeholders: 0,
            block_hashes: &hashes,
        },
    }];
    let step = StepInput {
        scheduled: &sc,
        ..Default::default()
    };
    let plan = s.build_connector_meta(&mut g, &step).unwrap();
    assert_eq!(plan.store_gpu_blocks, &[fa[0], fa[1], sw[0], sw[1]]);
    // A hybrid layout holds no re-prefillable tail back.
    assert_eq!(s.config().validate().map(|v| v.reprefillable), Ok(0));
}

#[test]
fn a_chunk_not_a_multiple_of_the_block_is_asked_once_as_vllm_asks_it() {
    // A 24-token chunk (a block and a half); attention holds 2 blocks, the chunked group
    // none. vLLM's single pass (two spec groups): attention 32 tokens, then the chunked
    // group from its chunk's start (token 24: block 1), which misses: 1 block of null
    // padding, a hit of 16 tokens. Asked again at 16 tokens, the chunk would start at block 0
    // and miss: vLLM does not ask again.
    let chunk = GroupKind::ChunkedLocal { chunk: 24 };
    let hashes = [1, 2, 3];
    let (mut s, mut g) = (sched(16, 32, &[FA, chunk]), gpu(32));
    hand_off(&mut s, &mut g, 1, &keys(0, &hashes[..2]));
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 33), 0),
        Ok((16, true))
    );
    let fa = cpu_blocks(&s, 0, &hashes[..2]);
    assert_eq!(s.cpu_pool().ref_count(fa[0]), Some(1));
    assert_eq!(s.cpu_pool().ref_count(fa[1]), Some(0));
    let tables: [&[u32]; 2] = [&[10, 11], &[20, 21]];
    s.update_state_after_alloc_groups(&mut g, 9, &tables, 16)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[10]);
    // With a third spec group vLLM loops until a pass cuts nothing: the chunked group is
    // asked again at 16 tokens, misses block 0, and there is no hit.
    let (mut s, mut g) = (sched(16, 32, &[FA, chunk, GroupKind::Mamba]), gpu(32));
    let mut k = keys(0, &hashes[..2]);
    k.extend(keys(2, &hashes[..2]));
    hand_off(&mut s, &mut g, 1, &k);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 33), 0),
        Ok((0, false))
    );
}
