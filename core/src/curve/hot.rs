//! The hot keys of a trace, counted in bounded memory (Misra–Gries), for the stratified
//! estimate of [`SampledCurves`](super::SampledCurves) (see the [module docs](super)).

use alloc::vec::Vec;

use super::CurveError;
use crate::hashing::{FixedState, Map};

/// Counts the references of the most frequent keys in at most `k` counters (Misra–Gries):
/// every key referenced more than `N / (k + 1)` times of `N` is held, and each held count is
/// at most `N / (k + 1)` below the true one, never above it. Deterministic: no RNG, and a
/// decrement round treats every counter alike.
#[derive(Clone, Debug)]
pub struct HotCounter {
    counts: Map<u64, u64>,
    k: usize,
    blocks: u64,
}

impl HotCounter {
    /// A counter of at most `k` keys (16 bytes each and the table's overhead).
    ///
    /// # Errors
    /// [`CurveError::Config`] for `k = 0`, [`CurveError::OutOfMemory`].
    pub fn new(k: u32) -> Result<Self, CurveError> {
        if k == 0 {
            return Err(CurveError::Config);
        }
        let k = k as usize;
        let mut counts = Map::with_hasher(FixedState::default());
        counts
            .try_reserve(k + 1)
            .map_err(|_| CurveError::OutOfMemory)?;
        Ok(HotCounter {
            counts,
            k,
            blocks: 0,
        })
    }

    /// One reference to `key`. Allocates nothing.
    pub fn add(&mut self, key: u64) {
        self.blocks += 1;
        if let Some(c) = self.counts.get_mut(&key) {
            *c += 1;
        } else if self.counts.len() < self.k {
            self.counts.insert(key, 1);
        } else {
            self.counts.retain(|_, c| {
                *c -= 1;
                *c > 0
            });
        }
    }

    /// The references of one request's keys.
    pub fn add_all(&mut self, keys: &[u64]) {
        for &k in keys {
            self.add(k);
        }
    }

    /// The held keys and their (lower-bound) counts, most referenced first (ties by key),
    /// and the references counted in all.
    ///
    /// # Errors
    /// [`CurveError::OutOfMemory`].
    pub fn finish(&self) -> Result<HotKeys, CurveError> {
        let mut keys = Vec::new();
        keys.try_reserve(self.counts.len())
            .map_err(|_| CurveError::OutOfMemory)?;
        keys.extend(self.counts.iter().map(|(&k, &c)| (k, c)));
        keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(HotKeys {
            keys,
            blocks: self.blocks,
        })
    }
}

/// Keys with lower bounds on their reference counts over a trace of `blocks` references, most
/// referenced first ([`HotCounter::finish`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotKeys {
    /// `(key, count)`, counts non-increasing.
    pub keys: Vec<(u64, u64)>,
    /// The references the counts are over.
    pub blocks: u64,
}

impl HotKeys {
    /// The count a key needs to be taken as resident at `capacity` chunks: a mean reuse
    /// interval (`blocks / count` references) of at most `capacity` references, so at most
    /// `capacity` distinct chunks (`u64::MAX` for an empty set).
    #[must_use]
    pub fn floor(&self, capacity: u32) -> u64 {
        if self.keys.is_empty() || capacity == 0 {
            return u64::MAX;
        }
        self.blocks.div_ceil(u64::from(capacity)).max(2)
    }

    /// How many keys have at least `floor` references.
    #[must_use]
    pub fn at_least(&self, floor: u64) -> usize {
        self.keys.partition_point(|&(_, c)| c >= floor)
    }
}
