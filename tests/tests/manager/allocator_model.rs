//! Model-based proptests: random op sequences on `SlotPool` and `FreeQueue` against the
//! reference models in `kvtier_tests::allocator_model`, checked after every step.

use std::collections::BTreeSet;

use kvtier_core::allocator::{FreeQueue, SlotPool};
use kvtier_tests::allocator_model::{
    QueueModel, QueueOp, SlotModel, SlotOp, apply_queue, apply_slot,
};
use proptest::prelude::*;

const MAX_CAPACITY: u32 = 12;

fn slot_op(cap: u32) -> impl Strategy<Value = SlotOp> {
    prop_oneof![
        4 => Just(SlotOp::Alloc),
        2 => (0..=cap + 1).prop_map(SlotOp::AllocN),
        5 => (0..=cap).prop_map(SlotOp::Free),
        1 => Just(SlotOp::Reset),
    ]
}

fn queue_op(cap: u32) -> impl Strategy<Value = QueueOp> {
    let batch = prop::collection::vec(0..=cap, 0..5);
    prop_oneof![
        3 => Just(QueueOp::PopFront),
        2 => (0..=cap + 1).prop_map(QueueOp::PopFrontN),
        3 => (0..=cap).prop_map(QueueOp::Remove),
        3 => (0..=cap).prop_map(QueueOp::PushBack),
        2 => (0..=cap).prop_map(QueueOp::PushFront),
        2 => batch.clone().prop_map(QueueOp::PushBackN),
        2 => batch.prop_map(QueueOp::PushFrontN),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn slot_pool_matches_model(
        (cap, ops) in (0..=MAX_CAPACITY)
            .prop_flat_map(|c| (Just(c), prop::collection::vec(slot_op(c), 1..80)))
    ) {
        let mut pool = SlotPool::new(cap);
        let mut model = SlotModel::new(cap);
        for op in &ops {
            let before = pool.clone();
            let held_before = model.held.clone();
            let got = apply_slot(&mut pool, op);
            let want = model.apply(op);
            prop_assert_eq!(&got, &want, "op {:?}", op);
            match &got {
                Ok(ids) => {
                    // No id handed out twice while held (within a batch or across ops).
                    let distinct: BTreeSet<u32> = ids.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), ids.len());
                    prop_assert!(ids.iter().all(|id| !held_before.contains(id)));
                }
                Err(_) => prop_assert_eq!(&pool, &before, "an error changed the pool"),
            }
            // free + held = capacity, and the pool agrees with the model id by id.
            prop_assert_eq!(pool.free_count(), model.free_count());
            prop_assert_eq!(pool.free_count() + pool.allocated(), cap);
            prop_assert_eq!(pool.allocated() as usize, model.held.len());
            for id in 0..=cap {
                prop_assert_eq!(pool.is_allocated(id), model.held.contains(&id));
            }
        }
    }

    #[test]
    fn free_queue_matches_model(
        (cap, full, ops) in (0..=MAX_CAPACITY, any::<bool>())
            .prop_flat_map(|(c, f)| (Just(c), Just(f), prop::collection::vec(queue_op(c), 1..80)))
    ) {
        let (mut queue, mut model) = if full {
            (FreeQueue::new_full(cap).unwrap(), QueueModel::new_full(cap))
        } else {
            (FreeQueue::new_empty(cap).unwrap(), QueueModel::new_empty(cap))
        };
        let bytes = queue.heap_bytes();
        for op in &ops {
            let before = queue.clone();
            let got = apply_queue(&mut queue, op);
            let want = model.apply(op);
            prop_assert_eq!(&got, &want, "op {:?}", op);
            if got.is_err() {
                prop_assert_eq!(&queue, &before, "an error changed the queue");
            }
            // Exactly the model's order, front to back and from every cursor.
            let order: Vec<u32> = queue.iter().collect();
            prop_assert_eq!(&order, &model.items.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(queue.len() as usize, order.len());
            prop_assert_eq!(queue.front(), model.items.front().copied());
            prop_assert_eq!(queue.back(), model.items.back().copied());
            for (i, &id) in order.iter().enumerate() {
                prop_assert!(queue.iter_after(Some(id)).eq(order[i + 1..].iter().copied()));
            }
            // Queued + not queued = capacity, with no id queued twice.
            let linked = (0..cap).filter(|&id| queue.contains(id)).count();
            prop_assert_eq!(linked, order.len());
            prop_assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), order.len());
            prop_assert_eq!(queue.heap_bytes(), bytes);
        }
    }
}

/// The fixed sequence the firmware runs (`tests/firmware`), here on the host: every op agrees
/// with the model, and both allocators see successes and errors.
#[test]
fn fixed_sequence_matches_model() {
    let report = kvtier_tests::allocator_model::run_fixed_sequence(7, 24, 4_000).unwrap();
    assert_eq!(report.steps, 4_000);
    assert!(
        report.slot_ok > 1_000 && report.slot_ok < 4_000,
        "{report:?}"
    );
    assert!(
        report.queue_ok > 1_000 && report.queue_ok < 4_000,
        "{report:?}"
    );
}
