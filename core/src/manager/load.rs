//! The load path of [`OffloadManager`]: `lookup`, the hit-prefix scan, `prepare_load` (by key
//! or by the slots a scan found), `pin_hit_prefix`, `touch` and `complete_load` (by key or by
//! slot).

use alloc::vec::Vec;

use super::chunks::{ABSENT, PENDING};
use super::links::NIL;
use super::policy::{Access, Policy, check_positions};
use super::request::Requests;
use super::{CompleteLoadError, LoadError, OffloadManager, RequestId};
use crate::key::OffloadKey;

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

/// What [`OffloadManager::pin_hit_prefix`] found and pinned, borrowed from the manager until
/// its next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HitPrefix<'a> {
    /// Leading keys that were readable (HITs) and are now pinned for loading.
    pub hits: usize,
    /// Whether the scan stopped at a key whose store is still pending (HIT_PENDING).
    pub stopped_at_pending: bool,
    /// The pinned keys' slots, in key order (`slots.len() == hits`).
    pub slots: &'a [u32],
}

/// What [`OffloadManager::scan_hit_prefix`] found: the readable prefix of a key list, looked
/// up without pinning anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HitScan {
    /// Leading keys that are readable (HITs).
    pub hits: usize,
    /// Whether the scan stopped at a key whose store is still pending (HIT_PENDING).
    pub stopped_at_pending: bool,
}

impl<K: OffloadKey> OffloadManager<K> {
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
        self.pin_found(req, keys, end_tokens)
    }

    /// [`prepare_load`](Self::prepare_load) of keys whose slots the caller has just looked
    /// up (with [`scan_hit_prefix_slots`](Self::scan_hit_prefix_slots)): each slot is checked
    /// to hold its key instead of looking the key up again.
    ///
    /// # Errors
    /// As [`prepare_load`](Self::prepare_load), with [`LoadError::NotPresent`] also for a slot
    /// that does not hold its key and [`LoadError::SlotsMismatch`] when `slots` and `keys`
    /// differ in length; nothing changes then.
    pub fn prepare_load_slots(
        &mut self,
        req: RequestId,
        keys: &[K],
        slots: &[u32],
        end_tokens: Option<&[u64]>,
    ) -> Result<&[u32], LoadError> {
        check_positions(keys.len(), end_tokens).map_err(LoadError::Positions)?;
        if slots.len() != keys.len() {
            return Err(LoadError::SlotsMismatch {
                keys: keys.len(),
                slots: slots.len(),
            });
        }
        self.refresh_request(req)?;
        self.s_slot.clear();
        for (index, (key, &s)) in keys.iter().zip(slots).enumerate() {
            let r = self.chunks.ref_cnt(s);
            if r == ABSENT || self.chunks.keys().get(s as usize) != Some(key) {
                return Err(LoadError::NotPresent { index });
            }
            if r < 0 {
                return Err(LoadError::NotReady { index });
            }
            self.s_slot.push(s);
        }
        self.pin_found(req, keys, end_tokens)
    }

    /// Pins the readable chunks `s_slot` of `keys` for the live request `req` and records the
    /// request's access to them (the common end of the two `prepare_load` forms).
    fn pin_found(
        &mut self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
    ) -> Result<&[u32], LoadError> {
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
        // Every position first: a key named twice ranks by the last one given.
        self.s_entry.clear();
        for (i, key) in keys.iter().enumerate() {
            let e = st.entry(*key, self.cfg.hasher);
            if let Some(p) = end_tokens {
                st.set_pos(e, p[i]);
            }
            self.s_entry.push(e);
        }
        let mut access = Access::new(Requests::<K>::index(req));
        for (&e, &s) in self.s_entry.iter().zip(&self.s_slot) {
            access.record(st, e, true, s, &mut self.policy, &self.chunks);
        }
        Ok(&self.s_slot)
    }

    /// Looks `keys` up in order while they are readable (HIT), stopping at the first MISS or
    /// HIT_PENDING; pins nothing and changes nothing. [`pin_hit_prefix`](Self::pin_hit_prefix)
    /// is this scan plus the pin; a caller that must validate more before it pins (a replayer
    /// that promises to change nothing on error) scans first and pins with
    /// [`prepare_load`](Self::prepare_load).
    #[must_use]
    pub fn scan_hit_prefix(&self, keys: &[K]) -> HitScan {
        self.scan_with(keys, |_| {})
    }

    /// [`scan_hit_prefix`](Self::scan_hit_prefix) that also writes the readable prefix's
    /// slots into `slots` (cleared first), for [`prepare_load_slots`](Self::prepare_load_slots).
    pub fn scan_hit_prefix_slots(&self, keys: &[K], slots: &mut Vec<u32>) -> HitScan {
        slots.clear();
        self.scan_with(keys, |s| slots.push(s))
    }

    #[inline]
    fn scan_with(&self, keys: &[K], mut found: impl FnMut(u32)) -> HitScan {
        let mut hits = 0;
        for key in keys {
            match self.chunks.find(key) {
                None => break,
                Some(s) if self.chunks.ref_cnt(s) == PENDING => {
                    return HitScan {
                        hits,
                        stopped_at_pending: true,
                    };
                }
                Some(s) => {
                    found(s);
                    hits += 1;
                }
            }
        }
        HitScan {
            hits,
            stopped_at_pending: false,
        }
    }

    /// Looks `keys` up in order while they are readable and pins that prefix for loading
    /// ([`prepare_load`](Self::prepare_load) of it), so that no eviction can fall between a
    /// HIT and its pin. `end_tokens`, if given, holds one position per key (the pinned prefix
    /// uses its part). With no hit nothing is pinned and the request's state is untouched.
    ///
    /// # Errors
    /// [`LoadError`] when the request is not live or the positions do not fit the keys;
    /// nothing changes then.
    pub fn pin_hit_prefix(
        &mut self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
    ) -> Result<HitPrefix<'_>, LoadError> {
        check_positions(keys.len(), end_tokens).map_err(LoadError::Positions)?;
        self.requests.get_mut(req)?;
        let mut slots = core::mem::take(&mut self.s_resolve);
        let HitScan {
            hits,
            stopped_at_pending,
        } = self.scan_hit_prefix_slots(keys, &mut slots);
        if hits == 0 {
            self.s_resolve = slots;
            return Ok(HitPrefix {
                hits,
                stopped_at_pending,
                slots: &[],
            });
        }
        self.refresh_request(req)?;
        core::mem::swap(&mut self.s_slot, &mut slots);
        self.s_resolve = slots;
        let positions = end_tokens.map(|p| &p[..hits]);
        let slots = self.pin_found(req, &keys[..hits], positions)?;
        Ok(HitPrefix {
            hits,
            stopped_at_pending,
            slots,
        })
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
                    let ready = slot.map(|s| (s, self.chunks.ref_cnt(s) >= 0));
                    arc.touch(key, ready, self.chunks.pool.table());
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
        self.by_slot(keys, Self::complete_load_slots)
    }

    /// [`complete_load`](Self::complete_load) by slot: undoes one pin per slot, as
    /// [`prepare_load`](Self::prepare_load) returned them (a pinned chunk keeps its slot). A
    /// chunk whose last load completes becomes evictable.
    ///
    /// # Errors
    /// [`CompleteLoadError::NotPinned`] when a slot holds no pinned chunk (counting repeats
    /// within the call), [`CompleteLoadError::NotPresent`] for slot `u32::MAX` (no slot);
    /// nothing changes then.
    pub fn complete_load_slots(&mut self, slots: &[u32]) -> Result<(), CompleteLoadError> {
        self.s_zero.clear();
        for (index, &s) in slots.iter().enumerate() {
            if s == NIL {
                self.undo_unpins(&slots[..index]);
                return Err(CompleteLoadError::NotPresent { index });
            }
            let r = self.chunks.ref_cnt(s);
            if r <= 0 {
                self.undo_unpins(&slots[..index]);
                return Err(CompleteLoadError::NotPinned { index });
            }
            self.chunks.set_ref_cnt(s, r - 1);
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

    /// Gives back the pins that `complete_load_slots` took from `done` before it failed.
    fn undo_unpins(&mut self, done: &[u32]) {
        for &s in done {
            let r = self.chunks.ref_cnt(s);
            self.chunks.set_ref_cnt(s, r + 1);
        }
    }
}
