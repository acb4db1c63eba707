//! Checked integer helpers with the rounding direction in the name.
//!
//! Every helper returns `None` on overflow or a zero divisor; callers turn that into their own
//! typed error. Nothing here can panic.

/// `⌈a / b⌉`, or `None` when `b == 0`.
#[must_use]
pub const fn div_ceil(a: u64, b: u64) -> Option<u64> {
    if b == 0 {
        return None;
    }
    // `a / b + (a % b != 0)` cannot overflow: `a / b < u64::MAX` whenever the remainder is
    // non-zero (b ≥ 2 in that case).
    let q = a / b;
    if a.is_multiple_of(b) {
        Some(q)
    } else {
        Some(q + 1)
    }
}

/// `⌊a / b⌋`, or `None` when `b == 0`.
#[must_use]
pub const fn div_floor(a: u64, b: u64) -> Option<u64> {
    a.checked_div(b)
}

/// The smallest multiple of `align` that is `≥ x` (vLLM's `round_up`), or `None` on a zero
/// alignment or overflow.
#[must_use]
pub const fn round_up(x: u64, align: u64) -> Option<u64> {
    match div_ceil(x, align) {
        Some(q) => q.checked_mul(align),
        None => None,
    }
}

pub use crate::ratio::gcd;

/// Least common multiple, or `None` on overflow; `lcm(0, x) = 0`.
#[must_use]
pub const fn lcm(a: u64, b: u64) -> Option<u64> {
    if a == 0 || b == 0 {
        return Some(0);
    }
    let g = gcd(a, b);
    // g divides a, so a / g is exact.
    (a / g).checked_mul(b)
}

/// `⌊a · b / c⌋` computed in 128 bits, or `None` when `c == 0` or the result exceeds `u64`.
#[must_use]
pub fn mul_div_floor(a: u64, b: u64, c: u64) -> Option<u64> {
    if c == 0 {
        return None;
    }
    // u64 · u64 always fits in u128.
    let wide = u128::from(a) * u128::from(b) / u128::from(c);
    u64::try_from(wide).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_edges() {
        assert_eq!(div_ceil(7, 2), Some(4));
        assert_eq!(div_ceil(8, 2), Some(4));
        assert_eq!(div_ceil(u64::MAX, 2), Some(u64::MAX / 2 + 1));
        assert_eq!(div_ceil(1, 0), None);
        assert_eq!(div_floor(7, 2), Some(3));
        assert_eq!(round_up(4097, 4096), Some(8192));
        assert_eq!(round_up(u64::MAX, 4096), None);
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(lcm(4, 6), Some(12));
        assert_eq!(lcm(u64::MAX, u64::MAX - 1), None);
        assert_eq!(mul_div_floor(u64::MAX, u64::MAX, u64::MAX), Some(u64::MAX));
        assert_eq!(mul_div_floor(u64::MAX, 2, 1), None);
    }
}
