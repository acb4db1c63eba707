//! Model-based proptests of the simple offloader: random call sequences on the module and on
//! `kvtier_tests::simple_model` (a restatement of vLLM 0.33.0's `manager.py`) must agree on
//! every answer, plan, drain, event and pool state; the invariants hold after every call
//! (outcomes sum to the hand-offs published, used ≥ 1, no block both free and pinned), and
//! nothing is pending once every transfer has completed.

use kvtier_tests::simple_ops::{SimpleOp, World};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = SimpleOp> {
    prop_oneof![
        2 => (any::<u8>(), any::<u8>()).prop_map(|(template, blocks)| SimpleOp::Arrive { template, blocks }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(req, computed)| SimpleOp::Lookup { req, computed }),
        3 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(req, hashed, take)| SimpleOp::Alloc { req, hashed, take }),
        4 => (any::<u8>(), any::<u8>(), prop::collection::vec((any::<u8>(), any::<u8>()), 0..4), any::<u8>(), any::<u8>())
            .prop_map(|(sched, advance, handoffs, p, f)| SimpleOp::Step {
                sched,
                advance,
                handoffs,
                preempt: p & p.rotate_left(3),
                finish: f & f.rotate_left(5),
            }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(which, count)| SimpleOp::CompleteStore { which, count }),
        1 => any::<u8>().prop_map(|mask| SimpleOp::CompleteLoad { mask }),
        2 => any::<u8>().prop_map(|req| SimpleOp::Finish { req }),
        1 => Just(SimpleOp::Reset),
        1 => Just(SimpleOp::Drain),
    ]
}

fn run(
    cpu: u32,
    gpu: u32,
    lazy: bool,
    world: u32,
    events: bool,
    ops: &[SimpleOp],
) -> Result<(), TestCaseError> {
    let mut w = World::new(cpu, gpu, lazy, world, events).expect("a valid config");
    for (i, o) in ops.iter().enumerate() {
        w.apply(o)
            .map_err(|e| TestCaseError::fail(format!("op {i} {o:?}: {e}")))?;
    }
    w.quiesce()
        .map_err(|e| TestCaseError::fail(format!("quiesce: {e}")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn eager_agrees_with_the_model(cpu in 2u32..10, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 24, false, world, events, &ops)?;
    }

    #[test]
    fn lazy_agrees_with_the_model(cpu in 2u32..10, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 16, true, world, events, &ops)?;
    }
}
