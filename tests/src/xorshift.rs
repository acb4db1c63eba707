//! A reproducible number stream for churn workloads (xorshift64: no RNG crate, the same
//! numbers on every run and target).

/// The xorshift64 stream from `seed` (which must not be 0): each call returns the next number.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
