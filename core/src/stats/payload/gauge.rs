//! [`Gauge`]: an exact gauge value.

use core::fmt;

use crate::ratio::{Ratio, gcd};

/// An exact gauge value: `num / den` in lowest terms with `den ≥ 1` (integers have `den = 1`).
///
/// Usage gauges are `num_used / num_chunks`; keeping them as ratios makes aggregation exact and
/// the export the correctly rounded quotient, as Python's `/` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gauge {
    num: i64,
    den: u64,
}

impl Gauge {
    /// Zero.
    pub const ZERO: Gauge = Gauge { num: 0, den: 1 };

    /// An integer value.
    #[must_use]
    pub const fn int(value: i64) -> Self {
        Gauge { num: value, den: 1 }
    }

    /// `num / den` in lowest terms, or `None` when `den` is 0.
    #[must_use]
    pub fn ratio(num: i64, den: u64) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den);
        let num = i64::try_from(i128::from(num) / i128::from(g)).ok()?;
        Some(Gauge { num, den: den / g })
    }

    /// `num / den` when it is already in lowest terms with `den ≥ 1` (the canonical form),
    /// else `None`.
    #[must_use]
    pub fn from_lowest_terms(num: i64, den: u64) -> Option<Self> {
        let lowest = match den {
            0 => false,
            1 => true,
            // Usage fractions have power-of-two pools: a factor in common means `num` is even.
            d if d.is_power_of_two() => num & 1 == 1,
            d => gcd(num.unsigned_abs(), d) == 1,
        };
        lowest.then_some(Gauge { num, den })
    }

    /// `part / whole` as a usage fraction: 0 when `whole` is 0 (as vLLM reports an empty
    /// pool). A reduced numerator above `i64::MAX` saturates (no pool is that large).
    #[must_use]
    pub fn fraction(part: u64, whole: u64) -> Self {
        Ratio::new(part, whole).map_or(Gauge::ZERO, Gauge::from)
    }

    /// The numerator (lowest terms).
    #[must_use]
    pub const fn numerator(self) -> i64 {
        self.num
    }

    /// The denominator (lowest terms, at least 1).
    #[must_use]
    pub const fn denominator(self) -> u64 {
        self.den
    }

    /// The correctly rounded `f64` quotient (for export only).
    #[must_use]
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

impl From<Ratio> for Gauge {
    /// The non-negative gauge of an exact ratio; a numerator above `i64::MAX` saturates (no
    /// pool is that large).
    fn from(r: Ratio) -> Self {
        Gauge {
            num: i64::try_from(r.num()).unwrap_or(i64::MAX),
            den: r.den(),
        }
    }
}

impl fmt::Display for Gauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_terms_are_what_gcd_says() {
        let nums = (-70i64..70).chain([i64::MIN, i64::MIN + 1, i64::MAX, 1 << 40, 3 << 40]);
        let dens = (0u64..70).chain([1 << 14, 1 << 63, 3 << 20, u64::MAX, 65_536 * 3]);
        for n in nums {
            for d in dens.clone() {
                let expected = d != 0 && gcd(n.unsigned_abs(), d) == 1;
                assert_eq!(
                    Gauge::from_lowest_terms(n, d).is_some(),
                    expected,
                    "{n}/{d}"
                );
            }
        }
        assert_eq!(
            Gauge::from_lowest_terms(-37, 16_384),
            Some(Gauge {
                num: -37,
                den: 16_384
            })
        );
        assert_eq!(Gauge::from_lowest_terms(0, 1), Some(Gauge::ZERO));
        assert_eq!(Gauge::from_lowest_terms(0, 2), None);
    }
}
