//! Call sequences for the simple offloader, shared by the proptests
//! (`tests/simple/simple_model.rs`) and the fuzz target (`fuzz/fuzz_targets/simple_ops.rs`).
//!
//! [`World`] plays vLLM's scheduler: it owns twin GPU pools (one for [`SimpleScheduler`], one
//! for the reference [`SimpleModel`]), the requests and their block tables, and turns each
//! [`SimpleOp`] into the same call on both sides, allocating and freeing GPU blocks the way
//! vLLM's KV-cache manager does. Every call it makes respects the GPU-side contract, so both
//! sides must answer alike: [`World::apply`] returns the first difference it sees.

#![allow(
    clippy::cast_possible_truncation,
    reason = "test model: block counts, ids and token counts are small"
)]

use kvtier_core::BlockKey;
use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
use kvtier_core::simple::{
    Finished, GroupKind, Handoff, Layout, LookupRequest, Progress, Scheduled, SimpleConfig,
    SimpleScheduler, StepInput, WorkerOutput,
};
use kvtier_core::stats::Gauge;
use kvtier_core::stats::catalogue::{
    SIMPLE_LOAD_BLOCKS, SIMPLE_PENDING_STORE_BLOCKS, SIMPLE_SAVE_OUTCOMES, SIMPLE_USED_BLOCKS,
};
use kvtier_core::stats::simple_offload::SaveOutcome;

use crate::simple_model::{Gpu, ModelPlan, ModelStats, SimpleModel};

/// Tokens per block.
pub const BS: u32 = 4;
/// Requests alive at once.
const MAX_ALIVE: usize = 6;

const FA: GroupKind = GroupKind::FullAttention;
const MAMBA: GroupKind = GroupKind::Mamba;
/// A window of 2 blocks and a token (`cdiv(window − 1, BS)` = 2 blocks needed).
const SW9: GroupKind = GroupKind::SlidingWindow { window: 2 * BS + 1 };
/// A window of 3 blocks (3 blocks needed).
const SW12: GroupKind = GroupKind::SlidingWindow { window: 3 * BS };
/// A chunk of 2 blocks.
const CL8: GroupKind = GroupKind::ChunkedLocal { chunk: 2 * BS };
/// A chunk of a block and a half.
const CL6: GroupKind = GroupKind::ChunkedLocal { chunk: BS + BS / 2 };

/// The layouts the proptests and the fuzz target run, by name, in vLLM's group order.
pub const LAYOUTS: &[(&str, &[GroupKind])] = &[
    ("dense", &[FA]),
    ("fa+mamba", &[FA, MAMBA]),
    ("mamba+fa", &[MAMBA, FA]),
    ("fa+sw(2 blocks+1)", &[FA, SW9]),
    ("fa+sw(3 blocks)", &[FA, SW12]),
    ("fa+chunked(2 blocks)", &[FA, CL8]),
    // A chunk that is not a multiple of the block: asked again at its own answer, the group
    // may answer less, so vLLM's single pass and its loop are what decide.
    ("fa+chunked(1.5 blocks)", &[FA, CL6]),
    ("fa+sw+chunked(1.5 blocks)", &[FA, SW9, CL6]),
    ("fa+sw+mamba", &[FA, SW9, MAMBA]),
    ("fa+sw+sw (one spec)", &[FA, SW9, SW9]),
    ("fa+scratch", &[FA, GroupKind::Scratch]),
    ("sw+fa", &[SW12, FA]),
    ("sw+mamba+fa+sw", &[SW9, MAMBA, FA, SW9]),
];

/// What a [`World`] runs besides its layout: the hash block size (the groups' blocks are
/// all [`BS`]; a smaller hash block makes a Mamba layout's eager hits fine-grained, gives
/// prompts partial tails and the GPU's blocks secondary hashes) and EAGLE's block drop (all
/// groups drop; a layout with a chunked-local group refuses it).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// The hash block size is `BS >> (hash_shift % 3)`: the block's, half of it, a token.
    pub hash_shift: u8,
    /// `use_eagle_block_drop`.
    pub eagle: bool,
}

impl Geometry {
    /// Hash and block of one size, no EAGLE.
    pub const PLAIN: Geometry = Geometry {
        hash_shift: 0,
        eagle: false,
    };

    /// The hash block size.
    pub fn hash(self) -> u32 {
        BS >> (self.hash_shift % 3)
    }
}

/// One call (or scheduler action) of a sequence.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug)]
pub enum SimpleOp {
    /// A request over prompt `template % 3` (shared prefixes) with `blocks % 6 + 1` full
    /// blocks, and a partial tail unless `template % 8` is 7.
    Arrive {
        /// Prompt family.
        template: u8,
        /// Full blocks.
        blocks: u8,
    },
    /// `get_num_new_matched_tokens` with `computed % (blocks + 1)` blocks computed locally.
    Lookup {
        /// Request index.
        req: u8,
        /// Local blocks.
        computed: u8,
    },
    /// Allocation: a table of `blocks + 1` GPU blocks, the first `hashed` cached, then
    /// `update_state_after_alloc` with `take` of the hit's blocks.
    Alloc {
        /// Request index.
        req: u8,
        /// Blocks cached on the GPU.
        hashed: u8,
        /// Hit blocks accepted.
        take: u8,
    },
    /// [`SimpleOp::Lookup`] then [`SimpleOp::Alloc`] of the same request (a hit taken).
    Admit {
        /// Request index.
        req: u8,
        /// Local blocks.
        computed: u8,
        /// Blocks cached on the GPU.
        hashed: u8,
        /// Hit blocks accepted.
        take: u8,
    },
    /// `build_connector_meta`.
    Step {
        /// Which allocated requests are scheduled.
        sched: u8,
        /// Tokens scheduled per request (`% 3 · BS`).
        advance: u8,
        /// Boundary hand-offs: (request index, table position; 255 = the null block).
        handoffs: Vec<(u8, u8)>,
        /// Which requests are preempted / finished in the output.
        preempt: u8,
        /// Which requests are in `finished_req_ids`.
        finish: u8,
    },
    /// A store report: the `which`-th outstanding event, `count % 2 + 1` workers.
    CompleteStore {
        /// Event choice.
        which: u8,
        /// Workers.
        count: u8,
    },
    /// `finished_recving` for the requests in the mask.
    CompleteLoad {
        /// Request mask.
        mask: u8,
    },
    /// `request_finished_all_groups`, then the request's blocks freed.
    Finish {
        /// Request index.
        req: u8,
    },
    /// GPU blocks taken from the free queue's front and freed again: cached blocks there
    /// (a sliding window's dropped blocks among them) lose their hash.
    Evict {
        /// Blocks (`% 4 + 1`).
        n: u8,
    },
    /// `reset`.
    Reset,
    /// `get_stats`.
    Drain,
}

#[derive(Clone, Debug)]
struct Req {
    id: u64,
    hashes: Vec<u64>,
    num_tokens: u64,
    /// The block table per group: a positional group's has a block per position (0 once
    /// dropped), a Mamba group's a state at odd positions and the last, a scratch group's
    /// one block.
    tables: Vec<Vec<u32>>,
    /// Leading positions cached on the GPU.
    cached: u32,
    computed: u64,
    hit: u64,
    lookup_computed: u64,
    alive: bool,
    allocated: bool,
    sent_table: bool,
}

/// Both sides and the scheduler's state around them.
#[derive(Debug)]
pub struct World {
    /// The module.
    pub module: SimpleScheduler,
    /// The reference model.
    pub model: SimpleModel,
    gpu_a: Gpu,
    gpu_b: Gpu,
    reqs: Vec<Req>,
    outstanding: Vec<u64>,
    world_size: u32,
    kinds: Vec<GroupKind>,
    /// The hash block size.
    hash: u32,
    /// EAGLE's drop is on.
    eagle: bool,
}

fn pool(n: u32) -> Gpu {
    let mut c = BlockPoolConfig::new(n, true);
    c.secondary_capacity = n;
    BlockPool::new(c).expect("a small pool builds")
}

/// Reads a module payload as the model's drain.
pub fn stats_of(p: &kvtier_core::stats::Payload) -> ModelStats {
    let int = |g: Option<Gauge>| {
        g.filter(|g| g.denominator() == 1)
            .map_or(i64::MIN, Gauge::numerator)
    };
    ModelStats {
        outcomes: SaveOutcome::ALL
            .iter()
            .map(|o| p.counter(SIMPLE_SAVE_OUTCOMES, &[o.label()]))
            .collect(),
        load_blocks: p.counter(SIMPLE_LOAD_BLOCKS, &[]),
        used: int(p.gauge(SIMPLE_USED_BLOCKS, &[])),
        pending: int(p.gauge(SIMPLE_PENDING_STORE_BLOCKS, &[])),
    }
}

impl World {
    /// Both sides over a GPU pool of `gpu_blocks` and a CPU pool of `cpu_blocks`, for a
    /// dense model.
    pub fn new(
        cpu_blocks: u32,
        gpu_blocks: u32,
        lazy: bool,
        world_size: u32,
        events: bool,
    ) -> Option<Self> {
        Self::with_kinds(cpu_blocks, gpu_blocks, lazy, world_size, events, &[FA])
    }

    /// [`World::new`] for the layout `kinds` (group `g` keyed `BlockKey::new(hash, g)`; a
    /// Mamba group's hand-offs name its states).
    pub fn with_kinds(
        cpu_blocks: u32,
        gpu_blocks: u32,
        lazy: bool,
        world_size: u32,
        events: bool,
        kinds: &[GroupKind],
    ) -> Option<Self> {
        Self::with_geometry(
            cpu_blocks,
            gpu_blocks,
            lazy,
            world_size,
            events,
            kinds,
            Geometry::PLAIN,
        )
    }

    /// [`World::with_kinds`] with `geometry`; `None` for a configuration the module refuses.
    pub fn with_geometry(
        cpu_blocks: u32,
        gpu_blocks: u32,
        lazy: bool,
        world_size: u32,
        events: bool,
        kinds: &[GroupKind],
        geometry: Geometry,
    ) -> Option<Self> {
        let mut c = SimpleConfig::with_cpu_blocks(BS, gpu_blocks, cpu_blocks);
        c.layout = Layout::new(kinds).ok()?;
        c.hash_block_size = Some(geometry.hash());
        c.use_eagle_block_drop = geometry.eagle;
        c.lazy_offload = lazy;
        c.max_num_batched_tokens = 8;
        c.world_size = world_size;
        c.enable_events = events;
        c.max_requests = 64;
        let module = SimpleScheduler::new(c).ok()?;
        let mut model = SimpleModel::new(
            BS,
            cpu_blocks,
            lazy,
            module.target_free(),
            world_size,
            events,
        );
        model.set_layout(
            kinds,
            &vec![BS; kinds.len()],
            geometry.hash(),
            geometry.eagle,
            &[],
        );
        Some(World {
            module,
            model,
            gpu_a: pool(gpu_blocks),
            gpu_b: pool(gpu_blocks),
            reqs: Vec::new(),
            outstanding: Vec::new(),
            world_size,
            kinds: kinds.to_vec(),
            hash: geometry.hash(),
            eagle: geometry.eagle,
        })
    }

    /// The CPU hit request `i`'s last lookup found (both sides agreed on it).
    pub fn hit(&self, i: usize) -> u64 {
        self.reqs.get(i).map_or(0, |r| r.hit)
    }

    /// Hash blocks per block.
    fn per(&self) -> usize {
        (BS / self.hash) as usize
    }

    /// Request `r`'s full blocks.
    fn blocks_of(&self, r: &Req) -> usize {
        r.hashes.len() / self.per()
    }

    /// `get_num_new_matched_tokens` for request `i` with `computed % (blocks + 1)` blocks
    /// computed locally, on both sides.
    fn lookup(&mut self, i: usize, computed: u8) -> Result<(), String> {
        let r = &self.reqs[i];
        let computed = u64::from(computed) % (self.blocks_of(r) as u64 + 1) * u64::from(BS);
        let l = LookupRequest {
            req: r.id,
            block_hashes: &r.hashes,
            num_tokens: r.num_tokens,
            skip_reading_prefix_cache: false,
        };
        let a = self
            .module
            .get_num_new_matched_tokens(&l, computed)
            .map_err(|e| e.to_string())?;
        let b = self.model.lookup(&l, computed);
        if a != b {
            return Err(format!("lookup: module {a:?}, model {b:?}"));
        }
        let r = &mut self.reqs[i];
        (r.hit, r.lookup_computed) = (a.0, computed);
        Ok(())
    }

    /// Request `i`'s allocation (its tables, the first `hashed` positions cached, what left
    /// a window dropped) and `update_state_after_alloc` with `take` of its hit's blocks, on
    /// both sides.
    fn alloc(&mut self, i: usize, hashed: u8, take: u8) -> Result<(), String> {
        let n = self.blocks_of(&self.reqs[i]) as u32 + 1;
        let kept = |p: u32| p % 2 == 1 || p + 1 == n;
        let counts: Vec<u32> = self
            .kinds
            .iter()
            .map(|k| match k {
                GroupKind::Mamba => (0..n).filter(|&p| kept(p)).count() as u32,
                GroupKind::Scratch => 1,
                _ => n,
            })
            .collect();
        if self.gpu_a.free_count() < counts.iter().sum() {
            return Ok(());
        }
        let mut tables = Vec::new();
        for (g, &k) in self.kinds.clone().iter().enumerate() {
            let fresh = self.both_new(counts[g])?;
            tables.push(if k == GroupKind::Mamba {
                let mut f = fresh.iter();
                (0..n)
                    .map(|p| if kept(p) { *f.next().unwrap_or(&0) } else { 0 })
                    .collect()
            } else {
                fresh
            });
        }
        self.reqs[i].tables = tables;
        self.reqs[i].cached = 0;
        self.cache(i, u32::from(hashed) % n)?;
        // A hybrid hit's state is loaded only when the whole hit is taken: take it
        // whole more often there. Hash blocks are taken (all of a block, or part).
        let units = u64::from(take % if self.kinds.len() > 1 { 8 } else { 4 }) * self.per() as u64;
        let h = u64::from(self.hash);
        let r = &self.reqs[i];
        let ext = (r.hit / h).min(units) * h;
        let (id, lc) = (r.id, r.lookup_computed);
        // The allocation drops what already left a window before the connector sees it.
        self.remove_skipped(i, lc + ext)?;
        let tables: Vec<&[u32]> = self.reqs[i].tables.iter().map(Vec::as_slice).collect();
        self.module
            .update_state_after_alloc_groups(&mut self.gpu_a, id, &tables, ext)
            .map_err(|e| e.to_string())?;
        self.model.after_alloc(&mut self.gpu_b, id, &tables, ext);
        let r = &mut self.reqs[i];
        (r.allocated, r.computed) = (true, lc + ext);
        Ok(())
    }

    /// Caches request `i`'s positions up to `upto` on both GPU pools, each prefix-cacheable
    /// group under its own key (dropped entries and a Mamba table's gaps are skipped).
    fn cache(&mut self, i: usize, upto: u32) -> Result<(), String> {
        let per = self.per();
        let r = &self.reqs[i];
        let (from, upto) = (r.cached, upto.min(self.blocks_of(r) as u32));
        if upto <= from {
            return Ok(());
        }
        for (g, k) in self.kinds.iter().enumerate() {
            if !k.is_cacheable() {
                continue;
            }
            // Each block keyed by the hash at its end.
            let keys: Vec<BlockKey> = r
                .hashes
                .chunks_exact(per)
                .map(|c| BlockKey::new(c[per - 1], g as u32))
                .collect();
            for p in [&mut self.gpu_a, &mut self.gpu_b] {
                p.cache_full_blocks(&r.tables[g], &keys, from, upto, BS, None)
                    .map_err(|e| e.to_string())?;
            }
            // With hashes finer than the block, every other newly cached block also holds
            // the key of the boundary in its middle, as a block shared with a request whose
            // prompt ended there does in vLLM's pool (a secondary hash).
            if per > 1 && matches!(k, &FA | &MAMBA) {
                for pos in (from..upto).filter(|p| p % 2 == 0) {
                    let b = r.tables[g][pos as usize];
                    if b == 0 {
                        continue;
                    }
                    let mid = BlockKey::new(r.hashes[pos as usize * per + per / 2 - 1], g as u32);
                    for p in [&mut self.gpu_a, &mut self.gpu_b] {
                        p.insert_secondary_hash(b, mid, 0)
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        self.reqs[i].cached = upto;
        Ok(())
    }

    /// `_cache_partial_tail_block` after `tokens` computed: with hashes finer than the block,
    /// the block holding the prompt's last hash boundary (short of its last token) takes that
    /// boundary's key in every full-attention and Mamba group, as its hash when it has none
    /// or a shorter one, else as a secondary hash.
    fn cache_tail(&mut self, i: usize, tokens: u64) -> Result<(), String> {
        let (h, bs) = (u64::from(self.hash), u64::from(BS));
        if h == bs {
            return Ok(());
        }
        let r = &self.reqs[i];
        // A resend matches at most the prompt less a token, an EAGLE lookup all of it.
        let limit = if self.eagle {
            r.num_tokens
        } else {
            r.num_tokens - 1
        };
        let boundary = (limit / h).min(r.hashes.len() as u64) * h;
        if boundary == 0 || boundary > tokens || boundary % bs == 0 {
            return Ok(());
        }
        for (g, &k) in self.kinds.iter().enumerate() {
            if !matches!(k, FA | MAMBA) {
                continue;
            }
            let Some(&b) = r.tables[g].get((boundary / bs) as usize) else {
                continue;
            };
            if b == 0 {
                continue;
            }
            let key = BlockKey::new(r.hashes[(boundary / h - 1) as usize], g as u32);
            for p in [&mut self.gpu_a, &mut self.gpu_b] {
                let r = match p.block_hash(b) {
                    Some(x) if x.key == key => Ok(false),
                    Some(x) if x.num_tokens < boundary => {
                        p.evict_blocks(&[b]).map_err(|e| e.to_string())?;
                        p.insert_hash(b, key, boundary)
                    }
                    Some(_) => p.insert_secondary_hash(b, key, 0),
                    None => p.insert_hash(b, key, boundary),
                };
                r.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// vLLM's `remove_skipped_blocks` after `computed` tokens: a sliding-window or chunked
    /// group's blocks wholly before what the next token attends to are freed (back to the
    /// end of the free queue, still cached) and become the null block, from the last one
    /// back to the first already dropped.
    fn remove_skipped(&mut self, i: usize, computed: u64) -> Result<(), String> {
        for (g, k) in self.kinds.iter().enumerate() {
            let skipped = match *k {
                GroupKind::SlidingWindow { window } => (computed + 1).saturating_sub(window.into()),
                GroupKind::ChunkedLocal { chunk } => computed / u64::from(chunk) * u64::from(chunk),
                _ => 0,
            };
            let table = &mut self.reqs[i].tables[g];
            let last = ((skipped / u64::from(BS)) as usize).min(table.len());
            let mut freed = Vec::new();
            for b in table[..last].iter_mut().rev() {
                if *b == 0 {
                    break;
                }
                freed.push(std::mem::take(b));
            }
            for p in [&mut self.gpu_a, &mut self.gpu_b] {
                p.free_blocks(&freed).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// `n` new blocks from both GPU pools, which must hand out the same.
    fn both_new(&mut self, n: u32) -> Result<Vec<u32>, String> {
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        self.gpu_a
            .get_new_blocks(n, |b| ta.push(b))
            .map_err(|e| e.to_string())?;
        self.gpu_b
            .get_new_blocks(n, |b| tb.push(b))
            .map_err(|e| e.to_string())?;
        if ta != tb {
            return Err(format!("GPU pools diverged: {ta:?} vs {tb:?}"));
        }
        Ok(ta)
    }

    fn pick(&self, i: u8, f: impl Fn(&Req) -> bool) -> Option<usize> {
        let c: Vec<usize> = (0..self.reqs.len()).filter(|&j| f(&self.reqs[j])).collect();
        (!c.is_empty()).then(|| c[i as usize % c.len()])
    }

    /// Runs one op on both sides; `Err` describes the first difference.
    pub fn apply(&mut self, op: &SimpleOp) -> Result<(), String> {
        match *op {
            SimpleOp::Arrive { template, blocks } => {
                if self.reqs.iter().filter(|r| r.alive).count() >= MAX_ALIVE {
                    return Ok(());
                }
                let n = u64::from(blocks % 6 + 1);
                let t = u64::from(template % 3);
                // A prompt ending one to three tokens past a block (a partial tail with hashes
                // finer than the block; prompts of one family then end at different
                // boundaries inside a block), or for one template in eight on the block (on a
                // hash block too: an EAGLE lookup then reaches a hash block past its cap).
                let tail = if template % 8 == 7 {
                    0
                } else {
                    1 + u64::from(blocks / 6 % 3)
                };
                let num_tokens = n * u64::from(BS) + tail;
                let hashes = num_tokens / u64::from(self.hash);
                self.reqs.push(Req {
                    id: self.reqs.len() as u64 + 100,
                    hashes: (0..hashes).map(|i| t * 1000 + i + 1).collect(),
                    num_tokens,
                    tables: Vec::new(),
                    cached: 0,
                    computed: 0,
                    hit: 0,
                    lookup_computed: 0,
                    alive: true,
                    allocated: false,
                    sent_table: false,
                });
            }
            SimpleOp::Lookup { req, computed } => {
                if let Some(i) = self.pick(req, |r| r.alive && !r.allocated) {
                    self.lookup(i, computed)?;
                }
            }
            SimpleOp::Alloc { req, hashed, take } => {
                if let Some(i) = self.pick(req, |r| r.alive && !r.allocated) {
                    self.alloc(i, hashed, take)?;
                }
            }
            SimpleOp::Admit {
                req,
                computed,
                hashed,
                take,
            } => {
                if let Some(i) = self.pick(req, |r| r.alive && !r.allocated) {
                    self.lookup(i, computed)?;
                    self.alloc(i, hashed, take)?;
                }
            }
            SimpleOp::Step {
                sched,
                advance,
                ref handoffs,
                preempt,
                finish,
            } => self.step(sched, advance, handoffs, preempt, finish)?,
            SimpleOp::CompleteStore { which, count } => {
                if self.outstanding.is_empty() {
                    return Ok(());
                }
                let k = which as usize % self.outstanding.len();
                let e = self.outstanding[k];
                let c = u32::from(count % 2) + 1;
                let stores = [(e, c)];
                let out = WorkerOutput {
                    finished_recving: &[],
                    completed_stores: &stores,
                };
                self.module
                    .update_connector_output(&mut self.gpu_a, &out)
                    .map_err(|e| e.to_string())?;
                self.model.output(&mut self.gpu_b, &[], &stores);
                if c >= self.world_size {
                    self.outstanding.remove(k);
                }
            }
            SimpleOp::CompleteLoad { mask } => {
                let ids: Vec<u64> = self
                    .reqs
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| mask & (1 << (j % 8)) != 0)
                    .map(|(_, r)| r.id)
                    .collect();
                let out = WorkerOutput {
                    finished_recving: &ids,
                    completed_stores: &[],
                };
                self.module
                    .update_connector_output(&mut self.gpu_a, &out)
                    .map_err(|e| e.to_string())?;
                self.model.output(&mut self.gpu_b, &ids, &[]);
            }
            SimpleOp::Finish { req } => {
                let Some(i) = self.pick(req, |r| r.alive) else {
                    return Ok(());
                };
                let r = &self.reqs[i];
                let tables: Vec<&[u32]> = r.tables.iter().map(Vec::as_slice).collect();
                let f = Finished {
                    req: r.id,
                    block_ids: &tables,
                    num_prompt_tokens: r.num_tokens,
                    progress: Progress {
                        num_computed_tokens: r.computed,
                        num_output_placeholders: 0,
                        block_hashes: &r.hashes,
                    },
                };
                self.module
                    .request_finished_all_groups(&mut self.gpu_a, &f)
                    .map_err(|e| e.to_string())?;
                self.model.finished_all(&mut self.gpu_b, &f);
                for t in &r.tables {
                    let rev: Vec<u32> = t.iter().rev().copied().collect();
                    for g in [&mut self.gpu_a, &mut self.gpu_b] {
                        g.free_blocks(&rev).map_err(|e| e.to_string())?;
                    }
                }
                self.reqs[i].alive = false;
            }
            SimpleOp::Evict { n } => {
                let n = u32::from(n % 4) + 1;
                if self.gpu_a.free_count() >= n {
                    let got = self.both_new(n)?;
                    for g in [&mut self.gpu_a, &mut self.gpu_b] {
                        g.free_blocks(&got).map_err(|e| e.to_string())?;
                    }
                }
            }
            SimpleOp::Reset => {
                let (a, b) = (
                    self.module.reset(&mut self.gpu_a),
                    self.model.reset(&mut self.gpu_b),
                );
                if a != b {
                    return Err(format!("reset: module {a}, model {b}"));
                }
            }
            SimpleOp::Drain => {
                let (a, b) = (stats_of(&self.module.get_stats()), self.model.drain());
                if a != b {
                    return Err(format!("drain: module {a:?}, model {b:?}"));
                }
            }
        }
        self.compare()
    }

    fn step(
        &mut self,
        sched: u8,
        advance: u8,
        handoffs: &[(u8, u8)],
        preempt: u8,
        finish: u8,
    ) -> Result<(), String> {
        let bit = |m: u8, j: usize| m & (1 << (j % 8)) != 0;
        let adv = u64::from(advance % 3) * u64::from(BS);
        let picked: Vec<usize> = (0..self.reqs.len())
            .filter(|&j| self.reqs[j].alive && self.reqs[j].allocated && bit(sched, j))
            .collect();
        let preempted: Vec<u64> = (0..self.reqs.len())
            .filter(|&j| self.reqs[j].alive && bit(preempt, j))
            .map(|j| self.reqs[j].id)
            .collect();
        let finished: Vec<u64> = (0..self.reqs.len())
            .filter(|&j| bit(finish, j))
            .map(|j| self.reqs[j].id)
            .collect();
        // What the scheduler does before the connector sees the step: blocks that left a
        // window dropped, the blocks this step computes cached.
        for &j in &picked {
            let computed = self.reqs[j].computed;
            let upto = ((computed + adv) / u64::from(BS)) as u32;
            self.remove_skipped(j, computed)?;
            self.cache(j, upto)?;
            self.cache_tail(j, computed + adv)?;
        }
        // A model with a Mamba group hands off its states; any other its attention blocks,
        // to test the rules.
        let handed = self
            .kinds
            .iter()
            .position(|&k| k == GroupKind::Mamba)
            .unwrap_or_else(|| self.kinds.iter().position(|&k| k == FA).unwrap_or(0));
        let blocks: Vec<(u64, Vec<u32>)> = handoffs
            .iter()
            .filter(|_| !self.reqs.is_empty())
            .map(|&(r, p)| {
                let r = &self.reqs[r as usize % self.reqs.len()];
                let table = r.tables.get(handed).map_or(&[][..], Vec::as_slice);
                let g = if p == 255 || table.is_empty() {
                    0
                } else {
                    table[p as usize % table.len()]
                };
                (r.id, vec![g])
            })
            .collect();
        let h: Vec<Handoff<'_>> = blocks
            .iter()
            .map(|(id, g)| Handoff {
                req: *id,
                gpu_blocks: g,
            })
            .collect();
        let tables: Vec<Vec<&[u32]>> = picked
            .iter()
            .map(|&j| self.reqs[j].tables.iter().map(Vec::as_slice).collect())
            .collect();
        let sc: Vec<Scheduled<'_>> = picked
            .iter()
            .enumerate()
            .map(|(k, &j)| {
                let r = &self.reqs[j];
                let full = !r.sent_table;
                Scheduled {
                    req: r.id,
                    new_block_ids: full.then_some(&tables[k][..]),
                    full_table: full,
                    num_scheduled_tokens: adv,
                    progress: Progress {
                        num_computed_tokens: r.computed,
                        num_output_placeholders: 0,
                        block_hashes: &r.hashes,
                    },
                }
            })
            .collect();
        let step = StepInput {
            handoffs: &h,
            preempted: &preempted,
            finished: &finished,
            scheduled: &sc,
        };
        let a = {
            let p = self
                .module
                .build_connector_meta(&mut self.gpu_a, &step)
                .map_err(|e| e.to_string())?;
            ModelPlan {
                store_event: p.store_event,
                store_gpu: p.store_gpu_blocks.to_vec(),
                store_cpu: p.store_cpu_blocks.to_vec(),
                load_event: p.load_event,
                load_gpu: p.load_gpu_blocks.to_vec(),
                load_cpu: p.load_cpu_blocks.to_vec(),
            }
        };
        let b = self.model.build(&mut self.gpu_b, &step);
        if a != b {
            return Err(format!("plan: module {a:?}, model {b:?}"));
        }
        if let Some(e) = a.store_event {
            self.outstanding.push(e);
        }
        for &j in &picked {
            let r = &mut self.reqs[j];
            r.sent_table = true;
            r.computed = (r.computed + adv).min(r.num_tokens);
        }
        for r in self.reqs.iter_mut().filter(|r| preempted.contains(&r.id)) {
            r.sent_table = false;
        }
        Ok(())
    }

    /// Both sides agree on everything observable, and the invariants hold.
    fn compare(&mut self) -> Result<(), String> {
        let m = &self.module;
        let cpu = m.cpu_pool();
        let queue: Vec<u32> = cpu.free_queue().iter().collect();
        let model_queue: Vec<u32> = self.model.cpu.free.iter().copied().collect();
        if queue != model_queue {
            return Err(format!(
                "CPU free queue: module {queue:?}, model {model_queue:?}"
            ));
        }
        for b in 0..m.num_cpu_blocks() {
            let (ra, rb) = (
                cpu.ref_count(b).unwrap_or(0),
                self.model.cpu.refs[b as usize],
            );
            let (ha, hb) = (
                cpu.block_hash(b).map(|h| h.key),
                self.model.cpu.hash[b as usize],
            );
            let sa: Vec<BlockKey> = cpu.secondary_hashes(b).collect();
            if sa != self.model.cpu.secondary[b as usize] {
                return Err(format!(
                    "CPU block {b}'s secondary hashes: module {sa:?}, model {:?}",
                    self.model.cpu.secondary[b as usize]
                ));
            }
            if ra != rb || ha != hb {
                return Err(format!(
                    "CPU block {b}: module ({ra}, {ha:?}), model ({rb}, {hb:?})"
                ));
            }
        }
        let qa: Vec<u32> = self.gpu_a.free_queue().iter().collect();
        let qb: Vec<u32> = self.gpu_b.free_queue().iter().collect();
        if qa != qb {
            return Err(format!(
                "GPU free queue: module side {qa:?}, model side {qb:?}"
            ));
        }
        if m.published() != self.model.published() {
            return Err(format!(
                "published: module {}, model {}",
                m.published(),
                self.model.published()
            ));
        }
        let sum: u64 = SaveOutcome::ALL.iter().map(|&o| m.boundary_total(o)).sum();
        if sum != m.published() {
            return Err("outcomes do not sum to the hand-offs published".into());
        }
        if m.num_cpu_blocks() - cpu.free_count() < 1 {
            return Err("used blocks below 1".into());
        }
        if queue.iter().any(|&b| cpu.ref_count(b) != Some(0))
            || !self.model.free_and_pinned().is_empty()
        {
            return Err("a block is both free and pinned".into());
        }
        let ea: Vec<_> = self.module.take_events().collect();
        let eb = std::mem::take(&mut self.model.events);
        if ea != eb {
            return Err(format!("events: module {ea:?}, model {eb:?}"));
        }
        Ok(())
    }

    /// Issues the queued flushes with an empty step, then completes every outstanding store
    /// and load; then nothing may be pending.
    pub fn quiesce(&mut self) -> Result<(), String> {
        let empty = SimpleOp::Step {
            sched: 0,
            advance: 0,
            handoffs: Vec::new(),
            preempt: 0,
            finish: 0,
        };
        self.apply(&empty)?;
        while !self.outstanding.is_empty() {
            let op = SimpleOp::CompleteStore { which: 0, count: 1 };
            self.apply(&op)?;
        }
        self.apply(&SimpleOp::CompleteLoad { mask: 0xff })?;
        if self.module.pending_store_blocks() != 0 || self.module.has_pending_stores() {
            return Err(format!(
                "pending after quiesce: {}",
                self.module.pending_store_blocks()
            ));
        }
        self.apply(&SimpleOp::Drain)
    }
}
