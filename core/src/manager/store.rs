//! The store path: [`OffloadManager::prepare_store`] (reuse filter, eviction, allocation) and
//! [`OffloadManager::complete_store`].

use alloc::vec::Vec;

use super::chunks::PENDING;
use super::links;
use super::policy::{Access, Policy, check_positions};
use super::request::{INSERTED, Requests, STORE_MISS};
use super::{EventKind, OffloadManager, RequestId, StoreError};
use crate::key::OffloadKey;

/// Per offered key, how `prepare_store` classified it.
const CANDIDATE: u8 = 0;
const READY: u8 = 1;
const PENDING_KEY: u8 = 2;
const SKIPPED: u8 = 3;

/// One offered key as `prepare_store` classified it: its request entry, its slot when
/// resident (`NIL` when absent), its key table id when it is an ARC ghost (`NIL` otherwise)
/// and its class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offered {
    entry: u32,
    slot: u32,
    ghost: u32,
    class: u8,
    /// The key's hash (the manager's hasher): one per key and call.
    hash: u64,
}

/// What [`OffloadManager::prepare_store`] decided, written into a buffer the caller owns and
/// reuses: holding it borrows nothing, so the caller can pass its keys straight to
/// [`complete_store`](OffloadManager::complete_store).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorePlan<K> {
    keys: Vec<K>,
    slots: Vec<u32>,
    evicted: Vec<K>,
}

impl<K> StorePlan<K> {
    /// An empty plan.
    #[must_use]
    pub const fn new() -> Self {
        StorePlan {
            keys: Vec::new(),
            slots: Vec::new(),
            evicted: Vec::new(),
        }
    }

    /// The keys to store, in offer order (pending until completed).
    #[must_use]
    pub fn keys(&self) -> &[K] {
        &self.keys
    }

    /// `slots()[i]` is the slot allocated to `keys()[i]`.
    #[must_use]
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// Keys evicted to make room, in victim order.
    #[must_use]
    pub fn evicted(&self) -> &[K] {
        &self.evicted
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.slots.clear();
        self.evicted.clear();
    }
}

/// How the stores of [`OffloadManager::complete_store`]'s keys ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreOutcome {
    /// The data was written: the keys become readable.
    Stored,
    /// The transfer failed: the keys are dropped and their slots freed.
    Failed,
}

impl<K: OffloadKey> OffloadManager<K> {
    /// Decides which of the offered `keys` to store, evicting idle chunks if needed, and
    /// writes the decision into `plan` (cleared first; reuse one plan across calls and the
    /// warm path allocates nothing): the keys to store (absent keys that passed the reuse
    /// filter, in offer order), their slots, and the evicted keys in victim order. The new
    /// chunks are pending until [`complete_store`](Self::complete_store). Every offered key
    /// is protected from eviction by this call.
    ///
    /// # Errors
    /// [`StoreError::NoRoom`] when the needed evictions cannot be satisfied: no chunk changes,
    /// but, as in vLLM, the offer still counts (the reuse tracker, the allocation-size
    /// histogram, the request's record of the keys it saw). Any other [`StoreError`] (the
    /// request is not live, a key repeats, the positions do not fit) changes nothing. `plan`
    /// is empty after an error.
    pub fn prepare_store(
        &mut self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
        plan: &mut StorePlan<K>,
    ) -> Result<(), StoreError> {
        plan.clear();
        check_positions(keys.len(), end_tokens).map_err(StoreError::Positions)?;
        self.refresh_request(req)?;
        let ri = Requests::<K>::index(req);
        let hasher = self.cfg.hasher;
        let st = self.requests.get_mut(req)?;

        // 1. Validate (no key twice in one offer) and classify. Nothing seen from outside
        //    changes before the offer is valid: new entries are unseen.
        self.offer_stamp += 1;
        let stamp = self.offer_stamp;
        self.s_offer.clear();
        self.s_idle.clear();
        let num_chunks = self.cfg.num_chunks;
        let mut candidates = 0usize;
        for (index, key) in keys.iter().enumerate() {
            let hash = self.chunks.hash(key);
            let e = st.entry_hashed(*key, hash, hasher);
            let entry = &mut st.entries[e as usize];
            if entry.offer == stamp {
                return Err(StoreError::DuplicateKey { index });
            }
            entry.offer = stamp;
            // One probe finds a resident key or an ARC ghost.
            let (class, slot, ghost) = match self.chunks.find_any_hashed(key, hash) {
                Some(s) if s < num_chunks => match self.chunks.ref_cnt(s) {
                    0 => {
                        self.s_idle.push(s);
                        (READY, s, links::NIL)
                    }
                    r if r > 0 => (READY, s, links::NIL),
                    _ => (PENDING_KEY, s, links::NIL),
                },
                found => {
                    candidates += 1;
                    (CANDIDATE, links::NIL, found.unwrap_or(links::NIL))
                }
            };
            self.s_offer.push(Offered {
                entry: e,
                slot,
                ghost,
                class,
                hash,
            });
        }

        // Room in the key tables for the insertions this offer can make: candidates (a
        // victim's key becoming an ARC ghost keeps its index entry) and the tracker's new
        // keys. A growing table grows; a whole one worn by removals is rebuilt in place (see
        // `KeyTable::make_room`).
        {
            let cap = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let (adds, offered) = (cap(candidates), cap(keys.len()));
            let arc = match &self.policy {
                Policy::Arc(arc) => Some(arc),
                Policy::Lru(_) => None,
            };
            let ghosts = || arc.into_iter().flat_map(|a| a.ghost_ids());
            let grown = self.chunks.pool.make_room(adds, ghosts);
            let grown = grown.and_then(|()| {
                self.tracker
                    .as_mut()
                    .map_or(Ok(()), |t| t.make_room(offered))
            });
            grown.map_err(|_| StoreError::OutOfMemory)?;
        }

        // 2. The reuse tracker counts the whole offer; absent keys below the threshold are
        //    skipped.
        if let Some(t) = &mut self.tracker {
            t.record(keys, &mut self.s_count);
            let mut skipped = 0u64;
            for (o, &count) in self.s_offer.iter_mut().zip(&self.s_count) {
                if o.class == CANDIDATE && count < self.cfg.store_threshold {
                    o.class = SKIPPED;
                    skipped += 1;
                }
            }
            #[expect(clippy::cast_possible_truncation, reason = "skipped <= candidates")]
            let now = candidates - skipped as usize;
            candidates = now;
            self.stores_skipped = self.stores_skipped.saturating_add(skipped);
        }

        // 3. Store misses this request has not reported yet (ARC adapts on ghost hits).
        if let Policy::Arc(arc) = &mut self.policy {
            for o in self.s_offer.iter().rev() {
                if o.class == CANDIDATE
                    && o.ghost != links::NIL
                    && st.entries[o.entry as usize].flags & STORE_MISS == 0
                {
                    arc.adapt_ghost(o.ghost);
                }
            }
        }

        // 4. Positions, store misses, and the request's access to candidates and ready keys,
        //    in offer order.
        let mut access = Access::new(ri);
        for (i, o) in self.s_offer.iter().enumerate() {
            if let Some(p) = end_tokens {
                st.set_pos(o.entry, p[i]);
            }
            if o.class == CANDIDATE {
                st.entries[o.entry as usize].flags |= STORE_MISS;
            }
            if o.class <= READY {
                let reused = o.class == READY;
                access.record(st, o.entry, reused, o.slot, &mut self.policy, &self.chunks);
            }
        }

        if candidates == 0 {
            return Ok(());
        }

        // 6. Sample the allocation size, then make room. Every idle offered chunk is
        //    protected from this call's eviction for the time of the choice.
        self.alloc_sizes.observe(candidates as u64);
        let free = self.chunks.pool.free_count() as usize;
        if candidates > free {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "candidates <= keys offered, and free < candidates is a u32"
            )]
            let need = (candidates - free).min(u32::MAX as usize) as u32;
            let no_room = StoreError::NoRoom {
                need,
                evictable: self.evictable,
            };
            self.chunks.protect(&self.s_idle);
            #[expect(
                clippy::cast_possible_truncation,
                reason = "idle slots are distinct u32s"
            )]
            let protected = self.s_idle.len() as u32;
            self.victims.clear();
            let ok = need <= self.evictable.saturating_sub(protected)
                && match &mut self.policy {
                    Policy::Lru(lru) => lru.evict(
                        need,
                        self.chunks.ref_cnts(),
                        &mut self.victims,
                        &mut self.requests,
                        self.chunks.keys(),
                    ),
                    Policy::Arc(arc) => arc.evict(need, self.chunks.ref_cnts(), &mut self.victims),
                };
            self.chunks.unprotect(&self.s_idle);
            if !ok {
                self.alloc_failures = self.alloc_failures.saturating_add(1);
                return Err(no_room);
            }
            self.evictable -= need;
            match &mut self.policy {
                // The victims' index entries become their ghosts': the slots are only freed.
                Policy::Arc(arc) => {
                    arc.retire(&self.victims, self.chunks.pool.table_mut());
                    for &v in &self.victims {
                        plan.evicted.push(self.chunks.key(v));
                        self.chunks.release(v);
                    }
                }
                Policy::Lru(_) => {
                    for &v in &self.victims {
                        plan.evicted.push(self.chunks.key(v));
                        self.chunks.remove(v);
                    }
                }
            }
            if let Some(ev) = &mut self.events {
                ev.push(EventKind::Removed, plan.evicted.iter().copied());
            }
        }

        // 7. Allocate and insert the candidates, pending.
        let st = self.requests.get_mut(req)?;
        for (o, key) in self.s_offer.iter().zip(keys) {
            if o.class != CANDIDATE {
                continue;
            }
            let inserted = match (&self.policy, o.ghost) {
                (Policy::Arc(_), ghost) if ghost != links::NIL => {
                    self.chunks.insert_from_ghost(*key, o.hash, ghost)
                }
                _ => self.chunks.insert_hashed(*key, o.hash).map(|s| (s, false)),
            };
            let Some((slot, adopted)) = inserted else {
                break;
            };
            let entry = &mut st.entries[o.entry as usize];
            entry.flags |= INSERTED;
            entry.slot = slot;
            let pos = entry.pos();
            match &mut self.policy {
                Policy::Lru(lru) => lru.insert(
                    slot,
                    pos,
                    &mut st.rank,
                    ri,
                    self.chunks.keys(),
                    &mut st.displaced,
                ),
                Policy::Arc(arc) => {
                    arc.insert(slot, key, o.ghost, adopted, self.chunks.pool.table_mut());
                }
            }
            plan.keys.push(*key);
            plan.slots.push(slot);
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "candidates <= num_chunks, a u32"
        )]
        let added = plan.keys.len() as u32;
        self.write_pending += added;
        Ok(())
    }

    /// Completes stores. [`StoreOutcome::Stored`]: each pending key becomes readable and
    /// evictable (one `Stored` event). [`StoreOutcome::Failed`]: each pending key is removed
    /// and its slot freed (one metadata-only removal event). Keys that are absent or already
    /// readable are skipped, as in vLLM, so completing twice, or after a
    /// [`reset_cache`](Self::reset_cache) dropped the store, is harmless; the returned count
    /// says how many keys were pending and completed.
    pub fn complete_store(&mut self, keys: &[K], outcome: StoreOutcome) -> usize {
        self.by_slot(keys, |m, slots| m.complete_store_slots(slots, outcome))
    }

    /// [`complete_store`](Self::complete_store) by slot, as
    /// [`StorePlan::slots`] gave them (a pending chunk keeps its slot): a slot whose chunk is
    /// not pending (already completed, or holding no chunk) is skipped. Returns how many
    /// stores completed.
    pub fn complete_store_slots(&mut self, slots: &[u32], outcome: StoreOutcome) -> usize {
        let success = outcome == StoreOutcome::Stored;
        self.s_done.clear();
        for &s in slots {
            if self.chunks.ref_cnt(s) != PENDING {
                continue;
            }
            let key = self.chunks.key(s);
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
            self.s_done.push(key);
        }
        if let Some(ev) = &mut self.events {
            let kind = if success {
                EventKind::Stored
            } else {
                EventKind::RemovedMetadataOnly
            };
            ev.push(kind, self.s_done.iter().copied());
        }
        self.s_done.len()
    }
}
