//! vLLM 0.33.0's ARC policy: T1 (seen once), T2 (seen more than once), ghost lists B1 and B2,
//! and an adaptive target size for T1.
//!
//! The target is an `f64` updated with exactly vLLM's operations in vLLM's order, because it
//! decides victims and matching vLLM's victims exactly matters more than integer purity (the
//! one float in the core's decisions; IEEE arithmetic makes it identical on every target).
//!
//! The ghost keys live in the chunks' key table, at the ids past the slots (a key is resident
//! or a ghost, never both, so one index answers for both): the methods that meet ghost keys
//! take that table.

use alloc::vec::Vec;

use super::key_table::KeyTable;
use super::links::{Links, List, NIL};
use crate::key::OffloadKey;
use crate::reserve::{AllocError, Lazy};
use ghosts::{B1, B2, Ghosts};

mod ghosts;

const NONE: u8 = 0;
const T1: u8 = 1;
const T2: u8 = 2;

#[derive(Clone, Debug)]
pub(crate) struct Arc {
    links: Links,
    /// The list each node is in, one byte per node (in the nodes it would pad each to 12).
    which: Lazy<u8>,
    t1: List,
    t2: List,
    ghosts: Ghosts,
    target: f64,
    capacity: u32,
}

impl Arc {
    /// An empty ARC of `n` slots, whose ghosts take the key table's ids `n..3 · n`.
    pub(crate) fn new(n: u32) -> Result<Self, AllocError> {
        Ok(Arc {
            links: Links::new(n)?,
            which: Lazy::new(n as usize, NONE)?,
            t1: List::EMPTY,
            t2: List::EMPTY,
            ghosts: Ghosts::new(n)?,
            target: 0.0,
            capacity: n,
        })
    }

    /// The bytes [`Arc::new`] allocates for `n` slots (and `2 · n` ghost nodes; their keys
    /// are the key table's).
    pub(crate) fn bytes(n: u64) -> u64 {
        Links::<()>::bytes(n)
            .saturating_add(Lazy::<u8>::bytes(n))
            .saturating_add(Ghosts::bytes(n))
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

    /// A new chunk goes to the MRU end of T1 and its key leaves the ghost lists. `ghost`: the
    /// key table id of the key's ghost when the offer was classified (`NIL`: it was none; a
    /// key that was not one cannot have become one since, as only resident victims do);
    /// `adopted`: the slot took over that ghost's index entry
    /// ([`Chunks::insert_from_ghost`](super::chunks::Chunks::insert_from_ghost)), so only its
    /// node is left to free. A ghost not adopted was dropped from a full list by this call's
    /// evictions (its id gone from the index, or holding another key since); the lists are
    /// still searched for the key then, defensively (the search finds nothing).
    pub(crate) fn insert<K: OffloadKey>(
        &mut self,
        slot: u32,
        key: &K,
        ghost: u32,
        adopted: bool,
        table: &mut KeyTable<K>,
    ) {
        self.which.set(slot as usize, T1);
        self.links.push_back(&mut self.t1, slot);
        if adopted {
            self.ghosts.release(ghost - self.ghosts.capacity);
        } else if ghost != NIL {
            self.ghosts.remove(table, key);
        }
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
    pub(crate) fn adapt<K: OffloadKey>(&mut self, key: &K, table: &KeyTable<K>) {
        if let Some(node) = self.ghosts.find(table, key) {
            self.adapt_node(node);
        }
    }

    /// Ghost adaptation for the ghost at key table id `id` (as
    /// [`Chunks::find_any_hashed`](super::chunks::Chunks::find_any_hashed) found it, at or past
    /// the slots).
    pub(crate) fn adapt_ghost(&mut self, id: u32) {
        if let Some(node) = id.checked_sub(self.ghosts.capacity) {
            self.adapt_node(node);
        }
    }

    fn adapt_node(&mut self, node: u32) {
        let cap = f64::from(self.capacity);
        let g = &mut self.ghosts;
        let [l1, l2] = &mut g.lists;
        let (b1, b2) = (f64::from(l1.len), f64::from(l2.len));
        if Ghosts::list_of(node) == B1 {
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
    pub(crate) fn touch<K: OffloadKey>(
        &mut self,
        key: &K,
        slot: Option<(u32, bool)>,
        table: &KeyTable<K>,
    ) {
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
            None => self.adapt(key, table),
        }
    }

    /// The end of a request, for each of its resident keys `(slot, insertion_only, reused)`,
    /// distinct slots walked tail to head: a key only inserted by the request moves to the MRU end
    /// of its list, a reused one to the MRU end of T2. A run of keys that lie next to one another
    /// in one list, in the walk's order or against it, and go to the same list, moves at once: the
    /// lists end exactly as the one-by-one moves leave them (moving a run's keys to a tail one by
    /// one leaves them there in walk order).
    pub(crate) fn on_finished_all(&mut self, keys: impl Iterator<Item = (u32, bool, bool)>) {
        let mut run = Run::NONE;
        for (slot, insertion_only, reused) in keys {
            let from = self.which.get(slot as usize);
            let to = match (from, insertion_only, reused) {
                (T1 | T2, true, _) => from,
                (T1 | T2, false, true) => T2,
                _ => continue, // not in a list, or neither inserted nor reused: no move
            };
            // A run's next key lies beside its last one in the list as it was when the run
            // began (nothing moves until the run ends), so in the same list.
            if run.n > 0 && run.to == to {
                let last = run.last;
                if run.dir >= 0 && self.links.next(last) == slot {
                    (run.last, run.n, run.dir) = (slot, run.n + 1, 1);
                    continue;
                }
                if run.dir <= 0 && self.links.prev(last) == slot {
                    (run.last, run.n, run.dir) = (slot, run.n + 1, -1);
                    continue;
                }
            }
            self.move_run(run);
            run = Run {
                first: slot,
                last: slot,
                n: 1,
                dir: 0,
                from,
                to,
            };
        }
        self.move_run(run);
    }

    /// Moves `run` to the MRU end of its target list (nothing for an empty run).
    #[inline]
    fn move_run(&mut self, run: Run) {
        let Run {
            first,
            last,
            n,
            dir,
            from,
            to,
        } = run;
        if n == 0 {
            return;
        }
        // The run in list order.
        let (head, tail) = if dir < 0 {
            (last, first)
        } else {
            (first, last)
        };
        let from_list = if from == T1 {
            &mut self.t1
        } else {
            &mut self.t2
        };
        if n == 1 && from == to {
            self.links.move_to_tail(from_list, first);
            return;
        }
        self.links.detach_run(from_list, head, tail, n);
        let to_list = if to == T1 { &mut self.t1 } else { &mut self.t2 };
        if dir < 0 {
            self.links.append_run_reversed(to_list, head, tail, n);
        } else {
            self.links.append_run(to_list, head, tail, n);
        }
        if from != to {
            // Appended in walk order: `first` onwards.
            let mut at = first;
            for _ in 0..n {
                self.which.set(at as usize, to);
                at = self.links.next(at);
            }
        }
    }

    /// The end of a request, for one resident key (callers walk tail to head).
    #[cfg(test)]
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

    /// Chooses `need` victims with vLLM's two monotonic scanners, appending their slots to
    /// `out` (nothing changes; [`retire`](Self::retire) retires them). All or nothing:
    /// on `false`, `out` is truncated back.
    pub(crate) fn evict(&self, need: u32, ref_cnt: &[i32], out: &mut Vec<u32>) -> bool {
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
        true
    }

    /// Moves the resident `victims` (chosen by [`evict`](Self::evict)) to the ghost lists: T1
    /// victims to B1, T2 victims to B2, each list trimmed to the capacity. Each victim's index
    /// entry in `table` is handed to its ghost ([`KeyTable::relabel`]), so no victim slot is
    /// filed in `table` afterwards: the caller frees the slots without removing their keys
    /// ([`Chunks::release`](super::chunks::Chunks::release)).
    pub(crate) fn retire<K: OffloadKey>(&mut self, victims: &[u32], table: &mut KeyTable<K>) {
        for &s in victims {
            let list = if self.which.get(s as usize) == T1 {
                self.links.unlink(&mut self.t1, s);
                B1
            } else {
                self.links.unlink(&mut self.t2, s);
                B2
            };
            self.ghosts.push(table, list, s);
            self.which.set(s as usize, NONE);
        }
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
    pub(crate) fn for_each_ghost<K: OffloadKey>(&self, table: &KeyTable<K>, f: impl FnMut(&K)) {
        let base = self.ghosts.capacity;
        table.for_each_key_in(|i| i >= base, f);
    }

    /// The key table ids of every ghost, B1's then B2's.
    pub(crate) fn ghost_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let g = &self.ghosts;
        g.lists.iter().flat_map(move |l| {
            core::iter::successors(Some(l.head).filter(|&n| n != NIL), move |&n| {
                Some(g.links.next(n)).filter(|&m| m != NIL)
            })
            .map(move |n| g.capacity + n)
        })
    }

    /// The ghost keys `table` holds (a walk over the whole index, for invariant checks).
    pub(crate) fn ghosts_held<K: OffloadKey>(&self, table: &KeyTable<K>) -> usize {
        let base = self.ghosts.capacity;
        table.count_in(|i| i >= base)
    }
}

/// Keys of a finishing request that move together ([`Arc::on_finished_all`]): `n` keys from
/// `first` to `last` in walk order, lying in list `from` in that order (`dir` 1), against it
/// (`dir` −1) or either way (`dir` 0, one key), bound for the MRU end of list `to`.
#[derive(Clone, Copy, Debug)]
struct Run {
    first: u32,
    last: u32,
    n: u32,
    dir: i8,
    from: u8,
    to: u8,
}

impl Run {
    const NONE: Run = Run {
        first: NIL,
        last: NIL,
        n: 0,
        dir: 0,
        from: NONE,
        to: NONE,
    };
}

/// Python's `max(1, x)` for a positive float `x`: 1 unless `x` is larger.
#[inline]
fn py_max_one(x: f64) -> f64 {
    if x > 1.0 { x } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::FixedState;

    /// A small xorshift stream for the test's choices.
    fn stream(mut x: u64) -> impl FnMut(u64) -> u64 {
        move |below| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below
        }
    }

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "choices below 24 and list lengths below 24"
    )]
    fn a_request_end_by_runs_equals_the_one_by_one_moves() {
        const N: u32 = 24;
        let mut table = KeyTable::<u64>::new(N, FixedState::default(), false).unwrap();
        let mut next = stream(0x2545_f491_4f6c_dd1d);
        let (mut forward, mut backward, mut moved) = (0, 0, 0);
        for case in 0..2_000 {
            // Some slots resident in T1 and T2, in a shuffled order.
            let mut arc = Arc::new(N).unwrap();
            let mut slots: Vec<u32> = (0..N).collect();
            for i in (1..slots.len()).rev() {
                slots.swap(i, next(i as u64 + 1) as usize);
            }
            let resident = 1 + next(u64::from(N)) as usize;
            for &s in &slots[..resident] {
                arc.insert(s, &u64::from(s), NIL, false, &mut table);
                if next(2) == 0 {
                    arc.touch(&u64::from(s), Some((s, true)), &table);
                }
            }
            // A walk of distinct slots: stretches of the lists as they lie, either way round,
            // and single slots (some not resident), each with its flags.
            let (t1, t2) = arc.lists();
            let mut walk: Vec<(u32, bool, bool)> = Vec::new();
            let mut used = [false; N as usize];
            for _ in 0..1 + next(6) {
                let list = if next(2) == 0 { &t1 } else { &t2 };
                if list.is_empty() {
                    continue;
                }
                let start = next(list.len() as u64) as usize;
                let len = 1 + next((list.len() - start) as u64) as usize;
                let mut part: Vec<u32> = list[start..start + len].to_vec();
                if next(2) == 0 {
                    part.reverse();
                }
                if next(4) == 0 {
                    part.push(next(u64::from(N)) as u32);
                }
                // One flag pair per stretch mostly, sometimes per slot.
                let (mut ins, mut reu) = (next(2) == 0, next(3) != 0);
                for s in part {
                    if used[s as usize] {
                        continue;
                    }
                    used[s as usize] = true;
                    if next(5) == 0 {
                        (ins, reu) = (next(2) == 0, next(3) != 0);
                    }
                    walk.push((s, ins, reu));
                }
            }
            let mut one_by_one = arc.clone();
            for &(s, ins, reu) in &walk {
                one_by_one.on_finished(s, ins, reu);
            }
            arc.on_finished_all(walk.iter().copied());
            assert_eq!(arc.lists(), one_by_one.lists(), "case {case}: {walk:?}");
            assert_eq!(arc.sizes(), one_by_one.sizes(), "case {case}");
            for s in 0..N {
                assert_eq!(
                    arc.which.get(s as usize),
                    one_by_one.which.get(s as usize),
                    "case {case}: slot {s}"
                );
            }
            let (a1, a2) = arc.lists();
            assert_eq!((a1.len() as u32, a2.len() as u32), (arc.t1.len, arc.t2.len));
            for w in walk.windows(2) {
                forward += u32::from(arc.links.next(w[0].0) == w[1].0);
                backward += u32::from(one_by_one.links.prev(w[1].0) == w[0].0);
            }
            moved += walk.len();
        }
        // The walks held runs both ways (a run's keys end adjacent, in walk order).
        assert!(forward > 1_000 && backward > 1_000 && moved > 10_000);
    }
}
