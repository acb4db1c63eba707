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
//! `max_requests + slot` is a slot's; each node carries its rank next to its links). Every rank
//! change is then O(1): a fresh rank is the largest rank there is (append at the tail), and a
//! request rank is placed right after its anchor, walking only past the request's own chunks
//! that rank lower — none when blocks arrive head to tail, which is how a scheduler offers
//! them. Eviction walks from the head (from the scan hint, past which no idle chunk sits) and
//! takes the first idle (`ref_cnt == 0`), unprotected chunks: exactly the heap's pop order
//! restricted to evictable chunks, so the victims are vLLM's.
//!
//! A request's access to a chunk usually does not move it. When the request's anchor lies past
//! the scan hint, the chunk takes its new rank where it is and is *displaced*: it remembers the
//! anchor, and the request lists it. A chunk the request stores is linked displaced too, next
//! to the request's previous displaced chunk (no walk from the anchor). Scans pass displaced
//! chunks by; a scan that meets an anchor first places that request's displaced chunks into its
//! bucket, so they are met at their ranks; a finishing request refreshes them (moving them to
//! the tail, which it would do anyway), a dropped one places them. A loaded prefix therefore
//! moves once per request (at its end) instead of twice, and a request's chunks tend to lie in
//! the order its end refreshes them, as one run. [`Lru::order`] merges the displaced chunks
//! back in.

use alloc::vec::Vec;

use super::chunks::PROTECTED;
use super::links::{Links, List, NIL};
use super::request::{RequestRank, Requests};
use crate::key::OffloadKey;
use crate::reserve::{AllocError, Lazy};

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
    /// Where eviction scans start (a node): every node before it is pinned, pending, an anchor
    /// or displaced (NIL: scan from the head). Keeps eviction from re-walking the in-flight
    /// chunks. Never a displaced node itself.
    hint: u32,
    /// By slot: the anchor of the request bucket a *displaced* chunk belongs in, `NIL` for a
    /// chunk that sits where its rank says. See [`on_access`](Self::on_access).
    anchor_of: Lazy<u32>,
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
            anchor_of: Lazy::new(n as usize, NIL)?,
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
            self.settle_hint();
        }
        self.links.unlink(&mut self.order, i);
    }

    /// Whether `slot`'s chunk is displaced.
    #[inline(always)]
    fn is_displaced(&self, slot: u32) -> bool {
        self.anchor_of.get(slot as usize) != NIL
    }

    /// Whether `node` is a displaced chunk (anchors never are).
    #[inline(always)]
    fn displaced(&self, node: u32) -> bool {
        self.slot_of(node).is_some_and(|s| self.is_displaced(s))
    }

    /// Moves the hint back past displaced nodes (a scan starting earlier only walks more).
    #[inline]
    fn settle_hint(&mut self) {
        while self.hint != NIL && self.displaced(self.hint) {
            self.hint = self.links.prev(self.hint);
        }
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
        // A displaced chunk's bucket lies past the hint: a scan meets it at its anchor.
        if self.is_displaced(slot) {
            return;
        }
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
        if self.anchor_linked(rank) {
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

    /// Unlinks a finished request's anchor and empties `displaced`, its list of displaced
    /// chunks: its end has just refreshed every chunk of its own, so none is displaced into
    /// its bucket any more.
    pub(crate) fn finish_request(
        &mut self,
        rank: &mut RequestRank,
        req_index: u32,
        displaced: &mut Vec<u32>,
    ) {
        debug_assert!(
            displaced
                .iter()
                .all(|&s| self.anchor_of.get(s as usize) != req_index),
            "a finished request left a chunk displaced"
        );
        displaced.clear();
        self.release_anchor(rank, req_index);
    }

    /// Unlinks a dropped request's anchor, first placing the chunks still displaced into its
    /// bucket (`displaced`, its list, is emptied).
    pub(crate) fn drop_request<K: OffloadKey>(
        &mut self,
        rank: &mut RequestRank,
        req_index: u32,
        displaced: &mut Vec<u32>,
        keys: &[K],
    ) {
        if self.anchor_linked(rank) {
            self.place_displaced(req_index, displaced, keys);
        }
        displaced.clear();
        self.release_anchor(rank, req_index);
    }

    /// Whether the request's anchor is linked (it has a major in this generation).
    fn anchor_linked(&self, rank: &RequestRank) -> bool {
        rank.major != 0 && rank.generation == self.generation
    }

    /// Unlinks the request's anchor if linked and forgets its rank.
    fn release_anchor(&mut self, rank: &mut RequestRank, req_index: u32) {
        if self.anchor_linked(rank) {
            self.unlink(req_index);
        }
        *rank = RequestRank::default();
    }

    /// Places the chunks of `list` still displaced into `anchor`'s bucket, emptying `list`.
    fn place_displaced<K: OffloadKey>(&mut self, anchor: u32, list: &mut Vec<u32>, keys: &[K]) {
        for &slot in list.iter() {
            if self.anchor_of.get(slot as usize) != anchor {
                continue; // refreshed, removed, or displaced into a later request since
            }
            self.anchor_of.set(slot as usize, NIL);
            let node = self.node(slot);
            let rank = self.links.data(node);
            self.unlink(node);
            self.place_in_bucket(node, rank, anchor, keys);
        }
        list.clear();
    }

    /// Places unlinked `node` with rank `rank` right after the request's anchor, past the
    /// bucket's chunks that rank lower.
    #[inline(always)]
    fn place_in_bucket<K: OffloadKey>(&mut self, node: u32, rank: Rank, anchor: u32, keys: &[K]) {
        self.links.set_data(node, rank);
        let mut at = self.links.next(anchor);
        while let Some(s) = self.slot_of(at).filter(|_| at != NIL) {
            if self.is_displaced(s) {
                at = self.links.next(at); // it sits elsewhere in rank order
                continue;
            }
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

    /// A newly stored chunk: request rank when it has a position (displaced if it may be, and
    /// listed in `displaced`, the request's list), else a fresh rank.
    pub(crate) fn insert<K: OffloadKey>(
        &mut self,
        slot: u32,
        position: Option<u64>,
        rank: &mut RequestRank,
        req_index: u32,
        keys: &[K],
        displaced: &mut Vec<u32>,
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
                if !self.may_displace(major) {
                    self.place_in_bucket(node, r, req_index, keys);
                    return;
                }
                // Displaced from the start: linked just before the request's last displaced
                // chunk if it still is one (a scheduler offers a request's blocks head to tail,
                // so its chunks line up tail first, as its end refreshes them: one run), else
                // at the tail. Chosen before this slot is marked: the list may name the slot
                // from an earlier chunk, and the slot itself is not linked yet.
                let before = displaced
                    .last()
                    .filter(|&&d| self.anchor_of.get(d as usize) == req_index)
                    .map_or(NIL, |&d| self.node(d));
                self.links.set_data(node, r);
                self.anchor_of.set(slot as usize, req_index);
                self.links.insert_before(&mut self.order, before, node);
                displaced.push(slot);
            }
        }
    }

    /// Whether a chunk given a rank of request major `major` may stay displaced: the request's
    /// anchor lies past the scan hint (anchors sort by major, before their chunks).
    #[inline(always)]
    fn may_displace(&self, major: u64) -> bool {
        self.hint != NIL && major > self.links.data(self.hint).major
    }

    /// Forgets a chunk (failed store or eviction).
    pub(crate) fn remove(&mut self, slot: u32) {
        self.anchor_of.set(slot as usize, NIL);
        self.unlink(self.node(slot));
    }

    /// Gives resident `slot` a fresh (largest) rank.
    #[inline(always)]
    pub(crate) fn refresh(&mut self, slot: u32) {
        let node = self.node(slot);
        let major = self.fresh_major();
        self.links.set_data(node, Rank { major, minor: 0 });
        self.anchor_of.set(slot as usize, NIL);
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
            self.anchor_of.set((at - self.base) as usize, NIL);
            if self.hint == at && moved {
                self.hint = before;
            }
            if at == last {
                break;
            }
            at = self.links.next(at);
        }
        self.links.move_run_to_tail(&mut self.order, first, last);
        self.settle_hint();
    }

    pub(crate) fn begin_access(&mut self, rank: &mut RequestRank, req_index: u32) -> u64 {
        self.request_major(rank, req_index)
    }

    /// A request's first access to resident `slot` at `position`: raise its rank to
    /// `(request_major, −position)` if that is larger, leaving the chunk displaced (and listed
    /// in `displaced`, the request's list) if it may be.
    #[inline(always)]
    pub(crate) fn on_access<K: OffloadKey>(
        &mut self,
        slot: u32,
        position: u64,
        request_major: u64,
        req_index: u32,
        keys: &[K],
        displaced: &mut Vec<u32>,
    ) {
        let node = self.node(slot);
        let new = Rank {
            major: request_major,
            minor: neg_position(position),
        };
        if self.links.data(node) >= new {
            return;
        }
        // The request's bucket lies past the hint (its anchor's major is larger than the
        // hint's): the chunk may stay where it is, displaced, until a scan meets the anchor,
        // the request finishes (which refreshes it) or is dropped (which places it).
        if node != self.hint && self.may_displace(request_major) {
            self.links.set_data(node, new);
            if self.anchor_of.get(slot as usize) != req_index {
                self.anchor_of.set(slot as usize, req_index);
                displaced.push(slot);
            }
            return;
        }
        self.anchor_of.set(slot as usize, NIL);
        self.unlink(node);
        self.place_in_bucket(node, new, req_index, keys);
    }

    /// Chooses `need` victims in rank order among idle chunks (not [`PROTECTED`]), appending
    /// their slots to `out`. All or nothing: on `false` no rank and no victim changed (`out`
    /// is truncated back; displaced chunks the scan met may have been placed).
    ///
    /// A scan that meets a request's anchor first places the chunks displaced into its
    /// bucket (`requests` holds each request's list), so that they are met in rank order; a
    /// displaced chunk met anywhere else is passed by.
    pub(crate) fn evict<K: OffloadKey>(
        &mut self,
        need: u32,
        ref_cnt: &[i32],
        out: &mut Vec<u32>,
        requests: &mut Requests<K>,
        keys: &[K],
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
            match self.slot_of(at) {
                Some(s) => match ref_cnt.get(s as usize) {
                    Some(0) if !self.is_displaced(s) => {
                        out.push(s);
                        found += 1;
                    }
                    Some(&PROTECTED) if first_idle_kept == NIL && !self.is_displaced(s) => {
                        first_idle_kept = at;
                    }
                    _ => {}
                },
                None => {
                    if let Some(list) = requests.displaced_mut(at)
                        && !list.is_empty()
                    {
                        self.place_displaced(at, list, keys);
                    }
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
        self.settle_hint();
        true
    }

    /// Forgets everything; ranks restart at 1 and every request's rank becomes stale.
    pub(crate) fn clear(&mut self) {
        self.order = List::EMPTY;
        self.hint = NIL;
        self.anchor_of.clear();
        self.next_rank = 0;
        self.generation += 1;
    }

    /// Resident chunks in eviction order, head first (for tests and invariant checks): the
    /// placed chunks as linked, with the displaced ones merged in at their ranks.
    pub(crate) fn order<K: OffloadKey>(&self, keys: &[K]) -> Vec<u32> {
        let key = |s: u32| keys.get(s as usize);
        let by_rank = |a: u32, b: u32| {
            (self.links.data(self.node(a)), key(a)).cmp(&(self.links.data(self.node(b)), key(b)))
        };
        let (mut placed, mut displaced) = (Vec::new(), Vec::new());
        let mut at = self.order.head;
        // At most the linked count: a broken list then shows as a wrong count, not a hang.
        let mut left = self.order.len;
        while at != NIL && left > 0 {
            left -= 1;
            if let Some(s) = self.slot_of(at) {
                if !self.is_displaced(s) {
                    placed.push(s);
                } else {
                    displaced.push(s);
                }
            }
            at = self.links.next(at);
        }
        displaced.sort_unstable_by(|&a, &b| by_rank(a, b));
        let mut out = Vec::with_capacity(placed.len() + displaced.len());
        let (mut i, mut j) = (0, 0);
        while i < placed.len() || j < displaced.len() {
            let take_placed = j == displaced.len()
                || (i < placed.len() && by_rank(placed[i], displaced[j]).is_le());
            if take_placed {
                out.push(placed[i]);
                i += 1;
            } else {
                out.push(displaced[j]);
                j += 1;
            }
        }
        out
    }

    /// The bytes [`Lru::new`] allocates.
    pub(crate) fn bytes(n: u64, max_requests: u64) -> u64 {
        Links::<Rank>::bytes(n.saturating_add(max_requests)).saturating_add(Lazy::<u32>::bytes(n))
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.links.heap_bytes() + self.anchor_of.heap_bytes()
    }
}

/// `−position`, which fits in an `i64` because positions are validated to be ≤ `i64::MAX`.
#[inline]
fn neg_position(p: u64) -> i64 {
    i64::try_from(p).map_or(i64::MIN + 1, |v| -v)
}
