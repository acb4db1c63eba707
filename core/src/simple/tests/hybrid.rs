//! The hybrid layout (one attention group, one Mamba group in `align` mode): the lookup
//! reconciled with the Mamba states the CPU holds, the loads per group in group order, and
//! hand-offs of Mamba states keyed by their own group.

use alloc::vec::Vec;

use crate::simple::*;
use crate::stats::catalogue::SIMPLE_SAVE_OUTCOMES;

pub(super) const BS: u32 = 16;

pub(super) fn gpu(n: u32) -> BlockPool<BlockKey> {
    BlockPool::new(BlockPoolConfig::new(n, true)).unwrap()
}

fn hybrid(cpu_blocks: u32, gpu_blocks: u32, attention: u32, mamba: u32) -> SimpleScheduler {
    let mut c = SimpleConfig::with_cpu_blocks(BS, gpu_blocks, cpu_blocks);
    assert_eq!(attention + mamba, 1, "groups 0 and 1");
    c.layout = Layout::hybrid_mamba(attention == 0);
    SimpleScheduler::new(c).unwrap()
}

/// GPU blocks cached under `keys`, one each.
pub(super) fn cached(g: &mut BlockPool<BlockKey>, keys: &[BlockKey]) -> Vec<u32> {
    let mut ids = Vec::new();
    for k in keys {
        g.get_new_blocks(1, |b| ids.push(b)).unwrap();
        let b = *ids.last().unwrap();
        g.cache_full_blocks(&[b], &[*k], 0, 1, BS, None).unwrap();
    }
    ids
}

/// Offers the blocks cached under `keys` as one request's hand-offs and completes the store
/// (if any); frees the GPU blocks.
pub(super) fn hand_off(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    req: u64,
    keys: &[BlockKey],
) {
    let ids = cached(g, keys);
    s.update_state_after_alloc(g, req, &[], 0).unwrap();
    let h = [Handoff {
        req,
        gpu_blocks: &ids,
    }];
    let step = StepInput {
        handoffs: &h,
        ..Default::default()
    };
    if let Some(e) = s.build_connector_meta(g, &step).unwrap().store_event {
        let done = [(e, 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &done,
        };
        s.update_connector_output(g, &out).unwrap();
    }
    g.free_blocks(&ids).unwrap();
}

/// One step scheduling request `req` for the first time with its whole `tables`, after
/// `computed` tokens over `hashes`: the plan's store (event, GPU blocks, CPU blocks).
pub(super) fn first_step(
    s: &mut SimpleScheduler,
    g: &mut BlockPool<BlockKey>,
    req: u64,
    tables: Tables<'_>,
    computed: u64,
    hashes: &[u64],
) -> (Option<u64>, Vec<u32>, Vec<u32>) {
    let sc = [Scheduled {
        req,
        new_block_ids: Some(tables),
        full_table: true,
        num_scheduled_tokens: 1,
        progress: Progress {
            num_computed_tokens: computed,
            num_output_placeholders: 0,
            block_hashes: hashes,
        },
    }];
    let step = StepInput {
        scheduled: &sc,
        ..Default::default()
    };
    let plan = s.build_connector_meta(g, &step).unwrap();
    (
        plan.store_event,
        plan.store_gpu_blocks.to_vec(),
        plan.store_cpu_blocks.to_vec(),
    )
}

pub(super) fn lookup(hashes: &[u64], num_tokens: u64) -> LookupRequest<'_> {
    LookupRequest {
        req: 9,
        block_hashes: hashes,
        num_tokens,
        skip_reading_prefix_cache: false,
    }
}

#[test]
fn hit_ends_at_the_last_mamba_state_held() {
    let (mut s, mut g) = (hybrid(16, 32, 0, 1), gpu(32));
    let a = |h| BlockKey::new(h, 0);
    let m = |h| BlockKey::new(h, 1);
    hand_off(&mut s, &mut g, 1, &[a(1), a(2), a(3), a(4), m(2)]);
    let cpu = |k: BlockKey| s.cpu_pool().get_one_block(&k).unwrap();
    let (c1, c2, cm2) = (cpu(a(1)), cpu(a(2)), cpu(m(2)));
    let hashes = [1, 2, 3, 4, 5];
    let _ = cpu;
    // Attention holds 4 blocks; the last Mamba state within them is at block 2: 32 tokens.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 81), 0),
        Ok((32, true))
    );
    // Pinned: the two attention blocks and the Mamba state, nothing else.
    assert_eq!(s.cpu_pool().ref_count(cm2), Some(1));
    assert_eq!(s.cpu_pool().ref_count(c1), Some(1));
    let c3 = s.cpu_pool().get_one_block(&a(3)).unwrap();
    assert_eq!(s.cpu_pool().ref_count(c3), Some(0));
    // No Mamba state within the attention hit: no hit at all.
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&[1, 9], 33), 0),
        Ok((0, false))
    );
    assert_eq!(
        s.cpu_pool().ref_count(cm2),
        Some(0),
        "the retry released the pins"
    );
    // The whole hit taken: attention loads, then the Mamba state into the Mamba table's block
    // at the hit's last position.
    s.get_num_new_matched_tokens(&lookup(&hashes, 81), 0)
        .unwrap();
    let tables: Tables<'_> = &[&[20, 21, 22], &[0, 23, 24]];
    s.update_state_after_alloc_groups(&mut g, 9, tables, 32)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[20, 21, 23]);
    assert_eq!(plan.load_cpu_blocks, &[c1, c2, cm2]);
    assert_eq!(g.ref_count(23), Some(1));
}

#[test]
fn a_partial_take_leaves_the_mamba_state_and_group_order_decides_the_load_order() {
    // The Mamba group first (group 0), attention second.
    let (mut s, mut g) = (hybrid(16, 32, 1, 0), gpu(32));
    let a = |h| BlockKey::new(h, 1);
    let m = |h| BlockKey::new(h, 0);
    hand_off(&mut s, &mut g, 1, &[a(1), a(2), m(2), m(1)]);
    let cpu = |k: BlockKey| s.cpu_pool().get_one_block(&k).unwrap();
    let (c1, c2, cm2) = (cpu(a(1)), cpu(a(2)), cpu(m(2)));
    let hashes = [1, 2, 3];
    assert_eq!(
        s.get_num_new_matched_tokens(&lookup(&hashes, 49), 0),
        Ok((32, true))
    );
    let tables: Tables<'_> = &[&[0, 23, 24], &[20, 21, 22]];
    // One block taken: the attention block alone, the Mamba state at block 2 released.
    let mut t = s.clone();
    let mut tg = g.clone();
    t.update_state_after_alloc_groups(&mut tg, 9, tables, 16)
        .unwrap();
    let plan = t
        .build_connector_meta(&mut tg, &StepInput::default())
        .unwrap();
    assert_eq!(
        (plan.load_gpu_blocks, plan.load_cpu_blocks),
        (&[20][..], &[c1][..])
    );
    assert_eq!(t.cpu_pool().ref_count(cm2), Some(0));
    // Both taken: the Mamba group's load comes first.
    s.update_state_after_alloc_groups(&mut g, 9, tables, 32)
        .unwrap();
    let plan = s
        .build_connector_meta(&mut g, &StepInput::default())
        .unwrap();
    assert_eq!(plan.load_gpu_blocks, &[23, 20, 21]);
    assert_eq!(plan.load_cpu_blocks, &[cm2, c1, c2]);
    // A Mamba table too short for the state is refused, and nothing changes.
    let mut u = hybrid(16, 32, 1, 0);
    let mut ug = gpu(32);
    hand_off(&mut u, &mut ug, 1, &[a(1), a(2), m(2)]);
    u.get_num_new_matched_tokens(&lookup(&hashes, 49), 0)
        .unwrap();
    let short: Tables<'_> = &[&[0], &[20, 21]];
    let before = u.cpu_pool().free_count();
    assert_eq!(
        u.update_state_after_alloc_groups(&mut ug, 9, short, 32),
        Err(AllocStateError::TableTooShort { req: 9 })
    );
    assert_eq!(u.cpu_pool().free_count(), before);
}

#[test]
fn mamba_states_are_classified_and_stored_under_their_own_group() {
    let (mut s, mut g) = (hybrid(4, 32, 0, 1), gpu(32));
    // The same hash in both groups: two keys, two CPU blocks; then again: already cached.
    hand_off(
        &mut s,
        &mut g,
        1,
        &[BlockKey::new(7, 0), BlockKey::new(7, 1)],
    );
    let p = s.get_stats();
    assert_eq!(p.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(2));
    hand_off(&mut s, &mut g, 2, &[BlockKey::new(7, 1)]);
    let p = s.get_stats();
    assert_eq!(
        p.counter(SIMPLE_SAVE_OUTCOMES, &["skipped_already_cached"]),
        Some(1)
    );
    assert!(s.cpu_pool().get_one_block(&BlockKey::new(7, 1)).is_some());
}

#[test]
fn layouts_are_checked() {
    assert_eq!(
        Layout::new(&[GroupKind::Mamba]),
        Err(ConfigError::Layout {
            why: "a layout needs a full-attention group"
        })
    );
    assert!(Layout::new(&[]).is_err());
    assert!(Layout::new(&[GroupKind::FullAttention; MAX_GROUPS + 1]).is_err());
    assert!(
        Layout::new(&[
            GroupKind::FullAttention,
            GroupKind::SlidingWindow { window: 0 }
        ])
        .is_err()
    );
    let l = Layout::new(&[
        GroupKind::Scratch,
        GroupKind::Mamba,
        GroupKind::FullAttention,
    ])
    .unwrap();
    assert_eq!((l.attention_group(), l.mamba_group()), (2, Some(1)));
    assert_eq!(l.cacheable().map(|(g, _)| g).collect::<Vec<_>>(), [1, 2]);
}
