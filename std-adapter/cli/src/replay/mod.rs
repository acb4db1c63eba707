//! The kvtrace replay protocol: drives one [`OffloadManager`] with a trace's records and counts
//! what happened.
//!
//! Per request (`docs/formats/kvtrace.md`): on `L`, a new request context, then `lookup` of the keys in
//! order while they are HITs; `k` leading hits are loaded (`prepare_load`) and `k` is folded
//! into the hit digest. On `S`, the loads complete and the rest of the keys are offered
//! (`prepare_store`); `NoRoom` counts a store failure. On `C`, the stored keys complete and the
//! request finishes. Key of block `i`: its hash in group 0, end-token position
//! `(i + 1) · block_tokens`.
//!
//! Around the protocol, what `kvtier replay` runs, one child module each: a whole run of a
//! trace or the built-in workload into a [`ReplayReport`] ([`replay`], with the manager of
//! [`ManagerArgs`]), the replay's own stats and transfer model ([`ReplayStats`],
//! [`TransferModel`]), the GPU front of `--gpu-blocks` ([`GpuFront`]), and the run of the
//! simple CPU offloader behind it ([`replay_simple`], [`SimpleRun`]). The offloader a run
//! drives is chosen by [`crate::tier::Offloader`].

use std::time::{Duration, Instant};

use kvtier_core::BlockKey;
use kvtier_core::hashing::Map;
use kvtier_core::manager::{
    HitScan, ManagerStats, OffloadManager, RequestError, RequestId, StoreError, StoreOutcome,
    StorePlan,
};

use crate::trace::Record;

mod error;
mod gpu;
mod manager;
mod run;
mod simple;
mod stats;

pub use error::ReplayError;
pub use gpu::{GpuFront, GpuReport};
pub(crate) use gpu::{add_gpu_series, finish as finish_engine};
pub use manager::{ManagerArgs, ManagerError, parse_policy};
pub(crate) use run::progress_bar;
pub use run::{ReplayOptions, ReplayReport, RunError, replay};
pub use simple::{SimpleReport, SimpleRun, SimpleRunError, pool_sizing, replay_simple};
pub use stats::{
    DEFAULT_TRANSFER_GBPS, ReplayStats, TransferArgs, TransferError, TransferModel,
    TransferModelError,
};

/// The multiplier of the hit digest: `d = d · 1000003 + k (mod 2^64)` per `L` record.
pub const DIGEST_MULTIPLIER: u64 = 1_000_003;

/// The longest store list whose repeated hashes are found through a bit filter on the stack
/// (longer lists go through a map).
const FILTERED_REPEAT_CHECK: usize = 256;

/// Bits of the repeat filter (a power of two, a multiple of 64).
const FILTER_BITS: usize = 1024;

/// Spreads a hash over the filter's bits (odd: a bijection of `u64`), so that structured
/// hashes (small integers in tests) do not share bits.
const FILTER_SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// What a replay counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplayCounts {
    /// `L` records replayed.
    pub requests: u64,
    /// Blocks over all requests.
    pub request_blocks: u64,
    /// Leading blocks found readable (loaded).
    pub hit_blocks: u64,
    /// Requests with at least one hit block.
    pub hit_requests: u64,
    /// Blocks `prepare_store` allocated.
    pub stored_blocks: u64,
    /// Blocks evicted to make room.
    pub evicted_blocks: u64,
    /// `prepare_store` calls that found no room (`StoreError::NoRoom`).
    pub store_failures: u64,
    /// Lookup scans that stopped at a pending (HIT_PENDING) key.
    pub stopped_at_pending: u64,
    /// Candidates rejected by the reuse filter over the run (`None` without a filter).
    pub stores_skipped: Option<u64>,
    /// The hit digest.
    pub digest: u64,
}

impl ReplayCounts {
    /// `hit_blocks / request_blocks`, 0 for an empty replay.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
    pub fn block_hit_rate(&self) -> f64 {
        if self.request_blocks == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / self.request_blocks as f64
        }
    }

    /// `hit_requests / requests`, 0 for an empty replay.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
    pub fn request_hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hit_requests as f64 / self.requests as f64
        }
    }
}

/// The default of [`Replayer::with_max_open_blocks`]: 16,777,216 blocks over the requests
/// open at once (12 B each in the replayer's arena).
pub const DEFAULT_MAX_OPEN_BLOCKS: u64 = 1 << 24;

/// A request between its `L` and its `C`. Its hashes are `arena[start..start + held]`: all
/// of its blocks until its `S`, then the ones its store allocated; `slots[start..]` holds the
/// slots of its leading hits until its `S`, then those of its stored blocks.
#[derive(Clone, Copy, Debug)]
struct Open {
    req: RequestId,
    start: usize,
    held: usize,
    blocks: u64,
    hits: usize,
    started: bool,
}

/// Replays records through a manager it owns.
///
/// Memory: the hashes and slots of the open requests sit in one arena, 12 bytes per block (the
/// arena reuses the space of completed requests; with its slack at most 4 times that), bounded by
/// [`Replayer::with_max_open_blocks`]; a small entry per open request; and scratch buffers as
/// long as the longest request. Keys ([`BlockKey`], group 0) and end-token positions are made
/// from the hashes when a manager call needs them.
#[derive(Debug)]
pub struct Replayer {
    manager: OffloadManager<BlockKey>,
    block_tokens: u64,
    max_open_blocks: u64,
    open_blocks: u64,
    open: Map<u64, Open>,
    arena: Vec<u64>,
    /// The slots parallel to `arena`.
    slots: Vec<u32>,
    /// Arena slots of completed requests (and of blocks not stored), reclaimed by compaction.
    garbage: usize,
    /// The keys of the current manager call.
    keys: Vec<BlockKey>,
    /// `positions[i] = (i + 1) · block_tokens`, as long as the longest request so far.
    positions: Vec<u64>,
    /// Hash → first block, to find a repeat in a store offer.
    seen: Map<u64, u64>,
    /// (start, rid) of the open requests, sorted to compact the arena.
    order: Vec<(usize, u64)>,
    counts: ReplayCounts,
    skipped_total: u64,
    last_lookup: Duration,
    /// The slots of the last `L`'s leading hits.
    hit_slots: Vec<u32>,
    /// The reused output of `prepare_store`.
    plan: StorePlan<BlockKey>,
    /// The most leading keys an `L`'s lookup scans ([`Replayer::set_max_hits`]).
    max_hits: usize,
}

impl Replayer {
    /// A replayer over `manager` with `block_tokens` tokens per block, holding at most
    /// [`DEFAULT_MAX_OPEN_BLOCKS`] blocks of open requests.
    #[must_use]
    pub fn new(manager: OffloadManager<BlockKey>, block_tokens: u64) -> Self {
        let filter = manager.config().filter_enabled();
        Replayer {
            manager,
            block_tokens,
            max_open_blocks: DEFAULT_MAX_OPEN_BLOCKS,
            open_blocks: 0,
            open: Map::default(),
            arena: Vec::new(),
            slots: Vec::new(),
            garbage: 0,
            keys: Vec::new(),
            positions: Vec::new(),
            seen: Map::default(),
            order: Vec::new(),
            counts: ReplayCounts {
                stores_skipped: filter.then_some(0),
                ..ReplayCounts::default()
            },
            skipped_total: 0,
            last_lookup: Duration::ZERO,
            hit_slots: Vec::new(),
            plan: StorePlan::new(),
            max_hits: usize::MAX,
        }
    }

    /// The wall time of the last `L` record's lookup scan (the `lookup` calls up to the first
    /// key that is not a HIT), what vLLM's scheduler times as one offload lookup.
    #[must_use]
    pub fn last_lookup(&self) -> Duration {
        self.last_lookup
    }

    /// The same replayer holding at most `max_open_blocks` blocks over the requests open at
    /// once (an `L` past it is [`ReplayError::TooManyOpenBlocks`]).
    #[must_use]
    pub const fn with_max_open_blocks(mut self, max_open_blocks: u64) -> Self {
        self.max_open_blocks = max_open_blocks;
        self
    }

    /// Limits the lookup scan of the next `L` records to their first `max_hits` keys (all of
    /// them by default, `usize::MAX`); the keys past the hits are still offered at `S`. A GPU
    /// in front sets it to keep a hit short of the request's last token, as vLLM does.
    pub fn set_max_hits(&mut self, max_hits: usize) {
        self.max_hits = max_hits;
    }

    /// The manager, for inspection.
    #[must_use]
    pub fn manager(&self) -> &OffloadManager<BlockKey> {
        &self.manager
    }

    /// The manager, mutably (e.g. to drain its stats).
    pub fn manager_mut(&mut self) -> &mut OffloadManager<BlockKey> {
        &mut self.manager
    }

    /// Drains the manager's stats, folding `stores_skipped` into the run's total.
    pub fn drain_stats(&mut self) -> ManagerStats {
        let s = self.manager.take_stats();
        if let Some(n) = s.stores_skipped {
            self.skipped_total = self.skipped_total.saturating_add(n);
        }
        s
    }

    /// The counts so far (`stores_skipped` includes what the manager has not reported yet).
    #[must_use]
    pub fn counts(&self) -> ReplayCounts {
        let filter = self.manager.config().filter_enabled();
        let mut c = self.counts;
        c.stores_skipped = filter.then(|| {
            self.skipped_total
                .saturating_add(self.manager.inspect().stores_skipped_undrained())
        });
        c
    }

    /// Requests open (between `L` and `C`).
    #[must_use]
    pub fn open_requests(&self) -> usize {
        self.open.len()
    }

    /// The blocks of the open requests (what [`Replayer::with_max_open_blocks`] bounds).
    #[must_use]
    pub const fn open_blocks(&self) -> u64 {
        self.open_blocks
    }

    /// The heap bytes of the replayer's own buffers (the manager's are
    /// [`Inspect::heap_bytes`](kvtier_core::manager::Inspect::heap_bytes)).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.arena.capacity() * size_of::<u64>()
            + self.slots.capacity() * size_of::<u32>()
            + self.keys.capacity() * size_of::<BlockKey>()
            + self.positions.capacity() * size_of::<u64>()
            + self.hit_slots.capacity() * size_of::<u32>()
            + self.order.capacity() * size_of::<(usize, u64)>()
            + self.open.allocation_size()
            + self.seen.allocation_size()
    }

    /// Replays one record.
    ///
    /// # Errors
    /// [`ReplayError`] for a record that breaks the protocol, passes a limit, or that the
    /// manager refuses. The replayer and the manager are unchanged then: an `L` is checked
    /// whole (including that the keys its `S` will offer do not repeat) before anything
    /// changes, so its `S` and `C` cannot meet a documented manager error.
    pub fn apply(&mut self, rec: Record<'_>) -> Result<(), ReplayError> {
        match rec {
            Record::Load { rid, hashes } => self.load(rid, hashes),
            Record::Start { rid } => self.start(rid),
            Record::Complete { rid } => self.complete(rid),
        }
    }

    /// `self.keys` = the keys of `hashes`; `positions` covers `hashes.len()`.
    fn stage(&mut self, rid: u64, hashes: &[u64]) -> Result<(), ReplayError> {
        let oom = ReplayError::OutOfMemory { rid };
        let n = hashes.len();
        self.keys.clear();
        self.keys.try_reserve(n).map_err(|_| oom)?;
        self.keys
            .extend(hashes.iter().map(|&h| BlockKey::new(h, 0)));
        if self.positions.len() < n {
            let have = self.positions.len();
            self.positions.try_reserve(n - have).map_err(|_| oom)?;
            let bt = self.block_tokens;
            self.positions
                .extend((have as u64 + 1..=n as u64).map(|i| i.saturating_mul(bt)));
        }
        Ok(())
    }

    /// The first repeated hash of `hashes` (1-based blocks, `offset` added).
    fn repeat_in(&mut self, rid: u64, hashes: &[u64], offset: u64) -> Result<(), ReplayError> {
        // A list of up to FILTERED_REPEAT_CHECK hashes sets one filter bit per hash; only a
        // hash whose bit is already set is compared with the hashes before it (a repeat's bit
        // always is). A longer one goes through the map. Both report the first repeat in list
        // order.
        if hashes.len() <= FILTERED_REPEAT_CHECK {
            let mut bits = [0u64; FILTER_BITS / 64];
            for (j, &hash) in hashes.iter().enumerate() {
                #[expect(clippy::cast_possible_truncation, reason = "the top bits of a u64")]
                let b = (hash.wrapping_mul(FILTER_SPREAD) >> (64 - FILTER_BITS.trailing_zeros()))
                    as usize;
                let (word, bit) = ((b / 64) % bits.len(), 1u64 << (b % 64));
                if bits[word] & bit != 0
                    && let Some(i) = hashes[..j].iter().position(|&h| h == hash)
                {
                    return Err(ReplayError::RepeatedHash {
                        rid,
                        hash,
                        first: offset + 1 + i as u64,
                        repeat: offset + 1 + j as u64,
                    });
                }
                bits[word] |= bit;
            }
            return Ok(());
        }
        self.seen.clear();
        self.seen
            .try_reserve(hashes.len())
            .map_err(|_| ReplayError::OutOfMemory { rid })?;
        for (i, &hash) in (offset + 1..).zip(hashes) {
            if let Some(&first) = self.seen.get(&hash) {
                return Err(ReplayError::RepeatedHash {
                    rid,
                    hash,
                    first,
                    repeat: i,
                });
            }
            self.seen.insert(hash, i);
        }
        Ok(())
    }

    /// Room for `n` more hashes at the end of the arena, compacting it when that reclaims at
    /// least half of it.
    fn make_room(&mut self, rid: u64, n: usize) -> Result<(), ReplayError> {
        let oom = ReplayError::OutOfMemory { rid };
        if self.arena.len() + n > self.arena.capacity() && self.garbage * 2 >= self.arena.len() {
            self.order.clear();
            self.order.try_reserve(self.open.len()).map_err(|_| oom)?;
            self.order
                .extend(self.open.iter().map(|(&rid, o)| (o.start, rid)));
            self.order.sort_unstable();
            let mut to = 0;
            for &(from, rid) in &self.order {
                if let Some(o) = self.open.get_mut(&rid) {
                    self.arena.copy_within(from..from + o.held, to);
                    self.slots.copy_within(from..from + o.held, to);
                    o.start = to;
                    to += o.held;
                }
            }
            self.arena.truncate(to);
            self.slots.truncate(to);
            self.garbage = 0;
        }
        self.arena.try_reserve(n).map_err(|_| oom)?;
        self.slots.try_reserve(n).map_err(|_| oom)?;
        self.open.try_reserve(1).map_err(|_| oom)
    }

    fn load(&mut self, rid: u64, hashes: &[u64]) -> Result<(), ReplayError> {
        // Check everything first; change nothing before the manager accepts the request.
        if self.open.contains_key(&rid) {
            return Err(ReplayError::DuplicateRequest(rid));
        }
        let n = hashes.len();
        let blocks = n as u64;
        if self.open_blocks.saturating_add(blocks) > self.max_open_blocks {
            return Err(ReplayError::TooManyOpenBlocks {
                rid,
                blocks,
                open: self.open_blocks,
                max_open_blocks: self.max_open_blocks,
            });
        }
        if blocks
            .checked_mul(self.block_tokens)
            .is_none_or(|last| last > i64::MAX as u64)
        {
            return Err(ReplayError::PositionTooLarge { rid });
        }
        self.stage(rid, hashes)?;
        // The scan changes nothing: everything is checked before the request is pinned.
        let scan = Instant::now();
        let HitScan {
            hits: k,
            stopped_at_pending: pending,
        } = self
            .manager
            .scan_hit_prefix_slots(&self.keys[..n.min(self.max_hits)], &mut self.hit_slots);
        self.last_lookup = scan.elapsed();
        self.repeat_in(rid, &hashes[k..], k as u64)?;
        self.make_room(rid, n)?;
        let req = self.manager.on_new_request().map_err(|e| match e {
            RequestError::TooManyRequests { max_requests } => {
                ReplayError::TooManyRequests { rid, max_requests }
            }
            _ => ReplayError::Request(e),
        })?;
        let start = self.arena.len();
        if k > 0 {
            match self.manager.prepare_load_slots(
                req,
                &self.keys[..k],
                &self.hit_slots,
                Some(&self.positions[..k]),
            ) {
                Ok(slots) => self.slots.extend_from_slice(slots),
                Err(e) => {
                    let _ = self.manager.drop_request(req);
                    return Err(ReplayError::Load(e));
                }
            }
        }
        // Accepted: record it.
        self.arena.extend_from_slice(hashes);
        self.slots.resize(start + n, u32::MAX);
        self.open.insert(
            rid,
            Open {
                req,
                start,
                held: n,
                blocks,
                hits: k,
                started: false,
            },
        );
        self.open_blocks += blocks;
        if pending {
            self.counts.stopped_at_pending += 1;
        }
        if k > 0 {
            self.counts.hit_requests += 1;
        }
        self.counts.requests += 1;
        self.counts.request_blocks += blocks;
        self.counts.hit_blocks += k as u64;
        self.counts.digest = self
            .counts
            .digest
            .wrapping_mul(DIGEST_MULTIPLIER)
            .wrapping_add(k as u64);
        Ok(())
    }

    fn start(&mut self, rid: u64) -> Result<(), ReplayError> {
        let o = *self
            .open
            .get(&rid)
            .ok_or(ReplayError::UnknownRequest(rid))?;
        if o.started {
            return Err(ReplayError::OutOfOrder(rid));
        }
        let k = o.hits;
        // The keys the store offers: those past the hits.
        self.keys.clear();
        self.keys.extend(
            self.arena[o.start + k..o.start + o.held]
                .iter()
                .map(|&h| BlockKey::new(h, 0)),
        );
        if k > 0 {
            self.manager
                .complete_load_slots(&self.slots[o.start..o.start + k])
                .map_err(ReplayError::CompleteLoad)?;
        }
        let mut held = 0;
        if k < o.held {
            let plan = &mut self.plan;
            match self.manager.prepare_store(
                o.req,
                &self.keys,
                Some(&self.positions[k..o.held]),
                plan,
            ) {
                Ok(()) => {
                    self.counts.stored_blocks += plan.keys().len() as u64;
                    self.counts.evicted_blocks += plan.evicted().len() as u64;
                    // The stored keys are a subset of the request's: they fit its range.
                    for (at, key) in self.arena[o.start..].iter_mut().zip(plan.keys()) {
                        *at = key.hash;
                    }
                    for (at, &slot) in self.slots[o.start..].iter_mut().zip(plan.slots()) {
                        *at = slot;
                    }
                    held = plan.keys().len();
                }
                Err(StoreError::NoRoom { .. }) => self.counts.store_failures += 1,
                Err(e) => return Err(ReplayError::Store(e)),
            }
        }
        self.garbage += o.held - held;
        if let Some(open) = self.open.get_mut(&rid) {
            open.held = held;
            open.started = true;
        }
        Ok(())
    }

    fn complete(&mut self, rid: u64) -> Result<(), ReplayError> {
        let o = *self
            .open
            .get(&rid)
            .ok_or(ReplayError::UnknownRequest(rid))?;
        if !o.started {
            return Err(ReplayError::OutOfOrder(rid));
        }
        if o.held > 0 {
            self.manager
                .complete_store_slots(&self.slots[o.start..o.start + o.held], StoreOutcome::Stored);
        }
        self.manager
            .on_request_finished(o.req)
            .map_err(ReplayError::Request)?;
        self.open.remove(&rid);
        self.garbage += o.held;
        self.open_blocks -= o.blocks;
        if self.open.is_empty() {
            self.arena.clear();
            self.slots.clear();
            self.garbage = 0;
        }
        Ok(())
    }
}
