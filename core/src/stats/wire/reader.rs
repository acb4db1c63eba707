//! [`Reader`]: the checked cursor over the input (bytes, varints, texts) and [`Lent`], a text
//! it read.

use core::cmp::Ordering;

use super::{DecodeError, Limit, fixed};
use crate::stats::catalogue;
use crate::stats::payload::Text;

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub(super) fn byte(&mut self) -> Result<u8, DecodeError> {
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
        self.varint_tail(b)
    }

    /// The rest of a varint whose first byte `first` has the continuation bit set.
    fn varint_tail(&mut self, first: u8) -> Result<u64, DecodeError> {
        let mut v = u64::from(first & 0x7f);
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

    /// Moves past `n` varints, checking each; a run of single-byte ones (always canonical) is
    /// passed eight bytes at a time.
    #[inline]
    pub(super) fn skip_varints(&mut self, mut n: usize) -> Result<(), DecodeError> {
        while n >= 8 {
            let eight = self.buf.get(self.pos..).and_then(<[u8]>::first_chunk::<8>);
            match eight {
                Some(eight) if u64::from_le_bytes(*eight) & 0x8080_8080_8080_8080 == 0 => {
                    self.pos += 8;
                    n -= 8;
                }
                _ => break,
            }
        }
        for _ in 0..n {
            self.varint()?;
        }
        Ok(())
    }

    /// A varint that must be at most `max`.
    #[inline]
    pub(super) fn count(&mut self, max: usize, limit: Limit) -> Result<usize, DecodeError> {
        let v = self.varint()?;
        usize::try_from(v)
            .ok()
            .filter(|n| *n <= max)
            .ok_or(DecodeError::LimitExceeded(limit))
    }

    /// A length-prefixed byte string of at most `max` bytes.
    #[inline]
    pub(super) fn raw_text(&mut self, max: usize, limit: Limit) -> Result<&'a [u8], DecodeError> {
        let len = self.count(max, limit)?;
        let end = self.pos.checked_add(len).ok_or(DecodeError::Truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    /// A length-prefixed text of at most `max` bytes: a known label text needs no UTF-8 check.
    #[inline]
    pub(super) fn text(&mut self, max: usize, limit: Limit) -> Result<Lent<'a>, DecodeError> {
        lend(self.raw_text(max, limit)?)
    }

    /// Moves past `count` histogram bounds when the input continues with the encoding of one of
    /// the catalogue's bound lists of that length.
    #[inline]
    pub(super) fn skip_known_bounds(&mut self, count: usize) -> bool {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        match fixed::known_prefix(rest, count) {
            Some(len) => {
                self.pos += len;
                true
            }
            None => false,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
}

/// True when `raw` is UTF-8 (checked as ASCII first, word by word).
#[inline]
pub(super) fn is_utf8(raw: &[u8]) -> bool {
    is_ascii(raw) || core::str::from_utf8(raw).is_ok()
}

/// True when every byte of `raw` is below 0x80: eight bytes at a time, the last word
/// overlapping the one before, so there is no byte-by-byte tail.
#[inline]
fn is_ascii(raw: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let Some(last) = raw.last_chunk::<8>() else {
        return raw.is_ascii();
    };
    let mut any = u64::from_ne_bytes(*last);
    let mut rest = raw;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        any |= u64::from_ne_bytes(*word);
        rest = tail;
    }
    any & HIGH == 0
}

/// `raw` as a [`Lent`] text: known, or checked as UTF-8.
#[inline]
pub(super) fn lend(raw: &[u8]) -> Result<Lent<'_>, DecodeError> {
    match catalogue::known_label_bytes(raw) {
        Some(known) => Ok(Lent::Known(known)),
        None => utf8(raw).map(Lent::Input),
    }
}

/// `raw` as text.
pub(super) fn utf8(raw: &[u8]) -> Result<&str, DecodeError> {
    core::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8)
}

/// A text read from the input: one of the catalogue's known texts (borrowed for good) or
/// validated and lent from the input. Compared by its characters only.
#[derive(Clone, Copy, Debug)]
pub(super) enum Lent<'a> {
    /// A known label text.
    Known(&'static str),
    /// Any other text.
    Input(&'a str),
}

impl<'a> Lent<'a> {
    #[inline]
    pub(super) const fn as_str(self) -> &'a str {
        match self {
            Lent::Known(s) => s,
            Lent::Input(s) => s,
        }
    }

    /// The owned form: borrowed when known, else a copy.
    pub(super) fn to_text(self) -> Text {
        match self {
            Lent::Known(s) => Text::Borrowed(s),
            Lent::Input(s) => Text::Owned(s.into()),
        }
    }
}

impl PartialEq for Lent<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Lent<'_> {}

impl PartialOrd for Lent<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Lent<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_checked_at_every_position() {
        for len in 0..40 {
            let mut bytes = alloc::vec![b'a'; len];
            assert!(is_ascii(&bytes), "{len}");
            for at in 0..len {
                bytes[at] = 0xc3;
                assert!(!is_ascii(&bytes), "{len} {at}");
                bytes[at] = b'a';
            }
        }
        assert!(is_utf8("é-vllm:kv_offload_".as_bytes()));
        assert!(!is_utf8(b"vllm:kv_offload_\xc3"));
    }
}
