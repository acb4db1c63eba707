//! Sizing curves: hit counts at every capacity from one pass over a request stream fed
//! record by record (`lookup` for an `L`, `store` for an `S`, `finish` for a `C` of the
//! kvtrace protocol; the core knows requests and keys, not the file format).
//!
//! | type | holds |
//! |---|---|
//! | [`LruStack`] | the exact LRU curve at every capacity `1..=N` in one pass, each point certified or not |
//! | [`Sampler`] | spatially hashed sampling (SHARDS): a key is kept iff `hash(key) mod 2^24 < T` |
//! | [`SampledCurves`] | the sampled LRU stack and miniature replays of any policy ([`MiniReplay`]) at scaled capacities |
//!
//! # When vLLM's LRU manager is a stack algorithm
//!
//! Mattson's inclusion property (the cache of `C` chunks always holds a subset of the cache of
//! `C + 1`) lets one pass over the trace give the hits at every capacity: a key hits at `C`
//! iff its *stack distance* is at most `C`. For [`OffloadManager`](crate::manager) under the
//! replay protocol it holds between requests but not inside them:
//!
//! - **Ranks are request-scoped.** A request's keys rank as `(request major, −position)`
//!   from its first access and get fresh ranks at its end, tail first (the head ends most
//!   recent). Between requests this is LRU over "whole requests": the stack moves a request's
//!   keys to the top when it arrives and again when it ends (time stamps in a Fenwick tree;
//!   a key's distance is one plus the stamps after its own). In flight the real ranks differ
//!   from the stack's (hits ranked at the load, the rest at the store, keys resident behind a
//!   miss keep their old rank); that is harmless wherever evictions never reach an open
//!   request's keys.
//! - **Slots are allocated at the store, not at the lookup.** A key an open request met
//!   absent at capacity `C` holds no slot there until the request's `S`: the stack keeps those
//!   keys by the capacity below which they were absent (their *floor*), and a key at position
//!   `p` is resident at `C` iff `p ≤ C + absent(C)`. The hit threshold of each block is the
//!   prefix maximum of these thresholds (the scan stops at the first miss).
//! - **Pending stores.** A key stored by an open request is HIT_PENDING until its `C`, below
//!   its floor only. A request that meets it pending does not observe it and its end does not
//!   refresh it: at the floor's every capacity when the key was new (the same everywhere, kept
//!   exactly), below the floor only when it was resident above it. Then the key's last refresh
//!   differs by capacity — *inclusion breaks*: the stack keeps a *shadow* at the key's older
//!   stamp and marks inexact the capacities whose eviction zone reaches the shadow before the
//!   key is touched again.
//! - **Pinned hits, pending stores and the store's own offered chunks are not evictable;
//!   a store fails when everything is.** Exact only where each store's eviction zone (the
//!   bottom `m` of the cache, `m` its new keys) lies below every key stamped since the oldest
//!   open request arrived; capacities above that cut are certified at each `S`, those below it
//!   marked (a store failure is always below it). Keys resident behind a miss are shadows too
//!   until their request's `S`.
//! - **Residency dips.** Two absent keys with the same floor make `C + absent(C)` fall by one
//!   at that capacity: a key resident at `C` can be absent at `C + 1` (inclusion fails
//!   outright); the capacities around such floors are marked.
//! - **The store threshold** counts offers, and what a request offers depends on its hits,
//!   hence on the capacity: no stack property; [`SampledCurves`] simulates it in miniature.
//!
//! Every point of a [`Curve`] says whether it is certified ([`CurvePoint::exact`]); a caller
//! replays the others. Certified points equal a replay at their capacity in hit blocks, hit
//! requests and the digest (property tests against the replayer on random interleaved traces).
//!
//! # Digests at every capacity
//!
//! The kvtrace digest is `d = Σ_j k_j · M^(T−1−j)` over the `T` requests. `M = 1000003` is odd,
//! so it is invertible modulo 2^64: request `j` adds the weight `M^−j` to the histogram bucket
//! of each of its blocks' thresholds, and the digest at `C` is `M^(T−1)` times the prefix sum
//! of the weights up to `C` — one addition per block, no per-capacity work per reference.
//!
//! # Sampling
//!
//! [`Sampler`] keeps a fixed fraction `R` of the key space (FixedState hash, no RNG). Each
//! request's kept keys, in order, form a request of a miniature trace; a miniature cache of
//! `R · C` chunks stands for `C`. The LRU stack over the kept keys gives the whole sampled LRU
//! curve; [`MiniReplay`]s run ARC, LRU with a store threshold (tracker scaled by `R`), at
//! chosen capacities. The stack keeps only keys within its largest capacity of the top plus
//! the open requests' keys, and a miniature holds `R · C` slots and its open requests, so
//! memory is bounded by the configuration whatever the trace's length (what SHARDS' fixed-size
//! variant gets by lowering its threshold as the sample fills).
//!
//! **Hot keys.** The error of spatial sampling is that of the few keys that carry most hits:
//! in prefix-sharing traffic one shared prompt's blocks are referenced by a fifth of all
//! requests, and whether its handful of keys are kept moves the whole curve (by 12 points on
//! the generated 1M-record trace at `R = 0.01`). [`HotCounter`] finds them in a first pass in
//! `k` counters (Misra–Gries: deterministic, every key above `N / (k + 1)` references held).
//! At capacity `C`, the keys whose mean reuse interval is at most `C` references
//! ([`HotKeys::floor`]) are taken as resident: they are not sampled, their references are
//! counted exactly (a hit when met before and in the request's leading run of such keys), and
//! the miniature simulates the other sampled keys in `R · (C − hot)` slots
//! ([`SampledCurves::estimate`]). SHARDS-adj (FAST'15 §4: estimate the misses over the
//! expected `R · N` sampled blocks) was tried and is worse here: the hot keys miss at small
//! capacities, so the correction moved those points by up to 31 points.
//!
//! **Control variate.** Spatial sampling errs mostly by drawing more (or fewer) re-referenced
//! keys than the trace holds, and the same draw moves every capacity. The trace's exact
//! count of references to a key met before (the infinite-cache bound, one pass its caller
//! makes anyway) against the same count over the sampled cold keys gives a ratio estimator:
//! [`SampledCurves::estimate_controlled`] scales each miniature's hit rate by the exact cold
//! repeat rate over the sampled one (never above the exact rate). It needs the sampled keys
//! met so far ([`SampledConfig::max_seen_keys`], `R` of the distinct keys); at rate 1 it
//! changes nothing.
//!
//! Measured against exact replays at `kvtier sweep --from 64 --to 65536 --steps 64`'s
//! capacities, LRU and ARC, `R = 0.01`, 4,096 hot-key counters, the control variate on
//! (largest / mean absolute error, in points of block hit rate; without the control variate
//! in brackets):
//!
//! | trace | blocks | LRU | ARC |
//! |---|---|---|---|
//! | `small-a` | 30,722 | 7.8 / 2.61 (8.8 / 3.18) | 7.1 / 2.45 (6.9 / 3.06) |
//! | `small-b` | 302,290 | 6.9 / 1.81 (6.8 / 2.01) | 6.3 / 2.14 (6.4 / 2.32) |
//! | `mooncake-synthetic.jsonl` | 117,888 | 3.1 / 0.80 (5.5 / 1.56) | 3.5 / 0.85 (5.8 / 1.64) |
//! | `gen_trace.py --ops 1000000` | 10,284,651 | 3.8 / 0.96 (3.7 / 1.24) | 6.6 / 1.92 (6.7 / 2.17) |
//!
//! Without hot keys the largest errors are 16.5 / 19.2, 16.0 / 19.4, 3.1 / 3.5 and 11.3 / 14.1.
//! The resident assumption is a bias of its own where hot keys are in fact evicted (on
//! `small-a`, 7 to 10 points high at 720 chunks even at `R = 0.5`, where sampling alone is
//! within 4): at `R = 0.5` counting no hot keys (`HotKeys::default()`) is better.
//!
//! Estimating instead each hot reference's LRU reuse distance (distinct keys kept at `16 · R`
//! since its last reference, over that rate) was tried too: 2.4 points on Mooncake, but 7 to
//! 12 points high near 500 chunks on the others (key-level LRU distances miss the in-flight
//! effects that make small caches lose hits), so it is not kept.
//!
//! **Why one point is out of reach at `R = 0.01`.** Over 16 seeds ([`SampledConfig::seed`],
//! `kvtier sweep --sample-seed`) the estimates' standard deviation per capacity is the
//! sampling's own error, and it is about a point or more on every shared trace: median over
//! the capacities 0.85 (LRU) / 0.75 (ARC) points on Mooncake, 1.5 / 1.7 on `small-b`, 2.1 /
//! 2.1 on `small-a`, 1.6 / 1.4 on the 1M-record trace (8 seeds), with the control variate. A
//! largest error of one point over 64 capacities needs a deviation near a third of a point,
//! about ten times fewer errors squared: `R` ten times larger or more. Averaged over the seeds
//! the estimates are within about a point of the replays from 1,400 chunks up (no bias left
//! there); below, on `small-a`, `small-b` and the 1M-record trace they lean high by up to 7
//! points between 240 and 900 chunks (the resident assumption, and `R · C` of a few slots,
//! where the miniature's in-flight effects are not those of the full cache); on Mooncake the
//! mean is within 1.1 points everywhere. Callers check the estimate against exact replays at a
//! few capacities (`kvtier sweep --verify`) and can see its spread with other seeds.

mod absent;
mod fenwick;
mod flags;
mod hot;
mod mini;
mod shadows;
mod shards;
mod stack;
mod stamps;

pub use hot::{HotCounter, HotKeys};
pub use mini::{MiniCounts, MiniReplay};
pub use shards::{DEFAULT_SEED, Mini, SAMPLE_MODULUS, SampledConfig, SampledCurves, Sampler};
pub use stack::{LruStack, StackConfig};

use alloc::vec::Vec;
use core::fmt;

use crate::reserve::{AllocError, with_capacity};

/// The multiplier of the kvtrace hit digest: `d = d · 1000003 + k (mod 2^64)` per request.
pub const DIGEST_MULTIPLIER: u64 = 1_000_003;

/// Why a curve could not be built or fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CurveError {
    /// A configuration out of range (a zero capacity, a zero sampling rate).
    Config,
    /// A request arrived while already open.
    DuplicateRequest(u64),
    /// A store or finish for a request that is not open.
    UnknownRequest(u64),
    /// A store twice, or a finish before the store.
    OutOfOrder(u64),
    /// A request arrived while the configured number of requests were open.
    TooManyRequests(u64),
    /// A request's blocks would pass the configured bound on open blocks.
    TooManyOpenBlocks(u64),
    /// A request repeats a key among the blocks it would store.
    RepeatedKey(u64),
    /// The memory for the curve's arrays cannot be had.
    OutOfMemory,
}

impl fmt::Display for CurveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CurveError::Config => f.write_str("curve configuration out of range"),
            CurveError::DuplicateRequest(r) => write!(f, "request {r} arrived twice"),
            CurveError::UnknownRequest(r) => write!(f, "request {r} is not open"),
            CurveError::OutOfOrder(r) => write!(f, "request {r}: records out of order"),
            CurveError::TooManyRequests(r) => {
                write!(f, "request {r} arrives past the bound on open requests")
            }
            CurveError::TooManyOpenBlocks(r) => {
                write!(f, "request {r}'s blocks pass the bound on open blocks")
            }
            CurveError::RepeatedKey(r) => {
                write!(
                    f,
                    "request {r} repeats a key among the blocks it would store"
                )
            }
            CurveError::OutOfMemory => f.write_str("out of memory for the curve"),
        }
    }
}

impl core::error::Error for CurveError {}

impl From<AllocError> for CurveError {
    fn from(_: AllocError) -> Self {
        CurveError::OutOfMemory
    }
}

/// The record-level calls every curve takes: one per kvtrace record (`L`, `S`, `C`).
pub trait Sink {
    /// An `L` record: request `rid` arrives with its block keys, head first.
    ///
    /// # Errors
    /// The curve's [`CurveError`]; nothing changes then.
    fn lookup(&mut self, rid: u64, keys: &[u64]) -> Result<(), CurveError>;
    /// An `S` record: request `rid`'s store phase.
    ///
    /// # Errors
    /// The curve's [`CurveError`]; nothing changes then.
    fn store(&mut self, rid: u64) -> Result<(), CurveError>;
    /// A `C` record: request `rid`'s stores complete and it finishes.
    ///
    /// # Errors
    /// The curve's [`CurveError`]; nothing changes then.
    fn finish(&mut self, rid: u64) -> Result<(), CurveError>;
}

/// Implements [`Sink`] by the type's own `lookup`, `store` and `finish`.
macro_rules! sink_by_methods {
    ($($t:ty),*) => {$(
        impl $crate::curve::Sink for $t {
            fn lookup(&mut self, rid: u64, keys: &[u64]) -> Result<(), $crate::curve::CurveError> {
                <$t>::lookup(self, rid, keys)
            }
            fn store(&mut self, rid: u64) -> Result<(), $crate::curve::CurveError> {
                <$t>::store(self, rid)
            }
            fn finish(&mut self, rid: u64) -> Result<(), $crate::curve::CurveError> {
                <$t>::finish(self, rid)
            }
        }
    )*};
}

sink_by_methods!(LruStack, SampledCurves, MiniReplay);

/// One capacity of a curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CurvePoint {
    /// Leading blocks found readable.
    pub hit_blocks: u64,
    /// Requests with at least one hit block.
    pub hit_requests: u64,
    /// The hit digest.
    pub digest: u64,
    /// Whether the point is certified equal to a replay at its capacity.
    pub exact: bool,
}

/// Hit counts at capacities `1..=len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Curve {
    points: Vec<CurvePoint>,
    requests: u64,
    request_blocks: u64,
    exact_from: u32,
}

impl Curve {
    fn new(n: usize, requests: u64, request_blocks: u64) -> Result<Self, AllocError> {
        Ok(Curve {
            points: with_capacity(n)?,
            requests,
            request_blocks,
            exact_from: 1,
        })
    }

    fn push(&mut self, hit_blocks: u64, hit_requests: u64, digest: u64, exact: bool) {
        if !exact {
            self.exact_from = self.len() + 2;
        }
        self.points.push(CurvePoint {
            hit_blocks,
            hit_requests,
            digest,
            exact,
        });
    }

    /// The point at `capacity` (`1..=len`), `None` outside.
    #[must_use]
    pub fn at(&self, capacity: u32) -> Option<CurvePoint> {
        let i = (capacity as usize).checked_sub(1)?;
        self.points.get(i).copied()
    }

    /// The largest capacity of the curve.
    #[must_use]
    pub fn len(&self) -> u32 {
        u32::try_from(self.points.len()).unwrap_or(u32::MAX)
    }

    /// Whether the curve holds no capacity.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Requests seen.
    #[must_use]
    pub const fn requests(&self) -> u64 {
        self.requests
    }

    /// Blocks over all requests.
    #[must_use]
    pub const fn request_blocks(&self) -> u64 {
        self.request_blocks
    }

    /// Whether the point at `capacity` is certified equal to a replay at that capacity.
    #[must_use]
    pub fn is_exact(&self, capacity: u32) -> bool {
        self.at(capacity).is_some_and(|p| p.exact)
    }

    /// The smallest capacity from which every point is certified exact (`len + 1` when the
    /// last one is not).
    #[must_use]
    pub const fn exact_from(&self) -> u32 {
        self.exact_from
    }
}

/// `m^-1 mod 2^64` for odd `m` (Newton's iteration doubles the correct bits each step).
pub(crate) const fn inverse(m: u64) -> u64 {
    let mut x = m;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// `m^e mod 2^64`.
pub(crate) const fn power(m: u64, mut e: u64) -> u64 {
    let (mut base, mut acc) = (m, 1u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}
