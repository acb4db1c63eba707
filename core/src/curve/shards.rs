//! Spatially hashed sampling (SHARDS) and the sampled curves it feeds: the LRU stack over the
//! sampled keys, and miniature replays of any policy at scaled capacities (see the
//! [module docs](super)).

use alloc::vec::Vec;
use core::hash::BuildHasher;

use super::hot::HotKeys;
use super::mini::{MiniCounts, MiniReplay, RequestSlots};
use super::stack::{LruStack, StackConfig};
use super::{Curve, CurveError};
use crate::hashing::{FixedState, Map, Set};
use crate::manager::{ManagerConfig, PolicyKind};
use crate::reserve::filled;

/// The seed of [`Sampler::new`]'s hash.
pub const DEFAULT_SEED: u64 = 0x5348_4152_4453;

/// The modulus of the sampling filter: a key is kept when `hash(key) mod 2^24 < T`.
pub const SAMPLE_MODULUS: u64 = 1 << 24;

/// Keeps a key when its hash, reduced modulo [`SAMPLE_MODULUS`], falls below a threshold:
/// a fixed fraction of the key space, the same keys on every run (the hash is
/// [`FixedState`]'s), so a kept key is kept at every reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    threshold: u64,
    hasher: FixedState,
}

impl Sampler {
    /// A filter keeping the fraction `rate` (`0 < rate ≤ 1`, rounded to a multiple of
    /// 2^-24) of the key space.
    ///
    /// # Errors
    /// [`CurveError::Config`] for a rate outside `(0, 1]` or below 2^-24.
    pub fn new(rate: f64) -> Result<Self, CurveError> {
        Self::with_seed(rate, DEFAULT_SEED)
    }

    /// [`new`](Self::new) with the hash seeded by `seed` (another seed samples other keys).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_seed(rate: f64, seed: u64) -> Result<Self, CurveError> {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(CurveError::Config);
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "rate in (0, 1]: the product is in [0, 2^24]"
        )]
        let threshold = libm::round(rate * SAMPLE_MODULUS as f64) as u64;
        if threshold == 0 {
            return Err(CurveError::Config);
        }
        Ok(Sampler {
            threshold,
            hasher: FixedState::with_seed(seed),
        })
    }

    /// The fraction of the key space kept.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "below 2^25")]
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / SAMPLE_MODULUS as f64
    }

    /// Whether `key` is sampled.
    #[inline]
    #[must_use]
    pub fn keeps(&self, key: u64) -> bool {
        self.hasher.hash_one(key) % SAMPLE_MODULUS < self.threshold
    }

    /// The sampled-space capacity that stands for `capacity` chunks: `rate · capacity`,
    /// rounded, at least 1.
    #[must_use]
    pub fn scaled(&self, capacity: u32) -> u32 {
        let c = (u128::from(capacity) * u128::from(self.threshold)
            + u128::from(SAMPLE_MODULUS / 2))
            / u128::from(SAMPLE_MODULUS);
        u32::try_from(c).unwrap_or(u32::MAX).max(1)
    }
}

/// What [`SampledCurves`] simulates.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledConfig {
    /// The sampling rate (`0 < rate ≤ 1`).
    pub rate: f64,
    /// The largest capacity of the LRU curve (chunks, full scale).
    pub max_capacity: u32,
    /// Full-scale capacities at which each of `policies` is simulated in miniature.
    pub capacities: Vec<u32>,
    /// Policies simulated in miniature (at every one of `capacities`); without a store
    /// threshold the sampled LRU stack runs as well.
    pub policies: Vec<PolicyKind>,
    /// The store threshold of the miniature managers (0 or 1: no filter); their reuse
    /// tracker is scaled by the rate.
    pub store_threshold: u32,
    /// The full-scale reuse tracker's size (vLLM's default: 64,000).
    pub max_tracker_size: u32,
    /// Tokens per block.
    pub block_tokens: u64,
    /// The most requests open at once.
    pub max_requests: u32,
    /// The sampler's hash seed ([`DEFAULT_SEED`] for [`Sampler::new`]'s keys).
    pub seed: u64,
    /// Whether to run the sampled LRU stack (the whole sampled LRU curve; without a store
    /// threshold only).
    pub stack: bool,
    /// Keys counted in a first pass ([`HotCounter`](super::HotCounter)): at each capacity
    /// `C`, those whose mean reuse interval is at most `C` references
    /// ([`HotKeys::floor`]) are taken as resident and counted exactly, outside the
    /// miniatures, which simulate the other sampled keys in the room left (empty: none).
    pub hot: HotKeys,
    /// Distinct sampled keys remembered for the control variate of
    /// [`SampledCurves::estimate_controlled`] (8 bytes each and the table's slack); past it,
    /// or at 0, that estimate is [`SampledCurves::estimate`]'s.
    pub max_seen_keys: u32,
}

impl SampledConfig {
    /// Miniatures of `policies` at `capacities` (the largest is the LRU curve's end), keys
    /// sampled at `rate` with [`DEFAULT_SEED`]; the rest as vLLM's defaults and `kvtier
    /// sweep` have them: no store threshold (1), a 64,000-entry reuse tracker, 16 tokens
    /// per block, 1,024 requests open at once, no sampled stack, no hot keys, 4,194,304
    /// sampled keys remembered for the control variate.
    #[must_use]
    pub fn new(rate: f64, capacities: Vec<u32>, policies: Vec<PolicyKind>) -> Self {
        SampledConfig {
            rate,
            max_capacity: capacities.iter().copied().max().unwrap_or(1),
            capacities,
            policies,
            store_threshold: 1,
            max_tracker_size: 64_000,
            block_tokens: 16,
            max_requests: 1024,
            seed: DEFAULT_SEED,
            stack: false,
            hot: HotKeys::default(),
            max_seen_keys: 1 << 22,
        }
    }
}

/// One miniature replay: its policy and full-scale capacity.
#[derive(Clone, Debug)]
pub struct Mini {
    /// The policy.
    pub policy: PolicyKind,
    /// The full-scale capacity it stands for.
    pub capacity: u32,
    /// The capacity it simulates.
    pub scaled: u32,
    /// The reference count from which a key is hot at this capacity.
    pub floor: u64,
    /// The index of `floor` among the distinct floors, ascending.
    floor_ix: usize,
    replay: MiniReplay,
}

impl Mini {
    /// What it counted.
    #[must_use]
    pub const fn counts(&self) -> MiniCounts {
        self.replay.counts()
    }
}

/// Sampled curves from one pass: the sampled keys of each request, in order, go to an LRU
/// stack (the whole LRU curve, SHARDS) and to miniature replays (any policy, at chosen
/// capacities); requests without a sampled key are passed by.
#[derive(Clone, Debug)]
pub struct SampledCurves {
    sampler: Sampler,
    /// Without a store threshold, the LRU stack (with one, LRU runs in miniature too).
    lru: Option<LruStack>,
    minis: Vec<Mini>,
    /// The distinct floors of the miniatures, ascending.
    floors: Vec<u64>,
    /// `hot_hist[j]`: hot references counted at the miniatures of floor index below `j`.
    hot_hist: Vec<u64>,
    /// As `hot_hist`, for the hot references counted as hits.
    hit_hist: Vec<u64>,
    /// As `hot_hist`, for the hot references to a key met before (the repeat bound's).
    hot_rep_hist: Vec<u64>,
    /// `cold_hist[j]`: sampled references cold at the miniatures of floor index `j` and above.
    cold_hist: Vec<u64>,
    /// As `cold_hist`, for the sampled references to a key met before.
    cold_rep_hist: Vec<u64>,
    /// The sampled keys met so far, at most [`SampledConfig::max_seen_keys`].
    sampled_seen: Set<u64>,
    max_seen: usize,
    /// `sampled_seen` overflowed (or could not grow): no control variate.
    seen_full: bool,
    /// The hot references of the current request to a key met before: their counts.
    reps: Vec<u64>,
    ids: RequestSlots,
    scratch: Vec<u64>,
    picked: Vec<u64>,
    sampled: Vec<(u64, u64)>,
    /// Each hot key's reference count, and whether it was met before.
    hot: Map<u64, (u64, bool)>,
    /// The hot keys of the current request met for the first time.
    newly: Vec<u64>,
    counts: Vec<u64>,
    run: Vec<u64>,
    requests: u64,
    request_blocks: u64,
}

impl SampledCurves {
    /// Curves as `cfg` says.
    ///
    /// # Errors
    /// [`CurveError::Config`] for a bad rate or a capacity the manager refuses,
    /// [`CurveError::OutOfMemory`].
    pub fn new(cfg: &SampledConfig) -> Result<Self, CurveError> {
        let sampler = Sampler::with_seed(cfg.rate, cfg.seed)?;
        let filter = cfg.store_threshold > 1;
        let lru = if filter || !cfg.stack {
            None
        } else {
            let mut s = StackConfig::new(sampler.scaled(cfg.max_capacity));
            s.max_open_requests = cfg.max_requests;
            Some(LruStack::new(s)?)
        };
        let mut hot = Map::with_hasher(FixedState::default());
        hot.try_reserve(cfg.hot.keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        hot.extend(cfg.hot.keys.iter().map(|&(k, c)| (k, (c, false))));
        let mut minis = Vec::new();
        for &policy in &cfg.policies {
            for &capacity in &cfg.capacities {
                let floor = cfg.hot.floor(capacity);
                let pinned = u32::try_from(cfg.hot.at_least(floor)).unwrap_or(u32::MAX);
                let scaled = sampler.scaled(capacity.saturating_sub(pinned));
                let mut m = ManagerConfig::new(scaled);
                m.policy = policy;
                m.store_threshold = cfg.store_threshold;
                m.max_tracker_size = sampler.scaled(cfg.max_tracker_size);
                m.max_requests = cfg.max_requests;
                minis.push(Mini {
                    policy,
                    capacity,
                    scaled,
                    floor,
                    floor_ix: 0,
                    replay: MiniReplay::new(m, cfg.block_tokens)?,
                });
            }
        }
        let mut floors: Vec<u64> = minis.iter().map(|m| m.floor).collect();
        floors.sort_unstable();
        floors.dedup();
        for m in &mut minis {
            m.floor_ix = floors.partition_point(|&f| f < m.floor);
        }
        let hot_hist = filled(floors.len() + 1, 0)?;
        Ok(SampledCurves {
            hit_hist: hot_hist.clone(),
            hot_rep_hist: hot_hist.clone(),
            cold_hist: hot_hist.clone(),
            cold_rep_hist: hot_hist.clone(),
            sampled_seen: Set::with_hasher(FixedState::default()),
            max_seen: cfg.max_seen_keys as usize,
            seen_full: cfg.max_seen_keys == 0,
            reps: Vec::new(),
            hot_hist,
            floors,
            sampler,
            lru,
            minis,
            ids: RequestSlots::new(),
            scratch: Vec::new(),
            picked: Vec::new(),
            sampled: Vec::new(),
            hot,
            newly: Vec::new(),
            counts: Vec::new(),
            run: Vec::new(),
            requests: 0,
            request_blocks: 0,
        })
    }

    /// The sampler.
    #[must_use]
    pub const fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// An `L` record.
    ///
    /// # Errors
    /// [`CurveError`] from the stack or a miniature replay.
    pub fn lookup(&mut self, rid: u64, keys: &[u64]) -> Result<(), CurveError> {
        if self.ids.get(rid).is_some() {
            return Err(CurveError::DuplicateRequest(rid));
        }
        self.requests += 1;
        self.request_blocks += keys.len() as u64;
        self.hot_counts(keys)?;
        self.scratch.clear();
        self.sampled.clear();
        let s = self.sampler;
        for &k in keys.iter().filter(|&&k| s.keeps(k)) {
            self.scratch.push(k);
            self.sampled
                .push((k, self.hot.get(&k).map_or(0, |&(c, _)| c)));
        }
        // A count `c` is hot at the miniatures whose floor is at most `c`: those of floor index
        // below the number of floors up to `c`.
        for &c in &self.counts {
            self.hot_hist[self.floors.partition_point(|&f| f <= c)] += 1;
        }
        for &c in &self.run {
            self.hit_hist[self.floors.partition_point(|&f| f <= c)] += 1;
        }
        for &c in &self.reps {
            self.hot_rep_hist[self.floors.partition_point(|&f| f <= c)] += 1;
        }
        if !self.seen_full {
            for &(k, c) in &self.sampled {
                let j = self.floors.partition_point(|&f| f <= c);
                self.cold_hist[j] += 1;
                if self.sampled_seen.contains(&k) {
                    self.cold_rep_hist[j] += 1;
                } else if self.sampled_seen.len() >= self.max_seen
                    || self.sampled_seen.try_reserve(1).is_err()
                {
                    self.seen_full = true;
                    self.sampled_seen = Set::with_hasher(FixedState::default());
                    break;
                } else {
                    self.sampled_seen.insert(k);
                }
            }
        }
        if self.scratch.is_empty() {
            return Ok(());
        }
        let slot = self.ids.open(rid)?;
        if let Some(lru) = &mut self.lru {
            lru.lookup(rid, &self.scratch)?;
        }
        // `scratch` holds every sampled key: a miniature whose floor is above the largest
        // hot count among them takes it as it is, the others only their keys below the floor.
        let top = self.sampled.iter().map(|&(_, c)| c).max().unwrap_or(0);
        for m in &mut self.minis {
            let keys = if m.floor > top {
                &self.scratch
            } else {
                self.picked.clear();
                self.picked.extend(
                    self.sampled
                        .iter()
                        .filter(|&&(_, c)| c < m.floor)
                        .map(|&(k, _)| k),
                );
                &self.picked
            };
            if !keys.is_empty() {
                m.replay.lookup_slot(slot, rid, keys)?;
            }
        }
        Ok(())
    }

    /// The hot keys' counts in `keys` and the running minimum of the counts
    /// over the leading run of hot keys met before; then marks `keys`' hot keys met.
    fn hot_counts(&mut self, keys: &[u64]) -> Result<(), CurveError> {
        self.counts.clear();
        self.run.clear();
        self.reps.clear();
        if self.hot.is_empty() {
            return Ok(());
        }
        self.counts
            .try_reserve(keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        self.run
            .try_reserve(keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        self.reps
            .try_reserve(keys.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        self.newly.clear();
        let (mut leading, mut least) = (true, u64::MAX);
        for k in keys {
            let (c, seen) = self.hot.get(k).copied().unwrap_or((0, false));
            if c > 0 {
                self.counts.push(c);
                if seen || self.newly.contains(k) {
                    self.reps.push(c);
                }
                if !seen && !self.newly.contains(k) {
                    self.newly
                        .try_reserve(1)
                        .map_err(|_| CurveError::OutOfMemory)?;
                    self.newly.push(*k);
                }
            }
            if leading && c > 0 && seen {
                least = least.min(c);
                self.run.push(least);
            } else {
                leading = false;
            }
        }
        for k in &self.newly {
            if let Some(h) = self.hot.get_mut(k) {
                h.1 = true;
            }
        }
        Ok(())
    }

    /// An `S` record.
    ///
    /// # Errors
    /// [`CurveError`] from the stack or a miniature replay.
    pub fn store(&mut self, rid: u64) -> Result<(), CurveError> {
        let Some(slot) = self.ids.get(rid) else {
            return Ok(());
        };
        if let Some(lru) = &mut self.lru {
            lru.store(rid)?;
        }
        for m in self.minis.iter_mut().filter(|m| m.replay.slot_open(slot)) {
            m.replay.store_slot(slot, rid)?;
        }
        Ok(())
    }

    /// A `C` record.
    ///
    /// # Errors
    /// [`CurveError`] from the stack or a miniature replay.
    pub fn finish(&mut self, rid: u64) -> Result<(), CurveError> {
        let Some(slot) = self.ids.close(rid) else {
            return Ok(());
        };
        if let Some(lru) = &mut self.lru {
            lru.finish(rid)?;
        }
        for m in self.minis.iter_mut().filter(|m| m.replay.slot_open(slot)) {
            m.replay.finish_slot(slot, rid)?;
        }
        Ok(())
    }

    /// Requests and blocks seen (all of them, sampled or not).
    #[must_use]
    pub const fn seen(&self) -> (u64, u64) {
        (self.requests, self.request_blocks)
    }

    /// The sampled LRU stack's curve (over sampled capacities `1..=rate · max_capacity`),
    /// `None` with a store threshold or without [`SampledConfig::stack`].
    ///
    /// # Errors
    /// [`CurveError::OutOfMemory`].
    pub fn lru_curve(&self) -> Result<Option<Curve>, CurveError> {
        self.lru.as_ref().map(LruStack::curve).transpose()
    }

    /// The estimated LRU block hit rate at full-scale `capacity`, from `curve` (the
    /// [`lru_curve`](Self::lru_curve)): sampled hit blocks over sampled blocks at the scaled
    /// capacity, `None` where the sampled stack does not certify that capacity (the in-flight
    /// effects of a small scaled cache; a miniature LRU replay there stands for it).
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    pub fn lru_rate(&self, curve: &Curve, capacity: u32) -> Option<f64> {
        let c = self.sampler.scaled(capacity).min(curve.len());
        match curve.at(c) {
            Some(p) if p.exact && curve.request_blocks() > 0 => {
                Some(p.hit_blocks as f64 / curve.request_blocks() as f64)
            }
            Some(p) if p.exact => Some(0.0),
            _ => None,
        }
    }

    /// The miniature replay of `policy` at full-scale `capacity`, if simulated.
    #[must_use]
    pub fn mini(&self, policy: PolicyKind, capacity: u32) -> Option<&Mini> {
        self.minis
            .iter()
            .find(|m| m.policy == policy && m.capacity == capacity)
    }

    /// The estimated block hit rate at miniature `m`'s capacity: its hot keys' hits, counted
    /// exactly, plus the other blocks seen at the miniature's hit rate, over all blocks seen.
    #[must_use]
    pub fn estimate(&self, m: &Mini) -> f64 {
        self.combine(m, m.counts().block_hit_rate())
    }

    /// [`estimate`](Self::estimate) with the sampling error of the cold keys corrected by a
    /// control variate: `repeated`, the trace's exact count of references to a key met
    /// before (the infinite-cache bound), against the same count over the sampled keys. The
    /// miniature's hit rate is scaled by the exact cold repeat rate over the sampled one (a
    /// ratio estimator: a sample that drew more re-referenced keys than the trace holds also
    /// drew more hits), and never above the exact cold repeat rate. Without a sampled repeat,
    /// or once the remembered keys overflowed, it is [`estimate`](Self::estimate).
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "rates")]
    pub fn estimate_controlled(&self, m: &Mini, repeated: u64) -> f64 {
        let (hot_blocks, _) = self.hot(m);
        let above = |h: &[u64]| h.get(m.floor_ix + 1..).map_or(0, |t| t.iter().sum::<u64>());
        let upto = |h: &[u64]| h.get(..=m.floor_ix).map_or(0, |t| t.iter().sum::<u64>());
        let cold = self.request_blocks.saturating_sub(hot_blocks);
        let cold_reps = repeated.saturating_sub(above(&self.hot_rep_hist));
        let (s_refs, s_reps) = (upto(&self.cold_hist), upto(&self.cold_rep_hist));
        let rate = m.counts().block_hit_rate();
        if self.seen_full || cold == 0 || s_refs == 0 || s_reps == 0 {
            return self.combine(m, rate);
        }
        let exact = cold_reps as f64 / cold as f64;
        let sampled = s_reps as f64 / s_refs as f64;
        self.combine(m, (rate * exact / sampled).min(exact))
    }

    /// Miniature `m`'s hot hits plus its cold blocks at `cold_rate`, over all blocks seen.
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    fn combine(&self, m: &Mini, cold_rate: f64) -> f64 {
        if self.request_blocks == 0 {
            return 0.0;
        }
        let (hot_blocks, hot_hits) = self.hot(m);
        let cold = self.request_blocks.saturating_sub(hot_blocks) as f64;
        let est = hot_hits as f64 + cold * cold_rate;
        (est / self.request_blocks as f64).clamp(0.0, 1.0)
    }

    /// The references to miniature `m`'s hot keys (all of them, none sampled), and how many
    /// of them are counted as hits (in the leading run of hot keys met before).
    #[must_use]
    pub fn hot(&self, m: &Mini) -> (u64, u64) {
        let above = |h: &[u64]| h.get(m.floor_ix + 1..).map_or(0, |t| t.iter().sum());
        (above(&self.hot_hist), above(&self.hit_hist))
    }

    /// The miniature replays, in policy then capacity order.
    #[must_use]
    pub fn minis(&self) -> &[Mini] {
        &self.minis
    }
}
