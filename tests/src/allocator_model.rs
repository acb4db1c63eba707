//! Operation enums and reference models for the allocators, shared by proptests and fuzz targets.
//!
//! * [`SlotOp`] / [`SlotModel`] mirror [`SlotPool`]: a fresh counter, a `Vec` used as a LIFO
//!   stack and a `BTreeSet` of held ids.
//! * [`QueueOp`] / [`QueueModel`] mirror [`FreeQueue`] with a `VecDeque` (linear-time removal,
//!   obviously correct).
//!
//! `apply_*` run an op on the real allocator and return the same outcome type as the model, so
//! a driver compares the two with `==`. No proptest types here: strategies live in the tests.

use std::collections::{BTreeSet, VecDeque};

use kvtier_core::allocator::{FreeQueue, PopError, PushError, RemoveError, SlotError, SlotPool};

/// One operation on a [`SlotPool`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum SlotOp {
    /// `alloc()`.
    Alloc,
    /// `alloc_n(n)`.
    AllocN(u32),
    /// `free(id)`.
    Free(u32),
    /// `reset()`.
    Reset,
}

/// The ids an op handed out (empty for `Free`/`Reset`), or its error.
pub type SlotOutcome = Result<Vec<u32>, SlotError>;

/// Reference model of [`SlotPool`]: vLLM's CPU-tier order in the plainest terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotModel {
    /// The number of ids.
    pub capacity: u32,
    /// Ids ever handed out since the last reset: `0..fresh`.
    pub fresh: u32,
    /// Freed ids; the last one is reused first.
    pub stack: Vec<u32>,
    /// Ids currently held.
    pub held: BTreeSet<u32>,
}

impl SlotModel {
    /// A model of `SlotPool::new(capacity)`.
    #[must_use]
    pub fn new(capacity: u32) -> Self {
        SlotModel {
            capacity,
            fresh: 0,
            stack: Vec::new(),
            held: BTreeSet::new(),
        }
    }

    /// Free ids: never used plus freed.
    #[must_use]
    pub fn free_count(&self) -> u32 {
        self.capacity - self.fresh + u32::try_from(self.stack.len()).unwrap_or(u32::MAX)
    }

    fn take_one(&mut self) -> Option<u32> {
        let id = if self.fresh < self.capacity {
            self.fresh += 1;
            self.fresh - 1
        } else {
            self.stack.pop()?
        };
        self.held.insert(id);
        Some(id)
    }

    /// Applies `op` to the model.
    pub fn apply(&mut self, op: &SlotOp) -> SlotOutcome {
        match *op {
            SlotOp::Alloc => self
                .take_one()
                .map(|id| vec![id])
                .ok_or(SlotError::Exhausted {
                    requested: 1,
                    free: 0,
                }),
            SlotOp::AllocN(n) => {
                let free = self.free_count();
                if n > free {
                    return Err(SlotError::Exhausted { requested: n, free });
                }
                Ok((0..n).filter_map(|_| self.take_one()).collect())
            }
            SlotOp::Free(id) => {
                if id >= self.capacity {
                    return Err(SlotError::OutOfRange {
                        id,
                        capacity: self.capacity,
                    });
                }
                if !self.held.remove(&id) {
                    return Err(SlotError::NotAllocated { id });
                }
                self.stack.push(id);
                Ok(Vec::new())
            }
            SlotOp::Reset => {
                *self = SlotModel::new(self.capacity);
                Ok(Vec::new())
            }
        }
    }
}

/// Applies `op` to a real [`SlotPool`].
pub fn apply_slot(pool: &mut SlotPool, op: &SlotOp) -> SlotOutcome {
    match *op {
        SlotOp::Alloc => pool.alloc().map(|id| vec![id]),
        SlotOp::AllocN(n) => {
            let mut ids = Vec::new();
            pool.alloc_n(n, |id| ids.push(id)).map(|()| ids)
        }
        SlotOp::Free(id) => pool.free(id).map(|()| Vec::new()),
        SlotOp::Reset => {
            pool.reset();
            Ok(Vec::new())
        }
    }
}

/// One operation on a [`FreeQueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum QueueOp {
    /// `pop_front()`.
    PopFront,
    /// `pop_front_n(n)`.
    PopFrontN(u32),
    /// `remove(id)`.
    Remove(u32),
    /// `push_back(id)`.
    PushBack(u32),
    /// `push_front(id)`.
    PushFront(u32),
    /// `push_back_n(ids)`.
    PushBackN(Vec<u32>),
    /// `push_front_n(ids)`.
    PushFrontN(Vec<u32>),
}

/// Any [`FreeQueue`] error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// From a pop.
    Pop(PopError),
    /// From `remove`.
    Remove(RemoveError),
    /// From a push.
    Push(PushError),
}

/// The ids an op popped (empty for the others), or its error.
pub type QueueOutcome = Result<Vec<u32>, QueueError>;

/// Reference model of [`FreeQueue`]: a `VecDeque` of ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueModel {
    /// The number of ids.
    pub capacity: u32,
    /// Queued ids, front first.
    pub items: VecDeque<u32>,
}

impl QueueModel {
    /// A model of `FreeQueue::new_full(capacity)`.
    #[must_use]
    pub fn new_full(capacity: u32) -> Self {
        QueueModel {
            capacity,
            items: (0..capacity).collect(),
        }
    }

    /// A model of `FreeQueue::new_empty(capacity)`.
    #[must_use]
    pub fn new_empty(capacity: u32) -> Self {
        QueueModel {
            capacity,
            items: VecDeque::new(),
        }
    }

    fn len(&self) -> u32 {
        u32::try_from(self.items.len()).unwrap_or(u32::MAX)
    }

    /// The error pushing `ids` (in order) would hit first, if any.
    fn check_push(&self, ids: &[u32]) -> Result<(), PushError> {
        let mut seen = BTreeSet::new();
        for &id in ids {
            if id >= self.capacity {
                return Err(PushError::OutOfRange {
                    id,
                    capacity: self.capacity,
                });
            }
            if self.items.contains(&id) {
                return Err(PushError::AlreadyLinked { id });
            }
            if !seen.insert(id) {
                return Err(PushError::Duplicate { id });
            }
        }
        Ok(())
    }

    /// Applies `op` to the model.
    pub fn apply(&mut self, op: &QueueOp) -> QueueOutcome {
        match op {
            QueueOp::PopFront => self
                .items
                .pop_front()
                .map(|id| vec![id])
                .ok_or(QueueError::Pop(PopError {
                    requested: 1,
                    available: 0,
                })),
            &QueueOp::PopFrontN(n) => {
                if n > self.len() {
                    return Err(QueueError::Pop(PopError {
                        requested: n,
                        available: self.len(),
                    }));
                }
                Ok(self.items.drain(..n as usize).collect())
            }
            &QueueOp::Remove(id) => {
                if id >= self.capacity {
                    return Err(QueueError::Remove(RemoveError::OutOfRange {
                        id,
                        capacity: self.capacity,
                    }));
                }
                let Some(pos) = self.items.iter().position(|&x| x == id) else {
                    return Err(QueueError::Remove(RemoveError::NotLinked { id }));
                };
                self.items.remove(pos);
                Ok(Vec::new())
            }
            &QueueOp::PushBack(id) => self.apply(&QueueOp::PushBackN(vec![id])),
            &QueueOp::PushFront(id) => self.apply(&QueueOp::PushFrontN(vec![id])),
            QueueOp::PushBackN(ids) => {
                self.check_push(ids).map_err(QueueError::Push)?;
                self.items.extend(ids);
                Ok(Vec::new())
            }
            QueueOp::PushFrontN(ids) => {
                self.check_push(ids).map_err(QueueError::Push)?;
                for &id in ids.iter().rev() {
                    self.items.push_front(id);
                }
                Ok(Vec::new())
            }
        }
    }
}

/// Applies `op` to a real [`FreeQueue`].
pub fn apply_queue(queue: &mut FreeQueue, op: &QueueOp) -> QueueOutcome {
    let done = |()| Vec::new();
    match op {
        QueueOp::PopFront => queue
            .pop_front()
            .map(|id| vec![id])
            .map_err(QueueError::Pop),
        &QueueOp::PopFrontN(n) => {
            let mut ids = Vec::new();
            queue
                .pop_front_n(n, |id| ids.push(id))
                .map(|()| ids)
                .map_err(QueueError::Pop)
        }
        &QueueOp::Remove(id) => queue.remove(id).map(done).map_err(QueueError::Remove),
        &QueueOp::PushBack(id) => queue.push_back(id).map(done).map_err(QueueError::Push),
        &QueueOp::PushFront(id) => queue.push_front(id).map(done).map_err(QueueError::Push),
        QueueOp::PushBackN(ids) => queue.push_back_n(ids).map(done).map_err(QueueError::Push),
        QueueOp::PushFrontN(ids) => queue.push_front_n(ids).map(done).map_err(QueueError::Push),
    }
}
