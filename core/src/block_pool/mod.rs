//! vLLM's GPU-style block pool: null block 0, a prefix-hash map, ref counts, and the free queue
//! that orders both allocation and prefix-cache eviction.
//!
//! [`BlockPool`] reproduces vLLM 0.33.0's `BlockPool` (`vllm/v1/core/block_pool.py`):
//!
//! * Blocks `0..num_blocks` start free in id order; block 0 is taken at construction as the
//!   **null block**: never handed out, never cached, and skipped by [`BlockPool::touch`] and
//!   [`BlockPool::free_blocks`].
//! * [`BlockPool::get_new_blocks`] pops from the front of the free queue; with caching on, a
//!   popped block loses its hash (a [`PoolEvent::Removed`]).
//! * [`BlockPool::free_blocks`] puts blocks whose count reaches 0 back: blocks without a hash
//!   (or all blocks, with caching off) at the **front** in the given order, so they are reused
//!   first; hashed blocks at the **back** in the given order, so they are evicted last (LRU).
//! * [`BlockPool::usage`] is `1 − free / (num_blocks − 1)`, as an exact [`Usage`] ratio.
//!
//! Where vLLM asserts or would corrupt its lists (freeing a block that is not in use, a block
//! id out of range, re-hashing a block), kvtier returns a typed error and changes nothing.
//! Memory is allocated once by [`BlockPool::new`] and never grows: 110 bytes per block with
//! [`BlockKey`] keys at power-of-two sizes, half of it the hash index pre-sized for a key per
//! block (see [`BlockPool::heap_bytes`]).

mod error;
mod index;
#[cfg(test)]
mod tests;
mod types;

use alloc::collections::VecDeque;
use alloc::collections::vec_deque::Drain;
use alloc::vec::Vec;
use core::hash::Hash;

pub use error::{
    CacheError, FreeError, GetBlocksError, InsertHashError, NewPoolError, OutOfRange, TouchError,
};
pub use types::{BlockHash, BlockPoolConfig, PoolEvent, Usage};

use crate::allocator::FreeQueue;
use crate::key::BlockKey;
use crate::reserve::{filled, with_capacity};
use index::KeyIndex;

/// vLLM's GPU block pool over a [`FreeQueue`], generic over the prefix-cache key `K`
/// ([`BlockKey`] is the natural choice).
///
/// ```
/// use kvtier_core::BlockKey;
/// use kvtier_core::block_pool::{BlockPool, BlockPoolConfig};
///
/// let mut pool = BlockPool::<BlockKey>::new(BlockPoolConfig::new(10, true))?;
/// assert_eq!(pool.free_count(), 9); // block 0 is the null block
/// let mut blocks = Vec::new();
/// pool.get_new_blocks(3, |b| blocks.push(b))?;
/// assert_eq!(blocks, [1, 2, 3]);
/// assert_eq!((pool.usage().used, pool.usage().total), (3, 9));
///
/// // Cache block 1 as the request's first full block (16 tokens), then free the request in
/// // reverse order: uncached blocks go to the front, cached ones to the back.
/// let a = BlockKey::new(0xa, 0);
/// pool.cache_full_blocks(&[1], &[a], 0, 1, 16, None)?;
/// pool.free_blocks(&[1, 2, 3])?;
/// assert!(pool.free_queue().iter().eq([2, 3, 4, 5, 6, 7, 8, 9, 1]));
/// assert_eq!(pool.get_one_block(&a), Some(1));
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct BlockPool<K> {
    config: BlockPoolConfig,
    // INVARIANT: a block other than the null block is in `queue` iff its `ref_cnt` is 0.
    queue: FreeQueue,
    ref_cnt: Vec<u32>,
    // Each block's hash and the key → blocks map. INVARIANT: block 0 never holds a hash.
    index: KeyIndex<K>,
    events: VecDeque<PoolEvent<K>>,
    dropped_events: u64,
    // Scratch for `free_blocks`, each with room for every block, so freeing never allocates.
    to_front: Vec<u32>,
    to_back: Vec<u32>,
}

impl<K: Copy + Eq + Hash> BlockPool<K> {
    /// The null block's id.
    pub const NULL_BLOCK: u32 = 0;

    /// A pool with blocks `1..num_blocks` free in id order and block 0 taken as the null block.
    /// All memory the pool uses is allocated here.
    ///
    /// # Errors
    /// [`NewPoolError::ZeroBlocks`] when `num_blocks == 0`; [`NewPoolError::AllocFailed`] when
    /// the tables cannot be allocated.
    pub fn new(config: BlockPoolConfig) -> Result<Self, NewPoolError> {
        let num_blocks = config.num_blocks;
        if num_blocks == 0 {
            return Err(NewPoolError::ZeroBlocks);
        }
        let fail = NewPoolError::AllocFailed { num_blocks };
        let n = usize::try_from(num_blocks).map_err(|_| fail)?;
        let mut queue = FreeQueue::new_full(num_blocks).map_err(|_| fail)?;
        queue.pop_front().map_err(|_| fail)?; // the null block; cannot fail with num_blocks > 0
        let mut events = VecDeque::new();
        if config.enable_events {
            let cap = usize::try_from(config.event_capacity).map_err(|_| fail)?;
            events.try_reserve_exact(cap).map_err(|_| fail)?;
        }
        Ok(BlockPool {
            config,
            queue,
            ref_cnt: filled(n, 0).map_err(|_| fail)?,
            index: KeyIndex::try_new(n, config.secondary_capacity as usize).ok_or(fail)?,
            events,
            dropped_events: 0,
            to_front: with_capacity(n).map_err(|_| fail)?,
            to_back: with_capacity(n).map_err(|_| fail)?,
        })
    }

    /// The configuration the pool was built with.
    #[must_use]
    pub fn config(&self) -> &BlockPoolConfig {
        &self.config
    }

    /// Blocks in the pool, the null block included.
    #[must_use]
    pub fn num_blocks(&self) -> u32 {
        self.config.num_blocks
    }

    /// Blocks in the free queue (free or cached-but-idle; vLLM's `get_num_free_blocks`).
    #[must_use]
    pub fn free_count(&self) -> u32 {
        self.queue.len()
    }

    /// Usage excluding the null block: `used = num_blocks − 1 − free` over `num_blocks − 1`.
    #[must_use]
    pub fn usage(&self) -> Usage {
        let total = self.config.num_blocks - 1;
        Usage {
            used: total - self.queue.len(),
            total,
        }
    }

    /// Bytes of heap this pool holds (for memory accounting); fixed at construction, since
    /// no table grows afterwards.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        use core::mem::size_of;
        self.queue.heap_bytes()
            + self.ref_cnt.capacity() * size_of::<u32>()
            + self.index.heap_bytes()
            + self.events.capacity() * size_of::<PoolEvent<K>>()
            + (self.to_front.capacity() + self.to_back.capacity()) * size_of::<u32>()
    }

    /// The free queue, front (next handed out, first evicted) to back.
    #[must_use]
    pub fn free_queue(&self) -> &FreeQueue {
        &self.queue
    }

    /// A block's reference count (0 for the null block, whose count is not maintained), or
    /// `None` when `block` is out of range.
    #[must_use]
    pub fn ref_count(&self, block: u32) -> Option<u32> {
        self.ref_cnt.get(block as usize).copied()
    }

    /// The hash a block holds, if any (`None` also when `block` is out of range).
    #[must_use]
    pub fn block_hash(&self, block: u32) -> Option<BlockHash<K>> {
        self.index.get(block)
    }

    /// The number of distinct keys in the prefix cache.
    #[must_use]
    pub fn cached_key_count(&self) -> usize {
        self.index.len()
    }

    /// The block cached under `key`; the first inserted when several blocks share it.
    #[must_use]
    pub fn get_one_block(&self, key: &K) -> Option<u32> {
        self.index.first(key)
    }

    /// Looks up one key per KV-cache group (vLLM's `get_cached_block`): when every key hits,
    /// passes each block to `sink` in key order and returns true; when any key misses, returns
    /// false and calls `sink` for none.
    pub fn get_cached_block(&self, keys: &[K], mut sink: impl FnMut(u32)) -> bool {
        if !keys.iter().all(|k| self.index.first(k).is_some()) {
            return false;
        }
        keys.iter()
            .filter_map(|k| self.index.first(k))
            .for_each(&mut sink);
        true
    }

    /// Hands out `n` blocks from the front of the free queue, passing each to `sink` in order;
    /// all or nothing. Each block's count goes from 0 to 1; with caching on, a block that held a
    /// hash loses it (emitting [`PoolEvent::Removed`]).
    ///
    /// # Errors
    /// [`GetBlocksError`] when fewer than `n` blocks are free; nothing changes then.
    pub fn get_new_blocks(
        &mut self,
        n: u32,
        mut sink: impl FnMut(u32),
    ) -> Result<(), GetBlocksError> {
        let free = self.queue.len();
        if n > free {
            return Err(GetBlocksError { requested: n, free });
        }
        for _ in 0..n {
            let Ok(block) = self.queue.pop_front() else {
                break; // unreachable: n <= len was checked
            };
            if self.config.enable_caching {
                self.evict_hash(block);
            }
            debug_assert_eq!(
                self.ref_cnt[block as usize], 0,
                "queued blocks are unreferenced"
            );
            self.ref_cnt[block as usize] = 1;
            sink(block);
        }
        Ok(())
    }

    /// Takes one more reference on each block (the prefix-cache hit path): a block at count 0
    /// leaves the free queue. The null block is skipped; a block may appear several times.
    ///
    /// # Errors
    /// [`TouchError`] for a block out of range or a count that would overflow; nothing changes
    /// then.
    pub fn touch(&mut self, blocks: &[u32]) -> Result<(), TouchError> {
        self.check_range(blocks).map_err(TouchError::OutOfRange)?;
        for (i, &b) in blocks.iter().enumerate() {
            if b == Self::NULL_BLOCK {
                continue;
            }
            let Some(count) = self.ref_cnt[b as usize].checked_add(1) else {
                self.adjust_refs(blocks.get(..i).unwrap_or_default(), false);
                return Err(TouchError::RefCountOverflow { block: b });
            };
            self.ref_cnt[b as usize] = count;
        }
        for &b in blocks {
            if b != Self::NULL_BLOCK && self.queue.contains(b) {
                // Queued means its count was 0 before this call: it is no longer free.
                let removed = self.queue.remove(b);
                debug_assert!(removed.is_ok());
            }
        }
        Ok(())
    }

    /// Drops one reference on each block, in the given order (their eviction priority: callers
    /// pass a request's blocks tail first). Blocks reaching 0 return to the free queue: those
    /// without a hash (all, with caching off) are put at the front in the given order, those
    /// with a hash at the back in the given order. The null block is skipped.
    ///
    /// # Errors
    /// [`FreeError`] for a block out of range or freed more often than it is referenced;
    /// nothing changes then.
    pub fn free_blocks(&mut self, blocks: &[u32]) -> Result<(), FreeError> {
        self.check_range(blocks).map_err(FreeError::OutOfRange)?;
        self.to_front.clear();
        self.to_back.clear();
        for (i, &b) in blocks.iter().enumerate() {
            if b == Self::NULL_BLOCK {
                continue;
            }
            let count = self.ref_cnt[b as usize];
            if count == 0 {
                self.adjust_refs(blocks.get(..i).unwrap_or_default(), true);
                return Err(FreeError::NotInUse { block: b });
            }
            self.ref_cnt[b as usize] = count - 1;
            if count == 1 {
                // A block reaches 0 at most once per call, so each list holds distinct blocks
                // and never outgrows its reserved capacity.
                if self.config.enable_caching && self.index.has_hash(b) {
                    self.to_back.push(b);
                } else {
                    self.to_front.push(b);
                }
            }
        }
        let front = self.queue.push_front_n(&self.to_front);
        let back = self.queue.push_back_n(&self.to_back);
        debug_assert!(
            front.is_ok() && back.is_ok(),
            "blocks at count 0 are unqueued"
        );
        Ok(())
    }

    /// Caches a request's newly full blocks (vLLM's `cache_full_blocks`): for each index `i` in
    /// `num_cached_blocks..num_full_blocks`, block `blocks[i]` gets key `keys[i]` covering
    /// `(i + 1) · block_size` tokens, unless it is the null block or `block_mask` (one entry per
    /// new block) is false for it. `keys` are the request's per-block keys for this KV-cache
    /// group at this `block_size`. Does nothing when `num_cached_blocks >= num_full_blocks`.
    ///
    /// A block that already holds a hash over fewer tokens (a promotion) has it removed first
    /// ([`PoolEvent::Removed`]); one [`PoolEvent::Stored`] per cached block follows the call's
    /// removals.
    ///
    /// # Errors
    /// [`CacheError`] for a zero `block_size`, `blocks` or `keys` shorter than
    /// `num_full_blocks`, a mask of the wrong length, a block out of range, or a block whose
    /// hash already covers at least as many tokens; nothing changes then.
    pub fn cache_full_blocks(
        &mut self,
        blocks: &[u32],
        keys: &[K],
        num_cached_blocks: u32,
        num_full_blocks: u32,
        block_size: u32,
        block_mask: Option<&[bool]>,
    ) -> Result<(), CacheError> {
        if num_cached_blocks >= num_full_blocks {
            return Ok(());
        }
        if block_size == 0 {
            return Err(CacheError::ZeroBlockSize);
        }
        let (start, end) = (num_cached_blocks as usize, num_full_blocks as usize);
        let (Some(new_blocks), Some(new_keys)) = (blocks.get(start..end), keys.get(start..end))
        else {
            return Err(if blocks.len() < end {
                CacheError::BlocksTooShort {
                    num_full_blocks,
                    len: blocks.len(),
                }
            } else {
                CacheError::KeysTooShort {
                    num_full_blocks,
                    len: keys.len(),
                }
            });
        };
        if let Some(mask) = block_mask
            && mask.len() != new_blocks.len()
        {
            return Err(CacheError::MaskLength {
                expected: new_blocks.len(),
                len: mask.len(),
            });
        }
        let selected = |j: usize| block_mask.is_none_or(|m| m.get(j).copied().unwrap_or(false));
        // (i + 1) · block_size < 2^32 · 2^32: no overflow in u64.
        let tokens =
            |j: usize| (u64::from(num_cached_blocks) + j as u64 + 1) * u64::from(block_size);
        for (j, &b) in new_blocks.iter().enumerate() {
            if b == Self::NULL_BLOCK || !selected(j) {
                continue;
            }
            if b >= self.config.num_blocks {
                return Err(CacheError::OutOfRange(self.out_of_range(b)));
            }
            // A block repeated later in this call always gets more tokens than its earlier
            // entry, so checking against the state before the call is enough.
            if let Some(h) = self.index.get(b)
                && h.num_tokens >= tokens(j)
            {
                return Err(CacheError::AlreadyHashed {
                    block: b,
                    num_tokens: h.num_tokens,
                    new_num_tokens: tokens(j),
                });
            }
        }
        for (j, (&b, &key)) in new_blocks.iter().zip(new_keys).enumerate() {
            if b == Self::NULL_BLOCK || !selected(j) {
                continue;
            }
            self.evict_hash(b);
            self.index.insert(
                b,
                BlockHash {
                    key,
                    num_tokens: tokens(j),
                },
            );
        }
        if self.config.enable_events {
            for (j, (&b, &key)) in new_blocks.iter().zip(new_keys).enumerate() {
                if b != Self::NULL_BLOCK && selected(j) {
                    self.push_event(PoolEvent::Stored {
                        key,
                        block: b,
                        num_tokens: tokens(j),
                    });
                }
            }
        }
        Ok(())
    }

    /// Gives `block` the hash `key` over `num_tokens` tokens without an event (vLLM's
    /// `_insert_block_hash` for a block's primary hash, which the CPU offloader calls when a
    /// copy into `block` completes). Returns false, changing nothing, when the block already
    /// holds `key`.
    ///
    /// # Errors
    /// [`InsertHashError`] for a block out of range, the null block, or a block holding another
    /// hash (where vLLM adds a secondary hash:
    /// [`insert_secondary_hash`](Self::insert_secondary_hash)); nothing changes then.
    pub fn insert_hash(
        &mut self,
        block: u32,
        key: K,
        num_tokens: u64,
    ) -> Result<bool, InsertHashError> {
        self.check_hashable(block)?;
        match self.index.get(block) {
            Some(h) if h.key == key => Ok(false),
            Some(_) => Err(InsertHashError::AlreadyHashed { block }),
            None => {
                self.index.insert(block, BlockHash { key, num_tokens });
                Ok(true)
            }
        }
    }

    /// Makes `block`, which holds a hash, also reachable under `key` (vLLM's
    /// `_insert_block_hash` on a block that already has its `block_hash`: a fine-grained
    /// prefix boundary inside the block). The key joins the end of its chain, so
    /// [`get_one_block`](Self::get_one_block) still answers the first block inserted under it;
    /// evicting the block removes every key it holds. A block without a hash takes `key` as its
    /// hash (over `num_tokens`), as in vLLM. Returns false, changing nothing, when the block
    /// already holds `key`.
    ///
    /// # Errors
    /// [`InsertHashError`] for a block out of range, the null block, or no room left
    /// ([`BlockPoolConfig::secondary_capacity`]); nothing changes then.
    pub fn insert_secondary_hash(
        &mut self,
        block: u32,
        key: K,
        num_tokens: u64,
    ) -> Result<bool, InsertHashError> {
        self.check_hashable(block)?;
        if self.index.get(block).is_none() {
            self.index.insert(block, BlockHash { key, num_tokens });
            return Ok(true);
        }
        if self.index.contains(&key, block) {
            return Ok(false);
        }
        if self.index.insert_secondary(block, key) {
            Ok(true)
        } else {
            Err(InsertHashError::NoSecondaryRoom { block })
        }
    }

    /// The secondary hashes `block` holds, in insertion order (none when out of range).
    pub fn secondary_hashes(&self, block: u32) -> impl Iterator<Item = K> + '_ {
        self.index.secondaries(block)
    }

    /// Removes the hashes of the given blocks from the prefix cache, in the given order
    /// (emitting [`PoolEvent::Removed`] for each block that had one). Reference counts and the
    /// free queue are untouched.
    ///
    /// # Errors
    /// [`OutOfRange`] for a block id out of range; nothing changes then.
    pub fn evict_blocks(&mut self, blocks: &[u32]) -> Result<(), OutOfRange> {
        self.check_range(blocks)?;
        for &b in blocks {
            self.evict_hash(b);
        }
        Ok(())
    }

    /// Clears the whole prefix cache, only when no block but the null block is in use: then
    /// every hash is dropped, [`PoolEvent::AllCleared`] is emitted and the result is true.
    /// Otherwise nothing changes and the result is false.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.config.num_blocks - self.queue.len() != 1 {
            return false;
        }
        self.index.clear();
        self.push_event(PoolEvent::AllCleared);
        true
    }

    /// Drains the events recorded since the last call, oldest first (empty when events are
    /// off).
    pub fn take_events(&mut self) -> Drain<'_, PoolEvent<K>> {
        self.events.drain(..)
    }

    /// Events dropped because the queue held `event_capacity` events (since construction).
    #[must_use]
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    fn out_of_range(&self, block: u32) -> OutOfRange {
        OutOfRange {
            block,
            num_blocks: self.config.num_blocks,
        }
    }

    /// `block` can take a hash: in range and not the null block.
    fn check_hashable(&self, block: u32) -> Result<(), InsertHashError> {
        if block >= self.config.num_blocks {
            return Err(InsertHashError::OutOfRange(self.out_of_range(block)));
        }
        if block == Self::NULL_BLOCK {
            return Err(InsertHashError::NullBlock);
        }
        Ok(())
    }

    fn check_range(&self, blocks: &[u32]) -> Result<(), OutOfRange> {
        match blocks.iter().find(|&&b| b >= self.config.num_blocks) {
            Some(&b) => Err(self.out_of_range(b)),
            None => Ok(()),
        }
    }

    /// Undoes the count changes of a failed `touch` (`up == false`) or `free_blocks`
    /// (`up == true`) on the blocks processed so far.
    fn adjust_refs(&mut self, done: &[u32], up: bool) {
        for &b in done {
            if b != Self::NULL_BLOCK {
                let c = &mut self.ref_cnt[b as usize];
                *c = if up {
                    c.saturating_add(1)
                } else {
                    c.saturating_sub(1)
                };
            }
        }
    }

    /// Drops `block`'s hash and secondary hashes, if any, from the block and the index,
    /// emitting `Removed` for each (its hash first, as vLLM's `_remove_cached_block_hashes`).
    #[inline]
    fn evict_hash(&mut self, block: u32) {
        if let Some(h) = self.index.remove(block) {
            self.push_event(PoolEvent::Removed { key: h.key, block });
            if self.config.secondary_capacity > 0 {
                self.evict_secondaries(block);
            }
        }
    }

    /// Drops `block`'s secondary hashes, emitting `Removed` for each (out of the eviction's
    /// hot path: only a CPU pool of a fine-grained layout has them).
    #[inline(never)]
    fn evict_secondaries(&mut self, block: u32) {
        let (index, events) = (&mut self.index, &mut self.events);
        let (enabled, cap) = (self.config.enable_events, self.config.event_capacity);
        let dropped = &mut self.dropped_events;
        index.remove_secondaries(block, |key| {
            if !enabled {
                return;
            }
            if events.len() < cap as usize {
                events.push_back(PoolEvent::Removed { key, block });
            } else {
                *dropped = dropped.saturating_add(1);
            }
        });
    }

    fn push_event(&mut self, event: PoolEvent<K>) {
        if !self.config.enable_events {
            return;
        }
        if self.events.len() < self.config.event_capacity as usize {
            self.events.push_back(event);
        } else {
            self.dropped_events = self.dropped_events.saturating_add(1);
        }
    }
}

impl BlockPool<BlockKey> {
    /// [`BlockPool::get_cached_block`] for one block hash across KV-cache groups: the key of
    /// group `g` is `BlockKey::new(hash, g)`.
    pub fn get_cached_block_for_groups(
        &self,
        hash: u64,
        group_ids: &[u32],
        mut sink: impl FnMut(u32),
    ) -> bool {
        let key = |g: u32| BlockKey::new(hash, g);
        if !group_ids
            .iter()
            .all(|&g| self.index.first(&key(g)).is_some())
        {
            return false;
        }
        group_ids
            .iter()
            .filter_map(|&g| self.index.first(&key(g)))
            .for_each(&mut sink);
        true
    }
}
