//! The borrowed view against the owned decode on many payloads shaped to reach every path of
//! the walk: names that share 8- and 16-byte prefixes (the word-at-a-time order and ASCII
//! checks), non-ASCII names and labels, tuples of several labels, labels of 128 bytes and more
//! (two-byte lengths), catalogue and other histogram bounds, and info series. Each payload's
//! view must lend exactly the series `decode` builds; each mutated or cut copy must be rejected
//! by both with the same error (or accepted by both with the same series).
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::stats::catalogue::{
    ALLOCATION_SIZE_BOUNDS, CPU_ALLOCATION_SIZE, CPU_CACHE_READ_USAGE_PERC, CPU_CACHE_USAGE_PERC,
    LOAD_BYTES, LOAD_SIZE, LOAD_TIME, SIMPLE_SAVE_OUTCOMES, TRANSFER_SIZE_BOUNDS,
};
use kvtier_core::stats::wire;
use kvtier_tests::stats_model::{StatsOp, apply_to_payload};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            LOAD_BYTES,
            LOAD_TIME,
            LOAD_SIZE,
            CPU_ALLOCATION_SIZE,
            CPU_CACHE_USAGE_PERC,
            CPU_CACHE_READ_USAGE_PERC,
            SIMPLE_SAVE_OUTCOMES,
            "vllm:kv_offload_",
            "vllm:kv_offload_é",
            "vllm:kv_offload_zzzzzzzzzzzzzzzz",
            "vllm:kv_éoffload_x",
            "vllm:kv",
            "vllm:kv_offlo",
        ])
        .prop_map(str::to_owned),
        // Shared prefixes of one and two words, then a short or long tail.
        ("[a-c]{0,3}", "[a-z_:é]{0,20}").prop_map(|(a, b)| format!("vllm:kv_{a}{b}")),
        "[a-z_:]{0,12}",
        "\\PC{0,6}",
    ]
}

fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "a",
            "stored",
            "skipped_already_cached",
            "external_unspecified",
            "éé",
        ])
        .prop_map(str::to_owned),
        "[a-c]{0,10}",
        "\\PC{0,4}",
        // Two-byte lengths.
        (126..140usize, "[a-b]").prop_map(|(n, c)| c.repeat(n)),
    ]
}

fn labels() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(label(), 0..4)
}

fn bounds() -> impl Strategy<Value = Vec<u64>> {
    prop::sample::select(vec![
        ALLOCATION_SIZE_BOUNDS.to_vec(),
        TRANSFER_SIZE_BOUNDS.to_vec(),
        vec![1, 10, 100],
        vec![5],
        vec![300, 1 << 20, 1 << 40],
    ])
}

fn op() -> impl Strategy<Value = StatsOp> {
    prop_oneof![
        4 => (name(), labels(), prop_oneof![0..1000u64, any::<u64>()])
            .prop_map(|(n, l, v)| StatsOp::Counter(n, l, v)),
        3 => (name(), labels(), 0..100u32, 0..100u32)
            .prop_map(|(n, l, a, b)| StatsOp::Gauge(n, l, a, b)),
        3 => (name(), labels(), bounds(), prop::collection::vec(0..3_000_000u64, 0..12))
            .prop_map(|(n, l, b, o)| StatsOp::Histogram(n, l, b, o)),
        1 => prop::collection::vec(
                prop::collection::vec(("[a-z_é]{1,12}", prop::option::of("\\PC{0,4}")), 0..5),
                0..3,
            )
            .prop_map(StatsOp::Info),
    ]
}

/// `decode` and `decode_view` agree on `bytes`.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    match (wire::decode(bytes), wire::decode_view(bytes)) {
        (Ok(p), Ok(view)) => {
            prop_assert_eq!(view.len(), p.series().len());
            prop_assert_eq!(view.has_info(), p.info().is_some());
            let lent: Vec<_> = view.series().collect();
            prop_assert_eq!(lent.len(), p.series().len());
            for (owned, lent) in p.series().iter().zip(&lent) {
                prop_assert_eq!(owned.name(), lent.name);
                prop_assert!(owned.labels().iter().eq(lent.labels.iter().copied()));
                prop_assert_eq!(owned.value(), &lent.value.to_value());
            }
        }
        (Err(a), Err(b)) => prop_assert_eq!(a, b),
        (a, b) => prop_assert!(
            false,
            "decode {:?} but decode_view {:?}",
            a.map(|_| ()),
            b.map(|_| ())
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn views_of_valid_payloads_lend_what_decode_builds(
        ops in prop::collection::vec(op(), 0..40),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut p = kvtier_core::stats::Payload::new();
        for op in &ops {
            let _ = apply_to_payload(&mut p, op);
        }
        let bytes = wire::encode_to_vec(&p);
        prop_assert_eq!(wire::decode(&bytes), Ok(p));
        agree(&bytes)?;
        // One edit at a time, then all of them.
        let mut mutated = bytes.clone();
        for (at, byte) in &edits {
            let mut once = bytes.clone();
            let i = at.index(bytes.len());
            once[i] = *byte;
            agree(&once)?;
            mutated[i] = *byte;
        }
        agree(&mutated)?;
        agree(&bytes[..cut.index(bytes.len())])?;
    }
}
