//! Proptest strategies for stats payloads, shared by `stats_props` and `wire_props`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use kvtier_core::stats::Payload;
use kvtier_core::stats::catalogue::{
    ALLOCATION_SIZE_BOUNDS, CPU_ALLOCATION_SIZE, LOAD_BYTES, LOAD_TIME,
};
use kvtier_tests::stats_model::{StatsOp, apply_to_payload};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            LOAD_BYTES,
            LOAD_TIME,
            CPU_ALLOCATION_SIZE,
            "x",
            "y",
            "z:é"
        ])
        .prop_map(str::to_owned),
        "[a-z_:]{0,5}",
    ]
}

fn labels() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "a",
                "b",
                "stored",
                "skipped_already_cached",
                "it's",
                ""
            ])
            .prop_map(str::to_owned),
            "\\PC{0,3}",
        ],
        0..3,
    )
}

fn bounds() -> impl Strategy<Value = Vec<u64>> {
    prop::sample::select(vec![ALLOCATION_SIZE_BOUNDS.to_vec(), vec![1, 10, 100]])
}

/// One update, drawn from names and label tuples (`name` and `labels` make their strategies),
/// histogram `bounds` and `observations`; info series have fewer than `info_labels` labels,
/// named by the regex `info_name`.
pub fn op_of<N, L>(
    name: impl Fn() -> N,
    labels: impl Fn() -> L,
    bounds: impl Strategy<Value = Vec<u64>> + 'static,
    observations: impl Strategy<Value = Vec<u64>> + 'static,
    info_name: &'static str,
    info_labels: usize,
) -> impl Strategy<Value = StatsOp>
where
    N: Strategy<Value = String> + 'static,
    L: Strategy<Value = Vec<String>> + 'static,
{
    prop_oneof![
        4 => (name(), labels(), prop_oneof![0..1000u64, any::<u64>()])
            .prop_map(|(n, l, v)| StatsOp::Counter(n, l, v)),
        3 => (name(), labels(), 0..100u32, 0..100u32)
            .prop_map(|(n, l, a, b)| StatsOp::Gauge(n, l, a, b)),
        3 => (name(), labels(), bounds, observations)
            .prop_map(|(n, l, b, o)| StatsOp::Histogram(n, l, b, o)),
        1 => prop::collection::vec(
                prop::collection::vec((info_name, prop::option::of("\\PC{0,4}")), 0..info_labels),
                0..3,
            )
            .prop_map(StatsOp::Info),
    ]
}

/// One update.
pub fn op() -> impl Strategy<Value = StatsOp> {
    op_of(
        name,
        labels,
        bounds(),
        prop::collection::vec(0..300_000u64, 0..4),
        "[a-z_]{1,6}",
        4,
    )
}

/// Up to 12 updates.
pub fn ops() -> impl Strategy<Value = Vec<StatsOp>> {
    prop::collection::vec(op(), 0..12)
}

/// A payload built from `ops` (rejected updates skipped).
pub fn payload_of(ops: &[StatsOp]) -> Payload {
    let mut p = Payload::new();
    for op in ops {
        let _ = apply_to_payload(&mut p, op);
    }
    p
}
