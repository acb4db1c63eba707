//! The CPU pool as vLLM's scheduler exposes it raw (`cpu_block_pool`): pins, releases,
//! hand-outs and caching by hand, each checked by the pool.

use super::SimpleScheduler;
use crate::BlockKey;

impl SimpleScheduler {
    /// Takes one more reference on CPU blocks (vLLM's `cpu_block_pool.touch`, which vLLM's
    /// scheduler exposes raw): a block at count 0 leaves the free queue, so no store hands
    /// it out until [`cpu_free_blocks`](Self::cpu_free_blocks) releases it. A caller that
    /// pins blocks and never frees them shrinks the pool for good.
    ///
    /// # Errors
    /// The pool's [`TouchError`](crate::block_pool::TouchError); nothing changes then.
    pub fn cpu_touch(&mut self, blocks: &[u32]) -> Result<(), crate::block_pool::TouchError> {
        self.cpu.touch(blocks)
    }

    /// Drops one reference on CPU blocks, in eviction order (vLLM's
    /// `cpu_block_pool.free_blocks`): blocks reaching 0 rejoin the free queue, hashed ones at
    /// the back. Only the references a caller took with [`cpu_touch`](Self::cpu_touch) are
    /// its to drop: freeing a block a load or store of the scheduler holds lets a later
    /// store overwrite it while that transfer still reads or writes it.
    ///
    /// # Errors
    /// The pool's [`FreeError`](crate::block_pool::FreeError); nothing changes then.
    pub fn cpu_free_blocks(&mut self, blocks: &[u32]) -> Result<(), crate::block_pool::FreeError> {
        self.cpu.free_blocks(blocks)
    }

    /// Takes `n` blocks from the front of the CPU pool's free queue (vLLM's
    /// `cpu_block_pool.get_new_blocks`, public in vLLM's scheduler): each block's hash is
    /// removed (a `Removed` event when events are on) and it holds one reference, passed to
    /// `sink` in order. Like [`cpu_touch`](Self::cpu_touch), this is the caller's own pin:
    /// [`cpu_free_blocks`](Self::cpu_free_blocks) gives the blocks back.
    ///
    /// # Errors
    /// The pool's [`GetBlocksError`](crate::block_pool::GetBlocksError) when fewer than `n`
    /// blocks are free; nothing changes then.
    pub fn cpu_get_new_blocks(
        &mut self,
        n: u32,
        sink: impl FnMut(u32),
    ) -> Result<(), crate::block_pool::GetBlocksError> {
        self.cpu.get_new_blocks(n, sink)?;
        self.pull_pool_events();
        Ok(())
    }

    /// Caches CPU blocks the caller holds (vLLM's `cpu_block_pool.cache_full_blocks`):
    /// `blocks[i]` under `keys[i]` over `(i + 1) · block_size` tokens for `i` in
    /// `num_cached_blocks..num_full_blocks`, as [`BlockPool::cache_full_blocks`](crate::block_pool::BlockPool::cache_full_blocks) does; a later
    /// lookup finds them. A `Stored` event per block when events are on (no payload).
    ///
    /// # Errors
    /// The pool's [`CacheError`](crate::block_pool::CacheError) (lists too short, a block out
    /// of range, one already hashed over as many tokens); nothing changes then.
    pub fn cpu_cache_full_blocks(
        &mut self,
        blocks: &[u32],
        keys: &[BlockKey],
        num_cached_blocks: u32,
        num_full_blocks: u32,
        block_size: u32,
    ) -> Result<(), crate::block_pool::CacheError> {
        self.cpu.cache_full_blocks(
            blocks,
            keys,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            None,
        )?;
        self.pull_pool_events();
        Ok(())
    }
}
