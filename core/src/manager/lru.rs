//! vLLM 0.33.0's rank-based, request-scoped LRU policy.
//!
//! Every resident chunk has a rank `(major, minor)`; the smallest rank (ties broken by key) is
//! evicted first. A *fresh* rank is `(next_rank += 1, 0)`. A request allocates one major value
//! the first time it needs one, and its keys with an end-token position `p` rank as
//! `(request_major, −p)`, so within a request the tail sorts before the head. `touch` and the
//! end of a request give fresh ranks, walking keys tail to head.
//!
//! vLLM keeps the evictable chunks in a lazily rebuilt binary heap. kvtier keeps *all* resident
//! chunks in one intrusive list sorted by rank, with an anchor node per live request marking
//! where that request's major value sits. Every rank change is then O(1): a fresh rank is the
//! largest rank there is (append at the tail), and a request rank is placed right after its
//! anchor, walking only past the request's own chunks that rank lower — none when blocks arrive
//! head to tail, which is how a scheduler offers them. Eviction walks from the head and takes
//! the first idle (`ref_cnt == 0`), unprotected chunks: exactly the heap's pop order
//! restricted to evictable chunks, so the victims are vLLM's.

use alloc::vec::Vec;

use super::links::{Links, List, NIL};
use crate::key::OffloadKey;
use crate::reserve::{AllocError, Lazy, Split};

/// The rank state of a request, kept in the request's own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestRank {
    /// The request's major value; 0 means none allocated.
    pub(crate) major: u64,
    /// The policy generation the major belongs to.
    pub(crate) generation: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Lru {
    links: Links,
    order: List,
    major: Split<u64>,
    minor: Split<i64>,
    /// Slots are nodes `0..n`; request anchors are `n..n + max_requests`.
    n: u32,
    next_rank: u64,
    generation: u64,
    /// Where eviction scans start: every node before it is pinned, pending or an anchor
    /// (NIL: scan from the head). Keeps eviction from re-walking the in-flight chunks.
    hint: u32,
}

impl Lru {
    pub(crate) fn new(n: u32, max_requests: u32) -> Result<Self, AllocError> {
        Ok(Lru {
            links: Links::split(n, max_requests)?,
            order: List::EMPTY,
            major: Split::new(n, max_requests, 0)?,
            minor: Split::new(n, max_requests, 0)?,
            n,
            next_rank: 0,
            generation: 0,
            hint: NIL,
        })
    }

    /// Unlinks node `i`, moving the scan hint back to its predecessor if it pointed at `i`.
    #[inline]
    fn unlink(&mut self, i: u32) {
        if self.hint == i {
            self.hint = self.links.prev(i);
        }
        self.links.unlink(&mut self.order, i);
    }

    /// `rank(a) < rank(b)` for linked nodes (anchors sort before their request's chunks).
    #[inline]
    fn ranks_before<K: OffloadKey>(&self, a: u32, b: u32, keys: &[K]) -> bool {
        let ra = (self.major.get(a), self.minor.get(a));
        let rb = (self.major.get(b), self.minor.get(b));
        if ra != rb {
            return ra < rb;
        }
        a < self.n && b < self.n && keys[a as usize] < keys[b as usize]
    }

    /// Slot `slot` just became idle (evictable): keep the scan hint at or before it.
    #[inline]
    pub(crate) fn on_evictable<K: OffloadKey>(&mut self, slot: u32, keys: &[K]) {
        if self.hint != NIL && self.ranks_before(slot, self.hint, keys) {
            self.hint = slot;
        }
    }

    fn fresh_major(&mut self) -> u64 {
        self.next_rank += 1;
        self.next_rank
    }

    /// The request's major value, allocating it (and linking its anchor at the tail) if the
    /// request has none in this generation.
    fn request_major(&mut self, rank: &mut RequestRank, req_index: u32) -> u64 {
        if rank.major != 0 && rank.generation == self.generation {
            return rank.major;
        }
        let major = self.fresh_major();
        let anchor = self.n + req_index;
        self.major.set(anchor, major);
        self.minor.set(anchor, i64::MIN);
        self.links.push_back(&mut self.order, anchor);
        *rank = RequestRank {
            major,
            generation: self.generation,
        };
        major
    }

    /// Unlinks a finished or dropped request's anchor.
    pub(crate) fn release_request(&mut self, rank: &mut RequestRank, req_index: u32) {
        if rank.major != 0 && rank.generation == self.generation {
            self.unlink(self.n + req_index);
        }
        *rank = RequestRank::default();
    }

    /// Places unlinked `slot` with rank `(major, minor)` right after the request's anchor,
    /// past the bucket's chunks that rank lower.
    fn place_in_bucket<K: OffloadKey>(&mut self, slot: u32, anchor: u32, keys: &[K]) {
        let (major, minor) = (self.major.get(slot), self.minor.get(slot));
        let key = keys[slot as usize];
        let mut at = self.links.next(anchor);
        while at != NIL
            && at < self.n
            && self.major.get(at) == major
            && (self.minor.get(at), keys[at as usize]) < (minor, key)
        {
            at = self.links.next(at);
        }
        self.links.insert_before(&mut self.order, at, slot);
    }

    /// A newly stored chunk: request rank when it has a position, else a fresh rank.
    pub(crate) fn insert<K: OffloadKey>(
        &mut self,
        slot: u32,
        position: Option<u64>,
        rank: &mut RequestRank,
        req_index: u32,
        keys: &[K],
    ) {
        match position {
            None => {
                let m = self.fresh_major();
                self.major.set(slot, m);
                self.minor.set(slot, 0);
                self.links.push_back(&mut self.order, slot);
            }
            Some(p) => {
                let m = self.request_major(rank, req_index);
                self.major.set(slot, m);
                self.minor.set(slot, neg_position(p));
                self.place_in_bucket(slot, self.n + req_index, keys);
            }
        }
    }

    /// Forgets a chunk (failed store or eviction).
    pub(crate) fn remove(&mut self, slot: u32) {
        self.unlink(slot);
    }

    /// Gives resident `slot` a fresh (largest) rank.
    pub(crate) fn refresh(&mut self, slot: u32) {
        let m = self.fresh_major();
        self.major.set(slot, m);
        self.minor.set(slot, 0);
        if self.order.tail != slot {
            self.unlink(slot);
            self.links.push_back(&mut self.order, slot);
        }
    }

    /// Allocates the request's rank if needed (vLLM does this on every access batch with at
    /// least one new key, even when none of them is resident).
    pub(crate) fn begin_access(&mut self, rank: &mut RequestRank, req_index: u32) -> u64 {
        self.request_major(rank, req_index)
    }

    /// A request's first access to resident `slot` at `position`: raise its rank to
    /// `(request_major, −position)` if that is larger.
    pub(crate) fn on_access<K: OffloadKey>(
        &mut self,
        slot: u32,
        position: u64,
        request_major: u64,
        req_index: u32,
        keys: &[K],
    ) {
        let new = (request_major, neg_position(position));
        if (self.major.get(slot), self.minor.get(slot)) >= new {
            return;
        }
        self.unlink(slot);
        self.major.set(slot, new.0);
        self.minor.set(slot, new.1);
        self.place_in_bucket(slot, self.n + req_index, keys);
    }

    /// Chooses `need` victims in rank order among idle chunks not stamped with `stamp`,
    /// appending them to `out`. All or nothing: on `false` nothing changed (and `out` is
    /// truncated back).
    pub(crate) fn evict(
        &mut self,
        need: u32,
        ref_cnt: &[i32],
        stamps: &[u32],
        stamp: u32,
        out: &mut Vec<u32>,
    ) -> bool {
        let start = out.len();
        let mut at = if self.hint == NIL {
            self.order.head
        } else {
            self.hint
        };
        let mut found = 0;
        let mut first_idle_kept = NIL;
        while at != NIL && found < need {
            if at < self.n && ref_cnt.get(at as usize) == Some(&0) {
                if stamps.get(at as usize).copied().unwrap_or(0) != stamp {
                    out.push(at);
                    found += 1;
                } else if first_idle_kept == NIL {
                    first_idle_kept = at;
                }
            }
            at = self.links.next(at);
        }
        if found < need {
            out.truncate(start);
            return false;
        }
        // Everything scanned before the first idle chunk kept (or before the node after the
        // last victim) is pinned, pending or an anchor.
        let new_hint = if first_idle_kept == NIL {
            at
        } else {
            first_idle_kept
        };
        for &slot in &out[start..] {
            self.links.unlink(&mut self.order, slot);
        }
        self.hint = if new_hint == NIL {
            self.order.tail
        } else {
            new_hint
        };
        true
    }

    /// Forgets everything; ranks restart at 1 and every request's rank becomes stale.
    pub(crate) fn clear(&mut self) {
        self.order = List::EMPTY;
        self.hint = NIL;
        self.next_rank = 0;
        self.generation += 1;
    }

    /// Resident chunks in eviction order, head first (for tests and invariant checks).
    pub(crate) fn order(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.order.head;
        let n = self.n;
        core::iter::from_fn(move || {
            while at != NIL {
                let cur = at;
                at = self.links.next(cur);
                if cur < n {
                    return Some(cur);
                }
            }
            None
        })
    }

    /// The bytes [`Lru::new`] allocates.
    pub(crate) fn bytes(n: u64, max_requests: u64) -> u64 {
        let nodes = n.saturating_add(max_requests);
        Links::bytes(nodes)
            .saturating_add(Lazy::<u64>::bytes(nodes))
            .saturating_add(Lazy::<i64>::bytes(nodes))
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.links.heap_bytes() + self.major.heap_bytes() + self.minor.heap_bytes()
    }
}

/// `−position`, which fits in an `i64` because positions are validated to be ≤ `i64::MAX`.
#[inline]
fn neg_position(p: u64) -> i64 {
    i64::try_from(p).map_or(i64::MIN + 1, |v| -v)
}
