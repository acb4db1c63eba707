//! Model-based proptests of the simple offloader: random call sequences on the module and on
//! `kvtier_tests::simple_model` (a restatement of vLLM 0.33.0's `manager.py`), for a dense
//! model and for a hybrid one (attention + Mamba in align mode), must agree on
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
        3 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(req, computed, hashed, take)| SimpleOp::Admit { req, computed, hashed, take }),
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
    hybrid: bool,
    ops: &[SimpleOp],
) -> Result<(), TestCaseError> {
    let mut w = World::with_layout(cpu, gpu, lazy, world, events, hybrid).expect("a valid config");
    for (i, o) in ops.iter().enumerate() {
        w.apply(o)
            .map_err(|e| TestCaseError::fail(format!("op {i} {o:?}: {e}")))?;
    }
    w.quiesce()
        .map_err(|e| TestCaseError::fail(format!("quiesce: {e}")))
}

/// A producer whose prompt's blocks and some of its states reach the CPU, then a request of
/// the same prompt family admitted with a hit taken (in part or whole), then random calls: the
/// paths of a hybrid hit (its Mamba state found, pinned, loaded or released).
fn hybrid_hit() -> impl Strategy<Value = Vec<SimpleOp>> {
    (
        0u8..6,
        prop::collection::vec(any::<u8>(), 1..6),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        prop::collection::vec(op(), 0..30),
    )
        .prop_map(|(blocks, states, computed, take, second, tail)| {
            let n = blocks % 6 + 1;
            let mut ops = vec![
                SimpleOp::Arrive {
                    template: 0,
                    blocks,
                },
                // Every block of its table hashed on the GPU (`hashed % (n + 1) = n`).
                SimpleOp::Alloc {
                    req: 0,
                    hashed: n,
                    take: 0,
                },
            ];
            // Steps of 8 tokens confirm its blocks; each hands off one of its states.
            for &p in &states {
                ops.push(SimpleOp::Step {
                    sched: 1,
                    advance: 2,
                    handoffs: vec![(0, p)],
                    preempt: 0,
                    finish: 0,
                });
                ops.push(SimpleOp::CompleteStore { which: 0, count: 1 });
            }
            ops.extend([
                SimpleOp::Step {
                    sched: 1,
                    advance: 2,
                    handoffs: Vec::new(),
                    preempt: 0,
                    finish: 0,
                },
                SimpleOp::CompleteStore { which: 0, count: 1 },
                SimpleOp::CompleteStore { which: 0, count: 1 },
                SimpleOp::Arrive {
                    template: 0,
                    blocks: second,
                },
                SimpleOp::Admit {
                    req: 0,
                    computed,
                    hashed: 0,
                    take,
                },
                SimpleOp::Step {
                    sched: 0,
                    advance: 0,
                    handoffs: Vec::new(),
                    preempt: 0,
                    finish: 0,
                },
            ]);
            ops.extend(tail);
            ops
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn eager_agrees_with_the_model(cpu in 2u32..10, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 24, false, world, events, false, &ops)?;
    }

    #[test]
    fn hybrid_eager_agrees_with_the_model(cpu in 2u32..12, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 40, false, world, events, true, &ops)?;
    }

    #[test]
    fn hybrid_hits_agree_with_the_model(cpu in 6u32..16, ops in hybrid_hit()) {
        run(cpu, 40, false, 1, true, true, &ops)?;
    }

    #[test]
    fn hybrid_lazy_agrees_with_the_model(cpu in 2u32..12, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 32, true, world, events, true, &ops)?;
    }

    #[test]
    fn lazy_agrees_with_the_model(cpu in 2u32..10, world in 1u32..3, events: bool, ops in prop::collection::vec(op(), 0..60)) {
        run(cpu, 16, true, world, events, false, &ops)?;
    }
}
