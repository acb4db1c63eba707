//! [`walk`]: the validating walk over the bytes, the one home of the decoding rules.
//!
//! The walk reads every field in order, checks it, and reports what it read to a [`Visitor`]:
//! [`decode`](fn@super::decode) builds the payload from the reports,
//! [`decode_view`](super::decode_view) ignores them ([`Check`]). Both are the same walk,
//! monomorphized twice, so they accept the same inputs and report the same error for each
//! rejected one. A visitor that knows two family names ([`Visitor::known_name`]: `decode`'s,
//! for catalogue names) answers their order in place of the byte comparison, with the same
//! result. The walk runs to the end with its state in locals; the view's
//! [`SeriesIter`](super::SeriesIter) does not resume it but re-reads the validated bytes with the
//! per-field readers here ([`read_kind_and_count`], [`read_value`]) and the cursor's text reads,
//! lending catalogue names and known label texts from the catalogue.
//!
//! The fast paths keep every check: a catalogue histogram's bounds are compared with their
//! canonical encoding in one go (equal bytes are valid bounds; other bytes are read one by one),
//! a run of eight single-byte varints (each one canonical) is passed at once, ASCII text is
//! checked a word at a time before the full UTF-8 check, and a label tuple is kept as the bytes
//! that hold it (compared with the next one label by label).

use core::cmp::Ordering;

use super::reader::{Checked, Reader, after, cmp_words, is_utf8};
use super::value::{HistogramView, ValueView};
use super::{DecodeError, Limit, VERSION, unzigzag};
use crate::stats::MetricKind;
use crate::stats::histogram::MAX_BOUNDS;
use crate::stats::payload::{
    Gauge, MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, MAX_LABELS, MAX_NAME_LEN, MAX_SERIES,
};

/// What the walk reports, field group by field group, once each is checked. Every method does
/// nothing by default; an error a visitor returns ends the walk with that error.
pub(super) trait Visitor<'a> {
    /// The series total (field 2), and the input's length.
    fn total(&mut self, _total: usize, _input: usize) {}

    /// Before the walk checks a family name against the one before: the visitor's own answer,
    /// when it knows both names (a catalogue name is UTF-8, and catalogue positions follow the
    /// byte order of the names); `None` lets the walk compare and check the bytes.
    fn known_name(&mut self, _name: &'a [u8]) -> Option<Checked> {
        None
    }

    /// A family opens: its name (UTF-8) and kind (fields 3.1–3.3).
    ///
    /// # Errors
    /// The visitor's own.
    fn family(&mut self, _name: &'a [u8], _kind: MetricKind) -> Result<(), DecodeError> {
        Ok(())
    }

    /// A series of the family opened last: its labels and value (fields 3.4.1–3.4.3).
    ///
    /// # Errors
    /// The visitor's own.
    fn series(&mut self, _labels: Tuple<'a>, _value: ValueView<'a>) -> Result<(), DecodeError> {
        Ok(())
    }

    /// The info section is present and holds `count` series (field 5); `left` input bytes
    /// follow.
    fn info(&mut self, _count: usize, _left: usize) {}

    /// An info series of `count` labels opens (field 5.1); `left` input bytes follow.
    fn info_series(&mut self, _count: usize, _left: usize) {}

    /// One info label of the series opened last: its name (UTF-8) and value (fields 5.2–5.4).
    ///
    /// # Errors
    /// The visitor's own.
    fn info_label(&mut self, _name: &'a [u8], _value: InfoRaw<'a>) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// The visitor that keeps nothing: the walk only checks.
pub(super) struct Check;

impl Visitor<'_> for Check {}

/// An info value as read (texts UTF-8).
#[derive(Clone, Copy, Debug)]
pub(super) enum InfoRaw<'a> {
    /// Tag 0.
    None,
    /// Tags 1 and 2.
    Bool(bool),
    /// Tag 3.
    Int(i64),
    /// Tag 4.
    Text(&'a [u8]),
}

/// A label tuple as the input holds it: its label count (at most [`MAX_LABELS`], so one byte),
/// then that many texts, each UTF-8 and within the limits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tuple<'a> {
    /// The label count, then each label (a length, then its bytes).
    raw: &'a [u8],
}

impl<'a> Tuple<'a> {
    /// The label values, in order. The bytes were checked when the tuple was read; reads stay
    /// checked all the same, and would end the iteration early rather than panic.
    pub(super) fn labels(self) -> impl Iterator<Item = &'a [u8]> {
        let mut r = Reader {
            buf: self.raw,
            pos: 1,
        };
        let count = self.raw.first().copied().unwrap_or(0);
        (0..count).map_while(move |_| r.raw_text(MAX_LABEL_LEN, Limit::LabelLen).ok())
    }

    /// The order of two tuples: label by label, then by count.
    #[inline(always)]
    fn cmp(self, other: Self) -> Ordering {
        match (self.raw.split_first(), other.raw.split_first()) {
            // One label each (the common case): the two texts' order.
            (Some((1, a)), Some((1, b))) => cmp_words(text_after_len(a), text_after_len(b)).0,
            _ => self
                .labels()
                .zip(other.labels())
                .map(|(a, b)| cmp_words(a, b).0)
                .find(|o| o.is_ne())
                .unwrap_or_else(|| self.raw.first().cmp(&other.raw.first())),
        }
    }
}

/// The bytes of a lone text `raw` (its length, then the bytes) after the length.
#[inline]
fn text_after_len(raw: &[u8]) -> &[u8] {
    match raw.split_first() {
        Some((&len, rest)) if len < 0x80 => rest,
        _ => raw.get(2..).unwrap_or_default(),
    }
}

/// What a successful walk found besides what it reported.
#[derive(Clone, Copy, Debug)]
pub(super) struct Walked {
    /// The number of series.
    pub(super) series: usize,
    /// True when the info section is present.
    pub(super) has_info: bool,
}

/// Walks `bytes` as one payload, reporting to `visitor`.
///
/// # Errors
/// The first rule `bytes` breaks (see the format), or the first error of `visitor`.
#[inline]
pub(super) fn walk<'a, V: Visitor<'a>>(
    bytes: &'a [u8],
    visitor: &mut V,
) -> Result<Walked, DecodeError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let version = r.byte()?;
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let total = r.count(MAX_SERIES, Limit::Series)?;
    visitor.total(total, bytes.len());
    let mut left = total;
    let mut prev_name: Option<&[u8]> = None;
    let mut prev_ascii = false;
    while left != 0 {
        let name = r.raw_text(MAX_NAME_LEN, Limit::NameLen)?;
        // Byte order is `str` order.
        let checked = match visitor.known_name(name) {
            Some(known) => known,
            None => after(prev_name, prev_ascii, name),
        };
        if !checked.ascending {
            return Err(DecodeError::NotSorted);
        }
        let (kind, count) = read_kind_and_count(&mut r, left)?;
        if !checked.utf8 {
            return Err(DecodeError::InvalidUtf8);
        }
        visitor.family(name, kind)?;
        // One loop per kind, so the series loop does not dispatch on it.
        match kind {
            MetricKind::Counter => walk_series(&mut r, count, visitor, read_counter)?,
            MetricKind::Gauge => walk_series(&mut r, count, visitor, read_gauge)?,
            MetricKind::Histogram => walk_series(&mut r, count, visitor, read_histogram)?,
        }
        left -= count;
        prev_name = Some(name);
        prev_ascii = checked.ascii;
    }
    let has_info = match r.byte()? {
        0 => false,
        1 => {
            // The cursor goes to the info section by value, so that no loop has its address
            // taken (and its fields stay in registers).
            r = walk_info(r, visitor)?;
            true
        }
        b => return Err(DecodeError::InvalidInfoFlag(b)),
    };
    if r.remaining() != 0 {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(Walked {
        series: total,
        has_info,
    })
}

/// The `count` series of one family, their values read by `value`.
#[inline(always)]
fn walk_series<'a, V: Visitor<'a>>(
    r: &mut Reader<'a>,
    count: usize,
    visitor: &mut V,
    value: impl Fn(&mut Reader<'a>) -> Result<ValueView<'a>, DecodeError>,
) -> Result<(), DecodeError> {
    let mut prev: Option<Tuple<'a>> = None;
    for _ in 0..count {
        let tuple = read_tuple(r)?;
        if let Some(prev) = prev
            && prev.cmp(tuple) != Ordering::Less
        {
            return Err(DecodeError::NotSorted);
        }
        visitor.series(tuple, value(r)?)?;
        prev = Some(tuple);
    }
    Ok(())
}

/// The info section after its flag (field 5); returns the cursor after it.
fn walk_info<'a, V: Visitor<'a>>(
    mut r: Reader<'a>,
    visitor: &mut V,
) -> Result<Reader<'a>, DecodeError> {
    let n = r.count(MAX_INFO_SERIES, Limit::InfoSeries)?;
    visitor.info(n, r.remaining());
    for _ in 0..n {
        let labels = r.count(MAX_INFO_LABELS, Limit::InfoLabels)?;
        visitor.info_series(labels, r.remaining());
        let mut prev: Option<&[u8]> = None;
        let mut prev_ascii = false;
        for _ in 0..labels {
            let name = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
            // Byte order is `str` order.
            let checked = after(prev, prev_ascii, name);
            if !checked.utf8 {
                return Err(DecodeError::InvalidUtf8);
            }
            if !checked.ascending {
                return Err(DecodeError::NotSorted);
            }
            prev = Some(name);
            prev_ascii = checked.ascii;
            let value = match r.byte()? {
                0 => InfoRaw::None,
                1 => InfoRaw::Bool(false),
                2 => InfoRaw::Bool(true),
                3 => InfoRaw::Int(unzigzag(r.varint()?)),
                4 => {
                    let text = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
                    if !is_utf8(text) {
                        return Err(DecodeError::InvalidUtf8);
                    }
                    InfoRaw::Text(text)
                }
                t => return Err(DecodeError::UnknownInfoTag(t)),
            };
            visitor.info_label(name, value)?;
        }
    }
    Ok(r)
}

/// A family's kind and series count (at least one, at most the `left` still to read).
#[inline]
pub(super) fn read_kind_and_count(
    r: &mut Reader<'_>,
    left: usize,
) -> Result<(MetricKind, usize), DecodeError> {
    let kind = match r.byte()? {
        0 => MetricKind::Counter,
        1 => MetricKind::Gauge,
        2 => MetricKind::Histogram,
        other => return Err(DecodeError::UnknownKind(other)),
    };
    let count = r.varint()?;
    let count = usize::try_from(count)
        .ok()
        .filter(|c| (1..=left).contains(c))
        .ok_or(DecodeError::SeriesCountMismatch)?;
    Ok((kind, count))
}

/// A label count, then that many labels, each within the limits and UTF-8.
#[inline(always)]
fn read_tuple<'a>(r: &mut Reader<'a>) -> Result<Tuple<'a>, DecodeError> {
    let start = r.pos;
    let count = r.count(MAX_LABELS, Limit::Labels)?;
    for _ in 0..count {
        let raw = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
        if !is_utf8(raw) {
            return Err(DecodeError::InvalidUtf8);
        }
    }
    let raw = r.buf.get(start..r.pos).ok_or(DecodeError::Truncated)?;
    Ok(Tuple { raw })
}

/// A value of `kind`.
#[inline]
pub(super) fn read_value<'a>(
    r: &mut Reader<'a>,
    kind: MetricKind,
) -> Result<ValueView<'a>, DecodeError> {
    match kind {
        MetricKind::Counter => read_counter(r),
        MetricKind::Gauge => read_gauge(r),
        MetricKind::Histogram => read_histogram(r),
    }
}

/// A counter value.
#[inline(always)]
fn read_counter<'a>(r: &mut Reader<'a>) -> Result<ValueView<'a>, DecodeError> {
    Ok(ValueView::Counter(r.varint()?))
}

/// A gauge value: in lowest terms, the denominator at least one.
#[inline(always)]
fn read_gauge<'a>(r: &mut Reader<'a>) -> Result<ValueView<'a>, DecodeError> {
    let num = unzigzag(r.varint()?);
    let den = r.varint()?;
    Gauge::from_lowest_terms(num, den)
        .map(ValueView::Gauge)
        .ok_or(DecodeError::InvalidGauge)
}

/// A histogram value, by the rules of `Histogram::from_buckets`: at most [`MAX_BOUNDS`] bounds,
/// strictly ascending, one count per bucket, a sum. Bounds that are one of the catalogue's lists
/// are compared with its encoding in one go; other bounds are read and checked one by one.
#[inline(always)]
fn read_histogram<'a>(r: &mut Reader<'a>) -> Result<ValueView<'a>, DecodeError> {
    let bounds = r.count(MAX_BOUNDS, Limit::Bounds)?;
    let start = r.pos;
    // A catalogue list, canonically encoded, is ascending: nothing more to check.
    if !r.skip_known_bounds(bounds) {
        let mut prev = None;
        for _ in 0..bounds {
            let b = r.varint()?;
            if prev.is_some_and(|p| p >= b) {
                return Err(DecodeError::InvalidHistogram);
            }
            prev = Some(b);
        }
    }
    // The bucket counts, then the sum.
    r.skip_varints(bounds + 2)?;
    let raw = r.buf.get(start..r.pos).ok_or(DecodeError::Truncated)?;
    Ok(ValueView::Histogram(HistogramView::new(raw, bounds)))
}
