//! [`FreeQueue`]: the GPU block pool's free list, an intrusive doubly linked list over `u32` ids.

use alloc::vec::Vec;
use core::fmt;
use core::iter::FusedIterator;

/// A [`FreeQueue`] could not be built: `capacity + 1` link slots do not fit in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAllocError {
    /// The capacity asked for.
    pub capacity: u32,
}

impl fmt::Display for QueueAllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot allocate a free queue of {} ids: out of memory or address space",
            self.capacity
        )
    }
}

impl core::error::Error for QueueAllocError {}

/// [`FreeQueue::pop_front`] or [`FreeQueue::pop_front_n`] asked for more ids than are queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PopError {
    /// Ids asked for.
    pub requested: u32,
    /// Ids queued.
    pub available: u32,
}

impl fmt::Display for PopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no free blocks available: {} requested, {} queued",
            self.requested, self.available
        )
    }
}

impl core::error::Error for PopError {}

/// Why [`FreeQueue::remove`] failed. Nothing changes on error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoveError {
    /// The id is not below the queue's capacity.
    OutOfRange {
        /// The id given.
        id: u32,
        /// The queue's capacity.
        capacity: u32,
    },
    /// The id is in range but not in the queue.
    NotLinked {
        /// The id given.
        id: u32,
    },
}

impl fmt::Display for RemoveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RemoveError::OutOfRange { id, capacity } => {
                write!(f, "id {id} is out of range for a queue of {capacity} ids")
            }
            RemoveError::NotLinked { id } => {
                write!(f, "cannot remove id {id}: it is not in the free queue")
            }
        }
    }
}

impl core::error::Error for RemoveError {}

/// Why a push onto a [`FreeQueue`] failed. Nothing changes on error; for a slice, the first
/// offending id (in slice order) is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// The id is not below the queue's capacity.
    OutOfRange {
        /// The id given.
        id: u32,
        /// The queue's capacity.
        capacity: u32,
    },
    /// The id is already in the queue.
    AlreadyLinked {
        /// The id given.
        id: u32,
    },
    /// The id appears more than once in the slice being pushed.
    Duplicate {
        /// The repeated id.
        id: u32,
    },
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PushError::OutOfRange { id, capacity } => {
                write!(f, "id {id} is out of range for a queue of {capacity} ids")
            }
            PushError::AlreadyLinked { id } => {
                write!(f, "cannot push id {id}: it is already in the free queue")
            }
            PushError::Duplicate { id } => {
                write!(f, "cannot push id {id} twice in one batch")
            }
        }
    }
}

impl core::error::Error for PushError {}

/// A fixed-capacity FIFO of ids `0..capacity` with O(1) removal from the middle: vLLM's
/// `FreeKVCacheBlockQueue`, without per-block objects.
///
/// Each id is either linked (in the queue, exactly once) or not. The links live in two arrays
/// allocated by the constructor; no operation allocates afterwards. Every misuse (popping more
/// than is queued, removing an id that is not queued, pushing one that is, or an id out of
/// range) is a typed error that leaves the queue unchanged.
///
/// ```
/// use kvtier_core::allocator::FreeQueue;
/// let mut q = FreeQueue::new_full(5)?;
/// assert_eq!(q.pop_front(), Ok(0));
/// q.remove(2)?;
/// q.push_back(2)?;
/// assert!(q.iter().eq([1, 3, 4, 2]));
/// q.push_front_n(&[0])?;
/// assert_eq!(q.front(), Some(0));
/// assert!(q.push_back(3).is_err()); // already queued
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeQueue {
    // INVARIANT: `next.len() == prev.len() == capacity + 1`. Slot `capacity` is the sentinel:
    // the list is circular through it (`next[sentinel]` is the head, `prev[sentinel]` the tail,
    // both the sentinel itself when empty). An id that is not linked points to itself in both
    // arrays; a linked id never does. So two queues holding the same ids in the same order are
    // equal field by field.
    next: Vec<u32>,
    prev: Vec<u32>,
    len: u32,
    capacity: u32,
}

impl FreeQueue {
    /// A queue of `capacity` ids holding all of them, in id order (`0` at the front).
    ///
    /// # Errors
    /// [`QueueAllocError`] when the link arrays cannot be allocated.
    pub fn new_full(capacity: u32) -> Result<Self, QueueAllocError> {
        let mut q = Self::new_empty(capacity)?;
        let s = capacity;
        for id in 0..capacity {
            q.next[id as usize] = id + 1; // the last id's successor is the sentinel
            q.prev[id as usize] = if id == 0 { s } else { id - 1 };
        }
        if capacity > 0 {
            q.next[s as usize] = 0;
            q.prev[s as usize] = capacity - 1;
        }
        q.len = capacity;
        Ok(q)
    }

    /// A queue of `capacity` ids holding none of them.
    ///
    /// # Errors
    /// [`QueueAllocError`] when the link arrays cannot be allocated.
    pub fn new_empty(capacity: u32) -> Result<Self, QueueAllocError> {
        let err = QueueAllocError { capacity };
        let slots = usize::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_add(1))
            .ok_or(err)?;
        let mut next: Vec<u32> = crate::reserve::with_capacity(slots).map_err(|_| err)?;
        let mut prev: Vec<u32> = crate::reserve::with_capacity(slots).map_err(|_| err)?;
        // Every slot (the sentinel included) starts as a self-loop: nothing linked.
        next.extend(0..=capacity);
        prev.extend(0..=capacity);
        Ok(FreeQueue {
            next,
            prev,
            len: 0,
            capacity,
        })
    }

    /// The number of ids the queue can hold (ids are `0..capacity`).
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The number of ids queued (vLLM's `num_free_blocks`).
    #[must_use]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when nothing is queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `id` is queued (false for ids out of range).
    #[must_use]
    pub fn contains(&self, id: u32) -> bool {
        id < self.capacity && self.is_linked(id)
    }

    /// The id at the front (the next one [`FreeQueue::pop_front`] returns).
    #[must_use]
    pub fn front(&self) -> Option<u32> {
        let head = self.next[self.sentinel()];
        (head != self.capacity).then_some(head)
    }

    /// The id at the back (the most recently appended).
    #[must_use]
    pub fn back(&self) -> Option<u32> {
        let tail = self.prev[self.sentinel()];
        (tail != self.capacity).then_some(tail)
    }

    /// Removes and returns the front id.
    ///
    /// # Errors
    /// [`PopError`] ("no free blocks available") when the queue is empty.
    pub fn pop_front(&mut self) -> Result<u32, PopError> {
        let Some(head) = self.front() else {
            return Err(PopError {
                requested: 1,
                available: 0,
            });
        };
        self.unlink(head);
        self.len -= 1;
        Ok(head)
    }

    /// Removes the first `n` ids, passing each to `sink` in queue order; all or nothing
    /// (`n = 0` does nothing).
    ///
    /// # Errors
    /// [`PopError`] when fewer than `n` ids are queued; nothing is removed then.
    pub fn pop_front_n(&mut self, n: u32, mut sink: impl FnMut(u32)) -> Result<(), PopError> {
        if n > self.len {
            return Err(PopError {
                requested: n,
                available: self.len,
            });
        }
        let s = self.sentinel();
        for _ in 0..n {
            let head = self.next[s];
            self.unlink(head);
            sink(head);
        }
        self.len -= n;
        Ok(())
    }

    /// Removes `id` from wherever it is in the queue, in O(1).
    ///
    /// # Errors
    /// [`RemoveError::OutOfRange`] or [`RemoveError::NotLinked`]; nothing changes then.
    pub fn remove(&mut self, id: u32) -> Result<(), RemoveError> {
        if id >= self.capacity {
            return Err(RemoveError::OutOfRange {
                id,
                capacity: self.capacity,
            });
        }
        if !self.is_linked(id) {
            return Err(RemoveError::NotLinked { id });
        }
        self.unlink(id);
        self.len -= 1;
        Ok(())
    }

    /// Appends `id` at the back.
    ///
    /// # Errors
    /// [`PushError::OutOfRange`] or [`PushError::AlreadyLinked`]; nothing changes then.
    pub fn push_back(&mut self, id: u32) -> Result<(), PushError> {
        self.check_pushable(id)?;
        let tail = self.prev[self.sentinel()];
        self.link_after(id, tail);
        self.len += 1;
        Ok(())
    }

    /// Inserts `id` at the front.
    ///
    /// # Errors
    /// [`PushError::OutOfRange`] or [`PushError::AlreadyLinked`]; nothing changes then.
    pub fn push_front(&mut self, id: u32) -> Result<(), PushError> {
        self.check_pushable(id)?;
        self.link_after(id, self.capacity);
        self.len += 1;
        Ok(())
    }

    /// Appends `ids` at the back, keeping their order (vLLM's `append_n`).
    ///
    /// # Errors
    /// [`PushError`] for the first id (in slice order) that is out of range, already queued, or
    /// repeated in `ids`; nothing is pushed then.
    pub fn push_back_n(&mut self, ids: &[u32]) -> Result<(), PushError> {
        self.check_pushable_all(ids)?;
        let mut after = self.prev[self.sentinel()];
        for &id in ids {
            self.link_after(id, after);
            after = id;
        }
        self.add_len(ids.len());
        Ok(())
    }

    /// Inserts `ids` at the front, keeping their order, ahead of the current front (vLLM's
    /// `prepend_n`): pushing `[4, 5]` onto `[0]` gives `[4, 5, 0]`.
    ///
    /// # Errors
    /// [`PushError`] for the first id (in slice order) that is out of range, already queued, or
    /// repeated in `ids`; nothing is pushed then.
    pub fn push_front_n(&mut self, ids: &[u32]) -> Result<(), PushError> {
        self.check_pushable_all(ids)?;
        let mut after = self.capacity;
        for &id in ids {
            self.link_after(id, after);
            after = id;
        }
        self.add_len(ids.len());
        Ok(())
    }

    /// The queued ids from front to back (vLLM's `get_all_free_blocks` order).
    #[must_use]
    pub fn iter(&self) -> QueueIter<'_> {
        QueueIter {
            queue: self,
            cur: self.next[self.sentinel()],
        }
    }

    /// The queued ids after `cursor`, front to back; from the front when `cursor` is `None`
    /// (vLLM's `iter_blocks_after`). A cursor that is not queued (or out of range) yields
    /// nothing, as in vLLM, where such a block has no successor link.
    #[must_use]
    pub fn iter_after(&self, cursor: Option<u32>) -> QueueIter<'_> {
        let cur = match cursor {
            None => self.next[self.sentinel()],
            Some(c) if self.contains(c) => self.next[c as usize],
            Some(_) => self.capacity,
        };
        QueueIter { queue: self, cur }
    }

    /// Bytes of heap this queue holds (for memory accounting).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        (self.next.capacity() + self.prev.capacity()) * core::mem::size_of::<u32>()
    }

    fn sentinel(&self) -> usize {
        self.capacity as usize
    }

    /// `id` must be below the capacity.
    fn is_linked(&self, id: u32) -> bool {
        self.next[id as usize] != id
    }

    fn check_pushable(&self, id: u32) -> Result<(), PushError> {
        if id >= self.capacity {
            return Err(PushError::OutOfRange {
                id,
                capacity: self.capacity,
            });
        }
        if self.is_linked(id) {
            return Err(PushError::AlreadyLinked { id });
        }
        Ok(())
    }

    /// Validates a batch without allocating: each accepted id is marked by pointing its `prev`
    /// at the sentinel (an unlinked id otherwise points to itself), so a repeat is seen as
    /// marked. The marks are undone before returning, whatever the outcome; the caller then
    /// links every id, which overwrites both links anyway.
    fn check_pushable_all(&mut self, ids: &[u32]) -> Result<(), PushError> {
        let s = self.capacity;
        let mut failure = None;
        let mut marked = 0;
        for &id in ids {
            if let Err(e) = self.check_pushable(id) {
                failure = Some(e);
                break;
            }
            if self.prev[id as usize] == s {
                failure = Some(PushError::Duplicate { id });
                break;
            }
            self.prev[id as usize] = s;
            marked += 1;
        }
        for &id in ids.iter().take(marked) {
            self.prev[id as usize] = id;
        }
        failure.map_or(Ok(()), Err)
    }

    /// Links the unlinked `id` right after `after` (an id or the sentinel).
    fn link_after(&mut self, id: u32, after: u32) {
        let before = self.next[after as usize];
        self.next[after as usize] = id;
        self.prev[id as usize] = after;
        self.next[id as usize] = before;
        self.prev[before as usize] = id;
    }

    /// Unlinks the linked `id`, leaving it a self-loop.
    fn unlink(&mut self, id: u32) {
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.next[id as usize] = id;
        self.prev[id as usize] = id;
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "the batch held distinct unlinked ids below capacity, so len + n <= capacity, a u32"
    )]
    fn add_len(&mut self, n: usize) {
        self.len += n as u32;
    }
}

impl<'a> IntoIterator for &'a FreeQueue {
    type Item = u32;
    type IntoIter = QueueIter<'a>;

    fn into_iter(self) -> QueueIter<'a> {
        self.iter()
    }
}

/// Iterator over queued ids, front to back: see [`FreeQueue::iter`] and
/// [`FreeQueue::iter_after`].
#[derive(Clone, Debug)]
pub struct QueueIter<'a> {
    queue: &'a FreeQueue,
    /// The next id to yield, or the sentinel when done.
    cur: u32,
}

impl Iterator for QueueIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.cur == self.queue.capacity {
            return None;
        }
        let id = self.cur;
        self.cur = self.queue.next[id as usize];
        Some(id)
    }
}

impl FusedIterator for QueueIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn zero_capacity_is_empty_and_rejects_everything() {
        let mut q = FreeQueue::new_full(0).unwrap();
        assert!(q.is_empty());
        assert_eq!(q.front(), None);
        assert_eq!(
            q.pop_front(),
            Err(PopError {
                requested: 1,
                available: 0
            })
        );
        assert_eq!(
            q.push_back(0),
            Err(PushError::OutOfRange { id: 0, capacity: 0 })
        );
        assert_eq!(q.pop_front_n(0, |_| {}), Ok(()));
        assert_eq!(q, FreeQueue::new_empty(0).unwrap());
    }

    #[test]
    fn failed_batch_leaves_no_marks() {
        let mut q = FreeQueue::new_empty(4).unwrap();
        let before = q.clone();
        assert_eq!(
            q.push_back_n(&[1, 2, 1]),
            Err(PushError::Duplicate { id: 1 })
        );
        assert_eq!(q, before);
        q.push_back_n(&[3, 1]).unwrap();
        assert_eq!(ids(&q), [3, 1]);
        assert_eq!(q.back(), Some(1));
    }

    #[test]
    fn max_id_and_sentinel_do_not_collide() {
        let mut q = FreeQueue::new_empty(3).unwrap();
        q.push_front(2).unwrap();
        assert!(q.contains(2));
        assert!(!q.contains(3));
        assert_eq!(
            q.remove(3),
            Err(RemoveError::OutOfRange { id: 3, capacity: 3 })
        );
        assert_eq!(q.iter_after(Some(3)).count(), 0);
    }
}
