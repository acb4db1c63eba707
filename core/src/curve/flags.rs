//! Which capacities of a stack pass are certified exact: everything at or above a threshold
//! that only rises, minus ranges marked one by one (a difference array, O(1) per mark).

use alloc::vec::Vec;

use crate::reserve::{AllocError, filled};

/// Capacities `1..=max` and the marks against them.
#[derive(Clone, Debug)]
pub(crate) struct Flags {
    /// Capacities below it are not exact.
    from: u32,
    /// `diff[c]`: ranges starting at `c` minus ranges ending before `c`.
    diff: Vec<i32>,
    max: u32,
}

impl Flags {
    pub(crate) fn new(max: u32) -> Result<Self, AllocError> {
        Ok(Flags {
            from: 1,
            diff: filled(max as usize + 2, 0)?,
            max,
        })
    }

    /// Capacities below `c` are not exact.
    #[inline]
    pub(crate) fn below(&mut self, c: u32) {
        self.from = self.from.max(c.min(self.max + 1));
    }

    /// Capacities `lo..hi` are not exact.
    #[inline]
    pub(crate) fn range(&mut self, lo: u32, hi: u32) {
        let (lo, hi) = (lo.max(1), hi.min(self.max + 1));
        if lo >= hi || hi <= self.from {
            return;
        }
        if lo <= self.from {
            self.below(hi);
            return;
        }
        self.diff[lo as usize] += 1;
        self.diff[hi as usize] -= 1;
    }

    /// Whether each capacity `1..=max` is exact, in order.
    pub(crate) fn each(&self) -> impl Iterator<Item = bool> + '_ {
        let mut open = 0i32;
        (1..=self.max).map(move |c| {
            open += self.diff[c as usize];
            c >= self.from && open == 0
        })
    }
}
