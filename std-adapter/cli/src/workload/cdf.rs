//! Sampling from fixed discrete distributions with integer thresholds: Zipf popularity and
//! log-uniform block counts.
//!
//! Each table is computed once from `f64` (`powf`, `ln`) and turned into cumulative thresholds
//! in `0..=2^53`; every draw after that is an integer comparison against a
//! [`SplitMix64::next_53`] value, so the stream depends on the float math only through those
//! thresholds (a last-ulp difference of a platform's `ln` could move one threshold by one part
//! in 2^53).

use super::config::BlockRange;
use super::rng::SplitMix64;

/// 2^53: the scale of the thresholds.
pub(crate) const UNIT: u64 = 1 << 53;

/// `p · 2^53` for `p` in `0..=1` (exact: a power-of-two scaling); a
/// [`SplitMix64::next_53`] draw below it has probability `p`.
pub(crate) fn probability_threshold(p: f64) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "p is in 0..=1, so p * 2^53 is in 0..=2^53 and fits in u64"
    )]
    let t = (p.clamp(0.0, 1.0) * UNIT as f64) as u64;
    t.min(UNIT)
}

/// A discrete distribution over `offset + 0 .. offset + len` as cumulative thresholds.
#[derive(Clone, Debug)]
pub(crate) struct Cdf {
    offset: u64,
    /// Non-decreasing, the last exactly [`UNIT`].
    thresholds: Vec<u64>,
}

impl Cdf {
    /// From cumulative fractions (non-decreasing in `0..=1`); the last is forced to 1.
    fn from_cumulative(offset: u64, cumulative: impl Iterator<Item = f64>) -> Self {
        let mut thresholds: Vec<u64> = cumulative.map(probability_threshold).collect();
        if let Some(last) = thresholds.last_mut() {
            *last = UNIT;
        }
        Cdf { offset, thresholds }
    }

    /// Zipf over ranks `0..n`: rank `k` (0-based) has weight `(k + 1)^-s`.
    pub(crate) fn zipf(n: u32, s: f64) -> Self {
        let weights: Vec<f64> = (1..=n).map(|k| f64::from(k).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        Cdf::from_cumulative(
            0,
            weights.into_iter().map(move |w| {
                sum += w;
                sum / total
            }),
        )
    }

    /// Log-uniform over `range` (small counts more likely: `P(k) ∝ ln((k + 1) / k)` for
    /// `min ≥ 1`), the shape of the sample traces' prefix, suffix and turn lengths. A range
    /// starting at 0 is shifted by one first.
    pub(crate) fn log_uniform(range: BlockRange) -> Self {
        let shift = u64::from(range.min == 0);
        let low = (u64::from(range.min) + shift) as f64;
        let high = (u64::from(range.max) + shift) as f64;
        let total = ((high + 1.0) / low).ln();
        let offset = u64::from(range.min);
        let count = u64::from(range.max - range.min) + 1;
        Cdf::from_cumulative(
            offset,
            (0..count).map(move |i| ((low + i as f64 + 1.0) / low).ln() / total),
        )
    }

    /// One draw.
    pub(crate) fn sample(&self, rng: &mut SplitMix64) -> u64 {
        self.at(rng.next_53())
    }

    /// The value for a uniform 53-bit `u`.
    pub(crate) fn at(&self, u: u64) -> u64 {
        let index = self.thresholds.partition_point(|&t| t <= u);
        let index = index.min(self.thresholds.len().saturating_sub(1));
        self.offset + index as u64
    }
}
