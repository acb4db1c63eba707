//! The LRU stack as time stamps: each key on the stack holds one stamp (the stamp names the
//! key by its caller's handle, a small index), a Fenwick tree counts
//! the stamps in use, and a key's stack position is one more than the count of stamps after
//! its own. Stamps are given in increasing order; when they run out they are renumbered
//! `1..=live` in order (compaction), dropping the keys a caller says it no longer needs.

use alloc::vec::Vec;

use super::fenwick::Fenwick;
use crate::reserve::{AllocError, filled};

/// Time stamps `1..=len` over key handles.
#[derive(Clone, Debug)]
pub(crate) struct Stamps {
    fen: Fenwick,
    /// The handle holding each stamp (index `ts`), valid where `held` is set.
    holder: Vec<u32>,
    held: Vec<bool>,
    /// The next stamp to give.
    clock: usize,
    /// Stamps in use.
    live: u32,
}

impl Stamps {
    /// `len` stamps, none in use.
    pub(crate) fn new(len: usize) -> Result<Self, AllocError> {
        Ok(Stamps {
            fen: Fenwick::new(len)?,
            holder: filled(len + 1, 0)?,
            held: filled(len + 1, false)?,
            clock: 1,
            live: 0,
        })
    }

    /// The bytes of the arrays.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.holder.capacity() * 4 + self.held.capacity() + (self.fen.len() + 1) * 4
    }

    /// Keys on the stack.
    pub(crate) const fn live(&self) -> u32 {
        self.live
    }

    /// Stamps left before a [`compact`](Self::compact) is needed.
    pub(crate) fn remaining(&self) -> usize {
        (self.fen.len() + 1).saturating_sub(self.clock)
    }

    /// Stamps in all.
    pub(crate) fn capacity(&self) -> usize {
        self.fen.len()
    }

    /// The 1-based stack position of stamp `ts` (in use).
    #[inline]
    pub(crate) fn position(&self, ts: u32) -> u32 {
        self.live - self.fen.prefix(ts as usize) + 1
    }

    /// Stamps in use at or after `ts`.
    pub(crate) fn at_or_after(&self, ts: u32) -> u32 {
        self.live - self.fen.prefix((ts as usize).saturating_sub(1))
    }

    /// The next stamp, for handle `h`, releasing `old` (0: none). There are
    /// [`remaining`](Self::remaining) stamps.
    #[inline]
    pub(crate) fn give(&mut self, h: u32, old: u32) -> u32 {
        let ts = self.take(h, old);
        self.fen.inc(ts as usize);
        ts
    }

    /// Gives the next stamps to handles one [`take`](Self::take) at a time, counting them in the
    /// tree once at the end (one range update instead of one per stamp): no position may be
    /// asked for in between.
    #[inline]
    pub(crate) fn run(&mut self, give: impl FnOnce(&mut Self)) {
        let first = self.clock;
        give(self);
        if self.clock > first {
            self.fen.inc_range(first, self.clock - 1);
        }
    }

    /// [`give`](Self::give) without counting the new stamp in the tree (inside
    /// [`run`](Self::run) only).
    #[inline]
    pub(crate) fn take(&mut self, h: u32, old: u32) -> u32 {
        if old != 0 {
            self.fen.dec(old as usize);
            self.held[old as usize] = false;
            self.live -= 1;
        }
        let ts = self.clock;
        self.held[ts] = true;
        self.holder[ts] = h;
        self.live += 1;
        self.clock += 1;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "stamps are u32 (new checks)"
        )]
        {
            ts as u32
        }
    }

    /// The stamp after the last one given (a lower bound of every later stamp).
    #[expect(
        clippy::cast_possible_truncation,
        reason = "stamps are u32 (new checks)"
    )]
    pub(crate) const fn next(&self) -> u32 {
        self.clock as u32
    }

    /// Renumbers the stamps in use `1..=live`, oldest first. `keep(h, depth, new)` (depth:
    /// the handle's stack position) gives the handle its new stamp and returns whether it
    /// stays; a handle dropped loses its stamp. `marks`, sorted, are old stamps the caller
    /// remembers: each becomes the new stamp of the first key kept at or after it.
    pub(crate) fn compact(
        &mut self,
        mut keep: impl FnMut(u32, u32, u32) -> bool,
        marks: &mut [u32],
    ) {
        let mut next = 0u32;
        let mut depth = self.live;
        let mut m = 0;
        for ts in 1..self.clock {
            while m < marks.len() && marks[m] as usize <= ts {
                marks[m] = next + 1;
                m += 1;
            }
            if !self.held[ts] {
                continue;
            }
            self.held[ts] = false;
            let h = self.holder[ts];
            if keep(h, depth, next + 1) {
                next += 1;
                self.holder[next as usize] = h;
            }
            depth -= 1;
        }
        for mark in &mut marks[m..] {
            *mark = next + 1;
        }
        for ts in 1..=next as usize {
            self.held[ts] = true;
        }
        self.live = next;
        self.clock = next as usize + 1;
        let held = &self.held;
        self.fen.rebuild((1..held.len()).map(|i| held[i]));
    }
}
