//! `stats::wire`: a compact, versioned, canonical binary encoding of a [`Payload`].
//!
//! The bytes carry names, kinds, labels, values and info, so a receiver decodes a payload without
//! knowing the metric catalogue. The encoding is canonical: a payload has exactly one encoding
//! (series and info labels in sorted order, minimal varints, gauges in lowest terms), and
//! [`decode`] accepts nothing else: no trailing bytes, no over-long varints, no duplicate or
//! unsorted keys. Hard limits (those of [`payload`](super::payload)) bound every count and
//! length, so hostile input cannot make the decoder allocate more than
//! [`MAX_SERIES`] series and [`MAX_INFO_SERIES`] × [`MAX_INFO_LABELS`] info labels.
//!
//! # Format, version 1
//!
//! `varint` is unsigned LEB128 (7 bits per byte, least significant first, at most 10 bytes, no
//! trailing zero byte); `zigzag` maps a signed value `n` to `(n << 1) ^ (n >> 63)` before the
//! varint; `text` is a varint byte length followed by that many bytes of UTF-8.
//!
//! | # | field | encoding | rule |
//! |---|---|---|---|
//! | 1 | version | `u8` | `1` |
//! | 2 | series total `N` | varint | `N ≤ MAX_SERIES` |
//! | 3 | families, until `N` series are read: | | |
//! | 3.1 | name | text | `≤ MAX_NAME_LEN` bytes; strictly ascending (byte order) across families |
//! | 3.2 | kind | `u8` | `0` counter, `1` gauge, `2` histogram |
//! | 3.3 | series count `S` | varint | `1 ≤ S`, running total `≤ N` |
//! | 3.4 | `S` × series: | | label tuples strictly ascending within the family |
//! | 3.4.1 | label count `L` | varint | `L ≤ MAX_LABELS` |
//! | 3.4.2 | `L` × label value | text | `≤ MAX_LABEL_LEN` bytes |
//! | 3.4.3 | counter value | varint | |
//! | 3.4.3 | gauge value | zigzag numerator, varint denominator | denominator `≥ 1`, lowest terms |
//! | 3.4.3 | histogram value | varint `B`, `B` × varint bound, `B + 1` × varint bucket count, varint sum | `B ≤ 16`, bounds strictly ascending; the count is the (saturating) total of the buckets |
//! | 4 | info flag | `u8` | `0` absent, `1` present |
//! | 5 | if present: info series count `I` | varint | `I ≤ MAX_INFO_SERIES` |
//! | 5.1 | `I` × series: label count `P` | varint | `P ≤ MAX_INFO_LABELS` |
//! | 5.2 | `P` × label name | text | `≤ MAX_LABEL_LEN`; strictly ascending within the series |
//! | 5.3 | `P` × value tag | `u8` | `0` None, `1` False, `2` True, `3` integer, `4` text |
//! | 5.4 | `P` × value | integer: zigzag; text: text (`≤ MAX_LABEL_LEN`); else nothing | |
//!
//! Fields 5.2–5.4 are interleaved per label (name, tag, value). Nothing follows field 4/5.
//!
//! # Contract
//!
//! - [`encode`] never panics; it writes [`encoded_len`] bytes when `buf.len() >=
//!   encoded_len(payload)` and returns [`EncodeError::BufferTooSmall`] otherwise.
//!   Every payload fits in [`MAX_ENCODED_LEN`] bytes.
//! - [`decode`] never panics on any input. Input that ends early is [`DecodeError::Truncated`]
//!   (every strict prefix of a valid encoding gives exactly that); anything else that is not a
//!   canonical encoding is another variant ([`DecodeError::is_truncated`] tells them apart).
//! - `decode(&encode(p)) == p` for every payload `p`.
//!
//! ```
//! use kvtier_core::stats::{Gauge, Payload, catalogue, wire};
//!
//! let mut p = Payload::new();
//! p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(3, 4)).unwrap();
//! p.increase_counter(catalogue::SIMPLE_SAVE_OUTCOMES, &["stored"], 7).unwrap();
//! let mut buf = [0u8; 128];
//! let n = wire::encode(&p, &mut buf).unwrap();
//! assert_eq!(n, wire::encoded_len(&p));
//! assert_eq!(wire::decode(&buf[..n]).unwrap(), p);
//! assert!(wire::decode(&buf[..n - 1]).unwrap_err().is_truncated());
//! assert!(wire::encode(&p, &mut buf[..3]).is_err());
//! ```

use alloc::vec::Vec;
use core::fmt;

use super::MetricKind;
use super::histogram::MAX_BOUNDS;
use super::payload::{
    InfoValue, MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, MAX_LABELS, MAX_NAME_LEN,
    MAX_SERIES, Payload, Series, Value,
};

mod decode;

pub use decode::{PayloadView, SeriesIter, SeriesView, ValueView, decode, decode_view};

/// The format version this module writes and reads.
pub const VERSION: u8 = 1;

const MAX_VARINT: usize = 10;
const fn text_max(len: usize) -> usize {
    2 + len
}
const MAX_SERIES_BYTES: usize = text_max(MAX_NAME_LEN) + 1 + MAX_VARINT // family header
    + 1 + MAX_LABELS * text_max(MAX_LABEL_LEN) // labels
    + 1 + MAX_BOUNDS * MAX_VARINT + (MAX_BOUNDS + 1) * MAX_VARINT + MAX_VARINT; // histogram
const MAX_INFO_BYTES: usize = MAX_VARINT
    + MAX_INFO_SERIES * (MAX_VARINT + MAX_INFO_LABELS * (2 * text_max(MAX_LABEL_LEN) + 1));

/// An upper bound of [`encoded_len`] over every payload the limits allow.
pub const MAX_ENCODED_LEN: usize =
    1 + MAX_VARINT + MAX_SERIES * MAX_SERIES_BYTES + 1 + MAX_INFO_BYTES;

/// Why [`encode`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The buffer is shorter than the encoding.
    BufferTooSmall {
        /// Bytes the encoding needs ([`encoded_len`]).
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall { needed, available } => write!(
                f,
                "the payload needs {needed} bytes but the buffer has {available}"
            ),
        }
    }
}

impl core::error::Error for EncodeError {}

/// Which hard limit a decoded count or length passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// [`MAX_SERIES`].
    Series,
    /// [`MAX_NAME_LEN`].
    NameLen,
    /// [`MAX_LABELS`].
    Labels,
    /// [`MAX_LABEL_LEN`].
    LabelLen,
    /// [`MAX_BOUNDS`].
    Bounds,
    /// [`MAX_INFO_SERIES`].
    InfoSeries,
    /// [`MAX_INFO_LABELS`].
    InfoLabels,
}

/// Why [`decode`] rejected its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended before the payload did (more bytes might complete it).
    Truncated,
    /// The version byte is not [`VERSION`].
    UnsupportedVersion(u8),
    /// A varint has a redundant trailing zero byte.
    NonCanonicalVarint,
    /// A varint does not fit in 64 bits.
    VarintOverflow,
    /// A count or length passes a hard limit.
    LimitExceeded(Limit),
    /// A name, label or text is not UTF-8.
    InvalidUtf8,
    /// A kind byte is not 0, 1 or 2.
    UnknownKind(u8),
    /// An info value tag is not 0–4.
    UnknownInfoTag(u8),
    /// The info flag is not 0 or 1.
    InvalidInfoFlag(u8),
    /// Family names, label tuples or info label names are not strictly ascending (duplicates
    /// included).
    NotSorted,
    /// A family has no series, or the families hold more series than the total says.
    SeriesCountMismatch,
    /// A gauge has denominator 0 or is not in lowest terms.
    InvalidGauge,
    /// Histogram bounds are not strictly ascending.
    InvalidHistogram,
    /// Bytes follow the payload.
    TrailingBytes,
}

impl DecodeError {
    /// True when the input is a strict prefix of something that might decode (more bytes are
    /// needed); false when it is invalid whatever follows.
    #[must_use]
    pub const fn is_truncated(&self) -> bool {
        matches!(self, DecodeError::Truncated)
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("the stats payload is truncated"),
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "stats wire version {v} is not supported (expected {VERSION})"
                )
            }
            DecodeError::NonCanonicalVarint => f.write_str("over-long varint"),
            DecodeError::VarintOverflow => f.write_str("varint does not fit in 64 bits"),
            DecodeError::LimitExceeded(l) => write!(f, "a count or length passes the {l:?} limit"),
            DecodeError::InvalidUtf8 => f.write_str("text is not UTF-8"),
            DecodeError::UnknownKind(k) => write!(f, "unknown metric kind {k}"),
            DecodeError::UnknownInfoTag(t) => write!(f, "unknown info value tag {t}"),
            DecodeError::InvalidInfoFlag(b) => write!(f, "info flag {b} is neither 0 nor 1"),
            DecodeError::NotSorted => f.write_str("keys are duplicated or not in ascending order"),
            DecodeError::SeriesCountMismatch => {
                f.write_str("the family series counts do not add up to the total")
            }
            DecodeError::InvalidGauge => {
                f.write_str("a gauge has a zero denominator or is not in lowest terms")
            }
            DecodeError::InvalidHistogram => {
                f.write_str("histogram bounds are not strictly ascending")
            }
            DecodeError::TrailingBytes => f.write_str("bytes follow the stats payload"),
        }
    }
}

impl core::error::Error for DecodeError {}

// ---------------------------------------------------------------- sizes

const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

const fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)).cast_unsigned()
}

const fn unzigzag(v: u64) -> i64 {
    (v >> 1).cast_signed() ^ -((v & 1).cast_signed())
}

fn text_len(s: &str) -> usize {
    varint_len(s.len() as u64) + s.len()
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::Counter(c) => varint_len(*c),
        Value::Gauge(g) => varint_len(zigzag(g.numerator())) + varint_len(g.denominator()),
        Value::Histogram(h) => {
            varint_len(h.bounds().len() as u64)
                + h.bounds().iter().map(|b| varint_len(*b)).sum::<usize>()
                + h.bucket_counts()
                    .iter()
                    .map(|c| varint_len(*c))
                    .sum::<usize>()
                + varint_len(h.sum())
        }
    }
}

/// The families of a payload: runs of series with the same name.
fn families(series: &[Series]) -> impl Iterator<Item = &[Series]> {
    series.chunk_by(|a, b| a.name == b.name)
}

/// The exact number of bytes [`encode`] writes for `payload`.
#[must_use]
pub fn encoded_len(payload: &Payload) -> usize {
    let mut n = 1 + varint_len(payload.len() as u64) + 1;
    for fam in families(payload.series()) {
        if let Some(first) = fam.first() {
            n += text_len(first.name()) + 1 + varint_len(fam.len() as u64);
        }
        for s in fam {
            n += varint_len(s.labels().len() as u64);
            n += s.labels().iter().map(text_len).sum::<usize>();
            n += value_len(s.value());
        }
    }
    if let Some(info) = payload.info() {
        n += varint_len(info.len() as u64);
        for series in info {
            n += varint_len(series.len() as u64);
            for (k, v) in series.iter() {
                n += text_len(k) + 1;
                n += match v {
                    InfoValue::Int(i) => varint_len(zigzag(*i)),
                    InfoValue::Text(t) => text_len(t),
                    InfoValue::None | InfoValue::Bool(_) => 0,
                };
            }
        }
    }
    n
}

// ---------------------------------------------------------------- encode

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

/// The buffer ran out (the caller turns this into [`EncodeError::BufferTooSmall`]).
struct Full;

impl Writer<'_> {
    #[inline]
    fn byte(&mut self, b: u8) -> Result<(), Full> {
        let slot = self.buf.get_mut(self.pos).ok_or(Full)?;
        *slot = b;
        self.pos += 1;
        Ok(())
    }

    #[inline]
    #[expect(clippy::cast_possible_truncation, reason = "masked to 7 bits first")]
    fn varint(&mut self, mut v: u64) -> Result<(), Full> {
        while v >= 0x80 {
            self.byte((v as u8 & 0x7f) | 0x80)?;
            v >>= 7;
        }
        self.byte(v as u8)
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) -> Result<(), Full> {
        let end = self.pos.checked_add(b.len()).ok_or(Full)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(Full)?
            .copy_from_slice(b);
        self.pos = end;
        Ok(())
    }

    fn text(&mut self, s: &str) -> Result<(), Full> {
        self.varint(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
}

const fn kind_byte(k: MetricKind) -> u8 {
    match k {
        MetricKind::Counter => 0,
        MetricKind::Gauge => 1,
        MetricKind::Histogram => 2,
    }
}

fn write_payload(w: &mut Writer<'_>, payload: &Payload) -> Result<(), Full> {
    w.byte(VERSION)?;
    w.varint(payload.len() as u64)?;
    for fam in families(payload.series()) {
        let Some(first) = fam.first() else { continue };
        w.text(first.name())?;
        w.byte(kind_byte(first.kind()))?;
        w.varint(fam.len() as u64)?;
        for s in fam {
            w.varint(s.labels().len() as u64)?;
            for l in s.labels().iter() {
                w.text(l)?;
            }
            match s.value() {
                Value::Counter(c) => w.varint(*c)?,
                Value::Gauge(g) => {
                    w.varint(zigzag(g.numerator()))?;
                    w.varint(g.denominator())?;
                }
                Value::Histogram(h) => {
                    w.varint(h.bounds().len() as u64)?;
                    for b in h.bounds() {
                        w.varint(*b)?;
                    }
                    for c in h.bucket_counts() {
                        w.varint(*c)?;
                    }
                    w.varint(h.sum())?;
                }
            }
        }
    }
    match payload.info() {
        None => w.byte(0),
        Some(info) => {
            w.byte(1)?;
            w.varint(info.len() as u64)?;
            for series in info {
                w.varint(series.len() as u64)?;
                for (k, v) in series.iter() {
                    w.text(k)?;
                    match v {
                        InfoValue::None => w.byte(0)?,
                        InfoValue::Bool(false) => w.byte(1)?,
                        InfoValue::Bool(true) => w.byte(2)?,
                        InfoValue::Int(i) => {
                            w.byte(3)?;
                            w.varint(zigzag(*i))?;
                        }
                        InfoValue::Text(t) => {
                            w.byte(4)?;
                            w.text(t)?;
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// Encodes `payload` into the front of `buf` and returns the number of bytes written.
///
/// # Errors
/// [`EncodeError::BufferTooSmall`] when `buf` is shorter than [`encoded_len`]; the bytes of `buf`
/// are unspecified then.
pub fn encode(payload: &Payload, buf: &mut [u8]) -> Result<usize, EncodeError> {
    let available = buf.len();
    let mut w = Writer { buf, pos: 0 };
    match write_payload(&mut w, payload) {
        Ok(()) => Ok(w.pos),
        Err(Full) => Err(EncodeError::BufferTooSmall {
            needed: encoded_len(payload),
            available,
        }),
    }
}

/// Encodes `payload` into a new vector of exactly [`encoded_len`] bytes.
#[must_use]
pub fn encode_to_vec(payload: &Payload) -> Vec<u8> {
    let mut out = alloc::vec![0u8; encoded_len(payload)];
    // The buffer has exactly the needed length, so this cannot fail; keep what was written.
    let n = encode(payload, &mut out).unwrap_or(0);
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::decode::Reader;
    use super::*;

    #[test]
    fn varints_are_minimal_and_bounded() {
        let mut buf = [0u8; 10];
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut w = Writer {
                buf: &mut buf,
                pos: 0,
            };
            assert!(w.varint(v).is_ok());
            let n = w.pos;
            assert_eq!(n, varint_len(v));
            let mut r = Reader {
                buf: &buf[..n],
                pos: 0,
            };
            assert_eq!(r.varint(), Ok(v));
            let mut r = Reader {
                buf: &buf[..n - 1],
                pos: 0,
            };
            assert_eq!(r.varint(), Err(DecodeError::Truncated));
        }
        let over_long = [0x80, 0x00];
        assert_eq!(
            Reader {
                buf: &over_long,
                pos: 0
            }
            .varint(),
            Err(DecodeError::NonCanonicalVarint)
        );
        let too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(
            Reader {
                buf: &too_big,
                pos: 0
            }
            .varint(),
            Err(DecodeError::VarintOverflow)
        );
        for v in [0i64, 1, -1, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn empty_payload_is_three_bytes() {
        let p = Payload::new();
        assert_eq!(encode_to_vec(&p), [1, 0, 0]);
        assert_eq!(decode(&[1, 0, 0]), Ok(p));
        assert_eq!(decode(&[1, 0, 0, 0]), Err(DecodeError::TrailingBytes));
        assert_eq!(decode(&[2, 0, 0]), Err(DecodeError::UnsupportedVersion(2)));
        assert_eq!(decode(&[1, 0, 2]), Err(DecodeError::InvalidInfoFlag(2)));
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
    }

    #[test]
    fn non_canonical_gauges_and_orders_are_rejected() {
        // One gauge "g" = 2/4 (not in lowest terms).
        assert_eq!(
            decode(&[1, 1, 1, b'g', 1, 1, 0, 4, 4, 0]),
            Err(DecodeError::InvalidGauge)
        );
        assert_eq!(
            decode(&[1, 1, 1, b'g', 1, 1, 0, 2, 0, 0]),
            Err(DecodeError::InvalidGauge)
        );
        assert!(decode(&[1, 1, 1, b'g', 1, 1, 0, 2, 2, 0]).is_ok());
        // Two families "b" then "a".
        let unsorted = [1, 2, 1, b'b', 0, 1, 0, 5, 1, b'a', 0, 1, 0, 5, 0];
        assert_eq!(decode(&unsorted), Err(DecodeError::NotSorted));
        // The same label tuple twice.
        let dup = [1, 2, 1, b'c', 0, 2, 1, 1, b'x', 1, 1, 1, b'x', 2, 0];
        assert_eq!(decode(&dup), Err(DecodeError::NotSorted));
        // A family claiming more series than the total.
        assert_eq!(
            decode(&[1, 1, 1, b'c', 0, 2, 0, 1, 0, 1, 0]),
            Err(DecodeError::SeriesCountMismatch)
        );
        assert_eq!(
            decode(&[1, 1, 1, b'c', 3]),
            Err(DecodeError::UnknownKind(3))
        );
    }

    #[test]
    fn limits_are_enforced_before_allocation() {
        assert_eq!(
            decode(&[1, 0xff, 0xff, 0x03]),
            Err(DecodeError::LimitExceeded(Limit::Series))
        );
        assert_eq!(
            decode(&[1, 1, 0xff, 0x7f]),
            Err(DecodeError::LimitExceeded(Limit::NameLen))
        );
        assert_eq!(
            decode(&[1, 0, 1, 17]),
            Err(DecodeError::LimitExceeded(Limit::InfoSeries))
        );
        const { assert!(MAX_ENCODED_LEN < 1 << 20) };
    }
}
