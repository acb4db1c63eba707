//! vLLM 0.33.0's ARC policy: T1 (seen once), T2 (seen more than once), ghost lists B1 and B2,
//! and an adaptive target size for T1.
//!
//! The target is an `f64` updated with exactly vLLM's operations in vLLM's order, because it
//! decides victims and matching vLLM's victims exactly matters more than integer purity (the
//! one float in the core's decisions; IEEE arithmetic makes it identical on every target).

use alloc::vec::Vec;

use super::key_table::KeyTable;
use super::links::{Links, List, NIL};
use crate::hashing::FixedState;
use crate::key::OffloadKey;
use crate::reserve::{AllocError, Lazy};

const NONE: u8 = 0;
const T1: u8 = 1;
const T2: u8 = 2;

#[derive(Clone, Debug)]
pub(crate) struct Arc<K> {
    links: Links,
    /// The list each node is in, one byte per node (in the nodes it would pad each to 12).
    which: Lazy<u8>,
    t1: List,
    t2: List,
    ghosts: Ghosts<K>,
    target: f64,
    capacity: u32,
}

impl<K: OffloadKey> Arc<K> {
    pub(crate) fn new(n: u32, hasher: FixedState, grow: bool) -> Result<Self, AllocError> {
        Ok(Arc {
            links: Links::new(n)?,
            which: Lazy::new(n as usize, NONE)?,
            t1: List::EMPTY,
            t2: List::EMPTY,
            ghosts: Ghosts::new(n, hasher, grow)?,
            target: 0.0,
            capacity: n,
        })
    }

    /// The bytes [`Arc::new`] allocates for `n` slots (and `2 · n` ghost nodes).
    pub(crate) fn bytes(n: u64) -> u64 {
        Links::<()>::bytes(n)
            .saturating_add(Lazy::<u8>::bytes(n))
            .saturating_add(Ghosts::<K>::bytes(n))
    }

    /// Makes room for `victims` more ghosts (see [`KeyTable::reserve`]).
    pub(crate) fn reserve_ghosts(&mut self, victims: u32) -> Result<(), AllocError> {
        self.ghosts.table.reserve(victims)
    }

    /// The adaptive target size of T1.
    pub(crate) fn target(&self) -> f64 {
        self.target
    }

    /// (|T1|, |T2|, |B1|, |B2|).
    pub(crate) fn sizes(&self) -> (u32, u32, u32, u32) {
        (
            self.t1.len,
            self.t2.len,
            self.ghosts.lists[B1 as usize].len,
            self.ghosts.lists[B2 as usize].len,
        )
    }

    /// A new chunk goes to the MRU end of T1 and leaves the ghost lists.
    pub(crate) fn insert(&mut self, slot: u32, key: &K) {
        self.which.set(slot as usize, T1);
        self.links.push_back(&mut self.t1, slot);
        self.ghosts.remove(key);
    }

    /// Forgets a chunk without a ghost entry (failed store).
    pub(crate) fn remove(&mut self, slot: u32) {
        match self.which.get(slot as usize) {
            T1 => self.links.unlink(&mut self.t1, slot),
            T2 => self.links.unlink(&mut self.t2, slot),
            _ => return,
        }
        self.which.set(slot as usize, NONE);
    }

    /// Ghost adaptation for a key that is not resident.
    pub(crate) fn adapt(&mut self, key: &K) {
        let Some(node) = self.ghosts.find(key) else {
            return;
        };
        let cap = f64::from(self.capacity);
        let g = &mut self.ghosts;
        let [l1, l2] = &mut g.lists;
        let (b1, b2) = (f64::from(l1.len), f64::from(l2.len));
        if Ghosts::<K>::list_of(node) == B1 {
            let delta = py_max_one(b2 / b1);
            let t = self.target + delta;
            self.target = if t <= cap { t } else { cap };
            g.links.move_to_tail(l1, node);
        } else {
            let delta = py_max_one(b1 / b2);
            let t = self.target - delta;
            self.target = if t >= 0.0 { t } else { 0.0 };
            g.links.move_to_tail(l2, node);
        }
    }

    /// `touch` of one key (callers walk the keys in reverse). `slot` is the key's slot if
    /// resident, with its readiness.
    pub(crate) fn touch(&mut self, key: &K, slot: Option<(u32, bool)>) {
        match slot {
            Some((s, ready)) => match self.which.get(s as usize) {
                T1 if ready => {
                    self.links.move_to_back(&mut self.t1, &mut self.t2, s);
                    self.which.set(s as usize, T2);
                }
                T1 => self.links.move_to_tail(&mut self.t1, s),
                T2 => self.links.move_to_tail(&mut self.t2, s),
                _ => {}
            },
            None => self.adapt(key),
        }
    }

    /// The end of a request, for one resident key (callers walk tail to head).
    pub(crate) fn on_finished(&mut self, slot: u32, insertion_only: bool, reused: bool) {
        let w = self.which.get(slot as usize);
        if insertion_only {
            match w {
                T1 => self.links.move_to_tail(&mut self.t1, slot),
                T2 => self.links.move_to_tail(&mut self.t2, slot),
                _ => {}
            }
        } else if reused {
            match w {
                T1 => {
                    self.links.move_to_back(&mut self.t1, &mut self.t2, slot);
                    self.which.set(slot as usize, T2);
                }
                T2 => self.links.move_to_tail(&mut self.t2, slot),
                _ => {}
            }
        }
    }

    /// Chooses `need` victims with vLLM's two monotonic scanners, appending `(slot)` to `out`;
    /// on success moves them to the ghost lists (T1 victims to B1, T2 victims to B2), trimming
    /// each ghost list to the capacity. All or nothing.
    pub(crate) fn evict(
        &mut self,
        need: u32,
        keys: &[K],
        ref_cnt: &[i32],
        out: &mut Vec<u32>,
    ) -> bool {
        let start = out.len();
        // Idle and not protected by the store call.
        let eligible = |s: u32| ref_cnt.get(s as usize) == Some(&0);
        let mut c1 = self.t1.head;
        let mut c2 = self.t2.head;
        let links = &self.links;
        let next_eligible = |cursor: &mut u32| -> Option<u32> {
            while *cursor != NIL {
                let s = *cursor;
                *cursor = links.next(s);
                if eligible(s) {
                    return Some(s);
                }
            }
            None
        };
        let mut virtual_t1 = f64::from(self.t1.len);
        let floor_target = libm::floor(self.target);
        for _ in 0..need {
            let mut pick = None;
            if virtual_t1 >= floor_target
                && let Some(s) = next_eligible(&mut c1)
            {
                pick = Some(s);
                virtual_t1 -= 1.0;
            }
            if pick.is_none() {
                pick = next_eligible(&mut c2);
            }
            if pick.is_none()
                && let Some(s) = next_eligible(&mut c1)
            {
                pick = Some(s);
                virtual_t1 -= 1.0;
            }
            match pick {
                Some(s) => out.push(s),
                None => {
                    out.truncate(start);
                    return false;
                }
            }
        }
        for &s in &out[start..] {
            let key = keys[s as usize];
            if self.which.get(s as usize) == T1 {
                self.links.unlink(&mut self.t1, s);
                self.ghosts.push(B1, key);
            } else {
                self.links.unlink(&mut self.t2, s);
                self.ghosts.push(B2, key);
            }
            self.which.set(s as usize, NONE);
        }
        true
    }

    /// Empties all four lists and resets the target.
    pub(crate) fn clear(&mut self) {
        self.t1 = List::EMPTY;
        self.t2 = List::EMPTY;
        self.which.clear();
        self.ghosts.clear();
        self.target = 0.0;
    }

    /// Resident slots of T1 then T2, LRU first (for tests and invariant checks).
    pub(crate) fn lists(&self) -> (Vec<u32>, Vec<u32>) {
        let walk = |l: &List| {
            let mut v = Vec::new();
            let mut at = l.head;
            while at != NIL {
                v.push(at);
                at = self.links.next(at);
            }
            v
        };
        (walk(&self.t1), walk(&self.t2))
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.links.heap_bytes() + self.which.heap_bytes() + self.ghosts.heap_bytes()
    }

    /// Passes every key of B1 and B2 to `f`, in no particular order.
    pub(crate) fn for_each_ghost(&self, mut f: impl FnMut(&K)) {
        self.ghosts.table.for_each_key(&mut f);
    }
}

/// Python's `max(1, x)` for a positive float `x`: 1 unless `x` is larger.
#[inline]
fn py_max_one(x: f64) -> f64 {
    if x > 1.0 { x } else { 1.0 }
}

/// The two ghost lists, by the parity of their ids.
const B1: u32 = 0;
const B2: u32 = 1;

/// The ghost lists: keys recently evicted from T1 (B1) and T2 (B2), each at most `capacity`
/// long, in a table of `2 · capacity` ids. B1's ids are even and B2's odd, so a ghost's id
/// says its list: no per-ghost list byte and no id allocator beyond each list's count of
/// ids ever used and its list of freed ones.
#[derive(Clone, Debug)]
struct Ghosts<K> {
    table: KeyTable<K>,
    /// B1, B2 and each one's freed ids, threaded through one node table.
    links: Links,
    lists: [List; 2],
    free: [List; 2],
    /// How many of each list's ids have ever been used (its next fresh id is
    /// `2 · fresh[list] + list`).
    fresh: [u32; 2],
    capacity: u32,
}

impl<K: OffloadKey> Ghosts<K> {
    fn new(capacity: u32, hasher: FixedState, grow: bool) -> Result<Self, AllocError> {
        // The configuration keeps 2 · capacity below 2^32.
        let n = capacity.checked_mul(2).ok_or(AllocError)?;
        Ok(Ghosts {
            table: KeyTable::new(n, hasher, grow)?,
            links: Links::new(n)?,
            lists: [List::EMPTY; 2],
            free: [List::EMPTY; 2],
            fresh: [0; 2],
            capacity,
        })
    }

    /// The bytes [`Ghosts::new`] allocates for `capacity` ghosts per list.
    fn bytes(capacity: u64) -> u64 {
        let n = capacity.saturating_mul(2);
        KeyTable::<K>::bytes(n).saturating_add(Links::<()>::bytes(n))
    }

    #[inline]
    fn find(&self, key: &K) -> Option<u32> {
        self.table.find(key)
    }

    /// The list ghost `node` is in.
    #[inline]
    const fn list_of(node: u32) -> u32 {
        node & 1
    }

    #[inline]
    fn remove(&mut self, key: &K) {
        if let Some(node) = self.table.remove_key(key) {
            self.release(node);
        }
    }

    /// Takes `node` (just forgotten by the table) out of its list into its list's free ids.
    #[inline]
    fn release(&mut self, node: u32) {
        let l = Self::list_of(node) as usize;
        self.links.unlink(&mut self.lists[l], node);
        self.links.push_back(&mut self.free[l], node);
    }

    /// Appends `key` (not a ghost yet) at the MRU end of `list`, dropping that list's LRU entry
    /// first when it is full — the same result as vLLM's append-then-trim.
    fn push(&mut self, list: u32, key: K) {
        if self.capacity == 0 {
            return;
        }
        let l = list as usize;
        if self.lists[l].len >= self.capacity {
            let head = self.lists[l].head;
            self.table.remove(head);
            self.release(head);
        }
        let node = match self.free[l].head {
            NIL => {
                // Fewer than `capacity` of this list's ids are in use and none is free, so
                // this one is below 2 · capacity.
                let id = 2 * self.fresh[l] + list;
                self.fresh[l] += 1;
                id
            }
            freed => {
                self.links.unlink(&mut self.free[l], freed);
                freed
            }
        };
        self.table.insert_at(node, key);
        self.links.push_back(&mut self.lists[l], node);
    }

    fn clear(&mut self) {
        self.table.clear();
        self.lists = [List::EMPTY; 2];
        self.free = [List::EMPTY; 2];
        self.fresh = [0; 2];
    }

    fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + self.links.heap_bytes()
    }
}
