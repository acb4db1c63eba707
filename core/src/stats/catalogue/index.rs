//! [`StrIndex`]: a perfect hash over a fixed list of strings, built at compile time, so finding
//! a string (or learning it is not in the list) is one fingerprint, one table read and one
//! comparison.

/// A summary of a string that, together with its length, tells apart every string of an indexed
/// list: the last eight bytes; for shorter strings their first and last four bytes (which then
/// cover every byte), or the first, middle and last byte.
const fn fingerprint(b: &[u8]) -> u64 {
    if let Some(tail) = b.last_chunk::<8>() {
        return u64::from_be_bytes(*tail);
    }
    if let (Some(head), Some(tail)) = (b.first_chunk::<4>(), b.last_chunk::<4>()) {
        return ((u32::from_be_bytes(*head) as u64) << 32) | u32::from_be_bytes(*tail) as u64;
    }
    match b {
        [] => 0,
        [first, .., last] => {
            ((*first as u64) << 16) | ((b[b.len() / 2] as u64) << 8) | *last as u64
        }
        [only] => *only as u64,
    }
}

/// The multipliers tried, in order, until one spreads the list without collision.
const fn next_multiplier(m: u64) -> u64 {
    m.wrapping_add(0x9e37_79b9_7f4a_7c15) | 1
}

/// Where a string with fingerprint `fp` and length `len` lands among `2^bits` slots.
#[expect(
    clippy::cast_possible_truncation,
    reason = "below 2^bits, and bits < 16"
)]
const fn slot(fp: u64, len: usize, mul: u64, bits: u32) -> usize {
    (fp.wrapping_add(len as u64).wrapping_mul(mul) >> (64 - bits)) as usize
}

/// Marks an empty slot.
const EMPTY: u8 = u8::MAX;

/// A perfect hash over `keys` with `SLOTS` slots (a power of two, comfortably more than the
/// keys, so a collision-free multiplier is found in a few tries).
#[derive(Debug)]
pub(crate) struct StrIndex<const SLOTS: usize> {
    keys: &'static [&'static str],
    mul: u64,
    /// For each slot: the position in `keys` of the string that lands there (or [`EMPTY`]),
    /// its length and its fingerprint, so most misses and every hit of at most eight bytes are
    /// settled without comparing bytes.
    slots: [(u8, usize, u64); SLOTS],
}

impl<const SLOTS: usize> StrIndex<SLOTS> {
    /// Builds the index (at compile time: a failure is a build error).
    ///
    /// # Panics
    /// When `SLOTS` is not a power of two, `keys` has duplicates or 255 or more entries, or no
    /// multiplier among the first thousand separates the keys (give it more slots).
    #[expect(
        clippy::cast_possible_truncation,
        reason = "fewer than 255 keys, asserted"
    )]
    pub(crate) const fn new(keys: &'static [&'static str]) -> Self {
        assert!(
            SLOTS.is_power_of_two() && SLOTS >= 2 && SLOTS <= 1 << 15,
            "SLOTS must be a power of two below 2^16"
        );
        assert!(keys.len() < EMPTY as usize, "too many keys");
        let bits = SLOTS.trailing_zeros();
        let mut mul = next_multiplier(0);
        let mut attempt = 0;
        while attempt < 1000 {
            let mut slots = [(EMPTY, usize::MAX, 0); SLOTS];
            let mut i = 0;
            let mut clash = false;
            while i < keys.len() && !clash {
                let k = keys[i].as_bytes();
                let fp = fingerprint(k);
                let s = slot(fp, k.len(), mul, bits);
                if slots[s].0 == EMPTY {
                    slots[s] = (i as u8, k.len(), fp);
                } else {
                    clash = true;
                }
                i += 1;
            }
            if !clash {
                return StrIndex { keys, mul, slots };
            }
            mul = next_multiplier(mul);
            attempt += 1;
        }
        panic!("no collision-free multiplier: duplicate keys, or too few slots");
    }

    /// The position of `b` in the keys, if it is one of them.
    #[inline]
    pub(crate) fn find(&self, b: &[u8]) -> Option<usize> {
        let fp = fingerprint(b);
        let &(i, len, key_fp) =
            self.slots
                .get(slot(fp, b.len(), self.mul, SLOTS.trailing_zeros()))?;
        if len != b.len() || key_fp != fp {
            return None;
        }
        let i = usize::from(i);
        // Up to eight bytes, the fingerprint is the whole string.
        (b.len() <= 8 || self.keys.get(i)?.as_bytes() == b).then_some(i)
    }

    /// The key at `i`.
    #[inline]
    pub(crate) fn key(&self, i: usize) -> Option<&'static str> {
        self.keys.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WORDS: [&str; 10] = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "abcdefg",
        "abcdefgh",
        "xbcdefgh",
        "abcdefghi",
        "zzzzzzzzzzzzabcdefgh",
    ];
    static INDEX: StrIndex<32> = StrIndex::new(&WORDS);

    #[test]
    fn finds_every_key_and_nothing_else() {
        for (i, w) in WORDS.iter().enumerate() {
            assert_eq!(INDEX.find(w.as_bytes()), Some(i), "{w:?}");
            assert_eq!(INDEX.key(i), Some(*w));
        }
        // The same length and last eight bytes as a key, but another string.
        let twin = "yyyyyyyyyyyyabcdefgh";
        assert_eq!(
            fingerprint(twin.as_bytes()),
            fingerprint(WORDS[9].as_bytes())
        );
        for other in [
            "b",
            "abce",
            "abcdefgx",
            "abcdefghij",
            "ABCD",
            "abcdefh",
            twin,
        ] {
            assert_eq!(INDEX.find(other.as_bytes()), None, "{other:?}");
        }
        assert_eq!(INDEX.key(WORDS.len()), None);
    }

    #[test]
    fn fingerprints_cover_short_strings_fully() {
        assert_ne!(fingerprint(b"abcdefg"), fingerprint(b"abcxefg"));
        assert_ne!(fingerprint(b"abc"), fingerprint(b"axc"));
        assert_eq!(fingerprint(b"zzabcdefgh"), fingerprint(b"abcdefgh"));
    }
}
