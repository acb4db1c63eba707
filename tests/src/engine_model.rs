//! A reference model of the engine step model (`docs/engine-model.md`) and a recording
//! connector, for the GPU front's property tests.
//!
//! [`ModelEngine`] restates the model in the plainest terms: a `VecDeque` free list whose
//! blocks are found by linear search, a `BTreeMap` from hash to the blocks holding it, and
//! each queue a `Vec`. [`Recorder`] is the tier behind either engine: it holds the hashes
//! offered at `prefill_done` (no capacity, no eviction) and logs every call, so the two
//! engines can be compared call for call.

#![allow(
    clippy::cast_possible_truncation,
    clippy::missing_panics_doc,
    clippy::expect_used,
    reason = "test model: small numbers, invariants the test inputs keep"
)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvtier_cli::engine::GroupTables;
use kvtier_cli::engine::{Connector, EngineConfig, FinishedRequest, LookupQuery, StepRecord};
use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;

/// One connector call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `lookup(rid, gpu hit, cap)` and its answer.
    Lookup(u64, usize, usize, usize),
    /// `allocated(rid, table, external)`.
    Allocated(u64, Vec<u32>, usize),
    /// `load_done(rid)`.
    LoadDone(u64),
    /// `prefill_done(rid)`.
    Prefill(u64),
    /// `step(step, [(rid, computed, scheduled, table, new blocks, full table)], preempted)`.
    Step(u64, Vec<(u64, u64, u64, Vec<u32>, usize, bool)>, Vec<u64>),
    /// `finished(rid, table)`.
    Finished(u64, Vec<u32>),
    /// A hybrid model's state table at `allocated(rid, …)` (logged after it).
    States(u64, Vec<u32>),
    /// A step's hand-offs (logged after its `Step`, when there are any).
    Handoffs(u64, Vec<(u64, Vec<u32>)>),
}

/// The tier of the tests: every offered hash is kept; lookups count the leading held hashes.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Hashes stored.
    pub tier: BTreeSet<u64>,
    /// Per request: its hashes and the first offered block.
    pending: BTreeMap<u64, (Vec<u64>, usize)>,
    /// The calls, in order.
    pub log: Vec<Call>,
}

impl Recorder {
    /// A recorder whose tier already holds `tier`.
    #[must_use]
    pub fn with_tier(tier: &[u64]) -> Self {
        Recorder {
            tier: tier.iter().copied().collect(),
            ..Recorder::default()
        }
    }

    /// `lookup`: the leading hashes of `hashes[gpu_hit..]` the tier holds, at most `cap`.
    pub fn lookup(&mut self, rid: u64, hashes: &[u64], gpu_hit: usize, cap: usize) -> usize {
        let n = hashes[gpu_hit..]
            .iter()
            .take(cap)
            .take_while(|h| self.tier.contains(h))
            .count();
        self.log.push(Call::Lookup(rid, gpu_hit, cap, n));
        n
    }

    /// `allocated`.
    pub fn allocated(
        &mut self,
        rid: u64,
        hashes: &[u64],
        gpu_hit: usize,
        table: &[u32],
        ext: usize,
    ) {
        self.pending.insert(rid, (hashes.to_vec(), gpu_hit + ext));
        self.log.push(Call::Allocated(rid, table.to_vec(), ext));
    }

    /// `prefill_done`: the blocks past the hits join the tier.
    pub fn prefill(&mut self, rid: u64) {
        if let Some((hashes, from)) = self.pending.get(&rid) {
            self.tier.extend(hashes[*from..].iter().copied());
        }
        self.log.push(Call::Prefill(rid));
    }
}

impl Connector for Recorder {
    type Error = core::convert::Infallible;

    fn lookup(&mut self, q: &LookupQuery<'_>) -> Result<usize, Self::Error> {
        Ok(Recorder::lookup(
            self,
            q.rid,
            q.block_hashes,
            q.gpu_hit_blocks,
            q.max_hit_blocks,
        ))
    }

    fn allocated(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        q: &LookupQuery<'_>,
        tables: GroupTables<'_>,
        ext: usize,
    ) -> Result<(), Self::Error> {
        Recorder::allocated(
            self,
            q.rid,
            q.block_hashes,
            q.gpu_hit_blocks,
            tables.attention,
            ext,
        );
        if !tables.mamba.is_empty() {
            self.log.push(Call::States(q.rid, tables.mamba.to_vec()));
        }
        Ok(())
    }

    fn load_done(&mut self, rid: u64) -> Result<(), Self::Error> {
        self.log.push(Call::LoadDone(rid));
        Ok(())
    }

    fn prefill_done(&mut self, rid: u64) -> Result<(), Self::Error> {
        self.prefill(rid);
        Ok(())
    }

    fn step(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        s: &StepRecord<'_>,
    ) -> Result<(), Self::Error> {
        let sched = s
            .scheduled
            .iter()
            .map(|r| {
                (
                    r.rid,
                    r.num_computed_tokens,
                    r.num_scheduled_tokens,
                    r.block_ids.to_vec(),
                    r.num_new_blocks,
                    r.full_table,
                )
            })
            .collect();
        self.log
            .push(Call::Step(s.step, sched, s.preempted.to_vec()));
        if !s.handoffs.is_empty() {
            let h = s.handoffs.iter().map(|h| (h.req, h.gpu_blocks.to_vec()));
            self.log.push(Call::Handoffs(s.step, h.collect()));
        }
        Ok(())
    }

    fn finished(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), Self::Error> {
        self.log
            .push(Call::Finished(req.rid, req.block_ids.to_vec()));
        Ok(())
    }
}

/// A request of the model.
#[derive(Clone, Debug)]
struct R {
    rid: u64,
    hashes: Vec<u64>,
    prompt: u64,
    table: Vec<u32>,
    /// A hybrid model's state table (0: the null block).
    states: Vec<u32>,
    computed: u64,
    outputs: u64,
    cached: usize,
    admitted: bool,
    gpu_hit: usize,
    ext: usize,
    preempted: bool,
    prefilled: bool,
    end: u64,
    sched: u64,
    new: usize,
    full: bool,
}

impl R {
    fn tokens(&self) -> u64 {
        self.prompt + self.outputs
    }
}

/// The reference engine. Counts: `(steps, preemptions, prefix queries, prefix hits,
/// external queries, external hits, finished)`.
#[derive(Debug)]
pub struct ModelEngine {
    cfg: EngineConfig,
    free: VecDeque<u32>,
    refs: Vec<u32>,
    /// Each block's key: its hash and group (1: a hybrid model's Mamba states).
    hash_of: Vec<Option<(u64, u32)>>,
    cached: BTreeMap<(u64, u32), Vec<u32>>,
    /// Hand-offs made since the last step's schedule: `(request, state block)`.
    offers: Vec<(u64, u32)>,
    waiting: Vec<R>,
    holding: Vec<R>,
    running: Vec<R>,
    loading: Vec<R>,
    finishing: Vec<R>,
    /// `(steps, preemptions, prefix queries, prefix hits, external queries, external hits,
    /// finished)`.
    pub counts: [u64; 7],
}

impl ModelEngine {
    /// An idle model of `cfg`.
    #[must_use]
    pub fn new(cfg: EngineConfig) -> Self {
        let n = cfg.num_gpu_blocks as usize;
        ModelEngine {
            cfg,
            free: (1..cfg.num_gpu_blocks).collect(),
            refs: vec![0; n],
            hash_of: vec![None; n],
            cached: BTreeMap::new(),
            offers: Vec::new(),
            waiting: Vec::new(),
            holding: Vec::new(),
            running: Vec::new(),
            loading: Vec::new(),
            finishing: Vec::new(),
            counts: [0; 7],
        }
    }

    /// The free list, front first.
    #[must_use]
    pub fn free_list(&self) -> Vec<u32> {
        self.free.iter().copied().collect()
    }

    /// Whether every request has freed its blocks.
    #[must_use]
    pub fn idle(&self) -> bool {
        [
            &self.waiting,
            &self.holding,
            &self.running,
            &self.loading,
            &self.finishing,
        ]
        .iter()
        .all(|q| q.is_empty())
    }

    /// An arrival; then steps while `max_num_seqs` requests wait. The request must fit.
    /// `Err(step)` when a step made no progress (the engine's `Stalled`).
    pub fn arrive(&mut self, rid: u64, hashes: &[u64], tier: &mut Recorder) -> Result<(), u64> {
        let bt = u64::from(self.cfg.block_tokens);
        self.waiting.push(R {
            rid,
            hashes: hashes.to_vec(),
            prompt: hashes.len() as u64 * bt,
            table: vec![],
            states: vec![],
            computed: 0,
            outputs: 0,
            cached: 0,
            admitted: false,
            gpu_hit: 0,
            ext: 0,
            preempted: false,
            prefilled: false,
            end: 0,
            sched: 0,
            new: 0,
            full: false,
        });
        while self.waiting.len() >= self.cfg.max_num_seqs {
            self.step(tier)?;
        }
        Ok(())
    }

    /// Steps until idle; `Err(step)` as [`ModelEngine::arrive`].
    pub fn finish(&mut self, tier: &mut Recorder) -> Result<(), u64> {
        while !self.idle() {
            self.step(tier)?;
        }
        Ok(())
    }

    fn take_free(&mut self) -> u32 {
        let b = self.free.pop_front().expect("checked");
        if let Some(h) = self.hash_of[b as usize].take() {
            let v = self.cached.get_mut(&h).expect("indexed");
            v.retain(|&x| x != b);
            if v.is_empty() {
                self.cached.remove(&h);
            }
        }
        self.refs[b as usize] = 1;
        b
    }

    /// A hybrid model first frees every state of `r` but its last; then, if `reserved` leaves
    /// room for both groups, touches `hits` (and the hit's state), extends the table to
    /// `tokens` tokens, then the state table: the hit's state at its position, and a new
    /// block when `tokens` reach a new position.
    fn alloc(
        &mut self,
        r: &mut R,
        hits: &[u32],
        state: Option<(usize, u32)>,
        tokens: u64,
        reserved: u64,
    ) -> bool {
        let hybrid = self.cfg.hybrid;
        if let Some(last) = r.states.iter().rposition(|&b| b != 0) {
            let stale: Vec<u32> = r.states[..last]
                .iter()
                .copied()
                .filter(|&b| b != 0)
                .collect();
            r.states[..last].fill(0);
            self.release(&stale);
        }
        let want = tokens.div_ceil(u64::from(self.cfg.block_tokens)) as usize;
        let new = want.saturating_sub(r.table.len() + hits.len());
        let state_len = state.map_or(r.states.len(), |(n, _)| n);
        let state_new = usize::from(hybrid && want > state_len);
        let state_hit: Vec<u32> = state.map(|(_, b)| b).into_iter().collect();
        let idle = hits
            .iter()
            .chain(&state_hit)
            .filter(|&&b| self.refs[b as usize] == 0)
            .count();
        if (new + idle + state_new) as u64 + reserved > self.free.len() as u64 {
            return false;
        }
        for &b in hits.iter().chain(&state_hit) {
            self.refs[b as usize] += 1;
            self.free.retain(|&x| x != b);
        }
        r.table.extend_from_slice(hits);
        for _ in 0..new {
            let b = self.take_free();
            r.table.push(b);
        }
        if let Some((n, b)) = state {
            r.states.resize(n - 1, 0);
            r.states.push(b);
        }
        if state_new == 1 {
            r.states.resize(want - 1, 0);
            let b = self.take_free();
            r.states.push(b);
        }
        true
    }

    /// A hybrid model's chunk from `start` within `budget`: one ending inside the prompt ends
    /// on a block boundary.
    fn chunk(&self, r: &R, start: u64, budget: u64) -> u64 {
        let n = (r.tokens() - start).min(budget);
        if !self.cfg.hybrid || start + n >= r.prompt {
            return n;
        }
        let bt = u64::from(self.cfg.block_tokens);
        ((start + n) / bt * bt).saturating_sub(start)
    }

    /// Caches the state after `boundary` blocks, if held and not yet cached, and offers it.
    fn cache_state(&mut self, r: &R, boundary: usize) {
        let Some(i) = boundary.checked_sub(1) else {
            return;
        };
        let (Some(&b), Some(&h)) = (r.states.get(i), r.hashes.get(i)) else {
            return;
        };
        if b == 0 || self.hash_of[b as usize].is_some() {
            return;
        }
        self.hash_of[b as usize] = Some((h, 1));
        self.cached.entry((h, 1)).or_default().push(b);
        self.offers.push((r.rid, b));
    }

    /// Frees `r`'s tables (attention, then states) and drops its offers.
    fn free_request(&mut self, r: &mut R) {
        self.release(&r.table);
        let states: Vec<u32> = r.states.iter().copied().filter(|&b| b != 0).collect();
        self.release(&states);
        r.table.clear();
        r.states.clear();
        self.offers.retain(|&(rid, _)| rid != r.rid);
    }

    fn cache(&mut self, r: &mut R, full: usize) {
        for i in r.cached..full.min(r.hashes.len()) {
            let b = r.table[i];
            let h = r.hashes[i];
            self.hash_of[b as usize] = Some((h, 0));
            self.cached.entry((h, 0)).or_default().push(b);
        }
        r.cached = r.cached.max(full.min(r.hashes.len()));
    }

    fn release(&mut self, table: &[u32]) {
        let mut front = vec![];
        let mut back = vec![];
        for &b in table.iter().rev() {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.hash_of[b as usize].is_some() {
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

    fn reserve(&self) -> u64 {
        let bt = u64::from(self.cfg.block_tokens);
        let left = |r: &R| r.prompt.div_ceil(bt).saturating_sub(r.table.len() as u64);
        let run: u64 = self
            .running
            .iter()
            .filter(|r| r.computed + r.sched < r.prompt)
            .map(left)
            .sum();
        run + self.loading.iter().map(left).sum::<u64>()
            + self.holding.iter().map(left).sum::<u64>()
    }

    /// One step; `Err(step)` when it made no progress.
    pub fn step(&mut self, tier: &mut Recorder) -> Result<(), u64> {
        let t = self.counts[0];
        let mut progress = !self.loading.is_empty()
            || !self.finishing.is_empty()
            || self.running.iter().any(|r| r.prefilled && r.end >= t);
        let bt = u64::from(self.cfg.block_tokens);
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = vec![];
        for r in &mut self.running {
            (r.sched, r.new, r.full) = (0, 0, false);
        }
        // Running requests, in order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let n = self.chunk(&self.running[i], self.running[i].computed, budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let tokens = self.running[i].computed + n;
            let ok = loop {
                let mut r = self.running[i].clone();
                let held = r.table.len();
                let ok = self.alloc(&mut r, &[], None, tokens, 0);
                r.new = r.table.len() - held;
                self.running[i] = r;
                if ok {
                    break true;
                }
                let last = self.running.len() - 1;
                let l = &self.running[last];
                if l.prefilled && l.end >= t {
                    break false;
                }
                let mut v = self.running.pop().expect("non-empty");
                self.free_request(&mut v);
                (v.computed, v.cached, v.sched, v.preempted) = (0, 0, 0, true);
                self.counts[1] += 1;
                preempted.push(v.rid);
                self.waiting.insert(0, v);
                if last == i {
                    break false;
                }
            };
            if !ok {
                break;
            }
            progress = true;
            let mut r = self.running[i].clone();
            self.cache(&mut r, (tokens / bt) as usize);
            self.cache_state(&r, ((tokens / bt) as usize).min(r.hashes.len()));
            r.sched = n;
            budget -= n;
            self.running[i] = r;
            i += 1;
        }
        // Waiting requests: holding ones first.
        while preempted.is_empty() && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let reserve = self.reserve();
            let from_holding = !self.holding.is_empty();
            let Some(mut r) = (if from_holding {
                self.holding.first().cloned()
            } else {
                self.waiting.first().cloned()
            }) else {
                break;
            };
            let fresh = r.computed == 0;
            let mut hits = vec![];
            let mut ext = 0;
            let max = (((r.tokens() - 1) / bt) as usize).min(r.hashes.len());
            let mut state = None;
            if fresh {
                for &h in r.hashes.iter().take(max) {
                    match self.cached.get(&(h, 0)).and_then(|v| v.first()) {
                        Some(&b) => hits.push(b),
                        None => break,
                    }
                }
                if self.cfg.hybrid {
                    // The hit ends at the last of its blocks whose state is cached.
                    state = (0..hits.len()).rev().find_map(|i| {
                        let v = self.cached.get(&(r.hashes[i], 1))?;
                        v.first().map(|&b| (i + 1, b))
                    });
                    hits.truncate(state.map_or(0, |(n, _)| n));
                }
                if !r.admitted {
                    ext = tier.lookup(r.rid, &r.hashes, hits.len(), max - hits.len());
                }
            }
            let g = hits.len();
            let start = if fresh { g as u64 * bt } else { r.computed };
            let n = if ext > 0 {
                0
            } else {
                self.chunk(&r, start, budget)
            };
            if ext == 0 && n == 0 {
                break;
            }
            let held = r.table.len();
            let reserved = if ext > 0 { reserve } else { 0 };
            let ok = self.alloc(&mut r, &hits, state, start + n + ext as u64 * bt, reserved);
            if !ok {
                // The stale states released before the check stay released.
                if from_holding {
                    self.holding[0] = r;
                } else {
                    self.waiting[0] = r;
                }
                break;
            }
            progress = true;
            if from_holding {
                self.holding.remove(0);
            } else {
                self.waiting.remove(0);
            }
            r.new = r.table.len() - held;
            r.full = true;
            if fresh {
                r.cached = g;
                r.computed = start;
                let q = if r.preempted { None } else { Some(r.tokens()) };
                if let Some(q) = q {
                    self.counts[2] += q;
                    self.counts[3] += start;
                }
                if !r.admitted {
                    tier.allocated(r.rid, &r.hashes, g, &r.table, ext);
                    if !r.states.is_empty() {
                        tier.log.push(Call::States(r.rid, r.states.clone()));
                    }
                    (r.admitted, r.gpu_hit, r.ext) = (true, g, ext);
                    self.counts[4] += r.tokens() - start;
                    self.counts[5] += ext as u64 * bt;
                }
            }
            if ext > 0 {
                r.end = t + self.cfg.transfer_steps;
                self.loading.push(r);
                continue;
            }
            self.cache(&mut r, ((start + n) / bt) as usize);
            self.cache_state(&r, (((start + n) / bt) as usize).min(r.hashes.len()));
            r.sched = n;
            budget -= n;
            self.running.push(r);
        }
        let sched = self
            .running
            .iter()
            .filter(|r| r.sched > 0)
            .map(|r| (r.rid, r.computed, r.sched, r.table.clone(), r.new, r.full))
            .collect();
        progress |= !preempted.is_empty();
        tier.log.push(Call::Step(t, sched, preempted));
        let mut handoffs: Vec<(u64, Vec<u32>)> = Vec::new();
        for (rid, b) in std::mem::take(&mut self.offers) {
            match handoffs.iter_mut().find(|(r, _)| *r == rid) {
                Some((_, v)) => v.push(b),
                None => handoffs.push((rid, vec![b])),
            }
        }
        if !handoffs.is_empty() {
            tier.log.push(Call::Handoffs(t, handoffs));
        }
        // Compute.
        let mut still = vec![];
        for mut r in std::mem::take(&mut self.running) {
            if r.sched > 0 {
                r.computed += r.sched;
                if r.computed == r.tokens() {
                    r.outputs += 1;
                }
                if !r.prefilled && r.computed >= r.prompt {
                    r.prefilled = true;
                    r.end = t + self.cfg.transfer_steps;
                    tier.prefill(r.rid);
                }
                if r.outputs >= u64::from(self.cfg.decode_tokens) {
                    self.finishing.push(r);
                    continue;
                }
            }
            still.push(r);
        }
        self.running = still;
        // Transfers.
        let (done, wait): (Vec<R>, Vec<R>) = std::mem::take(&mut self.loading)
            .into_iter()
            .partition(|r| r.end <= t);
        self.loading = wait;
        for mut r in done {
            tier.log.push(Call::LoadDone(r.rid));
            let end = r.gpu_hit + r.ext;
            self.cache(&mut r, end);
            self.cache_state(&r, end);
            r.computed = end as u64 * bt;
            self.holding.push(r);
        }
        let (done, wait): (Vec<R>, Vec<R>) = std::mem::take(&mut self.finishing)
            .into_iter()
            .partition(|r| r.end <= t);
        self.finishing = wait;
        for mut r in done {
            tier.log.push(Call::Finished(r.rid, r.table.clone()));
            self.free_request(&mut r);
            self.counts[6] += 1;
        }
        self.counts[0] += 1;
        if progress { Ok(()) } else { Err(t) }
    }
}
