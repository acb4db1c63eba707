//! [`SlotPool`]: the CPU tier's slot allocator.

use alloc::vec::Vec;
use core::fmt;

/// Why a [`SlotPool`] operation failed. Nothing changes on error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotError {
    /// `requested` slots were asked for but only `free` are free.
    Exhausted {
        /// Slots requested.
        requested: u32,
        /// Slots free.
        free: u32,
    },
    /// The id is not below the pool's capacity.
    OutOfRange {
        /// The id given.
        id: u32,
        /// The pool's capacity.
        capacity: u32,
    },
    /// The id is not currently allocated (never handed out, or already freed).
    NotAllocated {
        /// The id given.
        id: u32,
    },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SlotError::Exhausted { requested, free } => {
                write!(f, "cannot allocate {requested} slots: only {free} are free")
            }
            SlotError::OutOfRange { id, capacity } => {
                write!(
                    f,
                    "slot id {id} is out of range for a pool of {capacity} slots"
                )
            }
            SlotError::NotAllocated { id } => write!(f, "slot id {id} is not allocated"),
        }
    }
}

impl core::error::Error for SlotError {}

/// A fixed pool of `capacity` slot ids `0..capacity`, in vLLM's CPU-tier order.
///
/// Allocation hands out never-used ids first, in ascending order (`0, 1, 2, …`), and only when
/// those are exhausted pops freed ids from a stack (last freed, first reused). Freed ids are
/// pushed one by one in the order they are freed. Every operation is O(1) per id and nothing is
/// allocated after [`SlotPool::new`].
///
/// ```
/// use kvtier_core::allocator::SlotPool;
/// let mut pool = SlotPool::new(3);
/// assert_eq!(pool.alloc(), Ok(0));
/// assert_eq!(pool.alloc(), Ok(1));
/// pool.free(0).unwrap();
/// assert_eq!(pool.alloc(), Ok(2)); // fresh ids first
/// assert_eq!(pool.alloc(), Ok(0)); // then the freed ones, LIFO
/// assert!(pool.alloc().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotPool {
    capacity: u32,
    /// Ids ever handed out: `0..fresh` have been used, `fresh..capacity` never.
    fresh: u32,
    /// Freed ids, reused from the end. INVARIANT: `free_stack.capacity() >= capacity`.
    free_stack: Vec<u32>,
    /// One bit per id: set while the id is allocated.
    held: Vec<u64>,
}

impl SlotPool {
    /// A pool of `capacity` ids, all free. The only allocation the pool ever makes.
    ///
    /// # Errors
    /// [`AllocError`](crate::AllocError) when its `capacity · 4.125` bytes cannot be allocated.
    pub fn try_new(capacity: u32) -> Result<Self, crate::AllocError> {
        let words = (capacity as usize).div_ceil(64);
        let free_stack = crate::reserve::with_capacity(capacity as usize)?;
        let held = crate::reserve::filled(words, 0)?;
        Ok(SlotPool {
            capacity,
            fresh: 0,
            free_stack,
            held,
        })
    }

    /// A pool of `capacity` ids, all free. The only allocation the pool ever makes; like `Vec`,
    /// it aborts when the memory cannot be had ([`SlotPool::try_new`] returns an error instead).
    #[must_use]
    pub fn new(capacity: u32) -> Self {
        let words = (capacity as usize).div_ceil(64);
        SlotPool {
            capacity,
            fresh: 0,
            free_stack: Vec::with_capacity(capacity as usize),
            held: alloc::vec![0; words],
        }
    }

    /// The number of ids in the pool.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Ids available to [`SlotPool::alloc`].
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "free_stack.len() <= fresh <= capacity, a u32"
    )]
    #[inline]
    pub fn free_count(&self) -> u32 {
        (self.capacity - self.fresh) + self.free_stack.len() as u32
    }

    /// Ids currently allocated (`capacity − free`).
    #[must_use]
    pub fn allocated(&self) -> u32 {
        self.capacity - self.free_count()
    }

    /// True when `id` is currently allocated.
    #[must_use]
    #[inline]
    pub fn is_allocated(&self, id: u32) -> bool {
        id < self.capacity && self.held[(id / 64) as usize] & (1u64 << (id % 64)) != 0
    }

    /// Hands out one id: the next fresh id if any is left, else the most recently freed one.
    ///
    /// # Errors
    /// [`SlotError::Exhausted`] when no id is free.
    #[inline]
    pub fn alloc(&mut self) -> Result<u32, SlotError> {
        let id = if self.fresh < self.capacity {
            let id = self.fresh;
            self.fresh += 1;
            id
        } else if let Some(id) = self.free_stack.pop() {
            id
        } else {
            return Err(SlotError::Exhausted {
                requested: 1,
                free: 0,
            });
        };
        self.held[(id / 64) as usize] |= 1u64 << (id % 64);
        Ok(id)
    }

    /// Hands out `n` ids in allocation order, passing each to `sink`; all or nothing.
    ///
    /// # Errors
    /// [`SlotError::Exhausted`] when fewer than `n` ids are free; nothing is allocated then.
    pub fn alloc_n(&mut self, n: u32, mut sink: impl FnMut(u32)) -> Result<(), SlotError> {
        let free = self.free_count();
        if n > free {
            return Err(SlotError::Exhausted { requested: n, free });
        }
        for _ in 0..n {
            // Cannot fail: n <= free was checked above.
            match self.alloc() {
                Ok(id) => sink(id),
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Returns `id` to the pool; it becomes the next id reused once fresh ids run out.
    ///
    /// # Errors
    /// [`SlotError::OutOfRange`] or [`SlotError::NotAllocated`]; nothing changes then.
    #[inline]
    pub fn free(&mut self, id: u32) -> Result<(), SlotError> {
        if id >= self.capacity {
            return Err(SlotError::OutOfRange {
                id,
                capacity: self.capacity,
            });
        }
        if !self.is_allocated(id) {
            return Err(SlotError::NotAllocated { id });
        }
        self.held[(id / 64) as usize] &= !(1u64 << (id % 64));
        // Never reallocates: at most `capacity` ids can be free at once.
        self.free_stack.push(id);
        Ok(())
    }

    /// Frees every id and restarts fresh allocation at 0 (vLLM's `reset_cache`).
    pub fn reset(&mut self) {
        self.fresh = 0;
        self.free_stack.clear();
        self.held.iter_mut().for_each(|w| *w = 0);
    }

    /// Bytes of heap this pool holds (for memory accounting).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.free_stack.capacity() * 4 + self.held.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn fresh_ascending_then_lifo() {
        let mut p = SlotPool::new(4);
        let mut got = Vec::new();
        p.alloc_n(2, |i| got.push(i)).unwrap();
        assert_eq!(got, [0, 1]);
        p.free(1).unwrap();
        p.free(0).unwrap();
        got.clear();
        p.alloc_n(4, |i| got.push(i)).unwrap();
        assert_eq!(got, [2, 3, 0, 1]);
        assert_eq!(p.free_count(), 0);
        assert_eq!(
            p.alloc(),
            Err(SlotError::Exhausted {
                requested: 1,
                free: 0
            })
        );
    }

    #[test]
    fn misuse_is_an_error_and_changes_nothing() {
        let mut p = SlotPool::new(2);
        assert_eq!(p.free(0), Err(SlotError::NotAllocated { id: 0 }));
        assert_eq!(p.free(9), Err(SlotError::OutOfRange { id: 9, capacity: 2 }));
        let before = p.clone();
        assert_eq!(
            p.alloc_n(3, |_| {}),
            Err(SlotError::Exhausted {
                requested: 3,
                free: 2
            })
        );
        assert_eq!(p, before);
        assert_eq!(p.alloc(), Ok(0));
        p.free(0).unwrap();
        assert_eq!(p.free(0), Err(SlotError::NotAllocated { id: 0 }));
    }

    #[test]
    fn reset_restarts_at_zero_and_zero_capacity_is_legal() {
        let mut p = SlotPool::new(3);
        p.alloc_n(3, |_| {}).unwrap();
        p.reset();
        assert_eq!((p.free_count(), p.alloc()), (3, Ok(0)));
        let mut z = SlotPool::new(0);
        assert_eq!(z.free_count(), 0);
        assert!(z.alloc().is_err());
        assert!(z.alloc_n(0, |_| {}).is_ok());
    }

    #[test]
    fn no_reallocation_after_construction() {
        let mut p = SlotPool::new(100);
        let cap = p.free_stack.capacity();
        p.alloc_n(100, |_| {}).unwrap();
        for i in (0..100).rev() {
            p.free(i).unwrap();
        }
        assert_eq!(p.free_stack.capacity(), cap);
    }
}
