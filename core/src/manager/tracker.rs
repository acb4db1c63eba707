//! The reuse (store-threshold) tracker of vLLM 0.33.0: an LRU-ordered, size-bounded map from key
//! to the number of store offers that named it.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use super::links::{Links, List};
use super::reserve::{OutOfMemory, descending, filled, table};
use crate::hashing::FixedState;
use crate::key::OffloadKey;

#[derive(Clone, Debug)]
pub(crate) struct Tracker<K> {
    links: Links,
    keys: Vec<K>,
    counts: Vec<u32>,
    free: Vec<u32>,
    index: HashTable<u32>,
    hasher: FixedState,
    lru: List,
    max: u32,
}

impl<K: OffloadKey> Tracker<K> {
    pub(crate) fn new(max: u32, filler: K, hasher: FixedState) -> Result<Self, OutOfMemory> {
        let n = max as usize;
        Ok(Tracker {
            links: Links::new(n)?,
            keys: filled(n, filler)?,
            counts: filled(n, 0)?,
            free: descending(max)?,
            index: table(n)?,
            hasher,
            lru: List::EMPTY,
            max,
        })
    }

    fn find(&self, key: &K) -> Option<u32> {
        let keys = &self.keys;
        self.index
            .find(self.hasher.hash_one(key), |&i| keys[i as usize] == *key)
            .copied()
    }

    /// Records one offer of distinct `keys` (tracked ones move to the MRU end, count + 1, and
    /// cannot be dropped by this offer; untracked ones enter with count 1, dropping the LRU
    /// entry when full, or are not tracked when every entry is protected); writes each key's count after the offer into
    /// `counts_out` (0 for a key that could not be tracked).
    pub(crate) fn record(&mut self, keys: &[K], counts_out: &mut Vec<u32>) {
        counts_out.clear();
        let mut protected = 0u32;
        for key in keys {
            match self.find(key) {
                Some(i) => {
                    self.links.move_to_tail(&mut self.lru, i);
                    self.counts[i as usize] = self.counts[i as usize].saturating_add(1);
                    protected += 1;
                    counts_out.push(self.counts[i as usize]);
                }
                None => counts_out.push(0),
            }
        }
        let mut unprotected = self.lru.len - protected;
        for (key, count) in keys.iter().zip(counts_out.iter_mut()) {
            if *count != 0 {
                continue;
            }
            if self.lru.len >= self.max {
                if unprotected == 0 {
                    continue;
                }
                self.drop_lru();
                unprotected -= 1;
            }
            let Some(i) = self.free.pop() else { continue };
            self.keys[i as usize] = *key;
            self.counts[i as usize] = 1;
            self.links.push_back(&mut self.lru, i);
            let keys = &self.keys;
            let hasher = self.hasher;
            self.index.insert_unique(hasher.hash_one(key), i, |&j| {
                hasher.hash_one(keys[j as usize])
            });
            *count = 1;
        }
    }

    fn drop_lru(&mut self) {
        let head = self.lru.head;
        let h = self.hasher.hash_one(self.keys[head as usize]);
        if let Ok(e) = self.index.find_entry(h, |&j| j == head) {
            e.remove();
        }
        self.links.unlink(&mut self.lru, head);
        self.free.push(head);
    }

    /// Tracked keys (for tests and invariant checks).
    pub(crate) fn len(&self) -> u32 {
        self.lru.len
    }

    /// The count of `key`, 0 when untracked.
    pub(crate) fn count(&self, key: &K) -> u32 {
        self.find(key).map_or(0, |i| self.counts[i as usize])
    }

    /// Passes every tracked key to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        for &i in &self.index {
            f(&self.keys[i as usize]);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * (core::mem::size_of::<K>() + 8 + 4 + 4)
            + self.index.allocation_size()
    }
}
