//! The prefix-cache index: key → the blocks holding it, in insertion order.

use alloc::vec::Vec;
use core::hash::Hash;

use crate::hashing::{FixedState, Map};

/// End of a chain.
const NIL: u32 = u32::MAX;

/// First and last block of one key's chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chain {
    first: u32,
    last: u32,
}

/// vLLM's `BlockHashToBlockMap` without per-key containers: blocks that share a key form an
/// intrusive doubly linked chain in insertion order, so the first inserted block still present
/// is `first` (what Python's insertion-ordered dict yields) and removal is O(1).
///
/// A block is in at most one chain (it holds at most one key), and callers only remove a block
/// under the key it holds. Ids are block ids below the pool's `num_blocks`, which is at most
/// `u32::MAX`, so they never equal [`NIL`].
#[derive(Clone, Debug)]
pub(super) struct KeyIndex<K> {
    heads: Map<K, Chain>,
    // INVARIANT: both have one slot per block; a block outside every chain has NIL in both.
    next: Vec<u32>,
    prev: Vec<u32>,
}

impl<K: Copy + Eq + Hash> KeyIndex<K> {
    /// An empty index for `num_blocks` blocks, with room for a key per block so the map does
    /// not grow. `None` when allocation fails.
    pub(super) fn try_new(num_blocks: usize) -> Option<Self> {
        let mut heads = Map::with_hasher(FixedState::default());
        heads.try_reserve(num_blocks).ok()?;
        Some(KeyIndex {
            heads,
            next: super::try_filled_vec(num_blocks, NIL)?,
            prev: super::try_filled_vec(num_blocks, NIL)?,
        })
    }

    /// The first inserted block still holding `key`.
    pub(super) fn first(&self, key: &K) -> Option<u32> {
        self.heads.get(key).map(|c| c.first)
    }

    /// The number of distinct keys.
    pub(super) fn len(&self) -> usize {
        self.heads.len()
    }

    /// Adds `block` (in no chain) at the end of `key`'s chain.
    pub(super) fn insert(&mut self, key: K, block: u32) {
        match self.heads.get_mut(&key) {
            None => {
                self.heads.insert(
                    key,
                    Chain {
                        first: block,
                        last: block,
                    },
                );
            }
            Some(chain) => {
                let last = chain.last;
                chain.last = block;
                self.next[last as usize] = block;
                self.prev[block as usize] = last;
            }
        }
    }

    /// Removes `block` from `key`'s chain (it must be in it), dropping the key when its chain
    /// empties.
    pub(super) fn remove(&mut self, key: &K, block: u32) {
        let (p, n) = (self.prev[block as usize], self.next[block as usize]);
        self.prev[block as usize] = NIL;
        self.next[block as usize] = NIL;
        if p != NIL {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        match (p, n) {
            (NIL, NIL) => {
                self.heads.remove(key);
            }
            _ => {
                if let Some(chain) = self.heads.get_mut(key) {
                    if p == NIL {
                        chain.first = n;
                    }
                    if n == NIL {
                        chain.last = p;
                    }
                }
            }
        }
    }

    /// Forgets every key (keeping the allocations).
    pub(super) fn clear(&mut self) {
        self.heads.clear();
        self.next.fill(NIL);
        self.prev.fill(NIL);
    }
}
