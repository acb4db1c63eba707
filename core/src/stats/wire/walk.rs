//! [`Walker`]: the validating walk over the bytes, then the info section and the end.
//!
//! [`decode`](fn@super::decode) and the view's series take it one series at a time
//! ([`Walker::next_series`]: names and known label texts interned, values kept);
//! [`decode_view`](super::decode_view) checks every series in one loop
//! ([`Walker::check_series`]: nothing kept, texts only checked as UTF-8). Both read each field
//! with the same functions in the same order, so they accept the same inputs and report the
//! same error for each rejected one (the wire property tests and the `wire_decode` fuzz target
//! compare them).
//!
//! The fast paths keep every check: a catalogue histogram's bounds are compared with their
//! canonical encoding in one go (equal bytes are valid bounds; other bytes are read one by one),
//! a run of eight single-byte varints (each one canonical) is passed at once, and ASCII text is
//! checked a word at a time before the full UTF-8 check.

use alloc::vec::Vec;

use super::reader::{Lent, Reader, is_utf8, lend, utf8};
use super::view::{HistogramView, ValueView};
use super::{DecodeError, Limit, VERSION, unzigzag};
use crate::stats::MetricKind;
use crate::stats::catalogue::{self, CATALOGUE, MetricDef};
use crate::stats::histogram::MAX_BOUNDS;
use crate::stats::payload::{
    Gauge, InfoSeries, InfoValue, MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, MAX_LABELS,
    MAX_NAME_LEN, MAX_SERIES, Text,
};

/// A label tuple as read.
pub(super) type Tuple<'a> = heapless::Vec<Lent<'a>, MAX_LABELS>;

/// The walk's position and what it read last.
pub(super) struct Walker<'a> {
    r: Reader<'a>,
    /// Series still to read, over all families.
    left: usize,
    /// Series still to read in the current family.
    left_in_family: usize,
    /// The current family: its name and its position in the catalogue (if it is a catalogue
    /// name); `None` before the first.
    family: Option<(&'a str, Option<usize>)>,
    /// The current family's kind.
    kind: MetricKind,
    /// The label tuples of the last two series; `last` says which holds the latest.
    tuples: [Tuple<'a>; 2],
    last: bool,
    value: ValueView<'a>,
}

impl core::fmt::Debug for Walker<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Walker")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl<'a> Walker<'a> {
    /// Reads the version and the series total.
    pub(super) fn new(bytes: &'a [u8]) -> Result<Self, DecodeError> {
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
            family: None,
            kind: MetricKind::Counter,
            tuples: [Tuple::new(), Tuple::new()],
            last: false,
            value: ValueView::Counter(0),
        })
    }

    /// Series not read yet.
    pub(super) const fn left(&self) -> usize {
        self.left
    }

    /// The name of the series read last.
    pub(super) fn name(&self) -> &'a str {
        self.family.map_or("", |(name, _)| name)
    }

    /// The catalogue family of the series read last, if its name is a catalogue name.
    pub(super) fn def(&self) -> Option<&'static MetricDef> {
        self.family
            .and_then(|(_, position)| position)
            .and_then(|i| CATALOGUE.get(i))
    }

    /// The label tuple of the series read last.
    pub(super) fn labels(&self) -> &[Lent<'a>] {
        let [a, b] = &self.tuples;
        if self.last { b } else { a }
    }

    /// The value of the series read last.
    pub(super) const fn value(&self) -> ValueView<'a> {
        self.value
    }

    /// Reads the next series; `Some(true)` when it opens a family, `None` after the last one.
    #[inline]
    pub(super) fn next_series(&mut self) -> Result<Option<bool>, DecodeError> {
        if self.left == 0 {
            return Ok(None);
        }
        let opens_family = self.left_in_family == 0;
        if opens_family {
            self.read_family()?;
        }
        let [a, b] = &mut self.tuples;
        let (last, next) = if self.last { (b, a) } else { (a, b) };
        read_tuple(&mut self.r, next, |r| {
            r.text(MAX_LABEL_LEN, Limit::LabelLen)
        })?;
        if !opens_family && *last >= *next {
            return Err(DecodeError::NotSorted);
        }
        self.value = read_value(&mut self.r, self.kind)?;
        self.last = !self.last;
        self.left_in_family -= 1;
        self.left -= 1;
        Ok(Some(opens_family))
    }

    /// A family header: its name (after the previous one), kind and series count.
    fn read_family(&mut self) -> Result<(), DecodeError> {
        let raw = self.r.raw_text(MAX_NAME_LEN, Limit::NameLen)?;
        let position = catalogue::position_bytes(raw);
        // Catalogue positions follow the byte order of the names, which is `str` order.
        let ascending = match (self.family, position) {
            (None, _) => true,
            (Some((_, Some(prev))), Some(at)) => prev < at,
            (Some((prev, _)), _) => prev.as_bytes() < raw,
        };
        if !ascending {
            return Err(DecodeError::NotSorted);
        }
        let (kind, count) = read_kind_and_count(&mut self.r, self.left)?;
        let name = match position.and_then(|i| CATALOGUE.get(i)) {
            Some(def) => def.name,
            None => utf8(raw)?,
        };
        self.family = Some((name, position));
        self.kind = kind;
        self.left_in_family = count;
        Ok(())
    }

    /// Checks every series not read yet, keeping nothing: the checks of [`next_series`] in one
    /// loop, with names and texts checked as UTF-8 in place of being looked up.
    ///
    /// [`next_series`]: Self::next_series
    pub(super) fn check_series(&mut self) -> Result<(), DecodeError> {
        // A family begun step by step is finished that way.
        while self.left_in_family != 0 {
            self.next_series()?;
        }
        let prev_name = self.family.map(|(name, _)| name.as_bytes());
        let mut r = Reader {
            buf: self.r.buf,
            pos: self.r.pos,
        };
        let checked = check_families(&mut r, prev_name, self.left);
        self.r.pos = r.pos;
        checked?;
        self.left = 0;
        Ok(())
    }

    /// After the last series: the info section and the end. With `keep`, the info series are
    /// built and returned; without, they are only checked (nothing is allocated) and an empty
    /// list stands for a present section.
    pub(super) fn finish(&mut self, keep: bool) -> Result<Option<Vec<InfoSeries>>, DecodeError> {
        let info = match self.r.byte()? {
            0 => None,
            1 => {
                let n = self.r.count(MAX_INFO_SERIES, Limit::InfoSeries)?;
                if keep {
                    let mut info = Vec::with_capacity(n.min(self.r.remaining()));
                    for _ in 0..n {
                        info.push(read_info_series(&mut self.r)?);
                    }
                    Some(info)
                } else {
                    for _ in 0..n {
                        check_info_series(&mut self.r)?;
                    }
                    Some(Vec::new())
                }
            }
            b => return Err(DecodeError::InvalidInfoFlag(b)),
        };
        if self.r.remaining() != 0 {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(info)
    }
}

/// The loop of [`Walker::check_series`]: families holding `left` series, the first after
/// `prev_name`.
fn check_families<'a>(
    r: &mut Reader<'a>,
    mut prev_name: Option<&'a [u8]>,
    mut left: usize,
) -> Result<(), DecodeError> {
    let mut tuples: [heapless::Vec<&[u8], MAX_LABELS>; 2] = Default::default();
    while left != 0 {
        let raw = r.raw_text(MAX_NAME_LEN, Limit::NameLen)?;
        if prev_name.is_some_and(|prev| prev >= raw) {
            return Err(DecodeError::NotSorted);
        }
        let (kind, count) = read_kind_and_count(r, left)?;
        if !is_utf8(raw) {
            return Err(DecodeError::InvalidUtf8);
        }
        for i in 0..count {
            let [a, b] = &mut tuples;
            let (last, next) = if i % 2 == 1 { (a, b) } else { (b, a) };
            read_tuple(r, next, |r| {
                let raw = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
                is_utf8(raw).then_some(raw).ok_or(DecodeError::InvalidUtf8)
            })?;
            if i != 0 && *last >= *next {
                return Err(DecodeError::NotSorted);
            }
            read_value(r, kind)?;
        }
        left -= count;
        prev_name = Some(raw);
    }
    Ok(())
}

/// A family's kind and series count (at least one, at most the `left` still to read).
#[inline]
fn read_kind_and_count(
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

/// A label count, then that many labels, each read by `label`, into `into`.
#[inline]
fn read_tuple<'a, T>(
    r: &mut Reader<'a>,
    into: &mut heapless::Vec<T, MAX_LABELS>,
    mut label: impl FnMut(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<(), DecodeError> {
    let n = r.count(MAX_LABELS, Limit::Labels)?;
    into.clear();
    for _ in 0..n {
        let value = label(r)?;
        into.push(value)
            .map_err(|_| DecodeError::LimitExceeded(Limit::Labels))?;
    }
    Ok(())
}

/// A value of `kind`. Histogram bounds that are one of the catalogue's lists are compared with
/// its encoding in one go; other bounds are read and checked one by one.
#[inline(always)]
fn read_value<'a>(r: &mut Reader<'a>, kind: MetricKind) -> Result<ValueView<'a>, DecodeError> {
    match kind {
        MetricKind::Counter => Ok(ValueView::Counter(r.varint()?)),
        MetricKind::Gauge => {
            let num = unzigzag(r.varint()?);
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
    }
}

/// One info series (fields 5.1–5.4), built.
fn read_info_series(r: &mut Reader<'_>) -> Result<InfoSeries, DecodeError> {
    let n = r.count(MAX_INFO_LABELS, Limit::InfoLabels)?;
    let mut pairs: Vec<(Text, InfoValue)> = Vec::with_capacity(n.min(r.remaining()));
    let mut prev: Option<&[u8]> = None;
    for _ in 0..n {
        let key = info_key(r, prev)?;
        prev = Some(key);
        let value = match r.byte()? {
            0 => InfoValue::None,
            1 => InfoValue::Bool(false),
            2 => InfoValue::Bool(true),
            3 => InfoValue::Int(unzigzag(r.varint()?)),
            4 => InfoValue::Text(lend(info_text(r)?)?.to_text()),
            t => return Err(DecodeError::UnknownInfoTag(t)),
        };
        pairs.push((lend(key)?.to_text(), value));
    }
    Ok(InfoSeries::from_checked_pairs(pairs))
}

/// One info series checked as [`read_info_series`] reads it, in the same order, keeping nothing.
fn check_info_series(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    let n = r.count(MAX_INFO_LABELS, Limit::InfoLabels)?;
    let mut prev: Option<&[u8]> = None;
    for _ in 0..n {
        prev = Some(info_key(r, prev)?);
        match r.byte()? {
            0..=2 => {}
            3 => {
                r.varint()?;
            }
            4 => {
                info_text(r)?;
            }
            t => return Err(DecodeError::UnknownInfoTag(t)),
        }
    }
    Ok(())
}

/// An info label name: UTF-8, after `prev` (byte order is `str` order).
#[inline]
fn info_key<'a>(r: &mut Reader<'a>, prev: Option<&[u8]>) -> Result<&'a [u8], DecodeError> {
    let key = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
    if !is_utf8(key) {
        return Err(DecodeError::InvalidUtf8);
    }
    // Byte order is `str` order.
    if prev.is_some_and(|p| p >= key) {
        return Err(DecodeError::NotSorted);
    }
    Ok(key)
}

/// An info text value: UTF-8.
#[inline]
fn info_text<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    let raw = r.raw_text(MAX_LABEL_LEN, Limit::LabelLen)?;
    if !is_utf8(raw) {
        return Err(DecodeError::InvalidUtf8);
    }
    Ok(raw)
}
