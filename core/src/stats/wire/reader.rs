//! [`Reader`]: the checked cursor over the input (bytes, varints, texts), and the checks of a
//! text it read.

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

    /// Moves past `count` histogram bounds when the input continues with the encoding of one of
    /// the catalogue's bound lists of that length.
    #[inline(always)]
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
    is_ascii_from(raw, 0) || core::str::from_utf8(raw).is_ok()
}

/// What [`after`] found about a text: whether it follows the one before, and whether it is
/// UTF-8 (and ASCII, which the next text's check can rely on).
#[derive(Clone, Copy, Debug)]
pub(super) struct Checked {
    /// After the previous text in byte order (`str` order), or the first.
    pub(super) ascending: bool,
    /// UTF-8.
    pub(super) utf8: bool,
    /// Every byte below 0x80.
    pub(super) ascii: bool,
}

/// Checks `next` against `prev` (a text before it, checked already; `prev_ascii` when it is
/// ASCII) in one pass: the words they share are compared once, and when `prev` is ASCII they
/// need no ASCII check in `next` either.
#[inline]
pub(super) fn after(prev: Option<&[u8]>, prev_ascii: bool, next: &[u8]) -> Checked {
    let (ascending, shared) = match prev {
        None => (true, 0),
        Some(prev) => {
            let (order, shared) = cmp_words(prev, next);
            (order.is_lt(), if prev_ascii { shared } else { 0 })
        }
    };
    let ascii = is_ascii_from(next, shared);
    Checked {
        ascending,
        utf8: ascii || core::str::from_utf8(next).is_ok(),
        ascii,
    }
}

/// The byte order of `a` and `b`, compared a word at a time, and the number of leading bytes
/// (a multiple of eight) found equal on the way.
#[inline]
pub(super) fn cmp_words(a: &[u8], b: &[u8]) -> (Ordering, usize) {
    let mut shared = 0;
    for (x, y) in a.as_chunks::<8>().0.iter().zip(b.as_chunks::<8>().0) {
        if x != y {
            return (u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y)), shared);
        }
        shared += 8;
    }
    // Fewer than eight bytes left on one side: byte by byte, then by length.
    let (x, y) = (
        a.get(shared..).unwrap_or_default(),
        b.get(shared..).unwrap_or_default(),
    );
    for (p, q) in x.iter().zip(y) {
        if p != q {
            return (p.cmp(q), shared);
        }
    }
    (x.len().cmp(&y.len()), shared)
}

const HIGH: u64 = 0x8080_8080_8080_8080;

/// True when every byte of `raw` from `from` on is below 0x80: the last eight bytes first, then
/// eight at a time from `from` (overlapping the last word, so there is no byte-by-byte tail).
#[inline]
fn is_ascii_from(raw: &[u8], from: usize) -> bool {
    let Some(last) = raw.last_chunk::<8>() else {
        return raw.is_ascii();
    };
    if u64::from_ne_bytes(*last) & HIGH != 0 {
        return false;
    }
    let rest = raw.get(from..).unwrap_or_default();
    rest.as_chunks::<8>()
        .0
        .iter()
        .all(|w| u64::from_ne_bytes(*w) & HIGH == 0)
}

/// `raw` as an owned text: a known label text is borrowed for good (and needs no UTF-8 check),
/// any other is checked and copied.
pub(super) fn to_text(raw: &[u8]) -> Result<Text, DecodeError> {
    match catalogue::known_label_bytes(raw) {
        Some(known) => Ok(Text::Borrowed(known)),
        None => utf8(raw).map(|s| Text::Owned(s.into())),
    }
}

/// `raw` as text.
pub(super) fn utf8(raw: &[u8]) -> Result<&str, DecodeError> {
    core::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_checked_at_every_position() {
        for len in 0..40 {
            let mut bytes = alloc::vec![b'a'; len];
            assert!(is_ascii_from(&bytes, 0), "{len}");
            for at in 0..len {
                bytes[at] = 0xc3;
                assert!(!is_ascii_from(&bytes, 0), "{len} {at}");
                // A check from a later word still sees the last one.
                let from = (at / 8) * 8;
                assert!(!is_ascii_from(&bytes, from), "{len} {at} from {from}");
                bytes[at] = b'a';
            }
        }
        assert!(is_utf8("é-vllm:kv_offload_".as_bytes()));
        assert!(!is_utf8(b"vllm:kv_offload_\xc3"));
    }

    #[test]
    fn words_compare_as_slices_do() {
        let texts: [&[u8]; 12] = [
            b"",
            b"a",
            b"ab",
            b"abcdefgh",
            b"abcdefgh\x00",
            b"abcdefgi",
            b"abcdefghabcdefgh",
            b"abcdefghabcdefgz",
            b"vllm:kv_offload_load_bytes",
            b"vllm:kv_offload_load_size",
            "vllm:é".as_bytes(),
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ];
        for a in texts {
            for b in texts {
                let (order, shared) = cmp_words(a, b);
                assert_eq!(order, a.cmp(b), "{a:?} {b:?}");
                assert_eq!(a.get(..shared), b.get(..shared));
                let checked = after(Some(a), a.is_ascii(), b);
                assert_eq!(checked.ascending, a < b);
                assert_eq!(checked.utf8, core::str::from_utf8(b).is_ok(), "{b:?}");
                assert_eq!(checked.ascii, b.is_ascii(), "{b:?}");
            }
        }
    }
}
