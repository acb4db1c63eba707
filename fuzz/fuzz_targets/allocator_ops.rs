//! `allocator_ops`: arbitrary operation sequences on `SlotPool` and `FreeQueue`, each step
//! compared with the reference models of `kvtier_tests::allocator_model` (vLLM's orders in the
//! plainest terms). After every step: the same outcome as the model, no id handed out twice
//! while held, free + held = capacity, and an error (never a panic) leaves the allocator equal
//! to a clone taken before the call.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use kvtier_core::allocator::{FreeQueue, SlotPool};
use kvtier_tests::allocator_model::{
    QueueModel, QueueOp, SlotModel, SlotOp, apply_queue, apply_slot,
};
use libfuzzer_sys::fuzz_target;

/// Largest capacity fuzzed: small, so exhaustion and reuse are hot.
const MAX_CAPACITY: u32 = 32;

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    queue_full: bool,
    slot_ops: Vec<SlotOp>,
    queue_ops: Vec<QueueOp>,
}

/// Ids and counts mostly near the capacity (so ops mostly hit live ids), but any `u32` whose
/// top bit is set is kept as is, so out-of-range and huge values stay reachable.
fn fold(v: u32, cap: u32) -> u32 {
    if v & 0x8000_0000 != 0 {
        v
    } else {
        v % (cap + 2)
    }
}

fn fold_slot(op: SlotOp, cap: u32) -> SlotOp {
    match op {
        SlotOp::AllocN(n) => SlotOp::AllocN(fold(n, cap)),
        SlotOp::Free(id) => SlotOp::Free(fold(id, cap)),
        other => other,
    }
}

fn fold_queue(op: QueueOp, cap: u32) -> QueueOp {
    let many = |ids: Vec<u32>| ids.into_iter().map(|i| fold(i, cap)).collect();
    match op {
        QueueOp::PopFrontN(n) => QueueOp::PopFrontN(fold(n, cap)),
        QueueOp::Remove(id) => QueueOp::Remove(fold(id, cap)),
        QueueOp::PushBack(id) => QueueOp::PushBack(fold(id, cap)),
        QueueOp::PushFront(id) => QueueOp::PushFront(fold(id, cap)),
        QueueOp::PushBackN(ids) => QueueOp::PushBackN(many(ids)),
        QueueOp::PushFrontN(ids) => QueueOp::PushFrontN(many(ids)),
        QueueOp::PopFront => QueueOp::PopFront,
    }
}

fn slot_pool(cap: u32, ops: Vec<SlotOp>) {
    let mut pool = SlotPool::new(cap);
    let mut model = SlotModel::new(cap);
    for op in ops.into_iter().map(|op| fold_slot(op, cap)) {
        let before = pool.clone();
        let held_before = model.held.clone();
        let got = apply_slot(&mut pool, &op);
        let want = model.apply(&op);
        assert_eq!(got, want, "SlotPool {op:?}");
        match &got {
            Ok(ids) => {
                let distinct: BTreeSet<u32> = ids.iter().copied().collect();
                assert_eq!(
                    distinct.len(),
                    ids.len(),
                    "an id handed out twice in one batch"
                );
                assert!(
                    ids.iter().all(|id| !held_before.contains(id)),
                    "an id handed out while held"
                );
            }
            Err(e) => {
                assert_eq!(pool, before, "{op:?} failed ({e}) but changed the pool");
            }
        }
        assert_eq!(
            pool.free_count() + pool.allocated(),
            cap,
            "free + held != capacity"
        );
        assert_eq!(pool.free_count(), model.free_count());
        for id in 0..=cap {
            assert_eq!(pool.is_allocated(id), model.held.contains(&id), "id {id}");
        }
    }
}

fn free_queue(cap: u32, full: bool, ops: Vec<QueueOp>) {
    let built = if full {
        FreeQueue::new_full(cap).map(|q| (q, QueueModel::new_full(cap)))
    } else {
        FreeQueue::new_empty(cap).map(|q| (q, QueueModel::new_empty(cap)))
    };
    let Ok((mut queue, mut model)) = built else {
        return;
    };
    let bytes = queue.heap_bytes();
    for op in ops.into_iter().map(|op| fold_queue(op, cap)) {
        let before = queue.clone();
        let got = apply_queue(&mut queue, &op);
        let want = model.apply(&op);
        assert_eq!(got, want, "FreeQueue {op:?}");
        if got.is_err() {
            assert_eq!(queue, before, "{op:?} failed but changed the queue");
        }
        let order: Vec<u32> = queue.iter().collect();
        assert!(
            order.iter().eq(model.items.iter()),
            "order differs after {op:?}"
        );
        assert_eq!(queue.len() as usize, order.len());
        assert_eq!(queue.front(), model.items.front().copied());
        assert_eq!(queue.back(), model.items.back().copied());
        let linked = (0..cap).filter(|&id| queue.contains(id)).count();
        assert_eq!(linked, order.len(), "queued ids != len");
        assert_eq!(queue.heap_bytes(), bytes, "the queue grew");
    }
}

fuzz_target!(|input: Input| {
    let cap = u32::from(input.capacity) % (MAX_CAPACITY + 1);
    slot_pool(cap, input.slot_ops);
    free_queue(cap, input.queue_full, input.queue_ops);
});
