//! The prefix-cache index: each block's hash, and key → the blocks holding it, in insertion
//! order.

use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};

use super::types::BlockHash;
use crate::hashing::FixedState;

/// No block.
const NIL: u32 = u32::MAX;

/// One block's hash and links, kept together so that touching a block is one cache line.
#[derive(Clone, Copy, Debug)]
struct Slot<K> {
    entry: Option<BlockHash<K>>,
    next: u32,
    prev: u32,
    bucket_next: u32,
}

impl<K> Slot<K> {
    const EMPTY: Self = Slot {
        entry: None,
        next: NIL,
        prev: NIL,
        bucket_next: NIL,
    };
}

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
    // INVARIANTS, with one slot per block:
    // * `slots[b].entry` is `Some` iff `b` is in exactly one key chain, the chain of its key.
    // * Key chains: `next` is the next block with the same key (NIL at the tail); `prev` is
    //   the previous one, except that a head's `prev` is its chain's tail (itself when alone).
    //   A block outside every chain is `Slot::EMPTY`.
    // * Each key's head is in exactly one bucket list: `buckets[bucket(key)]`, then the
    //   heads' `bucket_next` onwards. Only heads are in bucket lists.
    slots: Vec<Slot<K>>,
    buckets: Vec<u32>,
    keys: usize,
}

impl<K: Copy + Eq + Hash> KeyIndex<K> {
    /// An empty index for `num_blocks` blocks; `None` when allocation fails.
    pub(super) fn try_new(num_blocks: usize) -> Option<Self> {
        let num_buckets = num_blocks.max(1).checked_next_power_of_two()?;
        Some(KeyIndex {
            hasher: FixedState::default(),
            slots: crate::reserve::filled(num_blocks, Slot::EMPTY).ok()?,
            buckets: crate::reserve::filled(num_buckets, NIL).ok()?,
            keys: 0,
        })
    }

    /// The hash `block` holds (`None` also when out of range).
    pub(super) fn get(&self, block: u32) -> Option<BlockHash<K>> {
        self.slots.get(block as usize).and_then(|s| s.entry)
    }

    /// True when `block` holds a hash (`block` in range).
    pub(super) fn has_hash(&self, block: u32) -> bool {
        self.slots[block as usize].entry.is_some()
    }

    /// The first inserted block still holding `key`.
    pub(super) fn first(&self, key: &K) -> Option<u32> {
        let mut b = self.buckets[self.bucket(key)];
        while b != NIL {
            let slot = &self.slots[b as usize];
            if slot.entry.is_some_and(|e| e.key == *key) {
                return Some(b);
            }
            b = slot.bucket_next;
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
        let slot = match head {
            None => {
                let i = self.bucket(&entry.key);
                let bucket_next = self.buckets[i];
                self.buckets[i] = block;
                self.keys += 1;
                Slot {
                    entry: Some(entry),
                    next: NIL,
                    prev: block,
                    bucket_next,
                }
            }
            Some(head) => {
                let tail = self.slots[head as usize].prev;
                self.slots[tail as usize].next = block;
                self.slots[head as usize].prev = block;
                Slot {
                    entry: Some(entry),
                    next: NIL,
                    prev: tail,
                    bucket_next: NIL,
                }
            }
        };
        self.slots[block as usize] = slot;
    }

    /// Takes `block`'s hash (`block` in range), unlinking it; `None` when it held none.
    pub(super) fn remove(&mut self, block: u32) -> Option<BlockHash<K>> {
        let Slot {
            entry,
            next: n,
            prev: p,
            bucket_next,
        } = self.slots[block as usize];
        let entry = entry?;
        // A head is the one block whose `prev` (the tail) does not point back at it.
        if self.slots[p as usize].next != block {
            // Its successor (if any) becomes the head, in its place in the bucket list.
            let replacement = if n == NIL {
                self.keys -= 1;
                bucket_next
            } else {
                let succ = &mut self.slots[n as usize];
                succ.prev = p; // the chain's tail
                succ.bucket_next = bucket_next;
                n
            };
            self.replace_in_bucket(&entry.key, block, replacement);
        } else {
            self.slots[p as usize].next = n;
            if n == NIL {
                // `block` was the tail: the head's `prev` must point at the new tail.
                if let Some(head) = self.first(&entry.key) {
                    self.slots[head as usize].prev = p;
                }
            } else {
                self.slots[n as usize].prev = p;
            }
        }
        self.slots[block as usize] = Slot::EMPTY;
        Some(entry)
    }

    /// Forgets every hash (keeping the allocations).
    pub(super) fn clear(&mut self) {
        self.slots.fill(Slot::EMPTY);
        self.buckets.fill(NIL);
        self.keys = 0;
    }

    /// Bytes of heap held.
    pub(super) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot<K>>() + self.buckets.capacity() * size_of::<u32>()
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
            let after = self.slots[b as usize].bucket_next;
            if after == old {
                self.slots[b as usize].bucket_next = new;
                return;
            }
            b = after;
        }
    }
}
