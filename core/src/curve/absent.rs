//! The keys an open request met absent, by floor: below its floor such a key holds no slot
//! until its store begins, so a key at stack position `p` is resident at capacity `c` iff
//! `p ≤ c + absent(c)`, `absent(c)` the keys with a floor above `c`. Floors held by two keys
//! or more are *dips*: there `c + absent(c)` falls as `c` grows (see the [module docs](super)).

use alloc::vec::Vec;

use super::fenwick::Fenwick;
use crate::reserve::{AllocError, filled};

/// Absent keys by floor `1..=max`, floors past `max` counted in one bucket (`max + 1`).
#[derive(Clone, Debug)]
pub(crate) struct Absent {
    fen: Fenwick,
    total: u32,
    /// Per floor, the absent keys.
    at: Vec<u32>,
    /// The floors held by two keys or more, in no order.
    dips: Vec<u32>,
    /// Per floor, its index in `dips` plus one (0: not a dip).
    dip_ix: Vec<u32>,
    max: u32,
}

impl Absent {
    /// No absent key, floors up to `max`.
    pub(crate) fn new(max: u32) -> Result<Self, AllocError> {
        let n = max as usize + 2;
        Ok(Absent {
            fen: Fenwick::new(n - 1)?,
            total: 0,
            at: filled(n, 0)?,
            dips: Vec::new(),
            dip_ix: filled(n, 0)?,
            max,
        })
    }

    /// Absent keys in all.
    pub(crate) const fn total(&self) -> u32 {
        self.total
    }

    /// The floors held twice or more, each with the keys holding it.
    pub(crate) fn dips(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.dips.iter().map(|&d| (d, self.at[d as usize]))
    }

    /// The smallest capacity at which stack position `pos` is resident, `None` past `max`.
    #[inline]
    pub(crate) fn resident_from(&self, pos: u32) -> Option<u32> {
        let target = i64::from(pos) - i64::from(self.total);
        match self.fen.first_gap(target) {
            #[expect(clippy::cast_possible_truncation, reason = "within max + 1")]
            Some(c) if c <= self.max as usize => Some(c as u32),
            _ => None,
        }
    }

    /// A key absent below `floor` (`≥ 1`).
    pub(crate) fn add(&mut self, floor: u32) {
        let b = floor.min(self.max + 1) as usize;
        self.fen.inc(b);
        self.total += 1;
        if b <= self.max as usize {
            self.at[b] += 1;
            if self.at[b] == 2 {
                self.dip_ix[b] = u32::try_from(self.dips.len() + 1).unwrap_or(u32::MAX);
                self.dips.push(floor);
            }
        }
    }

    /// A key absent below `floor` no more (it was added).
    pub(crate) fn remove(&mut self, floor: u32) {
        let b = floor.min(self.max + 1) as usize;
        self.fen.dec(b);
        self.total -= 1;
        if b <= self.max as usize {
            self.at[b] -= 1;
            if self.at[b] == 1 {
                let i = self.dip_ix[b] as usize - 1;
                self.dips.swap_remove(i);
                if let Some(&moved) = self.dips.get(i) {
                    self.dip_ix[moved as usize] = self.dip_ix[b];
                }
                self.dip_ix[b] = 0;
            }
        }
    }

    /// The bytes of the arrays.
    pub(crate) fn heap_bytes(&self) -> usize {
        (self.fen.len() + 1) * 4 + (self.at.capacity() + self.dip_ix.capacity()) * 4
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::Absent;

    #[test]
    fn dips_and_residency_follow_a_plain_count() {
        let max = 20u32;
        let mut a = Absent::new(max).unwrap();
        let mut plain = [0u32; 23];
        let ops: [(bool, u32); 12] = [
            (true, 5),
            (true, 5),
            (true, 9),
            (true, 30),
            (true, 9),
            (true, 5),
            (false, 5),
            (false, 9),
            (true, 2),
            (false, 5),
            (true, 9),
            (false, 30),
        ];
        for (add, f) in ops {
            let b = f.min(max + 1) as usize;
            if add {
                a.add(f);
                plain[b] += 1;
            } else {
                a.remove(f);
                plain[b] -= 1;
            }
            let mut dips: Vec<(u32, u32)> = a.dips().collect();
            dips.sort_unstable();
            let want: Vec<(u32, u32)> = (1..=max)
                .filter(|&c| plain[c as usize] >= 2)
                .map(|c| (c, plain[c as usize]))
                .collect();
            assert_eq!(dips, want);
            assert_eq!(a.total(), plain.iter().sum::<u32>());
            // Past a dip residency is not monotone in the capacity (those capacities are
            // marked): the search is exact only without one.
            for pos in (1..30u32).filter(|_| want.is_empty()) {
                // Resident at c iff pos <= c + (keys with a floor above c).
                let above = |c: u32| plain[c as usize + 1..].iter().sum::<u32>();
                let want = (1..=max).find(|&c| pos <= c + above(c));
                assert_eq!(a.resident_from(pos), want, "pos {pos}");
            }
        }
    }
}
