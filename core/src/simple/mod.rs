//! vLLM 0.33.0's simple CPU offloader, scheduler side (`SimpleCPUOffloadScheduler` in
//! `vllm/v1/simple_kv_offload/manager.py`), on the core's [`BlockPool`] as the CPU pool.
//!
//! | file | holds |
//! |---|---|
//! | `config` | [`SimpleConfig`], the CPU pool's size ([`PoolSizing`]), lazy mode's [`lazy_target_blocks`] |
//! | `cpu` | the CPU pool's methods vLLM's scheduler exposes raw (`cpu_block_pool.touch`, …) |
//! | `layout` | the model's KV-cache groups ([`Layout`], [`GroupKind`]) |
//! | `gpu` | [`GpuBlocks`] (the GPU pool as the scheduler sees it) and the per-call inputs |
//! | `hit` | the hit search: vLLM's coordinator loop over the layout's spec groups |
//! | `lookup` | `get_num_new_matched_tokens` and `update_state_after_alloc`: hits, pins, loads |
//! | `eager` | eager stores: boundary hand-offs and their seven outcomes, the cursor scan, the final flush |
//! | `step` | `build_connector_meta`: one store event and one load event per step |
//! | `lazy` | lazy stores: the `target_free` walk of the GPU free queue |
//! | `completion` | worker output (loads, stores after `world_size` reports), finishing requests, `reset` |
//! | `requests`, `transfers` | fixed-size per-request and per-transfer tables |
//!
//! # Scope
//!
//! The model's KV-cache groups ([`SimpleConfig::layout`]): full attention, sliding window,
//! chunked local attention, Mamba in vLLM's `align` mode, and groups that are not
//! prefix-cacheable, each with its own block size (DCP-resolved) and a hash block size that
//! divides every prefix-cacheable one. One full-attention group alone is vLLM's
//! `UnitaryKVCacheCoordinator`; any other layout is its `HybridKVCacheCoordinator`, with
//! fine-grained hits where vLLM enables them ([`Validated::partial_hash_hits`]): full
//! attention's last block and a Mamba state may then end on any hash boundary, a finishing
//! prompt's full-attention partial tail is flushed, and every store copies its GPU block's
//! secondary hashes ([`GpuBlocks::secondary_hashes`]). With EAGLE's block drop
//! ([`SimpleConfig::use_eagle_block_drop`]) the draft groups match one block past a hit and
//! drop it, and a hybrid model's eager scan holds their last block back. A CPU hit is the longest every group accepts ([`GroupKind`] says what each kind needs); the eager
//! scan follows every positional group's table; Mamba states reach the CPU only as boundary
//! hand-offs ([`StepInput::handoffs`]) or, in lazy mode, from the GPU free queue.
//!
//! # The GPU-side contract
//!
//! The scheduler does not own the GPU pool. Each call that touches GPU blocks takes a
//! [`GpuBlocks`] view of it (for kvtier's own pool, `&mut BlockPool<BlockKey>`); the caller
//! passes the pool vLLM's scheduler bound with `bind_gpu_block_pool`, in the state vLLM's
//! scheduler has at that call. What each call reads and does to it:
//!
//! | method (vLLM's) | reads from the GPU view | pins (`touch`) / releases (`free`) |
//! |---|---|---|
//! | [`get_num_new_matched_tokens`](SimpleScheduler::get_num_new_matched_tokens) | nothing | nothing |
//! | [`update_state_after_alloc`](SimpleScheduler::update_state_after_alloc) | nothing | touches the load targets |
//! | [`build_connector_meta`](SimpleScheduler::build_connector_meta) | hashes of handed-off / scanned blocks, `cached_block` for null table entries; lazy: ref counts and the free queue | touches every block it stores |
//! | [`prepare_store_specs`](SimpleScheduler::prepare_store_specs) | as `build_connector_meta`'s stores | touches every block it stores |
//! | [`update_connector_output`](SimpleScheduler::update_connector_output) | the stored blocks' hashes (copied to the CPU) | frees loaded and stored blocks |
//! | [`request_finished_all_groups`](SimpleScheduler::request_finished_all_groups) | hashes of the final flush's blocks | touches the flush, frees an unissued load |
//! | [`request_finished`](SimpleScheduler::request_finished) | nothing | frees an unissued load |
//! | [`reset`](SimpleScheduler::reset) | nothing | frees queued flushes and unissued loads |
//!
//! Requests are `u64` ids (the caller maps vLLM's string ids); per-call inputs are the
//! structs of the `gpu` file ([`StepInput`], [`LookupRequest`], [`Finished`], [`WorkerOutput`]),
//! each field named after the vLLM attribute it carries. The GPU pool must have
//! at most [`SimpleConfig::num_gpu_blocks`] blocks (vLLM's KV-cache config's count; a smaller
//! pool is read as it is); block 0 is the null block.
//!
//! # Bounds
//!
//! Every table is allocated by [`SimpleScheduler::new`]: per request (`max_requests`), six
//! block lists of `max_blocks_per_request`; per CPU block, its transfer links; per GPU block,
//! one in-flight bit. No call allocates afterwards except [`SimpleScheduler::get_stats`],
//! whose [`Payload`] the caller owns. Inputs beyond the bounds are refused with a typed error
//! before anything changes.
//!
//! ```
//! use kvtier_core::BlockKey;
//! use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
//! use kvtier_core::simple::{SimpleConfig, SimpleScheduler};
//! use kvtier_core::stats::Gauge;
//! use kvtier_core::stats::catalogue::SIMPLE_USED_BLOCKS;
//!
//! let mut gpu = BlockPool::<BlockKey>::new(BlockPoolConfig::new(16, true))?;
//! let mut s = SimpleScheduler::new(SimpleConfig::with_cpu_blocks(4, 16, 8))?;
//! // An idle pool: only the null block is in use.
//! assert_eq!(s.get_stats().gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(1)));
//! assert_eq!(s.cpu_pool().free_count(), 7);
//! let plan = s.build_connector_meta(&mut gpu, &Default::default())?;
//! assert_eq!(plan.store_event, None);
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```

mod completion;
mod config;
mod cpu;
mod eager;
mod error;
mod gpu;
mod hit;
mod layout;
mod lazy;
mod lookup;
mod requests;
mod step;
#[cfg(test)]
mod tests;
mod transfers;

use alloc::collections::VecDeque;
use alloc::collections::vec_deque::Drain;
use alloc::vec::Vec;

pub use config::{
    GroupSpec, PoolSize, PoolSizing, SimpleConfig, Validated, lazy_target_blocks, per_rank_bytes,
};
pub use error::{AllocStateError, ConfigError, InputError, NewError, OutputError};
pub use gpu::{
    Finished, GpuBlocks, Handoff, LookupRequest, Progress, Scheduled, StepInput, Tables,
    WorkerOutput,
};
pub use layout::{GroupKind, Layout, MAX_GROUPS};
pub use transfers::StoredMeta;

use crate::BlockKey;
use crate::block_pool::{BlockPool, BlockPoolConfig, PoolEvent};
use crate::reserve::{filled, with_capacity};
use crate::stats::Payload;
use crate::stats::simple_offload::{Backend, SaveOutcome, SimpleOffloadConfig, SimpleOffloadStats};
use requests::Requests;
use transfers::Transfers;

/// The storage medium named in events (vLLM's `MEDIUM_CPU` / `MEDIUM_STORAGE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"CPU"`: host memory.
    Cpu,
    /// `"STORAGE"`: the disk backend.
    Storage,
}

/// A change to the CPU prefix cache (vLLM's `take_events`), recorded when events are on.
///
/// Every event is `locality="LOCAL"`, no LoRA; its key's group is the block's KV-cache group
/// (see [`SimpleConfig::layout`]). kvtier holds
/// no token ids: a positional store's [`StoredMeta`] says where in the request they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimpleEvent {
    /// `BlockStored`: a completed store made `key` reachable on the CPU.
    Stored {
        /// The GPU block's hash.
        key: BlockKey,
        /// The group's block size.
        block_size: u32,
        /// Parent hash and token position (positional stores); `None` for boundary, flush
        /// of a partial tail and lazy stores, which vLLM emits without a payload.
        meta: Option<StoredMeta>,
        /// The medium.
        medium: Medium,
    },
    /// `BlockRemoved`: a CPU block handed out for a new store lost `key`.
    Removed {
        /// The hash removed.
        key: BlockKey,
        /// The medium.
        medium: Medium,
    },
    /// `AllBlocksCleared`: a reset cleared the CPU prefix cache.
    AllCleared,
}

/// What [`SimpleScheduler::build_connector_meta`] plans for the workers (vLLM's
/// `SimpleCPUOffloadMetadata`; its `load_event_to_reqs` is
/// [`SimpleScheduler::load_event_requests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan<'a> {
    /// The store event of this step, if any block is stored (`store_event`, `-1` as `None`).
    pub store_event: Option<u64>,
    /// GPU sources, in order.
    pub store_gpu_blocks: &'a [u32],
    /// CPU destinations, index-parallel.
    pub store_cpu_blocks: &'a [u32],
    /// The load event of this step, if any load is issued.
    pub load_event: Option<u64>,
    /// GPU destinations of the loads, in order.
    pub load_gpu_blocks: &'a [u32],
    /// CPU sources, index-parallel.
    pub load_cpu_blocks: &'a [u32],
    /// Requests were preempted this step (`need_flush`).
    pub need_flush: bool,
}

/// What [`SimpleScheduler::prepare_store_specs`] planned: vLLM's `(gpu_block_ids,
/// cpu_block_ids, req_ids, block_meta)` without the metadata (see
/// [`SimpleScheduler::stored_meta`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreparedStores<'a> {
    /// GPU sources, in order.
    pub gpu_blocks: &'a [u32],
    /// CPU destinations, index-parallel.
    pub cpu_blocks: &'a [u32],
    /// The requests whose blocks are stored, each once, in first-stored order (empty in
    /// lazy mode).
    pub requests: &'a [u64],
}

/// vLLM's `SimpleCPUOffloadScheduler`. See the [module docs](self).
///
/// A clone decides exactly as the original (every bound comes from the configuration), but
/// its lists are cloned at their length, not their reserve, so its first calls may allocate
/// up to the same bounds.
#[derive(Clone, Debug)]
pub struct SimpleScheduler {
    config: SimpleConfig,
    v: Validated,
    medium: Medium,
    cpu: BlockPool<BlockKey>,
    reqs: Requests,
    xfer: Transfers,
    /// `_in_flight_store_gpu_blocks`, one bit per GPU block.
    in_flight: Vec<u64>,
    /// Lazy mode's cursor into the GPU free queue.
    cursor: Option<u32>,
    load_counter: u64,
    store_counter: u64,
    stats: SimpleOffloadStats,
    /// `_interval_load_blocks_completed` is in `stats`; this is the step stamp for duplicate
    /// detection.
    step: u64,
    events: VecDeque<SimpleEvent>,
    dropped_events: u64,
    // Scratch and output lists, reserved at construction.
    store_gpu: Vec<u32>,
    store_cpu: Vec<u32>,
    /// The requests of a prepared store (`max_requests`), collected while `collect_reqs`.
    store_reqs: Vec<u64>,
    collect_reqs: bool,
    load_gpu: Vec<u32>,
    load_cpu: Vec<u32>,
    sel_gpu: Vec<u32>,
    sel_meta: Vec<Option<StoredMeta>>,
    /// Per selected block (events on, fine geometry): its boundary keys, `xfer.per()` each.
    sel_keys: Vec<BlockKey>,
    /// Secondary hashes not kept for want of room.
    dropped_secondary: u64,
    got: Vec<u32>,
    tmp: Vec<u32>,
    /// The hit search's held blocks, one list per group (`max_blocks_per_request` each).
    found: Vec<Vec<u32>>,
}

/// A length or index bounded by a `u32` table size, as `u32`.
pub(super) fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl SimpleScheduler {
    /// Validates `config` and allocates every table.
    ///
    /// # Errors
    /// [`NewError::Config`] for an invalid configuration; [`NewError::AllocFailed`] when the
    /// tables cannot be had.
    pub fn new(config: SimpleConfig) -> Result<Self, NewError> {
        if config.max_requests > 1 << 24 {
            return Err(NewError::Config(ConfigError::ZeroBound));
        }
        let v = config.validate().map_err(NewError::Config)?;
        let fail = |_| NewError::AllocFailed;
        let mut pool_config = BlockPoolConfig::new(v.num_cpu_blocks, true);
        pool_config.enable_events = config.enable_events;
        // One call hands out at most every block, each losing its hash and secondary hashes.
        pool_config.event_capacity = v.num_cpu_blocks.saturating_add(v.secondary_capacity);
        pool_config.secondary_capacity = v.secondary_capacity;
        let cpu = BlockPool::new(pool_config).map_err(|_| NewError::AllocFailed)?;
        let n_cpu = v.num_cpu_blocks as usize;
        let n_gpu = config.num_gpu_blocks as usize;
        // One request's selection: at most a table per positional group, at most the pool.
        let positional = config
            .layout
            .kinds()
            .iter()
            .filter(|k| k.is_positional())
            .count();
        let max_b = (config.max_blocks_per_request as usize).saturating_mul(positional);
        let mut events = VecDeque::new();
        if config.enable_events {
            events
                .try_reserve_exact(config.event_capacity as usize)
                .map_err(|_| NewError::AllocFailed)?;
        }
        let mut info = SimpleOffloadConfig::new(v.num_cpu_blocks);
        info.backend = config.backend;
        info.page_cache = config.page_cache;
        info.lazy_offload = config.lazy_offload;
        Ok(SimpleScheduler {
            config,
            v,
            medium: match config.backend {
                Backend::Cpu => Medium::Cpu,
                Backend::Disk => Medium::Storage,
            },
            cpu,
            reqs: Requests::new(
                config.max_requests,
                config.max_blocks_per_request,
                &config.layout,
                v.num_cpu_blocks,
            )
            .map_err(fail)?,
            xfer: Transfers::new(
                v.num_cpu_blocks,
                config.enable_events,
                v.hash_blocks_per_block,
            )
            .map_err(fail)?,
            in_flight: filled(n_gpu.div_ceil(64), 0).map_err(fail)?,
            cursor: None,
            load_counter: 0,
            store_counter: 0,
            stats: SimpleOffloadStats::new(info),
            step: 0,
            events,
            dropped_events: 0,
            store_gpu: with_capacity(n_cpu).map_err(fail)?,
            store_cpu: with_capacity(n_cpu).map_err(fail)?,
            store_reqs: with_capacity(config.max_requests as usize).map_err(fail)?,
            collect_reqs: false,
            load_gpu: with_capacity(n_gpu).map_err(fail)?,
            load_cpu: with_capacity(n_gpu).map_err(fail)?,
            sel_gpu: with_capacity(max_b.min(n_cpu)).map_err(fail)?,
            sel_meta: with_capacity(if config.enable_events {
                max_b.min(n_cpu)
            } else {
                0
            })
            .map_err(fail)?,
            sel_keys: with_capacity(if config.enable_events {
                max_b
                    .min(n_cpu)
                    .saturating_mul(v.hash_blocks_per_block as usize)
            } else {
                0
            })
            .map_err(fail)?,
            dropped_secondary: 0,
            got: with_capacity(n_cpu).map_err(fail)?,
            tmp: with_capacity(n_cpu).map_err(fail)?,
            found: {
                let mut found = with_capacity(config.layout.len()).map_err(fail)?;
                for k in config.layout.kinds() {
                    let b = if k.is_cacheable() {
                        config.max_blocks_per_request as usize
                    } else {
                        0
                    };
                    found.push(with_capacity(b).map_err(fail)?);
                }
                found
            },
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &SimpleConfig {
        &self.config
    }

    /// What the configuration's validation derived (block sizes, fine-grained hits, …).
    #[must_use]
    pub fn validated(&self) -> &Validated {
        &self.v
    }

    /// The CPU pool's size, the null block included (vLLM's `num_cpu_blocks`).
    #[must_use]
    pub fn num_cpu_blocks(&self) -> u32 {
        self.v.num_cpu_blocks
    }

    /// Lazy mode's `target_free` (0 in eager mode).
    #[must_use]
    pub fn target_free(&self) -> u32 {
        self.v.target_free
    }

    /// The CPU pool (read-only).
    #[must_use]
    pub fn cpu_pool(&self) -> &BlockPool<BlockKey> {
        &self.cpu
    }

    /// The cumulative count of one outcome since construction or the last reset (vLLM's
    /// `get_boundary_store_stats()` field).
    #[must_use]
    pub fn boundary_total(&self, outcome: SaveOutcome) -> u64 {
        self.stats.total(outcome)
    }

    /// Hand-offs classified (vLLM's `published`: the sum of the seven outcomes).
    #[must_use]
    pub fn published(&self) -> u64 {
        self.stats.published()
    }

    /// Blocks in issued, queued and abandoned stores (the pending-store gauge).
    #[must_use]
    pub fn pending_store_blocks(&self) -> u64 {
        self.xfer.pending_blocks
    }

    /// A store transfer is queued or in flight (vLLM's `has_pending_stores`).
    #[must_use]
    pub fn has_pending_stores(&self) -> bool {
        self.xfer.pending_blocks > 0
    }

    /// Whether a GPU block is being stored (eager de-duplication).
    #[must_use]
    pub fn is_in_flight(&self, gpu_block: u32) -> bool {
        self.in_flight
            .get(gpu_block as usize / 64)
            .is_some_and(|w| w & (1 << (gpu_block % 64)) != 0)
    }

    /// Lazy mode's cursor into the GPU free queue.
    #[must_use]
    pub fn lazy_cursor(&self) -> Option<u32> {
        self.cursor
    }

    /// Whether the scheduler holds any state for `req` (a pending hit, a load, store state).
    /// A request it does not track can be forgotten by the caller's id map.
    #[must_use]
    pub fn is_tracked(&self, req: u64) -> bool {
        self.reqs.find(req).is_some()
    }

    /// Whether `req` has eager store state (vLLM's `_reqs_to_store` entry): a finish then
    /// reads its block tables for the blocks not yet stored.
    #[must_use]
    pub fn is_storing(&self, req: u64) -> bool {
        self.reqs
            .find(req)
            .is_some_and(|s| self.reqs.slots[s as usize].store.active)
    }

    /// The requests whose loads are registered but not yet issued, in registration order
    /// (the next [`build_connector_meta`](Self::build_connector_meta)'s load event names
    /// them in this order, as vLLM's `load_event_to_reqs` lists them).
    pub fn queued_loads(&self) -> impl Iterator<Item = u64> + '_ {
        self.reqs
            .load_order
            .iter()
            .map(|&s| self.reqs.slots[s as usize].id)
    }

    /// The event payload recorded for CPU block `cpu_block` while it is being written (events
    /// on, positional stores only; `None` otherwise).
    #[must_use]
    pub fn stored_meta(&self, cpu_block: u32) -> Option<StoredMeta> {
        self.xfer.meta.get(cpu_block as usize).copied().flatten()
    }

    /// Store event `event` while issued and not completed: `Some(abandoned)` (abandoned by a
    /// reset: its completion caches nothing); `None` once completed or never issued.
    #[must_use]
    pub fn store_event_state(&self, event: u64) -> Option<bool> {
        self.xfer.event(event).map(|e| e.abandoned)
    }

    /// The issued loads not yet finished, as `(load event, request)` pairs in slot order
    /// (vLLM's `load_event_to_reqs`, which the worker reads as a map of sets).
    pub fn load_event_requests(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.reqs.live().flat_map(|(_, s)| {
            [&s.load, &s.abandoned]
                .into_iter()
                .filter(|l| l.active)
                .filter_map(move |l| l.event.map(|e| (e, s.id)))
        })
    }

    /// Drains the interval's stats (vLLM's `get_stats`): outcome deltas and completed load
    /// blocks when > 0, `used_blocks = num_cpu_blocks − free`, `pending_store_blocks`, info.
    pub fn get_stats(&mut self) -> Payload {
        let free = self.cpu.free_count();
        self.stats.drain(free, self.xfer.pending_blocks)
    }

    /// Drains the events recorded since the last call, oldest first (empty when off).
    pub fn take_events(&mut self) -> Drain<'_, SimpleEvent> {
        self.events.drain(..)
    }

    /// Secondary hashes a completed store could not keep: the CPU pool's room
    /// ([`SimpleConfig::secondary_hashes`]) was in use (since construction).
    #[must_use]
    pub fn dropped_secondary_hashes(&self) -> u64 {
        self.dropped_secondary
    }

    /// Events dropped because `event_capacity` events were held.
    #[must_use]
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// Bytes of heap held (fixed at construction).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.cpu.heap_bytes()
            + self.reqs.heap_bytes()
            + self.xfer.heap_bytes()
            + self.in_flight.capacity() * 8
            + self.events.capacity() * size_of::<SimpleEvent>()
            + (self.store_gpu.capacity()
                + self.store_cpu.capacity()
                + self.load_gpu.capacity()
                + self.load_cpu.capacity()
                + self.sel_gpu.capacity()
                + self.got.capacity()
                + self.tmp.capacity())
                * 4
            + self.store_reqs.capacity() * 8
            + self.sel_meta.capacity() * size_of::<Option<StoredMeta>>()
            + self.sel_keys.capacity() * size_of::<BlockKey>()
            + self
                .found
                .iter()
                .map(|l| l.capacity() * 4 + size_of::<Vec<u32>>())
                .sum::<usize>()
    }

    fn set_in_flight(&mut self, gpu_block: u32, on: bool) {
        if let Some(w) = self.in_flight.get_mut(gpu_block as usize / 64) {
            let bit = 1u64 << (gpu_block % 64);
            if on {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
    }

    fn push_event(&mut self, e: SimpleEvent) {
        if !self.config.enable_events {
            return;
        }
        if self.events.len() < self.config.event_capacity as usize {
            self.events.push_back(e);
        } else {
            self.dropped_events = self.dropped_events.saturating_add(1);
        }
    }

    /// Moves the CPU pool's events (removals on hand-out, the reset's clear) into the queue.
    fn pull_pool_events(&mut self) {
        if !self.config.enable_events {
            return;
        }
        let medium = self.medium;
        let block_size = self.config.block_size;
        let cap = self.config.event_capacity as usize;
        let (events, dropped) = (&mut self.events, &mut self.dropped_events);
        for e in self.cpu.take_events() {
            let e = match e {
                PoolEvent::Removed { key, .. } => SimpleEvent::Removed { key, medium },
                PoolEvent::AllCleared => SimpleEvent::AllCleared,
                PoolEvent::Stored { key, .. } => SimpleEvent::Stored {
                    key,
                    block_size,
                    meta: None,
                    medium,
                },
            };
            if events.len() < cap {
                events.push_back(e);
            } else {
                *dropped = dropped.saturating_add(1);
            }
        }
    }

    /// Hands out `n ≤ free` CPU blocks into `self.got` (cleared first).
    fn alloc_cpu(&mut self, n: u32) {
        self.got.clear();
        let got = &mut self.got;
        let r = self.cpu.get_new_blocks(n, |b| got.push(b));
        debug_assert!(r.is_ok(), "callers ask for at most the free count");
        self.pull_pool_events();
    }

    /// Checks a GPU view's size (at most the configured count) and that each id is in it.
    fn check_gpu(&self, gpu: &impl GpuBlocks, ids: &[u32]) -> Result<(), InputError> {
        if gpu.num_blocks() > self.config.num_gpu_blocks {
            return Err(InputError::GpuPoolSize {
                num_blocks: gpu.num_blocks(),
            });
        }
        match ids.iter().find(|&&b| b >= gpu.num_blocks()) {
            Some(&block) => Err(InputError::GpuBlockOutOfRange { block }),
            None => Ok(()),
        }
    }
}
