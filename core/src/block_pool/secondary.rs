//! Secondary hashes: a block reachable under more keys than its own hash (vLLM's
//! `cached_block_hashes_by_block`, the fine-grained prefix boundaries inside a block), kept
//! in the key index's bounded side room ([`BlockPoolConfig::secondary_capacity`]).

use core::hash::Hash;

#[cfg(doc)]
use super::BlockPoolConfig;
use super::{BlockHash, BlockPool, InsertHashError, PoolEvent};

impl<K: Copy + Eq + Hash> BlockPool<K> {
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

    /// Drops `block`'s secondary hashes, emitting `Removed` for each (out of the eviction's
    /// hot path: only a CPU pool of a fine-grained layout has them).
    #[inline(never)]
    pub(super) fn evict_secondaries(&mut self, block: u32) {
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
}
