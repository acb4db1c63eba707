//! Integer histograms over fixed bucket bounds.
//!
//! vLLM keeps every raw observation in a list until the payload is drained; kvtier keeps one
//! count per bucket plus the exact count and sum, so memory is bounded and merging is
//! associative and commutative. Values are integers in the metric's base unit (bytes, chunks,
//! nanoseconds); the catalogue says how to scale them on export.

use core::fmt;

/// The largest number of finite bucket bounds a histogram may have.
pub const MAX_BOUNDS: usize = 16;

/// Why a histogram could not be built or merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistogramError {
    /// More than [`MAX_BOUNDS`] bounds were given.
    TooManyBounds,
    /// The bounds are not strictly ascending.
    BoundsNotAscending,
    /// Two histograms with different bounds cannot be merged.
    BoundsMismatch,
}

impl fmt::Display for HistogramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistogramError::TooManyBounds => {
                write!(f, "a histogram takes at most {MAX_BOUNDS} bucket bounds")
            }
            HistogramError::BoundsNotAscending => {
                f.write_str("histogram bucket bounds must be strictly ascending")
            }
            HistogramError::BoundsMismatch => {
                f.write_str("histograms with different bucket bounds cannot be merged")
            }
        }
    }
}

impl core::error::Error for HistogramError {}

/// A histogram: per-bucket counts over fixed upper bounds (inclusive, as Prometheus `le`), an
/// overflow bucket (`+Inf`), the exact number of observations and their exact (saturating) sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    bounds: heapless::Vec<u64, MAX_BOUNDS>,
    /// `counts[i]` observations fell in `(bounds[i-1], bounds[i]]`; `counts[bounds.len()]` above
    /// the last bound. Not cumulative.
    counts: [u64; MAX_BOUNDS + 1],
    count: u64,
    sum: u64,
}

/// A histogram with no finite bounds (every observation lands in `+Inf`).
impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            bounds: heapless::Vec::new(),
            counts: [0; MAX_BOUNDS + 1],
            count: 0,
            sum: 0,
        }
    }
}

impl Histogram {
    /// An empty histogram over `bounds` (strictly ascending, at most [`MAX_BOUNDS`]).
    ///
    /// # Errors
    /// [`HistogramError::TooManyBounds`] or [`HistogramError::BoundsNotAscending`].
    pub fn new(bounds: &[u64]) -> Result<Self, HistogramError> {
        let v = heapless::Vec::from_slice(bounds).map_err(|_| HistogramError::TooManyBounds)?;
        if bounds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(HistogramError::BoundsNotAscending);
        }
        Ok(Histogram {
            bounds: v,
            counts: [0; MAX_BOUNDS + 1],
            count: 0,
            sum: 0,
        })
    }

    /// Records one observation of `value`.
    pub fn observe(&mut self, value: u64) {
        self.observe_n(value, 1);
    }

    /// Records `n` observations of `value` (the sum grows by `value · n`, saturating).
    pub fn observe_n(&mut self, value: u64, n: u64) {
        if n == 0 {
            return;
        }
        let idx = self.bounds.partition_point(|&b| b < value);
        self.counts[idx] = self.counts[idx].saturating_add(n);
        self.count = self.count.saturating_add(n);
        self.sum = self.sum.saturating_add(value.saturating_mul(n));
    }

    /// Adds every observation of `other` to `self`.
    ///
    /// # Errors
    /// [`HistogramError::BoundsMismatch`] when the bounds differ; `self` is unchanged then.
    pub fn merge(&mut self, other: &Histogram) -> Result<(), HistogramError> {
        if self.bounds != other.bounds {
            return Err(HistogramError::BoundsMismatch);
        }
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        Ok(())
    }

    /// Forgets every observation, keeping the bounds.
    pub fn clear(&mut self) {
        self.counts = [0; MAX_BOUNDS + 1];
        self.count = 0;
        self.sum = 0;
    }

    /// The finite upper bounds.
    #[must_use]
    pub fn bounds(&self) -> &[u64] {
        &self.bounds
    }

    /// Per-bucket (not cumulative) counts: one per bound, then the `+Inf` bucket.
    #[must_use]
    pub fn bucket_counts(&self) -> &[u64] {
        &self.counts[..=self.bounds.len()]
    }

    /// The number of observations.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of all observations (saturating at `u64::MAX`).
    #[must_use]
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// True when nothing has been observed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Rebuilds a histogram from its parts (used by decoders).
    ///
    /// # Errors
    /// As [`Histogram::new`]; also [`HistogramError::BoundsMismatch`] when `bucket_counts` does
    /// not have `bounds.len() + 1` entries or its total differs from `count`.
    pub fn from_parts(
        bounds: &[u64],
        bucket_counts: &[u64],
        count: u64,
        sum: u64,
    ) -> Result<Self, HistogramError> {
        let mut h = Histogram::new(bounds)?;
        if bucket_counts.len() != bounds.len() + 1 {
            return Err(HistogramError::BoundsMismatch);
        }
        let mut total = 0u64;
        for (slot, &c) in h.counts.iter_mut().zip(bucket_counts) {
            *slot = c;
            total = total.checked_add(c).ok_or(HistogramError::BoundsMismatch)?;
        }
        if total != count {
            return Err(HistogramError::BoundsMismatch);
        }
        h.count = count;
        h.sum = sum;
        Ok(h)
    }
}

impl Histogram {
    /// Rebuilds a histogram from its bounds, its per-bucket counts and its sum; the count is the
    /// saturating total of the buckets, which is what [`observe`](Self::observe) and
    /// [`merge`](Self::merge) keep it equal to (used by the wire decoder, which does not carry
    /// the count separately).
    ///
    /// # Errors
    /// As [`Histogram::new`]; [`HistogramError::BoundsMismatch`] when `bucket_counts` does not
    /// have `bounds.len() + 1` entries.
    pub fn from_buckets(
        bounds: &[u64],
        bucket_counts: &[u64],
        sum: u64,
    ) -> Result<Self, HistogramError> {
        let mut h = Histogram::new(bounds)?;
        if bucket_counts.len() != bounds.len() + 1 {
            return Err(HistogramError::BoundsMismatch);
        }
        for (slot, &c) in h.counts.iter_mut().zip(bucket_counts) {
            *slot = c;
            h.count = h.count.saturating_add(c);
        }
        h.sum = sum;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&[1, 4, 16]).unwrap();
        for v in [0, 1, 2, 4, 5, 16, 17, 1000] {
            h.observe(v);
        }
        assert_eq!(h.bucket_counts(), &[2, 2, 2, 2]);
        assert_eq!(h.count(), 8);
        assert_eq!(h.sum(), 1045);
    }

    #[test]
    fn merge_requires_equal_bounds_and_leaves_self_on_error() {
        let mut a = Histogram::new(&[1, 2]).unwrap();
        a.observe(2);
        let b = Histogram::new(&[1, 3]).unwrap();
        let before = a.clone();
        assert_eq!(a.merge(&b), Err(HistogramError::BoundsMismatch));
        assert_eq!(a, before);
        let mut c = Histogram::new(&[1, 2]).unwrap();
        c.observe_n(5, 3);
        a.merge(&c).unwrap();
        assert_eq!((a.count(), a.sum()), (4, 17));
        assert_eq!(a.bucket_counts(), &[0, 1, 3]);
    }

    #[test]
    fn bad_bounds_are_errors() {
        assert_eq!(
            Histogram::new(&[2, 2]),
            Err(HistogramError::BoundsNotAscending)
        );
        assert_eq!(Histogram::new(&[0; 17]), Err(HistogramError::TooManyBounds));
        assert_eq!(
            Histogram::from_parts(&[1], &[1, 1], 3, 0),
            Err(HistogramError::BoundsMismatch)
        );
        let h = Histogram::from_parts(&[1], &[1, 2], 3, 9).unwrap();
        assert_eq!((h.count(), h.sum()), (3, 9));
    }
}
