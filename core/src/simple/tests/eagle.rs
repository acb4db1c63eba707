//! EAGLE's block drop (`use_eagle_block_drop`): the draft groups' hits match one block past
//! the candidate and drop it, and a hybrid model's eager scan holds their last block back.
//! Numbers derived by hand from vLLM 0.33.0's coordinators and managers.

use alloc::vec::Vec;

use super::hybrid::{BS, cached, first_step, gpu, hand_off, lookup};
use crate::simple::*;

const FA: GroupKind = GroupKind::FullAttention;
/// A 33-token window: cdiv(32, 16) = 2 contiguous blocks, 3 with EAGLE's drop.
const SW: GroupKind = GroupKind::SlidingWindow { window: 33 };
const HASHES: [u64; 6] = [1, 2, 3, 4, 5, 6];

fn keys(group: u32, hashes: &[u64]) -> Vec<BlockKey> {
    hashes.iter().map(|&h| BlockKey::new(h, group)).collect()
}

fn sched(kinds: &[GroupKind], eagle: Option<u32>, drop: bool) -> SimpleScheduler {
    let mut c = SimpleConfig::with_cpu_blocks(BS, 64, 32);
    let mut l = Layout::new(kinds).unwrap();
    if let Some(g) = eagle {
        l = l.with_eagle_group(g).unwrap();
    }
    c.layout = l;
    c.use_eagle_block_drop = drop;
    SimpleScheduler::new(c).unwrap()
}

#[test]
fn a_dense_hit_drops_its_last_block() {
    for (drop, want) in [(false, 64), (true, 48)] {
        let (mut s, mut g) = (sched(&[FA], None, drop), gpu(64));
        hand_off(&mut s, &mut g, 1, &keys(0, &HASHES[..4]));
        // Four blocks held; the unitary coordinator asks with no margin and drops one.
        assert_eq!(
            s.get_num_new_matched_tokens(&lookup(&HASHES, 200), 0),
            Ok((want, true))
        );
        // At the cap (65 tokens: 4 blocks) the drop still takes one.
        assert_eq!(
            s.get_num_new_matched_tokens(
                &LookupRequest {
                    req: 8,
                    ..lookup(&HASHES, 65)
                },
                0
            ),
            Ok((want, true))
        );
    }
}

#[test]
fn a_window_draft_needs_one_more_block_and_drops_it() {
    let build = |drop| {
        let (mut s, mut g) = (sched(&[FA, SW], Some(1), drop), gpu(64));
        let mut k = keys(0, &HASHES);
        k.extend(keys(1, &HASHES));
        hand_off(&mut s, &mut g, 1, &k);
        (s, g)
    };
    // Without the drop: attention 6 blocks, the window's last two in a row: 96 tokens.
    let (mut s, _) = build(false);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 200), 0),
        Ok((96, true))
    );
    // With it: the window group, asked up to 96 + 16 (no hash past 96), needs three in a
    // row (blocks 3..=5), then drops block 5: 80 tokens, held from block 3.
    let (mut s, mut g) = build(true);
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 200), 0),
        Ok((80, true))
    );
    let t: [&[u32]; 2] = [&[10, 11, 12, 13, 14, 15], &[20, 21, 22, 23, 24, 25]];
    s.update_state_after_alloc_groups(&mut g, 9, &t, 80)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[10, 11, 12, 13, 14, 23, 24]);
    // The attention group is not a draft group: its own hit has no drop.
    let (mut s, _) = {
        let (mut s, mut g) = (sched(&[FA, SW], Some(0), true), gpu(64));
        let mut k = keys(0, &HASHES[..5]);
        k.extend(keys(1, &HASHES));
        hand_off(&mut s, &mut g, 1, &k);
        (s, g)
    };
    // Attention holds 5 blocks, asked up to 96 + 16 finds 5 and drops one: 64; the window
    // group then ends at 64 (blocks 2 and 3).
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&HASHES, 200), 0),
        Ok((64, true))
    );
}

#[test]
fn a_chunked_draft_or_a_short_scheduler_block_is_refused() {
    let mut c = SimpleConfig::with_cpu_blocks(BS, 64, 32);
    c.layout = Layout::new(&[FA, GroupKind::ChunkedLocal { chunk: 64 }]).unwrap();
    c.use_eagle_block_drop = true;
    assert!(matches!(c.validate(), Err(ConfigError::BlockSizes { .. })));
    // Marking only the attention group leaves the chunked group alone.
    c.layout = c.layout.with_eagle_group(0).unwrap();
    assert!(c.validate().is_ok());
    // Multi-token prediction's lookahead must fit a scheduler block.
    c.num_prefill_lookahead_tokens = 17;
    assert!(matches!(c.validate(), Err(ConfigError::BlockSizes { .. })));
    assert!(matches!(
        Layout::dense().with_eagle_group(1),
        Err(ConfigError::Layout { .. })
    ));
}

#[test]
fn the_eager_scan_holds_a_draft_groups_last_block_back() {
    // A hybrid model with 3 lookahead tokens (2 re-prefillable): after 64 confirmed tokens
    // attention stores all 4 blocks; the window draft group min(62, 48 + 16) = 62 tokens: 3.
    let mut c = SimpleConfig::with_cpu_blocks(BS, 64, 32);
    c.layout = Layout::new(&[FA, SW]).unwrap().with_eagle_group(1).unwrap();
    c.use_eagle_block_drop = true;
    c.num_prefill_lookahead_tokens = 3;
    let (mut s, mut g) = (SimpleScheduler::new(c).unwrap(), gpu(64));
    let fa = cached(&mut g, &keys(0, &HASHES[..4]));
    let sw = cached(&mut g, &keys(1, &HASHES[..4]));
    s.update_state_after_alloc_groups(&mut g, 1, &[&fa, &sw], 0)
        .unwrap();
    let (_, stored, _) = first_step(&mut s, &mut g, 1, &[&fa, &sw], 64, &HASHES[..4]);
    let mut want = fa.clone();
    want.extend(&sw[..3]);
    assert_eq!(stored, want);
}
