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
//! where that request's major value sits (nodes `0..max_requests` are the anchors, node
//! `max_requests + slot` is a slot's; each node carries its rank next to its links). Every rank change is then O(1): a fresh rank is the
//! largest rank there is (append at the tail), and a request rank is placed right after its
//! anchor, walking only past the request's own chunks that rank lower — none when blocks arrive
//! head to tail, which is how a scheduler offers them. Eviction walks from the head and takes
//! the first idle (`ref_cnt == 0`), unprotected chunks: exactly the heap's pop order
//! restricted to evictable chunks, so the victims are vLLM's.

use alloc::vec::Vec;

use super::chunks::PROTECTED;
use super::links::{Links, List, NIL};
use crate::key::OffloadKey;
use crate::reserve::AllocError;

/// The rank state of a request, kept in the request's own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestRank {
    /// The request's major value; 0 means none allocated.
    pub(crate) major: u64,
    /// The policy generation the major belongs to.
    pub(crate) generation: u64,
}

/// A node's rank `(major, minor)`, smallest evicted first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    major: u64,
    minor: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct Lru {
    /// Anchors are nodes `0..base`, slot `s` is node `base + s`.
    links: Links<Rank>,
    order: List,
    base: u32,
    next_rank: u64,
    generation: u64,
    /// Where eviction scans start (a node): every node before it is pinned, pending or an
    /// anchor (NIL: scan from the head). Keeps eviction from re-walking the in-flight chunks.
    hint: u32,
}

impl Lru {
    pub(crate) fn new(n: u32, max_requests: u32) -> Result<Self, AllocError> {
        let nodes = n.checked_add(max_requests).ok_or(AllocError)?;
        Ok(Lru {
            links: Links::new(nodes)?,
            order: List::EMPTY,
            base: max_requests,
            next_rank: 0,
            generation: 0,
            hint: NIL,
        })
    }

    /// The node of `slot`.
    #[inline(always)]
    fn node(&self, slot: u32) -> u32 {
        self.base + slot
    }

    /// The slot of `node`, `None` for an anchor.
    #[inline(always)]
    fn slot_of(&self, node: u32) -> Option<u32> {
        node.checked_sub(self.base)
    }

    /// Unlinks node `i`, moving the scan hint back to its predecessor if it pointed at `i`.
    #[inline(always)]
    fn unlink(&mut self, i: u32) {
        if self.hint == i {
            self.hint = self.links.prev(i);
        }
        self.links.unlink(&mut self.order, i);
    }

    /// `rank(a) < rank(b)` for linked nodes (anchors sort before their request's chunks; ties
    /// between chunks break by key).
    #[inline]
    fn ranks_before<K: OffloadKey>(&self, a: u32, b: u32, keys: &[K]) -> bool {
        let (ra, rb) = (self.links.data(a), self.links.data(b));
        if ra != rb {
            return ra < rb;
        }
        match (self.slot_of(a), self.slot_of(b)) {
            (Some(x), Some(y)) => keys[x as usize] < keys[y as usize],
            _ => false,
        }
    }

    /// Slot `slot` just became idle (evictable): keep the scan hint at or before it.
    #[inline]
    pub(crate) fn on_evictable<K: OffloadKey>(&mut self, slot: u32, keys: &[K]) {
        let node = self.node(slot);
        if self.hint != NIL && self.ranks_before(node, self.hint, keys) {
            self.hint = node;
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
        self.links.set_data(
            req_index,
            Rank {
                major,
                minor: i64::MIN,
            },
        );
        self.links.push_back(&mut self.order, req_index);
        *rank = RequestRank {
            major,
            generation: self.generation,
        };
        major
    }

    /// Unlinks a finished or dropped request's anchor.
    pub(crate) fn release_request(&mut self, rank: &mut RequestRank, req_index: u32) {
        if rank.major != 0 && rank.generation == self.generation {
            self.unlink(req_index);
        }
        *rank = RequestRank::default();
    }

    /// Places unlinked `node` with rank `rank` right after the request's anchor, past the
    /// bucket's chunks that rank lower.
    #[inline(always)]
    fn place_in_bucket<K: OffloadKey>(&mut self, node: u32, rank: Rank, anchor: u32, keys: &[K]) {
        self.links.set_data(node, rank);
        let mut at = self.links.next(anchor);
        while let Some(s) = self.slot_of(at).filter(|_| at != NIL) {
            let r = self.links.data(at);
            // The key breaks a tie only, so it is read only then.
            if r.major != rank.major
                || r.minor > rank.minor
                || (r.minor == rank.minor
                    && keys.get(s as usize) >= keys.get((node - self.base) as usize))
            {
                break;
            }
            at = self.links.next(at);
        }
        self.links.insert_before(&mut self.order, at, node);
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
        let node = self.node(slot);
        match position {
            None => {
                let major = self.fresh_major();
                self.links.set_data(node, Rank { major, minor: 0 });
                self.links.push_back(&mut self.order, node);
            }
            Some(p) => {
                let major = self.request_major(rank, req_index);
                let r = Rank {
                    major,
                    minor: neg_position(p),
                };
                self.place_in_bucket(node, r, req_index, keys);
            }
        }
    }

    /// Forgets a chunk (failed store or eviction).
    pub(crate) fn remove(&mut self, slot: u32) {
        self.unlink(self.node(slot));
    }

    /// Gives resident `slot` a fresh (largest) rank.
    #[inline(always)]
    pub(crate) fn refresh(&mut self, slot: u32) {
        let node = self.node(slot);
        let major = self.fresh_major();
        self.links.set_data(node, Rank { major, minor: 0 });
        if self.order.tail != node {
            self.unlink(node);
            self.links.push_back(&mut self.order, node);
        }
    }

    /// Allocates the request's rank if needed (vLLM does this on every access batch with at
    /// least one new key, even when none of them is resident).
    /// [`refresh`](Self::refresh) of each slot in turn (distinct slots), moving each run of
    /// slots that already follow one another in the list to the tail at once: the list, the
    /// ranks and the eviction hint end exactly as the one-by-one refreshes leave them.
    pub(crate) fn refresh_all(&mut self, slots: impl Iterator<Item = u32>) {
        let (mut first, mut last) = (NIL, NIL);
        for slot in slots {
            let node = self.node(slot);
            if last != NIL && self.links.next(last) == node {
                last = node;
                continue;
            }
            if first != NIL {
                self.refresh_run(first, last);
            }
            (first, last) = (node, node);
        }
        if first != NIL {
            self.refresh_run(first, last);
        }
    }

    /// Refreshes the linked run `first..=last`, front to back.
    fn refresh_run(&mut self, first: u32, last: u32) {
        // One-by-one, a lone node at the tail stays put and keeps the hint; otherwise every
        // node of the run is unlinked in turn, each with the run's predecessor before it, so a
        // hint inside the run ends on that predecessor.
        let moved = first != last || self.order.tail != first;
        let before = self.links.prev(first);
        let mut at = first;
        loop {
            let major = self.fresh_major();
            self.links.set_data(at, Rank { major, minor: 0 });
            if self.hint == at && moved {
                self.hint = before;
            }
            if at == last {
                break;
            }
            at = self.links.next(at);
        }
        self.links.move_run_to_tail(&mut self.order, first, last);
    }

    pub(crate) fn begin_access(&mut self, rank: &mut RequestRank, req_index: u32) -> u64 {
        self.request_major(rank, req_index)
    }

    /// A request's first access to resident `slot` at `position`: raise its rank to
    /// `(request_major, −position)` if that is larger.
    #[inline(always)]
    pub(crate) fn on_access<K: OffloadKey>(
        &mut self,
        slot: u32,
        position: u64,
        request_major: u64,
        req_index: u32,
        keys: &[K],
    ) {
        let node = self.node(slot);
        let new = Rank {
            major: request_major,
            minor: neg_position(position),
        };
        if self.links.data(node) >= new {
            return;
        }
        self.unlink(node);
        self.place_in_bucket(node, new, req_index, keys);
    }

    /// Chooses `need` victims in rank order among idle chunks (not [`PROTECTED`]), appending
    /// their slots to `out`. All or nothing: on `false` nothing changed (and `out` is
    /// truncated back).
    pub(crate) fn evict(&mut self, need: u32, ref_cnt: &[i32], out: &mut Vec<u32>) -> bool {
        let start = out.len();
        let mut at = if self.hint == NIL {
            self.order.head
        } else {
            self.hint
        };
        let mut found = 0;
        let mut first_idle_kept = NIL;
        while at != NIL && found < need {
            if let Some(s) = self.slot_of(at) {
                match ref_cnt.get(s as usize) {
                    Some(0) => {
                        out.push(s);
                        found += 1;
                    }
                    Some(&PROTECTED) if first_idle_kept == NIL => first_idle_kept = at,
                    _ => {}
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
            self.links.unlink(&mut self.order, self.base + slot);
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
        core::iter::from_fn(move || {
            while at != NIL {
                let cur = at;
                at = self.links.next(cur);
                if let Some(s) = self.slot_of(cur) {
                    return Some(s);
                }
            }
            None
        })
    }

    /// The bytes [`Lru::new`] allocates.
    pub(crate) fn bytes(n: u64, max_requests: u64) -> u64 {
        Links::<Rank>::bytes(n.saturating_add(max_requests))
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.links.heap_bytes()
    }
}

/// `−position`, which fits in an `i64` because positions are validated to be ≤ `i64::MAX`.
#[inline]
fn neg_position(p: u64) -> i64 {
    i64::try_from(p).map_or(i64::MIN + 1, |v| -v)
}
