//! The chunk table: which key holds which slot (a [`KeyPool`] whose ids are the slots, in vLLM's
//! slot order) and each chunk's reference count.

use super::key_pool::KeyPool;
use crate::hashing::FixedState;
use crate::key::OffloadKey;
use crate::reserve::{AllocError, Lazy};

/// `ref_cnt` of a slot that holds no key.
pub(crate) const ABSENT: i32 = i32::MIN;
/// `ref_cnt` of a chunk whose store has not completed (vLLM's −1).
pub(crate) const PENDING: i32 = -1;
/// `ref_cnt` of an idle chunk that the store call under way offers: not evictable by that call,
/// and back to 0 before the call returns.
pub(crate) const PROTECTED: i32 = -2;

/// Slot-indexed chunk state plus the key → slot index.
#[derive(Clone, Debug)]
pub(crate) struct Chunks<K> {
    /// The resident keys; a key's id is its slot. Under ARC its table also holds the ghost
    /// keys, at the ids past the slots.
    pub(crate) pool: KeyPool<K>,
    /// −1 pending, 0 idle (evictable), k > 0 pinned by k loads, `ABSENT` when free
    /// (`PROTECTED` only inside a store call).
    ref_cnt: Lazy<i32>,
}

impl<K: OffloadKey> Chunks<K> {
    /// `capacity` slots, all free, in a key table with room for `ghosts` more keys.
    pub(crate) fn new(
        capacity: u32,
        ghosts: u32,
        hasher: FixedState,
        grow: bool,
    ) -> Result<Self, AllocError> {
        let n = capacity as usize;
        Ok(Chunks {
            pool: KeyPool::new(capacity, ghosts, hasher, grow)?,
            ref_cnt: Lazy::new(n, ABSENT)?,
        })
    }

    /// The bytes [`Chunks::new`] allocates for `capacity` slots and `ghosts` ghost keys.
    pub(crate) fn bytes(capacity: u64, ghosts: u64) -> u64 {
        KeyPool::<K>::bytes(capacity, ghosts).saturating_add(Lazy::<i32>::bytes(capacity))
    }

    /// The slot holding `key`, if any.
    #[inline]
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        self.pool.find(key)
    }

    /// The key table id holding `key`, whose [`hash`](Self::hash) is `h`, if any: its slot
    /// when resident (below the capacity), else its ARC ghost's id.
    #[inline]
    pub(crate) fn find_any_hashed(&self, key: &K, h: u64) -> Option<u32> {
        self.pool.table().find_in_hashed(key, h, |_| true)
    }

    /// The hash the index files `key` under (the manager's hasher).
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.pool.table().hash(key)
    }

    /// The slot of `key`, trying the hint `slot` first (a slot that still holds `key`).
    #[inline(always)]
    pub(crate) fn find_hinted(&self, key: &K, slot: u32) -> Option<u32> {
        match self.pool.keys().get(slot as usize) {
            Some(k) if k == key && self.ref_cnt(slot) != ABSENT => Some(slot),
            _ => self.find(key),
        }
    }

    #[inline]
    pub(crate) fn key(&self, slot: u32) -> K {
        self.pool.key(slot)
    }

    /// Keys by slot (slots never used lie beyond the end).
    #[inline]
    pub(crate) fn keys(&self) -> &[K] {
        self.pool.keys()
    }

    #[inline]
    pub(crate) fn ref_cnt(&self, slot: u32) -> i32 {
        self.ref_cnt.get(slot as usize)
    }

    /// Reference counts by slot, as far as written (every resident slot is).
    #[inline]
    pub(crate) fn ref_cnts(&self) -> &[i32] {
        self.ref_cnt.written()
    }

    #[inline]
    pub(crate) fn set_ref_cnt(&mut self, slot: u32, v: i32) {
        self.ref_cnt.set(slot as usize, v);
    }

    /// Marks the idle chunks `slots` (distinct) [`PROTECTED`] from eviction, until
    /// [`unprotect`](Self::unprotect) with the same slots.
    #[inline]
    pub(crate) fn protect(&mut self, slots: &[u32]) {
        for &s in slots {
            if self.ref_cnt(s) == 0 {
                self.set_ref_cnt(s, PROTECTED);
            }
        }
    }

    /// Makes the [`PROTECTED`] chunks among `slots` idle again.
    #[inline]
    pub(crate) fn unprotect(&mut self, slots: &[u32]) {
        for &s in slots {
            if self.ref_cnt(s) == PROTECTED {
                self.set_ref_cnt(s, 0);
            }
        }
    }

    /// Gives `key` (not resident), whose [`hash`](Self::hash) is `h`, the next free slot,
    /// pending; `None` when no slot is free.
    #[inline]
    pub(crate) fn insert_hashed(&mut self, key: K, h: u64) -> Option<u32> {
        let slot = self.pool.insert_hashed(key, h)?;
        self.ref_cnt.set(slot as usize, PENDING);
        Some(slot)
    }

    /// [`insert_hashed`](Self::insert_hashed) of a key that was the ARC ghost of key table id
    /// `ghost`: the ghost's index entry becomes the slot's if the ghost still holds `key`.
    /// Returns the slot and whether it did.
    #[inline]
    pub(crate) fn insert_from_ghost(&mut self, key: K, h: u64, ghost: u32) -> Option<(u32, bool)> {
        let (slot, moved) = self.pool.insert_from(key, h, ghost)?;
        self.ref_cnt.set(slot as usize, PENDING);
        Some((slot, moved))
    }

    /// Removes `slot`'s key from the index and returns the slot to the pool.
    pub(crate) fn remove(&mut self, slot: u32) {
        self.pool.remove(slot);
        self.ref_cnt.set(slot as usize, ABSENT);
    }

    /// Returns `slot` to the pool when its key's index entry has already been given to
    /// another id ([`KeyTable::relabel`](super::key_table::KeyTable::relabel): an ARC victim's
    /// entry becomes its ghost's).
    pub(crate) fn release(&mut self, slot: u32) {
        self.pool.release(slot);
        self.ref_cnt.set(slot as usize, ABSENT);
    }

    /// Forgets every chunk; slot ids restart at 0.
    pub(crate) fn clear(&mut self) {
        self.pool.clear();
        self.ref_cnt.clear();
    }

    /// The number of resident keys.
    pub(crate) fn len(&self) -> usize {
        self.pool.indexed()
    }

    /// Passes every resident key to `f`, in no particular order.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        self.pool.for_each_key(&mut f);
    }

    /// Bytes of heap held (for memory accounting).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.pool.heap_bytes() + self.ref_cnt.heap_bytes()
    }
}
