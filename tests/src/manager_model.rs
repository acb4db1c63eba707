//! Operation enum and reference model for the [`OffloadManager`], shared by the model-based
//! proptest (`tests/tests/manager/manager_model.rs`) and fuzz targets.
//!
//! * [`Op`] covers every manager call over a small universe: keys `0..KEYS` (key `i` is
//!   `BlockKey::new(i, i % 2)`, so two KV-cache groups take part) and request handle slots
//!   `0..SLOTS`. Out-of-range indices wrap, so any decoded bytes make a valid op.
//! * [`Model`] is vLLM 0.33.0's `CPUOffloadingManager` with its LRU or ARC policy and the reuse
//!   tracker, written for obviousness: `BTreeMap`s, `Vec`s and linear scans. LRU ranks are
//!   `(major, minor)` pairs in a map and eviction sorts every idle, unprotected key by
//!   `(rank, key)`; ARC keeps T1, T2, B1, B2 as vectors and its target as vLLM's `f64`.
//! * [`Real`] drives an actual `OffloadManager<BlockKey>` with the same ops and returns the same
//!   [`Outcome`] type, so a driver compares the two with `assert_eq!`; [`Snapshot`] is the
//!   observable state of either, compared after every step.
//!
//! Where kvtier returns a typed error (vLLM would assert), the model predicts the same error as
//! a [`Failure`] and changes nothing. No proptest types here: strategies live in the tests.

use std::collections::{BTreeMap, BTreeSet};

use kvtier_core::BlockKey;

use crate::store::{outcome, store_or_no_room};
use kvtier_core::manager::{
    ChunkState, CompleteLoadError, ConfigError, EventKind, LoadError, LookupResult, ManagerConfig,
    OffloadManager, PolicyKind, PositionError, RequestError, RequestId, StoreError,
};

/// vLLM's bucket bounds of `vllm:kv_offload_cpu_allocation_size` (chunks per store).
pub const ALLOCATION_SIZE_BOUNDS: [u64; 10] =
    [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262_144];

/// Keys in the universe.
pub const KEYS: u8 = 12;
/// Request handle slots.
pub const SLOTS: usize = 4;

/// The manager key for key id `i` (group `i % 2`; `BlockKey` order agrees with id order).
#[must_use]
pub fn key(i: u8) -> BlockKey {
    BlockKey::new(u64::from(i % KEYS), u32::from(i % KEYS % 2))
}

/// The key id of a manager key from the universe (`u8::MAX` for a foreign key).
#[must_use]
pub fn id(k: &BlockKey) -> u8 {
    u8::try_from(k.hash).unwrap_or(u8::MAX)
}

fn norm(keys: &[u8]) -> Vec<u8> {
    keys.iter().map(|&k| k % KEYS).collect()
}

fn slot_index(slot: u8) -> usize {
    usize::from(slot) % SLOTS
}

/// The manager configuration under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `num_chunks`.
    pub capacity: u32,
    /// The eviction policy (the [`Model`] implements LRU only).
    pub policy: PolicyKind,
    /// `store_threshold` (≥ 2 turns the reuse filter on).
    pub store_threshold: u32,
    /// `max_tracker_size`.
    pub max_tracker_size: u32,
    /// `max_event_keys` (events are always enabled).
    pub max_event_keys: u32,
    /// `max_requests`.
    pub max_requests: u32,
}

impl Config {
    /// The [`ManagerConfig`] for this configuration, events on.
    #[must_use]
    pub fn manager_config(&self) -> ManagerConfig {
        let mut c = ManagerConfig::new(self.capacity);
        c.policy = self.policy;
        c.store_threshold = self.store_threshold;
        c.max_tracker_size = self.max_tracker_size;
        c.enable_events = true;
        c.max_event_keys = self.max_event_keys;
        c.max_requests = self.max_requests;
        c
    }

    fn filter(&self) -> bool {
        self.store_threshold >= 2
    }
}

/// One manager call. Key ids are taken modulo [`KEYS`], slots modulo [`SLOTS`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Op {
    /// `on_new_request`; the handle goes into `slot` (replacing, not finishing, its old one).
    NewRequest {
        /// Handle slot.
        slot: u8,
    },
    /// `on_request_finished` of the handle in `slot`.
    Finish {
        /// Handle slot.
        slot: u8,
    },
    /// `drop_request` of the handle in `slot`.
    Drop {
        /// Handle slot.
        slot: u8,
    },
    /// `lookup(key)`.
    Lookup {
        /// Key id.
        key: u8,
    },
    /// `prepare_store(handle, keys, positions)`.
    PrepareStore {
        /// Handle slot.
        slot: u8,
        /// Offered key ids.
        keys: Vec<u8>,
        /// End-token positions (any length: a wrong one is an error).
        positions: Option<Vec<u64>>,
    },
    /// `complete_store(keys, Stored or Failed)`.
    CompleteStore {
        /// Key ids.
        keys: Vec<u8>,
        /// Whether the transfer succeeded.
        success: bool,
    },
    /// `prepare_load(handle, keys, positions)`.
    PrepareLoad {
        /// Handle slot.
        slot: u8,
        /// Key ids.
        keys: Vec<u8>,
        /// End-token positions.
        positions: Option<Vec<u64>>,
    },
    /// `complete_load(keys)`.
    CompleteLoad {
        /// Key ids.
        keys: Vec<u8>,
    },
    /// `touch(keys)`.
    Touch {
        /// Key ids.
        keys: Vec<u8>,
    },
    /// `reset_cache()`.
    ResetCache,
    /// `take_stats()`.
    GetStats,
    /// `take_events()`.
    TakeEvents,
}

/// A typed error of the manager, without the request handle's internal numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The handle is not live (`RequestError::Unknown`).
    UnknownRequest,
    /// `RequestError::TooManyRequests`.
    TooManyRequests {
        /// The configured limit.
        max_requests: u32,
    },
    /// `PositionError::LengthMismatch`.
    LengthMismatch {
        /// Keys given.
        keys: usize,
        /// Positions given.
        positions: usize,
    },
    /// `PositionError::TooLarge`.
    PositionTooLarge {
        /// Index of the position.
        index: usize,
    },
    /// `StoreError::DuplicateKey`.
    DuplicateKey {
        /// Index of the repeat.
        index: usize,
    },
    /// `LoadError::NotPresent` or `CompleteLoadError::NotPresent`.
    NotPresent {
        /// Index of the key.
        index: usize,
    },
    /// `LoadError::NotReady`.
    NotReady {
        /// Index of the key.
        index: usize,
    },
    /// `CompleteLoadError::NotPinned`.
    NotPinned {
        /// Index of the key.
        index: usize,
    },
    /// `LoadError::TooManyPins` (unreachable at model scale).
    TooManyPins {
        /// Index of the key.
        index: usize,
    },
    /// An error this model does not know (the model never returns it, so it always shows as
    /// a mismatch).
    Unknown,
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Unknown(_) => Failure::UnknownRequest,
            RequestError::TooManyRequests { max_requests } => {
                Failure::TooManyRequests { max_requests }
            }
            _ => Failure::Unknown,
        }
    }
}

impl From<PositionError> for Failure {
    fn from(e: PositionError) -> Self {
        match e {
            PositionError::LengthMismatch { keys, positions } => {
                Failure::LengthMismatch { keys, positions }
            }
            PositionError::TooLarge { index } => Failure::PositionTooLarge { index },
            _ => Failure::Unknown,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Request(r) => r.into(),
            StoreError::DuplicateKey { index } => Failure::DuplicateKey { index },
            StoreError::Positions(p) => p.into(),
            _ => Failure::Unknown,
        }
    }
}

impl From<LoadError> for Failure {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Request(r) => r.into(),
            LoadError::NotPresent { index } => Failure::NotPresent { index },
            LoadError::NotReady { index } => Failure::NotReady { index },
            LoadError::TooManyPins { index } => Failure::TooManyPins { index },
            LoadError::Positions(p) => p.into(),
            _ => Failure::Unknown,
        }
    }
}

impl From<CompleteLoadError> for Failure {
    fn from(e: CompleteLoadError) -> Self {
        match e {
            CompleteLoadError::NotPresent { index } => Failure::NotPresent { index },
            CompleteLoadError::NotPinned { index } => Failure::NotPinned { index },
            _ => Failure::Unknown,
        }
    }
}

/// What `prepare_store` decided, as key ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreDecision {
    /// Keys to store, in offer order.
    pub keys: Vec<u8>,
    /// Their slots.
    pub slots: Vec<u32>,
    /// Evicted keys, in victim order.
    pub evicted: Vec<u8>,
}

/// One drained `take_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// `num_used`.
    pub num_used: u64,
    /// `write_pending`.
    pub write_pending: u64,
    /// `num_chunks`.
    pub num_chunks: u64,
    /// Allocation-size histogram: per-bucket counts over [`ALLOCATION_SIZE_BOUNDS`] then `+Inf`.
    pub size_buckets: Vec<u64>,
    /// Allocation-size observations.
    pub size_count: u64,
    /// Their sum.
    pub size_sum: u64,
    /// `stores_skipped` (`None` without the filter).
    pub stores_skipped: Option<u64>,
}

/// The result of one [`Op`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `on_new_request`, `on_request_finished`, `drop_request`.
    Request(Result<(), Failure>),
    /// `lookup`.
    Lookup(LookupResult),
    /// `prepare_store`: `Ok(None)` for [`StoreError::NoRoom`].
    Store(Result<Option<StoreDecision>, Failure>),
    /// `prepare_load`: the slots in key order.
    Load(Result<Vec<u32>, Failure>),
    /// `complete_load`.
    CompleteLoad(Result<(), Failure>),
    /// `complete_store`, `touch`, `reset_cache`.
    Done,
    /// `take_stats`.
    Stats(StatsSnapshot),
    /// `take_events`, as key ids.
    Events(Vec<(EventKind, Vec<u8>)>),
}

impl Outcome {
    /// Whether the op returned a typed error (the manager must then be unchanged).
    #[must_use]
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Outcome::Request(Err(_))
                | Outcome::Store(Err(_))
                | Outcome::Load(Err(_))
                | Outcome::CompleteLoad(Err(_))
        )
    }
}

/// The observable state of a manager (real or model), compared after every step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// `chunk(key)` for every key of the universe.
    pub chunks: Vec<Option<(u32, ChunkState)>>,
    /// `allocated()`.
    pub allocated: u32,
    /// `free_chunks()`.
    pub free: u32,
    /// `evictable()`.
    pub evictable: u32,
    /// `write_pending()`.
    pub write_pending: u32,
    /// `live_requests()`.
    pub live_requests: usize,
    /// `tracker_count(key)` for every key of the universe.
    pub tracker_counts: Vec<u32>,
    /// `tracker_len()`.
    pub tracker_len: u32,
    /// `stores_skipped_undrained()`.
    pub stores_skipped: u64,
    /// `events_dropped()`.
    pub events_dropped: (u64, u64),
    /// `eviction_order()` as key ids (LRU: rank order; ARC: T1 then T2, least recent first).
    pub eviction_order: Vec<u8>,
    /// ARC only: the adaptive target's bits and the ghost lists' lengths `(|B1|, |B2|)`.
    pub arc: Option<(u64, u32, u32)>,
}

// ----------------------------------------------------------------------------------------------
// The real manager.

/// An `OffloadManager<BlockKey>` plus the handles of [`SLOTS`] request slots.
#[derive(Debug)]
pub struct Real {
    /// The manager under test.
    pub manager: OffloadManager<BlockKey>,
    handles: [Option<RequestId>; SLOTS],
}

/// A handle that names no request (for a slot that never held one).
const NO_REQUEST: u64 = u64::MAX;

impl Real {
    /// A manager built from `cfg`.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is out of range.
    pub fn new(cfg: &Config) -> Result<Self, ConfigError> {
        Ok(Real {
            manager: OffloadManager::new(cfg.manager_config())?,
            handles: [None; SLOTS],
        })
    }

    fn handle(&self, slot: u8) -> RequestId {
        self.handles[slot_index(slot)].unwrap_or(RequestId::from_u64(NO_REQUEST))
    }

    /// Runs `op` on the manager.
    pub fn apply(&mut self, op: &Op) -> Outcome {
        let ks = |ids: &[u8]| ids.iter().map(|&i| key(i)).collect::<Vec<_>>();
        let m = &mut self.manager;
        match op {
            Op::NewRequest { slot } => Outcome::Request(match m.on_new_request() {
                Ok(h) => {
                    self.handles[slot_index(*slot)] = Some(h);
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }),
            Op::Finish { slot } => {
                let h = self.handle(*slot);
                Outcome::Request(self.manager.on_request_finished(h).map_err(Into::into))
            }
            Op::Drop { slot } => {
                let h = self.handle(*slot);
                Outcome::Request(self.manager.drop_request(h).map_err(Into::into))
            }
            Op::Lookup { key: k } => Outcome::Lookup(m.lookup(&key(*k))),
            Op::PrepareStore {
                slot,
                keys,
                positions,
            } => {
                let h = self.handle(*slot);
                let r = store_or_no_room(&mut self.manager, h, &ks(keys), positions.as_deref());
                Outcome::Store(match r {
                    Ok(Some(o)) => Ok(Some(StoreDecision {
                        keys: o.keys().iter().map(id).collect(),
                        slots: o.slots().to_vec(),
                        evicted: o.evicted().iter().map(id).collect(),
                    })),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e.into()),
                })
            }
            // Odd-length calls go through the by-slot forms, with the slots the manager holds
            // the keys in (an absent key: no slot), which must behave exactly as the keys do.
            Op::CompleteStore { keys, success } if keys.len() % 2 == 1 => {
                let slots: Vec<u32> = ks(keys)
                    .iter()
                    .filter_map(|k| m.inspect().chunk(k).map(|(s, _)| s))
                    .collect();
                m.complete_store_slots(&slots, outcome(*success));
                Outcome::Done
            }
            Op::CompleteStore { keys, success } => {
                m.complete_store(&ks(keys), outcome(*success));
                Outcome::Done
            }
            Op::PrepareLoad {
                slot,
                keys,
                positions,
            } if keys.len() % 2 == 1 => {
                let h = self.handle(*slot);
                let keys = ks(keys);
                let slots: Vec<u32> = keys
                    .iter()
                    .map(|k| self.manager.inspect().chunk(k).map_or(u32::MAX, |(s, _)| s))
                    .collect();
                let r = self
                    .manager
                    .prepare_load_slots(h, &keys, &slots, positions.as_deref());
                Outcome::Load(r.map(<[u32]>::to_vec).map_err(Into::into))
            }
            Op::PrepareLoad {
                slot,
                keys,
                positions,
            } => {
                let h = self.handle(*slot);
                let r = self
                    .manager
                    .prepare_load(h, &ks(keys), positions.as_deref());
                Outcome::Load(r.map(<[u32]>::to_vec).map_err(Into::into))
            }
            Op::CompleteLoad { keys } if keys.len() % 2 == 1 => {
                let slots: Vec<u32> = ks(keys)
                    .iter()
                    .map(|k| m.inspect().chunk(k).map_or(u32::MAX, |(s, _)| s))
                    .collect();
                Outcome::CompleteLoad(m.complete_load_slots(&slots).map_err(Into::into))
            }
            Op::CompleteLoad { keys } => {
                Outcome::CompleteLoad(m.complete_load(&ks(keys)).map_err(Into::into))
            }
            Op::Touch { keys } => {
                m.touch(&ks(keys));
                Outcome::Done
            }
            Op::ResetCache => {
                m.reset_cache();
                Outcome::Done
            }
            Op::GetStats => {
                let s = m.take_stats();
                Outcome::Stats(StatsSnapshot {
                    num_used: s.num_used,
                    write_pending: s.write_pending,
                    num_chunks: s.num_chunks,
                    size_buckets: s.allocation_sizes.bucket_counts().to_vec(),
                    size_count: s.allocation_sizes.count(),
                    size_sum: s.allocation_sizes.sum(),
                    stores_skipped: s.stores_skipped,
                })
            }
            Op::TakeEvents => Outcome::Events(
                m.take_events()
                    .into_iter()
                    .map(|(kind, keys)| (kind, keys.iter().map(id).collect()))
                    .collect(),
            ),
        }
    }

    /// The manager's observable state over the key universe.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let m = &self.manager;
        Snapshot {
            chunks: (0..KEYS).map(|i| m.inspect().chunk(&key(i))).collect(),
            allocated: m.inspect().allocated(),
            free: m.inspect().free_chunks(),
            evictable: m.inspect().evictable(),
            write_pending: m.inspect().write_pending(),
            live_requests: m.live_requests(),
            tracker_counts: (0..KEYS)
                .map(|i| m.inspect().tracker_count(&key(i)))
                .collect(),
            tracker_len: m.inspect().tracker_len(),
            stores_skipped: m.inspect().stores_skipped_undrained(),
            events_dropped: m.events_dropped(),
            eviction_order: m.inspect().eviction_order().iter().map(id).collect(),
            arc: m
                .inspect()
                .arc_target()
                .zip(m.inspect().arc_sizes())
                .map(|(t, (_, _, b1, b2))| (t.to_bits(), b1, b2)),
        }
    }
}

// ----------------------------------------------------------------------------------------------
// The reference model.

/// A resident chunk: its slot and `ref_cnt` (−1 pending, 0 idle, k pinned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    slot: u32,
    ref_cnt: i32,
}

/// vLLM's `_RequestCacheAccess`: what one request observed in one cache generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Access {
    generation: u64,
    /// Seen keys in first-observed order.
    seen: Vec<u8>,
    inserted: BTreeSet<u8>,
    reused: BTreeSet<u8>,
    store_miss: BTreeSet<u8>,
}

/// A request: its positions (vLLM's request context), its access state and its LRU rank.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Request {
    live: bool,
    positions: BTreeMap<u8, u64>,
    access: Access,
    /// `(cache generation, major)` of the request's LRU rank.
    rank: Option<(u64, u64)>,
}

/// Reference model of vLLM 0.33.0's CPU offloading manager with the LRU policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    cfg: Config,
    /// Slot ids handed out since the last reset: `0..fresh`.
    fresh: u32,
    /// Freed slot ids; the last is reused first.
    free: Vec<u32>,
    chunks: BTreeMap<u8, Chunk>,
    /// LRU ranks of resident keys.
    ranks: BTreeMap<u8, (u64, i64)>,
    /// ARC's lists when the policy is ARC (the LRU ranks are then kept but unused).
    arc: Option<ArcModel>,
    next_rank: u64,
    cache_generation: u64,
    /// Reuse tracker, least recently offered first.
    tracker: Vec<(u8, u32)>,
    stores_skipped: u64,
    alloc_samples: Vec<u64>,
    events: Vec<(EventKind, Vec<u8>)>,
    events_dropped: (u64, u64),
    requests: Vec<Request>,
    handles: [Option<usize>; SLOTS],
}

impl Model {
    /// An empty manager built from `cfg`, with vLLM's LRU or ARC policy as `cfg.policy` says.
    #[must_use]
    pub fn new(cfg: Config) -> Self {
        Model {
            cfg,
            fresh: 0,
            free: Vec::new(),
            chunks: BTreeMap::new(),
            ranks: BTreeMap::new(),
            arc: (cfg.policy == PolicyKind::Arc).then(|| ArcModel::new(cfg.capacity)),
            next_rank: 0,
            cache_generation: 0,
            tracker: Vec::new(),
            stores_skipped: 0,
            alloc_samples: Vec::new(),
            events: Vec::new(),
            events_dropped: (0, 0),
            requests: Vec::new(),
            handles: [None; SLOTS],
        }
    }

    /// The model's observable state.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let tracked = |k: u8| {
            self.tracker
                .iter()
                .find(|(t, _)| *t == k)
                .map_or(0, |&(_, c)| c)
        };
        let order: Vec<u8> = match &self.arc {
            Some(arc) => arc.t1.iter().chain(&arc.t2).copied().collect(),
            None => {
                let mut order: Vec<u8> = self.ranks.keys().copied().collect();
                order.sort_by_key(|k| (self.ranks[k], *k));
                order
            }
        };
        Snapshot {
            chunks: (0..KEYS)
                .map(|k| {
                    self.chunks.get(&k).map(|c| {
                        let state = match c.ref_cnt {
                            -1 => ChunkState::Pending,
                            0 => ChunkState::Idle,
                            r => ChunkState::Pinned(r.unsigned_abs()),
                        };
                        (c.slot, state)
                    })
                })
                .collect(),
            allocated: self.count(|c| c.ref_cnt >= -1),
            free: self.free_count(),
            evictable: self.count(|c| c.ref_cnt == 0),
            write_pending: self.count(|c| c.ref_cnt == -1),
            live_requests: self.requests.iter().filter(|r| r.live).count(),
            tracker_counts: (0..KEYS).map(tracked).collect(),
            tracker_len: u32::try_from(self.tracker.len()).unwrap_or(u32::MAX),
            stores_skipped: self.stores_skipped,
            events_dropped: self.events_dropped,
            eviction_order: order,
            arc: self.arc.as_ref().map(|a| {
                let len = |v: &Vec<u8>| u32::try_from(v.len()).unwrap_or(u32::MAX);
                (a.target.to_bits(), len(&a.b1), len(&a.b2))
            }),
        }
    }

    fn count(&self, f: impl Fn(&Chunk) -> bool) -> u32 {
        u32::try_from(self.chunks.values().filter(|c| f(c)).count()).unwrap_or(u32::MAX)
    }

    fn free_count(&self) -> u32 {
        self.cfg.capacity - self.fresh + u32::try_from(self.free.len()).unwrap_or(u32::MAX)
    }

    /// The live request in `slot`, if any.
    fn live(&self, slot: u8) -> Option<usize> {
        self.handles[slot_index(slot)].filter(|&r| self.requests[r].live)
    }

    /// vLLM's `_get_request_cache_access`: state from an older cache generation is replaced.
    fn access(&mut self, r: usize) -> &mut Access {
        let generation = self.cache_generation;
        let a = &mut self.requests[r].access;
        if a.generation != generation {
            *a = Access {
                generation,
                ..Access::default()
            };
        }
        a
    }

    // ----- LRU policy -----

    fn fresh_rank(&mut self) -> (u64, i64) {
        self.next_rank += 1;
        (self.next_rank, 0)
    }

    fn request_rank(&mut self, r: usize) -> u64 {
        match self.requests[r].rank {
            Some((g, major)) if g == self.cache_generation => major,
            _ => {
                self.next_rank += 1;
                self.requests[r].rank = Some((self.cache_generation, self.next_rank));
                self.next_rank
            }
        }
    }

    fn refresh(&mut self, k: u8) {
        if self.chunks.contains_key(&k) {
            let rank = self.fresh_rank();
            self.ranks.insert(k, rank);
        }
    }

    fn on_request_access(&mut self, r: usize, new_keys: &[u8]) {
        let major = self.request_rank(r);
        for k in new_keys {
            let Some(&p) = self.requests[r].positions.get(k) else {
                continue;
            };
            let Some(&old) = self.ranks.get(k) else {
                continue;
            };
            let rank = (major, -i64::try_from(p).unwrap_or(i64::MAX));
            if old < rank {
                self.ranks.insert(*k, rank);
            }
        }
    }

    /// `need` victims (ARC: its scanners, moving them to the ghost lists); LRU: the smallest
    /// `(rank, key)` among idle keys not in `protected`.
    fn evict(&mut self, need: usize, protected: &[u8]) -> Option<Vec<u8>> {
        if let Some(arc) = &mut self.arc {
            let chunks = &self.chunks;
            let eligible =
                |k: u8| chunks.get(&k).is_some_and(|c| c.ref_cnt == 0) && !protected.contains(&k);
            return arc.evict(need, eligible);
        }
        let mut idle: Vec<u8> = self
            .chunks
            .iter()
            .filter(|(k, c)| c.ref_cnt == 0 && !protected.contains(k))
            .map(|(k, _)| *k)
            .collect();
        idle.sort_by_key(|k| (self.ranks[k], *k));
        (idle.len() >= need).then(|| idle[..need].to_vec())
    }

    // ----- manager -----

    fn record_access(&mut self, r: usize, keys: &[u8], reused: &[u8]) {
        let a = self.access(r);
        let mut new_keys = Vec::new();
        for &k in keys {
            if !a.seen.contains(&k) {
                a.seen.push(k);
                new_keys.push(k);
            }
        }
        for &k in reused {
            if !a.inserted.contains(&k) {
                a.reused.insert(k);
            }
        }
        if !new_keys.is_empty() {
            self.on_request_access(r, &new_keys);
        }
    }

    fn tracker_record(&mut self, keys: &[u8]) {
        let mut protected = 0;
        for &k in keys {
            if let Some(i) = self.tracker.iter().position(|(t, _)| *t == k) {
                let (t, c) = self.tracker.remove(i);
                self.tracker.push((t, c + 1));
                protected += 1;
            }
        }
        let mut unprotected = self.tracker.len() - protected;
        for &k in keys {
            if self.tracker.iter().any(|(t, _)| *t == k) {
                continue;
            }
            if self.tracker.len() >= self.cfg.max_tracker_size as usize {
                if unprotected == 0 {
                    continue;
                }
                self.tracker.remove(0);
                unprotected -= 1;
            }
            self.tracker.push((k, 1));
        }
    }

    fn push_event(&mut self, kind: EventKind, keys: Vec<u8>) {
        if keys.is_empty() {
            return;
        }
        let used: usize = self.events.iter().map(|(_, k)| k.len()).sum();
        if used + keys.len() > self.cfg.max_event_keys as usize {
            self.events_dropped.0 += 1;
            self.events_dropped.1 += keys.len() as u64;
        } else {
            self.events.push((kind, keys));
        }
    }

    fn check_positions(keys: &[u8], positions: Option<&Vec<u64>>) -> Result<(), Failure> {
        let Some(p) = positions else { return Ok(()) };
        if p.len() != keys.len() {
            return Err(Failure::LengthMismatch {
                keys: keys.len(),
                positions: p.len(),
            });
        }
        match p.iter().position(|&v| i64::try_from(v).is_err()) {
            Some(index) => Err(Failure::PositionTooLarge { index }),
            None => Ok(()),
        }
    }

    fn set_positions(&mut self, r: usize, keys: &[u8], positions: Option<&Vec<u64>>) {
        if let Some(p) = positions {
            for (&k, &v) in keys.iter().zip(p) {
                self.requests[r].positions.insert(k, v);
            }
        }
    }

    fn prepare_store(
        &mut self,
        slot: u8,
        keys: &[u8],
        positions: Option<&Vec<u64>>,
    ) -> Result<Option<StoreDecision>, Failure> {
        Self::check_positions(keys, positions)?;
        let r = self.live(slot).ok_or(Failure::UnknownRequest)?;
        self.access(r);
        for (index, k) in keys.iter().enumerate() {
            if keys[..index].contains(k) {
                return Err(Failure::DuplicateKey { index });
            }
        }
        self.set_positions(r, keys, positions);
        // 1. The tracker counts the whole offer.
        if self.cfg.filter() {
            self.tracker_record(keys);
        }
        // 2. Partition.
        let mut candidates = Vec::new();
        let mut ready = Vec::new();
        for &k in keys {
            match self.chunks.get(&k) {
                None => candidates.push(k),
                Some(c) if c.ref_cnt >= 0 => ready.push(k),
                Some(_) => {}
            }
        }
        // 3. The reuse filter.
        if self.cfg.filter() {
            let before = candidates.len();
            let threshold = self.cfg.store_threshold;
            let tracker = &self.tracker;
            candidates.retain(|k| tracker.iter().any(|&(t, c)| t == *k && c >= threshold));
            self.stores_skipped += (before - candidates.len()) as u64;
        }
        // 4. Store misses this request has not reported yet (only ARC reacts: ghost hits).
        let a = self.access(r);
        let new_misses: Vec<u8> = candidates
            .iter()
            .copied()
            .filter(|k| !a.store_miss.contains(k))
            .collect();
        a.store_miss.extend(candidates.iter().copied());
        if let Some(arc) = &mut self.arc {
            for &k in new_misses.iter().rev() {
                arc.adapt(k);
            }
        }
        // 5. The request's access, in offer order.
        let recorded: Vec<u8> = keys
            .iter()
            .copied()
            .filter(|k| candidates.contains(k) || ready.contains(k))
            .collect();
        self.record_access(r, &recorded, &ready);
        // 6.
        if candidates.is_empty() {
            return Ok(Some(StoreDecision::default()));
        }
        // 7.
        self.alloc_samples.push(candidates.len() as u64);
        // 8. Make room.
        let mut evicted = Vec::new();
        let free = self.free_count() as usize;
        if candidates.len() > free {
            let need = candidates.len() - free;
            if need > self.count(|c| c.ref_cnt == 0) as usize {
                return Ok(None);
            }
            let Some(victims) = self.evict(need, keys) else {
                return Ok(None);
            };
            for v in victims {
                if let Some(c) = self.chunks.remove(&v) {
                    self.free.push(c.slot);
                }
                self.ranks.remove(&v);
                evicted.push(v);
            }
            self.push_event(EventKind::Removed, evicted.clone());
        }
        // 9. Allocate: fresh ids first, then the free stack's top.
        let mut slots = Vec::new();
        for &k in &candidates {
            let s = if self.fresh < self.cfg.capacity {
                self.fresh += 1;
                self.fresh - 1
            } else {
                self.free.pop().unwrap_or(u32::MAX)
            };
            self.chunks.insert(
                k,
                Chunk {
                    slot: s,
                    ref_cnt: -1,
                },
            );
            let rank = match self.requests[r].positions.get(&k) {
                None => self.fresh_rank(),
                Some(&p) => (self.request_rank(r), -i64::try_from(p).unwrap_or(i64::MAX)),
            };
            self.ranks.insert(k, rank);
            if let Some(arc) = &mut self.arc {
                arc.insert(k);
            }
            self.access(r).inserted.insert(k);
            slots.push(s);
        }
        Ok(Some(StoreDecision {
            keys: candidates,
            slots,
            evicted,
        }))
    }

    fn complete_store(&mut self, keys: &[u8], success: bool) {
        let mut done = Vec::new();
        for &k in keys {
            let Some(c) = self.chunks.get_mut(&k) else {
                continue;
            };
            if c.ref_cnt != -1 {
                continue;
            }
            if success {
                c.ref_cnt = 0;
            } else {
                let s = c.slot;
                self.chunks.remove(&k);
                self.ranks.remove(&k);
                if let Some(arc) = &mut self.arc {
                    arc.remove(k);
                }
                self.free.push(s);
            }
            done.push(k);
        }
        let kind = if success {
            EventKind::Stored
        } else {
            EventKind::RemovedMetadataOnly
        };
        self.push_event(kind, done);
    }

    fn prepare_load(
        &mut self,
        slot: u8,
        keys: &[u8],
        positions: Option<&Vec<u64>>,
    ) -> Result<Vec<u32>, Failure> {
        Self::check_positions(keys, positions)?;
        let r = self.live(slot).ok_or(Failure::UnknownRequest)?;
        self.access(r);
        for (index, k) in keys.iter().enumerate() {
            match self.chunks.get(k) {
                None => return Err(Failure::NotPresent { index }),
                Some(c) if c.ref_cnt < 0 => return Err(Failure::NotReady { index }),
                Some(_) => {}
            }
        }
        let mut slots = Vec::new();
        for k in keys {
            if let Some(c) = self.chunks.get_mut(k) {
                c.ref_cnt += 1;
                slots.push(c.slot);
            }
        }
        self.set_positions(r, keys, positions);
        self.record_access(r, keys, keys);
        Ok(slots)
    }

    fn complete_load(&mut self, keys: &[u8]) -> Result<(), Failure> {
        let mut after: BTreeMap<u8, i32> = BTreeMap::new();
        for (index, k) in keys.iter().enumerate() {
            let Some(c) = self.chunks.get(k) else {
                return Err(Failure::NotPresent { index });
            };
            let r = after.entry(*k).or_insert(c.ref_cnt);
            if *r <= 0 {
                return Err(Failure::NotPinned { index });
            }
            *r -= 1;
        }
        for (k, r) in after {
            if let Some(c) = self.chunks.get_mut(&k) {
                c.ref_cnt = r;
            }
        }
        Ok(())
    }

    /// vLLM's head-to-tail order of a request's keys: per KV group (ascending) in
    /// first-observed order, a group sorted by position when all its keys have one; then the
    /// whole list stably sorted by position when every key has one.
    fn request_order(&self, r: usize) -> Vec<u8> {
        let req = &self.requests[r];
        let pos = |k: &u8| req.positions.get(k).copied();
        let mut out = Vec::new();
        for group in 0..2 {
            let mut g: Vec<u8> = req
                .access
                .seen
                .iter()
                .copied()
                .filter(|k| k % 2 == group)
                .collect();
            if g.iter().all(|k| pos(k).is_some()) {
                g.sort_by_key(|k| pos(k));
            }
            out.extend(g);
        }
        if out.iter().all(|k| pos(k).is_some()) {
            out.sort_by_key(|k| pos(k));
        }
        out
    }

    fn finish(&mut self, slot: u8) -> Result<(), Failure> {
        let r = self.live(slot).ok_or(Failure::UnknownRequest)?;
        if self.requests[r].access.generation == self.cache_generation {
            let order = self.request_order(r);
            let a = &self.requests[r].access;
            match &mut self.arc {
                Some(arc) => {
                    for k in order.into_iter().rev() {
                        let reused = a.reused.contains(&k);
                        arc.on_finished(k, a.inserted.contains(&k) && !reused, reused);
                    }
                }
                None => {
                    for k in order.into_iter().rev() {
                        self.refresh(k);
                    }
                }
            }
        }
        self.requests[r].live = false;
        Ok(())
    }

    /// Runs `op` on the model.
    pub fn apply(&mut self, op: &Op) -> Outcome {
        match op {
            Op::NewRequest { slot } => {
                let live = self.requests.iter().filter(|r| r.live).count();
                if live >= self.cfg.max_requests as usize {
                    return Outcome::Request(Err(Failure::TooManyRequests {
                        max_requests: self.cfg.max_requests,
                    }));
                }
                self.requests.push(Request {
                    live: true,
                    positions: BTreeMap::new(),
                    access: Access {
                        generation: self.cache_generation,
                        ..Access::default()
                    },
                    rank: None,
                });
                self.handles[slot_index(*slot)] = Some(self.requests.len() - 1);
                Outcome::Request(Ok(()))
            }
            Op::Finish { slot } => Outcome::Request(self.finish(*slot)),
            Op::Drop { slot } => Outcome::Request(match self.live(*slot) {
                Some(r) => {
                    self.requests[r].live = false;
                    Ok(())
                }
                None => Err(Failure::UnknownRequest),
            }),
            Op::Lookup { key } => Outcome::Lookup(match self.chunks.get(&(key % KEYS)) {
                None => LookupResult::Miss,
                Some(c) if c.ref_cnt < 0 => LookupResult::HitPending,
                Some(_) => LookupResult::Hit,
            }),
            Op::PrepareStore {
                slot,
                keys,
                positions,
            } => Outcome::Store(self.prepare_store(*slot, &norm(keys), positions.as_ref())),
            Op::CompleteStore { keys, success } => {
                self.complete_store(&norm(keys), *success);
                Outcome::Done
            }
            Op::PrepareLoad {
                slot,
                keys,
                positions,
            } => Outcome::Load(self.prepare_load(*slot, &norm(keys), positions.as_ref())),
            Op::CompleteLoad { keys } => Outcome::CompleteLoad(self.complete_load(&norm(keys))),
            Op::Touch { keys } => {
                for k in norm(keys).into_iter().rev() {
                    match &mut self.arc {
                        Some(arc) => {
                            let ready = self.chunks.get(&k).map(|c| c.ref_cnt >= 0);
                            arc.touch(k, ready);
                        }
                        None => self.refresh(k),
                    }
                }
                Outcome::Done
            }
            Op::ResetCache => {
                self.chunks.clear();
                self.ranks.clear();
                if let Some(arc) = &mut self.arc {
                    *arc = ArcModel::new(self.cfg.capacity);
                }
                self.next_rank = 0;
                self.cache_generation += 1;
                self.fresh = 0;
                self.free.clear();
                Outcome::Done
            }
            Op::GetStats => Outcome::Stats(self.take_stats()),
            Op::TakeEvents => {
                let events = core::mem::take(&mut self.events);
                let out = events
                    .into_iter()
                    .filter_map(|(kind, keys)| {
                        if kind == EventKind::RemovedMetadataOnly {
                            let keys: Vec<u8> = keys
                                .into_iter()
                                .filter(|k| !self.chunks.contains_key(k))
                                .collect();
                            (!keys.is_empty()).then_some((kind, keys))
                        } else {
                            Some((kind, keys))
                        }
                    })
                    .collect();
                Outcome::Events(out)
            }
        }
    }

    fn take_stats(&mut self) -> StatsSnapshot {
        let allocated = u64::from(self.count(|c| c.ref_cnt >= -1));
        let evictable = u64::from(self.count(|c| c.ref_cnt == 0));
        let mut buckets = vec![0u64; ALLOCATION_SIZE_BOUNDS.len() + 1];
        for &v in &self.alloc_samples {
            let i = ALLOCATION_SIZE_BOUNDS
                .iter()
                .position(|&b| v <= b)
                .unwrap_or(ALLOCATION_SIZE_BOUNDS.len());
            buckets[i] += 1;
        }
        let samples = core::mem::take(&mut self.alloc_samples);
        let skipped = core::mem::take(&mut self.stores_skipped);
        StatsSnapshot {
            num_used: allocated - evictable,
            write_pending: u64::from(self.count(|c| c.ref_cnt == -1)),
            num_chunks: u64::from(self.cfg.capacity),
            size_buckets: buckets,
            size_count: samples.len() as u64,
            size_sum: samples.iter().sum(),
            stores_skipped: self.cfg.filter().then_some(skipped),
        }
    }
}

/// vLLM 0.33.0's ARC policy, written plainly: T1, T2, B1, B2 as vectors (least recent first)
/// and the adaptive target as an `f64` updated with vLLM's operations in vLLM's order.
#[derive(Clone, Debug, PartialEq)]
struct ArcModel {
    t1: Vec<u8>,
    t2: Vec<u8>,
    b1: Vec<u8>,
    b2: Vec<u8>,
    target: f64,
    capacity: usize,
}

impl Eq for ArcModel {}

fn remove_from(list: &mut Vec<u8>, k: u8) -> bool {
    match list.iter().position(|&x| x == k) {
        Some(i) => {
            list.remove(i);
            true
        }
        None => false,
    }
}

impl ArcModel {
    fn new(capacity: u32) -> Self {
        ArcModel {
            t1: Vec::new(),
            t2: Vec::new(),
            b1: Vec::new(),
            b2: Vec::new(),
            target: 0.0,
            capacity: capacity as usize,
        }
    }

    fn insert(&mut self, k: u8) {
        self.t1.push(k);
        remove_from(&mut self.b1, k);
        remove_from(&mut self.b2, k);
    }

    fn remove(&mut self, k: u8) {
        if !remove_from(&mut self.t1, k) {
            remove_from(&mut self.t2, k);
        }
    }

    /// Python's `max(1, x)`.
    fn max_one(x: f64) -> f64 {
        if x > 1.0 { x } else { 1.0 }
    }

    fn adapt(&mut self, k: u8) {
        #[allow(clippy::cast_precision_loss, reason = "small lengths")]
        let (b1, b2, cap) = (
            self.b1.len() as f64,
            self.b2.len() as f64,
            self.capacity as f64,
        );
        if remove_from(&mut self.b1, k) {
            let t = self.target + Self::max_one(b2 / b1);
            self.target = if t <= cap { t } else { cap };
            self.b1.push(k);
        } else if remove_from(&mut self.b2, k) {
            let t = self.target - Self::max_one(b1 / b2);
            self.target = if t >= 0.0 { t } else { 0.0 };
            self.b2.push(k);
        }
    }

    /// `ready`: `None` when `k` is not resident.
    fn touch(&mut self, k: u8, ready: Option<bool>) {
        if remove_from(&mut self.t1, k) {
            if ready == Some(true) {
                self.t2.push(k);
            } else {
                self.t1.push(k);
            }
        } else if remove_from(&mut self.t2, k) {
            self.t2.push(k);
        } else {
            self.adapt(k);
        }
    }

    fn on_finished(&mut self, k: u8, insertion_only: bool, reused: bool) {
        if insertion_only {
            if remove_from(&mut self.t1, k) {
                self.t1.push(k);
            } else if remove_from(&mut self.t2, k) {
                self.t2.push(k);
            }
        } else if reused && (remove_from(&mut self.t1, k) || remove_from(&mut self.t2, k)) {
            self.t2.push(k);
        }
    }

    fn evict(&mut self, need: usize, eligible: impl Fn(u8) -> bool) -> Option<Vec<u8>> {
        let mut c1 = self.t1.iter().copied().filter(|&k| eligible(k));
        let mut c2 = self.t2.iter().copied().filter(|&k| eligible(k));
        #[allow(clippy::cast_precision_loss, reason = "small lengths")]
        let mut virtual_t1 = self.t1.len() as f64;
        let floor_target = self.target.floor();
        let mut picks: Vec<(u8, bool)> = Vec::new();
        for _ in 0..need {
            let mut pick = None;
            if virtual_t1 >= floor_target
                && let Some(k) = c1.next()
            {
                pick = Some((k, true));
                virtual_t1 -= 1.0;
            }
            if pick.is_none() {
                pick = c2.next().map(|k| (k, false));
            }
            if pick.is_none()
                && let Some(k) = c1.next()
            {
                pick = Some((k, true));
                virtual_t1 -= 1.0;
            }
            picks.push(pick?);
        }
        for &(k, from_t1) in &picks {
            if from_t1 {
                remove_from(&mut self.t1, k);
                self.b1.push(k);
            } else {
                remove_from(&mut self.t2, k);
                self.b2.push(k);
            }
        }
        for ghost in [&mut self.b1, &mut self.b2] {
            while ghost.len() > self.capacity {
                ghost.remove(0);
            }
        }
        Some(picks.into_iter().map(|(k, _)| k).collect())
    }
}
