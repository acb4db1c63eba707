//! Sizes as the options give them: bytes, or a number and a unit ([`parse_size_floor`]).

use std::fmt;

/// Why [`parse_size_floor`] refused a size; each message quotes the text.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    /// The size starts with `-`.
    Negative(String),
    /// A plain number in exponent notation (`1e3`).
    Exponent(String),
    /// The size passes 2^64 bytes.
    TooLarge(String),
    /// The unit is none of the known ones.
    UnknownUnit {
        /// The unit, lower-cased.
        unit: String,
        /// The whole size.
        text: String,
    },
    /// The number is malformed.
    NotASize(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Negative(t) => {
                write!(
                    f,
                    "\"{t}\" is negative: a size is a byte count of 0 or more"
                )
            }
            SizeError::Exponent(t) => write!(
                f,
                "\"{t}\" is not an integer byte count: exponent notation is not accepted \
                 (write bytes, or a number with a unit such as 70GiB)"
            ),
            SizeError::TooLarge(t) => {
                write!(
                    f,
                    "\"{t}\" is too large: exceeds 2^64 bytes (sizes are 64 bits)"
                )
            }
            SizeError::UnknownUnit { unit, text } => {
                write!(f, "unknown unit \"{unit}\" in \"{text}\"")
            }
            SizeError::NotASize(t) => write!(f, "\"{t}\" is not a size"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a size: bytes, or a number (with an optional decimal fraction) and a unit: `B`,
/// `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB` (powers of 1000), `KiB`, `MiB`, `GiB`, `TiB`
/// (powers of 1024). Fractions are floored to whole bytes.
///
/// # Errors
/// [`SizeError`] saying what is wrong: a negative size, exponent notation (too large when it
/// exceeds 2^64 bytes), an unknown unit, a malformed number, or a size past 64 bits.
pub fn parse_size_floor(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(SizeError::Negative(t.to_owned()));
    }
    if let Some(f) = exponent_number(t) {
        return Err(if f >= TWO_POW_64 {
            SizeError::TooLarge(t.to_owned())
        } else {
            SizeError::Exponent(t.to_owned())
        });
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        other => {
            return Err(SizeError::UnknownUnit {
                unit: other.to_owned(),
                text: t.to_owned(),
            });
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 18 || int.len() > 20
    {
        return Err(SizeError::NotASize(t.to_owned()));
    }
    let parse = |s: &str| {
        if s.is_empty() {
            Ok(0u128)
        } else {
            s.parse::<u128>()
                .map_err(|_| SizeError::NotASize(t.to_owned()))
        }
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).unwrap_or(0));
    let whole = parse(int)?.checked_mul(mult);
    let part = parse(frac)?.checked_mul(mult).map(|p| p / scale);
    whole
        .zip(part)
        .and_then(|(w, p)| w.checked_add(p))
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| SizeError::TooLarge(t.to_owned()))
}

/// 2^64 as an `f64` (exact).
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// The value of a plain number written with an exponent (`1e30`, `2.5E9`), else `None`.
fn exponent_number(t: &str) -> Option<f64> {
    let (mantissa, exponent) = t.split_once(['e', 'E'])?;
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.');
    let exponent_ok = exponent
        .strip_prefix(['+', '-'])
        .unwrap_or(exponent)
        .chars()
        .all(|c| c.is_ascii_digit());
    if !digits(mantissa) || !exponent_ok || exponent.trim_start_matches(['+', '-']).is_empty() {
        return None;
    }
    // Digits and one exponent parse; an exponent past f64 gives infinity ("too large").
    t.parse::<f64>().ok()
}
