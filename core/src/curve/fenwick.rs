//! A Fenwick (binary indexed) tree of counts over `1..=len`: point updates, prefix sums and
//! the search for the `k`-th set position, each in `O(log len)`.

use alloc::vec::Vec;

use crate::reserve::{AllocError, filled};

/// Counts over positions `1..=len`.
#[derive(Clone, Debug)]
pub(crate) struct Fenwick {
    tree: Vec<u32>,
    /// The largest power of two not above `len` (0 when empty): the search's first step.
    top: usize,
}

impl Fenwick {
    /// All counts zero over `1..=len`.
    pub(crate) fn new(len: usize) -> Result<Self, AllocError> {
        let top = if len == 0 { 0 } else { 1 << len.ilog2() };
        Ok(Fenwick {
            tree: filled(len + 1, 0)?,
            top,
        })
    }

    /// The positions the tree covers.
    pub(crate) fn len(&self) -> usize {
        self.tree.len() - 1
    }

    /// Adds one at `i` (`1 ≤ i ≤ len`).
    #[inline]
    pub(crate) fn inc(&mut self, mut i: usize) {
        while i < self.tree.len() {
            self.tree[i] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// Adds one at every position of `a..=b` (`1 ≤ a ≤ b ≤ len`), in `O(b − a + log len)`:
    /// a node inside the range gains the positions of its span that lie in the range, and a
    /// node past `b` that spans part of the range spans `b` too, so it is on `b`'s update path.
    pub(crate) fn inc_range(&mut self, a: usize, b: usize) {
        #[expect(clippy::cast_possible_truncation, reason = "at most len, a u32 count")]
        for i in a..=b {
            let lo = i - (i & i.wrapping_neg());
            self.tree[i] += (i - lo.max(a - 1)) as u32;
        }
        let mut j = b + (b & b.wrapping_neg());
        #[expect(clippy::cast_possible_truncation, reason = "at most len, a u32 count")]
        while j < self.tree.len() {
            let lo = j - (j & j.wrapping_neg());
            self.tree[j] += (b - lo.max(a - 1)) as u32;
            j += j & j.wrapping_neg();
        }
    }

    /// Takes one from `i`, which holds at least one.
    #[inline]
    pub(crate) fn dec(&mut self, mut i: usize) {
        while i < self.tree.len() {
            self.tree[i] -= 1;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over `1..=i`.
    #[inline]
    pub(crate) fn prefix(&self, mut i: usize) -> u32 {
        let mut s = 0;
        while i > 0 {
            s += self.tree[i];
            i &= i - 1;
        }
        s
    }

    /// The smallest `c` in `1..=len` with `c − prefix(c) ≥ target`, assuming `c − prefix(c)`
    /// does not decrease (no position holds more than one); `None` when no `c` does.
    pub(crate) fn first_gap(&self, target: i64) -> Option<usize> {
        let (mut at, mut acc) = (0usize, 0i64);
        let mut step = self.top;
        while step > 0 {
            let next = at + step;
            if next < self.tree.len() {
                let h = next as i64 - (acc + i64::from(self.tree[next]));
                if h < target {
                    at = next;
                    acc += i64::from(self.tree[next]);
                }
            }
            step >>= 1;
        }
        (at < self.len()).then_some(at + 1)
    }

    /// Sets every count from `ones`: position `i + 1` holds `ones[i]` (0 or 1), in `O(len)`.
    pub(crate) fn rebuild(&mut self, ones: impl Iterator<Item = bool>) {
        self.tree.iter_mut().for_each(|t| *t = 0);
        for (i, one) in (1..self.tree.len()).zip(ones) {
            self.tree[i] += u32::from(one);
        }
        for i in 1..self.tree.len() {
            let j = i + (i & i.wrapping_neg());
            if j < self.tree.len() {
                self.tree[j] += self.tree[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fenwick;

    #[test]
    fn prefix_and_find_agree_with_a_plain_array() {
        let mut f = Fenwick::new(37).unwrap();
        let mut plain = [0u32; 38];
        for i in [3usize, 7, 8, 20, 37, 1, 7, 9] {
            f.inc(i);
            plain[i] += 1;
        }
        f.dec(7);
        plain[7] -= 1;
        for i in 0..=37 {
            assert_eq!(f.prefix(i), plain[..=i].iter().sum::<u32>());
        }
        for target in -3i64..40 {
            let want = (1..=37usize).find(|&c| c as i64 - i64::from(f.prefix(c)) >= target);
            if (1..=37usize).all(|c| plain[c] <= 1) {
                assert_eq!(f.first_gap(target), want, "target {target}");
            }
        }
        for (a, b) in [
            (1usize, 1usize),
            (1, 37),
            (5, 12),
            (8, 8),
            (9, 16),
            (17, 37),
            (30, 36),
        ] {
            let mut r = f.clone();
            let mut p = plain;
            r.inc_range(a, b);
            p[a..=b].iter_mut().for_each(|x| *x += 1);
            for i in 0..=37 {
                assert_eq!(
                    r.prefix(i),
                    p[..=i].iter().sum::<u32>(),
                    "range {a}..={b}, {i}"
                );
            }
        }
        let mut g = Fenwick::new(37).unwrap();
        g.rebuild((1..=37).map(|i| plain[i] > 0));
        for i in 0..=37 {
            assert_eq!(g.prefix(i), f.prefix(i));
        }
    }
}
