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
    // Secondary hashes (vLLM's `cached_block_hashes_by_block`): nodes `n..n + cap` of
    // `slots` (n = blocks), chained by key like the blocks' own slots. Per secondary node:
    // its block (`owner`) and the next node of the same block or of the free list
    // (`sec_next`); per block: its first secondary node (`sec_head`, empty when cap = 0).
    blocks: u32,
    owner: Vec<u32>,
    sec_next: Vec<u32>,
    sec_head: Vec<u32>,
    sec_free: u32,
}

impl<K: Copy + Eq + Hash> KeyIndex<K> {
    /// An empty index for `num_blocks` blocks with room for `secondary` secondary hashes;
    /// `None` when allocation fails or the node ids would not fit `u32`.
    pub(super) fn try_new(num_blocks: usize, secondary: usize) -> Option<Self> {
        let nodes = num_blocks.checked_add(secondary)?;
        u32::try_from(nodes).ok().filter(|&n| n != NIL)?;
        let num_buckets = num_blocks.max(1).checked_next_power_of_two()?;
        let blocks = u32::try_from(num_blocks).ok()?;
        let mut index = KeyIndex {
            hasher: FixedState::default(),
            slots: crate::reserve::filled(nodes, Slot::EMPTY).ok()?,
            buckets: crate::reserve::filled(num_buckets, NIL).ok()?,
            keys: 0,
            blocks,
            owner: crate::reserve::filled(secondary, NIL).ok()?,
            sec_next: crate::reserve::filled(secondary, NIL).ok()?,
            sec_head: crate::reserve::filled(if secondary > 0 { num_blocks } else { 0 }, NIL)
                .ok()?,
            sec_free: NIL,
        };
        index.reset_secondary();
        Some(index)
    }

    /// Puts every secondary node on the free list.
    fn reset_secondary(&mut self) {
        let cap = self.sec_next.len();
        // Node ids fit u32 (checked in `try_new`).
        for (next, node) in self.sec_next.iter_mut().zip(self.blocks + 1..) {
            *next = node;
        }
        if let Some(last) = self.sec_next.last_mut() {
            *last = NIL;
        }
        self.sec_free = if cap > 0 { self.blocks } else { NIL };
        self.sec_head.fill(NIL);
        self.owner.fill(NIL);
    }

    /// The block a node belongs to.
    fn block_of(&self, node: u32) -> u32 {
        if node < self.blocks {
            node
        } else {
            self.owner[(node - self.blocks) as usize]
        }
    }

    /// The hash `block` holds (`None` also when out of range).
    pub(super) fn get(&self, block: u32) -> Option<BlockHash<K>> {
        self.slots.get(block as usize).and_then(|s| s.entry)
    }

    /// True when `block` holds a hash (`block` in range).
    pub(super) fn has_hash(&self, block: u32) -> bool {
        self.slots[block as usize].entry.is_some()
    }

    /// The first inserted block still holding `key` (as its hash or a secondary one).
    pub(super) fn first(&self, key: &K) -> Option<u32> {
        self.head(key).map(|n| self.block_of(n))
    }

    /// The head node of `key`'s chain.
    fn head(&self, key: &K) -> Option<u32> {
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

    /// Whether `block` holds `key` (as its hash or a secondary one).
    pub(super) fn contains(&self, key: &K, block: u32) -> bool {
        let mut n = self.head(key).unwrap_or(NIL);
        while n != NIL {
            if self.block_of(n) == block {
                return true;
            }
            n = self.slots[n as usize].next;
        }
        false
    }

    /// `block`'s secondary hashes, in insertion order.
    pub(super) fn secondaries(&self, block: u32) -> impl Iterator<Item = K> + '_ {
        let mut n = self.sec_head.get(block as usize).copied().unwrap_or(NIL);
        core::iter::from_fn(move || {
            if n == NIL {
                return None;
            }
            let key = self.slots[n as usize].entry.map(|e| e.key);
            n = self.sec_next[(n - self.blocks) as usize];
            key
        })
    }

    /// Adds `key` as a secondary hash of `block` (in range, holding a hash, not holding
    /// `key`), at the end of the key's chain. False when no node is free.
    pub(super) fn insert_secondary(&mut self, block: u32, key: K) -> bool {
        let node = self.sec_free;
        if node == NIL {
            return false;
        }
        let i = (node - self.blocks) as usize;
        self.sec_free = self.sec_next[i];
        self.owner[i] = block;
        // Appended to the block's list, so it iterates in insertion order.
        self.sec_next[i] = NIL;
        match self.sec_head[block as usize] {
            NIL => self.sec_head[block as usize] = node,
            mut at => loop {
                let j = (at - self.blocks) as usize;
                if self.sec_next[j] == NIL {
                    self.sec_next[j] = node;
                    break;
                }
                at = self.sec_next[j];
            },
        }
        self.insert(node, BlockHash { key, num_tokens: 0 });
        true
    }

    /// Takes `block`'s secondary hashes (`block` in range), passing each key to `f` in
    /// insertion order.
    pub(super) fn remove_secondaries(&mut self, block: u32, mut f: impl FnMut(K)) {
        let Some(&head) = self.sec_head.get(block as usize) else {
            return;
        };
        self.sec_head[block as usize] = NIL;
        let mut n = head;
        while n != NIL {
            let i = (n - self.blocks) as usize;
            let next = self.sec_next[i];
            if let Some(e) = self.remove(n) {
                f(e.key);
            }
            self.owner[i] = NIL;
            self.sec_next[i] = self.sec_free;
            self.sec_free = n;
            n = next;
        }
    }

    /// The number of distinct keys.
    pub(super) fn len(&self) -> usize {
        self.keys
    }

    /// Gives node `block` (in range, holding no hash) the hash `entry`, at the end of its
    /// key's chain.
    pub(super) fn insert(&mut self, block: u32, entry: BlockHash<K>) {
        let head = self.head(&entry.key);
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

    /// Takes node `block`'s hash (`block` in range), unlinking it; `None` when it held none.
    #[inline]
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
                if let Some(head) = self.head(&entry.key) {
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
        self.reset_secondary();
    }

    /// Bytes of heap held.
    pub(super) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot<K>>()
            + (self.buckets.capacity()
                + self.owner.capacity()
                + self.sec_next.capacity()
                + self.sec_head.capacity())
                * size_of::<u32>()
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
