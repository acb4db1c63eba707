//! The chunk table: which key holds which slot, each chunk's reference count, and the slot pool.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use super::reserve::{OutOfMemory, filled, table};
use crate::allocator::SlotPool;
use crate::hashing::FixedState;
use crate::key::OffloadKey;

/// `ref_cnt` of a slot that holds no key.
pub(crate) const ABSENT: i32 = i32::MIN;
/// `ref_cnt` of a chunk whose store has not completed (vLLM's −1).
pub(crate) const PENDING: i32 = -1;

/// Slot-indexed chunk state plus the key → slot index.
#[derive(Clone, Debug)]
pub(crate) struct Chunks<K> {
    /// The key held by each slot; meaningful only where `ref_cnt != ABSENT`.
    keys: Vec<K>,
    /// −1 pending, 0 idle (evictable), k > 0 pinned by k loads, `ABSENT` when free.
    ref_cnt: Vec<i32>,
    /// The store call that last offered the slot's key (eviction protection).
    stamp: Vec<u32>,
    index: HashTable<u32>,
    hasher: FixedState,
    pub(crate) pool: SlotPool,
}

impl<K: OffloadKey> Chunks<K> {
    pub(crate) fn new(capacity: u32, filler: K, hasher: FixedState) -> Result<Self, OutOfMemory> {
        let n = capacity as usize;
        Ok(Chunks {
            keys: filled(n, filler)?,
            ref_cnt: filled(n, ABSENT)?,
            stamp: filled(n, 0)?,
            index: table(n)?,
            hasher,
            pool: SlotPool::try_new(capacity).ok_or(OutOfMemory)?,
        })
    }

    #[inline]
    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The slot holding `key`, if any.
    #[inline]
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        let keys = &self.keys;
        self.index
            .find(self.hash(key), |&s| keys[s as usize] == *key)
            .copied()
    }

    /// The slot of `key`, trying the hint `slot` first (a slot that still holds `key`).
    #[inline]
    pub(crate) fn find_hinted(&self, key: &K, slot: u32) -> Option<u32> {
        match self.ref_cnt.get(slot as usize) {
            Some(&r) if r != ABSENT && self.keys[slot as usize] == *key => Some(slot),
            _ => self.find(key),
        }
    }

    #[inline]
    pub(crate) fn key(&self, slot: u32) -> K {
        self.keys[slot as usize]
    }

    #[inline]
    pub(crate) fn keys(&self) -> &[K] {
        &self.keys
    }

    #[inline]
    pub(crate) fn ref_cnt(&self, slot: u32) -> i32 {
        self.ref_cnt[slot as usize]
    }

    #[inline]
    pub(crate) fn ref_cnts(&self) -> &[i32] {
        &self.ref_cnt
    }

    #[inline]
    pub(crate) fn set_ref_cnt(&mut self, slot: u32, v: i32) {
        self.ref_cnt[slot as usize] = v;
    }

    #[inline]
    pub(crate) fn stamps(&self) -> &[u32] {
        &self.stamp
    }

    #[inline]
    pub(crate) fn set_stamp(&mut self, slot: u32, stamp: u32) {
        self.stamp[slot as usize] = stamp;
    }

    /// Forgets every protection stamp (when the call counter wraps).
    pub(crate) fn clear_stamps(&mut self) {
        self.stamp.iter_mut().for_each(|s| *s = 0);
    }

    /// Records that `slot` (just allocated) holds `key`, pending.
    pub(crate) fn insert(&mut self, key: K, slot: u32) {
        let h = self.hash(&key);
        self.keys[slot as usize] = key;
        self.ref_cnt[slot as usize] = PENDING;
        let keys = &self.keys;
        let hasher = self.hasher;
        self.index
            .insert_unique(h, slot, |&s| hasher.hash_one(keys[s as usize]));
    }

    /// Removes `slot`'s key from the index and returns the slot to the pool.
    pub(crate) fn remove(&mut self, slot: u32) {
        let key = self.keys[slot as usize];
        let h = self.hash(&key);
        if let Ok(entry) = self.index.find_entry(h, |&s| s == slot) {
            entry.remove();
        }
        self.ref_cnt[slot as usize] = ABSENT;
        // The slot was allocated (it held a key), so freeing cannot fail.
        let _ = self.pool.free(slot);
    }

    /// Forgets every chunk; slot ids restart at 0.
    pub(crate) fn clear(&mut self) {
        self.index.clear();
        self.ref_cnt.iter_mut().for_each(|r| *r = ABSENT);
        self.pool.reset();
    }

    /// The number of resident keys.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Passes every resident key to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        for &s in &self.index {
            f(&self.keys[s as usize]);
        }
    }

    /// Bytes of heap held (for memory accounting).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * core::mem::size_of::<K>()
            + self.ref_cnt.capacity() * 4
            + self.stamp.capacity() * 4
            + self.index.allocation_size()
            + self.pool.heap_bytes()
    }
}
