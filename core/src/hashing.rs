//! The deterministic hasher used by every hash map in the core.
//!
//! hashbrown's default hasher is randomly seeded; kvtier must give the same outputs for the same
//! inputs on every run and every target, so every map uses [`FixedState`]. Iteration order of a
//! map never decides an eviction or an encoding: the maps are lookup structures only.

use core::hash::{BuildHasher, Hasher};

/// A [`BuildHasher`] with a fixed, caller-chosen seed (0 by default).
///
/// The hash is a multiply-rotate mix in the style of FxHash, finished with a folded multiply so
/// that hashbrown's control bytes (the top 7 bits) are well distributed even for small integer
/// keys. It is fast, not HashDoS-resistant: a process that hashes untrusted keys and fears
/// adversarial collisions should choose a secret seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedState {
    /// The seed mixed into every hash.
    pub seed: u64,
}

impl FixedState {
    /// A builder with the given seed.
    #[must_use]
    pub const fn with_seed(seed: u64) -> Self {
        FixedState { seed }
    }
}

impl BuildHasher for FixedState {
    type Hasher = FixedHasher;

    fn build_hasher(&self) -> FixedHasher {
        FixedHasher { state: self.seed }
    }
}

/// The hasher built by [`FixedState`].
#[derive(Clone, Copy, Debug)]
pub struct FixedHasher {
    state: u64,
}

const K: u64 = 0xf135_7aea_2e62_a9c5;
/// The finishing multiplier (the fractional part of π, odd).
const FOLD: u64 = 0x243f_6a88_85a3_08d3;

impl FixedHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(26) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FixedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // A folded multiply (the full 128-bit product, its halves xored): every bit of the
        // state reaches the top bits hashbrown uses as tags and the low bits tables index by,
        // in one multiplication.
        let full = u128::from(self.state) * u128::from(FOLD);
        #[expect(clippy::cast_possible_truncation, reason = "the product's two halves")]
        let (lo, hi) = (full as u64, (full >> 64) as u64);
        lo ^ hi
    }
}

/// A hashbrown map with the deterministic hasher.
pub type Map<K, V> = hashbrown::HashMap<K, V, FixedState>;

/// A hashbrown set with the deterministic hasher.
pub type Set<K> = hashbrown::HashSet<K, FixedState>;

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::Hash;

    fn h<T: Hash>(s: FixedState, v: T) -> u64 {
        s.hash_one(v)
    }

    /// Golden values, computed outside Rust from the algorithm as documented (multiply-rotate
    /// per word, a length prefix for slices, a folded multiply at the end). They pin the hash
    /// across releases and targets: a map's layout, and so its speed, must not change silently.
    #[test]
    fn golden_values() {
        let a = FixedState::default();
        assert_eq!(h(a, 42u64), 0x3599_abc8_339e_2e01);
        assert_eq!(h(a, 43u64), 0x9112_d536_cd2c_0c37);
        assert_eq!(h(FixedState::with_seed(1), 42u64), 0xbc35_7cfb_9e38_c35d);
        // Slices hash their length first; the trailing partial word carries its length.
        assert_eq!(h(a, [0u8; 3].as_slice()), 0xa497_5d96_a687_93c5);
        assert_eq!(h(a, [0u8; 4].as_slice()), 0x69d7_2ef4_2e20_d6a5);
        assert_eq!(h(a, b"kvtier-block".as_slice()), 0x36c8_8c24_02f3_4163);
        // A block key hashes as one word: hash ^ group.rotate_right(7).
        assert_eq!(h(a, crate::BlockKey::new(0xabc, 3)), 0x87f3_1301_ab40_e7f6);
    }
}
