//! Decoding: one validating walk over the bytes ([`Walker`]) serves both the borrowed
//! [`PayloadView`] (no allocation: names and labels are lent from the input) and the owned
//! [`decode`].

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::{DecodeError, Limit, VERSION};
use crate::stats::MetricKind;
use crate::stats::catalogue;
use crate::stats::histogram::{Histogram, MAX_BOUNDS};
use crate::stats::payload::{
    Gauge, InfoSeries, InfoValue, Labels, MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN,
    MAX_LABELS, MAX_NAME_LEN, MAX_SERIES, Payload, Series, Text, Value, intern_label,
    intern_label_bytes, intern_name_bytes,
};

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    pub(super) fn varint(&mut self) -> Result<u64, DecodeError> {
        let b = self.byte()?;
        if b < 0x80 {
            return Ok(u64::from(b));
        }
        let mut v = u64::from(b & 0x7f);
        let mut shift = 7u32;
        loop {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(DecodeError::VarintOverflow);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return if b == 0 {
                    Err(DecodeError::NonCanonicalVarint)
                } else {
                    Ok(v)
                };
            }
            shift += 7;
        }
    }

    /// A varint that must be at most `max`.
    fn count(&mut self, max: usize, limit: Limit) -> Result<usize, DecodeError> {
        let v = self.varint()?;
        usize::try_from(v)
            .ok()
            .filter(|n| *n <= max)
            .ok_or(DecodeError::LimitExceeded(limit))
    }

    fn raw_text(&mut self, max: usize, limit: Limit) -> Result<&'a [u8], DecodeError> {
        let len = self.count(max, limit)?;
        let end = self.pos.checked_add(len).ok_or(DecodeError::Truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    fn text(&mut self, max: usize, limit: Limit) -> Result<&'a str, DecodeError> {
        let bytes = self.raw_text(max, limit)?;
        core::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
    }

    /// A label value or info text, borrowed when it is a known value.
    fn label(&mut self) -> Result<Text, DecodeError> {
        let raw = self.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
        intern_label_bytes(raw).map_err(|_| DecodeError::InvalidUtf8)
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
}

fn read_kind(b: u8) -> Result<MetricKind, DecodeError> {
    match b {
        0 => Ok(MetricKind::Counter),
        1 => Ok(MetricKind::Gauge),
        2 => Ok(MetricKind::Histogram),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

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

impl HistogramView<'_> {
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

fn read_value<'a>(r: &mut Reader<'a>, kind: MetricKind) -> Result<ValueView<'a>, DecodeError> {
    match kind {
        MetricKind::Counter => Ok(ValueView::Counter(r.varint()?)),
        MetricKind::Gauge => {
            let num = super::unzigzag(r.varint()?);
            let den = r.varint()?;
            Gauge::from_lowest_terms(num, den)
                .map(ValueView::Gauge)
                .ok_or(DecodeError::InvalidGauge)
        }
        MetricKind::Histogram => {
            // The rules of `Histogram::from_buckets`: at most MAX_BOUNDS bounds, strictly
            // ascending, one count per bucket, a sum.
            let bounds = r.count(MAX_BOUNDS, Limit::Bounds)?;
            let start = r.pos;
            let mut prev = None;
            for _ in 0..bounds {
                let b = r.varint()?;
                if prev.is_some_and(|p| p >= b) {
                    return Err(DecodeError::InvalidHistogram);
                }
                prev = Some(b);
            }
            for _ in 0..=bounds {
                r.varint()?;
            }
            r.varint()?;
            let raw = r.buf.get(start..r.pos).ok_or(DecodeError::Truncated)?;
            Ok(ValueView::Histogram(HistogramView { raw, bounds }))
        }
    }
}

fn read_info_series(r: &mut Reader<'_>) -> Result<InfoSeries, DecodeError> {
    let n = r.count(MAX_INFO_LABELS, Limit::InfoLabels)?;
    let mut pairs: Vec<(Text, InfoValue)> = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        let key = r.text(MAX_LABEL_LEN, Limit::LabelLen)?;
        if pairs.last().is_some_and(|(k, _)| k.as_ref() >= key) {
            return Err(DecodeError::NotSorted);
        }
        let value = match r.byte()? {
            0 => InfoValue::None,
            1 => InfoValue::Bool(false),
            2 => InfoValue::Bool(true),
            3 => InfoValue::Int(super::unzigzag(r.varint()?)),
            4 => InfoValue::Text(r.label()?),
            t => return Err(DecodeError::UnknownInfoTag(t)),
        };
        pairs.push((intern_label(key), value));
    }
    Ok(InfoSeries::from_checked_pairs(pairs))
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

/// The validating walk over the series section, one series per step.
struct Walker<'a> {
    r: Reader<'a>,
    /// Series still to read, over all families.
    left: usize,
    /// Series still to read in the current family.
    left_in_family: u64,
    name: &'a str,
    name_bytes: Option<&'a [u8]>,
    kind: MetricKind,
    prev_labels: heapless::Vec<&'a str, MAX_LABELS>,
}

impl<'a> Walker<'a> {
    /// Reads the version and the series total.
    fn new(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        let version = r.byte()?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let left = r.count(MAX_SERIES, Limit::Series)?;
        Ok(Walker {
            r,
            left,
            left_in_family: 0,
            name: "",
            name_bytes: None,
            kind: MetricKind::Counter,
            prev_labels: heapless::Vec::new(),
        })
    }

    /// The next series and whether it opens a family, or `None` after the last one.
    fn next_series(&mut self) -> Result<Option<(SeriesView<'a>, bool)>, DecodeError> {
        if self.left == 0 {
            return Ok(None);
        }
        let opens_family = self.left_in_family == 0;
        if opens_family {
            let raw_name = self.r.raw_text(MAX_NAME_LEN, Limit::NameLen)?;
            // Byte order is `str` order, so the check needs no UTF-8 decoding.
            if self.name_bytes.is_some_and(|prev| prev >= raw_name) {
                return Err(DecodeError::NotSorted);
            }
            self.kind = read_kind(self.r.byte()?)?;
            let count = self.r.varint()?;
            let fits = usize::try_from(count).is_ok_and(|c| c <= self.left);
            if count == 0 || !fits {
                return Err(DecodeError::SeriesCountMismatch);
            }
            self.name = match catalogue::lookup_bytes(raw_name) {
                Some(d) => d.name,
                None => core::str::from_utf8(raw_name).map_err(|_| DecodeError::InvalidUtf8)?,
            };
            self.name_bytes = Some(raw_name);
            self.left_in_family = count;
        }
        let nl = self.r.count(MAX_LABELS, Limit::Labels)?;
        let mut labels = heapless::Vec::new();
        for _ in 0..nl {
            let value = self.r.text(MAX_LABEL_LEN, Limit::LabelLen)?;
            labels
                .push(value)
                .map_err(|_| DecodeError::LimitExceeded(Limit::Labels))?;
        }
        if !opens_family && self.prev_labels >= labels {
            return Err(DecodeError::NotSorted);
        }
        let value = read_value(&mut self.r, self.kind)?;
        self.prev_labels.clone_from(&labels);
        self.left_in_family -= 1;
        self.left -= 1;
        Ok(Some((
            SeriesView {
                name: self.name,
                labels,
                value,
            },
            opens_family,
        )))
    }

    /// After the last series: the info section (when `keep`, its series) and the end.
    fn finish(mut self, keep: bool) -> Result<Option<Vec<InfoSeries>>, DecodeError> {
        let info = match self.r.byte()? {
            0 => None,
            1 => {
                let n = self.r.count(MAX_INFO_SERIES, Limit::InfoSeries)?;
                let mut info = Vec::with_capacity(if keep { n.min(self.r.remaining()) } else { 0 });
                for _ in 0..n {
                    let series = read_info_series(&mut self.r)?;
                    if keep {
                        info.push(series);
                    }
                }
                Some(info)
            }
            b => return Err(DecodeError::InvalidInfoFlag(b)),
        };
        if self.r.remaining() != 0 {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(info)
    }
}

/// A payload decoded in place: validated exactly as [`decode`] validates (canonical, within
/// the limits), lending its names and labels from the input instead of copying them. Decoding
/// a view allocates nothing unless the payload carries info series (which are checked by
/// building them).
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

impl core::fmt::Debug for Walker<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Walker")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl<'a> Iterator for SeriesIter<'a> {
    type Item = SeriesView<'a>;

    fn next(&mut self) -> Option<SeriesView<'a>> {
        match self.walker.as_mut()?.next_series() {
            Ok(Some((series, _))) => Some(series),
            Ok(None) | Err(_) => {
                self.walker = None;
                None
            }
        }
    }
}

/// Validates `bytes` as one canonical payload and returns a view that lends from it.
///
/// # Errors
/// As [`decode`].
pub fn decode_view(bytes: &[u8]) -> Result<PayloadView<'_>, DecodeError> {
    let mut walker = Walker::new(bytes)?;
    let len = walker.left;
    while walker.next_series()?.is_some() {}
    let has_info = walker.finish(false)?.is_some();
    Ok(PayloadView {
        bytes,
        len,
        has_info,
    })
}

/// Decodes a payload from exactly `bytes`.
///
/// # Errors
/// [`DecodeError::Truncated`] when `bytes` ends early; another [`DecodeError`] when it is not a
/// canonical encoding (including bytes after the payload).
pub fn decode(bytes: &[u8]) -> Result<Payload, DecodeError> {
    let mut walker = Walker::new(bytes)?;
    // Each series takes at least two bytes, which bounds the allocation by the input size too.
    let mut series: Vec<Series> = Vec::with_capacity(walker.left.min(bytes.len() / 2));
    let mut name: Text = Text::Borrowed("");
    while let Some((view, opens_family)) = walker.next_series()? {
        if opens_family {
            name = intern_name_bytes(view.name.as_bytes()).map_err(|_| DecodeError::InvalidUtf8)?;
        }
        let mut labels = Labels::new();
        for value in &view.labels {
            labels
                .push(intern_label(value))
                .map_err(|_| DecodeError::LimitExceeded(Limit::Labels))?;
        }
        series.push(Series {
            name: name.clone(),
            labels,
            value: view.value.to_value(),
        });
    }
    let info = walker.finish(true)?;
    Ok(Payload::from_checked_parts(series, info))
}
