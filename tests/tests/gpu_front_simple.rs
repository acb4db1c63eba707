//! The engine model's steps drive the core's simple CPU offloader (`kvtier_core::simple`)
//! through the same [`Connector`] hooks as the OffloadingConnector tier: a check that the step
//! interface carries what `SimpleCPUOffloadScheduler` reads. Over a shared trace, eager and
//! lazy, the invariants hold: the seven outcomes sum to the hand-offs published, the pool
//! reports at least the null block used, nothing is pending once every transfer completed, and
//! the GPU pool is idle at the end (every pin the offloader took is released).

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test code: a failed unwrap is a failed test; small numbers"
)]

use std::collections::VecDeque;

use kvtier_cli::engine::{
    Connector, Engine, EngineConfig, FinishedRequest, LookupQuery, StepRecord,
};
use kvtier_cli::trace::Record;
use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::{
    Finished, LookupRequest, Progress, Scheduled, SimpleConfig, SimpleScheduler, StepInput,
    WorkerOutput,
};
use kvtier_core::stats::Gauge;
use kvtier_core::stats::catalogue::{
    SIMPLE_LOAD_BLOCKS, SIMPLE_PENDING_STORE_BLOCKS, SIMPLE_USED_BLOCKS,
};
use kvtier_core::stats::simple_offload::SaveOutcome;

/// The simple offloader as the engine's connector: loads complete when the engine says so,
/// stores `transfer_steps` steps after the step that issued them.
struct SimpleTier {
    s: SimpleScheduler,
    bt: u64,
    transfer_steps: u64,
    finished: Vec<u64>,
    recv: Vec<u64>,
    stores: VecDeque<(u64, u64)>,
}

impl SimpleTier {
    /// The computed tokens the hashes cover (the model hashes prompt blocks only).
    fn covered(&self, computed: u64, hashes: &[u64]) -> u64 {
        computed.min(hashes.len() as u64 * self.bt)
    }

    /// Reports the loads done and the stores due by the end of step `t`.
    fn complete(&mut self, gpu: &mut BlockPool<BlockKey>, t: u64) -> Result<(), String> {
        let mut done = Vec::new();
        while self.stores.front().is_some_and(|&(_, due)| due <= t) {
            let (event, _) = self.stores.pop_front().unwrap();
            done.push((event, 1));
        }
        let out = WorkerOutput {
            finished_recving: &self.recv,
            completed_stores: &done,
        };
        self.s
            .update_connector_output(gpu, &out)
            .map_err(|e| e.to_string())?;
        self.recv.clear();
        Ok(())
    }

    /// One step with nothing scheduled (issues queued flushes), then its completion.
    fn idle_step(&mut self, gpu: &mut BlockPool<BlockKey>, t: u64) -> Result<(), String> {
        let input = StepInput {
            finished: &self.finished,
            ..StepInput::default()
        };
        let plan = self
            .s
            .build_connector_meta(gpu, &input)
            .map_err(|e| e.to_string())?;
        if let Some(e) = plan.store_event {
            self.stores.push_back((e, t + self.transfer_steps));
        }
        self.finished.clear();
        self.complete(gpu, t)
    }
}

impl Connector for SimpleTier {
    type Error = String;

    fn lookup(&mut self, q: &LookupQuery<'_>) -> Result<usize, String> {
        let req = LookupRequest {
            req: q.rid,
            block_hashes: q.block_hashes,
            num_tokens: q.num_tokens,
            skip_reading_prefix_cache: false,
        };
        let (tokens, _) = self
            .s
            .get_num_new_matched_tokens(&req, q.gpu_hit_blocks as u64 * self.bt)
            .map_err(|e| e.to_string())?;
        Ok(((tokens / self.bt) as usize).min(q.max_hit_blocks))
    }

    fn allocated(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        q: &LookupQuery<'_>,
        block_ids: &[u32],
        external_blocks: usize,
    ) -> Result<(), String> {
        self.s
            .update_state_after_alloc(gpu, q.rid, block_ids, external_blocks as u64 * self.bt)
            .map_err(|e| e.to_string())
    }

    fn load_done(&mut self, rid: u64) -> Result<(), String> {
        self.recv.push(rid);
        Ok(())
    }

    fn prefill_done(&mut self, _rid: u64) -> Result<(), String> {
        Ok(())
    }

    fn step(&mut self, gpu: &mut BlockPool<BlockKey>, step: &StepRecord<'_>) -> Result<(), String> {
        let scheduled: Vec<Scheduled<'_>> = step
            .scheduled
            .iter()
            .map(|r| Scheduled {
                req: r.rid,
                new_block_ids: Some(if r.full_table {
                    r.block_ids
                } else {
                    &r.block_ids[r.block_ids.len() - r.num_new_blocks..]
                }),
                full_table: r.full_table,
                num_scheduled_tokens: r.num_scheduled_tokens,
                progress: Progress {
                    num_computed_tokens: self.covered(r.num_computed_tokens, r.block_hashes),
                    num_output_placeholders: 0,
                    block_hashes: r.block_hashes,
                },
            })
            .collect();
        let input = StepInput {
            handoffs: &[],
            preempted: step.preempted,
            finished: &self.finished,
            scheduled: &scheduled,
        };
        let plan = self
            .s
            .build_connector_meta(gpu, &input)
            .map_err(|e| e.to_string())?;
        if let Some(e) = plan.store_event {
            self.stores.push_back((e, step.step + self.transfer_steps));
        }
        self.finished.clear();
        self.complete(gpu, step.step)
    }

    fn finished(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), String> {
        let done = Finished {
            req: req.rid,
            block_ids: req.block_ids,
            progress: Progress {
                num_computed_tokens: self.covered(req.num_computed_tokens, req.block_hashes),
                num_output_placeholders: 0,
                block_hashes: req.block_hashes,
            },
        };
        self.s
            .request_finished_all_groups(gpu, &done)
            .map_err(|e| e.to_string())?;
        self.finished.push(req.rid);
        Ok(())
    }
}

fn trace_requests() -> Vec<Vec<u64>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("L "))
        .map(|l| {
            l.split(' ')
                .skip(3)
                .map(|h| u64::from_str_radix(h, 16).unwrap())
                .collect()
        })
        .collect()
}

fn drive(lazy: bool, cpu_blocks: u32) -> (SimpleTier, Engine) {
    let (gpu_blocks, bt) = (300, 16);
    let mut cfg = EngineConfig::new(gpu_blocks, bt);
    cfg.max_num_seqs = 32;
    cfg.decode_tokens = 8;
    let mut engine = Engine::new(cfg).unwrap();
    let mut sc = SimpleConfig::with_cpu_blocks(bt, gpu_blocks, cpu_blocks);
    sc.lazy_offload = lazy;
    sc.max_num_batched_tokens = 8192;
    let mut tier = SimpleTier {
        s: SimpleScheduler::new(sc).unwrap(),
        bt: u64::from(bt),
        transfer_steps: cfg.transfer_steps,
        finished: Vec::new(),
        recv: Vec::new(),
        stores: VecDeque::new(),
    };
    for (rid, hashes) in trace_requests().iter().enumerate() {
        let rec = Record::Load {
            rid: rid as u64,
            hashes,
        };
        engine.apply(rec, &mut tier).unwrap();
    }
    engine.finish(&mut tier).unwrap();
    // The engine is idle; the offloader may still hold queued flushes and stores in flight.
    let mut t = engine.counts().steps;
    while tier.s.has_pending_stores() || !tier.stores.is_empty() || !tier.finished.is_empty() {
        let pool = engine_pool(&mut engine);
        tier.idle_step(pool, t).unwrap();
        t += 1;
        assert!(t < engine.counts().steps + 100, "stores never drain");
    }
    (tier, engine)
}

/// The engine's GPU pool, for the offloader's calls after the engine's last step.
fn engine_pool(engine: &mut Engine) -> &mut BlockPool<BlockKey> {
    engine.gpu_mut().pool_mut()
}

#[test]
fn the_engine_drives_the_simple_offloader_eager_and_lazy() {
    for lazy in [false, true] {
        for cpu_blocks in [512, 4096] {
            let (mut tier, engine) = drive(lazy, cpu_blocks);
            let outcomes: u64 = SaveOutcome::ALL
                .iter()
                .map(|&o| tier.s.boundary_total(o))
                .sum();
            assert_eq!(outcomes, tier.s.published(), "lazy {lazy} cpu {cpu_blocks}");
            let stats = tier.s.get_stats();
            let used = stats.gauge(SIMPLE_USED_BLOCKS, &[]).unwrap();
            assert!(used.numerator() >= 1);
            assert_eq!(
                stats.gauge(SIMPLE_PENDING_STORE_BLOCKS, &[]),
                Some(Gauge::int(0))
            );
            assert_eq!(tier.s.pending_store_blocks(), 0);
            // Every GPU pin the offloader took is released: the GPU is idle.
            assert_eq!(engine.gpu().usage().used, 0, "lazy {lazy} cpu {cpu_blocks}");
            // Idle, the pool is the null block in use; what was stored stays cached.
            assert_eq!(used, Gauge::int(1));
            // One full-attention group has no boundary hand-offs (vLLM's come from Mamba
            // "align" groups only): eager stores come from the cursor scan and the flushes.
            assert_eq!(tier.s.published(), 0);
            let cached = tier.s.cpu_pool().cached_key_count();
            assert!(cached > 0, "lazy {lazy} cpu {cpu_blocks}: nothing stored");
            let loads = stats.counter(SIMPLE_LOAD_BLOCKS, &[]).unwrap_or(0);
            assert!(loads > 0, "lazy {lazy} cpu {cpu_blocks}: nothing loaded");
            assert_eq!(loads * 16, engine.counts().external_prefix_cache_hits);
        }
    }
}
