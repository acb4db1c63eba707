//! Scenario ports of vLLM 0.33.0's free-queue tests (spec C13) plus the error cases kvtier adds
//! where vLLM raises or asserts.

use kvtier_core::allocator::{FreeQueue, PopError, PushError, QueueAllocError, RemoveError};

fn ids(q: &FreeQueue) -> Vec<u32> {
    q.iter().collect()
}

fn pop_n(q: &mut FreeQueue, n: u32) -> Result<Vec<u32>, PopError> {
    let mut out = Vec::new();
    q.pop_front_n(n, |id| out.push(id)).map(|()| out)
}

#[test]
fn c13_queue_of_five_popleft_remove_append() {
    let mut q = FreeQueue::new_full(5).unwrap();
    assert_eq!(q.pop_front(), Ok(0));
    assert_eq!(ids(&q), [1, 2, 3, 4]);
    q.remove(2).unwrap();
    assert_eq!(ids(&q), [1, 3, 4]);
    assert_eq!(q.len(), 3);
    q.push_back(2).unwrap();
    assert_eq!(ids(&q), [1, 3, 4, 2]);
    let popped: Vec<u32> = (0..4).map(|_| q.pop_front().unwrap()).collect();
    assert_eq!(popped, [1, 3, 4, 2]);
    let err = q.pop_front().unwrap_err();
    assert_eq!(
        err,
        PopError {
            requested: 1,
            available: 0
        }
    );
    assert!(err.to_string().starts_with("no free blocks available"));
    assert!(q.is_empty());
}

#[test]
fn c13_append_n_on_an_empty_queue() {
    let mut q = FreeQueue::new_empty(6).unwrap();
    assert_eq!(ids(&q), [] as [u32; 0]);
    q.push_back_n(&[]).unwrap();
    assert_eq!(q.len(), 0);
    q.push_back_n(&[0]).unwrap();
    assert_eq!(ids(&q), [0]);
    q.push_back_n(&[4, 5]).unwrap();
    assert_eq!(ids(&q), [0, 4, 5]);
    q.push_back_n(&[1, 2, 3]).unwrap();
    assert_eq!(ids(&q), [0, 4, 5, 1, 2, 3]);
    assert_eq!(q.len(), 6);
    assert_eq!((q.front(), q.back()), (Some(0), Some(3)));
}

#[test]
fn c13_prepend_n_keeps_order_ahead_of_the_head() {
    let mut q = FreeQueue::new_empty(6).unwrap();
    q.push_back(0).unwrap();
    q.push_front_n(&[4, 5]).unwrap();
    assert_eq!(ids(&q), [4, 5, 0]);
    q.push_front_n(&[1, 2]).unwrap();
    assert_eq!(ids(&q), [1, 2, 4, 5, 0]);
    assert_eq!(q.len(), 5);
    // prepend onto an empty queue
    let mut e = FreeQueue::new_empty(3).unwrap();
    e.push_front_n(&[2, 0]).unwrap();
    assert_eq!(ids(&e), [2, 0]);
}

#[test]
fn c13_popleft_n_in_order() {
    let mut q = FreeQueue::new_empty(6).unwrap();
    q.push_back_n(&[1, 3, 5, 4, 0, 2]).unwrap();
    assert_eq!(pop_n(&mut q, 0), Ok(vec![]));
    assert_eq!(q.len(), 6);
    assert_eq!(pop_n(&mut q, 1), Ok(vec![1]));
    assert_eq!(pop_n(&mut q, 2), Ok(vec![3, 5]));
    assert_eq!(pop_n(&mut q, 3), Ok(vec![4, 0, 2]));
    assert!(q.is_empty());
    assert_eq!(
        pop_n(&mut q, 1),
        Err(PopError {
            requested: 1,
            available: 0
        })
    );
}

#[test]
fn popleft_n_is_all_or_nothing() {
    let mut q = FreeQueue::new_full(4).unwrap();
    let before = q.clone();
    assert_eq!(
        pop_n(&mut q, 5),
        Err(PopError {
            requested: 5,
            available: 4
        })
    );
    assert_eq!(q, before);
    assert_eq!(pop_n(&mut q, 4), Ok(vec![0, 1, 2, 3]));
}

#[test]
fn remove_errors_change_nothing() {
    let mut q = FreeQueue::new_full(4).unwrap();
    q.remove(1).unwrap();
    let before = q.clone();
    assert_eq!(q.remove(1), Err(RemoveError::NotLinked { id: 1 }));
    assert_eq!(
        q.remove(4),
        Err(RemoveError::OutOfRange { id: 4, capacity: 4 })
    );
    assert_eq!(
        q.remove(u32::MAX),
        Err(RemoveError::OutOfRange {
            id: u32::MAX,
            capacity: 4
        })
    );
    assert_eq!(q, before);
    assert_eq!(ids(&q), [0, 2, 3]);
    assert_eq!(
        RemoveError::NotLinked { id: 1 }.to_string(),
        "cannot remove id 1: it is not in the free queue"
    );
}

#[test]
fn push_errors_are_checked_before_anything_changes() {
    let mut q = FreeQueue::new_empty(5).unwrap();
    q.push_back_n(&[3, 1]).unwrap();
    let before = q.clone();
    // Already queued: single and batch, front and back.
    assert_eq!(q.push_back(3), Err(PushError::AlreadyLinked { id: 3 }));
    assert_eq!(q.push_front(1), Err(PushError::AlreadyLinked { id: 1 }));
    assert_eq!(
        q.push_back_n(&[0, 2, 1]),
        Err(PushError::AlreadyLinked { id: 1 })
    );
    // Duplicates inside one batch.
    assert_eq!(
        q.push_front_n(&[0, 2, 0]),
        Err(PushError::Duplicate { id: 0 })
    );
    assert_eq!(q.push_back_n(&[4, 4]), Err(PushError::Duplicate { id: 4 }));
    // Out of range: the first offending id in slice order is reported.
    assert_eq!(
        q.push_back_n(&[0, 7, 3]),
        Err(PushError::OutOfRange { id: 7, capacity: 5 })
    );
    assert_eq!(
        q.push_front_n(&[3, 9]),
        Err(PushError::AlreadyLinked { id: 3 })
    );
    assert_eq!(q, before);
    assert_eq!(ids(&q), [3, 1]);
    // And afterwards the ids rejected above are still pushable.
    q.push_front_n(&[0, 2]).unwrap();
    q.push_back(4).unwrap();
    assert_eq!(ids(&q), [0, 2, 3, 1, 4]);
}

#[test]
fn contains_and_iter_after_cursor() {
    let mut q = FreeQueue::new_empty(8).unwrap();
    q.push_back_n(&[5, 2, 7, 0]).unwrap();
    assert!(q.contains(7));
    assert!(!q.contains(1));
    assert!(!q.contains(8));
    assert_eq!(q.iter_after(None).collect::<Vec<_>>(), [5, 2, 7, 0]);
    assert_eq!(q.iter_after(Some(5)).collect::<Vec<_>>(), [2, 7, 0]);
    assert_eq!(q.iter_after(Some(7)).collect::<Vec<_>>(), [0]);
    assert_eq!(q.iter_after(Some(0)).count(), 0);
    // A cursor that is not queued (or out of range) has no successor: nothing.
    assert_eq!(q.iter_after(Some(1)).count(), 0);
    assert_eq!(q.iter_after(Some(100)).count(), 0);
    assert_eq!((&q).into_iter().count(), 4);
}

#[test]
fn construction_sizes_and_degenerate_capacities() {
    let full = FreeQueue::new_full(3).unwrap();
    assert_eq!((full.capacity(), full.len()), (3, 3));
    assert_eq!(ids(&full), [0, 1, 2]);
    assert_eq!(full.heap_bytes(), 2 * 4 * 4);
    let one = FreeQueue::new_full(1).unwrap();
    assert_eq!(ids(&one), [0]);
    let mut zero = FreeQueue::new_full(0).unwrap();
    assert!(zero.is_empty());
    assert_eq!(
        zero.push_front_n(&[0]),
        Err(PushError::OutOfRange { id: 0, capacity: 0 })
    );
    assert_eq!(
        QueueAllocError { capacity: 7 }.to_string(),
        "cannot allocate a free queue of 7 ids: out of memory or address space"
    );
}

#[test]
fn no_reallocation_after_construction() {
    let mut q = FreeQueue::new_full(1000).unwrap();
    let bytes = q.heap_bytes();
    let mut popped = Vec::new();
    q.pop_front_n(1000, |id| popped.push(id)).unwrap();
    popped.reverse();
    q.push_front_n(&popped[..500]).unwrap();
    q.push_back_n(&popped[500..]).unwrap();
    for id in (0..1000).step_by(3) {
        q.remove(id).unwrap();
        q.push_back(id).unwrap();
    }
    assert_eq!(q.len(), 1000);
    assert_eq!(q.heap_bytes(), bytes);
}
