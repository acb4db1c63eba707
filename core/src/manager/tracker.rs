//! The reuse (store-threshold) tracker of vLLM 0.33.0: an LRU-ordered, size-bounded map from key
//! to the number of store offers that named it.

use alloc::vec::Vec;

use super::key_pool::KeyPool;
use super::links::{Links, List};
use crate::hashing::FixedState;
use crate::key::OffloadKey;
use crate::reserve::AllocError;

#[derive(Clone, Debug)]
pub(crate) struct Tracker<K> {
    pool: KeyPool<K>,
    /// Each node's payload is its key's offer count.
    links: Links<u32>,
    lru: List,
    max: u32,
}

impl<K: OffloadKey> Tracker<K> {
    pub(crate) fn new(max: u32, hasher: FixedState, grow: bool) -> Result<Self, AllocError> {
        Ok(Tracker {
            pool: KeyPool::new(max, 0, hasher, grow)?,
            links: Links::new(max)?,
            lru: List::EMPTY,
            max,
        })
    }

    /// The bytes [`Tracker::new`] allocates for `max` entries.
    pub(crate) fn bytes(max: u64) -> u64 {
        KeyPool::<K>::bytes(max, 0).saturating_add(Links::<u32>::bytes(max))
    }

    fn find(&self, key: &K) -> Option<u32> {
        self.pool.find(key)
    }

    /// Makes room for the keys of one offer of `n` keys (see [`KeyPool::make_room`]).
    pub(crate) fn make_room(&mut self, n: u32) -> Result<(), AllocError> {
        self.pool.make_room(n, core::iter::empty)
    }

    /// Records one offer of distinct `keys` (tracked ones move to the MRU end, count + 1, and
    /// cannot be dropped by this offer; untracked ones enter with count 1, dropping the LRU
    /// entry when full, or are not tracked when every entry is protected); writes each key's
    /// count after the offer into `counts_out` (0 for a key that could not be tracked).
    pub(crate) fn record(&mut self, keys: &[K], counts_out: &mut Vec<u32>) {
        counts_out.clear();
        let mut protected = 0u32;
        for key in keys {
            match self.find(key) {
                Some(i) => {
                    self.links.move_to_tail(&mut self.lru, i);
                    let c = self.links.data(i).saturating_add(1);
                    self.links.set_data(i, c);
                    protected += 1;
                    counts_out.push(c);
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
            let Some(i) = self.pool.insert(*key) else {
                continue;
            };
            self.links.set_data(i, 1);
            self.links.push_back(&mut self.lru, i);
            *count = 1;
        }
    }

    fn drop_lru(&mut self) {
        let head = self.lru.head;
        self.pool.remove(head);
        self.links.unlink(&mut self.lru, head);
    }

    /// Tracked keys (for tests and invariant checks).
    pub(crate) fn len(&self) -> u32 {
        self.lru.len
    }

    /// The count of `key`, 0 when untracked.
    pub(crate) fn count(&self, key: &K) -> u32 {
        self.find(key).map_or(0, |i| self.links.data(i))
    }

    /// Passes every tracked key to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        self.pool.for_each_key(&mut f);
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.pool.heap_bytes() + self.links.heap_bytes()
    }
}
