//! [`Inspect`]: a read-only view of a manager's internals for tests, invariant checks and
//! reports: slot counts, chunk states, the policy's lists, the reuse tracker, memory held.

use alloc::vec::Vec;

use super::chunks::{self, PENDING};
use super::events::EventQueue;
use super::policy::Policy;
use super::tracker::Tracker;
use super::{ChunkState, OffloadManager};
use crate::key::OffloadKey;

/// A read-only view of an [`OffloadManager`], from [`OffloadManager::inspect`].
#[derive(Clone, Copy, Debug)]
pub struct Inspect<'a, K: OffloadKey> {
    m: &'a OffloadManager<K>,
}

impl<K: OffloadKey> OffloadManager<K> {
    /// The manager's internals, read-only.
    #[must_use]
    pub fn inspect(&self) -> Inspect<'_, K> {
        Inspect { m: self }
    }
}

impl<K: OffloadKey> Inspect<'_, K> {
    /// Candidates the reuse filter rejected since the last
    /// [`take_stats`](OffloadManager::take_stats), without draining them.
    #[must_use]
    pub fn stores_skipped_undrained(self) -> u64 {
        self.m.stores_skipped
    }

    /// Capacity in chunks.
    #[must_use]
    pub fn capacity(self) -> u32 {
        self.m.cfg.num_chunks
    }

    /// Slots allocated (`A − |F|`): resident chunks.
    #[must_use]
    pub fn allocated(self) -> u32 {
        self.m.chunks.pool.len()
    }

    /// Free slots.
    #[must_use]
    pub fn free_chunks(self) -> u32 {
        self.m.chunks.pool.free_count()
    }

    /// Chunks idle and evictable (`ref_cnt == 0`).
    #[must_use]
    pub fn evictable(self) -> u32 {
        self.m.evictable
    }

    /// Chunks whose store is pending (`ref_cnt == −1`).
    #[must_use]
    pub fn write_pending(self) -> u32 {
        self.m.write_pending
    }

    /// The slot and state of a resident key.
    #[must_use]
    pub fn chunk(self, key: &K) -> Option<(u32, ChunkState)> {
        let s = self.m.chunks.find(key)?;
        let state = match self.m.chunks.ref_cnt(s) {
            PENDING => ChunkState::Pending,
            0 => ChunkState::Idle,
            r => ChunkState::Pinned(r.unsigned_abs()),
        };
        Some((s, state))
    }

    /// The reuse tracker's count for `key` (0 when untracked or the filter is off).
    #[must_use]
    pub fn tracker_count(self, key: &K) -> u32 {
        self.m.tracker.as_ref().map_or(0, |t| t.count(key))
    }

    /// Keys the reuse tracker holds (0 when the filter is off).
    #[must_use]
    pub fn tracker_len(self) -> u32 {
        self.m.tracker.as_ref().map_or(0, Tracker::len)
    }

    /// ARC's adaptive target for T1, `None` under LRU.
    #[must_use]
    pub fn arc_target(self) -> Option<f64> {
        match &self.m.policy {
            Policy::Arc(a) => Some(a.target()),
            Policy::Lru(_) => None,
        }
    }

    /// ARC's list sizes `(|T1|, |T2|, |B1|, |B2|)`, `None` under LRU.
    #[must_use]
    pub fn arc_sizes(self) -> Option<(u32, u32, u32, u32)> {
        match &self.m.policy {
            Policy::Arc(a) => Some(a.sizes()),
            Policy::Lru(_) => None,
        }
    }

    /// Resident keys in the policy's eviction order, first victim first, ignoring pins
    /// (LRU: rank order; ARC: T1 from its LRU end, then T2).
    #[must_use]
    pub fn eviction_order(self) -> Vec<K> {
        match &self.m.policy {
            Policy::Lru(l) => l
                .order(self.m.chunks.keys())
                .into_iter()
                .map(|s| self.m.chunks.key(s))
                .collect(),
            Policy::Arc(a) => {
                let (t1, t2) = a.lists();
                t1.into_iter()
                    .chain(t2)
                    .map(|s| self.m.chunks.key(s))
                    .collect()
            }
        }
    }

    /// Bytes of heap the manager holds (all of it allocated at construction, plus warm
    /// per-request buffers).
    #[must_use]
    pub fn heap_bytes(self) -> usize {
        let policy = match &self.m.policy {
            Policy::Lru(l) => l.heap_bytes(),
            Policy::Arc(a) => a.heap_bytes(),
        };
        self.m.chunks.heap_bytes()
            + policy
            + self.m.tracker.as_ref().map_or(0, Tracker::heap_bytes)
            + self.m.events.as_ref().map_or(0, EventQueue::heap_bytes)
            + self.m.requests.heap_bytes()
    }

    /// Checks the manager's invariants: `allocated − free` bookkeeping, `evictable` and
    /// `write_pending` equal the chunk states, every resident key has exactly one slot and the
    /// policy holds exactly the resident chunks.
    ///
    /// # Errors
    /// A description of the first broken invariant (a bug in kvtier).
    pub fn check_invariants(self) -> Result<(), &'static str> {
        let (mut pending, mut idle, mut pinned) = (0u32, 0u32, 0u32);
        for s in 0..self.m.cfg.num_chunks {
            let r = self.m.chunks.ref_cnt(s);
            if r == chunks::ABSENT {
                if self.m.chunks.pool.holds(s) {
                    return Err("an allocated slot holds no key");
                }
                continue;
            }
            if !self.m.chunks.pool.holds(s) {
                return Err("a free slot holds a key");
            }
            if self.m.chunks.find(&self.m.chunks.key(s)) != Some(s) {
                return Err("a resident key does not map back to its slot");
            }
            match r {
                PENDING => pending += 1,
                0 => idle += 1,
                r if r > 0 => pinned += 1,
                _ => return Err("a chunk has an impossible ref_cnt"),
            }
        }
        if self.m.chunks.len() != (pending + idle + pinned) as usize {
            return Err("the key index and the slot table disagree");
        }
        if self.allocated() != pending + idle + pinned {
            return Err("allocated - free != write_pending + pinned + evictable");
        }
        if pending != self.m.write_pending {
            return Err("write_pending does not count the pending chunks");
        }
        if idle != self.m.evictable {
            return Err("evictable does not count the idle chunks");
        }
        let in_policy = match &self.m.policy {
            Policy::Lru(l) => l.order(self.m.chunks.keys()).len(),
            Policy::Arc(a) => {
                let (t1, t2) = a.lists();
                t1.len() + t2.len()
            }
        };
        if in_policy != self.m.chunks.len() {
            return Err("the policy does not hold exactly the resident chunks");
        }
        if let Policy::Arc(a) = &self.m.policy {
            let (_, _, b1, b2) = a.sizes();
            if a.ghosts_held(self.m.chunks.pool.table()) != (b1 + b2) as usize {
                return Err("the key table does not hold exactly the ghost lists' keys");
            }
        }
        Ok(())
    }
}
