//! The CPU offload manager: vLLM 0.33.0's `CPUOffloadingManager`, exactly.
//!
//! An [`OffloadManager`] tracks which keys are offloaded to a tier of `num_chunks` slots and in
//! which slot, and decides what is stored and what is evicted. It reproduces vLLM's observable
//! behaviour: the same slot ids, the same victims in the same order, the same events, the same
//! gauges. Where vLLM asserts, it returns a typed error and changes nothing.
//!
//! ```
//! use kvtier_core::manager::{LookupResult, ManagerConfig, OffloadManager, StoreOutcome, StorePlan};
//! use kvtier_core::BlockKey;
//!
//! let k = |i: u64| BlockKey::new(i, 0);
//! let mut m = OffloadManager::new(ManagerConfig::new(4)).unwrap();
//! let req = m.on_new_request().unwrap();
//! let mut plan = StorePlan::new();
//! m.prepare_store(req, &[k(1), k(2)], None, &mut plan).unwrap();
//! assert_eq!(plan.slots(), &[0, 1]);
//! assert_eq!(m.lookup(&k(1)), LookupResult::HitPending);
//! assert_eq!(m.complete_store(plan.keys(), StoreOutcome::Stored), 2);
//! assert_eq!(m.lookup(&k(1)), LookupResult::Hit);
//! m.on_request_finished(req).unwrap();
//! ```
//!
//! Chunk states: a chunk's `ref_cnt` is −1 while its store is pending (not readable), 0 when it
//! is idle (readable and evictable) and k > 0 while k loads read it (pinned). The manager keeps
//! `evictable` (chunks at 0) and `write_pending` (chunks at −1), and the invariant
//! `allocated − free = write_pending + pinned + evictable` holds after every call
//! ([`Inspect::check_invariants`]).
//!
//! Differences from vLLM, all where vLLM would assert or corrupt its state: a store offer that
//! names a key twice is rejected ([`StoreError::DuplicateKey`]; vLLM would allocate it twice and
//! leak a slot); request state lives in a fixed pool of [`RequestId`] handles instead of the
//! caller's context object; the event queue is bounded.

mod arc;
mod chunks;
mod config;
mod entry_index;
mod error;
mod events;
mod inspect;
mod key_pool;
mod key_table;
mod links;
mod load;
mod lru;
mod policy;
mod request;
mod stats;
mod store;
mod tracker;

pub use config::{ConfigError, ManagerConfig, PolicyKind, UnknownPolicy};
pub use error::{CompleteLoadError, LoadError, PositionError, StoreError};
pub use events::{EventKind, OffloadEvent};
pub use inspect::Inspect;
pub use load::{HitPrefix, HitScan, LookupResult};
pub use request::{RequestError, RequestId};
pub use stats::ManagerStats;
pub use store::{StoreOutcome, StorePlan};

use alloc::vec::Vec;

use self::arc::Arc;
use self::chunks::Chunks;
use self::events::EventQueue;
use self::links::NIL;
use self::lru::Lru;
use self::policy::{Policy, order_keys};
use self::request::{INSERTED, REUSED, Requests};
use self::tracker::Tracker;
use crate::key::{BlockKey, OffloadKey};
use crate::stats::{CpuTierInfo, Histogram};

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

/// vLLM 0.33.0's CPU offloading manager over keys `K` (see the [module docs](self)).
///
/// Memory is fixed at construction and steady-state calls do not allocate (per-request buffers
/// are reused once warm), unless [`ManagerConfig::grow_tables`] lets the key tables grow as
/// they fill, up to the same bound.
#[derive(Clone, Debug)]
pub struct OffloadManager<K: OffloadKey = BlockKey> {
    cfg: ManagerConfig,
    chunks: Chunks<K>,
    policy: Policy,
    evictable: u32,
    write_pending: u32,
    tracker: Option<Tracker<K>>,
    stores_skipped: u64,
    /// `prepare_store` calls that found no room since the last drain.
    alloc_failures: u64,
    /// Whether a drain has reported `config_info` yet.
    info_reported: bool,
    alloc_sizes: Histogram,
    events: Option<EventQueue<K>>,
    requests: Requests<K>,
    cache_generation: u64,
    /// Stamps request entries offered by the current store call (duplicate detection).
    offer_stamp: u64,
    /// The request entries of the keys of a `prepare_load`.
    s_entry: Vec<u32>,
    /// The keys of the current store offer, classified.
    s_offer: Vec<store::Offered>,
    /// The idle resident slots of the current store offer (protected while it evicts).
    s_idle: Vec<u32>,
    s_slot: Vec<u32>,
    s_count: Vec<u32>,
    s_zero: Vec<u32>,
    s_order: Vec<u32>,
    /// Slots of the keys of a `complete_load` / `complete_store` call.
    s_resolve: Vec<u32>,
    /// The keys a `complete_store` completed (its event's keys).
    s_done: Vec<K>,
    victims: Vec<u32>,
}

/// The ghost keys the chunks' key table holds room for: ARC's two ghost lists of up to
/// `num_chunks` keys each (the configuration keeps `3 · num_chunks` below 2^32).
fn ghost_keys(policy: PolicyKind, num_chunks: u32) -> u32 {
    match policy {
        PolicyKind::Lru => 0,
        PolicyKind::Arc => num_chunks.saturating_mul(2),
    }
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
            PolicyKind::Arc => Policy::Arc(Arc::new(n).map_err(oom)?),
        };
        let tracker = match cfg.filter_enabled() {
            true => {
                Some(Tracker::new(cfg.max_tracker_size, cfg.hasher, cfg.grow_tables).map_err(oom)?)
            }
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
            chunks: Chunks::new(n, ghost_keys(cfg.policy, n), cfg.hasher, cfg.grow_tables)
                .map_err(oom)?,
            policy,
            evictable: 0,
            write_pending: 0,
            tracker,
            stores_skipped: 0,
            alloc_failures: 0,
            info_reported: false,
            alloc_sizes,
            events,
            requests: Requests::new(cfg.max_requests, cfg.hasher).map_err(oom)?,
            cache_generation: 0,
            offer_stamp: 0,
            s_entry: Vec::new(),
            s_offer: Vec::new(),
            s_idle: Vec::new(),
            s_slot: Vec::new(),
            s_count: Vec::new(),
            s_zero: Vec::new(),
            s_order: Vec::new(),
            s_resolve: Vec::new(),
            s_done: Vec::new(),
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
            PolicyKind::Arc => Arc::bytes(n),
        };
        let tracker = match cfg.filter_enabled() {
            true => Tracker::<K>::bytes(u64::from(cfg.max_tracker_size)),
            false => 0,
        };
        let events = match cfg.enable_events {
            true => EventQueue::<K>::bytes(u64::from(cfg.max_event_keys)),
            false => 0,
        };
        Chunks::<K>::bytes(n, u64::from(ghost_keys(cfg.policy, cfg.num_chunks)))
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
            let order = order_keys(st, &mut self.s_order);
            match &mut self.policy {
                Policy::Lru(lru) => {
                    let chunks = &self.chunks;
                    lru.refresh_all(order.iter().rev().filter_map(|&e| {
                        let entry = &st.entries[e as usize];
                        chunks.find_hinted(&entry.key, entry.slot)
                    }));
                    lru.finish_request(&mut st.rank, ri, &mut st.displaced);
                }
                Policy::Arc(arc) => {
                    let chunks = &self.chunks;
                    arc.on_finished_all(order.iter().rev().filter_map(|&e| {
                        let entry = &st.entries[e as usize];
                        let slot = chunks.find_hinted(&entry.key, entry.slot)?;
                        let reused = entry.flags & REUSED != 0;
                        let inserted_only = entry.flags & INSERTED != 0 && !reused;
                        Some((slot, inserted_only, reused))
                    }));
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
            lru.drop_request(&mut st.rank, ri, &mut st.displaced, self.chunks.keys());
        }
        self.requests.release(req);
        Ok(())
    }

    /// Requests currently live.
    #[must_use]
    pub fn live_requests(&self) -> usize {
        self.requests.live()
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
    /// scheduler step): a second call right after reports no samples.
    pub fn take_stats(&mut self) -> ManagerStats {
        let sizes = self.alloc_sizes.clone();
        self.alloc_sizes.clear();
        let skipped = self.tracker.is_some().then_some(self.stores_skipped);
        self.stores_skipped = 0;
        let allocation_failures = core::mem::take(&mut self.alloc_failures);
        let config_info = (!self.info_reported).then(|| self.config_info());
        self.info_reported = true;
        ManagerStats {
            allocation_failures,
            config_info,
            num_used: u64::from(self.chunks.pool.len() - self.evictable),
            write_pending: u64::from(self.write_pending),
            num_chunks: u64::from(self.cfg.num_chunks),
            allocation_sizes: sizes,
            stores_skipped: skipped,
        }
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

    /// [`take_stats`](Self::take_stats) as vLLM's manager payload (see
    /// [`ManagerStats::to_step_payload`] for what a whole scheduler step reports).
    pub fn take_stats_payload(&mut self) -> crate::stats::Payload {
        self.take_stats().to_payload()
    }

    /// Passes every key the manager still holds to `f`: resident keys, ARC's ghost keys,
    /// the reuse tracker's keys, the keys of live requests and of undrained events. A key may
    /// be passed more than once; the order is unspecified.
    ///
    /// A caller that maps large keys to compact ones (for example interned ids) can free the
    /// mapping of every key this does not pass: the manager will never return it again, and
    /// a later equal key may get a new compact key.
    ///
    /// ```
    /// use kvtier_core::manager::{ManagerConfig, OffloadManager, StorePlan};
    ///
    /// let mut m: OffloadManager<u64> = OffloadManager::new(ManagerConfig::new(1)).unwrap();
    /// let req = m.on_new_request().unwrap();
    /// m.prepare_store(req, &[7], None, &mut StorePlan::new()).unwrap();
    /// let mut held = Vec::new();
    /// m.for_each_held_key(|k| held.push(*k));
    /// held.sort_unstable();
    /// held.dedup();
    /// assert_eq!(held, [7]);
    /// ```
    pub fn for_each_held_key(&self, mut f: impl FnMut(&K)) {
        self.chunks.for_each_key(&mut f);
        if let Policy::Arc(a) = &self.policy {
            a.for_each_ghost(self.chunks.pool.table(), &mut f);
        }
        if let Some(t) = &self.tracker {
            t.for_each_key(&mut f);
        }
        self.requests.for_each_key(&mut f);
        if let Some(ev) = &self.events {
            ev.for_each_key(&mut f);
        }
    }

    /// Runs the by-slot form `f` of a call on the slots of `keys` (`u32::MAX` for an absent
    /// key, which no slot form accepts as a chunk), in the reused `s_resolve` buffer.
    fn by_slot<R>(&mut self, keys: &[K], f: impl FnOnce(&mut Self, &[u32]) -> R) -> R {
        let mut slots = core::mem::take(&mut self.s_resolve);
        slots.clear();
        slots.extend(keys.iter().map(|k| self.chunks.find(k).unwrap_or(NIL)));
        let result = f(self, &slots);
        self.s_resolve = slots;
        result
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
