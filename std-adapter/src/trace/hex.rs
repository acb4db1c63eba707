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

/// Marks a byte that is not a lowercase hex digit in [`DIGIT`].
const INVALID: u8 = 0xff;

/// The value of each lowercase hex digit; [`INVALID`] for every other byte.
const DIGIT: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut i: u8 = 0;
    while i < 10 {
        t[(b'0' + i) as usize] = i;
        i += 1;
    }
    let mut j: u8 = 0;
    while j < 6 {
        t[(b'a' + j) as usize] = 10 + j;
        j += 1;
    }
    t
};

/// The lowercase hex digits, by value.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Parses one hash field: exactly 16 lowercase hex digits, the u64 written big-endian.
///
/// # Errors
/// [`HashProblem`] says what is wrong with the field.
#[inline]
pub fn parse_hash(field: &[u8]) -> Result<u64, HashProblem> {
    let Ok(digits) = <&[u8; 16]>::try_from(field) else {
        return Err(HashProblem::WrongLength { len: field.len() });
    };
    let mut value = 0u64;
    let mut bad = 0u8;
    for &b in digits {
        let d = DIGIT[usize::from(b)];
        bad |= d & 0xf0;
        value = (value << 4) | u64::from(d & 0x0f);
    }
    if bad == 0 {
        Ok(value)
    } else if digits.iter().any(|b| !b.is_ascii_hexdigit()) {
        Err(HashProblem::NotHex)
    } else {
        Err(HashProblem::Uppercase)
    }
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
