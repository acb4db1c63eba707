//! The model's lookup and load paths: vLLM 0.33.0's `get_num_new_matched_tokens` and
//! `update_state_after_alloc`, with the CPU coordinator's `find_longest_cache_hit` written
//! the way vLLM runs it: prefix-cacheable groups of one spec merged into a spec group and
//! looked up together, full attention sorted first, each kind's manager producing hit lists
//! with null padding over its view of the hashes (fine-grained where enabled), EAGLE's margin
//! and drop with its verified set, and the hybrid coordinator's shrinking loop (one pass only
//! for a simple hybrid), with no shortcut taken from what the loop is meant to compute.

#![allow(
    clippy::cast_possible_truncation,
    reason = "test model: block counts, ids and token counts are small"
)]

use kvtier_core::BlockKey;
use kvtier_core::simple::{GroupKind, LookupRequest};

use super::{Gpu, HitGroups, LoadSt, NaivePool, SimpleModel, StoreSt, get, pins};

/// One hit list of a group: `None` is the null block.
pub type Hit = Vec<Option<u32>>;

/// KV-cache groups of one spec, looked up together (vLLM's `SpecGroup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecGroup {
    /// The shared spec.
    pub kind: GroupKind,
    /// The members' block size.
    pub block: u64,
    /// The member groups, in group order.
    pub ids: Vec<u32>,
    /// A member drops EAGLE's block.
    pub eagle: bool,
}

/// `verify_and_split_kv_cache_groups`: the prefix-cacheable groups merged by equal spec
/// (kind and block size, in order of first appearance; the EAGLE flag of any member), then a
/// stable sort putting full attention first.
pub fn spec_groups(kinds: &[GroupKind], blocks: &[u64], drop: &[bool]) -> Vec<SpecGroup> {
    let mut out: Vec<SpecGroup> = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        if kind == GroupKind::Scratch {
            continue;
        }
        let (block, eagle) = (blocks[i], drop[i]);
        match out.iter_mut().find(|s| s.kind == kind && s.block == block) {
            Some(s) => {
                s.ids.push(i as u32);
                s.eagle |= eagle;
            }
            None => out.push(SpecGroup {
                kind,
                block,
                ids: vec![i as u32],
                eagle,
            }),
        }
    }
    out.sort_by_key(|s| s.kind != GroupKind::FullAttention);
    out
}

/// `resolve_block_hashes(hashes, hash, block)` without fine-grained lookup: the hash at the
/// end of each `block`-token block.
fn resolve(hashes: &[u64], hash: u64, block: u64) -> Vec<u64> {
    let s = (block / hash) as usize;
    hashes.chunks_exact(s).map(|c| c[s - 1]).collect()
}

/// One manager's lookup parameters.
struct Find<'a> {
    hashes: &'a [u64],
    hash: u64,
    align: u64,
    fine: bool,
}

impl NaivePool {
    /// `get_cached_block(hash, group_ids)`: one block per group, or nothing when any group
    /// misses.
    fn get_cached_block(&self, hash: Option<&u64>, ids: &[u32]) -> Option<Vec<u32>> {
        let &h = hash?;
        ids.iter()
            .map(|&g| self.get_one(&BlockKey::new(h, g)))
            .collect()
    }

    /// The manager of `spec`'s `find_longest_cache_hit`, at most `max_length` tokens: the hit
    /// lists (one per group) and the hit in tokens.
    fn find(&self, spec: &SpecGroup, f: &Find<'_>, max_length: u64, drop: bool) -> (Vec<Hit>, u64) {
        let ids = &spec.ids[..];
        let bs = spec.block;
        let (align, hash) = (f.align, f.hash);
        let mut lists: Vec<Hit> = vec![Vec::new(); ids.len()];
        let push = |lists: &mut Vec<Hit>, found: Vec<u32>| {
            for (l, b) in lists.iter_mut().zip(found) {
                l.push(Some(b));
            }
        };
        let len = |lists: &Vec<Hit>| lists.first().map_or(0, Vec::len) as u64;
        match spec.kind {
            // Full attention: the leading run of blocks every group holds; fine-grained,
            // then the first block not held whole at its longest held hash boundary.
            GroupKind::FullAttention | GroupKind::Scratch => {
                let fine = f.fine && align < bs && bs.is_multiple_of(align);
                let view = resolve(f.hashes, hash, bs);
                for i in 0..((max_length / bs) as usize).min(view.len()) {
                    let Some(found) = self.get_cached_block(view.get(i), ids) else {
                        break;
                    };
                    push(&mut lists, found);
                }
                let mut hit = len(&lists) * bs;
                if fine {
                    let scale = bs / align;
                    let first = len(&lists) * scale;
                    let last = (first + scale - 1)
                        .min(max_length / align)
                        .min(f.hashes.len() as u64);
                    for fi in (first..last).rev() {
                        if let Some(found) = self.get_cached_block(f.hashes.get(fi as usize), ids) {
                            push(&mut lists, found);
                            hit = (fi + 1) * align;
                            break;
                        }
                    }
                }
                if drop && hit > 0 {
                    hit -= align.min(bs);
                }
                hit -= hit % align;
                for l in &mut lists {
                    l.truncate(hit.div_ceil(bs) as usize);
                }
                (lists, hit)
            }
            // Sliding window (whole blocks): right to left, the first run of
            // `cdiv(window − 1, bs)` (+1 with EAGLE's drop) held blocks whose end is aligned
            // ends the hit; blocks before it stay null. Without one, the run from the first
            // block, cut to the alignment. EAGLE then drops the last block and re-aligns.
            GroupKind::SlidingWindow { window } => {
                let view = resolve(f.hashes, hash, bs);
                let need = (u64::from(window) - 1).div_ceil(bs) + u64::from(drop);
                let max_blocks = (max_length / bs) as usize;
                for l in &mut lists {
                    *l = vec![None; max_blocks];
                }
                let mut run = 0u64;
                let mut matched = false;
                for i in (0..max_blocks).rev() {
                    match self.get_cached_block(view.get(i), ids) {
                        Some(found) => {
                            if run == 0 && bs != align {
                                let post = if drop { i } else { i + 1 } as u64;
                                if !(post * bs).is_multiple_of(align) {
                                    continue;
                                }
                            }
                            for (l, b) in lists.iter_mut().zip(found) {
                                l[i] = Some(b);
                            }
                            run += 1;
                            if run >= need {
                                for l in &mut lists {
                                    l.truncate(i + run as usize);
                                }
                                matched = true;
                                break;
                            }
                        }
                        None => run = 0,
                    }
                }
                let realign = |lists: &mut Vec<Hit>| {
                    while bs != align && !(len(lists) * bs).is_multiple_of(align) {
                        for l in lists.iter_mut() {
                            l.pop();
                        }
                    }
                };
                if !matched {
                    for l in &mut lists {
                        l.truncate(run as usize);
                    }
                    realign(&mut lists);
                }
                if drop && len(&lists) > 0 {
                    for l in &mut lists {
                        l.pop();
                    }
                    realign(&mut lists);
                }
                let hit = len(&lists) * bs;
                (lists, hit)
            }
            // Chunked local (its block is the alignment): blocks wholly before the chunk
            // holding token `max_length` are null; from there, the leading run of held blocks.
            GroupKind::ChunkedLocal { chunk } => {
                let view = resolve(f.hashes, hash, bs);
                let chunk = u64::from(chunk);
                let start_token = if max_length > 0 {
                    max_length / chunk * chunk
                } else {
                    0
                };
                let start = (start_token / bs) as usize;
                for l in &mut lists {
                    *l = vec![None; start];
                }
                for i in start..(max_length / bs) as usize {
                    let Some(found) = self.get_cached_block(view.get(i), ids) else {
                        break;
                    };
                    push(&mut lists, found);
                }
                let hit = len(&lists) * bs;
                (lists, hit)
            }
            // Mamba (align mode): the last held state, nulls before it; fine-grained, at any
            // hash boundary, else at an aligned block end.
            GroupKind::Mamba => {
                let fine = f.fine && align < bs && bs.is_multiple_of(align);
                if fine {
                    let scale = bs / align;
                    let units = (max_length / align).min(f.hashes.len() as u64);
                    for fi in (0..units).rev() {
                        if let Some(found) = self.get_cached_block(f.hashes.get(fi as usize), ids) {
                            for (l, b) in lists.iter_mut().zip(found) {
                                l.extend(std::iter::repeat_n(None, (fi / scale) as usize));
                                l.push(Some(b));
                            }
                            return (lists, (fi + 1) * align);
                        }
                    }
                    return (lists, 0);
                }
                let view = resolve(f.hashes, hash, bs);
                for i in (0..(max_length / bs) as usize).rev() {
                    if let Some(found) = self.get_cached_block(view.get(i), ids) {
                        if bs != align && !((i as u64 + 1) * bs).is_multiple_of(align) {
                            continue;
                        }
                        for (l, b) in lists.iter_mut().zip(found) {
                            l.extend(std::iter::repeat_n(None, i));
                            l.push(Some(b));
                        }
                        return (lists, (i as u64 + 1) * bs);
                    }
                }
                (lists, 0)
            }
        }
    }
}

impl SimpleModel {
    /// The CPU coordinator's `find_longest_cache_hit(block_hashes, max_cache_hit_length)`:
    /// the hit lists indexed by group (empty for a group not looked up) and the hit length
    /// in tokens.
    pub fn find_longest_cache_hit(&self, hashes: &[u64], max_len: u64) -> (HitGroups, u64) {
        let n = self.kinds.len();
        let specs = spec_groups(&self.kinds, &self.blocks, &self.drop);
        let f = Find {
            hashes,
            hash: self.hash,
            align: if self.fine { self.hash } else { self.bs },
            fine: self.fine,
        };
        if n == 1 {
            // `UnitaryKVCacheCoordinator`: the one manager's answer, no EAGLE margin.
            return self.cpu.find(&specs[0], &f, max_len, specs[0].eagle);
        }
        let mut hit_length = max_len;
        let mut by_group: Vec<Option<Hit>> = vec![None; n];
        let mut len_by_group = vec![0u64; n];
        let simple_hybrid = specs.len() == 2 && specs[0].kind == GroupKind::FullAttention;
        let mut verified: Vec<usize> = Vec::new();
        loop {
            let mut curr = hit_length;
            for (idx, spec) in specs.iter().enumerate() {
                let first = spec.ids[0] as usize;
                if spec.kind == GroupKind::FullAttention && by_group[first].is_some() {
                    // Looked up once; later passes only trim.
                    curr = curr.min(len_by_group[first]);
                    continue;
                }
                let drop = spec.eagle && !verified.contains(&idx);
                let mut max = curr;
                if drop && spec.kind != GroupKind::Mamba {
                    let fine_lookup = self.fine && spec.kind == GroupKind::FullAttention;
                    let margin = if fine_lookup && spec.block > self.hash {
                        self.hash
                    } else {
                        spec.block
                    };
                    max = (curr + margin).min(hashes.len() as u64 * self.hash);
                }
                let (lists, new_len) = self.cpu.find(spec, &f, max, drop);
                if drop {
                    verified.push(idx);
                } else if new_len < curr {
                    verified.clear();
                }
                curr = new_len;
                for (&g, l) in spec.ids.iter().zip(lists) {
                    by_group[g as usize] = Some(l);
                    len_by_group[g as usize] = new_len;
                }
            }
            if curr >= hit_length {
                break;
            }
            hit_length = curr;
            if simple_hybrid {
                break;
            }
        }
        for spec in specs.iter().filter(|s| s.kind == GroupKind::FullAttention) {
            let keep = hit_length.div_ceil(spec.block) as usize;
            for &g in &spec.ids {
                if let Some(l) = &mut by_group[g as usize] {
                    l.truncate(keep);
                }
            }
        }
        (
            by_group
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect(),
            hit_length,
        )
    }

    /// `get_num_new_matched_tokens(request, num_computed_tokens)`.
    pub fn lookup(&mut self, r: &LookupRequest<'_>, computed: u64) -> (u64, bool) {
        if let Some(p) = self.pending_hits.iter().position(|(i, _, _)| *i == r.req) {
            let (_, groups, _) = self.pending_hits.remove(p);
            self.cpu.free_blocks(&pins(&groups));
        }
        if r.skip_reading_prefix_cache || !computed.is_multiple_of(self.bs) {
            return (0, false);
        }
        for k in &self.kinds {
            if let GroupKind::ChunkedLocal { chunk } = *k
                && !computed.is_multiple_of(u64::from(chunk))
            {
                return (0, false);
            }
        }
        let skipped = (computed / self.hash) as usize;
        let remaining = r.block_hashes.get(skipped..).unwrap_or_default();
        if remaining.is_empty() {
            return (0, false);
        }
        let max_hit = r.num_tokens as i64 - 1 - computed as i64;
        if max_hit <= 0 {
            return (0, false);
        }
        let (groups, hit) = self.find_longest_cache_hit(remaining, max_hit as u64);
        if hit == 0 {
            return (0, false);
        }
        self.cpu.touch(&pins(&groups));
        self.pending_hits.push((r.req, groups, computed));
        (hit, true)
    }

    /// `update_state_after_alloc(request, blocks, num_external_tokens)`, `tables` the request's
    /// table per group.
    pub fn after_alloc(&mut self, gpu: &mut Gpu, req: u64, tables: &[&[u32]], ext: u64) {
        let num_groups = tables.len();
        if !self.lazy && get(&mut self.reqs_to_store, req).is_none() {
            self.reqs_to_store.push((
                req,
                StoreSt {
                    block_ids: vec![Vec::new(); num_groups],
                    stored: vec![0; num_groups],
                    events: Default::default(),
                    finished: false,
                },
            ));
        }
        let pending = self
            .pending_hits
            .iter()
            .position(|(i, _, _)| *i == req)
            .map(|p| self.pending_hits.remove(p));
        let Some((_, groups, computed)) = pending else {
            return;
        };
        if ext == 0 {
            self.cpu.free_blocks(&pins(&groups));
            return;
        }
        let (mut gpu_ids, mut cpu_ids) = (Vec::new(), Vec::new());
        for (g, table) in tables.iter().enumerate() {
            let cacheable = self.kinds.get(g).is_some_and(|k| k.is_cacheable());
            if !cacheable {
                continue;
            }
            let gb = self.blocks[g];
            let take = ext.div_ceil(gb) as usize;
            let start = (computed / gb) as usize;
            let hit = groups.get(g).map_or(&[][..], |h| &h[..h.len().min(take)]);
            for (i, b) in hit.iter().enumerate() {
                if let Some(c) = b {
                    gpu_ids.push(table[start + i]);
                    cpu_ids.push(*c);
                }
            }
        }
        self.cpu.touch(&cpu_ids);
        self.cpu.free_blocks(&pins(&groups));
        gpu.touch(&gpu_ids).expect("in range");
        self.reqs_to_load.push((
            req,
            LoadSt {
                event: None,
                gpu: gpu_ids,
                cpu: cpu_ids,
            },
        ));
    }
}
