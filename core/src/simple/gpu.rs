//! What the simple scheduler sees of the GPU side: the GPU block pool as a trait, and the
//! per-call inputs vLLM's scheduler hands its `SimpleCPUOffloadScheduler`.
//!
//! See the [module docs](super) for the contract.

use crate::BlockKey;
use crate::block_pool::{BlockHash, BlockPool};

/// The GPU block pool as the simple scheduler reads and pins it (vLLM binds the scheduler's
/// `BlockPool` with `bind_gpu_block_pool`).
///
/// Block ids are `0..num_blocks()`; block 0 is the null block. The scheduler validates every
/// id it is given before it calls a method here, passes [`GpuBlocks::touch`] only in-range ids
/// (a load target taken from the caller's block table may be the null block, which vLLM's
/// pool skips and an implementation must skip too), and passes [`GpuBlocks::free`] only
/// blocks it touched itself, once per touch, in the order vLLM frees them. An implementation
/// with vLLM's `BlockPool` semantics therefore never sees a call it must refuse. The
/// scheduler never allocates, caches or evicts GPU blocks: that stays the caller's (the GPU
/// KV-cache manager's) part, done between the scheduler's calls exactly as vLLM's scheduler
/// does it.
pub trait GpuBlocks {
    /// Blocks in the pool, the null block included.
    fn num_blocks(&self) -> u32;
    /// The block's primary hash (`block.block_hash` with `block_hash_num_tokens`), if any.
    fn block_hash(&self, block: u32) -> Option<BlockHash<BlockKey>>;
    /// The block's reference count.
    fn ref_count(&self, block: u32) -> u32;
    /// The first block cached under `key` (`get_cached_block(hash, [group])`).
    fn cached_block(&self, key: BlockKey) -> Option<u32>;
    /// The key `key` names in the terms [`block_hash`](Self::block_hash) reports keys in. The
    /// scheduler builds `key` from a request's hash ([`Progress::block_hashes`]); a view
    /// whose request hashes are stand-ins (e.g. positions in the caller's lists, resolved
    /// lazily) maps them here. Default: `key` itself.
    fn request_key(&self, key: BlockKey) -> BlockKey {
        key
    }
    /// Passes each secondary hash of the block to `sink` (vLLM's
    /// `cached_block_hashes_by_block[block]`: fine-grained prefix boundaries inside it). A
    /// completed store copies them to the CPU block. Default: none.
    fn secondary_hashes(&self, block: u32, sink: impl FnMut(BlockKey)) {
        let _ = (block, sink);
    }
    /// The free queue after `cursor` (from its front when `None`), front to back; nothing
    /// when `cursor` is not queued (`free_block_queue.iter_blocks_after`).
    fn free_queue_after(&self, cursor: Option<u32>) -> impl Iterator<Item = u32> + '_;
    /// One more reference on each block (`touch`; a block at 0 leaves the free queue).
    fn touch(&mut self, blocks: &[u32]);
    /// One reference less on each block, in order (`free_blocks`).
    fn free(&mut self, blocks: &[u32]);
}

/// kvtier's own [`BlockPool`] as the GPU pool. `touch` and `free` errors cannot happen under
/// the contract above and are ignored.
impl GpuBlocks for BlockPool<BlockKey> {
    fn num_blocks(&self) -> u32 {
        BlockPool::num_blocks(self)
    }
    fn block_hash(&self, block: u32) -> Option<BlockHash<BlockKey>> {
        BlockPool::block_hash(self, block)
    }
    fn ref_count(&self, block: u32) -> u32 {
        BlockPool::ref_count(self, block).unwrap_or(0)
    }
    fn cached_block(&self, key: BlockKey) -> Option<u32> {
        self.get_one_block(&key)
    }
    fn secondary_hashes(&self, block: u32, sink: impl FnMut(BlockKey)) {
        BlockPool::secondary_hashes(self, block).for_each(sink);
    }
    fn free_queue_after(&self, cursor: Option<u32>) -> impl Iterator<Item = u32> + '_ {
        self.free_queue().iter_after(cursor)
    }
    fn touch(&mut self, blocks: &[u32]) {
        let r = BlockPool::touch(self, blocks);
        debug_assert!(r.is_ok(), "touch under the contract cannot fail");
    }
    fn free(&mut self, blocks: &[u32]) {
        let r = BlockPool::free_blocks(self, blocks);
        debug_assert!(r.is_ok(), "free under the contract cannot fail");
    }
}

/// A request's GPU block tables, one per KV-cache group in group order
/// (`blocks.get_block_ids()`): `tables[g]` is group `g`'s table, null entries (block 0) for
/// skipped blocks. Tables past the slice's end are empty.
pub type Tables<'a> = &'a [&'a [u32]];

/// What the lookup reads off vLLM's `Request` (`get_num_new_matched_tokens`).
#[derive(Clone, Copy, Debug)]
pub struct LookupRequest<'a> {
    /// The request id (vLLM's `request_id`, mapped to an integer by the caller).
    pub req: u64,
    /// `request.block_hashes`: one 64-bit hash per full block of its tokens (every group
    /// keys it with its own group id). Hashes past
    /// [`lookup_hash_count`](super::SimpleScheduler::lookup_hash_count) after the computed
    /// ones are never read, and may be left out.
    pub block_hashes: &'a [u64],
    /// `request.num_tokens`.
    pub num_tokens: u64,
    /// `request.skip_reading_prefix_cache`.
    pub skip_reading_prefix_cache: bool,
}

/// What the eager scan reads off a live `Request`.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// `request.num_computed_tokens` at the time of the call (before this step's tokens).
    pub num_computed_tokens: u64,
    /// `request.num_output_placeholders`.
    pub num_output_placeholders: u64,
    /// `request.block_hashes` (must cover `num_computed_tokens / block_size` blocks).
    pub block_hashes: &'a [u64],
}

/// One request's boundary hand-offs (`kv_connector_block_state.boundary_state_offloads`),
/// in the dict's order: a hybrid model's Mamba states, each keyed by its GPU block's own hash.
/// Each entry is classified and stored whatever its group.
#[derive(Clone, Copy, Debug)]
pub struct Handoff<'a> {
    /// The request.
    pub req: u64,
    /// The GPU block of each entry, in entry order.
    pub gpu_blocks: &'a [u32],
}

/// One request of the step as `yield_req_data` gives it: new requests first, then cached
/// ones, in the scheduler output's order.
#[derive(Clone, Copy, Debug)]
pub struct Scheduled<'a> {
    /// The request.
    pub req: u64,
    /// Its new block ids, per group ([`Tables`]); `None` when the output has none for it.
    pub new_block_ids: Option<Tables<'a>>,
    /// `new_block_ids` is the whole table (a new or resumed request).
    pub full_table: bool,
    /// `num_scheduled_tokens[req]` (0 when absent).
    pub num_scheduled_tokens: u64,
    /// The live request's progress.
    pub progress: Progress<'a>,
}

/// The parts of vLLM's `SchedulerOutput` that `build_connector_meta` reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepInput<'a> {
    /// Boundary hand-offs, per request.
    pub handoffs: &'a [Handoff<'a>],
    /// `preempted_req_ids`.
    pub preempted: &'a [u64],
    /// `finished_req_ids`.
    pub finished: &'a [u64],
    /// The scheduled requests.
    pub scheduled: &'a [Scheduled<'a>],
}

/// A finishing request (`request_finished_all_groups`).
#[derive(Clone, Copy, Debug)]
pub struct Finished<'a> {
    /// The request.
    pub req: u64,
    /// Its block tables at finish, per group ([`Tables`]).
    pub block_ids: Tables<'a>,
    /// `request.num_prompt_tokens` (read only with fine-grained hits: the prompt's last hash
    /// boundary may end inside a full-attention block, flushed too).
    pub num_prompt_tokens: u64,
    /// Its progress at finish.
    pub progress: Progress<'a>,
}

/// The parts of vLLM's `KVConnectorOutput` that `update_connector_output` reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerOutput<'a> {
    /// `finished_recving`: requests whose load completed.
    pub finished_recving: &'a [u64],
    /// `kv_connector_worker_meta.completed_store_events` (already summed over workers within
    /// the step): `(event, count)` in dict order.
    pub completed_stores: &'a [(u64, u32)],
}
