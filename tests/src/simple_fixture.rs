//! The fixture of the simple offloader's scenario ports (`tests/simple/simple_scenarios*.rs`):
//! vLLM 0.33.0's `test_scheduler.py` helpers (`make_scheduler`, `make_request`,
//! `_alloc_and_register`, `simulate_store_completion`, ...) over kvtier's scheduler and a
//! kvtier `BlockPool` as the GPU pool.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test fixture: a failed unwrap is a failed test; sizes are small"
)]

use kvtier_core::BlockKey;
use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
use kvtier_core::simple::{
    Finished, LookupRequest, PoolSize, PoolSizing, Progress, Scheduled, SimpleConfig,
    SimpleScheduler, StepInput, WorkerOutput,
};

/// Tokens per block (`BLOCK_SIZE`).
pub const BS: u32 = 16;
/// `_BYTES_PER_BLOCK`: 16 tokens · 1 head · 16 dims · K and V · 2 bytes.
pub const BYTES_PER_BLOCK: u64 = 16 * 16 * 2 * 2;

/// The scheduler and its GPU pool (`SchedulerFixture`).
#[derive(Debug)]
pub struct Fix {
    /// The scheduler.
    pub s: SimpleScheduler,
    /// The GPU pool bound to it.
    pub gpu: BlockPool<BlockKey>,
}

/// A prompt of `blocks` full blocks plus `extra` tokens (`make_request`).
#[derive(Clone, Debug)]
pub struct Req {
    /// Request id.
    pub id: u64,
    /// One hash per full block.
    pub hashes: Vec<u64>,
    /// Prompt tokens.
    pub num_tokens: u64,
    /// `num_computed_tokens`.
    pub computed: u64,
}

/// `make_scheduler(num_cpu_blocks, num_gpu_blocks, lazy=...)`: the pool sized from bytes.
pub fn make_scheduler(num_cpu_blocks: u64, num_gpu_blocks: u32, lazy: bool) -> Fix {
    let sizing = PoolSizing {
        capacity_bytes: BYTES_PER_BLOCK * num_cpu_blocks,
        gpu_total_bytes: BYTES_PER_BLOCK * u64::from(num_gpu_blocks),
        size: PoolSize::FromBytes,
    };
    let mut c = SimpleConfig::new(BS, num_gpu_blocks, sizing);
    c.lazy_offload = lazy;
    c.max_num_batched_tokens = 64;
    Fix {
        s: SimpleScheduler::new(c).unwrap(),
        gpu: BlockPool::new(BlockPoolConfig::new(num_gpu_blocks, true)).unwrap(),
    }
}

/// `make_request(num_blocks, extra_tokens)` with request id `id`.
pub fn make_request(id: u64, blocks: u64, extra: u64) -> Req {
    Req {
        id,
        hashes: (0..blocks).map(|i| id * 1000 + i).collect(),
        num_tokens: blocks * u64::from(BS) + extra,
        computed: 0,
    }
}

/// The same prompt under another request id.
pub fn same_prompt(r: &Req, id: u64) -> Req {
    Req {
        id,
        computed: 0,
        ..r.clone()
    }
}

impl Fix {
    /// `gpu_block_pool.get_new_blocks(n)`.
    pub fn get_new(&mut self, n: u32) -> Vec<u32> {
        let mut v = Vec::new();
        self.gpu.get_new_blocks(n, |b| v.push(b)).unwrap();
        v
    }

    /// `_allocate_gpu_blocks`: new blocks, the full ones cached under the prompt's hashes.
    pub fn alloc_cached(&mut self, r: &Req, n: u32) -> Vec<u32> {
        let ids = self.get_new(n);
        let keys: Vec<BlockKey> = r.hashes.iter().map(|&h| BlockKey::new(h, 0)).collect();
        let full = n.min(r.hashes.len() as u32);
        self.gpu
            .cache_full_blocks(&ids, &keys, 0, full, BS, None)
            .unwrap();
        ids
    }

    /// `_alloc_and_register` (confirmed) followed by `update_state_after_alloc(req, blocks, 0)`.
    pub fn register(&mut self, r: &mut Req, n: u32) -> Vec<u32> {
        let ids = self.alloc_cached(r, n);
        r.computed = u64::from(n * BS);
        self.s
            .update_state_after_alloc(&mut self.gpu, r.id, &ids, 0)
            .unwrap();
        ids
    }

    /// `get_num_new_matched_tokens(request, computed)`.
    pub fn lookup(&mut self, r: &Req, computed: u64) -> (u64, bool) {
        let l = LookupRequest {
            req: r.id,
            block_hashes: &r.hashes,
            num_tokens: r.num_tokens,
            skip_reading_prefix_cache: false,
        };
        self.s.get_num_new_matched_tokens(&l, computed).unwrap()
    }

    /// `build_connector_meta` with `r` scheduled for `tokens` (its table `new` when given,
    /// as a new request when `full`): (store event, store GPU list, CPU list, load event,
    /// load GPU list).
    pub fn step(&mut self, sched: &[(&Req, Option<&[u32]>, bool, u64)], preempted: &[u64]) -> Plan {
        let news: Vec<Option<[&[u32]; 1]>> = sched.iter().map(|s| s.1.map(|n| [n])).collect();
        let sc: Vec<Scheduled<'_>> = sched
            .iter()
            .zip(&news)
            .map(|(&(r, _, full, tokens), new)| Scheduled {
                req: r.id,
                new_block_ids: new.as_ref().map(|n| &n[..]),
                full_table: full,
                num_scheduled_tokens: tokens,
                progress: Progress {
                    num_computed_tokens: r.computed,
                    num_output_placeholders: 0,
                    block_hashes: &r.hashes,
                },
            })
            .collect();
        let step = StepInput {
            scheduled: &sc,
            preempted,
            ..Default::default()
        };
        let p = self.s.build_connector_meta(&mut self.gpu, &step).unwrap();
        Plan {
            store_event: p.store_event,
            store_gpu: p.store_gpu_blocks.to_vec(),
            store_cpu: p.store_cpu_blocks.to_vec(),
            load_event: p.load_event,
            load_gpu: p.load_gpu_blocks.to_vec(),
        }
    }

    /// `build_connector_meta(make_scheduler_output({}))`.
    pub fn empty_step(&mut self) -> Plan {
        self.step(&[], &[])
    }

    /// `simulate_store_completion` (every worker reports it).
    pub fn complete_store(&mut self, e: Option<u64>) {
        let stores = [(e.unwrap(), 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &stores,
        };
        self.s.update_connector_output(&mut self.gpu, &out).unwrap();
    }

    /// `simulate_load_completion(sched, {req})`.
    pub fn complete_load(&mut self, req: u64) {
        let recv = [req];
        let out = WorkerOutput {
            finished_recving: &recv,
            completed_stores: &[],
        };
        self.s.update_connector_output(&mut self.gpu, &out).unwrap();
    }

    /// `request_finished_all_groups(request, block_ids)`.
    pub fn finish_all(&mut self, r: &Req, ids: &[u32]) {
        let f = Finished {
            req: r.id,
            block_ids: &[ids],
            num_prompt_tokens: r.num_tokens,
            progress: Progress {
                num_computed_tokens: r.computed,
                num_output_placeholders: 0,
                block_hashes: &r.hashes,
            },
        };
        self.s
            .request_finished_all_groups(&mut self.gpu, &f)
            .unwrap();
    }

    /// `get_cpu_free_blocks`.
    pub fn cpu_free(&self) -> u32 {
        self.s.cpu_pool().free_count()
    }

    /// Whether the CPU prefix cache holds hash `h` (group 0).
    pub fn cached(&self, h: u64) -> bool {
        self.s
            .cpu_pool()
            .get_one_block(&BlockKey::new(h, 0))
            .is_some()
    }

    /// `num_gpu_blocks − free` on the GPU pool.
    pub fn gpu_used(&self) -> u32 {
        self.gpu.num_blocks() - self.gpu.free_count()
    }

    /// A request stored through the eager scan and completed (the opening of most tests).
    pub fn store_request(&mut self, r: &mut Req, n: u32) -> Vec<u32> {
        let ids = self.register(r, n);
        let p = self.step(&[(r, Some(&ids), true, u64::from(n * BS))], &[]);
        self.complete_store(p.store_event);
        ids
    }
}

/// A step's plan as owned lists.
#[derive(Debug)]
pub struct Plan {
    /// Store event.
    pub store_event: Option<u64>,
    /// Store sources.
    pub store_gpu: Vec<u32>,
    /// Store destinations.
    pub store_cpu: Vec<u32>,
    /// Load event.
    pub load_event: Option<u64>,
    /// Load destinations.
    pub load_gpu: Vec<u32>,
}

/// `_flush_old_blocks_to_lru_head` after a request's blocks were cached and freed.
pub fn lazy_offload_old(f: &mut Fix, r: &Req) -> (Plan, Vec<u32>) {
    let old = f.alloc_cached(r, 2);
    f.gpu.free_blocks(&old).unwrap();
    let fillers = f.get_new(5);
    (f.empty_step(), fillers)
}
