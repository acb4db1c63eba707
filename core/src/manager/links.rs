//! Intrusive doubly linked lists over `u32` node indices, sharing one node table.
//!
//! Several lists (LRU order, ARC's T1 and T2, the ghost lists) thread through one fixed array
//! of nodes sized once. Each node holds its `prev`/`next` links next to a small payload `P` of
//! its owner's (the LRU's rank, the reuse tracker's count), so that one node access touches one place in
//! memory. A node is in at most one list of a table at a time. All operations are O(1) and
//! allocate nothing; the table is written lazily, as far as its nodes are used.

use crate::reserve::{AllocError, Lazy};

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

/// One node: its links and its owner's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node<P> {
    prev: u32,
    next: u32,
    data: P,
}

/// The nodes `0..n` of one or more lists, each with a payload `P` (its `Default` until set).
#[derive(Clone, Debug)]
pub(crate) struct Links<P: Copy + Default = ()> {
    nodes: Lazy<Node<P>>,
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

impl<P: Copy + Default> Links<P> {
    /// Nodes `0..n`, unlinked, with default payloads.
    pub(crate) fn new(n: u32) -> Result<Self, AllocError> {
        let fill = Node {
            prev: NIL,
            next: NIL,
            data: P::default(),
        };
        Ok(Links {
            nodes: Lazy::new(n as usize, fill)?,
        })
    }

    /// The bytes [`Links::new`] allocates for `n` nodes.
    pub(crate) const fn bytes(n: u64) -> u64 {
        Lazy::<Node<P>>::bytes(n)
    }

    #[inline(always)]
    pub(crate) fn next(&self, i: u32) -> u32 {
        self.nodes.get(i as usize).next
    }

    #[inline(always)]
    pub(crate) fn prev(&self, i: u32) -> u32 {
        self.nodes.get(i as usize).prev
    }

    /// Node `i`'s payload.
    #[inline(always)]
    pub(crate) fn data(&self, i: u32) -> P {
        self.nodes.get(i as usize).data
    }

    /// Sets node `i`'s payload (ignored out of range).
    #[inline(always)]
    pub(crate) fn set_data(&mut self, i: u32, data: P) {
        if let Some(n) = self.nodes.slot(i as usize) {
            n.data = data;
        }
    }

    #[inline(always)]
    fn set_prev(&mut self, i: u32, prev: u32) {
        if let Some(n) = self.nodes.slot(i as usize) {
            n.prev = prev;
        }
    }

    #[inline(always)]
    fn set_next(&mut self, i: u32, next: u32) {
        if let Some(n) = self.nodes.slot(i as usize) {
            n.next = next;
        }
    }

    #[inline(always)]
    fn set_links(&mut self, i: u32, prev: u32, next: u32) {
        if let Some(n) = self.nodes.slot(i as usize) {
            n.prev = prev;
            n.next = next;
        }
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.nodes.heap_bytes()
    }

    /// Appends unlinked node `i` at the tail of `list`.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, list: &mut List, i: u32) {
        self.set_links(i, list.tail, NIL);
        if list.tail == NIL {
            list.head = i;
        } else {
            self.set_next(list.tail, i);
        }
        list.tail = i;
        list.len += 1;
    }

    /// Inserts unlinked node `i` before node `at` of `list` (at the tail when `at` is NIL).
    #[inline(always)]
    pub(crate) fn insert_before(&mut self, list: &mut List, at: u32, i: u32) {
        if at == NIL {
            self.push_back(list, i);
            return;
        }
        let p = self.prev(at);
        self.set_links(i, p, at);
        self.set_prev(at, i);
        if p == NIL {
            list.head = i;
        } else {
            self.set_next(p, i);
        }
        list.len += 1;
    }

    /// Removes node `i`, which must be linked in `list`.
    #[inline(always)]
    pub(crate) fn unlink(&mut self, list: &mut List, i: u32) {
        self.bridge(list, i, i);
        self.set_links(i, NIL, NIL);
        list.len -= 1;
    }

    /// Links the neighbours of the linked run `first..=last` of `list` to each other (the run's
    /// own links are left as they are).
    #[inline(always)]
    fn bridge(&mut self, list: &mut List, first: u32, last: u32) {
        let (p, n) = (self.prev(first), self.next(last));
        if p == NIL {
            list.head = n;
        } else {
            self.set_next(p, n);
        }
        if n == NIL {
            list.tail = p;
        } else {
            self.set_prev(n, p);
        }
    }

    /// Moves the linked run `first..=last` of `list` (in list order) to its tail, keeping the
    /// run's order.
    pub(crate) fn move_run_to_tail(&mut self, list: &mut List, first: u32, last: u32) {
        if list.tail == last {
            return;
        }
        let (p, n) = (self.prev(first), self.next(last));
        // `last` is not the tail, so `n` is a node; the tail is outside the run.
        if p == NIL {
            list.head = n;
        } else {
            self.set_next(p, n);
        }
        self.set_prev(n, p);
        let tail = list.tail;
        self.set_next(tail, first);
        self.set_prev(first, tail);
        self.set_next(last, NIL);
        list.tail = last;
    }

    /// Takes the linked run `first..=last` (`n` nodes) out of `list`. The run keeps its inner
    /// links (and stale outer ones) for [`append_run`](Self::append_run) or
    /// [`append_run_reversed`](Self::append_run_reversed).
    #[inline]
    pub(crate) fn detach_run(&mut self, list: &mut List, first: u32, last: u32, n: u32) {
        self.bridge(list, first, last);
        list.len -= n;
    }

    /// Appends a detached run `first..=last` (`n` nodes) to the back of `list`, in its order.
    #[inline]
    pub(crate) fn append_run(&mut self, list: &mut List, first: u32, last: u32, n: u32) {
        self.set_prev(first, list.tail);
        if list.tail == NIL {
            list.head = first;
        } else {
            self.set_next(list.tail, first);
        }
        self.set_next(last, NIL);
        list.tail = last;
        list.len += n;
    }

    /// Appends a detached run `first..=last` (`n` nodes) to the back of `list` in reverse:
    /// `last` first, `first` at the tail.
    #[inline]
    pub(crate) fn append_run_reversed(&mut self, list: &mut List, first: u32, last: u32, n: u32) {
        let mut tail = list.tail;
        let mut at = last;
        loop {
            // The run's inner links still lead from `last` back to `first`.
            let before = self.prev(at);
            self.set_links(at, tail, NIL);
            if tail == NIL {
                list.head = at;
            } else {
                self.set_next(tail, at);
            }
            tail = at;
            if at == first {
                break;
            }
            at = before;
        }
        list.tail = tail;
        list.len += n;
    }

    /// Moves node `i`, linked in `list`, to its tail.
    #[inline(always)]
    pub(crate) fn move_to_tail(&mut self, list: &mut List, i: u32) {
        let tail = list.tail;
        if tail == i {
            return;
        }
        // `i` is linked and not the tail, so it has a successor and the list a tail.
        let Node {
            prev: p, next: n, ..
        } = self.nodes.get(i as usize);
        if p == NIL {
            list.head = n;
        } else {
            self.set_next(p, n);
        }
        self.set_prev(n, p);
        self.set_links(i, tail, NIL);
        self.set_next(tail, i);
        list.tail = i;
    }

    /// Moves node `i` (linked in `from`) to the tail of another list `to`.
    #[inline(always)]
    pub(crate) fn move_to_back(&mut self, from: &mut List, to: &mut List, i: u32) {
        self.unlink(from, i);
        self.push_back(to, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn collect(l: &Links<u8>, list: &List) -> Vec<u32> {
        let mut v = Vec::new();
        let mut i = list.head;
        while i != NIL {
            v.push(i);
            i = l.next(i);
        }
        v
    }

    #[test]
    fn a_run_moves_to_the_tail_in_order() {
        let mut l = Links::<u8>::new(6).unwrap();
        let mut a = List::EMPTY;
        for i in 0..6 {
            l.push_back(&mut a, i);
        }
        l.move_run_to_tail(&mut a, 1, 3);
        assert_eq!(collect(&l, &a), [0, 4, 5, 1, 2, 3]);
        l.move_run_to_tail(&mut a, 0, 4);
        assert_eq!(collect(&l, &a), [5, 1, 2, 3, 0, 4]);
        l.move_run_to_tail(&mut a, 2, 4);
        assert_eq!(collect(&l, &a), [5, 1, 2, 3, 0, 4]);
        assert_eq!(
            (a.head, a.tail, a.len, l.prev(5), l.next(4)),
            (5, 4, 6, NIL, NIL)
        );
    }

    #[test]
    fn a_run_detaches_and_appends_in_order_or_reversed() {
        let mut l = Links::<u8>::new(8).unwrap();
        let (mut a, mut b) = (List::EMPTY, List::EMPTY);
        for i in 0..6 {
            l.push_back(&mut a, i);
        }
        l.detach_run(&mut a, 1, 3, 3);
        l.append_run_reversed(&mut b, 1, 3, 3);
        assert_eq!(
            (collect(&l, &a), collect(&l, &b)),
            (alloc::vec![0, 4, 5], alloc::vec![3, 2, 1])
        );
        assert_eq!(
            (a.len, b.len, b.head, b.tail, l.prev(3), l.next(1)),
            (3, 3, 3, 1, NIL, NIL)
        );
        // From the tail of a list back onto it, reversed; from its head onto its tail, in order.
        l.detach_run(&mut a, 4, 5, 2);
        l.append_run_reversed(&mut a, 4, 5, 2);
        assert_eq!(collect(&l, &a), [0, 5, 4]);
        l.detach_run(&mut a, 0, 5, 2);
        l.append_run(&mut a, 0, 5, 2);
        assert_eq!(
            (collect(&l, &a), a.head, a.tail, a.len),
            (alloc::vec![4, 0, 5], 4, 5, 3)
        );
        // A whole list onto another, which empties it.
        l.detach_run(&mut b, 3, 1, 3);
        l.append_run(&mut a, 3, 1, 3);
        assert_eq!(
            (collect(&l, &a), b),
            (alloc::vec![4, 0, 5, 3, 2, 1], List::EMPTY)
        );
        assert_eq!((l.prev(4), l.prev(3), l.next(5), a.len), (NIL, 5, 3, 6));
    }

    #[test]
    fn push_insert_unlink_move() {
        let mut l = Links::<u8>::new(6).unwrap();
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
        l.set_data(5, 9);
        assert_eq!((l.data(5), l.data(4), l.next(3), l.prev(5)), (9, 0, 5, 3));
        l.set_data(6, 1);
        assert_eq!(l.data(6), 0);
    }
}
