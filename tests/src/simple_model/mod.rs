//! A reference model of vLLM 0.33.0's `SimpleCPUOffloadScheduler` for any layout of
//! KV-cache groups ([`SimpleModel::kinds`]: full attention, sliding window, chunked local,
//! Mamba in align mode, scratch), written as a direct restatement of `manager.py` and of the
//! CPU coordinator's lookup (`lookup.rs`: spec groups, per-group hit lists with null entries,
//! the hybrid coordinator's loop): insertion-ordered `Vec`s for its dicts,
//! `BTreeMap`/`BTreeSet` where order does not matter, and a naive CPU `BlockPool` (a
//! `VecDeque` free list, a map from key to the blocks holding it in insertion order).
//!
//! It drives the same kind of GPU pool as the module (a kvtier `BlockPool`), so a harness can
//! run both on twin GPU pools and compare every answer, plan, stats payload and event.

#![allow(
    clippy::cast_possible_truncation,
    reason = "test model: block counts, ids and token counts are small"
)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::{
    GroupKind, Medium, Progress, Scheduled, SimpleEvent, StepInput, StoredMeta,
};

mod completion;
mod lookup;
use kvtier_core::stats::simple_offload::SaveOutcome;
pub use lookup::{Hit, SpecGroup, spec_groups};

/// A hit's blocks per group, `None` for the null block (vLLM's tuple of block lists).
pub type HitGroups = Vec<Vec<Option<u32>>>;

/// The GPU pool both sides drive.
pub type Gpu = BlockPool<BlockKey>;

/// The naive CPU pool: vLLM's `BlockPool` with caching on.
#[derive(Clone, Debug)]
pub struct NaivePool {
    /// Free queue, front first.
    pub free: VecDeque<u32>,
    /// Reference counts.
    pub refs: Vec<u32>,
    /// Each block's hash.
    pub hash: Vec<Option<BlockKey>>,
    /// Each block's secondary hashes (`cached_block_hashes_by_block`), in insertion order.
    pub secondary: Vec<Vec<BlockKey>>,
    /// Key → blocks holding it, first inserted first.
    pub map: BTreeMap<BlockKey, Vec<u32>>,
}

impl NaivePool {
    fn new(n: u32) -> Self {
        NaivePool {
            free: (1..n).collect(),
            refs: vec![0; n as usize],
            hash: vec![None; n as usize],
            secondary: vec![Vec::new(); n as usize],
            map: BTreeMap::new(),
        }
    }
    /// `_insert_block_hash(key, block)`: a block without a hash takes it as its hash, one
    /// with a hash as a secondary one, unless it holds `key` already.
    pub(crate) fn insert(&mut self, b: u32, key: BlockKey) {
        let holds = self.map.get(&key).is_some_and(|v| v.contains(&b));
        if holds {
            return;
        }
        if self.hash[b as usize].is_none() {
            self.hash[b as usize] = Some(key);
        } else {
            self.secondary[b as usize].push(key);
        }
        self.map.entry(key).or_default().push(b);
    }
    /// `get_one_block`.
    pub fn get_one(&self, k: &BlockKey) -> Option<u32> {
        self.map.get(k).and_then(|v| v.first().copied())
    }
    fn get_new(&mut self, n: usize, removed: &mut Vec<BlockKey>) -> Vec<u32> {
        let got: Vec<u32> = self.free.drain(..n).collect();
        for &b in &got {
            // `_remove_cached_block_hashes`: its hash, then its secondary hashes.
            let keys: Vec<BlockKey> = self.hash[b as usize]
                .take()
                .into_iter()
                .chain(std::mem::take(&mut self.secondary[b as usize]))
                .collect();
            for k in keys {
                let v = self.map.get_mut(&k).expect("hashed blocks are mapped");
                v.retain(|&x| x != b);
                if v.is_empty() {
                    self.map.remove(&k);
                }
                removed.push(k);
            }
            self.refs[b as usize] += 1;
        }
        got
    }
    pub(crate) fn touch(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().filter(|&&b| b != 0) {
            if self.refs[b as usize] == 0 {
                self.free.retain(|&x| x != b);
            }
            self.refs[b as usize] += 1;
        }
    }
    pub(crate) fn free_blocks(&mut self, blocks: &[u32]) {
        let (mut front, mut back) = (Vec::new(), Vec::new());
        for &b in blocks.iter().filter(|&&b| b != 0) {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.hash[b as usize].is_some() {
                    back.push(b);
                } else {
                    front.push(b);
                }
            }
        }
        for &b in front.iter().rev() {
            self.free.push_front(b);
        }
        self.free.extend(back);
    }
}

/// The payload of a secondary hash: its key, parent hash and first token (vLLM's
/// `meta_by_hash` entries other than the block's own hash).
pub(crate) type Boundary = (BlockKey, Option<u64>, u64);

#[derive(Clone, Debug, Default)]
pub(crate) struct Transfer {
    pub(crate) gpu: Vec<u32>,
    pub(crate) cpu: Vec<u32>,
    pub(crate) meta: Vec<Option<StoredMeta>>,
    /// Per block: the request's hash boundaries inside it (positional stores, events on).
    pub(crate) bounds: Vec<Vec<Boundary>>,
}

/// What `_select_eager_blocks_to_store` picks: GPU blocks, their payloads and boundaries,
/// each group's cursor advance.
pub(crate) type Selection = (
    Vec<u32>,
    Vec<Option<StoredMeta>>,
    Vec<Vec<Boundary>>,
    Vec<usize>,
);

#[derive(Clone, Debug)]
pub(crate) struct LoadSt {
    pub(crate) event: Option<u64>,
    pub(crate) gpu: Vec<u32>,
    pub(crate) cpu: Vec<u32>,
}

#[derive(Clone, Debug)]
pub(crate) struct StoreSt {
    /// The request's table per group, as the scheduler output gave it.
    pub(crate) block_ids: Vec<Vec<u32>>,
    /// `num_stored_blocks`: the scan's cursor per group.
    pub(crate) stored: Vec<usize>,
    pub(crate) events: BTreeSet<u64>,
    pub(crate) finished: bool,
}

/// What a drain reports, read the same way off the module's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStats {
    /// Outcome deltas in `SaveOutcome::ALL` order (`None` when not emitted).
    pub outcomes: Vec<Option<u64>>,
    /// `load_blocks_total` (`None` when not emitted).
    pub load_blocks: Option<u64>,
    /// `used_blocks`.
    pub used: i64,
    /// `pending_store_blocks`.
    pub pending: i64,
}

/// A plan as owned lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPlan {
    /// Store event.
    pub store_event: Option<u64>,
    /// Store GPU list.
    pub store_gpu: Vec<u32>,
    /// Store CPU list.
    pub store_cpu: Vec<u32>,
    /// Load event.
    pub load_event: Option<u64>,
    /// Load GPU list.
    pub load_gpu: Vec<u32>,
    /// Load CPU list.
    pub load_cpu: Vec<u32>,
}

/// The model.
#[derive(Clone, Debug)]
pub struct SimpleModel {
    /// The scheduler's block size.
    pub(crate) bs: u64,
    /// The hash block size.
    pub(crate) hash: u64,
    /// Each group's block size.
    pub(crate) blocks: Vec<u64>,
    /// Each group drops EAGLE's block.
    pub(crate) drop: Vec<bool>,
    /// Fine-grained hits (`enable_partial_hash_hits`).
    pub(crate) fine: bool,
    /// `max(0, num_prefill_lookahead − 1)`.
    pub(crate) reprefillable: u64,
    pub(crate) num_cpu: u32,
    pub(crate) lazy: bool,
    pub(crate) target_free: usize,
    pub(crate) world: u32,
    pub(crate) events_on: bool,
    /// The CPU pool.
    pub cpu: NaivePool,
    /// The KV-cache groups' kinds, in group order (one full-attention group unless set after
    /// [`SimpleModel::new`]).
    pub kinds: Vec<GroupKind>,
    /// `_pending_cpu_hits`: per request, the hit's blocks per group (`None`: the null block)
    /// and the computed tokens it was found after.
    pub(crate) pending_hits: Vec<(u64, HitGroups, u64)>,
    pub(crate) reqs_to_load: Vec<(u64, LoadSt)>,
    pub(crate) abandoned_loads: Vec<(u64, LoadSt)>,
    pub(crate) reqs_to_store: Vec<(u64, StoreSt)>,
    pub(crate) events_to_blocks: BTreeMap<u64, Transfer>,
    pub(crate) abandoned: BTreeMap<u64, Transfer>,
    pub(crate) event_reqs: BTreeMap<u64, Vec<u64>>,
    pub(crate) in_flight: BTreeSet<u32>,
    pub(crate) flushes: Vec<Transfer>,
    pub(crate) counts: BTreeMap<u64, u32>,
    pub(crate) cursor: Option<u32>,
    pub(crate) load_counter: u64,
    pub(crate) store_counter: u64,
    pub(crate) current: [u64; 7],
    pub(crate) snapshot: [u64; 7],
    pub(crate) interval_load: u64,
    /// Events recorded (drained by the harness).
    pub events: Vec<SimpleEvent>,
}

/// The non-null blocks of a hit's groups, group by group (`_free_pending_cpu_hit`'s order).
pub(crate) fn pins(groups: &[Vec<Option<u32>>]) -> Vec<u32> {
    groups.iter().flatten().filter_map(|b| *b).collect()
}

pub(crate) fn idx(o: SaveOutcome) -> usize {
    SaveOutcome::ALL.iter().position(|&x| x == o).unwrap_or(0)
}

pub(crate) fn get<T>(v: &mut [(u64, T)], id: u64) -> Option<&mut T> {
    v.iter_mut().find(|(i, _)| *i == id).map(|(_, t)| t)
}

pub(crate) fn pop<T>(v: &mut Vec<(u64, T)>, id: u64) -> Option<T> {
    let p = v.iter().position(|(i, _)| *i == id)?;
    Some(v.remove(p).1)
}

impl SimpleModel {
    /// A model for the given facts (see `SimpleConfig`).
    pub fn new(
        bs: u32,
        num_cpu: u32,
        lazy: bool,
        target_free: u32,
        world: u32,
        events_on: bool,
    ) -> Self {
        SimpleModel {
            bs: u64::from(bs),
            hash: u64::from(bs),
            blocks: vec![u64::from(bs)],
            drop: vec![false],
            fine: false,
            reprefillable: 0,
            num_cpu,
            lazy,
            target_free: target_free as usize,
            world,
            events_on,
            cpu: NaivePool::new(num_cpu),
            kinds: vec![GroupKind::FullAttention],
            pending_hits: Vec::new(),
            reqs_to_load: Vec::new(),
            abandoned_loads: Vec::new(),
            reqs_to_store: Vec::new(),
            events_to_blocks: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            event_reqs: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            flushes: Vec::new(),
            counts: BTreeMap::new(),
            cursor: None,
            load_counter: 0,
            store_counter: 0,
            current: [0; 7],
            snapshot: [0; 7],
            interval_load: 0,
            events: Vec::new(),
        }
    }

    /// Sets the layout: the groups' kinds and block sizes, the hash block size, EAGLE's drop
    /// (`use_eagle`: the `marked` groups, all when none is), and decides fine-grained hits
    /// as vLLM's `partial_hash_hits_enabled` does (eager only; a Mamba group whose block is
    /// larger than the hash block; every other prefix-cacheable group full attention, Mamba
    /// or of the hash block size).
    pub fn set_layout(
        &mut self,
        kinds: &[GroupKind],
        blocks: &[u32],
        hash: u32,
        use_eagle: bool,
        marked: &[bool],
    ) {
        self.kinds = kinds.to_vec();
        self.blocks = blocks.iter().map(|&b| u64::from(b)).collect();
        self.hash = u64::from(hash);
        let none_marked = !marked.iter().any(|&m| m);
        self.drop = (0..kinds.len())
            .map(|g| use_eagle && (none_marked || marked.get(g).copied().unwrap_or(false)))
            .collect();
        let cacheable: Vec<(GroupKind, u64)> = kinds
            .iter()
            .zip(&self.blocks)
            .filter(|(k, _)| k.is_cacheable())
            .map(|(&k, &b)| (k, b))
            .collect();
        self.fine = !self.lazy
            && kinds.len() > 1
            && cacheable
                .iter()
                .any(|&(k, b)| k == GroupKind::Mamba && b > self.hash)
            && cacheable.iter().all(|&(k, b)| {
                matches!(k, GroupKind::FullAttention | GroupKind::Mamba) || b == self.hash
            });
    }

    pub(crate) fn medium(&self) -> Medium {
        Medium::Cpu
    }

    pub(crate) fn get_new(&mut self, n: usize) -> Vec<u32> {
        let mut removed = Vec::new();
        let got = self.cpu.get_new(n, &mut removed);
        if self.events_on {
            for key in removed {
                self.events.push(SimpleEvent::Removed {
                    key,
                    medium: self.medium(),
                });
            }
        }
        got
    }

    fn classify(&self, gpu: &Gpu, g: u32) -> Option<SaveOutcome> {
        if g == 0 {
            return Some(SaveOutcome::DroppedNullBlock);
        }
        let Some(h) = gpu.block_hash(g) else {
            return Some(SaveOutcome::DroppedNotHashed);
        };
        if self.in_flight.contains(&g) {
            return Some(SaveOutcome::SkippedInFlight);
        }
        if self.cpu.get_one(&h.key).is_some() {
            return Some(SaveOutcome::SkippedAlreadyCached);
        }
        None
    }

    /// `get_num_cacheable_tokens(num_computed_tokens, group)`.
    fn cacheable(&self, n: u64, g: usize) -> u64 {
        if self.kinds.len() == 1 {
            // The unitary coordinator: all but the re-prefillable tail.
            return n.saturating_sub(self.reprefillable);
        }
        let align = |n: u64| if self.fine { n } else { n / self.bs * self.bs };
        let cached = align(n);
        // The hybrid coordinator propagates the spec group's EAGLE flag to its managers.
        let specs = lookup::spec_groups(&self.kinds, &self.blocks, &self.drop);
        let eagle = specs.iter().any(|s| s.eagle && s.ids.contains(&(g as u32)));
        if eagle && cached > 0 {
            let finalized = n.saturating_sub(self.reprefillable);
            return finalized.min(align(finalized) + self.blocks[g]);
        }
        cached
    }

    /// `_select_eager_blocks_to_store`: the confirmed blocks of every positional
    /// prefix-cacheable group, group after group from each group's cursor `stored[g]`, that
    /// are ready to store while CPU blocks are free (a null entry is stored from the GPU's
    /// prefix cache while a block is cached there under the group's key); with their event
    /// metadata and each group's cursor advance.
    pub(crate) fn select(
        &self,
        gpu: &Gpu,
        req: u64,
        tables: &[&[u32]],
        stored: &[usize],
        p: &Progress<'_>,
    ) -> Selection {
        let (mut sel, mut meta, mut bounds) = (Vec::new(), Vec::new(), Vec::new());
        let mut adv = vec![0; self.kinds.len()];
        let num_free = self.cpu.free.len();
        let confirmed = p
            .num_computed_tokens
            .saturating_sub(p.num_output_placeholders);
        let hashes = p.block_hashes;
        for (g, ids) in tables.iter().enumerate() {
            let Some(&kind) = self.kinds.get(g) else {
                continue;
            };
            if !kind.is_cacheable() {
                continue;
            }
            if sel.len() >= num_free {
                break;
            }
            // Align-mode Mamba tables are not positionally stable.
            if kind == GroupKind::Mamba {
                continue;
            }
            let gb = self.blocks[g];
            let per = (gb / self.hash) as usize;
            let ready = ids.len().min((self.cacheable(confirmed, g) / gb) as usize);
            let start = stored.get(g).copied().unwrap_or(0);
            let key = |k: usize| hashes.get(k).map(|&h| BlockKey::new(h, g as u32));
            for i in start..ready {
                let mut b = ids[i];
                if b == 0 {
                    let cached = key((i + 1) * per - 1).and_then(|k| gpu.get_one_block(&k));
                    match cached {
                        Some(c) => b = c,
                        None => {
                            adv[g] += 1;
                            continue;
                        }
                    }
                }
                if self.classify(gpu, b).is_some() {
                    adv[g] += 1;
                    continue;
                }
                if sel.len() >= num_free {
                    break;
                }
                sel.push(b);
                adv[g] += 1;
                if self.events_on {
                    let parent = |k: usize| k.checked_sub(1).map(|j| hashes[j]);
                    meta.push(Some(StoredMeta {
                        req,
                        parent_hash: parent(i * per),
                        token_start: i as u64 * gb,
                    }));
                    let primary = gpu.block_hash(b).map(|h| h.key);
                    bounds.push(
                        (i * per..(i + 1) * per)
                            .filter_map(|k| Some((key(k)?, parent(k), k as u64 * self.hash)))
                            .filter(|&(k, _, _)| Some(k) != primary)
                            .collect(),
                    );
                } else {
                    meta.push(None);
                    bounds.push(Vec::new());
                }
            }
        }
        (sel, meta, bounds, adv)
    }

    /// `build_connector_meta(scheduler_output)`.
    pub fn build(&mut self, gpu: &mut Gpu, step: &StepInput<'_>) -> ModelPlan {
        let mut t = Transfer::default();
        let mut req_ids: Vec<u64> = Vec::new();
        if self.lazy {
            self.lazy_walk(gpu, &mut t);
        } else {
            self.eager(gpu, step, &mut t, &mut req_ids);
        }
        for f in std::mem::take(&mut self.flushes) {
            t.gpu.extend(f.gpu);
            t.cpu.extend(f.cpu);
            t.meta.extend(f.meta);
            t.bounds.extend(f.bounds);
        }
        let mut plan = ModelPlan {
            store_event: None,
            store_gpu: t.gpu.clone(),
            store_cpu: t.cpu.clone(),
            load_event: None,
            load_gpu: vec![],
            load_cpu: vec![],
        };
        if !t.gpu.is_empty() {
            let e = self.store_counter;
            self.store_counter += 1;
            self.events_to_blocks.insert(e, t);
            if !req_ids.is_empty() {
                for &r in &req_ids {
                    if let Some(st) = get(&mut self.reqs_to_store, r) {
                        st.events.insert(e);
                    }
                }
                self.event_reqs.insert(e, req_ids);
            }
            plan.store_event = Some(e);
        }
        let unissued: Vec<usize> = (0..self.reqs_to_load.len())
            .filter(|&i| self.reqs_to_load[i].1.event.is_none())
            .collect();
        if !unissued.is_empty() {
            let e = self.load_counter;
            self.load_counter += 1;
            for i in unissued {
                let l = &mut self.reqs_to_load[i].1;
                plan.load_gpu.extend(&l.gpu);
                plan.load_cpu.extend(&l.cpu);
                l.event = Some(e);
            }
            plan.load_event = Some(e);
        }
        plan
    }

    fn lazy_walk(&mut self, gpu: &mut Gpu, t: &mut Transfer) {
        if self.target_free == 0 {
            return;
        }
        let num_cpu_free = self.cpu.free.len();
        if self
            .cursor
            .is_some_and(|c| gpu.ref_count(c).unwrap_or(0) > 0)
        {
            self.cursor = None;
        }
        let mut last = self.cursor;
        let nodes: Vec<u32> = gpu.free_queue().iter_after(self.cursor).collect();
        for (covered, node) in nodes.into_iter().enumerate() {
            if covered >= self.target_free || t.gpu.len() >= num_cpu_free {
                break;
            }
            last = Some(node);
            if let Some(h) = gpu.block_hash(node)
                && node != 0
                && self.cpu.get_one(&h.key).is_none()
            {
                t.gpu.push(node);
            }
        }
        self.cursor = last;
        if !t.gpu.is_empty() {
            t.cpu = self.get_new(t.gpu.len());
            t.meta = vec![None; t.gpu.len()];
            t.bounds = vec![Vec::new(); t.gpu.len()];
            gpu.touch(&t.gpu).expect("in range");
        }
    }

    fn eager(
        &mut self,
        gpu: &mut Gpu,
        step: &StepInput<'_>,
        t: &mut Transfer,
        req_ids: &mut Vec<u64>,
    ) {
        let mut num_free = self.cpu.free.len();
        for h in step.handoffs {
            let gone = match get(&mut self.reqs_to_store, h.req) {
                None => true,
                Some(st) => {
                    st.finished || step.preempted.contains(&h.req) || step.finished.contains(&h.req)
                }
            };
            if gone {
                self.current[idx(SaveOutcome::DroppedRequestGone)] += h.gpu_blocks.len() as u64;
                continue;
            }
            let mut scheduled = false;
            for &g in h.gpu_blocks {
                if let Some(o) = self.classify(gpu, g) {
                    self.current[idx(o)] += 1;
                    continue;
                }
                if num_free == 0 {
                    self.current[idx(SaveOutcome::DroppedCpuFull)] += 1;
                    continue;
                }
                let c = self.get_new(1)[0];
                t.gpu.push(g);
                t.cpu.push(c);
                t.meta.push(None);
                t.bounds.push(Vec::new());
                self.in_flight.insert(g);
                gpu.touch(&[g]).expect("in range");
                num_free -= 1;
                self.current[idx(SaveOutcome::Stored)] += 1;
                scheduled = true;
            }
            if scheduled {
                req_ids.push(h.req);
            }
        }
        for &r in step.preempted {
            if let Some(st) = get(&mut self.reqs_to_store, r) {
                st.block_ids.iter_mut().for_each(Vec::clear);
                st.stored.iter_mut().for_each(|s| *s = 0);
            }
        }
        for sc in step.scheduled {
            self.eager_one(gpu, sc, t, req_ids);
        }
        let mut seen = BTreeSet::new();
        req_ids.retain(|r| seen.insert(*r));
    }

    fn eager_one(
        &mut self,
        gpu: &mut Gpu,
        sc: &Scheduled<'_>,
        t: &mut Transfer,
        req_ids: &mut Vec<u64>,
    ) {
        let Some(st) = get(&mut self.reqs_to_store, sc.req).filter(|s| !s.finished) else {
            return;
        };
        if sc.full_table {
            st.block_ids.iter_mut().for_each(Vec::clear);
        }
        if let Some(new) = sc.new_block_ids {
            for (table, new) in st.block_ids.iter_mut().zip(new) {
                table.extend_from_slice(new);
            }
        }
        if sc.num_scheduled_tokens == 0 {
            return;
        }
        let ids = st.block_ids.clone();
        let tables: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let stored = st.stored.clone();
        let (sel, meta, bounds, adv) = self.select(gpu, sc.req, &tables, &stored, &sc.progress);
        if !sel.is_empty() {
            let cpu = self.get_new(sel.len());
            req_ids.push(sc.req);
            t.gpu.extend(&sel);
            t.cpu.extend(cpu);
            self.in_flight.extend(&sel);
            t.meta.extend(meta);
            t.bounds.extend(bounds);
            gpu.touch(&sel).expect("in range");
        }
        if let Some(st) = get(&mut self.reqs_to_store, sc.req) {
            for (s, a) in st.stored.iter_mut().zip(adv) {
                *s += a;
            }
        }
    }
}
