//! The 16-lowercase-hex-digit form of a block hash.

/// What is wrong with one hash field of an `L` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashProblem {
    /// The field is not 16 characters long (its length in bytes is given).
    WrongLength {
        /// The field's length in bytes.
        len: usize,
    },
    /// The field holds an uppercase hex digit `A`–`F`; kvtrace hashes are lowercase.
    Uppercase,
    /// The field holds a byte that is not a hex digit.
    NotHex,
}

impl core::fmt::Display for HashProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HashProblem::WrongLength { len } => {
                write!(f, "has {len} characters instead of 16")
            }
            HashProblem::Uppercase => f.write_str("has an uppercase hex digit (must be lowercase)"),
            HashProblem::NotHex => f.write_str("has a character that is not a hex digit"),
        }
    }
}

/// The lowercase hex digits, by value.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Parses one hash field: exactly 16 lowercase hex digits, the u64 written big-endian.
///
/// ```
/// use kvtier_cli::trace::{HashProblem, parse_hash};
/// assert_eq!(parse_hash(b"00000000000000ff"), Ok(255));
/// assert_eq!(parse_hash(b"00000000000000FF"), Err(HashProblem::Uppercase));
/// assert_eq!(parse_hash(b"ff"), Err(HashProblem::WrongLength { len: 2 }));
/// ```
///
/// # Errors
/// [`HashProblem`] says what is wrong with the field.
#[inline]
pub fn parse_hash(field: &[u8]) -> Result<u64, HashProblem> {
    let Some((high, low)) = field
        .split_first_chunk::<8>()
        .and_then(|(high, rest)| <&[u8; 8]>::try_from(rest).ok().map(|low| (high, low)))
    else {
        return Err(HashProblem::WrongLength { len: field.len() });
    };
    match (parse_8(high), parse_8(low)) {
        (Some(h), Some(l)) => Ok((u64::from(h) << 32) | u64::from(l)),
        _ if field.iter().any(|b| !b.is_ascii_hexdigit()) => Err(HashProblem::NotHex),
        _ => Err(HashProblem::Uppercase),
    }
}

/// Each byte's high bit.
const HIGH: u64 = 0x8080_8080_8080_8080;
/// One in each byte.
const ONES: u64 = 0x0101_0101_0101_0101;

/// Per byte of `x` (every byte below 0x80), the high bit set when `m < byte < n`
/// (the `hasbetween` of Bit Twiddling Hacks, exact per byte for 7-bit bytes).
#[inline]
const fn between(x: u64, m: u64, n: u64) -> u64 {
    let low7 = x & (ONES * 127);
    ((ONES * (127 + n)).wrapping_sub(low7) & !x & (low7 + ONES * (127 - m))) & HIGH
}

/// Eight lowercase hex digits (the first the most significant) as a u32, a word at a time;
/// `None` if any byte is not a lowercase hex digit.
#[inline]
fn parse_8(digits: &[u8; 8]) -> Option<u32> {
    let x = u64::from_be_bytes(*digits);
    if x & HIGH != 0 {
        return None;
    }
    let digit = between(x, b'0' as u64 - 1, b'9' as u64 + 1);
    let letter = between(x, b'a' as u64 - 1, b'f' as u64 + 1);
    if digit | letter != HIGH {
        return None;
    }
    // '0'..'9' are 0x30..0x39 and 'a'..'f' are 0x61..0x66: the low nibble, plus 9 for letters
    // (bit 6 set).
    let mut v = (x & (ONES * 0x0f)) + 9 * ((x >> 6) & ONES);
    v = (v | (v >> 4)) & 0x00ff_00ff_00ff_00ff;
    v = (v | (v >> 8)) & 0x0000_ffff_0000_ffff;
    v = (v | (v >> 16)) & 0x0000_0000_ffff_ffff;
    u32::try_from(v).ok()
}

/// Writes `value` as 16 lowercase hex digits.
#[inline]
#[must_use]
pub fn format_hash(value: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (pair, byte) in out.chunks_exact_mut(2).zip(value.to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    out
}
