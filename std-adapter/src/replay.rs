//! The kvtrace replay protocol: drives one [`OffloadManager`] with a trace's records and counts
//! what happened.
//!
//! Per request (`spec/kvtrace.md`): on `L`, a new request context, then `lookup` of the keys in
//! order while they are HITs; `k` leading hits are loaded (`prepare_load`) and `k` is folded
//! into the hit digest. On `S`, the loads complete and the rest of the keys are offered
//! (`prepare_store`); no room counts a store failure. On `C`, the stored keys complete and the
//! request finishes. Key of block `i`: its hash in group 0, end-token position
//! `(i + 1) · block_tokens`.

use std::fmt;

use kvtier_core::BlockKey;
use kvtier_core::hashing::Map;
use kvtier_core::manager::{
    CompleteLoadError, LoadError, ManagerStats, OffloadManager, RequestError, StoreError,
    StoreOutcome, StorePlan,
};

use crate::trace::Record;

/// The multiplier of the hit digest: `d = d · 1000003 + k (mod 2^64)` per `L` record.
pub const DIGEST_MULTIPLIER: u64 = 1_000_003;

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
    /// `prepare_store` calls that found no room.
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

/// Why a record could not be replayed. The reader already rejects these for files; the
/// replayer checks again so that any record source is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayError {
    /// An `L` for a request that is already open.
    DuplicateRequest(u64),
    /// An `S` or `C` for a request that is not open.
    UnknownRequest(u64),
    /// An `S` twice, or a `C` before the `S`.
    OutOfOrder(u64),
    /// The manager refused a request context (too many in flight).
    Request(RequestError),
    /// The manager refused a load (a bug: the keys were just looked up).
    Load(LoadError),
    /// The manager refused to complete a load (a bug: the keys were pinned by this request).
    CompleteLoad(CompleteLoadError),
    /// The manager refused a store (e.g. a request that repeats a block hash).
    Store(StoreError),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::DuplicateRequest(r) => write!(f, "request {r} arrived twice"),
            ReplayError::UnknownRequest(r) => write!(f, "request {r} is not open"),
            ReplayError::OutOfOrder(r) => write!(f, "request {r}: records out of order"),
            ReplayError::Request(e) => write!(f, "{e}"),
            ReplayError::Load(e) => write!(f, "{e}"),
            ReplayError::CompleteLoad(e) => write!(f, "{e}"),
            ReplayError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReplayError {}

#[derive(Debug)]
struct Open {
    req: kvtier_core::manager::RequestId,
    keys: Vec<BlockKey>,
    positions: Vec<u64>,
    hits: usize,
    started: bool,
    stored: Vec<BlockKey>,
}

/// Replays records through a manager it owns.
#[derive(Debug)]
pub struct Replayer {
    manager: OffloadManager<BlockKey>,
    block_tokens: u64,
    open: Map<u64, Open>,
    spare: Vec<Open>,
    counts: ReplayCounts,
    skipped_total: u64,
    plan: StorePlan<BlockKey>,
}

impl Replayer {
    /// A replayer over `manager` with `block_tokens` tokens per block.
    #[must_use]
    pub fn new(manager: OffloadManager<BlockKey>, block_tokens: u64) -> Self {
        let filter = manager.config().filter_enabled();
        Replayer {
            manager,
            block_tokens,
            open: Map::default(),
            spare: Vec::new(),
            counts: ReplayCounts {
                stores_skipped: filter.then_some(0),
                ..ReplayCounts::default()
            },
            skipped_total: 0,
            plan: StorePlan::new(),
        }
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

    /// Replays one record.
    ///
    /// # Errors
    /// [`ReplayError`] for a record that breaks the protocol or a manager refusal; the
    /// replayer and the manager are unchanged then.
    pub fn apply(&mut self, rec: Record<'_>) -> Result<(), ReplayError> {
        match rec {
            Record::Load { rid, hashes } => self.load(rid, hashes),
            Record::Start { rid } => self.start(rid),
            Record::Complete { rid } => self.complete(rid),
        }
    }

    fn load(&mut self, rid: u64, hashes: &[u64]) -> Result<(), ReplayError> {
        if self.open.contains_key(&rid) {
            return Err(ReplayError::DuplicateRequest(rid));
        }
        let req = self
            .manager
            .on_new_request()
            .map_err(ReplayError::Request)?;
        let mut o = self.spare.pop().unwrap_or_else(|| Open {
            req,
            keys: Vec::new(),
            positions: Vec::new(),
            hits: 0,
            started: false,
            stored: Vec::new(),
        });
        o.req = req;
        o.keys.clear();
        o.positions.clear();
        o.stored.clear();
        o.started = false;
        let bt = self.block_tokens;
        o.keys.extend(hashes.iter().map(|&h| BlockKey::new(h, 0)));
        o.positions
            .extend((1..=hashes.len() as u64).map(|i| i.saturating_mul(bt)));
        let k = match self
            .manager
            .pin_hit_prefix(req, &o.keys, Some(&o.positions))
        {
            Ok(p) => {
                self.counts.stopped_at_pending += u64::from(p.stopped_at_pending);
                p.hits
            }
            Err(e) => {
                let _ = self.manager.drop_request(req);
                self.spare.push(o);
                return Err(ReplayError::Load(e));
            }
        };
        if k > 0 {
            self.counts.hit_requests += 1;
        }
        o.hits = k;
        self.counts.requests += 1;
        self.counts.request_blocks += hashes.len() as u64;
        self.counts.hit_blocks += k as u64;
        self.counts.digest = self
            .counts
            .digest
            .wrapping_mul(DIGEST_MULTIPLIER)
            .wrapping_add(k as u64);
        self.open.insert(rid, o);
        Ok(())
    }

    fn start(&mut self, rid: u64) -> Result<(), ReplayError> {
        let o = self
            .open
            .get_mut(&rid)
            .ok_or(ReplayError::UnknownRequest(rid))?;
        if o.started {
            return Err(ReplayError::OutOfOrder(rid));
        }
        let k = o.hits;
        if k > 0 {
            // Cannot fail: the keys were pinned by this request's prepare_load.
            self.manager
                .complete_load(&o.keys[..k])
                .map_err(ReplayError::CompleteLoad)?;
        }
        o.started = true;
        if k < o.keys.len() {
            let plan = &mut self.plan;
            match self
                .manager
                .prepare_store(o.req, &o.keys[k..], Some(&o.positions[k..]), plan)
            {
                Ok(()) => {
                    self.counts.stored_blocks += plan.keys().len() as u64;
                    self.counts.evicted_blocks += plan.evicted().len() as u64;
                    o.stored.extend_from_slice(plan.keys());
                }
                Err(StoreError::NoRoom { .. }) => self.counts.store_failures += 1,
                Err(e) => return Err(ReplayError::Store(e)),
            }
        }
        Ok(())
    }

    fn complete(&mut self, rid: u64) -> Result<(), ReplayError> {
        match self.open.get(&rid) {
            None => return Err(ReplayError::UnknownRequest(rid)),
            Some(o) if !o.started => return Err(ReplayError::OutOfOrder(rid)),
            Some(_) => {}
        }
        let Some(o) = self.open.remove(&rid) else {
            return Err(ReplayError::UnknownRequest(rid));
        };
        if !o.stored.is_empty() {
            self.manager.complete_store(&o.stored, StoreOutcome::Stored);
        }
        self.manager
            .on_request_finished(o.req)
            .map_err(ReplayError::Request)?;
        self.spare.push(o);
        Ok(())
    }
}
