//! Property and edge tests of `stats::wire`: round trips, truncation, canonical-only decoding,
//! hostile bytes, and the exact bytes of a small payload.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::stats::catalogue::{
    ALLOCATION_SIZE_BOUNDS, CPU_ALLOCATION_SIZE, CPU_CACHE_READ_USAGE_PERC, CPU_CACHE_USAGE_PERC,
    CPU_CONFIG_INFO_LABELS, LOAD_BYTES, LOAD_SIZE, LOAD_TIME, SIMPLE_SAVE_OUTCOMES, STORES_SKIPPED,
    TRANSFER_SIZE_BOUNDS,
};
use kvtier_core::stats::wire::{self, DecodeError, EncodeError};
use kvtier_core::stats::{Gauge, Histogram, InfoSeries, InfoValue, Payload};
use kvtier_tests::stats_model::StatsOp;
use proptest::prelude::*;

use crate::stats_strategies::{self, ops, payload_of};

#[test]
fn exact_bytes_of_a_small_payload() {
    let mut p = Payload::new();
    p.increase_counter("c", &[], 300).unwrap();
    p.set_gauge("g", &["a"], Gauge::ratio(-1, 4).unwrap())
        .unwrap();
    let bytes = wire::encode_to_vec(&p);
    #[rustfmt::skip]
    let expected = [
        1,          // version
        2,          // two series
        1, b'c', 0, 1, // family "c", counter, one series
        0, 0xac, 0x02, // no labels, 300
        1, b'g', 1, 1, // family "g", gauge, one series
        1, 1, b'a', // one label "a"
        1, 4,       // zigzag(-1) = 1, denominator 4
        0,          // no info
    ];
    assert_eq!(bytes, expected);
    assert_eq!(wire::decode(&bytes).unwrap(), p);
}

#[test]
fn a_decoded_catalogue_payload_borrows_its_names() {
    let mut p = Payload::new();
    p.increase_counter(SIMPLE_SAVE_OUTCOMES, &["stored"], 1)
        .unwrap();
    let d = wire::decode(&wire::encode_to_vec(&p)).unwrap();
    let s = &d.series()[0];
    assert!(matches!(s.name_text(), std::borrow::Cow::Borrowed(_)));
}

/// `decode` and `decode_view` both reject `bytes` with `expected`.
fn both_reject(bytes: &[u8], expected: DecodeError) {
    assert_eq!(wire::decode(bytes), Err(expected), "decode of {bytes:x?}");
    assert_eq!(
        wire::decode_view(bytes).map(|v| v.len()),
        Err(expected),
        "decode_view of {bytes:x?}"
    );
}

/// `bytes` with the first occurrence of `from` replaced by `to`.
fn replaced(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the pattern occurs");
    [&bytes[..at], to, &bytes[at + from.len()..]].concat()
}

fn one_histogram(name: &'static str, bounds: &[u64], observations: &[u64]) -> Payload {
    let mut h = Histogram::new(bounds).unwrap();
    for o in observations {
        h.observe(*o);
    }
    let mut p = Payload::new();
    p.merge_histogram(name, &[], &h).unwrap();
    p
}

/// The decoder compares a catalogue family's bounds with their precomputed encoding in one
/// go; bytes that differ from it still go through every check.
#[test]
fn catalogue_bounds_that_differ_are_checked_one_by_one() {
    let p = one_histogram(LOAD_SIZE, &TRANSFER_SIZE_BOUNDS, &[3, 7_000_000]);
    let bytes = wire::encode_to_vec(&p);
    assert_eq!(wire::decode(&bytes).unwrap(), p);
    // 1_000_000 and 5_000_000 are the first two bounds, three bytes each.
    let first = [0xc0, 0x84, 0x3d];
    let second = [0xc0, 0x96, 0xb1, 0x02];
    assert!(bytes.windows(3).any(|w| w == first));
    // The two swapped: not ascending.
    let swapped = replaced(
        &bytes,
        &[&first[..], &second[..]].concat(),
        &[&second[..], &first[..]].concat(),
    );
    both_reject(&swapped, DecodeError::InvalidHistogram);
    // The first written over-long (a trailing zero byte).
    let long = replaced(&bytes, &first, &[0xc0, 0x84, 0xbd, 0x00]);
    both_reject(&long, DecodeError::NonCanonicalVarint);
    // Cut inside the bounds.
    let cut = bytes.windows(3).position(|w| w == first).unwrap() + 2;
    both_reject(&bytes[..cut], DecodeError::Truncated);
    // A catalogue name with another valid bound list is a valid payload.
    let other = one_histogram(LOAD_SIZE, &ALLOCATION_SIZE_BOUNDS, &[5]);
    let bytes = wire::encode_to_vec(&other);
    assert_eq!(wire::decode(&bytes).unwrap(), other);
    assert_eq!(wire::decode_view(&bytes).unwrap().len(), 1);
}

/// Bucket counts below 0x80 are passed eight at a time; a longer or over-long one among them
/// is still read and checked.
#[test]
fn bucket_counts_are_checked_past_the_eight_byte_run() {
    // 200 observations of 65536 in the ninth bucket (16384 < 65536 ≤ 65536): a two-byte count
    // after eight single-byte ones.
    let mut h = Histogram::new(&ALLOCATION_SIZE_BOUNDS).unwrap();
    h.observe_n(65_536, 200);
    let mut p = Payload::new();
    p.merge_histogram(CPU_ALLOCATION_SIZE, &[], &h).unwrap();
    let bytes = wire::encode_to_vec(&p);
    assert_eq!(wire::decode(&bytes).unwrap(), p);
    let counts = [0, 0, 0, 0, 0, 0, 0, 0, 0xc8, 0x01, 0, 0];
    assert!(bytes.windows(counts.len()).any(|w| w == counts));
    // The zero count of the first bucket written over-long, inside the first eight bytes.
    let long = replaced(
        &bytes,
        &counts,
        &[0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0xc8, 0x01, 0, 0],
    );
    both_reject(&long, DecodeError::NonCanonicalVarint);
    // The 200 written over-long, after the first eight.
    let long = replaced(
        &bytes,
        &counts,
        &[0, 0, 0, 0, 0, 0, 0, 0, 0xc8, 0x81, 0x00, 0, 0],
    );
    both_reject(&long, DecodeError::NonCanonicalVarint);
}

/// Family names are ordered by catalogue position when both are catalogue names and by bytes
/// otherwise; the two orders agree.
#[test]
fn catalogue_and_other_names_are_ordered_by_bytes() {
    let mut p = Payload::new();
    for name in [
        "a",
        STORES_SKIPPED,
        "vllm:kv_offload_z",
        SIMPLE_SAVE_OUTCOMES,
        "zz",
    ] {
        p.increase_counter(name, &[], 1).unwrap();
    }
    let bytes = wire::encode_to_vec(&p);
    assert_eq!(wire::decode(&bytes).unwrap(), p);
    let view = wire::decode_view(&bytes).unwrap();
    let names: Vec<&str> = view.series().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "a",
            STORES_SKIPPED,
            "vllm:kv_offload_z",
            SIMPLE_SAVE_OUTCOMES,
            "zz"
        ]
    );
    // Two adjacent families swapped: a catalogue name and another, then two catalogue names.
    let family = |name: &str| {
        let len = u8::try_from(name.len()).unwrap();
        [&[len][..], name.as_bytes(), &[0, 1, 0, 1]].concat()
    };
    let swap = |a: &str, b: &str| {
        replaced(
            &bytes,
            &[family(a), family(b)].concat(),
            &[family(b), family(a)].concat(),
        )
    };
    both_reject(
        &swap(STORES_SKIPPED, "vllm:kv_offload_z"),
        DecodeError::NotSorted,
    );
    both_reject(
        &swap("vllm:kv_offload_z", SIMPLE_SAVE_OUTCOMES),
        DecodeError::NotSorted,
    );
    both_reject(&swap("a", STORES_SKIPPED), DecodeError::NotSorted);
}

/// Known label texts are found by a hash of their length and last eight bytes: another text
/// with the same hash is compared in full, and checked as UTF-8.
#[test]
fn texts_like_known_ones_are_checked_in_full() {
    let mut p = Payload::new();
    p.increase_counter(SIMPLE_SAVE_OUTCOMES, &["skipped_already_cached"], 1)
        .unwrap();
    p.increase_counter(SIMPLE_SAVE_OUTCOMES, &["stored"], 2)
        .unwrap();
    let bytes = wire::encode_to_vec(&p);
    let d = wire::decode(&bytes).unwrap();
    assert_eq!(d, p);
    assert!(matches!(
        d.series()[0].labels().as_slice()[0],
        std::borrow::Cow::Borrowed(_)
    ));
    // Same length and last eight bytes, not UTF-8.
    let bad = replaced(
        &bytes,
        b"skipped_already_cached",
        b"\xffkipped_already_cached",
    );
    both_reject(&bad, DecodeError::InvalidUtf8);
    // Same length, a valid other text: decodes, owned.
    let other = replaced(&bytes, b"skipped_already_cached", b"Skipped_already_cached");
    let d = wire::decode(&other).unwrap();
    assert_eq!(
        d.series()[0].labels().as_slice()[0],
        "Skipped_already_cached"
    );
    assert!(matches!(
        d.series()[0].labels().as_slice()[0],
        std::borrow::Cow::Owned(_)
    ));
    // A short known text (its hash is the whole text) with one byte changed.
    let bad = replaced(&bytes, b"stored", b"stor\xffd");
    both_reject(&bad, DecodeError::InvalidUtf8);
}

/// The view checks info series without building them: unsorted or non-UTF-8 keys are still
/// rejected, exactly as `decode` rejects them.
#[test]
fn info_series_are_checked_by_the_view() {
    let mut p = Payload::new();
    let info = InfoSeries::new()
        .with(CPU_CONFIG_INFO_LABELS[0], InfoValue::Int(16_384))
        .and_then(|s| s.with(CPU_CONFIG_INFO_LABELS[1], InfoValue::Text("x".into())))
        .unwrap();
    p.set_info(vec![info]).unwrap();
    let bytes = wire::encode_to_vec(&p);
    let d = wire::decode(&bytes).unwrap();
    assert_eq!(d, p);
    assert!(wire::decode_view(&bytes).unwrap().has_info());
    // Keys sorted: "cpu_blocks_per_chunk" < "cpu_num_chunks". Rename the second to sort first.
    let unsorted = replaced(&bytes, b"cpu_num_chunks", b"cpu_aaa_chunks");
    both_reject(&unsorted, DecodeError::NotSorted);
    let bad = replaced(&bytes, b"cpu_num_chunks", b"cpu_num_chunk\xff");
    both_reject(&bad, DecodeError::InvalidUtf8);
    let bad_text = replaced(&bytes, &[4, 1, b'x'], &[4, 1, 0xff]);
    both_reject(&bad_text, DecodeError::InvalidUtf8);
}

/// The borrowed view and the owned decode agree on `bytes`: both accept it (with the same
/// series, name for name, label for label, value for value) or both reject it with the same
/// error.
fn view_agrees_with_decode(bytes: &[u8]) -> Result<(), TestCaseError> {
    match (wire::decode(bytes), wire::decode_view(bytes)) {
        (Ok(p), Ok(view)) => {
            prop_assert_eq!(view.len(), p.series().len());
            prop_assert_eq!(view.has_info(), p.info().is_some());
            let mut seen = 0;
            for (owned, lent) in p.series().iter().zip(view.series()) {
                prop_assert_eq!(owned.name(), lent.name);
                let labels: Vec<&str> = owned
                    .labels()
                    .as_slice()
                    .iter()
                    .map(AsRef::as_ref)
                    .collect();
                prop_assert_eq!(labels.as_slice(), lent.labels.as_slice());
                prop_assert_eq!(owned.value(), &lent.value.to_value());
                seen += 1;
            }
            prop_assert_eq!(seen, p.series().len());
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
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_view_agrees_with_decode(
        ops in ops(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = wire::encode_to_vec(&payload_of(&ops));
        view_agrees_with_decode(&bytes)?;
        let mut mutated = bytes.clone();
        let i = at.index(mutated.len());
        mutated[i] = byte;
        view_agrees_with_decode(&mutated)?;
        view_agrees_with_decode(&bytes[..cut.index(bytes.len())])?;
    }

    #[test]
    fn round_trip(ops in ops()) {
        let p = payload_of(&ops);
        let n = wire::encoded_len(&p);
        prop_assert!(n <= wire::MAX_ENCODED_LEN);
        let mut buf = vec![0u8; n + 3];
        prop_assert_eq!(wire::encode(&p, &mut buf), Ok(n));
        prop_assert_eq!(wire::decode(&buf[..n]), Ok(p.clone()));
        prop_assert_eq!(wire::encode_to_vec(&p), buf[..n].to_vec());
        prop_assert_eq!(
            wire::encode(&p, &mut buf[..n - 1]),
            Err(EncodeError::BufferTooSmall { needed: n, available: n - 1 })
        );
    }

    #[test]
    fn every_strict_prefix_is_truncated(ops in ops()) {
        let bytes = wire::encode_to_vec(&payload_of(&ops));
        for cut in 0..bytes.len() {
            prop_assert_eq!(wire::decode(&bytes[..cut]), Err(DecodeError::Truncated), "cut {}", cut);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_only_canonical_input_decodes(
        bytes in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        if let Ok(p) = wire::decode(&bytes) {
            prop_assert_eq!(wire::encode_to_vec(&p), bytes);
        }
    }

    #[test]
    fn mutated_encodings_are_rejected_unless_canonical(
        ops in ops(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = wire::encode_to_vec(&payload_of(&ops));
        let i = at.index(bytes.len());
        bytes[i] = byte;
        if let Ok(p) = wire::decode(&bytes) {
            prop_assert_eq!(wire::encode_to_vec(&p), bytes);
        }
    }

    #[test]
    fn non_canonical_forms_are_rejected(ops in ops(), extra in any::<u8>()) {
        let bytes = wire::encode_to_vec(&payload_of(&ops));
        let mut trailing = bytes.clone();
        trailing.push(extra);
        prop_assert_eq!(wire::decode(&trailing), Err(DecodeError::TrailingBytes));
        // The series total (byte 1, below 128 here) written as an over-long two-byte varint.
        prop_assume!(bytes[1] < 0x80);
        let mut long = bytes.clone();
        long[1] |= 0x80;
        long.insert(2, 0);
        prop_assert_eq!(wire::decode(&long), Err(DecodeError::NonCanonicalVarint));
    }
}

// Wide payloads, shaped to reach every path of the walk: names that share 8- and 16-byte
// prefixes (the word-at-a-time order and ASCII checks), non-ASCII names and labels, tuples of
// several labels, labels of 128 bytes and more (two-byte lengths), catalogue and other
// histogram bounds, and info series. Each payload's view must lend exactly the series `decode`
// builds; each mutated or cut copy must be rejected by both with the same error (or accepted
// by both with the same series).

fn wide_name() -> impl Strategy<Value = String> {
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

fn wide_label() -> impl Strategy<Value = String> {
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

fn wide_labels() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(wide_label(), 0..4)
}

fn wide_bounds() -> impl Strategy<Value = Vec<u64>> {
    prop::sample::select(vec![
        ALLOCATION_SIZE_BOUNDS.to_vec(),
        TRANSFER_SIZE_BOUNDS.to_vec(),
        vec![1, 10, 100],
        vec![5],
        vec![300, 1 << 20, 1 << 40],
    ])
}

/// One update of the wide payloads: every path of the wire walk (see `wide_name`).
fn wide_op() -> impl Strategy<Value = StatsOp> {
    stats_strategies::op_of(
        wide_name,
        wide_labels,
        wide_bounds(),
        prop::collection::vec(0..3_000_000u64, 0..12),
        "[a-z_é]{1,12}",
        5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn views_of_valid_payloads_lend_what_decode_builds(
        ops in prop::collection::vec(wide_op(), 0..40),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let p = payload_of(&ops);
        let bytes = wire::encode_to_vec(&p);
        prop_assert_eq!(wire::decode(&bytes), Ok(p));
        view_agrees_with_decode(&bytes)?;
        // One edit at a time, then all of them.
        let mut mutated = bytes.clone();
        for (at, byte) in &edits {
            let mut once = bytes.clone();
            let i = at.index(bytes.len());
            once[i] = *byte;
            view_agrees_with_decode(&once)?;
            mutated[i] = *byte;
        }
        view_agrees_with_decode(&mutated)?;
        view_agrees_with_decode(&bytes[..cut.index(bytes.len())])?;
    }
}
