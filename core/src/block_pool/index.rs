//! The prefix-cache index: each block's hash, and key → the blocks holding it, in insertion
//! order.

use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};

use super::types::BlockHash;
use crate::hashing::FixedState;

/// No block.
const NIL: u32 = u32::MAX;

/// vLLM's `BlockHashToBlockMap` plus each block's hash, as an intrusive chained hash table that
/// never grows: all its memory is allocated by [`KeyIndex::try_new`].
///
/// Blocks sharing a key form a chain in insertion order; the first one (the chain's *head*) is
/// what Python's insertion-ordered dict yields first, so it answers [`KeyIndex::first`]. Heads
/// hang off `buckets` (a power of two ≥ the number of blocks, so at most one key per bucket on
/// average), linked through `bucket_next`. Block ids are below `num_blocks ≤ u32::MAX`, so they
/// never equal [`NIL`].
#[derive(Clone, Debug)]
pub(super) struct KeyIndex<K> {
    hasher: FixedState,
    // INVARIANTS, with one slot per block in every per-block vector:
    // * `entries[b]` is `Some` iff `b` is in exactly one key chain, the chain of its key.
    // * Key chains: `next[b]` is the next block with the same key (NIL at the tail); `prev[b]`
    //   is the previous one, except that a head's `prev` is its chain's tail (itself when
    //   alone). A block outside every chain has NIL in `next`, `prev` and `bucket_next`.
    // * Each key's head is in exactly one bucket list: `buckets[bucket(key)]`, then
    //   `bucket_next[head]` onwards. Only heads are in bucket lists.
    entries: Vec<Option<BlockHash<K>>>,
    next: Vec<u32>,
    prev: Vec<u32>,
    bucket_next: Vec<u32>,
    buckets: Vec<u32>,
    keys: usize,
}

impl<K: Copy + Eq + Hash> KeyIndex<K> {
    /// An empty index for `num_blocks` blocks; `None` when allocation fails.
    pub(super) fn try_new(num_blocks: usize) -> Option<Self> {
        let num_buckets = num_blocks.max(1).checked_next_power_of_two()?;
        Some(KeyIndex {
            hasher: FixedState::default(),
            entries: super::try_filled_vec(num_blocks, None)?,
            next: super::try_filled_vec(num_blocks, NIL)?,
            prev: super::try_filled_vec(num_blocks, NIL)?,
            bucket_next: super::try_filled_vec(num_blocks, NIL)?,
            buckets: super::try_filled_vec(num_buckets, NIL)?,
            keys: 0,
        })
    }

    /// The hash `block` holds (`None` also when out of range).
    pub(super) fn get(&self, block: u32) -> Option<BlockHash<K>> {
        self.entries.get(block as usize).copied().flatten()
    }

    /// True when `block` holds a hash (`block` in range).
    pub(super) fn has_hash(&self, block: u32) -> bool {
        self.entries[block as usize].is_some()
    }

    /// The first inserted block still holding `key`.
    pub(super) fn first(&self, key: &K) -> Option<u32> {
        let mut b = self.buckets[self.bucket(key)];
        while b != NIL {
            if self.entries[b as usize].is_some_and(|e| e.key == *key) {
                return Some(b);
            }
            b = self.bucket_next[b as usize];
        }
        None
    }

    /// The number of distinct keys.
    pub(super) fn len(&self) -> usize {
        self.keys
    }

    /// Gives `block` (in range, holding no hash) the hash `entry`, at the end of its key's
    /// chain.
    pub(super) fn insert(&mut self, block: u32, entry: BlockHash<K>) {
        let head = self.first(&entry.key);
        self.entries[block as usize] = Some(entry);
        self.next[block as usize] = NIL;
        match head {
            None => {
                let i = self.bucket(&entry.key);
                self.bucket_next[block as usize] = self.buckets[i];
                self.buckets[i] = block;
                self.prev[block as usize] = block;
                self.keys += 1;
            }
            Some(head) => {
                let tail = self.prev[head as usize];
                self.next[tail as usize] = block;
                self.prev[block as usize] = tail;
                self.prev[head as usize] = block;
            }
        }
    }

    /// Takes `block`'s hash (`block` in range), unlinking it; `None` when it held none.
    pub(super) fn remove(&mut self, block: u32) -> Option<BlockHash<K>> {
        let entry = self.entries[block as usize]?;
        let b = block as usize;
        let (p, n) = (self.prev[b], self.next[b]);
        if self.first(&entry.key) == Some(block) {
            // A head: its successor (if any) becomes the head, in its place in the bucket list.
            let replacement = if n == NIL {
                self.keys -= 1;
                self.bucket_next[b]
            } else {
                self.prev[n as usize] = p; // the chain's tail
                self.bucket_next[n as usize] = self.bucket_next[b];
                n
            };
            self.replace_in_bucket(&entry.key, block, replacement);
        } else {
            self.next[p as usize] = n;
            if n == NIL {
                // `block` was the tail: the head's `prev` must point at the new tail.
                if let Some(head) = self.first(&entry.key) {
                    self.prev[head as usize] = p;
                }
            } else {
                self.prev[n as usize] = p;
            }
        }
        self.entries[b] = None;
        self.next[b] = NIL;
        self.prev[b] = NIL;
        self.bucket_next[b] = NIL;
        Some(entry)
    }

    /// Forgets every hash (keeping the allocations).
    pub(super) fn clear(&mut self) {
        self.entries.fill(None);
        self.next.fill(NIL);
        self.prev.fill(NIL);
        self.bucket_next.fill(NIL);
        self.buckets.fill(NIL);
        self.keys = 0;
    }

    /// Bytes of heap held.
    pub(super) fn heap_bytes(&self) -> usize {
        let links = self.next.capacity()
            + self.prev.capacity()
            + self.bucket_next.capacity()
            + self.buckets.capacity();
        self.entries.capacity() * size_of::<Option<BlockHash<K>>>() + links * size_of::<u32>()
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "masked to below buckets.len(), a usize"
    )]
    fn bucket(&self, key: &K) -> usize {
        let mask = (self.buckets.len() - 1) as u64;
        (self.hasher.hash_one(key) & mask) as usize
    }

    /// In `key`'s bucket list, puts `new` (a block or NIL) where `old` is.
    fn replace_in_bucket(&mut self, key: &K, old: u32, new: u32) {
        let i = self.bucket(key);
        if self.buckets[i] == old {
            self.buckets[i] = new;
            return;
        }
        let mut b = self.buckets[i];
        while b != NIL {
            let after = self.bucket_next[b as usize];
            if after == old {
                self.bucket_next[b as usize] = new;
                return;
            }
            b = after;
        }
    }
}
