//! Property tests of the stats payload against the vLLM-dict reference model
//! (`kvtier_tests::stats_model`): updates, `aggregate` (associative, latest gauge wins, info
//! survives, errors change nothing) and `reduce`.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::stats::Payload;
use kvtier_tests::stats_model::{ModelPayload, StatsOp, apply_to_payload, assert_matches};
use proptest::prelude::*;

use crate::stats_strategies::ops;

fn build(ops: &[StatsOp]) -> (Payload, ModelPayload) {
    let mut p = Payload::new();
    let mut m = ModelPayload::default();
    for op in ops {
        let before = p.clone();
        let applied = apply_to_payload(&mut p, op);
        assert_eq!(applied, m.apply(op), "{op:?}");
        if !applied {
            assert_eq!(p, before, "a rejected update changed the payload");
        }
    }
    (p, m)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn updates_and_reduce_match_the_model(ops in ops()) {
        let (p, m) = build(&ops);
        assert_matches(&p, &m);
        prop_assert_eq!(p.reduce(), m.reduce());
    }

    #[test]
    fn aggregate_matches_the_model_and_errors_change_nothing(a in ops(), b in ops()) {
        let (mut pa, mut ma) = build(&a);
        let (pb, mb) = build(&b);
        let before = pa.clone();
        let ok = pa.aggregate(&pb).is_ok();
        prop_assert_eq!(ok, ma.aggregate(&mb));
        if ok {
            assert_matches(&pa, &ma);
            prop_assert_eq!(pa.reduce(), ma.reduce());
        } else {
            prop_assert_eq!(pa, before);
        }
    }

    #[test]
    fn aggregate_is_associative(a in ops(), b in ops(), c in ops()) {
        let (pa, _) = build(&a);
        let (pb, _) = build(&b);
        let (pc, _) = build(&c);
        let mut left = pa.clone();
        let mut bc = pb.clone();
        let left_ok = left.aggregate(&pb).is_ok() && left.aggregate(&pc).is_ok();
        let mut right = pa.clone();
        let right_ok = bc.aggregate(&pc).is_ok() && right.aggregate(&bc).is_ok();
        if left_ok && right_ok {
            prop_assert_eq!(left, right);
        }
    }

    #[test]
    fn latest_gauge_wins_and_info_survives(a in ops(), b in ops()) {
        let (mut pa, _) = build(&a);
        let (pb, _) = build(&b);
        let info_before = pa.info().map(<[_]>::to_vec);
        if pa.aggregate(&pb).is_ok() {
            match pb.info() {
                Some(i) => prop_assert_eq!(pa.info(), Some(i)),
                None => prop_assert_eq!(pa.info().map(<[_]>::to_vec), info_before),
            }
            for s in pb.series() {
                if let kvtier_core::stats::Value::Gauge(g) = s.value() {
                    let l: Vec<&str> = s.labels().iter().collect();
                    prop_assert_eq!(pa.gauge(s.name(), &l), Some(*g));
                }
            }
            prop_assert!(!pa.is_empty() || pb.is_empty());
        }
    }
}
