//! [`Ratio`], the one exact rational of the core, and [`gcd`].
//!
//! Max concurrency (`num_blocks / blocks_per_request`), usage gauges (`used / capacity`) and
//! the GPU pool's usage are exact ratios; each is kept as a reduced `num / den` and becomes a
//! float only when it leaves the library ([`Ratio::to_f64`]).

/// Greatest common divisor (`gcd(0, 0) = 0`).
///
/// ```
/// assert_eq!(kvtier_core::ratio::gcd(12, 18), 6);
/// ```
#[must_use]
pub const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// A non-negative rational `num / den` in lowest terms, `den ≥ 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ratio {
    num: u64,
    den: u64,
}

impl Ratio {
    /// Zero (`0 / 1`).
    pub const ZERO: Ratio = Ratio { num: 0, den: 1 };

    /// `num / den` reduced, or `None` when `den = 0`.
    #[must_use]
    pub const fn new(num: u64, den: u64) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den);
        // g ≥ 1 because den ≥ 1.
        Some(Self {
            num: num / g,
            den: den / g,
        })
    }

    /// The numerator.
    #[must_use]
    pub const fn num(&self) -> u64 {
        self.num
    }

    /// The denominator (≥ 1).
    #[must_use]
    pub const fn den(&self) -> u64 {
        self.den
    }

    /// The quotient as an `f64`, for reports and for vLLM's float figures (vLLM computes
    /// `num_blocks / blocks_per_request` with Python's true division). Exact inputs below
    /// 2^53 give the correctly rounded quotient.
    ///
    /// ```
    /// use kvtier_core::ratio::Ratio;
    /// assert_eq!(Ratio::new(3, 2).map(|r| r.to_f64()), Some(1.5));
    /// ```
    #[must_use]
    #[expect(
        clippy::cast_precision_loss,
        reason = "a float view of the exact ratio, as vLLM reports it"
    )]
    pub fn to_f64(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `⌊self · x⌋`, or `None` when it exceeds `u64`.
    #[must_use]
    pub fn mul_floor(&self, x: u64) -> Option<u64> {
        // u64 · u64 always fits in u128; den ≥ 1.
        u64::try_from(u128::from(self.num) * u128::from(x) / u128::from(self.den)).ok()
    }
}

impl core::fmt::Display for Ratio {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.num, self.den)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduced_and_exact() {
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(gcd(0, 0), 0);
        let r = Ratio::new(16_384, 3_206).unwrap();
        assert_eq!((r.num(), r.den()), (8_192, 1_603));
        assert_eq!(Ratio::new(0, 7).map(|r| (r.num(), r.den())), Some((0, 1)));
        assert_eq!(Ratio::new(1, 0), None);
        assert_eq!(r.mul_floor(32_768), Some(167_458));
        assert_eq!(Ratio::new(u64::MAX, 1).unwrap().mul_floor(2), None);
        assert_eq!(alloc::format!("{r}"), "8192/1603");
    }
}
