//! vLLM's offload keys (bytes of any length) as compact manager keys.
//!
//! An [`Interner`] gives every distinct byte string a dense `u32` id while the manager may
//! still hold it, so identity is exact: two keys are equal exactly when their bytes are. It
//! keeps no copy of the bytes: each id's value (the binding's first Python object for the key)
//! is what a probe is compared with. The
//! manager key [`VKey`] carries the id plus the first 16 bytes and the last 4 (the KV group),
//! which order keys as vLLM's byte comparison does wherever the manager needs an order (ties
//! of equal LRU rank).
//!
//! Callers that can name a probe by identity (the binding: a Python object's address) also
//! get a direct-mapped cache, identity → id ([`Interner::recall`], [`Interner::remember`]),
//! whose entries are checked against the id's live value, so a stale entry is only a miss. It
//! is sized with the interner (at each sweep, [`RECENT_PER_ID`] entries per id the interner may
//! hold before its next one), so that the keys a large manager holds do not crowd each other
//! out of a cache made for a small one.
//!
//! Ids are recycled by [`Interner::sweep`]: every id the manager no longer holds
//! ([`OffloadManager::for_each_held_key`](kvtier_core::manager::OffloadManager::for_each_held_key))
//! is freed. A sweep runs when the interner has doubled since the last one, so memory stays
//! within twice what the manager holds, at amortised O(1) per new key.

use core::hash::{Hash, Hasher};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use kvtier_core::OffloadKey;

/// The id no interned key ever gets: stands for a key the manager cannot hold.
const ABSENT_ID: u32 = u32::MAX;

/// The fewest live ids at which a sweep runs.
const MIN_SWEEP: usize = 4096;

/// Identity-cache entries per id the interner may hold before its next sweep (rounded up to a
/// power of two). With 4,096 entries in all, a small-b replay (4,096 chunks, up to about 17,000
/// live ids under ARC) missed a third of its recalls; with 2 per id, 7 %.
const RECENT_PER_ID: usize = 4;

/// The most identity-cache entries (16 MiB).
const MAX_RECENT: usize = 1 << 22;

/// A vLLM key as the manager sees it: its interned id plus the bytes that order it.
///
/// Equality is the id's (the other fields follow from it). The order is `(head, group, id)`:
/// vLLM's byte order whenever two keys differ in their first 16 bytes, or have equal length
/// ≤ 20, or differ only in their last 4 bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VKey {
    /// Bytes 0..16 of the key, big-endian, zero-padded.
    head: u128,
    /// The last 4 bytes, big-endian (vLLM's `get_offload_group_idx`).
    group: u32,
    /// The interned id.
    id: u32,
}

impl VKey {
    /// The key for `bytes` under id `id`.
    fn new(bytes: &[u8], id: u32) -> Self {
        let head = match bytes.first_chunk::<16>() {
            Some(h) => u128::from_be_bytes(*h),
            None => {
                let mut head = [0u8; 16];
                head[..bytes.len()].copy_from_slice(bytes);
                u128::from_be_bytes(head)
            }
        };
        let group = match bytes.last_chunk::<4>() {
            Some(t) => u32::from_be_bytes(*t),
            None => bytes.iter().fold(0u32, |acc, &b| (acc << 8) | u32::from(b)),
        };
        VKey { head, group, id }
    }

    /// A key that is never held (for keys the interner does not know).
    #[must_use]
    pub(crate) fn absent() -> Self {
        VKey {
            head: 0,
            group: 0,
            id: ABSENT_ID,
        }
    }

    /// Whether this is the key that is never held.
    #[must_use]
    pub(crate) fn is_absent(&self) -> bool {
        self.id == ABSENT_ID
    }

    /// The interned id (dense: below the number of ids ever live at once).
    #[must_use]
    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

impl PartialEq for VKey {
    /// The ids' equality: one id is one key, so the other fields are equal too.
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for VKey {}

impl PartialOrd for VKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for VKey {
    #[inline]
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (self.head, self.group, self.id).cmp(&(other.head, other.group, other.id))
    }
}

impl Hash for VKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.id);
    }
}

impl OffloadKey for VKey {
    #[inline]
    fn group(&self) -> u32 {
        self.group
    }
}

#[derive(Debug)]
struct Slot<V> {
    hash: u64,
    key: VKey,
    value: Option<V>,
}

/// Byte strings ↔ dense ids, each id carrying a value `V` that holds the key's bytes (the
/// binding keeps the first Python object seen for the key, so outputs return vLLM's own key
/// objects). Lookups take the probe's hash and an equality test against a live value.
#[derive(Debug)]
pub(crate) struct Interner<V> {
    index: HashTable<u32>,
    slots: Vec<Slot<V>>,
    free: Vec<u32>,
    next_sweep: usize,
    marks: Vec<u64>,
    /// The identity cache: the id last remembered for identities of each bucket.
    /// INVARIANT: its length is a power of two, `1 << (64 - recent_shift)`.
    recent: Box<[u32]>,
    /// 64 − log2 of the identity cache's length: the shift that takes a bucket from the
    /// top bits of a product.
    recent_shift: u32,
}

impl<V> Default for Interner<V> {
    fn default() -> Self {
        let mut interner = Interner {
            // Room for the keys of the first sweep period: no rehash while it fills.
            index: HashTable::with_capacity(MIN_SWEEP),
            slots: Vec::with_capacity(MIN_SWEEP),
            free: Vec::new(),
            next_sweep: MIN_SWEEP,
            marks: Vec::new(),
            recent: Box::default(),
            recent_shift: 0,
        };
        interner.size_recent_for(MIN_SWEEP);
        interner
    }
}

/// Why a key could not be interned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum InternError {
    /// 2^32 − 1 keys are live at once.
    Full,
}

impl core::fmt::Display for InternError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("too many distinct offload keys held at once (2^32 - 1)")
    }
}

impl core::error::Error for InternError {}

impl<V> Interner<V> {
    /// The key whose value `is_key` accepts among those of hash `hash`, if interned
    /// (`is_key` sees only values of that very hash).
    #[inline]
    #[must_use]
    pub(crate) fn find(&self, hash: u64, is_key: impl Fn(&V) -> bool) -> Option<VKey> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| {
                let slot = &slots[i as usize];
                slot.hash == hash && slot.value.as_ref().is_some_and(&is_key)
            })
            .map(|&i| slots[i as usize].key)
    }

    /// The key of `bytes` (whose hash is `hash` and which `is_key` accepts), interning it
    /// with the value `make()` if it is new. `make()` must hold `bytes` as `is_key` reads them.
    ///
    /// # Errors
    /// [`InternError::Full`] when 2^32 − 1 ids are live.
    pub(crate) fn intern(
        &mut self,
        hash: u64,
        bytes: &[u8],
        is_key: impl Fn(&V) -> bool,
        make: impl FnOnce() -> V,
    ) -> Result<VKey, InternError> {
        let slots = &self.slots;
        let entry = self.index.entry(
            hash,
            |&i| slots[i as usize].value.as_ref().is_some_and(&is_key),
            |&i| slots[i as usize].hash,
        );
        let vacant = match entry {
            Entry::Occupied(e) => return Ok(self.slots[*e.get() as usize].key),
            Entry::Vacant(v) => v,
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&id| id != ABSENT_ID)
                    .ok_or(InternError::Full)?;
                self.slots.push(Slot {
                    hash: 0,
                    key: VKey::absent(),
                    value: None,
                });
                id
            }
        };
        let key = VKey::new(bytes, id);
        self.slots[id as usize] = Slot {
            hash,
            key,
            value: Some(make()),
        };
        vacant.insert(id);
        Ok(key)
    }

    /// Sizes the identity cache for `ids` ids, emptying it if its size changes. Returns
    /// whether it did.
    fn size_recent_for(&mut self, ids: usize) -> bool {
        let len = ids
            .saturating_mul(RECENT_PER_ID)
            .next_power_of_two()
            .clamp(2, MAX_RECENT);
        if len != self.recent.len() {
            self.recent = vec![ABSENT_ID; len].into_boxed_slice();
            self.recent_shift = 64 - len.trailing_zeros();
            return true;
        }
        false
    }

    /// The identity cache's bucket of `ident`.
    #[inline]
    fn bucket(&self, ident: usize) -> usize {
        // Fibonacci hashing: the top bits of the product spread aligned addresses evenly.
        let h = (ident as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        usize::try_from(h >> self.recent_shift).unwrap_or(0)
    }

    /// The key last remembered for `ident`, if its id is live and `is_it` accepts its value
    /// (the check that makes a stale entry a miss).
    #[inline]
    #[must_use]
    pub(crate) fn recall(&self, ident: usize, is_it: impl Fn(&V) -> bool) -> Option<VKey> {
        let id = self.recent[self.bucket(ident)];
        let slot = self.slots.get(id as usize)?;
        slot.value.as_ref().filter(|v| is_it(v)).map(|_| slot.key)
    }

    /// Remembers `key` (a live key) for `ident`, replacing the bucket's previous entry.
    #[inline]
    pub(crate) fn remember(&mut self, ident: usize, key: VKey) {
        let bucket = self.bucket(ident);
        self.recent[bucket] = key.id;
    }

    /// The value of a live key.
    #[must_use]
    pub(crate) fn value(&self, key: &VKey) -> Option<&V> {
        self.slots.get(key.id as usize)?.value.as_ref()
    }

    /// The key of a live id (`None` when the id is free).
    #[must_use]
    pub(crate) fn key_of(&self, id: u32) -> Option<VKey> {
        let slot = self.slots.get(id as usize)?;
        slot.value.as_ref().map(|_| slot.key)
    }

    /// Every live key with its value, in id order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (VKey, &V)> {
        self.slots
            .iter()
            .filter_map(|s| s.value.as_ref().map(|v| (s.key, v)))
    }

    /// Live ids.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no id is live.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether enough keys were interned since the last sweep for another to pay off.
    #[must_use]
    pub(crate) fn sweep_due(&self) -> bool {
        self.len() >= self.next_sweep
    }

    /// Frees every id that `held` does not pass (`held` receives a callback to call with
    /// each key still held), and resizes the identity cache for the interner's new bound,
    /// where each live key is then remembered under its value's identity `ident`. Returns
    /// the number of ids freed.
    pub(crate) fn sweep(
        &mut self,
        held: impl FnOnce(&mut dyn FnMut(&VKey)),
        ident: impl Fn(&V) -> usize,
    ) -> usize {
        self.marks.clear();
        self.marks.resize(self.slots.len().div_ceil(64), 0);
        let marks = &mut self.marks;
        held(&mut |k: &VKey| {
            let i = k.id as usize;
            if let Some(w) = marks.get_mut(i / 64) {
                *w |= 1 << (i % 64);
            }
        });
        let marks = &self.marks;
        let marked = |i: usize| marks.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
        // The index holds exactly the live ids: one pass over it drops the unmarked ones
        // (no probe per id), then the slots free them in id order.
        self.index.retain(|&mut id| marked(id as usize));
        let mut freed = 0;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if marked(i) || slot.value.is_none() {
                continue;
            }
            let id = slot.key.id;
            slot.value = None;
            slot.key = VKey::absent();
            self.free.push(id);
            freed += 1;
        }
        self.next_sweep = MIN_SWEEP.max(2 * self.len());
        if self.size_recent_for(self.next_sweep) {
            for slot in &self.slots {
                if let Some(v) = &slot.value {
                    let bucket = self.bucket(ident(v));
                    self.recent[bucket] = slot.key.id;
                }
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value holding its key's bytes, with a tag telling interned values apart.
    type Val = (Vec<u8>, u32);

    fn h(b: &[u8]) -> u64 {
        // Any function of the bytes will do; a weak one exercises the collision path.
        b.iter().map(|&x| u64::from(x)).sum()
    }

    fn intern(it: &mut Interner<Val>, b: &[u8], tag: u32) -> VKey {
        it.intern(h(b), b, |v| v.0 == b, || (b.to_vec(), tag))
            .unwrap()
    }

    fn find(it: &Interner<Val>, b: &[u8]) -> Option<VKey> {
        it.find(h(b), |v| v.0 == b)
    }

    #[test]
    fn equal_bytes_share_an_id_and_distinct_bytes_do_not() {
        let mut it = Interner::default();
        // Equal weak hashes, equal first 16 bytes and group, different middle bytes.
        let a = [[7u8; 16].as_slice(), &[1, 2], &[0, 0, 0, 3]].concat();
        let b = [[7u8; 16].as_slice(), &[2, 1], &[0, 0, 0, 3]].concat();
        let ka = intern(&mut it, &a, 1);
        let kb = intern(&mut it, &b, 2);
        assert_ne!(ka, kb);
        assert_eq!(intern(&mut it, &a, 3), ka);
        assert_eq!(it.value(&ka), Some(&(a.clone(), 1)));
        assert_eq!(it.value(&kb), Some(&(b.clone(), 2)));
        assert_eq!(find(&it, &b), Some(kb));
        assert_eq!(it.len(), 2);
        assert_eq!(ka.group(), 3);
    }

    #[test]
    fn order_is_byte_order_where_documented() {
        let mut it = Interner::default();
        let mut key = |b: &[u8]| intern(&mut it, b, 0);
        // Differ in the first 16 bytes.
        let lo = key(&[1, 0xff, 0, 0, 0, 9]);
        let hi = key(&[2, 0, 0, 0, 0, 0]);
        assert!(lo < hi);
        // Same hash part, different group (vLLM's keys of two KV groups).
        let hash = [5u8; 32];
        let g1 = key(&[hash.as_slice(), &1u32.to_be_bytes()].concat());
        let g0 = key(&[hash.as_slice(), &0u32.to_be_bytes()].concat());
        assert!(g0 < g1);
        // Equal length up to 20 bytes: fully ordered by the bytes.
        let x = key(&[[9u8; 16].as_slice(), &[0, 1, 0xff]].concat());
        let y = key(&[[9u8; 16].as_slice(), &[0, 2, 0]].concat());
        assert!(x < y);
    }

    #[test]
    fn sweep_frees_only_what_is_not_held_and_recycles_ids() {
        let mut it = Interner::default();
        let keys: Vec<VKey> = (0u32..10)
            .map(|i| intern(&mut it, &i.to_be_bytes(), i))
            .collect();
        let held = [keys[2], keys[7]];
        let freed = it.sweep(|f| held.iter().for_each(f), |_| 0);
        assert_eq!(freed, 8);
        assert_eq!(it.len(), 2);
        assert_eq!(it.value(&keys[7]), Some(&(7u32.to_be_bytes().to_vec(), 7)));
        assert_eq!(it.value(&keys[3]), None);
        assert_eq!(find(&it, &3u32.to_be_bytes()), None);
        // A new key takes a freed id; the held ones keep theirs.
        let n = intern(&mut it, b"new", 99);
        assert!(n.id() < 10 && n.id() != 2 && n.id() != 7);
        assert_eq!(find(&it, &7u32.to_be_bytes()), Some(keys[7]));
    }

    #[test]
    fn the_identity_cache_answers_only_for_the_live_value_it_names() {
        let mut it = Interner::default();
        let a = intern(&mut it, b"a", 1);
        let b = intern(&mut it, b"b", 2);
        assert_eq!(it.recall(7, |_| true), None);
        it.remember(7, a);
        assert_eq!(it.recall(7, |v| v.1 == 1), Some(a));
        // The entry names a's id: a value check that rejects it is a miss.
        assert_eq!(it.recall(7, |v| v.1 == 2), None);
        it.remember(7, b);
        assert_eq!(it.recall(7, |v| v.1 == 2), Some(b));
        // Once the id is freed, the entry is stale: a miss whatever the check.
        it.sweep(|_| {}, |_| 0);
        assert_eq!(it.recall(7, |_| true), None);
        // A new key reusing the id is found only if the check accepts its value.
        let c = intern(&mut it, b"c", 3);
        assert_eq!(c.id(), b.id());
        assert_eq!(it.recall(7, |v| v.1 == 2), None);
        assert_eq!(it.recall(7, |v| v.1 == 3), Some(c));
    }

    #[test]
    fn a_resized_identity_cache_still_recalls_the_live_keys() {
        let mut it = Interner::default();
        let small = it.recent.len();
        // Tags stand for identities: each value is remembered under its tag.
        let n = u32::try_from(3 * MIN_SWEEP).unwrap_or(u32::MAX);
        let keys: Vec<VKey> = (0..n)
            .map(|i| intern(&mut it, &i.to_be_bytes(), i))
            .collect();
        let tag = |v: &Val| v.1 as usize;
        it.sweep(|f| keys.iter().for_each(f), tag);
        assert!(it.recent.len() > small);
        assert_eq!(it.recent.len(), 1 << (64 - it.recent_shift));
        // Every live key is remembered under its identity, as far as buckets allow.
        let recalled = (0..keys.len())
            .filter(|&i| it.recall(i, |v| v.1 as usize == i) == Some(keys[i]))
            .count();
        assert!(recalled > keys.len() / 2, "{recalled} of {}", keys.len());
        // Once the interner shrinks, so does the cache, and nothing stale is recalled.
        it.sweep(|_| {}, tag);
        assert_eq!(it.recent.len(), small);
        assert!((0..keys.len()).all(|i| it.recall(i, |_| true).is_none()));
    }

    #[test]
    fn sweeps_become_due_as_the_interner_doubles() {
        let mut it: Interner<Val> = Interner::default();
        for i in 0..MIN_SWEEP as u64 - 1 {
            let b = i.to_le_bytes();
            it.intern(i, &b, |v| v.0 == b, || (b.to_vec(), 0)).unwrap();
        }
        assert!(!it.sweep_due());
        intern(&mut it, b"x", 0);
        assert!(it.sweep_due());
        it.sweep(|_| {}, |_| 0);
        assert!(it.is_empty() && !it.sweep_due());
    }
}
