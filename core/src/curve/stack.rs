//! The one-pass LRU curve: stack distances over time stamps (see the [module docs](super)).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::fenwick::Fenwick;
use super::flags::Flags;
use super::shadows::Shadows;
use super::stamps::Stamps;
use super::{Curve, CurveError, DIGEST_MULTIPLIER, inverse, power};
use crate::hashing::{FixedState, Map};
use crate::reserve::filled;

/// A capacity past every capacity of the curve ("never").
const FAR: u32 = u32::MAX;

/// What the stack knows of one key.
#[derive(Clone, Copy, Debug)]
struct KeyState {
    /// Its time stamp, 0 when it holds none.
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

/// One open request.
#[derive(Clone, Debug, Default)]
struct Open {
    keys: Vec<u64>,
    /// Per key: the capacity from which it was resident when the request arrived.
    pre: Vec<u32>,
    /// Per key: `(FAR, _)` when the request never observes it (pending under another store at
    /// every capacity that offers it, so its end does not refresh it); `(f, storer)` when it
    /// is pending under `storer`'s store below capacity `f` only; `(0, 0)` otherwise.
    skip: Vec<(u32, u64)>,
    /// The first stamp its arrival gave.
    ts_start: u32,
    started: bool,
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
    /// Keys met absent whose store has not begun, by floor (`max_capacity + 1` for floors past
    /// it): below its floor such a key holds no slot.
    absent: Fenwick,
    absent_total: u32,
    /// Per floor, the absent keys (to find floors held twice, where residency dips).
    absent_at: Vec<u32>,
    /// Floors held by two or more absent keys.
    dips: Vec<u32>,
    keys: Map<u64, KeyState>,
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
            stamps: Stamps::new(cfg.max_capacity as usize * 2 + 64)?,
            absent: Fenwick::new(n - 1)?,
            absent_total: 0,
            absent_at: filled(n, 0)?,
            dips: Vec::new(),
            keys: Map::with_hasher(FixedState::default()),
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
        // Resident at c when pos <= c + absent(c), absent(c) = keys with a floor above c.
        let target = i64::from(pos) - i64::from(self.absent_total);
        match self.absent.first_gap(target) {
            #[expect(clippy::cast_possible_truncation, reason = "within max_capacity + 1")]
            Some(c) if c <= self.cfg.max_capacity as usize => c as u32,
            _ => FAR,
        }
    }

    /// The (resident-from capacity, floor) of `key`.
    fn threshold(&self, key: u64) -> (u32, u32) {
        match self.keys.get(&key) {
            Some(st) if st.ts != 0 => {
                let from = self.resident_from(self.stamps.position(st.ts));
                (from, st.floor)
            }
            Some(st) => (FAR, st.floor),
            None => (FAR, 0),
        }
    }

    /// Makes room for `n` more stamps (compacting, and growing when compaction frees too
    /// little).
    fn room(&mut self, n: usize) -> Result<(), CurveError> {
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

    /// Gives `key` the next stamp (there is room: [`room`](Self::room)).
    fn stamp(&mut self, key: u64) {
        let st = self.keys.entry(key).or_insert(KeyState {
            ts: 0,
            floor: 0,
            storer: 0,
            batch: 0,
            shadow: 0,
            y_mark: 0,
        });
        st.shadow = 0;
        st.ts = self.stamps.give(key, st.ts);
    }

    /// Renumbers the stamps, forgetting the keys no capacity of the curve can reach again
    /// (deeper than `max_capacity` plus the absent keys, and held by no store); grows the
    /// stamps when the kept keys fill more than half of them.
    fn compact(&mut self) -> Result<(), CurveError> {
        let limit = self.cfg.max_capacity.saturating_add(self.absent_total);
        let mut marks: Vec<u32> = Vec::new();
        marks
            .try_reserve(self.open.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        marks
            .try_reserve(self.shadows.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        marks.extend(self.open.values().map(|o| o.ts_start));
        marks.extend(self.shadows.marks());
        let ys = self.keys.values().filter(|st| st.y_mark != 0).count();
        marks.try_reserve(ys).map_err(|_| CurveError::OutOfMemory)?;
        marks.extend(
            self.keys
                .values()
                .filter(|st| st.y_mark != 0)
                .map(|st| st.y_mark),
        );
        marks.sort_unstable();
        let old: Vec<u32> = marks.clone();
        let keys = &mut self.keys;
        self.stamps.compact(
            |key, depth, new| match keys.get_mut(&key) {
                Some(st) if depth <= limit || st.floor != 0 => {
                    st.ts = new;
                    true
                }
                _ => {
                    keys.remove(&key);
                    false
                }
            },
            &mut marks,
        );
        for o in self.open.values_mut() {
            if let Ok(i) = old.binary_search(&o.ts_start) {
                o.ts_start = marks[i];
            }
        }
        self.shadows.translate(&old, &marks);
        for st in self.keys.values_mut().filter(|st| st.y_mark != 0) {
            if let Ok(i) = old.binary_search(&st.y_mark) {
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
        let mut order: Vec<(u32, u64)> = Vec::new();
        order
            .try_reserve(self.keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        order.extend(
            self.keys
                .iter()
                .filter(|(_, st)| st.ts != 0)
                .map(|(&k, st)| (st.ts, k)),
        );
        order.sort_unstable();
        for (ts, key) in order {
            let new = bigger.give(key, 0);
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
        o.pre.clear();
        o.skip.clear();
        o.started = false;
        let room = o
            .keys
            .try_reserve(keys.len())
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
            let (from, floor) = self.threshold(key);
            let readable = from.max(floor);
            // Resident and readable but behind a miss: it keeps its old rank until the store
            // phase, where the stack has moved it already (a shadow; a range marked inexact
            // when another open request holds it too).
            if readable < prefix {
                // Held by another open request that touched it: it stands where that request
                // put it (as the stack does), or behind that request's own miss (its mark).
                let mark = match self.keys.get(&key) {
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
                        if let Some(st) = self.keys.get_mut(&key) {
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
            o.pre.push(from);
            o.skip.push((0, 0));
        }
        self.flag_dips();
        if let Err(e) = self.room(o.keys.len()) {
            self.spare.push(o);
            return Err(e);
        }
        o.ts_start = self.stamps.next();
        self.move_to_top(&o.keys, None);
        for (&key, &pre) in o.keys.iter().zip(&o.pre) {
            if let Some(st) = self.keys.get_mut(&key)
                && st.floor == 0
            {
                st.floor = pre;
                let b = pre.min(max + 1) as usize;
                self.absent.inc(b);
                self.absent_total += 1;
                if b <= max as usize {
                    self.absent_at[b] += 1;
                    if self.absent_at[b] == 2 {
                        self.dips.push(pre);
                    }
                }
            }
        }
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
        for &d in &self.dips {
            let held = self.absent_at[d as usize];
            self.flags
                .range(d.saturating_sub(held), d.saturating_add(held));
        }
    }

    /// Moves `keys` to the top, tail first (the head ends most recent), once per key, passing
    /// by the keys `skip` marks as not observed (there is room for them: [`room`](Self::room)).
    fn move_to_top(&mut self, keys: &[u64], skip: Option<&[(u32, u64)]>) {
        self.batch = self.batch.wrapping_add(1);
        let batch = self.batch;
        for i in (0..keys.len()).rev() {
            let key = keys[i];
            if skip.is_some_and(|s| s[i].0 == FAR) {
                continue;
            }
            if let Some(st) = self.keys.get_mut(&key) {
                if st.batch == batch {
                    continue;
                }
                st.batch = batch;
            }
            self.stamp(key);
            if let Some(st) = self.keys.get_mut(&key) {
                st.batch = batch;
            }
        }
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
        let max = self.cfg.max_capacity;
        self.scratch.clear();
        for (key, skip) in o.keys.iter().zip(o.skip.iter_mut()) {
            let Some(st) = self.keys.get_mut(key) else {
                continue;
            };
            // Offered here, it takes this request's rank wherever it stood behind a miss.
            st.y_mark = 0;
            if st.floor == 0 {
                continue;
            }
            if st.storer == 0 {
                // Stored here wherever it was absent: from now on it holds a slot.
                st.storer = rid + 1;
                let b = st.floor.min(max + 1) as usize;
                self.absent.dec(b);
                self.absent_total -= 1;
                if b <= max as usize {
                    self.absent_at[b] -= 1;
                    if self.absent_at[b] == 1 {
                        let f = st.floor;
                        self.dips.retain(|&d| d != f);
                    }
                }
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
        let keys = &self.keys;
        let refreshed = |key: &u64, id: u32| keys.get(key).is_some_and(|st| st.shadow == id);
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
        let Some(o) = self.open.remove(&rid) else {
            return Err(CurveError::UnknownRequest(rid));
        };
        // A key met pending below a finite floor, under a store that completed since: its last
        // refresh is this request's above the floor and the storer's below it (a shadow).
        self.scratch.clear();
        for (key, &(f, storer)) in o.keys.iter().zip(&o.skip) {
            match self.keys.get(key) {
                Some(st) if f != 0 && f != FAR && st.storer != storer => {
                    if st.shadow != 0 {
                        self.flags.below(f);
                    }
                    self.scratch.push(st.ts);
                }
                _ => self.scratch.push(0),
            }
        }
        self.move_to_top(&o.keys, Some(&o.skip));
        for (i, key) in o.keys.iter().enumerate() {
            let old = self.scratch[i];
            if old == 0 {
                continue;
            }
            match self.shadows.push(*key, old + 1, 1, o.skip[i].0, 0) {
                Some(id) => {
                    if let Some(st) = self.keys.get_mut(key) {
                        st.shadow = id;
                    }
                }
                None => self.flags.below(o.skip[i].0),
            }
        }
        for key in &o.keys {
            if let Some(st) = self.keys.get_mut(key)
                && st.storer == rid + 1
            {
                st.storer = 0;
                st.floor = 0;
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
            + self.keys.allocation_size()
            + self.open.allocation_size()
            + (self.hits.capacity() * 3 + self.absent_at.capacity()) * 8
            + self
                .open
                .values()
                .chain(&self.spare)
                .map(|o| o.keys.capacity() * 8 + o.pre.capacity() * 4 + o.skip.capacity() * 16)
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
