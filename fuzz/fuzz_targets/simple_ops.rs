//! `simple_ops`: arbitrary call sequences on the simple offloader's scheduler side.
//!
//! * Modelled mode (a layout of `kvtier_tests::simple_ops::LAYOUTS`, picked by the input:
//!   dense, attention with Mamba in either order, sliding windows, chunked local attention,
//!   merged specs, a scratch group; and a `Geometry`: hashes finer than the block, EAGLE's
//!   drop): the shared `SimpleOp` sequences, run on the
//!   module and on the reference model (vLLM 0.33.0's `manager.py` restated) over twin GPU
//!   pools; every answer, plan, drain, event and pool state must agree, the invariants hold
//!   after every op, and nothing is pending once every transfer has completed.
//! * Raw mode: any input at all (GPU ids out of range, unknown requests and events, short
//!   hashes, duplicate requests, tables past the bounds) straight to the public API: no
//!   panic, no table grows, and a call that returns an error leaves the scheduler and the GPU
//!   pool exactly as they were.
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::BlockKey;
use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
use kvtier_core::simple::{
    Finished, Handoff, Layout, LookupRequest, Progress, Scheduled, SimpleConfig, SimpleScheduler,
    StepInput, WorkerOutput,
};
use kvtier_tests::simple_ops::{Geometry, LAYOUTS, SimpleOp, World};
use libfuzzer_sys::fuzz_target;

const GPU_BLOCKS: u32 = 12;

#[derive(Arbitrary, Debug)]
enum RawOp {
    Lookup {
        req: u8,
        hashes: Vec<u8>,
        num_tokens: u16,
        computed: u16,
        skip: bool,
    },
    Alloc {
        req: u8,
        table: Vec<u8>,
        mamba: Vec<u8>,
        ext: u16,
    },
    GpuCache {
        n: u8,
        hashes: Vec<u8>,
    },
    Step {
        handoffs: Vec<(u8, Vec<u8>)>,
        preempted: Vec<u8>,
        finished: Vec<u8>,
        scheduled: Vec<RawSched>,
        /// `prepare_store_specs` instead of `build_connector_meta`.
        prepare: bool,
    },
    Output {
        recv: Vec<u8>,
        stores: Vec<(u8, u8)>,
    },
    Finish {
        req: u8,
        table: Vec<u8>,
        computed: u16,
        hashes: Vec<u8>,
    },
    FinishOnly {
        req: u8,
    },
    Reset,
    Drain,
}

#[derive(Arbitrary, Debug)]
struct RawSched {
    req: u8,
    new: Option<Vec<u8>>,
    full: bool,
    tokens: u8,
    computed: u16,
    placeholders: u8,
    hashes: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    raw: bool,
    cpu_blocks: u8,
    lazy: bool,
    layout: u8,
    world: bool,
    events: bool,
    small_tables: bool,
    geometry: Geometry,
    ops: Vec<SimpleOp>,
    raw_ops: Vec<RawOp>,
}

type Gpu = BlockPool<BlockKey>;

/// Everything observable of the scheduler and the GPU pool.
fn snapshot(s: &SimpleScheduler, g: &Gpu) -> impl PartialEq + std::fmt::Debug + use<> {
    let cpu = s.cpu_pool();
    let blocks = |n: u32| (0..n).collect::<Vec<u32>>();
    (
        cpu.free_queue().iter().collect::<Vec<_>>(),
        blocks(cpu.num_blocks())
            .iter()
            .map(|&b| (cpu.ref_count(b), cpu.block_hash(b)))
            .collect::<Vec<_>>(),
        g.free_queue().iter().collect::<Vec<_>>(),
        blocks(g.num_blocks())
            .iter()
            .map(|&b| (g.ref_count(b), s.is_in_flight(b)))
            .collect::<Vec<_>>(),
        (
            s.pending_store_blocks(),
            s.published(),
            s.lazy_cursor(),
            s.heap_bytes(),
        ),
        s.load_event_requests().collect::<Vec<_>>(),
    )
}

fn hashes(v: &[u8]) -> Vec<u64> {
    v.iter().map(|&h| u64::from(h % 8)).collect()
}

fn ids(v: &[u8]) -> Vec<u32> {
    v.iter().map(|&b| u32::from(b) % (GPU_BLOCKS + 2)).collect()
}

fn progress(computed: u16, placeholders: u8, h: &[u64]) -> Progress<'_> {
    Progress {
        num_computed_tokens: u64::from(computed),
        num_output_placeholders: u64::from(placeholders),
        block_hashes: h,
    }
}

/// Runs one raw op; `true` when it returned an error.
fn raw(s: &mut SimpleScheduler, g: &mut Gpu, op: &RawOp) -> bool {
    match op {
        RawOp::Lookup {
            req,
            hashes: h,
            num_tokens,
            computed,
            skip,
        } => {
            let h = hashes(h);
            let l = LookupRequest {
                req: u64::from(*req % 8),
                block_hashes: &h,
                num_tokens: u64::from(*num_tokens),
                skip_reading_prefix_cache: *skip,
            };
            s.get_num_new_matched_tokens(&l, u64::from(*computed))
                .is_err()
        }
        RawOp::Alloc {
            req,
            table,
            mamba,
            ext,
        } => {
            let (attention, mamba) = (ids(table), ids(mamba));
            let tables: [&[u32]; 2] = [&attention, &mamba];
            s.update_state_after_alloc_groups(g, u64::from(*req % 8), &tables, u64::from(*ext))
                .is_err()
        }
        RawOp::GpuCache { n, hashes: h } => {
            // The top bit picks the group (1: a hybrid model's Mamba states).
            let group = u32::from(*n >> 7);
            let n = u32::from(*n % 4);
            let mut got = Vec::new();
            if g.get_new_blocks(n, |b| got.push(b)).is_ok() {
                let keys: Vec<BlockKey> =
                    hashes(h).iter().map(|&x| BlockKey::new(x, group)).collect();
                let full = n.min(keys.len() as u32);
                let _ = g.cache_full_blocks(&got, &keys, 0, full, 4, None);
            }
            false
        }
        RawOp::Step {
            handoffs,
            preempted,
            finished,
            scheduled,
            prepare,
        } => {
            let hb: Vec<(u64, Vec<u32>)> = handoffs
                .iter()
                .map(|(r, b)| (u64::from(*r % 8), ids(b)))
                .collect();
            let h: Vec<Handoff<'_>> = hb
                .iter()
                .map(|(r, b)| Handoff {
                    req: *r,
                    gpu_blocks: b,
                })
                .collect();
            let p: Vec<u64> = preempted.iter().map(|&r| u64::from(r % 8)).collect();
            let f: Vec<u64> = finished.iter().map(|&r| u64::from(r % 8)).collect();
            let parts: Vec<(Option<Vec<u32>>, Vec<u64>)> = scheduled
                .iter()
                .map(|x| (x.new.as_deref().map(ids), hashes(&x.hashes)))
                .collect();
            let news: Vec<Option<[&[u32]; 1]>> = parts
                .iter()
                .map(|(n, _)| n.as_deref().map(|n| [n]))
                .collect();
            let sc: Vec<Scheduled<'_>> = scheduled
                .iter()
                .zip(&parts)
                .zip(&news)
                .map(|((x, (_, h)), new)| Scheduled {
                    req: u64::from(x.req % 8),
                    new_block_ids: new.as_ref().map(|n| &n[..]),
                    full_table: x.full,
                    num_scheduled_tokens: u64::from(x.tokens % 9),
                    progress: progress(x.computed, x.placeholders, h),
                })
                .collect();
            let step = StepInput {
                handoffs: &h,
                preempted: &p,
                finished: &f,
                scheduled: &sc,
            };
            if *prepare {
                s.prepare_store_specs(g, &step).is_err()
            } else {
                s.build_connector_meta(g, &step).is_err()
            }
        }
        RawOp::Output { recv, stores } => {
            let r: Vec<u64> = recv.iter().map(|&x| u64::from(x % 8)).collect();
            let st: Vec<(u64, u32)> = stores
                .iter()
                .map(|&(e, c)| (u64::from(e % 16), u32::from(c % 3)))
                .collect();
            s.update_connector_output(
                g,
                &WorkerOutput {
                    finished_recving: &r,
                    completed_stores: &st,
                },
            )
            .is_err()
        }
        RawOp::Finish {
            req,
            table,
            computed,
            hashes: h,
        } => {
            let (t, h) = (ids(table), hashes(h));
            let f = Finished {
                req: u64::from(*req % 8),
                block_ids: &[&t],
                num_prompt_tokens: u64::from(*computed),
                progress: progress(*computed, 0, &h),
            };
            s.request_finished_all_groups(g, &f).is_err()
        }
        RawOp::FinishOnly { req } => {
            s.request_finished(g, u64::from(*req % 8));
            false
        }
        RawOp::Reset => {
            s.reset(g);
            false
        }
        RawOp::Drain => {
            let _ = s.get_stats();
            let _ = s.take_events().count();
            false
        }
    }
}

fuzz_target!(|input: Input| {
    let cpu = u32::from(input.cpu_blocks % 10) + 1;
    let world = if input.world { 2 } else { 1 };
    let kinds = LAYOUTS[usize::from(input.layout) % LAYOUTS.len()].1;
    if !input.raw {
        let gpu = 12 * kinds.len() as u32 + 12;
        let Some(mut w) = World::with_geometry(
            cpu.max(2),
            gpu,
            input.lazy,
            world,
            input.events,
            kinds,
            input.geometry,
        ) else {
            return;
        };
        for (i, op) in input.ops.iter().enumerate() {
            if let Err(e) = w.apply(op) {
                panic!("op {i} {op:?}: {e}");
            }
        }
        if let Err(e) = w.quiesce() {
            panic!("quiesce: {e}");
        }
        return;
    }
    let mut c = SimpleConfig::with_cpu_blocks(4, GPU_BLOCKS, cpu);
    c.lazy_offload = input.lazy;
    c.hash_block_size = Some(input.geometry.hash());
    c.use_eagle_block_drop = input.geometry.eagle;
    let Ok(layout) = Layout::new(kinds) else {
        return;
    };
    c.layout = layout;
    c.max_num_batched_tokens = 8;
    c.world_size = world;
    c.enable_events = input.events;
    c.event_capacity = 8;
    if input.small_tables {
        c.max_requests = 3;
        c.max_blocks_per_request = 4;
    }
    let Ok(mut s) = SimpleScheduler::new(c) else {
        return;
    };
    let mut g = BlockPool::new(BlockPoolConfig::new(GPU_BLOCKS, true)).expect("a small pool");
    let bytes = s.heap_bytes();
    for op in &input.raw_ops {
        let before = snapshot(&s, &g);
        if raw(&mut s, &mut g, op) {
            assert_eq!(snapshot(&s, &g), before, "{op:?} failed but changed state");
        }
        assert_eq!(s.heap_bytes(), bytes, "a table grew");
        let used = s.num_cpu_blocks() - s.cpu_pool().free_count();
        assert!(used >= 1, "used blocks below 1");
    }
});
