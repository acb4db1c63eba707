//! SplitMix64: the small, fixed pseudo-random generator behind the built-in workload.
//!
//! The generator's output must never change with a dependency upgrade, so kvtier carries its own
//! PRNG instead of using the `rand` crate. SplitMix64 (Steele, Lea and Flood, 2014; the seeding
//! generator of the xoshiro family) keeps one `u64` of state, adds the golden-ratio increment
//! `0x9e37_79b9_7f4a_7c15` per step and passes the state through a 64-bit finaliser. Its period is
//! 2^64 and it passes BigCrush, far more than a synthetic workload needs.

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 finaliser: a bijective avalanche of one `u64`.
///
/// Also used on its own as a stateless hash (e.g. to derive a shared prefix's block hashes from
/// its index, so prefixes need no storage).
#[must_use]
#[inline]
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 generator. Same seed, same sequence, on every target and every release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first state is `seed`.
    #[must_use]
    pub(crate) const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A value uniform in `0..n` (0 when `n` is 0), by Lemire's multiply-shift (the bias is below
    /// `n / 2^64`, negligible for a workload).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(n);
        (wide >> 64) as u64
    }

    /// 53 random bits, uniform in `0..2^53` (the resolution of a probability threshold).
    #[inline]
    pub(crate) fn next_53(&mut self) -> u64 {
        self.next_u64() >> 11
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        assert!(a.below(10) < 10);
    }

    #[test]
    fn splitmix64_reference_vectors() {
        // The published SplitMix64 outputs for seed 0 (Steele, Lea and Flood; Vigna's reference C).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
        let mut rng = SplitMix64::new(99);
        for n in [1, 2, 3, 10, 1000] {
            assert!((0..100).all(|_| rng.below(n) < n));
        }
        assert_eq!(rng.below(0), 0);
    }
}
