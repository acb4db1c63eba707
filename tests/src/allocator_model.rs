//! Operation enums and reference models for the allocators, shared by proptests and fuzz targets.
//!
//! * [`SlotOp`] / [`SlotModel`] mirror [`SlotPool`]: a fresh counter, a `Vec` used as a LIFO
//!   stack and a `BTreeSet` of held ids.
//! * [`QueueOp`] / [`QueueModel`] mirror [`FreeQueue`] with a `VecDeque` (linear-time removal,
//!   obviously correct).
//!
//! `apply_*` run an op on the real allocator and return the same outcome type as the model, so
//! a driver compares the two with `==`. No proptest types here: strategies live in the tests.
//! [`run_fixed_sequence`] is a driver of its own over a fixed pseudo-random op sequence.
//!
//! `no_std` + `alloc` on purpose: the Cortex-M firmware (`tests/firmware`) includes this file by
//! path and runs the same models.

use alloc::collections::{BTreeSet, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

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

/// A small deterministic generator for [`run_fixed_sequence`] (xorshift64*).
#[derive(Clone, Debug)]
pub struct OpRng(u64);

impl OpRng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero state).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        OpRng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n ≥ 1`).
    pub fn below(&mut self, n: u32) -> u32 {
        #[expect(clippy::cast_possible_truncation, reason = "the remainder is below n")]
        let v = (self.next_u64() % u64::from(n.max(1))) as u32;
        v
    }
}

/// What [`run_fixed_sequence`] did, to compare across targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceReport {
    /// Ops applied to each allocator.
    pub steps: u32,
    /// `SlotPool` ops that succeeded.
    pub slot_ok: u32,
    /// `FreeQueue` ops that succeeded.
    pub queue_ok: u32,
    /// A fold of every outcome (ids handed out, error kinds), equal on every target.
    pub checksum: u64,
}

fn fold(sum: u64, v: u64) -> u64 {
    sum.wrapping_mul(1_000_003).wrapping_add(v)
}

fn random_slot_op(rng: &mut OpRng, cap: u32) -> SlotOp {
    match rng.below(12) {
        0..=3 => SlotOp::Alloc,
        4..=5 => SlotOp::AllocN(rng.below(cap + 2)),
        6..=10 => SlotOp::Free(rng.below(cap + 1)),
        _ => SlotOp::Reset,
    }
}

fn random_queue_op(rng: &mut OpRng, cap: u32) -> QueueOp {
    let batch = |rng: &mut OpRng| (0..rng.below(5)).map(|_| rng.below(cap + 1)).collect();
    match rng.below(17) {
        0..=2 => QueueOp::PopFront,
        3..=4 => QueueOp::PopFrontN(rng.below(cap + 2)),
        5..=7 => QueueOp::Remove(rng.below(cap + 1)),
        8..=10 => QueueOp::PushBack(rng.below(cap + 1)),
        11..=12 => QueueOp::PushFront(rng.below(cap + 1)),
        13..=14 => QueueOp::PushBackN(batch(rng)),
        _ => QueueOp::PushFrontN(batch(rng)),
    }
}

/// Runs `steps` pseudo-random ops from `seed` on a `SlotPool` of `cap` ids and on a full
/// `FreeQueue` of `cap` ids, against [`SlotModel`] and [`QueueModel`]: the same outcome for
/// every op, nothing changed by an error, and the same state (held ids, queue order) after
/// every step.
///
/// # Errors
/// A description of the first difference.
pub fn run_fixed_sequence(seed: u64, cap: u32, steps: u32) -> Result<SequenceReport, String> {
    let mut rng = OpRng::new(seed);
    let mut pool = SlotPool::new(cap);
    let mut slots = SlotModel::new(cap);
    let mut queue = FreeQueue::new_full(cap).map_err(|e| format!("FreeQueue::new_full: {e:?}"))?;
    let mut items = QueueModel::new_full(cap);
    let mut report = SequenceReport {
        steps,
        slot_ok: 0,
        queue_ok: 0,
        checksum: 0,
    };
    for step in 0..steps {
        let op = random_slot_op(&mut rng, cap);
        let before = pool.clone();
        let got = apply_slot(&mut pool, &op);
        let want = slots.apply(&op);
        if got != want {
            return Err(format!(
                "step {step}: {op:?} gave {got:?}, the model {want:?}"
            ));
        }
        match &got {
            Ok(ids) => {
                report.slot_ok += 1;
                report.checksum = ids
                    .iter()
                    .fold(report.checksum, |c, &id| fold(c, u64::from(id)));
            }
            Err(_) if pool != before => {
                return Err(format!("step {step}: {op:?} failed but changed the pool"));
            }
            Err(_) => report.checksum = fold(report.checksum, u64::MAX),
        }
        if pool.free_count() != slots.free_count()
            || (0..=cap).any(|id| pool.is_allocated(id) != slots.held.contains(&id))
        {
            return Err(format!(
                "step {step}: after {op:?} the pool and the model hold different ids"
            ));
        }

        let op = random_queue_op(&mut rng, cap);
        let before = queue.clone();
        let got = apply_queue(&mut queue, &op);
        let want = items.apply(&op);
        if got != want {
            return Err(format!(
                "step {step}: {op:?} gave {got:?}, the model {want:?}"
            ));
        }
        match &got {
            Ok(ids) => {
                report.queue_ok += 1;
                report.checksum = ids
                    .iter()
                    .fold(report.checksum, |c, &id| fold(c, u64::from(id)));
            }
            Err(_) if queue != before => {
                return Err(format!("step {step}: {op:?} failed but changed the queue"));
            }
            Err(_) => report.checksum = fold(report.checksum, u64::MAX - 1),
        }
        if !queue.iter().eq(items.items.iter().copied()) {
            return Err(format!(
                "step {step}: after {op:?} the queue order differs from the model"
            ));
        }
    }
    Ok(report)
}
