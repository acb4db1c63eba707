//! [`Engine`]: the step model of `docs/engine-model.md` over a [`GpuCache`], driving a
//! [`Connector`].

use std::collections::VecDeque;

use kvtier_core::hashing::Map;
use kvtier_core::simple::Handoff;

use super::GroupTables;

use super::connector::{Connector, FinishedRequest, ScheduledRequest, StepRecord};
use super::gpu::GpuCache;
use super::mamba::{chunk, group_offers};
use super::request::{Req, allocate, cache_prompt, prefill_reserve, query};
use super::{EngineConfig, EngineCounts, EngineError};
use crate::trace::Record;

/// The engine: waiting, running, loading and finishing requests over one GPU prefix cache.
///
/// ```
/// use kvtier_cli::engine::{Engine, EngineConfig, NoConnector};
/// use kvtier_cli::trace::Record;
///
/// let mut cfg = EngineConfig::new(9, 16);
/// cfg.decode_tokens = 1;
/// let mut e = Engine::new(cfg)?;
/// let mut none = NoConnector;
/// e.apply(Record::Load { rid: 0, hashes: &[1, 2, 3] }, &mut none)?;
/// e.apply(Record::Load { rid: 1, hashes: &[1, 2, 4] }, &mut none)?;
/// e.finish(&mut none)?;
/// let c = e.counts();
/// // The second request finds blocks 1 and 2 of the first in the GPU cache.
/// assert_eq!((c.prefix_cache_queries, c.prefix_cache_hits), (96, 32));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    gpu: GpuCache,
    waiting: VecDeque<Req>,
    /// Waiting requests that hold blocks (their loads done), admitted before `waiting`.
    holding: VecDeque<Req>,
    running: Vec<Req>,
    loading: Vec<Req>,
    finishing: Vec<Req>,
    open: Map<u64, ()>,
    counts: EngineCounts,
    hits: Vec<u32>,
    preempted: Vec<u64>,
    /// A hybrid model's boundary hand-offs not yet handed to the connector: `(request, state
    /// block)` in the order they were made.
    offers: Vec<(u64, u32)>,
}

impl Engine {
    /// An idle engine of `config`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for a configuration out of range, [`EngineError::Gpu`] when the
    /// GPU pool cannot be built.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError<core::convert::Infallible>> {
        config.check()?;
        Ok(Engine {
            gpu: GpuCache::new(config.num_gpu_blocks, config.block_tokens)?,
            config,
            waiting: VecDeque::new(),
            holding: VecDeque::new(),
            running: Vec::new(),
            loading: Vec::new(),
            finishing: Vec::new(),
            open: Map::default(),
            counts: EngineCounts::default(),
            hits: Vec::new(),
            preempted: Vec::new(),
            offers: Vec::new(),
        })
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The GPU prefix cache.
    #[must_use]
    pub const fn gpu(&self) -> &GpuCache {
        &self.gpu
    }

    /// The GPU prefix cache, mutably: for a connector's calls between steps (e.g. to finish
    /// its own transfers after [`Engine::finish`]); the engine's own references stay its own.
    pub fn gpu_mut(&mut self) -> &mut GpuCache {
        &mut self.gpu
    }

    /// What the engine counted so far.
    #[must_use]
    pub fn counts(&self) -> EngineCounts {
        self.counts
    }

    /// Requests in the engine (arrived, blocks not yet freed).
    #[must_use]
    pub fn open_requests(&self) -> usize {
        self.open.len()
    }

    /// Requests in the running list.
    #[must_use]
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Feeds one trace record: an `L` is an arrival, after which steps run while
    /// `max_num_seqs` requests wait; `S` and `C` are ignored (the model times the requests).
    ///
    /// # Errors
    /// [`EngineError`]: a repeated request, one that can never fit the GPU, a stalled engine,
    /// or the connector's error.
    pub fn apply<C: Connector>(
        &mut self,
        rec: Record<'_>,
        conn: &mut C,
    ) -> Result<(), EngineError<C::Error>> {
        let Record::Load { rid, hashes } = rec else {
            return Ok(());
        };
        self.arrive(rid, hashes)?;
        while self.waiting.len() >= self.config.max_num_seqs {
            self.step(conn)?;
        }
        Ok(())
    }

    /// Runs steps until every request has finished and freed its blocks.
    ///
    /// # Errors
    /// As [`Engine::apply`].
    pub fn finish<C: Connector>(&mut self, conn: &mut C) -> Result<(), EngineError<C::Error>> {
        while !self.open.is_empty() {
            self.step(conn)?;
        }
        Ok(())
    }

    fn arrive<E>(&mut self, rid: u64, hashes: &[u64]) -> Result<(), EngineError<E>> {
        if self.open.contains_key(&rid) {
            return Err(EngineError::DuplicateRequest(rid));
        }
        let bt = u64::from(self.config.block_tokens);
        let prompt = (hashes.len() as u64).saturating_mul(bt);
        let most = prompt.saturating_add(u64::from(self.config.decode_tokens) - 1);
        // A hybrid request also holds its running state and the one before it.
        let blocks = most.div_ceil(bt) + 2 * u64::from(self.config.hybrid);
        if blocks > u64::from(self.config.num_gpu_blocks - 1) {
            return Err(EngineError::RequestTooLarge {
                rid,
                blocks,
                gpu_blocks: self.config.num_gpu_blocks,
            });
        }
        self.open.insert(rid, ());
        self.waiting.push_back(Req {
            rid,
            hashes: hashes.to_vec(),
            prompt,
            table: Vec::new(),
            states: Vec::new(),
            computed: 0,
            outputs: 0,
            cached: 0,
            admitted: false,
            gpu_hit: 0,
            external: 0,
            preempted: false,
            prefilled: false,
            transfer_end: 0,
            scheduled: 0,
            new_blocks: 0,
            full_table: false,
        });
        Ok(())
    }

    /// One engine step: schedule the running requests, then (without a preemption) admit
    /// waiting ones; hand the schedule to the connector; compute; complete the transfers due.
    ///
    /// # Errors
    /// As [`Engine::apply`].
    pub fn step<C: Connector>(&mut self, conn: &mut C) -> Result<(), EngineError<C::Error>> {
        let t = self.counts.steps;
        let mut budget = self.config.max_num_batched_tokens;
        self.preempted.clear();
        for r in &mut self.running {
            r.scheduled = 0;
            r.new_blocks = 0;
            r.full_table = false;
        }
        // A transfer in flight completes at a step's end: a later step can do more.
        let mut progress = !self.loading.is_empty()
            || !self.finishing.is_empty()
            || self
                .running
                .iter()
                .any(|r| r.prefilled && r.transfer_end >= t);
        progress |= self.schedule_running(&mut budget)?;
        if self.preempted.is_empty() {
            progress |= self.admit(&mut budget, conn)?;
        }
        progress |= !self.preempted.is_empty();
        let used = u64::from(self.gpu.usage().used);
        self.counts.peak_used_blocks = self.counts.peak_used_blocks.max(used);
        self.hand_schedule(t, conn)?;
        self.compute(t, conn)?;
        self.complete_transfers(t, conn)?;
        self.counts.steps += 1;
        if !progress {
            return Err(EngineError::Stalled { step: t });
        }
        Ok(())
    }

    /// The running loop: each running request in order gets its next tokens (its prompt's
    /// rest up to the budget, or one decode token), preempting from the tail when blocks lack.
    fn schedule_running<E>(&mut self, budget: &mut u64) -> Result<bool, EngineError<E>> {
        let mut any = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let r = &self.running[i];
            let num_new = chunk(&self.config, r.num_tokens(), r.prompt, r.computed, *budget);
            if num_new == 0 {
                i += 1; // align mode: the budget holds no whole block of its prompt
                continue;
            }
            let tokens = r.computed + num_new;
            let scheduled = loop {
                let r = &mut self.running[i];
                let held = r.table.len();
                if allocate(&mut self.gpu, r, &[], None, tokens, 0, self.config.hybrid)? {
                    r.new_blocks = r.table.len() - held;
                    break true;
                }
                let last = self.running.len() - 1;
                if self.running[last].prefilled
                    && self.running[last].transfer_end >= self.counts.steps
                {
                    break false; // its stores read its blocks: it cannot be freed now
                }
                self.preempt_last()?;
                if last == i {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            let r = &mut self.running[i];
            let full = tokens / u64::from(self.config.block_tokens);
            cache_prompt(&mut self.gpu, &mut self.offers, r, full)?;
            r.scheduled = num_new;
            *budget -= num_new;
            any = true;
            i += 1;
        }
        Ok(any)
    }

    fn preempt_last<E>(&mut self) -> Result<(), EngineError<E>> {
        if let Some(mut r) = self.running.pop() {
            self.release(&mut r)?;
            r.computed = 0;
            r.cached = 0;
            r.scheduled = 0;
            r.preempted = true;
            self.counts.preemptions += 1;
            self.preempted.push(r.rid);
            self.waiting.push_front(r);
        }
        Ok(())
    }

    /// The waiting loop: admits requests from the front of `holding`, then of `waiting`, while
    /// the budget, `max_num_seqs` and the free blocks allow; a request the tier hits goes to
    /// loading instead of running, if the blocks it takes leave the running prefills theirs.
    fn admit<C: Connector>(
        &mut self,
        budget: &mut u64,
        conn: &mut C,
    ) -> Result<bool, EngineError<C::Error>> {
        let bt = u64::from(self.config.block_tokens);
        let mut any = false;
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let in_flight = prefill_reserve(&self.running, &self.loading, &self.holding, bt);
            let from_holding = !self.holding.is_empty();
            let queue = if from_holding {
                &mut self.holding
            } else {
                &mut self.waiting
            };
            let Some(r) = queue.front_mut() else {
                break;
            };
            let fresh = r.computed == 0;
            let (mut g, mut ext) = (0, 0);
            let mut state = None;
            self.hits.clear();
            if fresh {
                let max = r.max_hit_blocks(bt);
                self.gpu.longest_hit(&r.hashes, max, &mut self.hits);
                if self.config.hybrid {
                    state = self.gpu.state_hit(&r.hashes, self.hits.len());
                    self.hits.truncate(state.map_or(0, |(n, _)| n));
                }
                g = self.hits.len();
                if !r.admitted {
                    let q = query(r, g, max);
                    ext = conn.lookup(&q).map_err(EngineError::Connector)?;
                    ext = ext.min(max - g);
                }
            }
            let start = if fresh { g as u64 * bt } else { r.computed };
            let num_new = if ext > 0 {
                0
            } else {
                let n = chunk(&self.config, r.num_tokens(), r.prompt, start, *budget);
                if n == 0 {
                    break; // align mode: the budget holds no whole block of its prompt
                }
                n
            };
            let tokens = start + num_new + ext as u64 * bt;
            let held = r.table.len();
            let reserved = if ext > 0 { in_flight } else { 0 };
            let hybrid = self.config.hybrid;
            if !allocate(
                &mut self.gpu,
                r,
                &self.hits,
                state,
                tokens,
                reserved,
                hybrid,
            )? {
                break;
            }
            any = true;
            let Some(mut r) = queue.pop_front() else {
                break;
            };
            r.new_blocks = r.table.len() - held;
            r.full_table = true;
            if fresh {
                r.cached = g;
                r.computed = start;
                self.record_lookup(&r, g as u64 * bt);
                if !r.admitted {
                    let q = query(&r, g, r.max_hit_blocks(bt));
                    let tables = GroupTables {
                        attention: &r.table,
                        mamba: &r.states,
                    };
                    conn.allocated(self.gpu.pool_mut(), &q, tables, ext)
                        .map_err(EngineError::Connector)?;
                    r.admitted = true;
                    r.gpu_hit = g;
                    r.external = ext;
                    self.counts.external_prefix_cache_queries += r.num_tokens() - start;
                    self.counts.external_prefix_cache_hits += ext as u64 * bt;
                }
            }
            if ext > 0 {
                r.transfer_end = self.counts.steps + self.config.transfer_steps;
                self.counts.loads += 1;
                self.loading.push(r);
                continue;
            }
            cache_prompt(
                &mut self.gpu,
                &mut self.offers,
                &mut r,
                (start + num_new) / bt,
            )?;
            r.scheduled = num_new;
            *budget -= num_new;
            self.running.push(r);
        }
        Ok(any)
    }

    /// Frees a request's blocks, its attention table then its state table, each tail first,
    /// and drops its hand-offs not yet made (vLLM's `pop_blocks_for_free`).
    fn release<E>(&mut self, r: &mut Req) -> Result<(), EngineError<E>> {
        self.gpu.free(&mut r.table)?;
        self.gpu.free(&mut r.states)?;
        self.offers.retain(|&(rid, _)| rid != r.rid);
        Ok(())
    }

    /// vLLM's `record_prefix_cache_stats`, at admission: preempted requests apart.
    fn record_lookup(&mut self, r: &Req, hit_tokens: u64) {
        let c = &mut self.counts;
        if r.preempted {
            c.preempted_queries += r.num_tokens();
            c.preempted_hits += hit_tokens;
        } else {
            c.prefix_cache_queries += r.num_tokens();
            c.prefix_cache_hits += hit_tokens;
        }
    }

    fn hand_schedule<C: Connector>(
        &mut self,
        t: u64,
        conn: &mut C,
    ) -> Result<(), EngineError<C::Error>> {
        let scheduled: Vec<ScheduledRequest<'_>> = self
            .running
            .iter()
            .filter(|r| r.scheduled > 0)
            .map(|r| ScheduledRequest {
                rid: r.rid,
                num_computed_tokens: r.computed,
                num_scheduled_tokens: r.scheduled,
                block_ids: &r.table,
                num_new_blocks: r.new_blocks,
                full_table: r.full_table,
                block_hashes: &r.hashes,
            })
            .collect();
        let handoffs = group_offers(&self.offers);
        let handoffs: Vec<Handoff<'_>> = handoffs
            .iter()
            .map(|(req, gpu_blocks)| Handoff {
                req: *req,
                gpu_blocks,
            })
            .collect();
        let record = StepRecord {
            step: t,
            scheduled: &scheduled,
            preempted: &self.preempted,
            handoffs: &handoffs,
        };
        let r = conn
            .step(self.gpu.pool_mut(), &record)
            .map_err(EngineError::Connector);
        self.offers.clear();
        r
    }

    /// Runs the step's tokens: a request whose computed tokens reach its token count samples
    /// one; its prompt done, its stores start; its outputs done, it finishes.
    fn compute<C: Connector>(&mut self, t: u64, conn: &mut C) -> Result<(), EngineError<C::Error>> {
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.scheduled == 0 {
                i += 1;
                continue;
            }
            self.counts.scheduled_tokens += r.scheduled;
            r.computed += r.scheduled;
            if r.computed == r.num_tokens() {
                r.outputs += 1;
            }
            if !r.prefilled && r.computed >= r.prompt {
                r.prefilled = true;
                r.transfer_end = t + self.config.transfer_steps;
                conn.prefill_done(r.rid).map_err(EngineError::Connector)?;
            }
            if r.outputs >= u64::from(self.config.decode_tokens) {
                let r = self.running.remove(i);
                self.finishing.push(r);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The end of step `t`: loads due move their requests to `holding` (in load order) with
    /// the loaded blocks cached; finished requests whose stores are done free
    /// their blocks, in finishing order.
    fn complete_transfers<C: Connector>(
        &mut self,
        t: u64,
        conn: &mut C,
    ) -> Result<(), EngineError<C::Error>> {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.loading.len() {
            if self.loading[i].transfer_end <= t {
                let mut r = self.loading.remove(i);
                conn.load_done(r.rid).map_err(EngineError::Connector)?;
                let end = (r.gpu_hit + r.external) as u64;
                cache_prompt(&mut self.gpu, &mut self.offers, &mut r, end)?;
                r.computed = end * u64::from(self.config.block_tokens);
                ready.push(r);
            } else {
                i += 1;
            }
        }
        self.holding.extend(ready);
        let mut i = 0;
        while i < self.finishing.len() {
            if self.finishing[i].transfer_end <= t {
                let mut r = self.finishing.remove(i);
                let done = FinishedRequest {
                    rid: r.rid,
                    block_ids: &r.table,
                    num_computed_tokens: r.computed,
                    block_hashes: &r.hashes,
                };
                conn.finished(self.gpu.pool_mut(), &done)
                    .map_err(EngineError::Connector)?;
                self.release(&mut r)?;
                self.open.remove(&r.rid);
                self.counts.finished += 1;
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}
