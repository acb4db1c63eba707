//! A miniature replay: one [`OffloadManager`] driven by the kvtrace protocol from record-level
//! calls, for the sampled keys of a trace at a scaled-down capacity (see the
//! [module docs](super)).

use alloc::vec::Vec;

use super::CurveError;
use crate::BlockKey;
use crate::hashing::{FixedState, Map};
use crate::manager::{
    HitScan, ManagerConfig, OffloadManager, RequestError, RequestId, StoreError, StoreOutcome,
    StorePlan,
};

/// What a miniature replay counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MiniCounts {
    /// Requests replayed (those with at least one sampled key).
    pub requests: u64,
    /// Sampled blocks over all requests.
    pub request_blocks: u64,
    /// Leading sampled blocks found readable.
    pub hit_blocks: u64,
    /// Store offers that found no room.
    pub store_failures: u64,
}

impl MiniCounts {
    /// `hit_blocks / request_blocks`, 0 for an empty replay.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    pub fn block_hit_rate(&self) -> f64 {
        if self.request_blocks == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / self.request_blocks as f64
        }
    }
}

/// One request slot of a miniature replay: its keys, how many of them hit, the store's keys
/// (`req` is `None` while the slot is free).
#[derive(Clone, Debug, Default)]
struct Open {
    req: Option<RequestId>,
    keys: Vec<BlockKey>,
    hits: usize,
    stored: Vec<BlockKey>,
    started: bool,
}

/// Dense slots for the open requests of a stream: a request's id maps to a small index
/// while it is open, so per-request state lives in vectors indexed by slot. One table can
/// serve many miniatures fed the same stream.
#[derive(Clone, Debug)]
pub(super) struct RequestSlots {
    of: Map<u64, u32>,
    free: Vec<u32>,
    next: u32,
}

impl RequestSlots {
    pub(super) fn new() -> Self {
        RequestSlots {
            of: Map::with_hasher(FixedState::default()),
            free: Vec::new(),
            next: 0,
        }
    }

    /// The slot of open request `rid`.
    pub(super) fn get(&self, rid: u64) -> Option<u32> {
        self.of.get(&rid).copied()
    }

    /// A slot for `rid`, which must not be open.
    pub(super) fn open(&mut self, rid: u64) -> Result<u32, CurveError> {
        if self.of.contains_key(&rid) {
            return Err(CurveError::DuplicateRequest(rid));
        }
        self.of
            .try_reserve(1)
            .map_err(|_| CurveError::OutOfMemory)?;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.free
                    .try_reserve(1)
                    .map_err(|_| CurveError::OutOfMemory)?;
                let s = self.next;
                self.next = s.checked_add(1).ok_or(CurveError::OutOfMemory)?;
                s
            }
        };
        self.of.insert(rid, slot);
        Ok(slot)
    }

    /// Frees `rid`'s slot (its index, if it was open).
    pub(super) fn close(&mut self, rid: u64) -> Option<u32> {
        let slot = self.of.remove(&rid)?;
        self.free.push(slot);
        Some(slot)
    }
}

/// The kvtrace protocol over one manager (`L`: [`lookup`](Self::lookup), `S`:
/// [`store`](Self::store), `C`: [`finish`](Self::finish)), keys in KV group 0, end-token
/// positions `(i + 1) · block_tokens`.
#[derive(Clone, Debug)]
pub struct MiniReplay {
    manager: OffloadManager<BlockKey>,
    block_tokens: u64,
    /// The request table of the rid-level calls (unused when a caller drives the slots).
    ids: RequestSlots,
    open: Vec<Open>,
    counts: MiniCounts,
    slots: Vec<u32>,
    positions: Vec<u64>,
    plan: StorePlan<BlockKey>,
}

impl MiniReplay {
    /// A replay over a manager built from `cfg`.
    ///
    /// # Errors
    /// [`CurveError::Config`] when the manager refuses the configuration.
    pub fn new(cfg: ManagerConfig, block_tokens: u64) -> Result<Self, CurveError> {
        Ok(MiniReplay {
            manager: OffloadManager::new(cfg).map_err(|_| CurveError::Config)?,
            block_tokens: block_tokens.max(1),
            ids: RequestSlots::new(),
            open: Vec::new(),
            counts: MiniCounts::default(),
            slots: Vec::new(),
            positions: Vec::new(),
            plan: StorePlan::new(),
        })
    }

    /// What the replay counted so far.
    #[must_use]
    pub const fn counts(&self) -> MiniCounts {
        self.counts
    }

    /// Whether request `rid` is open.
    #[must_use]
    pub fn is_open(&self, rid: u64) -> bool {
        self.ids.get(rid).is_some()
    }

    /// Whether slot `slot` holds an open request.
    pub(super) fn slot_open(&self, slot: u32) -> bool {
        self.open
            .get(slot as usize)
            .is_some_and(|o| o.req.is_some())
    }

    /// The manager, for inspection.
    #[must_use]
    pub const fn manager(&self) -> &OffloadManager<BlockKey> {
        &self.manager
    }

    fn positions(&mut self, n: usize) -> Result<(), CurveError> {
        if self.positions.len() < n {
            let have = self.positions.len();
            self.positions
                .try_reserve(n - have)
                .map_err(|_| CurveError::OutOfMemory)?;
            let bt = self.block_tokens;
            self.positions
                .extend((have as u64 + 1..=n as u64).map(|i| i.saturating_mul(bt)));
        }
        Ok(())
    }

    /// An `L` record.
    ///
    /// # Errors
    /// [`CurveError`] for a request already open or one the manager refuses (too many in
    /// flight, a key repeated in what it would store); nothing changes then.
    pub fn lookup(&mut self, rid: u64, hashes: &[u64]) -> Result<(), CurveError> {
        let slot = self.ids.open(rid)?;
        self.lookup_slot(slot, rid, hashes).inspect_err(|_| {
            self.ids.close(rid);
        })
    }

    /// An `S` record.
    ///
    /// # Errors
    /// [`CurveError::UnknownRequest`] or [`CurveError::OutOfOrder`]; nothing changes then.
    pub fn store(&mut self, rid: u64) -> Result<(), CurveError> {
        let slot = self.ids.get(rid).ok_or(CurveError::UnknownRequest(rid))?;
        self.store_slot(slot, rid)
    }

    /// A `C` record.
    ///
    /// # Errors
    /// [`CurveError::UnknownRequest`] or [`CurveError::OutOfOrder`]; nothing changes then.
    pub fn finish(&mut self, rid: u64) -> Result<(), CurveError> {
        let slot = self.ids.get(rid).ok_or(CurveError::UnknownRequest(rid))?;
        self.finish_slot(slot, rid)?;
        self.ids.close(rid);
        Ok(())
    }

    /// [`lookup`](Self::lookup) of request `rid` into free slot `slot`.
    pub(super) fn lookup_slot(
        &mut self,
        slot: u32,
        rid: u64,
        hashes: &[u64],
    ) -> Result<(), CurveError> {
        let ix = slot as usize;
        if self.open.len() <= ix {
            self.open
                .try_reserve(ix + 1 - self.open.len())
                .map_err(|_| CurveError::OutOfMemory)?;
            self.open.resize_with(ix + 1, Open::default);
        }
        if self.open[ix].req.is_some() {
            return Err(CurveError::DuplicateRequest(rid));
        }
        self.positions(hashes.len())?;
        let o = &mut self.open[ix];
        o.keys.clear();
        o.stored.clear();
        o.started = false;
        o.keys
            .try_reserve(hashes.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        o.keys.extend(hashes.iter().map(|&h| BlockKey::new(h, 0)));
        let HitScan { hits, .. } = self.manager.scan_hit_prefix_slots(&o.keys, &mut self.slots);
        if o.keys[hits..]
            .iter()
            .enumerate()
            .any(|(i, k)| o.keys[hits + i + 1..].contains(k))
        {
            return Err(CurveError::RepeatedKey(rid));
        }
        let req = match self.manager.on_new_request() {
            Ok(r) => r,
            Err(RequestError::TooManyRequests { .. }) => {
                return Err(CurveError::TooManyRequests(rid));
            }
            Err(_) => return Err(CurveError::Config),
        };
        if hits > 0
            && self
                .manager
                .prepare_load_slots(
                    req,
                    &o.keys[..hits],
                    &self.slots,
                    Some(&self.positions[..hits]),
                )
                .is_err()
        {
            let _ = self.manager.drop_request(req);
            return Err(CurveError::Config);
        }
        o.req = Some(req);
        o.hits = hits;
        self.counts.requests += 1;
        self.counts.request_blocks += hashes.len() as u64;
        self.counts.hit_blocks += hits as u64;
        Ok(())
    }

    /// [`store`](Self::store) of request `rid` in slot `slot`.
    pub(super) fn store_slot(&mut self, slot: u32, rid: u64) -> Result<(), CurveError> {
        let o = self
            .open
            .get_mut(slot as usize)
            .filter(|o| o.req.is_some())
            .ok_or(CurveError::UnknownRequest(rid))?;
        let Some(req) = o.req.filter(|_| !o.started) else {
            return Err(CurveError::OutOfOrder(rid));
        };
        o.started = true;
        let k = o.hits;
        if k > 0 {
            let _ = self.manager.complete_load(&o.keys[..k]);
        }
        if k < o.keys.len() {
            let n = o.keys.len();
            match self.manager.prepare_store(
                req,
                &o.keys[k..],
                Some(&self.positions[k..n]),
                &mut self.plan,
            ) {
                Ok(()) => o.stored.extend_from_slice(self.plan.keys()),
                Err(StoreError::NoRoom { .. }) => self.counts.store_failures += 1,
                Err(_) => return Err(CurveError::Config),
            }
        }
        Ok(())
    }

    /// [`finish`](Self::finish) of request `rid` in slot `slot`, which is then free.
    pub(super) fn finish_slot(&mut self, slot: u32, rid: u64) -> Result<(), CurveError> {
        let o = self
            .open
            .get_mut(slot as usize)
            .filter(|o| o.req.is_some())
            .ok_or(CurveError::UnknownRequest(rid))?;
        if !o.started {
            return Err(CurveError::OutOfOrder(rid));
        }
        if !o.stored.is_empty() {
            self.manager.complete_store(&o.stored, StoreOutcome::Stored);
        }
        if let Some(req) = o.req.take() {
            let _ = self.manager.on_request_finished(req);
        }
        Ok(())
    }
}
