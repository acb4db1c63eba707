//! Intrusive doubly linked lists over `u32` node indices, sharing one link table.
//!
//! Several lists (LRU order, ARC's T1 and T2, the ghost lists) thread through fixed arrays of
//! `prev`/`next` indices sized once. A node is in at most one list of a table at a time. All
//! operations are O(1) and allocate nothing.

use crate::reserve::{AllocError, Lazy, Split};

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

/// The `prev`/`next` links of nodes `0..lo + hi`, stored as two lazily written regions
/// (`0..lo` and `lo..lo + hi`), so that each region touches memory only as far as its nodes
/// are used.
#[derive(Clone, Debug)]
pub(crate) struct Links {
    prev: Split<u32>,
    next: Split<u32>,
}

/// The ends and length of one list threaded through a [`Links`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
}

impl List {
    pub(crate) const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

impl Links {
    /// Links of `n` nodes in one region.
    pub(crate) fn new(n: u32) -> Result<Self, AllocError> {
        Links::split(n, 0)
    }

    /// Links of nodes `0..lo` and `lo..lo + hi`, each region written on demand.
    pub(crate) fn split(lo: u32, hi: u32) -> Result<Self, AllocError> {
        Ok(Links {
            prev: Split::new(lo, hi, NIL)?,
            next: Split::new(lo, hi, NIL)?,
        })
    }

    /// The bytes [`Links::split`] allocates for `nodes` nodes in all.
    pub(crate) fn bytes(nodes: u64) -> u64 {
        Lazy::<u32>::bytes(nodes).saturating_mul(2)
    }

    #[inline]
    pub(crate) fn next(&self, i: u32) -> u32 {
        self.next.get(i)
    }

    #[inline]
    pub(crate) fn prev(&self, i: u32) -> u32 {
        self.prev.get(i)
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.prev.heap_bytes() + self.next.heap_bytes()
    }

    /// Appends unlinked node `i` at the tail of `list`.
    #[inline]
    pub(crate) fn push_back(&mut self, list: &mut List, i: u32) {
        self.prev.set(i, list.tail);
        self.next.set(i, NIL);
        if list.tail == NIL {
            list.head = i;
        } else {
            self.next.set(list.tail, i);
        }
        list.tail = i;
        list.len += 1;
    }

    /// Inserts unlinked node `i` before node `at` of `list` (at the tail when `at` is NIL).
    #[inline]
    pub(crate) fn insert_before(&mut self, list: &mut List, at: u32, i: u32) {
        if at == NIL {
            self.push_back(list, i);
            return;
        }
        let p = self.prev.get(at);
        self.prev.set(i, p);
        self.next.set(i, at);
        self.prev.set(at, i);
        if p == NIL {
            list.head = i;
        } else {
            self.next.set(p, i);
        }
        list.len += 1;
    }

    /// Removes node `i`, which must be linked in `list`.
    #[inline]
    pub(crate) fn unlink(&mut self, list: &mut List, i: u32) {
        let p = self.prev.get(i);
        let n = self.next.get(i);
        if p == NIL {
            list.head = n;
        } else {
            self.next.set(p, n);
        }
        if n == NIL {
            list.tail = p;
        } else {
            self.prev.set(n, p);
        }
        self.prev.set(i, NIL);
        self.next.set(i, NIL);
        list.len -= 1;
    }

    /// Moves node `i`, linked in `list`, to its tail.
    #[inline]
    pub(crate) fn move_to_tail(&mut self, list: &mut List, i: u32) {
        if list.tail != i {
            self.unlink(list, i);
            self.push_back(list, i);
        }
    }

    /// Moves node `i` (linked in `from`) to the tail of another list `to`.
    #[inline]
    pub(crate) fn move_to_back(&mut self, from: &mut List, to: &mut List, i: u32) {
        self.unlink(from, i);
        self.push_back(to, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn collect(l: &Links, list: &List) -> Vec<u32> {
        let mut v = Vec::new();
        let mut i = list.head;
        while i != NIL {
            v.push(i);
            i = l.next(i);
        }
        v
    }

    #[test]
    fn push_insert_unlink_move() {
        let mut l = Links::split(4, 2).unwrap();
        let mut a = List::EMPTY;
        let mut b = List::EMPTY;
        for i in [0, 1, 2] {
            l.push_back(&mut a, i);
        }
        l.insert_before(&mut a, 1, 3);
        l.insert_before(&mut a, 0, 4);
        assert_eq!(collect(&l, &a), [4, 0, 3, 1, 2]);
        l.unlink(&mut a, 4);
        l.unlink(&mut a, 2);
        l.move_to_back(&mut a, &mut b, 3);
        l.insert_before(&mut b, NIL, 5);
        assert_eq!(collect(&l, &a), [0, 1]);
        assert_eq!(collect(&l, &b), [3, 5]);
        assert_eq!((a.len, b.len, a.tail, b.head), (2, 2, 1, 3));
        l.move_to_tail(&mut a, 0);
        assert_eq!(collect(&l, &a), [1, 0]);
        l.move_to_tail(&mut a, 0);
        assert_eq!(collect(&l, &a), [1, 0]);
    }
}
