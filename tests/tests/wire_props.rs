//! Property and edge tests of `stats::wire`: round trips, truncation, canonical-only decoding,
//! hostile bytes, and the exact bytes of a small payload.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_core::stats::catalogue::SIMPLE_SAVE_OUTCOMES;
use kvtier_core::stats::wire::{self, DecodeError, EncodeError};
use kvtier_core::stats::{Gauge, Payload};
use proptest::prelude::*;

#[path = "stats_strategies.rs"]
mod stats_strategies;
use stats_strategies::{ops, payload_of};

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
