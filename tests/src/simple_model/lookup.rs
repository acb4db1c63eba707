//! The model's lookup and load paths: vLLM 0.33.0's `get_num_new_matched_tokens` and
//! `update_state_after_alloc`, with the CPU coordinator's `find_longest_cache_hit` written
//! the way vLLM runs it: prefix-cacheable groups of one spec merged into a spec group and
//! looked up together, full attention sorted first, each kind's manager producing hit lists
//! with null padding, and the hybrid coordinator's shrinking loop (one pass only for a
//! simple hybrid), with no shortcut taken from what the loop is meant to compute.

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
    /// The member groups, in group order.
    pub ids: Vec<u32>,
}

/// `verify_and_split_kv_cache_groups`: the prefix-cacheable groups merged by equal spec (in
/// order of first appearance), then a stable sort putting full attention first.
pub fn spec_groups(kinds: &[GroupKind]) -> Vec<SpecGroup> {
    let mut out: Vec<SpecGroup> = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        if kind == GroupKind::Scratch {
            continue;
        }
        match out.iter_mut().find(|s| s.kind == kind) {
            Some(s) => s.ids.push(i as u32),
            None => out.push(SpecGroup {
                kind,
                ids: vec![i as u32],
            }),
        }
    }
    out.sort_by_key(|s| s.kind != GroupKind::FullAttention);
    out
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

    /// The manager of `kind`'s `find_longest_cache_hit` over `hashes`, for the groups `ids`,
    /// at most `max_length` tokens: the hit lists (one per group) and the hit in tokens.
    fn find(
        &self,
        kind: GroupKind,
        hashes: &[u64],
        max_length: u64,
        ids: &[u32],
        bs: u64,
    ) -> (Vec<Hit>, u64) {
        let max_blocks = (max_length / bs) as usize;
        let mut lists: Vec<Hit> = vec![Vec::new(); ids.len()];
        match kind {
            // Full attention: the leading run of blocks every group holds.
            GroupKind::FullAttention | GroupKind::Scratch => {
                for i in 0..max_blocks.min(hashes.len()) {
                    let Some(found) = self.get_cached_block(hashes.get(i), ids) else {
                        break;
                    };
                    for (l, b) in lists.iter_mut().zip(found) {
                        l.push(Some(b));
                    }
                }
            }
            // Sliding window: right to left, the first run of `cdiv(window − 1, bs)` held
            // blocks ends the hit; blocks before it stay null. Without one, the run from the
            // first block (possibly empty) is the hit.
            GroupKind::SlidingWindow { window } => {
                let need = (u64::from(window) - 1).div_ceil(bs);
                for l in &mut lists {
                    *l = vec![None; max_blocks];
                }
                let mut run = 0u64;
                let mut matched = false;
                for i in (0..max_blocks).rev() {
                    match self.get_cached_block(hashes.get(i), ids) {
                        Some(found) => {
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
                if !matched {
                    for l in &mut lists {
                        l.truncate(run as usize);
                    }
                }
            }
            // Chunked local: blocks wholly before the chunk holding token `max_length` are
            // null; from there, the leading run of held blocks.
            GroupKind::ChunkedLocal { chunk } => {
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
                for i in start..max_blocks {
                    let Some(found) = self.get_cached_block(hashes.get(i), ids) else {
                        break;
                    };
                    for (l, b) in lists.iter_mut().zip(found) {
                        l.push(Some(b));
                    }
                }
            }
            // Mamba (align mode, block-sized hashes): the last held state, nulls before it.
            GroupKind::Mamba => {
                for i in (0..max_blocks).rev() {
                    if let Some(found) = self.get_cached_block(hashes.get(i), ids) {
                        for (l, b) in lists.iter_mut().zip(found) {
                            l.extend(std::iter::repeat_n(None, i));
                            l.push(Some(b));
                        }
                        break;
                    }
                }
            }
        }
        let len = lists.first().map_or(0, Vec::len) as u64 * bs;
        (lists, len)
    }
}

impl SimpleModel {
    /// The CPU coordinator's `find_longest_cache_hit(block_hashes, max_cache_hit_length)`:
    /// the hit lists indexed by group (empty for a group not looked up) and the hit length
    /// in tokens.
    pub fn find_longest_cache_hit(&self, hashes: &[u64], max_len: u64) -> (HitGroups, u64) {
        let bs = self.bs;
        let n = self.kinds.len();
        if n == 1 {
            // `UnitaryKVCacheCoordinator`: the one manager's answer.
            return self.cpu.find(self.kinds[0], hashes, max_len, &[0], bs);
        }
        let specs = spec_groups(&self.kinds);
        let mut hit_length = max_len;
        let mut by_group: Vec<Option<Hit>> = vec![None; n];
        let mut len_by_group = vec![0u64; n];
        let simple_hybrid = specs.len() == 2 && specs[0].kind == GroupKind::FullAttention;
        loop {
            let mut curr = hit_length;
            for spec in &specs {
                let first = spec.ids[0] as usize;
                if spec.kind == GroupKind::FullAttention && by_group[first].is_some() {
                    // Looked up once; later passes only trim.
                    curr = curr.min(len_by_group[first]);
                    continue;
                }
                let (lists, new_len) = self.cpu.find(spec.kind, hashes, curr, &spec.ids, bs);
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
        let keep = hit_length.div_ceil(bs) as usize;
        for spec in specs.iter().filter(|s| s.kind == GroupKind::FullAttention) {
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
        let skipped = (computed / self.bs) as usize;
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
        let take = ext.div_ceil(self.bs) as usize;
        let start = (computed / self.bs) as usize;
        let (mut gpu_ids, mut cpu_ids) = (Vec::new(), Vec::new());
        for (g, table) in tables.iter().enumerate() {
            let cacheable = self.kinds.get(g).is_some_and(|k| k.is_cacheable());
            if !cacheable {
                continue;
            }
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
