//! `stats_aggregate`: arbitrary pairs of payloads, built from the shared
//! `kvtier_tests::stats_model::StatsOp` updates and checked against the vLLM-dict model, then
//! aggregated. Aggregation never panics; it succeeds exactly when the model's does; a failed
//! aggregate leaves the payload unchanged; counters never wrap (each is the saturating sum of
//! its inputs, so never below either) and histogram counts only grow; the result round-trips
//! through the wire codec.
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::stats::histogram::MAX_BOUNDS;
use kvtier_core::stats::payload::{
    MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, MAX_LABELS, MAX_NAME_LEN,
};
use kvtier_core::stats::{Payload, Value, wire};
use kvtier_tests::stats_model::{ModelPayload, StatsOp, apply_to_payload, assert_matches};
use libfuzzer_sys::fuzz_target;

/// Updates per payload: two payloads stay far below `MAX_SERIES` together, so the model (which
/// has no series limit) and the payload agree.
const MAX_OPS: usize = 48;

#[derive(Arbitrary, Debug)]
struct Input {
    a: Vec<StatsOp>,
    b: Vec<StatsOp>,
}

/// The longest prefix of `s` within `max` bytes, cut on a character boundary.
fn cut(mut s: String, max: usize) -> String {
    while s.len() > max {
        s.pop();
    }
    s
}

/// Names from a small set (so kinds conflict and series merge) unless the raw name is longer
/// than one byte; labels and texts within the payload limits; histogram bounds strictly
/// ascending and at most `MAX_BOUNDS` (what `Histogram::new` accepts).
fn name(n: String) -> String {
    match n.len() {
        0 => "vllm:kv_offload_cpu_allocation_size".to_owned(),
        1 => n,
        _ => cut(n, MAX_NAME_LEN),
    }
}

fn labels(l: Vec<String>) -> Vec<String> {
    l.into_iter()
        .take(MAX_LABELS)
        .map(|s| cut(s, MAX_LABEL_LEN))
        .collect()
}

fn normalize(op: StatsOp) -> StatsOp {
    match op {
        StatsOp::Counter(n, l, by) => StatsOp::Counter(name(n), labels(l), by),
        StatsOp::Gauge(n, l, num, den) => StatsOp::Gauge(name(n), labels(l), num, den),
        StatsOp::Histogram(n, l, mut bounds, obs) => {
            bounds.sort_unstable();
            bounds.dedup();
            bounds.truncate(MAX_BOUNDS);
            StatsOp::Histogram(name(n), labels(l), bounds, obs)
        }
        StatsOp::Info(series) => StatsOp::Info(
            series
                .into_iter()
                .take(MAX_INFO_SERIES)
                .map(|s| {
                    s.into_iter()
                        .take(MAX_INFO_LABELS)
                        .map(|(k, v)| (cut(k, MAX_LABEL_LEN), v.map(|v| cut(v, MAX_LABEL_LEN))))
                        .collect()
                })
                .collect(),
        ),
    }
}

fn build(ops: Vec<StatsOp>) -> (Payload, ModelPayload) {
    let mut p = Payload::new();
    let mut m = ModelPayload::default();
    for op in ops.into_iter().take(MAX_OPS).map(normalize) {
        let before = p.clone();
        let applied = apply_to_payload(&mut p, &op);
        assert_eq!(applied, m.apply(&op), "{op:?}");
        if !applied {
            assert_eq!(p, before, "a rejected update changed the payload");
        }
    }
    assert_matches(&p, &m);
    (p, m)
}

fn round_trip(p: &Payload) {
    let bytes = wire::encode_to_vec(p);
    assert_eq!(bytes.len(), wire::encoded_len(p));
    assert!(bytes.len() <= wire::MAX_ENCODED_LEN);
    assert_eq!(wire::decode(&bytes).as_ref(), Ok(p), "wire round trip");
}

fuzz_target!(|input: Input| {
    let (mut pa, mut ma) = build(input.a);
    let (pb, mb) = build(input.b);
    round_trip(&pa);
    let before = pa.clone();
    let ok = pa.aggregate(&pb).is_ok();
    assert_eq!(
        ok,
        ma.aggregate(&mb),
        "aggregate accepted differently from the model"
    );
    if !ok {
        assert_eq!(pa, before, "a failed aggregate changed the payload");
        return;
    }
    assert_matches(&pa, &ma);
    for s in pa.series() {
        let labels: Vec<&str> = s.labels().iter().collect();
        let olds = [before.get(s.name(), &labels), pb.get(s.name(), &labels)];
        match s.value() {
            Value::Counter(total) => {
                let parts: Vec<u64> = olds
                    .iter()
                    .map(|v| match v {
                        Some(Value::Counter(c)) => *c,
                        _ => 0,
                    })
                    .collect();
                assert_eq!(
                    *total,
                    parts[0].saturating_add(parts[1]),
                    "{}: counter wrapped",
                    s.name()
                );
                assert!(
                    parts.iter().all(|p| p <= total),
                    "{}: counter went down",
                    s.name()
                );
            }
            Value::Histogram(h) => {
                for old in olds.iter().flatten() {
                    if let Value::Histogram(o) = old {
                        assert!(
                            h.count() >= o.count(),
                            "{}: histogram count went down",
                            s.name()
                        );
                        assert!(h.sum() >= o.sum(), "{}: histogram sum went down", s.name());
                    }
                }
            }
            _ => {}
        }
    }
    round_trip(&pa);
});
