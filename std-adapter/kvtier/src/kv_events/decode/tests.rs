//! The decoder's rules one by one, and the corpus of hostile payloads with vLLM 0.33.0's
//! decoder's answers (`tests/data/kv_events/decoder-corpus.tsv`, checked against vLLM by the
//! Python suite's `test_kv_events_decoder.py`).

use std::fmt::Write as _;

use rmpv::Value;

use super::{DecodeError, MAX_DEPTH, decode};
use crate::kv_events::{BlockHash, EventBatch, Int, KvEvent, encode};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// msgpack bytes of `v`.
fn mp(v: &Value) -> Vec<u8> {
    let mut b = Vec::new();
    rmpv::encode::write_value(&mut b, v).expect("a Vec takes any write");
    b
}

fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect(),
    )
}

fn batch(events: Vec<Value>, rest: &[Value]) -> Vec<u8> {
    let mut items = vec![Value::F64(1.5), Value::Array(events)];
    items.extend_from_slice(rest);
    mp(&Value::Array(items))
}

fn removed(extra: &[(&str, Value)]) -> Value {
    let mut pairs = vec![
        ("type", Value::from("BlockRemoved")),
        ("block_hashes", Value::Array(vec![Value::from(5)])),
        ("medium", Value::from("CPU")),
    ];
    pairs.extend_from_slice(extra);
    map(&pairs)
}

fn stored(extra: &[(&str, Value)]) -> Value {
    let mut pairs = vec![
        ("type", Value::from("BlockStored")),
        ("block_hashes", Value::Array(vec![Value::from(-1)])),
        ("parent_block_hash", Value::from(i64::MIN)),
        (
            "token_ids",
            Value::Array(vec![Value::from(-7), Value::from(u64::MAX)]),
        ),
        ("block_size", Value::from(-16)),
        ("lora_id", Value::Nil),
        ("medium", Value::Nil),
        ("lora_name", Value::Nil),
    ];
    pairs.extend_from_slice(extra);
    map(&pairs)
}

fn one(bytes: &[u8]) -> KvEvent {
    let mut b = decode(bytes).expect("accepted");
    assert_eq!(b.events.len(), 1);
    b.events.remove(0)
}

#[test]
fn integers_take_msgpacks_whole_range() {
    let KvEvent::Stored(s) = one(&batch(vec![stored(&[])], &[])) else {
        panic!("a store");
    };
    assert_eq!(s.block_hashes, [BlockHash::Int(-1)]);
    assert_eq!(
        s.parent_block_hash,
        Some(BlockHash::Int(Int::from(i64::MIN)))
    );
    assert_eq!(s.token_ids, [-7, Int::from(u64::MAX)]);
    assert_eq!(s.block_size, -16);
    let b = decode(&batch(vec![], &[Value::from(u64::MAX)])).expect("accepted");
    assert_eq!(b.data_parallel_rank, Some(Int::from(u64::MAX)));
    // Re-encoded as msgspec writes them: signed markers below zero only.
    let again = encode(&decode(&batch(vec![stored(&[])], &[Value::from(0)])).unwrap());
    assert_eq!(decode(&again).unwrap().events[0], KvEvent::Stored(s));
    // Never a float, a bool or nil where vLLM types an int.
    for v in [Value::F64(16.0), Value::Boolean(true), Value::Nil] {
        let bytes = batch(vec![stored(&[("block_size", v)])], &[]);
        assert!(matches!(
            decode(&bytes),
            Err(DecodeError::Field {
                field: "block_size",
                ..
            })
        ));
    }
}

#[test]
fn batches_of_two_or_more_items() {
    assert_eq!(
        decode(&batch(vec![], &[])).unwrap().data_parallel_rank,
        None
    );
    let four = batch(vec![], &[Value::from(2), Value::from("ignored")]);
    assert_eq!(decode(&four).unwrap().data_parallel_rank, Some(2));
    // An extra item is read (it must be msgpack) but its text is not checked.
    let mut bad_text = batch(vec![], &[Value::from(2)]);
    bad_text[0] = 0x94;
    bad_text.extend_from_slice(&[0xa1, 0xff]);
    assert!(decode(&bad_text).is_ok());
    let mut cut = bad_text.clone();
    cut[0] = 0x95;
    assert!(matches!(decode(&cut), Err(DecodeError::Malformed { .. })));
    assert_eq!(
        decode(&mp(&Value::Array(vec![Value::F64(1.0)]))),
        Err(DecodeError::Batch)
    );
}

#[test]
fn the_first_type_names_the_kind_and_later_ones_must_repeat_it() {
    let again = removed(&[("type", Value::from("BlockRemoved"))]);
    assert!(matches!(one(&batch(vec![again], &[])), KvEvent::Removed(_)));
    let other = removed(&[("type", Value::from("AllBlocksCleared"))]);
    let err = decode(&batch(vec![other], &[])).unwrap_err();
    assert!(
        matches!(err, DecodeError::Field { field: "type", .. }),
        "{err}"
    );
    // The tag need not come first.
    let Value::Map(mut pairs) = removed(&[]) else {
        unreachable!()
    };
    pairs.rotate_left(1);
    assert!(matches!(
        one(&batch(vec![Value::Map(pairs)], &[])),
        KvEvent::Removed(_)
    ));
    let missing = map(&[("medium", Value::Nil)]);
    assert_eq!(
        decode(&batch(vec![missing], &[])),
        Err(DecodeError::Missing {
            event: 0,
            field: "type"
        })
    );
}

#[test]
fn a_repeated_field_keeps_its_last_value_and_unknown_keys_are_skipped() {
    let twice = removed(&[("group_idx", Value::from(1)), ("group_idx", Value::from(2))]);
    let KvEvent::Removed(r) = one(&batch(vec![twice], &[])) else {
        panic!("a removal");
    };
    assert_eq!(r.group_idx, Some(2));
    // Each value is still checked.
    let bad_first = removed(&[
        ("group_idx", Value::from("x")),
        ("group_idx", Value::from(2)),
    ]);
    assert!(decode(&batch(vec![bad_first], &[])).is_err());
    // An unknown key's value is skipped without reading its text; its key is a str.
    let mut bytes = batch(vec![removed(&[("zz", Value::from("ab"))])], &[]);
    let at = bytes.len() - 2;
    bytes[at..].copy_from_slice(&[0xff, 0xfe]);
    assert!(decode(&bytes).is_ok());
    let int_key = Value::Map(vec![
        (Value::from("type"), Value::from("AllBlocksCleared")),
        (Value::from(1), Value::Nil),
    ]);
    let err = decode(&batch(vec![int_key], &[])).unwrap_err();
    assert_eq!(err.to_string(), "event 0: `key` takes str, not int");
    // Fields of another kind are unknown keys here.
    let cleared = map(&[
        ("type", Value::from("AllBlocksCleared")),
        ("medium", Value::from(5)),
    ]);
    assert_eq!(one(&batch(vec![cleared], &[])), KvEvent::AllCleared);
}

#[test]
fn extra_keys_are_read_as_python_values() {
    let ek = |item: Value| {
        let s = stored(&[("extra_keys", Value::Array(vec![Value::Array(vec![item])]))]);
        decode(&batch(vec![s], &[])).map(|mut b| match b.events.remove(0) {
            KvEvent::Stored(s) => s.extra_keys,
            _ => unreachable!(),
        })
    };
    let item = |v: Value| Some(Value::Array(vec![Value::Array(vec![v])]));
    assert_eq!(ek(Value::F32(2.5)), Ok(item(Value::F64(2.5))));
    // A dict: 1, 1.0 and true are one key, in the first one's place with the last value.
    let keys = Value::Map(vec![
        (Value::from(1), Value::from("a")),
        (Value::from("x"), Value::Nil),
        (Value::F64(1.0), Value::from("b")),
        (Value::Boolean(true), Value::from("c")),
    ]);
    let want = Value::Map(vec![
        (Value::from(1), Value::from("c")),
        (Value::from("x"), Value::Nil),
    ]);
    assert_eq!(ek(keys), Ok(item(want)));
    assert!(ek(Value::Map(vec![(Value::Map(vec![]), Value::Nil)])).is_err());
    let tuple_key = Value::Array(vec![Value::Array(vec![])]);
    assert!(ek(Value::Map(vec![(tuple_key, Value::Nil)])).is_ok());
    // A timestamp: rounded to microseconds, in its narrowest form; outside datetime's range refused.
    let ts64 = |secs: u64, nanos: u64| Value::Ext(-1, ((nanos << 34) | secs).to_be_bytes().into());
    assert_eq!(
        ek(ts64(5, 1500)),
        Ok(item(Value::Ext(
            -1,
            ((2000u64 << 34) | 5).to_be_bytes().into()
        )))
    );
    assert_eq!(
        ek(ts64(5, 499)),
        Ok(item(Value::Ext(-1, 5u32.to_be_bytes().into())))
    );
    assert!(ek(ts64(5, 1_000_000_000)).is_err());
    let mut ts96 = 0u32.to_be_bytes().to_vec();
    ts96.extend_from_slice(&253_402_300_800i64.to_be_bytes());
    assert!(ek(Value::Ext(-1, ts96)).is_err());
    assert!(ek(Value::Ext(-1, vec![0; 3])).is_err());
    assert_eq!(ek(Value::Ext(7, vec![1])), Ok(item(Value::Ext(7, vec![1]))));
    // Not an array of arrays.
    assert!(ek(Value::Nil).is_ok());
    let s = stored(&[("extra_keys", Value::Array(vec![Value::from(5)]))]);
    assert!(decode(&batch(vec![s], &[])).is_err());
}

#[test]
fn hostile_lengths_and_depths_cost_nothing() {
    // Claims of 4 G items or bytes in a few bytes: refused, nothing allocated up front.
    let claims: [&[u8]; 4] = [
        &[0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x92, 0x00, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff],
        &[0x93, 0x00, 0x90, 0xdb, 0xff, 0xff, 0xff, 0xff],
        &[0x93, 0x00, 0x90, 0xc6, 0xff, 0xff, 0xff, 0xff],
    ];
    for b in claims {
        assert!(
            matches!(decode(b), Err(DecodeError::Malformed { .. })),
            "{b:?}"
        );
    }
    // The batch's array and MAX_DEPTH more in its fourth item: one too many.
    let mut deep = vec![0x94, 0x00, 0x90, 0x00];
    deep.extend(std::iter::repeat_n(0x91, MAX_DEPTH));
    deep.push(0x00);
    assert!(matches!(
        decode(&deep),
        Err(DecodeError::Malformed {
            problem: "nested deeper than the decoder's limit",
            ..
        })
    ));
    deep.drain(4..5);
    assert!(decode(&deep).is_ok());
    assert!(matches!(
        decode(&[0xc1]),
        Err(DecodeError::Malformed { offset: 0, .. })
    ));
}

#[test]
fn a_big_map_decodes_in_linear_time() {
    // 200,000 distinct keys and as many repeats: a dict's cost, not a list's.
    let n = 200_000;
    let pairs = (0..2 * n)
        .map(|i| (Value::from(i % n), Value::from(i)))
        .collect();
    let s = stored(&[(
        "extra_keys",
        Value::Array(vec![Value::Array(vec![Value::Map(pairs)])]),
    )]);
    let start = std::time::Instant::now();
    let KvEvent::Stored(s) = one(&batch(vec![s], &[])) else {
        panic!("a store");
    };
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    let Some(Value::Array(ek)) = s.extra_keys else {
        panic!("extra keys");
    };
    let Value::Array(item) = &ek[0] else {
        panic!("a tuple");
    };
    let Value::Map(m) = &item[0] else {
        panic!("a map");
    };
    assert_eq!(m.len(), n as usize);
    assert_eq!(m[7], (Value::from(7), Value::from(n + 7)));
}

#[test]
fn matches_vllm_on_the_corpus() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/kv_events/decoder-corpus.tsv"
    );
    let text = std::fs::read_to_string(path).expect("the corpus");
    let mut rows = 0;
    let mut wrong = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let [name, verdict, payload, again] = line.split('\t').collect::<Vec<_>>()[..] else {
            panic!("a corpus line of 4 fields: {line}");
        };
        rows += 1;
        let got = decode(&unhex(payload));
        let ok = match (&got, verdict) {
            (Ok(b), "accept") => hex(&encode(b)) == again,
            (Err(_), "reject") => true,
            _ => false,
        };
        if !ok {
            wrong.push(format!(
                "{name}: vLLM {verdict}s, kvtier {:?}",
                got.map(|b| hex(&encode(&b)))
            ));
        }
    }
    assert!(rows > 500, "{rows} payloads");
    assert!(
        wrong.is_empty(),
        "{} of {rows} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn decoded_batches_re_encode_to_msgspec_bytes() {
    let b = EventBatch {
        ts: 0.5,
        events: vec![one(&batch(vec![stored(&[])], &[]))],
        data_parallel_rank: Some(-1),
    };
    assert_eq!(decode(&encode(&b)), Ok(b));
}
