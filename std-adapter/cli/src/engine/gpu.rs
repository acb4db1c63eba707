//! The GPU prefix cache: the core's [`BlockPool`] used as vLLM's GPU KV cache, one KV-cache
//! group of full attention (and, for a hybrid model, a Mamba group sharing the pool: see
//! `mamba`), with the calls of vLLM's `KVCacheManager` in their order.
//!
//! * [`GpuCache::longest_hit`] is `find_longest_cache_hit`: the request's leading block
//!   hashes (group 0) while each is cached, at most `max_blocks` of them.
//! * [`GpuCache::allocate`] is `allocate_slots`: the hit blocks are touched first (so the
//!   new blocks cannot evict them), then the new blocks are taken from the front of the free
//!   queue; a hit block with no reference counts as a block to allocate, as in
//!   `get_num_blocks_to_allocate`. All or nothing.
//! * [`GpuCache::cache`] is `cache_full_blocks` over the request's prompt blocks.
//! * [`GpuCache::free`] frees a request's blocks in reverse order, so that its tail blocks
//!   are evicted first.

use core::fmt;

use kvtier_core::BlockKey;
use kvtier_core::block_pool::{
    BlockPool, BlockPoolConfig, CacheError, FreeError, GetBlocksError, NewPoolError, TouchError,
    Usage,
};

/// A block-pool call the engine's bookkeeping should make impossible failed (a bug in the
/// engine model, reported rather than hidden).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuError {
    /// The pool could not be built.
    New(NewPoolError),
    /// Too few free blocks.
    Get(GetBlocksError),
    /// A touch failed.
    Touch(TouchError),
    /// A free failed.
    Free(FreeError),
    /// Caching full blocks failed.
    Cache(CacheError),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU block pool: ")?;
        match self {
            GpuError::New(e) => e.fmt(f),
            GpuError::Get(e) => e.fmt(f),
            GpuError::Touch(e) => e.fmt(f),
            GpuError::Free(e) => e.fmt(f),
            GpuError::Cache(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GpuError {}

crate::from_variants::from_variants!(
    GpuError:
    NewPoolError => New,
    GetBlocksError => Get,
    TouchError => Touch,
    FreeError => Free,
    CacheError => Cache,
);

/// What another KV-cache group of the pool takes in the same allocation (a hybrid model's
/// Mamba group): hit blocks to touch with the attention hits, new blocks taken after them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Other<'a> {
    /// Its hit blocks, touched with the attention group's.
    pub hits: &'a [u32],
    /// Its new blocks.
    pub new: u64,
}

/// vLLM's GPU KV cache for one group: a [`BlockPool`] with prefix caching on.
#[derive(Debug)]
pub struct GpuCache {
    pub(super) pool: BlockPool<BlockKey>,
    block_tokens: u32,
    /// Scratch: the keys of one `cache` call, the reversed table of one `free` call.
    keys: Vec<BlockKey>,
    pub(super) reversed: Vec<u32>,
}

impl GpuCache {
    /// A cache of `num_blocks` blocks (the null block 0 included) of `block_tokens` tokens.
    ///
    /// # Errors
    /// [`GpuError::New`] for zero blocks or a pool that cannot be allocated.
    pub fn new(num_blocks: u32, block_tokens: u32) -> Result<Self, GpuError> {
        Ok(GpuCache {
            pool: BlockPool::new(BlockPoolConfig::new(num_blocks, true))?,
            block_tokens,
            keys: Vec::new(),
            reversed: Vec::new(),
        })
    }

    /// The pool, for inspection.
    #[must_use]
    pub fn pool(&self) -> &BlockPool<BlockKey> {
        &self.pool
    }

    /// The pool, mutably (for a connector that pins GPU blocks itself).
    pub fn pool_mut(&mut self) -> &mut BlockPool<BlockKey> {
        &mut self.pool
    }

    /// Tokens per block.
    #[must_use]
    pub const fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Blocks in the free queue (free, or cached and idle).
    #[must_use]
    pub fn free_count(&self) -> u32 {
        self.pool.free_count()
    }

    /// vLLM's `get_usage`, as published in `vllm:kv_cache_usage_perc`.
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.pool.usage()
    }

    /// The blocks caching `hashes`' leading blocks, at most `max_blocks` of them, appended to
    /// `out` (cleared first).
    pub fn longest_hit(&self, hashes: &[u64], max_blocks: usize, out: &mut Vec<u32>) {
        out.clear();
        for &h in hashes.iter().take(max_blocks) {
            match self.pool.get_one_block(&BlockKey::new(h, 0)) {
                Some(b) => out.push(b),
                None => break,
            }
        }
    }

    /// Blocks to take from the free queue to extend a table of `held` blocks (of which the
    /// `hits` are newly computed blocks still to be touched) to `tokens` tokens; `other`'s
    /// hits (a hybrid model's hit state) count when idle, its new blocks as they are.
    #[must_use]
    pub fn blocks_needed(&self, held: usize, hits: &[u32], tokens: u64, other: Other<'_>) -> u64 {
        let want = tokens.div_ceil(u64::from(self.block_tokens));
        let new = want.saturating_sub((held + hits.len()) as u64);
        let idle = hits
            .iter()
            .chain(other.hits)
            .filter(|&&b| self.pool.ref_count(b) == Some(0))
            .count() as u64;
        new + idle + other.new
    }

    /// `allocate_slots`: touches `hits` (and `other.hits`) and appends `hits` to `table`,
    /// then appends new blocks until the table covers `tokens` tokens. Returns false and
    /// changes nothing when the free queue holds fewer than [`GpuCache::blocks_needed`]
    /// blocks beyond `reserved` (blocks kept for other requests, vLLM's `reserved_blocks`).
    /// The other group's new blocks are the caller's to take right after.
    ///
    /// # Errors
    /// [`GpuError`] when the pool refuses a call the check above allows.
    pub fn allocate(
        &mut self,
        table: &mut Vec<u32>,
        hits: &[u32],
        tokens: u64,
        reserved: u64,
        other: Other<'_>,
    ) -> Result<bool, GpuError> {
        let available = u64::from(self.pool.free_count()).saturating_sub(reserved);
        if self.blocks_needed(table.len(), hits, tokens, other) > available {
            return Ok(false);
        }
        self.pool.touch(hits)?;
        self.pool.touch(other.hits)?;
        table.extend_from_slice(hits);
        let want = tokens.div_ceil(u64::from(self.block_tokens));
        let new = u32::try_from(want.saturating_sub(table.len() as u64)).unwrap_or(u32::MAX);
        self.pool.get_new_blocks(new, |b| table.push(b))?;
        Ok(true)
    }

    /// `cache_full_blocks`: caches `table[cached..full]` under `hashes[cached..full]`
    /// (group 0, block `i` covering `(i + 1) · block_tokens` tokens).
    ///
    /// # Errors
    /// [`GpuError::Cache`] when the pool refuses (a table or hash list too short).
    pub fn cache(
        &mut self,
        table: &[u32],
        hashes: &[u64],
        cached: usize,
        full: usize,
    ) -> Result<(), GpuError> {
        if cached >= full {
            return Ok(());
        }
        self.keys.clear();
        self.keys
            .extend(hashes.iter().take(full).map(|&h| BlockKey::new(h, 0)));
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.pool.cache_full_blocks(
            table,
            &self.keys,
            to_u32(cached),
            to_u32(full),
            self.block_tokens,
            None,
        )?;
        Ok(())
    }

    /// Frees a request's table in reverse order (vLLM's `free`) and clears it.
    ///
    /// # Errors
    /// [`GpuError::Free`] when the pool refuses (a block freed more often than held).
    pub fn free(&mut self, table: &mut Vec<u32>) -> Result<(), GpuError> {
        self.reversed.clear();
        self.reversed.extend(table.iter().rev());
        self.pool.free_blocks(&self.reversed)?;
        table.clear();
        Ok(())
    }
}
