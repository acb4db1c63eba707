//! The one-pass LRU curve: stack distances over time stamps (see the [module docs](super)).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::absent::Absent;
use super::flags::Flags;
use super::shadows::Shadows;
use super::stamps::Stamps;
use super::{Curve, CurveError, DIGEST_MULTIPLIER, inverse, power};
use crate::hashing::{FixedState, Map};
use crate::reserve::filled;

/// A capacity past every capacity of the curve ("never").
const FAR: u32 = u32::MAX;

/// Why keys move to the top, and what else the move does.
#[derive(Clone, Copy, Debug)]
enum Moved<'a> {
    /// A request arrived: a key holding no floor takes its threshold (`pre`, per key) as one.
    Arrived(&'a [u32]),
    /// A request finished: the keys its `skip` marks never observed stay where they are.
    Finished(&'a [(u32, u64)]),
}

/// The bounds an [`LruStack`] takes from its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackConfig {
    /// The largest capacity (chunks) of the curve.
    pub max_capacity: u32,
    /// The most blocks of requests open at once.
    pub max_open_blocks: u32,
    /// The most requests open at once.
    pub max_open_requests: u32,
}

impl StackConfig {
    /// A curve of capacities `1..=max_capacity`, with at most 1,048,576 blocks and 65,536
    /// requests open at once.
    #[must_use]
    pub const fn new(max_capacity: u32) -> Self {
        StackConfig {
            max_capacity,
            max_open_blocks: 1 << 20,
            max_open_requests: 1 << 16,
        }
    }
}

/// The exact LRU curve of the kvtrace protocol in one pass (see the [module docs](super)).
///
/// Memory: the stack keeps the keys within `max_capacity` of its top plus the open requests'
/// keys (a map entry and two stamps each), three arrays of `max_capacity` counters, and the
/// open requests' keys: bounded by [`StackConfig`], not by the trace's length.
#[derive(Clone, Debug)]
pub struct LruStack {
    cfg: StackConfig,
    stamps: Stamps,
    /// Keys met absent whose store has not begun, by floor: below its floor such a key holds
    /// no slot.
    absent: Absent,
    /// Each known key's slot.
    keys: Map<u64, u32>,
    slots: Slots,
    /// The keys whose `y_mark` is set.
    ys: u32,
    open: Map<u64, Open>,
    /// Open request ids in arrival order (closed ones are dropped from the front lazily).
    order: VecDeque<u64>,
    spare: Vec<Open>,
    open_blocks: u64,
    batch: u32,
    /// By threshold capacity (`max + 1`: never): hit blocks, digest weights, hit requests.
    hits: Vec<u64>,
    weights: Vec<u64>,
    first_hits: Vec<u64>,
    requests: u64,
    request_blocks: u64,
    weight: u64,
    inverse: u64,
    flags: Flags,
    shadows: Shadows,
    scratch: Vec<u32>,
}

impl LruStack {
    /// An empty stack.
    ///
    /// # Errors
    /// [`CurveError::Config`] for a capacity of 0 or `u32::MAX`, [`CurveError::OutOfMemory`]
    /// when its arrays cannot be allocated.
    pub fn new(cfg: StackConfig) -> Result<Self, CurveError> {
        if cfg.max_capacity == 0 || cfg.max_capacity >= FAR - 1 {
            return Err(CurveError::Config);
        }
        let n = cfg.max_capacity as usize + 2;
        Ok(LruStack {
            stamps: Stamps::new(cfg.max_capacity as usize * 4 + 64)?,
            absent: Absent::new(cfg.max_capacity)?,
            keys: Map::with_hasher(FixedState::default()),
            slots: Slots::default(),
            ys: 0,
            open: Map::with_hasher(FixedState::default()),
            order: VecDeque::new(),
            spare: Vec::new(),
            open_blocks: 0,
            batch: 0,
            hits: filled(n, 0)?,
            weights: filled(n, 0)?,
            first_hits: filled(n, 0)?,
            requests: 0,
            request_blocks: 0,
            weight: 1,
            inverse: inverse(DIGEST_MULTIPLIER),
            flags: Flags::new(cfg.max_capacity)?,
            shadows: Shadows::default(),
            scratch: Vec::new(),
            cfg,
        })
    }

    /// The smallest capacity at which a key at stack position `pos` is resident: keys met
    /// absent above it hold no slot there (`FAR` past the largest capacity).
    #[inline]
    fn resident_from(&self, pos: u32) -> u32 {
        if pos == FAR {
            return FAR;
        }
        self.absent.resident_from(pos).unwrap_or(FAR)
    }

    /// The (resident-from capacity, floor, slot) of `key`.
    fn threshold(&self, key: u64) -> (u32, u32, u32) {
        match self.keys.get(&key) {
            Some(&h) => {
                let st = &self.slots.states[h as usize];
                let from = if st.ts == 0 {
                    FAR
                } else {
                    self.resident_from(self.stamps.position(st.ts))
                };
                (from, st.floor, h)
            }
            None => (FAR, 0, NONE),
        }
    }

    /// Makes room for `n` more stamps (compacting, and growing when compaction frees too
    /// little).
    fn room(&mut self, n: usize) -> Result<(), CurveError> {
        self.slots.reserve(n)?;
        if self.stamps.remaining() >= n {
            return Ok(());
        }
        self.compact()?;
        if self.stamps.remaining() < n.max(self.stamps.capacity() / 2) {
            let want = (self.stamps.live() as usize + n) * 2 + 64;
            self.regrow(want)?;
        }
        Ok(())
    }

    /// Renumbers the stamps, forgetting the keys no capacity of the curve can reach again
    /// (deeper than `max_capacity` plus the absent keys, and held by no store); grows the
    /// stamps when the kept keys fill more than half of them.
    fn compact(&mut self) -> Result<(), CurveError> {
        let limit = self.cfg.max_capacity.saturating_add(self.absent.total());
        let mut marks: Vec<u32> = Vec::new();
        marks
            .try_reserve(self.open.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        marks
            .try_reserve(self.shadows.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        marks.extend(self.open.values().map(|o| o.ts_start));
        marks.extend(self.shadows.marks());
        // The keys marked behind a miss (their marks are stamps too), found by one walk of
        // the slots when there are any.
        let mut ys: Vec<u32> = Vec::new();
        if self.ys > 0 {
            ys.try_reserve(self.ys as usize)
                .and_then(|()| marks.try_reserve(self.ys as usize))
                .map_err(|_| CurveError::OutOfMemory)?;
            for (h, st) in (0u32..).zip(&self.slots.states) {
                if st.ts != 0 && st.y_mark != 0 {
                    ys.push(h);
                    marks.push(st.y_mark);
                }
            }
        }
        marks.sort_unstable();
        let old: Vec<u32> = marks.clone();
        let (keys, slots, live_ys) = (&mut self.keys, &mut self.slots, &mut self.ys);
        self.stamps.compact(
            |h, depth, new| {
                let st = &mut slots.states[h as usize];
                if depth <= limit || st.floor != 0 {
                    st.ts = new;
                    return true;
                }
                if st.y_mark != 0 {
                    *live_ys -= 1;
                }
                keys.remove(&st.key);
                slots.drop(h);
                false
            },
            &mut marks,
        );
        for o in self.open.values_mut() {
            if let Ok(i) = old.binary_search(&o.ts_start) {
                o.ts_start = marks[i];
            }
        }
        self.shadows.translate(&old, &marks);
        for &h in &ys {
            let st = &mut self.slots.states[h as usize];
            if st.ts != 0
                && let Ok(i) = old.binary_search(&st.y_mark)
            {
                st.y_mark = marks[i];
            }
        }
        Ok(())
    }

    /// Moves the stamps into arrays of `len`, in order (after a compaction: stamps `1..=live`).
    fn regrow(&mut self, len: usize) -> Result<(), CurveError> {
        if len <= self.stamps.live() as usize {
            return Err(CurveError::OutOfMemory);
        }
        let mut bigger = Stamps::new(len)?;
        let mut order: Vec<(u32, u32)> = Vec::new();
        order
            .try_reserve(self.keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        order.extend(
            (0u32..)
                .zip(&self.slots.states)
                .filter(|(_, st)| st.ts != 0)
                .map(|(h, st)| (st.ts, h)),
        );
        order.sort_unstable();
        for (ts, h) in order {
            let new = bigger.give(h, 0);
            debug_assert_eq!(new, ts, "compacted stamps are 1..=live");
        }
        self.stamps = bigger;
        Ok(())
    }

    /// An `L` record: request `rid` arrives with `keys`, head first. Its hit blocks at every
    /// capacity are counted now.
    ///
    /// # Errors
    /// [`CurveError`] for a request already open or past a bound; nothing changes then.
    pub fn lookup(&mut self, rid: u64, keys: &[u64]) -> Result<(), CurveError> {
        if self.open.contains_key(&rid) {
            return Err(CurveError::DuplicateRequest(rid));
        }
        if self.open.len() >= self.cfg.max_open_requests as usize {
            return Err(CurveError::TooManyRequests(rid));
        }
        let n = keys.len() as u64;
        if self.open_blocks + n > u64::from(self.cfg.max_open_blocks) {
            return Err(CurveError::TooManyOpenBlocks(rid));
        }
        let mut o = self.spare.pop().unwrap_or_default();
        o.keys.clear();
        o.hs.clear();
        o.pre.clear();
        o.skip.clear();
        o.started = false;
        let room = o
            .keys
            .try_reserve(keys.len())
            .and_then(|()| o.hs.try_reserve(keys.len()))
            .and_then(|()| o.pre.try_reserve(keys.len()))
            .and_then(|()| o.skip.try_reserve(keys.len()))
            .and_then(|()| self.order.try_reserve(1));
        if room.is_err() || self.open.try_reserve(1).is_err() {
            self.spare.push(o);
            return Err(CurveError::OutOfMemory);
        }
        let max = self.cfg.max_capacity;
        let never = max as usize + 1;
        let w = self.weight;
        // Block i hits at capacity c when every block up to i is resident and readable there.
        let mut prefix = 0u32;
        for (i, &key) in keys.iter().enumerate() {
            let (from, floor, h) = self.threshold(key);
            let readable = from.max(floor);
            // Resident and readable but behind a miss: it keeps its old rank until the store
            // phase, where the stack has moved it already (a shadow; a range marked inexact
            // when another open request holds it too).
            if readable < prefix {
                // Held by another open request that touched it: it stands where that request
                // put it (as the stack does), or behind that request's own miss (its mark).
                let mark = match self.slots.states.get(h as usize) {
                    Some(st) if st.y_mark != 0 => st.y_mark,
                    Some(st) if st.floor == 0 && st.ts != 0 => st.ts + 1,
                    _ => 0,
                };
                if mark != 0 {
                    if self
                        .shadows
                        .push(key, mark, readable, prefix, rid + 1)
                        .is_some()
                    {
                        if let Some(st) = self.slots.states.get_mut(h as usize) {
                            if st.y_mark == 0 {
                                self.ys += 1;
                            }
                            st.y_mark = mark;
                        }
                    } else {
                        self.flags.range(readable, prefix);
                    }
                }
            }
            prefix = prefix.max(readable);
            let t = if prefix > max { never } else { prefix as usize };
            self.hits[t] += 1;
            self.weights[t] = self.weights[t].wrapping_add(w);
            if i == 0 {
                self.first_hits[t] += 1;
            }
            o.keys.push(key);
            o.hs.push(h);
            o.pre.push(from);
            o.skip.push((0, 0));
        }
        self.flag_dips();
        if let Err(e) = self.room(o.keys.len()) {
            self.spare.push(o);
            return Err(e);
        }
        o.ts_start = self.stamps.next();
        self.move_to_top(&o.keys, &mut o.hs, Moved::Arrived(&o.pre));
        self.requests += 1;
        self.request_blocks += n;
        self.weight = self.weight.wrapping_mul(self.inverse);
        self.open_blocks += n;
        self.open.insert(rid, o);
        self.order.push_back(rid);
        Ok(())
    }

    /// Marks the capacities around floors held by two absent keys, where a key's residency
    /// is not monotone in the capacity.
    fn flag_dips(&mut self) {
        for (d, held) in self.absent.dips() {
            self.flags
                .range(d.saturating_sub(held), d.saturating_add(held));
        }
    }

    /// Moves `keys` to the top, tail first (the head ends most recent), once per key, each
    /// with the next stamp (there is room for them: [`room`](Self::room)); [`Moved`] says what
    /// else the move does. One map look-up per key; the new stamps counted as one range.
    fn move_to_top(&mut self, keys: &[u64], hs: &mut [u32], moved: Moved<'_>) {
        // Never 0, the batch of a new slot.
        self.batch = self.batch.wrapping_add(1).max(1);
        let batch = self.batch;
        let (map, absent, slots) = (&mut self.keys, &mut self.absent, &mut self.slots);
        self.stamps.run(|stamps| {
            for i in (0..keys.len()).rev() {
                let key = keys[i];
                if let Moved::Finished(skip) = moved
                    && skip[i].0 == FAR
                {
                    continue;
                }
                let h = match slots.find(map, key, hs[i]) {
                    Some(h) => h,
                    None => {
                        let h = slots.add(key);
                        map.insert(key, h);
                        h
                    }
                };
                hs[i] = h;
                let st = &mut slots.states[h as usize];
                if st.batch == batch {
                    continue;
                }
                st.batch = batch;
                st.shadow = 0;
                st.ts = stamps.take(h, st.ts);
                if let Moved::Arrived(pre) = moved
                    && st.floor == 0
                {
                    st.floor = pre[i];
                    absent.add(pre[i]);
                }
            }
        });
    }

    /// An `S` record: request `rid`'s store phase.
    ///
    /// # Errors
    /// [`CurveError::UnknownRequest`] or [`CurveError::OutOfOrder`]; nothing changes then.
    pub fn store(&mut self, rid: u64) -> Result<(), CurveError> {
        let o = self
            .open
            .get_mut(&rid)
            .ok_or(CurveError::UnknownRequest(rid))?;
        if o.started {
            return Err(CurveError::OutOfOrder(rid));
        }
        o.started = true;
        self.scratch.clear();
        for ((&key, skip), h) in o.keys.iter().zip(o.skip.iter_mut()).zip(o.hs.iter_mut()) {
            let Some(found) = self.slots.find(&self.keys, key, *h) else {
                continue;
            };
            *h = found;
            let st = &mut self.slots.states[found as usize];
            // Offered here, it takes this request's rank wherever it stood behind a miss.
            if st.y_mark != 0 {
                st.y_mark = 0;
                self.ys -= 1;
            }
            if st.floor == 0 {
                continue;
            }
            if st.storer == 0 {
                // Stored here wherever it was absent: from now on it holds a slot.
                st.storer = rid + 1;
                self.absent.remove(st.floor);
                self.scratch.push(st.floor);
            } else if st.storer != rid + 1 {
                *skip = (st.floor, st.storer);
            }
        }
        // The store evicts from the bottom of each capacity: exact only where that bottom lies
        // below every open request's keys (none pinned, pending, protected or ranked by its
        // request there).
        while self
            .order
            .front()
            .is_some_and(|r| !self.open.contains_key(r))
        {
            self.order.pop_front();
        }
        let oldest = self
            .order
            .front()
            .and_then(|r| self.open.get(r))
            .map_or(self.stamps.next(), |o| o.ts_start);
        let above = self.stamps.at_or_after(oldest);
        let stored_above = |c: u32, s: &[u32]| {
            u32::try_from(s.iter().filter(|&&f| f > c).count()).unwrap_or(u32::MAX)
        };
        let mut c = above;
        loop {
            let next = above.saturating_add(stored_above(c, &self.scratch));
            if next <= c {
                break;
            }
            c = next;
        }
        self.flags.below(c.saturating_add(1));
        self.flag_dips();
        self.flag_shadows(u32::try_from(self.scratch.len()).unwrap_or(u32::MAX), rid);
        Ok(())
    }

    /// Marks inexact the capacities whose eviction zone, `stored` slots deep, reaches a live
    /// shadow, retiring the stale ones (see [`Shadows::flag`]).
    fn flag_shadows(&mut self, stored: u32, rid: u64) {
        let (keys, states) = (&self.keys, &self.slots.states);
        let refreshed = |key: &u64, id: u32| {
            keys.get(key)
                .is_some_and(|&h| states[h as usize].shadow == id)
        };
        self.shadows
            .flag(stored, rid, refreshed, &self.stamps, &mut self.flags);
    }

    /// A `C` record: request `rid`'s stores complete and it finishes.
    ///
    /// # Errors
    /// [`CurveError::UnknownRequest`] or [`CurveError::OutOfOrder`]; nothing changes then.
    pub fn finish(&mut self, rid: u64) -> Result<(), CurveError> {
        match self.open.get(&rid) {
            None => return Err(CurveError::UnknownRequest(rid)),
            Some(o) if !o.started => return Err(CurveError::OutOfOrder(rid)),
            Some(_) => {}
        }
        let n = self.open.get(&rid).map_or(0, |o| o.keys.len());
        self.room(n)?;
        let Some(mut o) = self.open.remove(&rid) else {
            return Err(CurveError::UnknownRequest(rid));
        };
        // A key met pending below a finite floor, under a store that completed since: its last
        // refresh is this request's above the floor and the storer's below it (a shadow).
        self.scratch.clear();
        for ((&key, &(f, storer)), &h) in o.keys.iter().zip(&o.skip).zip(&o.hs) {
            let st = self
                .slots
                .find(&self.keys, key, h)
                .map(|h| &self.slots.states[h as usize]);
            match st {
                Some(st) if f != 0 && f != FAR && st.storer != storer => {
                    if st.shadow != 0 {
                        self.flags.below(f);
                    }
                    self.scratch.push(st.ts);
                }
                _ => self.scratch.push(0),
            }
        }
        self.move_to_top(&o.keys, &mut o.hs, Moved::Finished(&o.skip));
        for (i, key) in o.keys.iter().enumerate() {
            let old = self.scratch[i];
            if old == 0 {
                continue;
            }
            match self.shadows.push(*key, old + 1, 1, o.skip[i].0, 0) {
                Some(id) => {
                    if let Some(h) = self.slots.find(&self.keys, *key, o.hs[i]) {
                        self.slots.states[h as usize].shadow = id;
                    }
                }
                None => self.flags.below(o.skip[i].0),
            }
        }
        for (&key, &h) in o.keys.iter().zip(&o.hs) {
            if let Some(h) = self.slots.find(&self.keys, key, h) {
                let st = &mut self.slots.states[h as usize];
                if st.storer == rid + 1 {
                    st.storer = 0;
                    st.floor = 0;
                }
            }
        }
        self.open_blocks -= o.keys.len() as u64;
        self.spare.push(o);
        Ok(())
    }

    /// The heap bytes of the stack's arrays and maps (allocation sizes).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.stamps.heap_bytes()
            + self.slots.heap_bytes()
            + self.keys.allocation_size()
            + self.open.allocation_size()
            + self.hits.capacity() * 3 * 8
            + self.absent.heap_bytes()
            + self
                .open
                .values()
                .chain(&self.spare)
                .map(|o| {
                    o.keys.capacity() * 8
                        + (o.hs.capacity() + o.pre.capacity()) * 4
                        + o.skip.capacity() * 16
                })
                .sum::<usize>()
    }

    /// The curve so far: hit blocks, hit requests and the digest at every capacity
    /// `1..=max_capacity`, each marked exact or not.
    ///
    /// # Errors
    /// [`CurveError::OutOfMemory`] when the curve cannot be allocated.
    pub fn curve(&self) -> Result<Curve, CurveError> {
        let n = self.cfg.max_capacity as usize;
        let scale = power(DIGEST_MULTIPLIER, self.requests.saturating_sub(1));
        let mut out = Curve::new(n, self.requests, self.request_blocks)?;
        let (mut h, mut w, mut r) = (0u64, 0u64, 0u64);
        for (c, exact) in (1..=n).zip(self.flags.each()) {
            h += self.hits[c];
            w = w.wrapping_add(self.weights[c]);
            r += self.first_hits[c];
            out.push(h, r, scale.wrapping_mul(w), exact);
        }
        Ok(out)
    }
}

// What the stack knows of each key and of each open request.

/// No handle (a key met for the first time).
const NONE: u32 = u32::MAX;

/// What the stack knows of one key.
#[derive(Clone, Copy, Debug, Default)]
struct KeyState {
    key: u64,
    /// Its time stamp; 0 while its slot is free.
    ts: u32,
    /// Below this capacity the key is not readable: an open request met it absent there and
    /// its store has not completed (0: readable wherever resident).
    floor: u32,
    /// The open request (`rid + 1`, 0: none yet) whose store holds the key below its floor:
    /// the first of the requests holding it to reach its store phase.
    storer: u64,
    /// The last batch of moves that moved it.
    batch: u32,
    /// Its live refresh shadow's id (see [`Shadows`]), 0 for none.
    shadow: u32,
    /// While an open request holds it resident behind a miss: the mark of its old stamp
    /// (where it really stands), 0 otherwise.
    y_mark: u32,
}

/// The keys the stack knows, each in a slot named by a handle it keeps while it is known: the
/// stamps name their keys by handle, so a compaction renumbers them without the map, and an
/// open request remembers its keys' handles, so its store and its end need no look-up.
#[derive(Clone, Debug, Default)]
struct Slots {
    states: Vec<KeyState>,
    free: Vec<u32>,
}

impl Slots {
    /// Room for `n` more keys, so that [`add`](Self::add) and [`drop`](Self::drop) need no
    /// allocation.
    fn reserve(&mut self, n: usize) -> Result<(), CurveError> {
        let total = self.states.len() + n;
        self.states
            .try_reserve(n)
            .and_then(|()| self.free.try_reserve(total.saturating_sub(self.free.len())))
            .map_err(|_| CurveError::OutOfMemory)
    }

    /// A slot for `key`, its stamp 0.
    fn add(&mut self, key: u64) -> u32 {
        let fresh = KeyState {
            key,
            ..KeyState::default()
        };
        if let Some(h) = self.free.pop() {
            self.states[h as usize] = fresh;
            return h;
        }
        self.states.push(fresh);
        #[expect(clippy::cast_possible_truncation, reason = "one slot per stamp, u32")]
        {
            (self.states.len() - 1) as u32
        }
    }

    /// Frees slot `h`.
    fn drop(&mut self, h: u32) {
        self.states[h as usize].ts = 0;
        self.free.push(h);
    }

    /// `hint` when it is still `key`'s slot, else `key`'s slot from the map.
    #[inline]
    fn find(&self, map: &Map<u64, u32>, key: u64, hint: u32) -> Option<u32> {
        match self.states.get(hint as usize) {
            Some(st) if st.ts != 0 && st.key == key => Some(hint),
            _ => map.get(&key).copied(),
        }
    }

    fn heap_bytes(&self) -> usize {
        self.states.capacity() * size_of::<KeyState>() + self.free.capacity() * 4
    }
}

/// One open request.
#[derive(Clone, Debug, Default)]
struct Open {
    keys: Vec<u64>,
    /// Per key: its slot when last met ([`NONE`] before its first move).
    hs: Vec<u32>,
    /// Per key: the capacity from which it was resident when the request arrived.
    pre: Vec<u32>,
    /// Per key: `(u32::MAX, _)` when the request never observes it (pending under another store at
    /// every capacity that offers it, so its end does not refresh it); `(f, storer)` when it
    /// is pending under `storer`'s store below capacity `f` only; `(0, 0)` otherwise.
    skip: Vec<(u32, u64)>,
    /// The first stamp its arrival gave.
    ts_start: u32,
    started: bool,
}
