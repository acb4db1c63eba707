//! The engine model's hybrid layout (`--hybrid`, `docs/engine-model.md`, "A hybrid model"):
//! a Mamba group in align mode beside the attention group, in the same GPU pool, handing
//! off each boundary's state to the core's simple offloader.
//!
//! A small scenario is traced by hand (tables, hits, hand-offs step by step); a second one
//! sends a request to the CPU for its state; over the shared trace, eager and lazy, the
//! invariants hold: every hand-off the engine makes is classified once, the outcomes sum to
//! them, the GPU is idle and nothing is pending at the end.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test code: a failed unwrap is a failed test; small numbers"
)]

use kvtier_cli::engine::GroupTables;
use kvtier_cli::engine::{
    Connector, Engine, EngineConfig, FinishedRequest, LookupQuery, MAMBA_GROUP, StepRecord,
};
use kvtier_cli::tier::{SimpleTier, SimpleTierError};
use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::{Layout, SimpleConfig, SimpleScheduler};
use kvtier_core::stats::simple_offload::SaveOutcome;
use kvtier_tests::simple_drive::{feed, small_a_requests};

/// One step's hand-offs: `(request, blocks)` in order.
type StepHandoffs = Vec<(u64, Vec<u32>)>;

/// The simple tier, with every step's hand-offs logged as `(step, hand-offs)`.
struct Logged {
    tier: SimpleTier,
    handoffs: Vec<(u64, StepHandoffs)>,
    /// Each hand-off's key when it was handed over.
    keys: Vec<BlockKey>,
}

impl Connector for Logged {
    type Error = SimpleTierError;
    fn lookup(&mut self, q: &LookupQuery<'_>) -> Result<usize, Self::Error> {
        self.tier.lookup(q)
    }
    fn allocated(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        q: &LookupQuery<'_>,
        tables: GroupTables<'_>,
        ext: usize,
    ) -> Result<(), Self::Error> {
        self.tier.allocated(gpu, q, tables, ext)
    }
    fn load_done(&mut self, rid: u64) -> Result<(), Self::Error> {
        self.tier.load_done(rid)
    }
    fn prefill_done(&mut self, rid: u64) -> Result<(), Self::Error> {
        self.tier.prefill_done(rid)
    }
    fn step(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        step: &StepRecord<'_>,
    ) -> Result<(), Self::Error> {
        if !step.handoffs.is_empty() {
            let h = step.handoffs.iter().map(|h| (h.req, h.gpu_blocks.to_vec()));
            self.handoffs.push((step.step, h.collect()));
            for h in step.handoffs {
                let keys = h.gpu_blocks.iter().map(|&b| gpu.block_hash(b).unwrap().key);
                self.keys.extend(keys);
            }
        }
        self.tier.step(gpu, step)
    }
    fn finished(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), Self::Error> {
        self.tier.finished(gpu, req)
    }
}

fn run(cfg: EngineConfig, cpu_blocks: u32, lazy: bool, requests: &[Vec<u64>]) -> (Logged, Engine) {
    let mut engine = Engine::new(cfg).unwrap();
    let mut sc = SimpleConfig::with_cpu_blocks(cfg.block_tokens, cfg.num_gpu_blocks, cpu_blocks);
    sc.layout = Layout::hybrid_mamba(true);
    sc.lazy_offload = lazy;
    sc.max_num_batched_tokens = cfg.max_num_batched_tokens as u32;
    let tier = SimpleTier::new(SimpleScheduler::new(sc).unwrap(), cfg.block_tokens, 1);
    let mut conn = Logged {
        tier,
        handoffs: Vec::new(),
        keys: Vec::new(),
    };
    feed(&mut engine, &mut conn, requests);
    let t = engine.counts().steps;
    conn.tier.drain(engine.gpu_mut().pool_mut(), t).unwrap();
    (conn, engine)
}

fn outcome(c: &mut Logged, o: SaveOutcome) -> u64 {
    c.tier.scheduler().boundary_total(o)
}

#[test]
fn boundaries_are_handed_off_and_a_gpu_hit_ends_at_a_cached_state() {
    // 16-token blocks, 32 tokens a step, one output token each.
    let mut cfg = EngineConfig::new(64, 16);
    cfg.max_num_batched_tokens = 32;
    cfg.decode_tokens = 1;
    cfg.hybrid = true;
    let requests = [vec![1, 2, 3, 4, 5], vec![1, 2, 3, 4, 9]];
    let (mut c, engine) = run(cfg, 32, false, &requests);
    // Step 0: request 0's first chunk (blocks 1, 2; its state after 32 tokens in block 3).
    // Step 1: its second chunk (blocks 4, 5; state in 6). Step 2: its last 16 tokens (block
    // 7, state in 8; block 3 released) and request 1, which hits the GPU for 64 tokens, up to
    // the state after block 4 (block 6), and computes the rest (block 9, state in 10).
    assert_eq!(
        c.handoffs,
        [
            (0, vec![(0, vec![3])]),
            (1, vec![(0, vec![6])]),
            (2, vec![(0, vec![8]), (1, vec![10])]),
        ]
    );
    let state = |h| BlockKey::new(h, MAMBA_GROUP);
    assert_eq!(c.keys, [state(2), state(4), state(5), state(9)]);
    let counts = engine.counts();
    assert_eq!(
        (counts.prefix_cache_queries, counts.prefix_cache_hits),
        (160, 64)
    );
    assert_eq!(outcome(&mut c, SaveOutcome::Stored), 4);
    assert_eq!(c.tier.scheduler().published(), 4);
    // The four states are on the CPU, under the Mamba group.
    let cpu = c.tier.scheduler().cpu_pool();
    for h in [2, 4, 5, 9] {
        assert!(cpu.get_one_block(&state(h)).is_some(), "state {h}");
    }
    assert_eq!(engine.gpu().usage().used, 0);
}

#[test]
fn a_cpu_hit_loads_the_state_at_its_end_and_offers_it_again() {
    // A GPU of 15 blocks: the fillers evict request 0's blocks before request 4 comes back.
    let mut cfg = EngineConfig::new(15, 16);
    cfg.max_num_batched_tokens = 32;
    cfg.max_num_seqs = 1;
    cfg.decode_tokens = 1;
    cfg.hybrid = true;
    let requests = [
        vec![1, 2, 3, 4, 5],
        vec![21, 22, 23, 24, 25],
        vec![31, 32, 33, 34, 35],
        vec![41, 42, 43, 44, 45],
        vec![1, 2, 3, 4, 9],
    ];
    let (mut c, engine) = run(cfg, 64, false, &requests);
    let counts = engine.counts();
    // Request 4's GPU hit is gone; the CPU holds blocks 1–4 and the states after 2 and 4
    // blocks: it loads 64 tokens, the attention blocks and the state after block 4.
    assert_eq!(counts.prefix_cache_hits, 0);
    assert_eq!(counts.external_prefix_cache_hits, 64);
    let stats = c.tier.scheduler().get_stats();
    let loaded = stats.counter(kvtier_core::stats::catalogue::SIMPLE_LOAD_BLOCKS, &[]);
    assert_eq!(loaded, Some(5));
    // The loaded state is cached on the GPU and offered again: the CPU has it already.
    assert_eq!(outcome(&mut c, SaveOutcome::SkippedAlreadyCached), 1);
    // Its one step with hand-offs: the loaded state (after block 4) and its chunk's end.
    let mine: Vec<_> = c.handoffs.iter().filter(|(_, h)| h[0].0 == 4).collect();
    assert_eq!(mine.len(), 1, "{:?}", c.handoffs);
    assert_eq!(mine[0].1[0].1.len(), 2, "{:?}", c.handoffs);
    let state = |h| BlockKey::new(h, MAMBA_GROUP);
    assert_eq!(c.keys[c.keys.len() - 2..], [state(4), state(9)]);
    assert_eq!(engine.gpu().usage().used, 0);
}

#[test]
fn a_budget_below_one_block_is_refused() {
    let mut cfg = EngineConfig::new(64, 16);
    cfg.max_num_batched_tokens = 15;
    cfg.hybrid = true;
    let e = Engine::new(cfg).unwrap_err();
    assert!(e.to_string().contains("--max-num-batched-tokens"), "{e}");
}

#[test]
fn every_hand_off_is_classified_once_eager_and_lazy() {
    let requests = small_a_requests();
    for lazy in [false, true] {
        for cpu_blocks in [256, 4096] {
            let mut cfg = EngineConfig::new(300, 16);
            cfg.max_num_seqs = 32;
            cfg.decode_tokens = 8;
            cfg.max_num_batched_tokens = 256;
            cfg.hybrid = true;
            let (mut c, engine) = run(cfg, cpu_blocks, lazy, &requests);
            let made: usize = c
                .handoffs
                .iter()
                .flat_map(|(_, h)| h)
                .map(|(_, b)| b.len())
                .sum();
            let s = c.tier.scheduler();
            let sum: u64 = SaveOutcome::ALL.iter().map(|&o| s.boundary_total(o)).sum();
            let what = format!("lazy {lazy} cpu {cpu_blocks}");
            assert!(made > 1000, "{what}: {made} hand-offs");
            // Lazy mode takes its stores from the GPU free queue and classifies no hand-off.
            let published = if lazy { 0 } else { made as u64 };
            assert_eq!((s.published(), sum), (published, published), "{what}");
            assert!(c.keys.iter().all(|k| k.group == MAMBA_GROUP), "{what}");
            assert_eq!(engine.gpu().usage().used, 0, "{what}");
            assert_eq!(s.pending_store_blocks(), 0, "{what}");
            assert_eq!(s.num_cpu_blocks() - s.cpu_pool().free_count(), 1, "{what}");
            // States reach the CPU (by hand-off or from the free queue).
            let states = (0..s.num_cpu_blocks())
                .filter_map(|b| s.cpu_pool().block_hash(b))
                .filter(|h| h.key.group == MAMBA_GROUP)
                .count();
            assert!(states > 0, "{what}");
        }
    }
}
