//! [`KeyPool`]: a bounded set of keys, each held by a `u32` id from a fixed pool, with a
//! key → id index. The chunk table (ids are slots), the reuse tracker and ARC's ghost lists
//! are each one pool plus their own per-id state.
//!
//! Ids come from a [`SlotPool`]: never-used ids first, ascending, then freed ids, last freed
//! first. The key array is reserved at construction and written in that ascending order, so
//! only the ids ever used touch memory.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use crate::allocator::SlotPool;
use crate::hashing::FixedState;
use crate::reserve::{AllocError, array_bytes, put, table, table_bytes, with_capacity};

/// The keys a growing index is first sized for.
pub(crate) const GROWN_FROM: u32 = 1024;

#[derive(Clone, Debug)]
pub(crate) struct KeyPool<K> {
    /// The most ids (the index never holds more).
    max: u32,
    /// The key held by each id; meaningful only while the id is allocated.
    keys: Vec<K>,
    index: HashTable<u32>,
    hasher: FixedState,
    ids: SlotPool,
}

impl<K: Copy + Eq + core::hash::Hash> KeyPool<K> {
    /// A pool of `n` ids, all free. With `grow`, the index is first sized for at most
    /// [`GROWN_FROM`] keys and grows through [`reserve`](Self::reserve) instead of being
    /// allocated whole.
    pub(crate) fn new(n: u32, hasher: FixedState, grow: bool) -> Result<Self, AllocError> {
        let entries = if grow { n.min(GROWN_FROM) } else { n };
        Ok(KeyPool {
            max: n,
            keys: with_capacity(n as usize)?,
            index: table(entries as usize)?,
            hasher,
            ids: SlotPool::try_new(n)?,
        })
    }

    /// The bytes [`KeyPool::new`] allocates for `n` ids.
    pub(crate) fn bytes(n: u64) -> u64 {
        // The slot pool: a u32 free stack and one bit per id in u64 words.
        let ids = array_bytes(n, 4).saturating_add(array_bytes(n.div_ceil(64), 8));
        array_bytes(n, core::mem::size_of::<K>())
            .saturating_add(table_bytes::<u32>(n))
            .saturating_add(ids)
    }

    /// Makes room in the index for `additional` more keys (capped at the pool's size), so
    /// that the next inserts do not allocate.
    ///
    /// # Errors
    /// [`AllocError`] when the grown index cannot be allocated; nothing changes then.
    #[inline]
    pub(crate) fn reserve(&mut self, additional: u32) -> Result<(), AllocError> {
        let len = self.index.len();
        let want = (len + additional as usize).min(self.max as usize) - len.min(self.max as usize);
        if self.index.capacity() - len >= want {
            return Ok(());
        }
        let keys = &self.keys;
        let hasher = self.hasher;
        self.index
            .try_reserve(want, |&j| hasher.hash_one(keys[j as usize]))
            .map_err(|_| AllocError)
    }

    /// The id holding `key`, if any.
    #[inline]
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        let keys = &self.keys;
        self.index
            .find(self.hasher.hash_one(key), |&i| keys[i as usize] == *key)
            .copied()
    }

    /// The key of allocated id `id`.
    #[inline]
    pub(crate) fn key(&self, id: u32) -> K {
        self.keys[id as usize]
    }

    /// The key array, indexed by id (ids never used lie beyond its end).
    #[inline]
    pub(crate) fn keys(&self) -> &[K] {
        &self.keys
    }

    /// Whether `id` holds a key.
    #[inline]
    pub(crate) fn holds(&self, id: u32) -> bool {
        self.ids.is_allocated(id)
    }

    /// Gives `key` (not held yet) an id; `None` when every id is in use.
    pub(crate) fn insert(&mut self, key: K) -> Option<u32> {
        let id = self.ids.alloc().ok()?;
        put(&mut self.keys, id as usize, key);
        let keys = &self.keys;
        let hasher = self.hasher;
        self.index.insert_unique(hasher.hash_one(key), id, |&j| {
            hasher.hash_one(keys[j as usize])
        });
        Some(id)
    }

    /// Frees allocated id `id` and forgets its key.
    pub(crate) fn remove(&mut self, id: u32) {
        let h = self.hasher.hash_one(self.keys[id as usize]);
        if let Ok(e) = self.index.find_entry(h, |&j| j == id) {
            e.remove();
        }
        // The id held a key, so it is allocated and freeing cannot fail.
        let _ = self.ids.free(id);
    }

    /// Frees the id of `key` and returns it; `None` when `key` is not held.
    pub(crate) fn remove_key(&mut self, key: &K) -> Option<u32> {
        let keys = &self.keys;
        let entry = self
            .index
            .find_entry(self.hasher.hash_one(key), |&j| keys[j as usize] == *key)
            .ok()?;
        let (id, _) = entry.remove();
        let _ = self.ids.free(id);
        Some(id)
    }

    /// Forgets every key; ids restart at 0.
    pub(crate) fn clear(&mut self) {
        self.index.clear();
        self.ids.reset();
    }

    /// Passes every key held to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        for &id in &self.index {
            f(&self.keys[id as usize]);
        }
    }

    /// Keys held.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.ids.allocated()
    }

    /// Ids free.
    #[inline]
    pub(crate) fn free_count(&self) -> u32 {
        self.ids.free_count()
    }

    /// Keys in the index (equals [`len`](Self::len) unless the pool is corrupt).
    pub(crate) fn indexed(&self) -> usize {
        self.index.len()
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * core::mem::size_of::<K>()
            + self.index.allocation_size()
            + self.ids.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_ascend_then_reuse_last_freed_and_keys_map_back() {
        let mut p = KeyPool::<u64>::new(3, FixedState::default(), false).unwrap();
        assert_eq!([p.insert(10), p.insert(11)], [Some(0), Some(1)]);
        assert_eq!(p.keys().len(), 2);
        p.remove(0);
        assert_eq!(p.find(&10), None);
        assert_eq!(
            [p.insert(12), p.insert(13), p.insert(14)],
            [Some(2), Some(0), None]
        );
        assert_eq!(
            (p.find(&13), p.key(0), p.len(), p.free_count()),
            (Some(0), 13, 3, 0)
        );
        assert_eq!(p.remove_key(&11), Some(1));
        assert_eq!(
            (p.remove_key(&11), p.holds(1), p.indexed()),
            (None, false, 2)
        );
        p.clear();
        assert_eq!((p.len(), p.find(&12), p.insert(15)), (0, None, Some(0)));
        assert_eq!(p.heap_bytes() as u64, KeyPool::<u64>::bytes(3));
    }
}
