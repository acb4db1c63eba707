//! Per-request state: the keys a request observed, in order, with their end-token positions and
//! whether the request inserted or reused them (vLLM's `_RequestCacheAccess`), held in a fixed
//! pool of request slots addressed by generation-checked [`RequestId`]s.

use alloc::vec::Vec;
use core::fmt;
use core::hash::BuildHasher;

use super::entry_index::EntryIndex;
use crate::hashing::FixedState;
use crate::key::OffloadKey;
use crate::reserve::{AllocError, array_bytes, with_capacity};

/// A handle to a request's state in an [`OffloadManager`](super::OffloadManager), from
/// [`on_new_request`](super::OffloadManager::on_new_request). It goes stale when the request
/// finishes or is dropped: using it afterwards is an error, never another request's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId {
    index: u32,
    generation: u32,
}

impl RequestId {
    /// The handle as one `u64` (generation in the high half), for passing across an FFI or a
    /// process boundary.
    #[must_use]
    pub fn to_u64(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The inverse of [`RequestId::to_u64`]. Any value is accepted; a value that names no live
    /// request is reported as unknown when used.
    #[must_use]
    pub fn from_u64(v: u64) -> Self {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "splitting a u64 into halves"
        )]
        RequestId {
            index: v as u32,
            generation: (v >> 32) as u32,
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}v{}", self.index, self.generation)
    }
}

/// The request observed the key (it is part of the request's key order).
pub(crate) const SEEN: u8 = 1;
/// The request inserted the key (its store was allocated).
pub(crate) const INSERTED: u8 = 2;
/// The request reused the key (loaded it, or offered it while ready) without inserting it.
pub(crate) const REUSED: u8 = 4;
/// The key was reported to the policy as a store miss for this request.
pub(crate) const STORE_MISS: u8 = 8;

/// [`Entry`]'s position when it has none.
const NO_POS: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry<K> {
    pub(crate) key: K,
    /// The end-token position, [`NO_POS`] for none (positions are at most `i64::MAX`).
    pos: u64,
    /// Observation order among seen keys.
    pub(crate) seq: u32,
    pub(crate) flags: u8,
    /// The last store call that offered the key (duplicate detection).
    pub(crate) offer: u64,
    /// The slot the key was last seen in (a hint: valid only while that slot still holds
    /// the key; `u32::MAX` when unknown).
    pub(crate) slot: u32,
}

impl<K> Entry<K> {
    /// The end-token position, if the request gave one.
    #[inline(always)]
    pub(crate) fn pos(&self) -> Option<u64> {
        (self.pos != NO_POS).then_some(self.pos)
    }
}

/// A request's place in the LRU policy's order (see the `lru` module), kept in the request's
/// own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestRank {
    /// The request's major value; 0 means none allocated.
    pub(crate) major: u64,
    /// The policy generation the major belongs to.
    pub(crate) generation: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct RequestState<K> {
    generation: u32,
    live: bool,
    pub(crate) cache_gen: u64,
    pub(crate) entries: Vec<Entry<K>>,
    index: EntryIndex,
    /// The seen entries in observation order (`entries[observed[i]].seq == i`).
    pub(crate) observed: Vec<u32>,
    /// Whether every seen entry has a position and `observed` is already in the order a
    /// finished request commits: (position, group, observation order).
    pub(crate) in_order: bool,
    /// `(position, group)` of the last entry observed while `in_order` holds (`(0, 0)`, which
    /// orders before every key, while none is): a new entry is in order if it is not below.
    last_seen: (u64, u32),
    pub(crate) rank: RequestRank,
    /// Chunks the LRU left displaced on this request's accesses and stores (see the `lru`
    /// module); some may have been placed, refreshed, removed or displaced again since.
    pub(crate) displaced: Vec<u32>,
}

impl<K: OffloadKey> RequestState<K> {
    fn new() -> Self {
        RequestState {
            generation: 0,
            live: false,
            cache_gen: 0,
            entries: Vec::new(),
            index: EntryIndex::default(),
            observed: Vec::new(),
            in_order: true,
            last_seen: (0, 0),
            rank: RequestRank::default(),
            displaced: Vec::new(),
        }
    }

    /// Forgets every key (keeps the allocations for reuse).
    pub(crate) fn clear(&mut self, hasher: FixedState) {
        let entries = &self.entries;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "keys per request stay far below 2^32"
        )]
        self.index.clear(entries.len() as u32, |j| {
            hasher.hash_one(entries[j as usize].key)
        });
        self.entries.clear();
        self.observed.clear();
        self.in_order = true;
        self.last_seen = (0, 0);
        self.rank = RequestRank::default();
        self.displaced.clear();
    }

    /// Forgets what the request observed (a cache reset) but keeps the end-token positions,
    /// which belong to the request itself (vLLM keeps them on the request context).
    pub(crate) fn reset_access(&mut self) {
        for e in &mut self.entries {
            e.flags = 0;
            e.seq = u32::MAX;
        }
        self.observed.clear();
        self.in_order = true;
        self.last_seen = (0, 0);
        self.rank = RequestRank::default();
        self.displaced.clear();
    }

    /// The entry index of `key`, creating an unseen entry if needed (one probe of the index
    /// either way).
    pub(crate) fn entry(&mut self, key: K, hasher: FixedState) -> u32 {
        self.entry_hashed(key, hasher.hash_one(key), hasher)
    }

    /// [`entry`](Self::entry) for a key whose hash `h` (by `hasher`) the caller has.
    #[inline]
    pub(crate) fn entry_hashed(&mut self, key: K, h: u64, hasher: FixedState) -> u32 {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "keys per request stay far below 2^32"
        )]
        let i = self.entries.len() as u32;
        let entries = &self.entries;
        if let Some(e) = self.index.find_or_insert(
            h,
            i,
            |j| entries[j as usize].key == key,
            |j| hasher.hash_one(entries[j as usize].key),
        ) {
            return e;
        }
        self.entries.push(Entry {
            key,
            pos: NO_POS,
            seq: u32::MAX,
            flags: 0,
            offer: 0,
            slot: u32::MAX,
        });
        i
    }

    /// Sets entry `i`'s end-token position, one that `check_positions` accepted (at most
    /// `i64::MAX`, so never [`NO_POS`]). Moving a seen entry may break the commit order of
    /// `observed`, so it is no longer trusted to be in order.
    #[inline(always)]
    pub(crate) fn set_pos(&mut self, i: u32, pos: u64) {
        let e = &mut self.entries[i as usize];
        if e.pos != pos {
            if e.flags & SEEN != 0 {
                self.in_order = false;
            }
            e.pos = pos;
        }
    }

    /// Marks entry `i` seen (if new) and returns whether it was new.
    #[inline(always)]
    pub(crate) fn observe(&mut self, i: u32) -> bool {
        let e = &self.entries[i as usize];
        if e.flags & SEEN != 0 {
            return false;
        }
        if self.in_order {
            match e.pos().map(|p| (p, e.key.group())) {
                Some(at) if self.last_seen <= at => self.last_seen = at,
                _ => self.in_order = false,
            }
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "keys per request stay far below 2^32"
        )]
        let seq = self.observed.len() as u32;
        let e = &mut self.entries[i as usize];
        e.flags |= SEEN;
        e.seq = seq;
        self.observed.push(i);
        true
    }
}

/// Why a request handle could not be used or created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The handle names no live request (finished, dropped, or from another manager).
    Unknown(RequestId),
    /// Every request slot is in use (`ManagerConfig::max_requests`).
    TooManyRequests {
        /// The configured limit.
        max_requests: u32,
    },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Unknown(id) => {
                write!(
                    f,
                    "{id} is not a live request (finished, dropped or never created)"
                )
            }
            RequestError::TooManyRequests { max_requests } => write!(
                f,
                "all {max_requests} request slots are in use; finish or drop a request first"
            ),
        }
    }
}

impl core::error::Error for RequestError {}

#[derive(Clone, Debug)]
pub(crate) struct Requests<K> {
    states: Vec<RequestState<K>>,
    free: Vec<u32>,
    max: u32,
    hasher: FixedState,
}

impl<K: OffloadKey> Requests<K> {
    /// The bytes [`Requests::new`] allocates for `max` requests (request states are added as
    /// requests arrive and are not counted).
    pub(crate) fn bytes(max: u64) -> u64 {
        array_bytes(max, 4)
    }

    pub(crate) fn new(max: u32, hasher: FixedState) -> Result<Self, AllocError> {
        Ok(Requests {
            states: Vec::new(),
            free: with_capacity(max as usize)?,
            max,
            hasher,
        })
    }

    pub(crate) fn alloc(&mut self, cache_gen: u64) -> Result<RequestId, RequestError> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.states.len() >= self.max as usize {
                    return Err(RequestError::TooManyRequests {
                        max_requests: self.max,
                    });
                }
                self.states.push(RequestState::new());
                #[expect(clippy::cast_possible_truncation, reason = "bounded by max, a u32")]
                let i = (self.states.len() - 1) as u32;
                i
            }
        };
        let s = &mut self.states[index as usize];
        // A free state was cleared when it was released (a new one is empty).
        s.live = true;
        s.cache_gen = cache_gen;
        Ok(RequestId {
            index,
            generation: s.generation,
        })
    }

    pub(crate) fn get_mut(&mut self, id: RequestId) -> Result<&mut RequestState<K>, RequestError> {
        match self.states.get_mut(id.index as usize) {
            Some(s) if s.live && s.generation == id.generation => Ok(s),
            _ => Err(RequestError::Unknown(id)),
        }
    }

    pub(crate) fn index(id: RequestId) -> u32 {
        id.index
    }

    /// The list of chunks displaced on the accesses of the request in slot `index`.
    pub(crate) fn displaced_mut(&mut self, index: u32) -> Option<&mut Vec<u32>> {
        self.states
            .get_mut(index as usize)
            .map(|s| &mut s.displaced)
    }

    /// Frees the slot; the handle goes stale.
    pub(crate) fn release(&mut self, id: RequestId) {
        let hasher = self.hasher;
        if let Ok(s) = self.get_mut(id) {
            s.live = false;
            s.generation = s.generation.wrapping_add(1);
            s.clear(hasher);
            self.free.push(id.index);
        }
    }

    /// Bytes of heap held: the free list, and every request state with its warm buffers.
    pub(crate) fn heap_bytes(&self) -> usize {
        let states: usize = self
            .states
            .iter()
            .map(|s| {
                s.entries.capacity() * core::mem::size_of::<Entry<K>>()
                    + (s.observed.capacity() + s.displaced.capacity()) * 4
                    + s.index.allocation_size()
            })
            .sum();
        self.free.capacity() * 4
            + self.states.capacity() * core::mem::size_of::<RequestState<K>>()
            + states
    }

    pub(crate) fn live(&self) -> usize {
        self.states.len() - self.free.len()
    }

    /// Passes every key held by a live request's state to `f`.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&K)) {
        for s in self.states.iter().filter(|s| s.live) {
            for e in &s.entries {
                f(&e.key);
            }
        }
    }
}
