//! The block pool's configuration, events, per-block hash and usage ratio.

use crate::ratio::Ratio;

/// How to build a [`BlockPool`](super::BlockPool): `new(required…)`, then change the public
/// optional fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockPoolConfig {
    /// Blocks in the pool, the null block 0 included (vLLM's `num_gpu_blocks`). Must be > 0.
    pub num_blocks: u32,
    /// Prefix caching: when false, freed blocks all go to the front of the free queue and
    /// handing a block out does not evict its hash.
    pub enable_caching: bool,
    /// Record [`PoolEvent`]s for [`BlockPool::take_events`](super::BlockPool::take_events)
    /// (vLLM's `enable_kv_cache_events`; off by default, as in vLLM).
    pub enable_events: bool,
    /// The most events held between two `take_events` calls; further events are dropped and
    /// counted in [`BlockPool::dropped_events`](super::BlockPool::dropped_events).
    pub event_capacity: u32,
    /// Room for secondary hashes across the pool (vLLM's `cached_block_hashes_by_block`:
    /// further keys a block is reachable under, see
    /// [`BlockPool::insert_secondary_hash`](super::BlockPool::insert_secondary_hash));
    /// default 0.
    pub secondary_capacity: u32,
}

impl BlockPoolConfig {
    /// Default event capacity.
    pub const DEFAULT_EVENT_CAPACITY: u32 = 4096;

    /// A pool of `num_blocks` blocks, events off.
    #[must_use]
    pub const fn new(num_blocks: u32, enable_caching: bool) -> Self {
        BlockPoolConfig {
            num_blocks,
            enable_caching,
            enable_events: false,
            event_capacity: Self::DEFAULT_EVENT_CAPACITY,
            secondary_capacity: 0,
        }
    }
}

/// The prefix-cache hash a block holds: its key and the number of prefix tokens it covers
/// (vLLM's `block_hash` and `block_hash_num_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockHash<K> {
    /// The key (block hash with its KV-cache group).
    pub key: K,
    /// Prefix tokens covered: `(i + 1) · block_size` for the request's i-th block.
    pub num_tokens: u64,
}

/// A change to the prefix cache, recorded when events are on.
///
/// vLLM emits one `BlockStored` per `cache_full_blocks` call listing the new hashes (plus token
/// ids and extra keys that kvtier does not hold); kvtier emits one [`PoolEvent::Stored`] per
/// newly cached block, in the same order and at the same point in the event stream (after the
/// call's removals). A call that caches no block emits nothing, where vLLM emits an empty
/// `BlockStored`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolEvent<K> {
    /// A block became reachable under `key` (vLLM's `BlockStored`).
    Stored {
        /// The key.
        key: K,
        /// The block now holding it.
        block: u32,
        /// Prefix tokens it covers.
        num_tokens: u64,
    },
    /// A block stopped being reachable under `key` (vLLM's `BlockRemoved`).
    Removed {
        /// The key.
        key: K,
        /// The block that held it.
        block: u32,
    },
    /// Every hash was cleared by a successful `reset_prefix_cache` (vLLM's `AllBlocksCleared`).
    AllCleared,
}

/// KV-cache usage as an exact ratio: `used / total`, where `total = num_blocks − 1` and the
/// null block counts in neither (vLLM's `get_usage`, published as `vllm:kv_cache_usage_perc`).
/// Cached-but-idle blocks count as free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Blocks in use (not in the free queue), the null block excluded.
    pub used: u32,
    /// Blocks that can be used: `num_blocks − 1`.
    pub total: u32,
}

impl Usage {
    /// `used / total`, exact (0 when `total == 0`).
    #[must_use]
    pub fn ratio(&self) -> Ratio {
        Ratio::new(u64::from(self.used), u64::from(self.total)).unwrap_or(Ratio::ZERO)
    }

    /// Free blocks: `total − used`.
    #[must_use]
    pub const fn free(&self) -> u32 {
        self.total.saturating_sub(self.used)
    }

    /// The ratio as vLLM computes it, bit for bit: `1.0 − free / total` in `f64`, or 0 when
    /// `total == 0`. (This can differ from `used / total` in the last bit: with 1 of 9 used it
    /// is `1 − 8/9 = 0.11111111111111116`, not `0.1111111111111111`.)
    #[must_use]
    pub fn as_f64(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        1.0 - f64::from(self.free()) / f64::from(self.total)
    }
}
