//! [`KeyPool`]: a bounded set of keys, each held by a `u32` id from a fixed pool: a
//! [`KeyTable`] (the key → id index) whose ids a [`SlotPool`] hands out. The chunk table (ids
//! are slots) and the reuse tracker are each one pool plus their own per-id state. The table
//! may hold `extra` ids past the pool's, which the pool's own lookups do not see (the chunk
//! table lends them to ARC's ghosts, see [`table_mut`](KeyPool::table_mut)).
//!
//! Ids come from a [`SlotPool`]: never-used ids first, ascending, then freed ids, last freed
//! first. The key array is written in that ascending order, so only the ids ever used touch
//! memory.

use crate::allocator::SlotPool;
use crate::hashing::FixedState;
use crate::reserve::{AllocError, array_bytes};

use super::key_table::KeyTable;

#[derive(Clone, Debug)]
pub(crate) struct KeyPool<K> {
    table: KeyTable<K>,
    ids: SlotPool,
    /// The pool's own ids are `0..size`.
    size: u32,
}

impl<K: Copy + Eq + core::hash::Hash> KeyPool<K> {
    /// A pool of `n` ids, all free, in a table of `n + extra` ids. With `grow`, the index is
    /// first sized for at most [`GROWN_FROM`](super::key_table::GROWN_FROM) keys and grows
    /// through [`make_room`](Self::make_room) instead of being allocated whole.
    pub(crate) fn new(
        n: u32,
        extra: u32,
        hasher: FixedState,
        grow: bool,
    ) -> Result<Self, AllocError> {
        let all = n.checked_add(extra).ok_or(AllocError)?;
        Ok(KeyPool {
            table: KeyTable::new(all, hasher, grow)?,
            ids: SlotPool::try_new(n)?,
            size: n,
        })
    }

    /// The bytes [`KeyPool::new`] allocates for `n` ids and `extra` more in the table.
    pub(crate) fn bytes(n: u64, extra: u64) -> u64 {
        // The slot pool: a u32 free stack and one bit per id in u64 words.
        let ids = array_bytes(n, 4).saturating_add(array_bytes(n.div_ceil(64), 8));
        KeyTable::<K>::bytes(n.saturating_add(extra)).saturating_add(ids)
    }

    /// The table, whose ids from the pool's size `n` on are the lender's to use (the pool
    /// hands out, finds and walks only its own).
    #[inline]
    pub(crate) fn table_mut(&mut self) -> &mut KeyTable<K> {
        &mut self.table
    }

    /// The table (see [`table_mut`](Self::table_mut)).
    #[inline]
    pub(crate) fn table(&self) -> &KeyTable<K> {
        &self.table
    }

    /// Makes room in the index for `inserts` more insertions (see [`KeyTable::make_room`]);
    /// `extra` lists the lender's ids past the pool's that hold keys.
    ///
    /// # Errors
    /// [`AllocError`] when the grown index cannot be allocated; nothing changes then.
    #[inline]
    pub(crate) fn make_room<I: Iterator<Item = u32>>(
        &mut self,
        inserts: u32,
        extra: impl FnOnce() -> I,
    ) -> Result<(), AllocError> {
        let ids = &self.ids;
        self.table.make_room(inserts, || {
            (0..self.size)
                .filter(|&i| ids.is_allocated(i))
                .chain(extra())
        })
    }

    /// The id holding `key`, if any.
    #[inline]
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        let size = self.size;
        self.table.find_in(key, |i| i < size)
    }

    /// The key of allocated id `id`.
    #[inline]
    pub(crate) fn key(&self, id: u32) -> K {
        self.table.key(id)
    }

    /// The key array, indexed by id (ids never used lie beyond its end).
    #[inline]
    pub(crate) fn keys(&self) -> &[K] {
        self.table.keys()
    }

    /// Whether `id` holds a key.
    #[inline]
    pub(crate) fn holds(&self, id: u32) -> bool {
        self.ids.is_allocated(id)
    }

    /// Gives `key` (not held yet) an id; `None` when every id is in use.
    pub(crate) fn insert(&mut self, key: K) -> Option<u32> {
        self.insert_hashed(key, self.table.hash(&key))
    }

    /// [`insert`](Self::insert) for a key whose hash `h` ([`KeyTable::hash`]) the caller has.
    #[inline]
    pub(crate) fn insert_hashed(&mut self, key: K, h: u64) -> Option<u32> {
        let id = self.ids.alloc().ok()?;
        self.table.insert_at_hashed(id, key, h);
        Some(id)
    }

    /// Frees allocated id `id` and forgets its key.
    pub(crate) fn remove(&mut self, id: u32) {
        self.table.remove(id);
        // The id held a key, so it is allocated and freeing cannot fail.
        let _ = self.ids.free(id);
    }

    /// [`insert_hashed`](Self::insert_hashed) of `key`, taking over the index entry of id
    /// `from` if that id still holds `key` (an ARC ghost becoming resident: one probe, no
    /// tombstone). Returns the new id and whether the entry was taken over; `None` when no id
    /// is free.
    #[inline]
    pub(crate) fn insert_from(&mut self, key: K, h: u64, from: u32) -> Option<(u32, bool)> {
        let id = self.ids.alloc().ok()?;
        let moved = self.table.relabel_hashed(from, id, key, h);
        if !moved {
            self.table.insert_at_hashed(id, key, h);
        }
        Some((id, moved))
    }

    /// Frees allocated id `id` whose key the table no longer files under it (see
    /// [`KeyTable::relabel`]).
    pub(crate) fn release(&mut self, id: u32) {
        // The id is allocated (the caller's chunk held it), so freeing cannot fail.
        let _ = self.ids.free(id);
    }

    /// Forgets every key; ids restart at 0.
    pub(crate) fn clear(&mut self) {
        self.table.clear();
        self.ids.reset();
    }

    /// Passes every key held to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, f: impl FnMut(&K)) {
        let size = self.size;
        self.table.for_each_key_in(|i| i < size, f);
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

    /// The pool's keys in the index (equals [`len`](Self::len) unless the pool is corrupt; a
    /// walk over the whole index).
    pub(crate) fn indexed(&self) -> usize {
        let size = self.size;
        self.table.count_in(|i| i < size)
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + self.ids.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_ascend_then_reuse_last_freed_and_keys_map_back() {
        let mut p = KeyPool::<u64>::new(3, 0, FixedState::default(), false).unwrap();
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
        p.remove(1);
        assert_eq!(
            (p.find(&11), p.holds(1), p.holds(2), p.indexed()),
            (None, false, true, 2)
        );
        p.clear();
        assert_eq!((p.len(), p.find(&12), p.insert(15)), (0, None, Some(0)));
        assert_eq!(p.heap_bytes() as u64, KeyPool::<u64>::bytes(3, 0));
    }
}
