//! The borrowed view of a payload: [`PayloadView`], its [`SeriesIter`] and the [`SeriesView`]s
//! it lends.

use super::reader::Reader;
use super::value::ValueView;
use super::walk::{Check, read_kind_and_count, read_value, walk};
use super::{DecodeError, Limit};
use crate::stats::MetricKind;
use crate::stats::catalogue::{self, CATALOGUE};
use crate::stats::payload::{MAX_LABEL_LEN, MAX_LABELS, MAX_NAME_LEN, MAX_SERIES};

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
        let mut r = Reader {
            buf: self.bytes,
            pos: 0,
        };
        // The version byte, then the series total (the view's length).
        let left = match r.byte() {
            Ok(_) => r.count(MAX_SERIES, Limit::Series).unwrap_or(0),
            Err(_) => 0,
        };
        SeriesIter {
            r,
            left,
            left_in_family: 0,
            name: "",
            kind: MetricKind::Counter,
        }
    }
}

/// The series of a [`PayloadView`], read again from its bytes one at a time.
///
/// A `PayloadView` is only made by [`decode_view`], which walked its bytes and checked every
/// rule (order included), so this reads the fields with the walk's per-field readers and checks
/// no order again. Its reads stay checked: were the bytes to break a rule after all, the
/// iterator would simply end; it never panics.
pub struct SeriesIter<'a> {
    r: Reader<'a>,
    /// Series still to read, over all families.
    left: usize,
    /// Series still to read in the current family.
    left_in_family: usize,
    name: &'a str,
    kind: MetricKind,
}

impl core::fmt::Debug for SeriesIter<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SeriesIter")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl<'a> SeriesIter<'a> {
    /// The next series, or `None` at the end (or on bytes that break a rule).
    fn read(&mut self) -> Option<SeriesView<'a>> {
        if self.left == 0 {
            return None;
        }
        if self.left_in_family == 0 {
            let name = self.r.raw_text(MAX_NAME_LEN, Limit::NameLen).ok()?;
            let (kind, count) = read_kind_and_count(&mut self.r, self.left).ok()?;
            // A catalogue name is lent from the catalogue (no UTF-8 check needed).
            self.name = match catalogue::position_bytes(name).and_then(|i| CATALOGUE.get(i)) {
                Some(def) => def.name,
                None => core::str::from_utf8(name).ok()?,
            };
            self.kind = kind;
            self.left_in_family = count;
        }
        let count = self.r.count(MAX_LABELS, Limit::Labels).ok()?;
        let mut labels = heapless::Vec::new();
        for _ in 0..count {
            let raw = self.r.raw_text(MAX_LABEL_LEN, Limit::LabelLen).ok()?;
            // A known label text is lent from the catalogue (no UTF-8 check needed).
            let text = match catalogue::known_label_bytes(raw) {
                Some(known) => known,
                None => core::str::from_utf8(raw).ok()?,
            };
            labels.push(text).ok()?;
        }
        let value = read_value(&mut self.r, self.kind).ok()?;
        self.left_in_family -= 1;
        self.left -= 1;
        Some(SeriesView {
            name: self.name,
            labels,
            value,
        })
    }
}

impl<'a> Iterator for SeriesIter<'a> {
    type Item = SeriesView<'a>;

    fn next(&mut self) -> Option<SeriesView<'a>> {
        let series = self.read();
        if series.is_none() {
            self.left = 0;
        }
        series
    }
}

/// Validates `bytes` as one canonical payload and returns a view that lends from it.
///
/// # Errors
/// As [`decode`](fn@super::decode).
pub fn decode_view(bytes: &[u8]) -> Result<PayloadView<'_>, DecodeError> {
    let walked = walk(bytes, &mut Check)?;
    Ok(PayloadView {
        bytes,
        len: walked.series,
        has_info: walked.has_info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view is only made by `decode_view`; were one made over bytes that break the rules, its
    /// series would still be read with checked reads: the walk ends, it never panics.
    #[test]
    fn series_of_unchecked_bytes_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000 {
            let len = usize::try_from(next() % 64).unwrap_or(0);
            // Mostly small bytes (counts, lengths and kinds that parse), some of any value.
            let bytes: alloc::vec::Vec<u8> = (0..len)
                .map(|_| {
                    let v = next();
                    let b = v.to_le_bytes()[0];
                    if v & 0x300 == 0 { b } else { b % 4 }
                })
                .collect();
            let view = PayloadView {
                bytes: &bytes,
                len: round % 300,
                has_info: false,
            };
            let walked = view.series().count();
            assert!(walked <= bytes.len(), "{bytes:?}");
        }
    }
}
