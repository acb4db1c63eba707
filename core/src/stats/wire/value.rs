//! The borrowed views of a series' value: [`ValueView`] and the [`HistogramView`] it holds,
//! read by the walk and lent by the payload view.

use alloc::boxed::Box;

use super::reader::Reader;
use crate::stats::histogram::{Histogram, MAX_BOUNDS};
use crate::stats::payload::{Gauge, Value};

/// A decoded value, lent from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueView<'a> {
    /// A counter increment.
    Counter(u64),
    /// A gauge snapshot.
    Gauge(Gauge),
    /// Histogram observations.
    Histogram(HistogramView<'a>),
}

impl ValueView<'_> {
    /// The owned [`Value`].
    #[must_use]
    pub fn to_value(self) -> Value {
        match self {
            ValueView::Counter(c) => Value::Counter(c),
            ValueView::Gauge(g) => Value::Gauge(g),
            ValueView::Histogram(h) => Value::Histogram(Box::new(h.to_histogram())),
        }
    }
}

/// A histogram as the bytes hold it (validated): its bounds, per-bucket counts and sum are read
/// from the input on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistogramView<'a> {
    /// The varints after the bound count: bounds, bucket counts, sum.
    raw: &'a [u8],
    bounds: usize,
}

impl<'a> HistogramView<'a> {
    /// The view of `raw` (validated): `bounds` bounds, then the bucket counts and the sum.
    pub(super) const fn new(raw: &'a [u8], bounds: usize) -> Self {
        HistogramView { raw, bounds }
    }

    /// The number of bounds (the buckets are one more).
    #[must_use]
    pub const fn bound_count(&self) -> usize {
        self.bounds
    }

    fn varints(&self) -> impl Iterator<Item = u64> + '_ {
        let mut r = Reader {
            buf: self.raw,
            pos: 0,
        };
        core::iter::from_fn(move || r.varint().ok())
    }

    /// The bucket bounds, ascending.
    pub fn bounds(&self) -> impl Iterator<Item = u64> + '_ {
        self.varints().take(self.bounds)
    }

    /// The per-bucket (not cumulative) counts: one per bound, then the `+Inf` bucket.
    pub fn bucket_counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.varints().skip(self.bounds).take(self.bounds + 1)
    }

    /// The sum of the observations.
    #[must_use]
    pub fn sum(&self) -> u64 {
        self.varints().nth(2 * self.bounds + 1).unwrap_or(0)
    }

    /// The owned [`Histogram`].
    #[must_use]
    pub fn to_histogram(self) -> Histogram {
        let mut values = [0u64; 2 * MAX_BOUNDS + 2];
        for (slot, v) in values.iter_mut().zip(self.varints()) {
            *slot = v;
        }
        let (bounds, rest) = values.split_at(self.bounds.min(MAX_BOUNDS));
        let (counts, sum) = rest.split_at(self.bounds.min(MAX_BOUNDS) + 1);
        // The view was validated by the same rules, so this cannot fail.
        Histogram::from_buckets(bounds, counts, sum.first().copied().unwrap_or(0))
            .unwrap_or_default()
    }
}
