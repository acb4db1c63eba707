//! Scenario ports of vLLM 0.33.0's behaviour (`docs/vllm-behaviour.md`): C1, C3, C4, C5, C7,
//! C9, with its exact ids, victims, events and gauges. The bodies live in
//! `kvtier_tests::scenarios`, shared with the Cortex-M firmware (`tests/firmware`).

use kvtier_tests::scenarios;

#[test]
fn c1_lru_capacity_4_with_events() {
    scenarios::c1_lru_capacity_4_with_events();
}

#[test]
fn c1_metadata_only_event_keeps_only_keys_still_absent() {
    scenarios::c1_metadata_only_event_keeps_only_keys_still_absent();
}

#[test]
fn c3_prepare_load_keeps_key_order() {
    scenarios::c3_prepare_load_keeps_key_order();
}

#[test]
fn c4_usage_gauges_and_allocation_histogram() {
    scenarios::c4_usage_gauges_and_allocation_histogram();
}

#[test]
fn c4_through_the_stats_payload() {
    scenarios::c4_through_the_stats_payload();
}

#[test]
fn config_info_series() {
    scenarios::config_info_series();
}

#[test]
fn c4_zero_capacity_and_protected_failures_still_sample() {
    scenarios::c4_zero_capacity_and_protected_failures_still_sample();
}

#[test]
fn c5_stores_skipped() {
    scenarios::c5_stores_skipped();
}

#[test]
fn c7_evictable_count() {
    scenarios::c7_evictable_count();
}

#[test]
fn c9_lru_request_scoped_order() {
    scenarios::c9_lru_request_scoped_order();
}

#[test]
fn c9_request_rank_sorts_tails_first_while_in_flight() {
    scenarios::c9_request_rank_sorts_tails_first_while_in_flight();
}

#[test]
fn arc_policy_basics() {
    scenarios::arc_policy_basics();
}

/// The firmware's workload (`tests/firmware`) on the host: invariants hold throughout, the
/// pool fills, and the stream both hits and evicts (the firmware must print the same counts).
#[test]
fn workload_keeps_invariants_under_lru_and_arc() {
    use kvtier_core::manager::PolicyKind;
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        let (r, heap) = scenarios::workload(policy, 1024, 3000);
        assert_eq!(r.resident, 1024, "{policy}: {r:?}");
        assert!(r.hit_blocks > 0 && r.evicted_blocks > 0, "{policy}: {r:?}");
        assert!(
            r.stopped_at_pending > 0,
            "{policy}: two requests in flight share prefixes"
        );
        assert!(heap > 0);
    }
}
