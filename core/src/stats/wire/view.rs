//! The borrowed view of a payload: [`PayloadView`], its [`SeriesIter`] and the [`SeriesView`]s
//! and [`ValueView`]s it lends.

use alloc::boxed::Box;

use super::DecodeError;
use super::reader::Reader;
use super::walk::Walker;
use crate::stats::histogram::{Histogram, MAX_BOUNDS};
use crate::stats::payload::{Gauge, MAX_LABELS, Value};

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

/// One series as the bytes hold it: name and label values borrowed from the input.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesView<'a> {
    /// The metric name.
    pub name: &'a str,
    /// The label values, in the catalogue's label order.
    pub labels: heapless::Vec<&'a str, MAX_LABELS>,
    /// The value.
    pub value: ValueView<'a>,
}

/// A payload decoded in place: validated exactly as [`decode`](fn@super::decode) validates
/// (canonical, within the limits), lending its names and labels from the input instead of
/// copying them. Making a view allocates nothing: the series are read again, one at a time,
/// when [`series`](Self::series) walks them, and the info series are checked, not built.
///
/// ```
/// use kvtier_core::stats::{Payload, catalogue, wire};
/// let mut p = Payload::new();
/// p.increase_counter(catalogue::SIMPLE_SAVE_OUTCOMES, &["stored"], 7).unwrap();
/// let bytes = wire::encode_to_vec(&p);
/// let view = wire::decode_view(&bytes)?;
/// let series: Vec<_> = view.series().collect();
/// assert_eq!(series.len(), 1);
/// assert_eq!(series[0].name, catalogue::SIMPLE_SAVE_OUTCOMES);
/// assert_eq!(series[0].labels.as_slice(), &["stored"]);
/// assert_eq!(series[0].value, wire::ValueView::Counter(7));
/// # Ok::<(), wire::DecodeError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PayloadView<'a> {
    bytes: &'a [u8],
    len: usize,
    has_info: bool,
}

impl<'a> PayloadView<'a> {
    /// The number of series.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.len
    }

    /// True when the payload holds no series.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the payload carries info series (`decode` gives them).
    #[must_use]
    pub const fn has_info(&self) -> bool {
        self.has_info
    }

    /// The series in encoded order (families by name, label tuples ascending).
    #[must_use]
    pub fn series(&self) -> SeriesIter<'a> {
        SeriesIter {
            walker: Walker::new(self.bytes).ok(),
        }
    }
}

/// The series of a [`PayloadView`]. The bytes were validated when the view was made, so the
/// walk cannot fail; were it to, the iterator would simply end.
#[derive(Debug)]
pub struct SeriesIter<'a> {
    walker: Option<Walker<'a>>,
}

impl<'a> Iterator for SeriesIter<'a> {
    type Item = SeriesView<'a>;

    fn next(&mut self) -> Option<SeriesView<'a>> {
        let walker = self.walker.as_mut()?;
        if let Ok(Some(_)) = walker.next_series() {
            let mut labels = heapless::Vec::new();
            for l in walker.labels() {
                // At most MAX_LABELS, as the walk checked.
                labels.push(l.as_str()).ok()?;
            }
            return Some(SeriesView {
                name: walker.name(),
                labels,
                value: walker.value(),
            });
        }
        self.walker = None;
        None
    }
}

/// Validates `bytes` as one canonical payload and returns a view that lends from it.
///
/// # Errors
/// As [`decode`](fn@super::decode).
pub fn decode_view(bytes: &[u8]) -> Result<PayloadView<'_>, DecodeError> {
    let mut walker = Walker::new(bytes)?;
    let len = walker.left();
    walker.check_series()?;
    let has_info = walker.finish(false)?.is_some();
    Ok(PayloadView {
        bytes,
        len,
        has_info,
    })
}
