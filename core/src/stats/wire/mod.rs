//! `stats::wire`: a compact, versioned, canonical binary encoding of a
//! [`Payload`](super::Payload).
//!
//! The bytes carry names, kinds, labels, values and info, so a receiver decodes a payload without
//! knowing the metric catalogue. The encoding is canonical: a payload has exactly one encoding
//! (series and info labels in sorted order, minimal varints, gauges in lowest terms), and
//! [`decode`](fn@decode) accepts nothing else: no trailing bytes, no over-long varints, no
//! duplicate or unsorted keys. Hard limits (those of [`payload`](super::payload)) bound every
//! count and length, so hostile input cannot make the decoder allocate more than
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
//! - [`encode`](fn@encode) never panics; it writes [`encoded_len`] bytes when `buf.len() >=
//!   encoded_len(payload)` and returns [`EncodeError::BufferTooSmall`] otherwise.
//!   Every payload fits in [`MAX_ENCODED_LEN`] bytes.
//! - [`decode`](fn@decode) never panics on any input. Input that ends early is
//!   [`DecodeError::Truncated`] (every strict prefix of a valid encoding gives exactly that);
//!   anything else that is not a canonical encoding is another variant
//!   ([`DecodeError::is_truncated`] tells them apart).
//! - `decode(&encode(p)) == p` for every payload `p`.
//! - [`decode_view`] validates exactly as [`decode`](fn@decode) does (same result, same
//!   error: both are the one walk) and allocates nothing; its series are read from the input
//!   again when walked.
//!
//! # Cost
//!
//! One validating walk (module `walk`) holds every decoding rule; it runs to the end
//! with its state in locals and reports what it read to a visitor: [`decode`](fn@decode)'s
//! builds the payload, [`decode_view`]'s keeps nothing (the walk is monomorphized twice, so the
//! view pays for no building). A view's series are read again from the validated bytes, one at
//! a time, by the walk's per-field readers when [`PayloadView::series`] is walked.
//!
//! Catalogue names and the known label texts are found by a compile-time perfect hash (one
//! hash, one comparison) when `decode` builds them and when a view's series lend them (no UTF-8
//! check then); `decode`, which looks the names up anyway, orders two catalogue names by their
//! catalogue positions (which follow the byte order) for the walk. The catalogue's histogram
//! bound lists are written and compared as precomputed bytes; runs of single-byte bucket counts
//! are handled eight at a time; otherwise a family name (and an info label name) is compared
//! with the one before a word at a time, and checked as ASCII a word at a time only past the
//! words it shares with an ASCII one before it (UTF-8 in full only when it is not ASCII);
//! the series loop is specialised per kind; a label tuple is kept as the bytes that hold it.
//! None of this changes the bytes or what is accepted.
//!
//! | module | holds |
//! |---|---|
//! | this one | the format, the errors, varint sizes |
//! | `encode` | [`encode`](fn@encode), [`encode_to_vec`], [`encoded_len`] |
//! | `reader` | the checked cursor over the input, the word-at-a-time text order and checks |
//! | `walk` | the validating walk (every rule), its visitor, the per-field readers |
//! | `view` | [`decode_view`] (the walk, nothing kept), [`PayloadView`], [`SeriesIter`] |
//! | `decode` | [`decode`](fn@decode) (the walk, with the visitor that builds the payload) |
//! | `fixed` | the precomputed encodings of the catalogue's bound lists |
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

use core::fmt;

use super::histogram::MAX_BOUNDS;
use super::payload::{
    MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, MAX_LABELS, MAX_NAME_LEN, MAX_SERIES,
};

mod decode;
mod encode;
mod fixed;
mod reader;
mod value;
mod view;
mod walk;

pub use decode::decode;
pub use encode::{encode, encode_to_vec, encoded_len};
#[cfg(test)]
use reader::Reader;
pub use value::ValueView;
pub use view::{PayloadView, SeriesIter, SeriesView, decode_view};

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

/// Why [`encode`](fn@encode) failed.
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

/// Why [`decode`](fn@decode) rejected its input.
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

#[cfg(test)]
mod tests {
    use super::encode::Writer;
    use super::*;
    use crate::stats::Payload;

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
