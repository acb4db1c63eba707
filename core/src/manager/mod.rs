//! The CPU offload manager: vLLM 0.33.0's `CPUOffloadingManager`, exactly.
//!
//! An [`OffloadManager`] tracks which keys are offloaded to a tier of `num_chunks` slots and in
//! which slot, and decides what is stored and what is evicted. It reproduces vLLM's observable
//! behaviour: the same slot ids, the same victims in the same order, the same events, the same
//! gauges. Where vLLM asserts, it returns a typed error and changes nothing.
//!
//! ```
//! use kvtier_core::manager::{LookupResult, ManagerConfig, OffloadManager};
//! use kvtier_core::BlockKey;
//!
//! let k = |i: u64| BlockKey::new(i, 0);
//! let mut m = OffloadManager::new(ManagerConfig::new(4)).unwrap();
//! let req = m.on_new_request().unwrap();
//! let out = m.prepare_store(req, &[k(1), k(2)], None).unwrap().unwrap();
//! assert_eq!(out.slots, &[0, 1]);
//! assert_eq!(m.lookup(&k(1)), LookupResult::HitPending);
//! m.complete_store(&[k(1), k(2)], true);
//! assert_eq!(m.lookup(&k(1)), LookupResult::Hit);
//! m.on_request_finished(req).unwrap();
//! ```
//!
//! Chunk states: a chunk's `ref_cnt` is −1 while its store is pending (not readable), 0 when it
//! is idle (readable and evictable) and k > 0 while k loads read it (pinned). The manager keeps
//! `evictable` (chunks at 0) and `write_pending` (chunks at −1), and the invariant
//! `allocated − free = write_pending + pinned + evictable` holds after every call
//! ([`OffloadManager::check_invariants`]).
//!
//! Differences from vLLM, all where vLLM would assert or corrupt its state: a store offer that
//! names a key twice is rejected ([`StoreError::DuplicateKey`]; vLLM would allocate it twice and
//! leak a slot); request state lives in a fixed pool of [`RequestId`] handles instead of the
//! caller's context object; the event queue is bounded.

mod arc;
mod chunks;
mod config;
mod error;
mod events;
mod key_pool;
mod links;
mod lru;
mod request;
mod stats;
mod tracker;

pub use config::{ConfigError, CpuTierInfo, ManagerConfig, PolicyKind, UnknownPolicy};
pub use error::{CompleteLoadError, LoadError, PositionError, StoreError};
pub use events::{EventKind, OffloadEvent};
pub use request::{RequestError, RequestId};
pub use stats::ManagerStats;

use alloc::vec::Vec;

use self::arc::Arc;
use self::chunks::{Chunks, PENDING};
use self::events::EventQueue;
use self::lru::Lru;
use self::request::{INSERTED, REUSED, RequestState, Requests, SEEN, STORE_MISS};
use self::tracker::Tracker;
use crate::key::{BlockKey, OffloadKey};
use crate::stats::Histogram;

/// The answer of [`OffloadManager::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LookupResult {
    /// The key is not in the tier.
    Miss,
    /// The key is in the tier but its store has not completed.
    HitPending,
    /// The key is in the tier and readable.
    Hit,
}

/// The state of one resident chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkState {
    /// Its store has not completed (`ref_cnt == −1`).
    Pending,
    /// Readable and evictable (`ref_cnt == 0`).
    Idle,
    /// Readable, pinned by this many loads in flight.
    Pinned(u32),
}

/// What [`OffloadManager::prepare_store`] decided, borrowed from the manager until its next
/// call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOutput<'a, K> {
    /// The keys to store, in offer order.
    pub keys: &'a [K],
    /// `slots[i]` is the slot allocated to `keys[i]`.
    pub slots: &'a [u32],
    /// Keys evicted to make room, in victim order.
    pub evicted: &'a [K],
}

#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per manager, never moved in a hot path"
)]
enum Policy<K> {
    Lru(Lru),
    Arc(Arc<K>),
}

/// Per offered key, how `prepare_store` classified it.
const CANDIDATE: u8 = 0;
const READY: u8 = 1;
const PENDING_KEY: u8 = 2;
const SKIPPED: u8 = 3;

/// vLLM 0.33.0's CPU offloading manager over keys `K` (see the [module docs](self)).
///
/// Memory is fixed at construction; steady-state calls do not allocate (per-request buffers
/// are reused once warm).
#[derive(Clone, Debug)]
pub struct OffloadManager<K: OffloadKey = BlockKey> {
    cfg: ManagerConfig,
    chunks: Chunks<K>,
    policy: Policy<K>,
    evictable: u32,
    write_pending: u32,
    tracker: Option<Tracker<K>>,
    stores_skipped: u64,
    alloc_sizes: Histogram,
    events: Option<EventQueue<K>>,
    requests: Requests<K>,
    cache_generation: u64,
    /// Stamps the resident keys of the current store offer (eviction protection).
    call_stamp: u32,
    /// Stamps request entries offered by the current store call (duplicate detection).
    offer_stamp: u64,
    s_entry: Vec<u32>,
    s_class: Vec<u8>,
    s_slot: Vec<u32>,
    s_count: Vec<u32>,
    s_new: Vec<(u32, u32)>,
    s_rslot: Vec<u32>,
    s_zero: Vec<u32>,
    s_order: Vec<u32>,
    out_keys: Vec<K>,
    out_slots: Vec<u32>,
    out_evicted: Vec<K>,
    victims: Vec<u32>,
}

impl<K: OffloadKey> OffloadManager<K> {
    /// Builds a manager; all of its memory is allocated here.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is out of range, or
    /// [`ConfigError::OutOfMemory`] when its arrays cannot be allocated.
    pub fn new(cfg: ManagerConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let needed = Self::required_bytes(&cfg);
        if let Some(limit) = cfg.memory_limit
            && needed > limit
        {
            return Err(ConfigError::OutOfMemory {
                needed,
                limit: Some(limit),
            });
        }
        let oom = |_| ConfigError::OutOfMemory {
            needed,
            limit: None,
        };
        let n = cfg.num_chunks;
        let policy = match cfg.policy {
            PolicyKind::Lru => Policy::Lru(Lru::new(n, cfg.max_requests).map_err(oom)?),
            PolicyKind::Arc => Policy::Arc(Arc::new(n, cfg.hasher).map_err(oom)?),
        };
        let tracker = match cfg.filter_enabled() {
            true => Some(Tracker::new(cfg.max_tracker_size, cfg.hasher).map_err(oom)?),
            false => None,
        };
        let events = match cfg.enable_events {
            true => Some(EventQueue::new(cfg.max_event_keys).map_err(oom)?),
            false => None,
        };
        // The catalogue's bounds are ascending and fewer than 16 (its tests check every
        // family), so the bound-less fallback never happens.
        let alloc_sizes =
            Histogram::new(&crate::stats::catalogue::ALLOCATION_SIZE_BOUNDS).unwrap_or_default();
        Ok(OffloadManager {
            chunks: Chunks::new(n, cfg.hasher).map_err(oom)?,
            policy,
            evictable: 0,
            write_pending: 0,
            tracker,
            stores_skipped: 0,
            alloc_sizes,
            events,
            requests: Requests::new(cfg.max_requests).map_err(oom)?,
            cache_generation: 0,
            call_stamp: 0,
            offer_stamp: 0,
            s_entry: Vec::new(),
            s_class: Vec::new(),
            s_slot: Vec::new(),
            s_count: Vec::new(),
            s_new: Vec::new(),
            s_rslot: Vec::new(),
            s_zero: Vec::new(),
            s_order: Vec::new(),
            out_keys: Vec::new(),
            out_slots: Vec::new(),
            out_evicted: Vec::new(),
            victims: Vec::new(),
            cfg,
        })
    }

    /// The bytes [`new`](Self::new) allocates for `cfg`, computed from the configuration alone
    /// (exact for 16-byte hash-table groups, as on x86-64; at most a few bytes more than
    /// needed elsewhere). Per-request state is allocated later, as requests arrive, and is
    /// not included. [`ManagerConfig::memory_limit`] is checked against this number before
    /// anything is allocated.
    #[must_use]
    pub fn required_bytes(cfg: &ManagerConfig) -> u64 {
        let n = u64::from(cfg.num_chunks);
        let requests = u64::from(cfg.max_requests);
        let policy = match cfg.policy {
            PolicyKind::Lru => Lru::bytes(n, requests),
            PolicyKind::Arc => Arc::<K>::bytes(n),
        };
        let tracker = match cfg.filter_enabled() {
            true => Tracker::<K>::bytes(u64::from(cfg.max_tracker_size)),
            false => 0,
        };
        let events = match cfg.enable_events {
            true => EventQueue::<K>::bytes(u64::from(cfg.max_event_keys)),
            false => 0,
        };
        Chunks::<K>::bytes(n)
            .saturating_add(policy)
            .saturating_add(tracker)
            .saturating_add(events)
            .saturating_add(Requests::<K>::bytes(requests))
    }

    /// The configuration the manager was built with.
    #[must_use]
    pub fn config(&self) -> &ManagerConfig {
        &self.cfg
    }

    // ----- requests -----

    /// Starts a request's state (vLLM's `on_new_request`, which returns the chunk-level
    /// offload policy: kvtier's CPU tier is always chunk-level).
    ///
    /// # Errors
    /// [`RequestError::TooManyRequests`] when `max_requests` requests are live.
    pub fn on_new_request(&mut self) -> Result<RequestId, RequestError> {
        self.requests.alloc(self.cache_generation)
    }

    /// Ends a request: its keys, head to tail (by end-token position when every key has one,
    /// else in the order first observed, grouped by KV group), commit their recency to the
    /// policy. The handle goes stale.
    ///
    /// # Errors
    /// [`RequestError::Unknown`] when the handle is not live; nothing changes then.
    pub fn on_request_finished(&mut self, req: RequestId) -> Result<(), RequestError> {
        let ri = Requests::<K>::index(req);
        let st = self.requests.get_mut(req)?;
        if st.cache_gen == self.cache_generation {
            order_keys(st, &mut self.s_order);
            match &mut self.policy {
                Policy::Lru(lru) => {
                    for &e in self.s_order.iter().rev() {
                        let entry = &st.entries[e as usize];
                        if let Some(slot) = self.chunks.find_hinted(&entry.key, entry.slot) {
                            lru.refresh(slot);
                        }
                    }
                    lru.release_request(&mut st.rank, ri);
                }
                Policy::Arc(arc) => {
                    for &e in self.s_order.iter().rev() {
                        let entry = &st.entries[e as usize];
                        if let Some(slot) = self.chunks.find_hinted(&entry.key, entry.slot) {
                            let reused = entry.flags & REUSED != 0;
                            let inserted_only = entry.flags & INSERTED != 0 && !reused;
                            arc.on_finished(slot, inserted_only, reused);
                        }
                    }
                }
            }
        }
        self.requests.release(req);
        Ok(())
    }

    /// Forgets a request without committing its recency (an aborted request). The handle goes
    /// stale.
    ///
    /// # Errors
    /// [`RequestError::Unknown`] when the handle is not live.
    pub fn drop_request(&mut self, req: RequestId) -> Result<(), RequestError> {
        let ri = Requests::<K>::index(req);
        let st = self.requests.get_mut(req)?;
        if let Policy::Lru(lru) = &mut self.policy {
            lru.release_request(&mut st.rank, ri);
        }
        self.requests.release(req);
        Ok(())
    }

    /// Requests currently live.
    #[must_use]
    pub fn live_requests(&self) -> usize {
        self.requests.live()
    }

    // ----- lookup and loads -----

    /// Whether `key` is offloaded and readable. Changes nothing (no recency, no reuse count).
    #[must_use]
    pub fn lookup(&self, key: &K) -> LookupResult {
        match self.chunks.find(key) {
            None => LookupResult::Miss,
            Some(s) if self.chunks.ref_cnt(s) == PENDING => LookupResult::HitPending,
            Some(_) => LookupResult::Hit,
        }
    }

    /// Pins `keys` for reading and returns their slots in key order. `end_tokens[i]`, if
    /// given, is the end-token position of `keys[i]` in the request (it orders the request's
    /// keys for the LRU policy).
    ///
    /// # Errors
    /// [`LoadError`] when the request is not live, a key is absent or pending (vLLM asserts),
    /// or the positions do not fit; nothing changes then.
    pub fn prepare_load(
        &mut self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
    ) -> Result<&[u32], LoadError> {
        check_positions(keys.len(), end_tokens).map_err(LoadError::Positions)?;
        self.refresh_request(req)?;
        self.s_slot.clear();
        for (index, key) in keys.iter().enumerate() {
            match self.chunks.find(key) {
                None => return Err(LoadError::NotPresent { index }),
                Some(s) if self.chunks.ref_cnt(s) < 0 => {
                    return Err(LoadError::NotReady { index });
                }
                Some(s) => self.s_slot.push(s),
            }
        }
        for i in 0..self.s_slot.len() {
            let s = self.s_slot[i];
            let r = self.chunks.ref_cnt(s);
            if r == i32::MAX {
                for &t in &self.s_slot[..i] {
                    let r = self.chunks.ref_cnt(t) - 1;
                    self.chunks.set_ref_cnt(t, r);
                    if r == 0 {
                        self.evictable += 1;
                    }
                }
                return Err(LoadError::TooManyPins { index: i });
            }
            if r == 0 {
                self.evictable -= 1;
            }
            self.chunks.set_ref_cnt(s, r + 1);
        }
        let st = self.requests.get_mut(req)?;
        self.s_entry.clear();
        for (i, key) in keys.iter().enumerate() {
            let e = st.entry(*key, self.cfg.hasher);
            if let Some(p) = end_tokens {
                st.entries[e as usize].pos = Some(p[i]);
            }
            self.s_entry.push(e);
        }
        record_access(
            st,
            Requests::<K>::index(req),
            self.s_entry
                .iter()
                .zip(&self.s_slot)
                .map(|(&e, &s)| (e, true, s)),
            &mut self.policy,
            &self.chunks,
            &mut self.s_new,
        );
        Ok(&self.s_slot)
    }

    /// Marks `keys` recently used (walking them in reverse, so the first ends up the most
    /// recent). Absent keys are ignored by LRU and feed ARC's ghost adaptation.
    pub fn touch(&mut self, keys: &[K]) {
        for key in keys.iter().rev() {
            let slot = self.chunks.find(key);
            match &mut self.policy {
                Policy::Lru(lru) => {
                    if let Some(s) = slot {
                        lru.refresh(s);
                    }
                }
                Policy::Arc(arc) => {
                    arc.touch(key, slot.map(|s| (s, self.chunks.ref_cnt(s) >= 0)));
                }
            }
        }
    }

    /// Undoes one pin per key; a chunk whose last load completes becomes evictable.
    ///
    /// # Errors
    /// [`CompleteLoadError`] when a key is absent or not pinned (counting repeats within the
    /// call); nothing changes then.
    pub fn complete_load(&mut self, keys: &[K]) -> Result<(), CompleteLoadError> {
        self.s_slot.clear();
        self.s_zero.clear();
        for (index, key) in keys.iter().enumerate() {
            let Some(s) = self.chunks.find(key) else {
                self.undo_unpins();
                return Err(CompleteLoadError::NotPresent { index });
            };
            let r = self.chunks.ref_cnt(s);
            if r <= 0 {
                self.undo_unpins();
                return Err(CompleteLoadError::NotPinned { index });
            }
            self.chunks.set_ref_cnt(s, r - 1);
            self.s_slot.push(s);
            // A chunk reaches 0 at most once per call: a further unpin of it fails above.
            if r == 1 {
                self.s_zero.push(s);
            }
        }
        for &s in &self.s_zero {
            self.evictable += 1;
            if let Policy::Lru(lru) = &mut self.policy {
                lru.on_evictable(s, self.chunks.keys());
            }
        }
        Ok(())
    }

    fn undo_unpins(&mut self) {
        for &s in &self.s_slot {
            let r = self.chunks.ref_cnt(s);
            self.chunks.set_ref_cnt(s, r + 1);
        }
        self.s_slot.clear();
    }

    // ----- stores -----

    /// Decides which of the offered `keys` to store, evicting idle chunks if needed.
    ///
    /// Returns `Ok(None)` when the needed evictions cannot be satisfied (nothing changes then,
    /// except that the offer was counted by the reuse tracker and sampled in the
    /// allocation-size histogram, as in vLLM). Otherwise the keys to store (absent keys that
    /// passed the reuse filter, in offer order), their slots, and the evicted keys in victim
    /// order. The new chunks are pending until [`complete_store`](Self::complete_store).
    /// Every offered key is protected from eviction by this call.
    ///
    /// # Errors
    /// [`StoreError`] when the request is not live, a key repeats, or the positions do not
    /// fit; nothing changes then.
    pub fn prepare_store(
        &mut self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
    ) -> Result<Option<StoreOutput<'_, K>>, StoreError> {
        check_positions(keys.len(), end_tokens).map_err(StoreError::Positions)?;
        self.refresh_request(req)?;
        let ri = Requests::<K>::index(req);
        let hasher = self.cfg.hasher;
        let st = self.requests.get_mut(req)?;

        // 1. Validate: no key twice in one offer.
        self.offer_stamp += 1;
        let stamp = self.offer_stamp;
        self.s_entry.clear();
        for (index, key) in keys.iter().enumerate() {
            let e = st.entry(*key, hasher);
            let entry = &mut st.entries[e as usize];
            if entry.offer == stamp {
                return Err(StoreError::DuplicateKey { index });
            }
            entry.offer = stamp;
            self.s_entry.push(e);
        }
        if let Some(p) = end_tokens {
            for (&e, &pos) in self.s_entry.iter().zip(p) {
                st.entries[e as usize].pos = Some(pos);
            }
        }

        // 2. The reuse tracker counts the whole offer.
        if let Some(t) = &mut self.tracker {
            t.record(keys, &mut self.s_count);
        }

        // 3. Partition; protect every resident offered key from this call's eviction.
        self.call_stamp = self.call_stamp.wrapping_add(1);
        if self.call_stamp == 0 || self.call_stamp == u32::MAX {
            self.chunks.clear_stamps();
            self.call_stamp = 1;
        }
        self.s_class.clear();
        self.s_rslot.clear();
        self.out_keys.clear();
        let mut candidates = 0usize;
        let mut skipped = 0u64;
        for (i, key) in keys.iter().enumerate() {
            let found = self.chunks.find(key);
            self.s_rslot.push(found.unwrap_or(links::NIL));
            let class = match found {
                None => {
                    let admitted = match &self.tracker {
                        Some(_) => self.s_count[i] >= self.cfg.store_threshold,
                        None => true,
                    };
                    if admitted {
                        candidates += 1;
                        CANDIDATE
                    } else {
                        skipped += 1;
                        SKIPPED
                    }
                }
                Some(s) => {
                    self.chunks.set_stamp(s, self.call_stamp);
                    if self.chunks.ref_cnt(s) >= 0 {
                        READY
                    } else {
                        PENDING_KEY
                    }
                }
            };
            self.s_class.push(class);
        }
        self.stores_skipped = self.stores_skipped.saturating_add(skipped);

        // 4. Store misses this request has not reported yet (ARC adapts on ghost hits).
        if let Policy::Arc(arc) = &mut self.policy {
            for i in (0..keys.len()).rev() {
                let e = &mut st.entries[self.s_entry[i] as usize];
                if self.s_class[i] == CANDIDATE && e.flags & STORE_MISS == 0 {
                    arc.adapt(&keys[i]);
                }
            }
        }
        for i in 0..keys.len() {
            if self.s_class[i] == CANDIDATE {
                st.entries[self.s_entry[i] as usize].flags |= STORE_MISS;
            }
        }

        // 5. Record the request's access to candidates and ready keys, in offer order.
        let classes = &self.s_class;
        record_access(
            st,
            ri,
            self.s_entry
                .iter()
                .zip(classes)
                .zip(&self.s_rslot)
                .filter(|((_, c), _)| **c <= READY)
                .map(|((&e, &c), &slot)| (e, c == READY, slot)),
            &mut self.policy,
            &self.chunks,
            &mut self.s_new,
        );

        self.out_slots.clear();
        self.out_evicted.clear();
        if candidates == 0 {
            return Ok(Some(StoreOutput {
                keys: &[],
                slots: &[],
                evicted: &[],
            }));
        }

        // 6. Sample the allocation size, then make room.
        self.alloc_sizes.observe(candidates as u64);
        let free = self.chunks.pool.free_count() as usize;
        if candidates > free {
            let need = candidates - free;
            if need > self.evictable as usize {
                return Ok(None);
            }
            #[expect(clippy::cast_possible_truncation, reason = "need <= evictable, a u32")]
            let need = need as u32;
            self.victims.clear();
            let ok = match &mut self.policy {
                Policy::Lru(lru) => lru.evict(
                    need,
                    self.chunks.ref_cnts(),
                    self.chunks.stamps(),
                    self.call_stamp,
                    &mut self.victims,
                ),
                Policy::Arc(arc) => arc.evict(
                    need,
                    self.chunks.keys(),
                    self.chunks.ref_cnts(),
                    self.chunks.stamps(),
                    self.call_stamp,
                    &mut self.victims,
                ),
            };
            if !ok {
                return Ok(None);
            }
            self.evictable -= need;
            for &v in &self.victims {
                self.out_evicted.push(self.chunks.key(v));
                self.chunks.remove(v);
            }
            if let Some(ev) = &mut self.events {
                ev.push(EventKind::Removed, self.out_evicted.iter().copied());
            }
        }

        // 7. Allocate and insert the candidates, pending.
        let st = self.requests.get_mut(req)?;
        for (i, key) in keys.iter().enumerate() {
            if self.s_class[i] != CANDIDATE {
                continue;
            }
            let Some(slot) = self.chunks.insert(*key) else {
                break;
            };
            let entry = &mut st.entries[self.s_entry[i] as usize];
            entry.flags |= INSERTED;
            entry.slot = slot;
            let pos = entry.pos;
            match &mut self.policy {
                Policy::Lru(lru) => lru.insert(slot, pos, &mut st.rank, ri, self.chunks.keys()),
                Policy::Arc(arc) => arc.insert(slot, key),
            }
            self.out_keys.push(*key);
            self.out_slots.push(slot);
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "candidates <= num_chunks, a u32"
        )]
        let added = self.out_keys.len() as u32;
        self.write_pending += added;
        Ok(Some(StoreOutput {
            keys: &self.out_keys,
            slots: &self.out_slots,
            evicted: &self.out_evicted,
        }))
    }

    /// Completes stores. On success each pending key becomes readable and evictable (one
    /// `Stored` event); on failure each pending key is removed and its slot freed (one
    /// metadata-only removal event). Absent or already-ready keys are ignored, so completing
    /// twice is harmless.
    pub fn complete_store(&mut self, keys: &[K], success: bool) {
        self.out_keys.clear();
        for key in keys {
            let Some(s) = self.chunks.find(key) else {
                continue;
            };
            if self.chunks.ref_cnt(s) != PENDING {
                continue;
            }
            self.write_pending -= 1;
            if success {
                self.chunks.set_ref_cnt(s, 0);
                self.evictable += 1;
                if let Policy::Lru(lru) = &mut self.policy {
                    lru.on_evictable(s, self.chunks.keys());
                }
            } else {
                match &mut self.policy {
                    Policy::Lru(lru) => lru.remove(s),
                    Policy::Arc(arc) => arc.remove(s),
                }
                self.chunks.remove(s);
            }
            self.out_keys.push(*key);
        }
        if let Some(ev) = &mut self.events {
            let kind = if success {
                EventKind::Stored
            } else {
                EventKind::RemovedMetadataOnly
            };
            ev.push(kind, self.out_keys.iter().copied());
        }
    }

    // ----- events, reset, stats -----

    /// Drains the queued events in order, passing each to `f`. A metadata-only removal keeps
    /// only the keys that are still absent and is skipped when none is. With events disabled
    /// nothing is passed.
    pub fn drain_events(&mut self, f: impl FnMut(OffloadEvent<'_, K>)) {
        let chunks = &self.chunks;
        if let Some(ev) = &mut self.events {
            ev.drain(|k| chunks.find(k).is_none(), f);
        }
    }

    /// Drains the queued events into owned `(kind, keys)` pairs (allocates; see
    /// [`drain_events`](Self::drain_events) for the allocation-free form).
    pub fn take_events(&mut self) -> Vec<(EventKind, Vec<K>)> {
        let mut out = Vec::new();
        self.drain_events(|e| out.push((e.kind, e.keys.to_vec())));
        out
    }

    /// Events dropped because the queue was full: `(events, keys)`.
    #[must_use]
    pub fn events_dropped(&self) -> (u64, u64) {
        self.events
            .as_ref()
            .map_or((0, 0), |e| (e.dropped_events, e.dropped_keys))
    }

    /// Evicts everything: the policy is cleared (ranks, ghost lists, ARC's target), slot ids
    /// restart at 0, request states from before the reset are ignored from now on. The reuse
    /// tracker, undrained stats and queued events are kept, as in vLLM.
    pub fn reset_cache(&mut self) {
        match &mut self.policy {
            Policy::Lru(lru) => lru.clear(),
            Policy::Arc(arc) => arc.clear(),
        }
        self.cache_generation += 1;
        self.evictable = 0;
        self.write_pending = 0;
        self.chunks.clear();
    }

    /// Drains the stats collected since the last call (vLLM's `get_stats`, called once per
    /// scheduler step).
    pub fn get_stats(&mut self) -> ManagerStats {
        let sizes = self.alloc_sizes.clone();
        self.alloc_sizes.clear();
        let skipped = self.tracker.is_some().then_some(self.stores_skipped);
        self.stores_skipped = 0;
        ManagerStats {
            num_used: u64::from(self.allocated() - self.evictable),
            write_pending: u64::from(self.write_pending),
            num_chunks: u64::from(self.cfg.num_chunks),
            allocation_sizes: sizes,
            stores_skipped: skipped,
        }
    }

    /// Candidates the reuse filter rejected since the last [`get_stats`](Self::get_stats),
    /// without draining them.
    #[must_use]
    pub fn stores_skipped_undrained(&self) -> u64 {
        self.stores_skipped
    }

    /// The CPU tier's facts (vLLM's `config_info`): one info series, empty (`{}`) when the
    /// manager was built without [`ManagerConfig::info`].
    #[must_use]
    pub fn config_info(&self) -> crate::stats::InfoSeries {
        self.cfg
            .info
            .as_ref()
            .map_or_else(crate::stats::InfoSeries::new, CpuTierInfo::to_info_series)
    }

    /// [`get_stats`](Self::get_stats) as vLLM's payload.
    pub fn get_stats_payload(&mut self) -> crate::stats::Payload {
        self.get_stats().to_payload()
    }

    // ----- introspection -----

    /// Capacity in chunks.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.cfg.num_chunks
    }

    /// Slots allocated (`A − |F|`): resident chunks.
    #[must_use]
    pub fn allocated(&self) -> u32 {
        self.chunks.pool.len()
    }

    /// Free slots.
    #[must_use]
    pub fn free_chunks(&self) -> u32 {
        self.chunks.pool.free_count()
    }

    /// Chunks idle and evictable (`ref_cnt == 0`).
    #[must_use]
    pub fn evictable(&self) -> u32 {
        self.evictable
    }

    /// Chunks whose store is pending (`ref_cnt == −1`).
    #[must_use]
    pub fn write_pending(&self) -> u32 {
        self.write_pending
    }

    /// The slot and state of a resident key.
    #[must_use]
    pub fn chunk(&self, key: &K) -> Option<(u32, ChunkState)> {
        let s = self.chunks.find(key)?;
        let state = match self.chunks.ref_cnt(s) {
            PENDING => ChunkState::Pending,
            0 => ChunkState::Idle,
            r => ChunkState::Pinned(r.unsigned_abs()),
        };
        Some((s, state))
    }

    /// The reuse tracker's count for `key` (0 when untracked or the filter is off).
    #[must_use]
    pub fn tracker_count(&self, key: &K) -> u32 {
        self.tracker.as_ref().map_or(0, |t| t.count(key))
    }

    /// Keys the reuse tracker holds (0 when the filter is off).
    #[must_use]
    pub fn tracker_len(&self) -> u32 {
        self.tracker.as_ref().map_or(0, Tracker::len)
    }

    /// ARC's adaptive target for T1, `None` under LRU.
    #[must_use]
    pub fn arc_target(&self) -> Option<f64> {
        match &self.policy {
            Policy::Arc(a) => Some(a.target()),
            Policy::Lru(_) => None,
        }
    }

    /// ARC's list sizes `(|T1|, |T2|, |B1|, |B2|)`, `None` under LRU.
    #[must_use]
    pub fn arc_sizes(&self) -> Option<(u32, u32, u32, u32)> {
        match &self.policy {
            Policy::Arc(a) => Some(a.sizes()),
            Policy::Lru(_) => None,
        }
    }

    /// Resident keys in the policy's eviction order, first victim first, ignoring pins
    /// (LRU: rank order; ARC: T1 from its LRU end, then T2).
    #[must_use]
    pub fn eviction_order(&self) -> Vec<K> {
        match &self.policy {
            Policy::Lru(l) => l.order().map(|s| self.chunks.key(s)).collect(),
            Policy::Arc(a) => {
                let (t1, t2) = a.lists();
                t1.into_iter()
                    .chain(t2)
                    .map(|s| self.chunks.key(s))
                    .collect()
            }
        }
    }

    /// Bytes of heap the manager holds (all of it allocated at construction, plus warm
    /// per-request buffers).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        let policy = match &self.policy {
            Policy::Lru(l) => l.heap_bytes(),
            Policy::Arc(a) => a.heap_bytes(),
        };
        self.chunks.heap_bytes()
            + policy
            + self.tracker.as_ref().map_or(0, Tracker::heap_bytes)
            + self.events.as_ref().map_or(0, EventQueue::heap_bytes)
            + self.requests.heap_bytes()
    }

    /// Checks the manager's invariants: `allocated − free` bookkeeping, `evictable` and
    /// `write_pending` equal the chunk states, every resident key has exactly one slot and the
    /// policy holds exactly the resident chunks.
    ///
    /// # Errors
    /// A description of the first broken invariant (a bug in kvtier).
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let (mut pending, mut idle, mut pinned) = (0u32, 0u32, 0u32);
        for s in 0..self.cfg.num_chunks {
            let r = self.chunks.ref_cnt(s);
            if r == chunks::ABSENT {
                if self.chunks.pool.holds(s) {
                    return Err("an allocated slot holds no key");
                }
                continue;
            }
            if !self.chunks.pool.holds(s) {
                return Err("a free slot holds a key");
            }
            if self.chunks.find(&self.chunks.key(s)) != Some(s) {
                return Err("a resident key does not map back to its slot");
            }
            match r {
                PENDING => pending += 1,
                0 => idle += 1,
                r if r > 0 => pinned += 1,
                _ => return Err("a chunk has an impossible ref_cnt"),
            }
        }
        if self.chunks.len() != (pending + idle + pinned) as usize {
            return Err("the key index and the slot table disagree");
        }
        if self.allocated() != pending + idle + pinned {
            return Err("allocated - free != write_pending + pinned + evictable");
        }
        if pending != self.write_pending {
            return Err("write_pending does not count the pending chunks");
        }
        if idle != self.evictable {
            return Err("evictable does not count the idle chunks");
        }
        let in_policy = match &self.policy {
            Policy::Lru(l) => l.order().count(),
            Policy::Arc(a) => {
                let (t1, t2) = a.lists();
                t1.len() + t2.len()
            }
        };
        if in_policy != self.chunks.len() {
            return Err("the policy does not hold exactly the resident chunks");
        }
        Ok(())
    }

    /// Validates the handle and, if the cache was reset since the request last touched it,
    /// starts the request's state afresh (vLLM ignores state from an older generation).
    fn refresh_request(&mut self, req: RequestId) -> Result<(), RequestError> {
        let generation = self.cache_generation;
        let st = self.requests.get_mut(req)?;
        if st.cache_gen != generation {
            st.reset_access();
            st.cache_gen = generation;
        }
        Ok(())
    }
}

/// Checks an optional positions slice against the keys.
fn check_positions(keys: usize, end_tokens: Option<&[u64]>) -> Result<(), PositionError> {
    let Some(p) = end_tokens else { return Ok(()) };
    if p.len() != keys {
        return Err(PositionError::LengthMismatch {
            keys,
            positions: p.len(),
        });
    }
    match p.iter().position(|&v| v > i64::MAX as u64) {
        Some(index) => Err(PositionError::TooLarge { index }),
        None => Ok(()),
    }
}

/// vLLM's `_record_request_cache_access`: marks the entries seen (in order), marks those
/// flagged `reused` as reused unless this request inserted them, then tells the policy about
/// the newly seen ones. Each item carries the key's slot when resident (`NIL` when absent),
/// which the caller has just looked up.
fn record_access<K: OffloadKey>(
    st: &mut RequestState<K>,
    req_index: u32,
    items: impl Iterator<Item = (u32, bool, u32)>,
    policy: &mut Policy<K>,
    chunks: &Chunks<K>,
    s_new: &mut Vec<(u32, u32)>,
) {
    s_new.clear();
    for (e, reused, slot) in items {
        if st.observe(e) {
            s_new.push((e, slot));
        }
        let entry = &mut st.entries[e as usize];
        if slot != links::NIL {
            entry.slot = slot;
        }
        if reused && entry.flags & INSERTED == 0 {
            entry.flags |= REUSED;
        }
    }
    if !s_new.is_empty()
        && let Policy::Lru(lru) = policy
    {
        let major = lru.begin_access(&mut st.rank, req_index);
        for &(e, slot) in s_new.iter() {
            if let (Some(p), true) = (st.entries[e as usize].pos, slot != links::NIL) {
                lru.on_access(slot, p, major, req_index, chunks.keys());
            }
        }
    }
}

/// The request's seen keys head to tail, as vLLM orders them for `on_request_finished`.
fn order_keys<K: OffloadKey>(st: &RequestState<K>, order: &mut Vec<u32>) {
    order.clear();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "keys per request stay below 2^32"
    )]
    order.extend(
        st.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.flags & SEEN != 0)
            .map(|(i, _)| i as u32),
    );
    let es = &st.entries;
    let all_pos = order.iter().all(|&i| es[i as usize].pos.is_some());
    if all_pos {
        // Per-group position sort, then groups in order, then a stable sort by position:
        // (position, group, observation order). A scheduler usually offers blocks head to
        // tail, so the observation order is often already that order.
        let sort_key = |i: &u32| {
            let e = &es[*i as usize];
            (e.pos, e.key.group(), e.seq)
        };
        // `entries` is in creation order, not observation order: compare by the full key.
        if order.is_sorted_by_key(sort_key) {
            return;
        }
        order.sort_unstable_by_key(|&i| {
            let e = &es[i as usize];
            (e.pos, e.key.group(), e.seq)
        });
        return;
    }
    order.sort_unstable_by_key(|&i| (es[i as usize].key.group(), es[i as usize].seq));
    // Within each group, by position if every key of the group has one.
    let mut start = 0;
    while start < order.len() {
        let g = es[order[start] as usize].key.group();
        let mut end = start;
        while end < order.len() && es[order[end] as usize].key.group() == g {
            end += 1;
        }
        let run = &mut order[start..end];
        if run.iter().all(|&i| es[i as usize].pos.is_some()) {
            run.sort_unstable_by_key(|&i| (es[i as usize].pos, es[i as usize].seq));
        }
        start = end;
    }
}
