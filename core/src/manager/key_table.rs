//! [`KeyTable`]: keys held by `u32` ids the owner chooses, with a key → id index. It is the
//! lookup half of [`KeyPool`](super::key_pool::KeyPool), which adds an id allocator for the
//! ids below its size. Ids above it are another owner's: the chunk table's holds ARC's ghost
//! keys there, so that one index answers for resident and ghost keys alike (a key is never
//! both), and the lookups that care say which ids they mean.
//!
//! The key array is reserved at construction and written as far as the highest id used, so
//! only the ids ever used touch memory.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use crate::hashing::FixedState;
use crate::reserve::{AllocError, array_bytes, put, table, table_bytes, with_capacity};

/// The keys a growing index is first sized for.
pub(crate) const GROWN_FROM: u32 = 1024;

#[derive(Clone, Debug)]
pub(crate) struct KeyTable<K> {
    /// The most ids (the index never holds more).
    max: u32,
    /// The key held by each id; meaningful only while the id is in the index.
    keys: Vec<K>,
    index: HashTable<u32>,
    hasher: FixedState,
}

impl<K: Copy + Eq + core::hash::Hash> KeyTable<K> {
    /// A table for ids `0..n`, empty. With `grow`, the index is first sized for at most
    /// [`GROWN_FROM`] keys and grows through [`make_room`](Self::make_room) instead of being
    /// allocated whole.
    pub(crate) fn new(n: u32, hasher: FixedState, grow: bool) -> Result<Self, AllocError> {
        let entries = if grow { n.min(GROWN_FROM) } else { n };
        Ok(KeyTable {
            max: n,
            keys: with_capacity(n as usize)?,
            index: table(entries as usize)?,
            hasher,
        })
    }

    /// The bytes [`KeyTable::new`] allocates for `n` ids (the index at its largest).
    pub(crate) fn bytes(n: u64) -> u64 {
        array_bytes(n, core::mem::size_of::<K>()).saturating_add(table_bytes::<u32>(n))
    }

    /// Makes room in the index for `inserts` more insertions, so that they do not allocate.
    /// `live` lists the ids that hold keys, for a rebuild.
    ///
    /// Removed keys leave tombstones, which use up a hash table's room; once it is gone,
    /// hashbrown doubles a table more than half full at the next insertion. An index at its
    /// full size (the one [`bytes`](Self::bytes) counts) is therefore rebuilt in place from
    /// `live` instead: no allocation, the same lookups. A smaller one (growing, see
    /// [`new`](Self::new)) grows toward the full size. The room of a full index is then what
    /// its size leaves past its keys; an offer that inserts more than that can still make
    /// hashbrown double it, once (the keys never outnumber the ids, so the doubled index is
    /// at most half full and hashbrown rebuilds it in place from then on).
    ///
    /// # Errors
    /// [`AllocError`] when the grown index cannot be allocated; nothing changes then.
    #[inline]
    pub(crate) fn make_room<I: Iterator<Item = u32>>(
        &mut self,
        inserts: u32,
        live: impl FnOnce() -> I,
    ) -> Result<(), AllocError> {
        if self.index.capacity() - self.index.len() >= inserts as usize {
            return Ok(());
        }
        self.make_room_slow(inserts, live)
    }

    #[cold]
    #[inline(never)]
    fn make_room_slow<I: Iterator<Item = u32>>(
        &mut self,
        inserts: u32,
        live: impl FnOnce() -> I,
    ) -> Result<(), AllocError> {
        let (keys, hasher) = (&self.keys, self.hasher);
        if self.index.allocation_size() as u64 >= table_bytes::<u32>(u64::from(self.max)) {
            self.index.clear();
            for id in live() {
                let h = hasher.hash_one(keys[id as usize]);
                self.index
                    .insert_unique(h, id, |&j| hasher.hash_one(keys[j as usize]));
            }
            return Ok(());
        }
        // Growing: toward the full size, which holds every id (a doubling from below it stays
        // within it).
        let (len, max) = (self.index.len(), self.max as usize);
        let want = (inserts as usize).min(max.saturating_sub(len));
        self.index
            .try_reserve(want, |&j| hasher.hash_one(keys[j as usize]))
            .map_err(|_| AllocError)
    }

    /// The hash the index files `key` under.
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The id among those `ids` accepts that holds `key`, if any.
    #[inline]
    pub(crate) fn find_in(&self, key: &K, ids: impl Fn(u32) -> bool) -> Option<u32> {
        self.find_in_hashed(key, self.hash(key), ids)
    }

    /// [`find_in`](Self::find_in) for a key whose [`hash`](Self::hash) `h` the caller has.
    #[inline]
    pub(crate) fn find_in_hashed(&self, key: &K, h: u64, ids: impl Fn(u32) -> bool) -> Option<u32> {
        let keys = &self.keys;
        self.index
            .find(h, |&i| ids(i) && keys[i as usize] == *key)
            .copied()
    }

    /// The key of id `id` (held, or once held).
    #[inline]
    pub(crate) fn key(&self, id: u32) -> K {
        self.keys[id as usize]
    }

    /// The key array, indexed by id (ids never used lie beyond its end).
    #[inline]
    pub(crate) fn keys(&self) -> &[K] {
        &self.keys
    }

    /// Gives `key` (not held) the id `id` (below the table's size, holding no key).
    #[cfg(test)]
    pub(crate) fn insert_at(&mut self, id: u32, key: K) {
        self.insert_at_hashed(id, key, self.hash(&key));
    }

    /// Gives `key` (not held), whose [`hash`](Self::hash) `h` the caller has, the id `id`
    /// (below the table's size, holding no key).
    #[inline]
    pub(crate) fn insert_at_hashed(&mut self, id: u32, key: K, h: u64) {
        put(&mut self.keys, id as usize, key);
        let keys = &self.keys;
        let hasher = self.hasher;
        self.index
            .insert_unique(h, id, |&j| hasher.hash_one(keys[j as usize]));
    }

    /// Files the key of id `from` (which holds one) under id `to` instead, writing it at `to`
    /// in the key array: one probe, and the index entry is rewritten in place, so no tombstone
    /// is left and no room is used (an ARC victim becoming a ghost). `false`, and nothing
    /// changed, when `from` holds no key.
    #[inline]
    pub(crate) fn relabel(&mut self, from: u32, to: u32) -> bool {
        let key = self.keys[from as usize];
        self.relabel_hashed(from, to, key, self.hasher.hash_one(key))
    }

    /// [`relabel`](Self::relabel) when `from` holds `key`, whose [`hash`](Self::hash) `h` the
    /// caller has; `false`, and nothing changed, when `from` does not hold `key` (any more).
    #[inline]
    pub(crate) fn relabel_hashed(&mut self, from: u32, to: u32, key: K, h: u64) -> bool {
        if self.keys.get(from as usize) != Some(&key) {
            return false;
        }
        match self.index.find_mut(h, |&j| j == from) {
            Some(id) => {
                *id = to;
                put(&mut self.keys, to as usize, key);
                true
            }
            None => false,
        }
    }

    /// Forgets the key of id `id` (which holds one).
    #[inline]
    pub(crate) fn remove(&mut self, id: u32) {
        let h = self.hasher.hash_one(self.keys[id as usize]);
        if let Ok(e) = self.index.find_entry(h, |&j| j == id) {
            e.remove();
        }
    }

    /// Forgets `key` held by an id that `ids` accepts and returns that id; `None` when no
    /// such id holds it.
    #[inline]
    pub(crate) fn remove_key_in(&mut self, key: &K, ids: impl Fn(u32) -> bool) -> Option<u32> {
        let keys = &self.keys;
        let entry = self
            .index
            .find_entry(self.hasher.hash_one(key), |&j| {
                ids(j) && keys[j as usize] == *key
            })
            .ok()?;
        Some(entry.remove().0)
    }

    /// Forgets every key (the key array keeps its contents, unreachable).
    pub(crate) fn clear(&mut self) {
        self.index.clear();
    }

    /// Passes every key held by an id that `ids` accepts to `f`, in no particular order.
    pub(crate) fn for_each_key_in(&self, ids: impl Fn(u32) -> bool, mut f: impl FnMut(&K)) {
        for &id in &self.index {
            if ids(id) {
                f(&self.keys[id as usize]);
            }
        }
    }

    /// Keys held by ids that `ids` accepts (a walk over the whole index).
    pub(crate) fn count_in(&self, ids: impl Fn(u32) -> bool) -> usize {
        self.index.iter().filter(|&&id| ids(id)).count()
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * core::mem::size_of::<K>() + self.index.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_the_ids_given_and_back() {
        let all = |_| true;
        let mut t = KeyTable::<u64>::new(4, FixedState::default(), false).unwrap();
        t.insert_at(3, 30);
        t.insert_at(0, 10);
        assert_eq!(
            (
                t.find_in(&30, all),
                t.find_in(&10, all),
                t.find_in(&20, all)
            ),
            (Some(3), Some(0), None)
        );
        assert_eq!((t.key(3), t.keys().len(), t.count_in(all)), (30, 4, 2));
        t.remove(3);
        assert_eq!(
            (
                t.find_in(&30, all),
                t.remove_key_in(&10, all),
                t.remove_key_in(&10, all)
            ),
            (None, Some(0), None)
        );
        t.insert_at(1, 30);
        assert_eq!(t.find_in(&30, all), Some(1));
        let mut seen = alloc::vec::Vec::new();
        t.for_each_key_in(all, |k| seen.push(*k));
        assert_eq!(seen, [30]);
        t.clear();
        assert_eq!((t.count_in(all), t.find_in(&30, all)), (0, None));
        assert_eq!(t.heap_bytes() as u64, KeyTable::<u64>::bytes(4));
    }

    #[test]
    fn lookups_see_only_the_ids_they_name() {
        // One key held twice, by a low and a high id (the table allows it; the manager no
        // longer does it, as its ARC hands index entries over): each side finds, removes and
        // walks its own.
        let (low, high) = (|i: u32| i < 2, |i: u32| i >= 2);
        let mut t = KeyTable::<u64>::new(4, FixedState::default(), false).unwrap();
        t.insert_at(1, 7);
        t.insert_at(3, 7);
        t.insert_at(2, 8);
        assert_eq!(
            (t.find_in(&7, low), t.find_in(&7, high)),
            (Some(1), Some(3))
        );
        assert_eq!(
            (t.find_in(&8, low), t.count_in(low), t.count_in(high)),
            (None, 1, 2)
        );
        let mut seen = alloc::vec::Vec::new();
        t.for_each_key_in(high, |k| seen.push(*k));
        seen.sort_unstable();
        assert_eq!(seen, [7, 8]);
        assert_eq!(t.remove_key_in(&7, high), Some(3));
        assert_eq!((t.find_in(&7, high), t.find_in(&7, low)), (None, Some(1)));
    }

    #[test]
    fn a_relabelled_key_moves_to_its_new_id_in_one_entry() {
        let (low, high, all) = (|i: u32| i < 2, |i: u32| i >= 2, |_| true);
        let mut t = KeyTable::<u64>::new(4, FixedState::default(), false).unwrap();
        t.insert_at(1, 7);
        t.insert_at(0, 8);
        assert!(t.relabel(1, 3));
        assert_eq!(
            (t.find_in(&7, high), t.find_in(&7, low), t.key(3)),
            (Some(3), None, 7)
        );
        assert_eq!((t.count_in(all), t.find_in(&8, low)), (2, Some(0)));
        // Id 1 holds no key any more, id 3 does not hold 8: nothing to move, nothing changes.
        assert!(!t.relabel(1, 2));
        assert!(!t.relabel_hashed(3, 2, 8, t.hash(&8)));
        assert_eq!((t.count_in(all), t.find_in(&7, all)), (2, Some(3)));
        t.remove(3);
        assert_eq!((t.find_in(&7, all), t.count_in(all)), (None, 1));
    }
}
