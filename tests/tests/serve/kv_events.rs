//! The KV-events stream: the codec against payloads vLLM's encoder wrote
//! (`tests/data/kv_events/`), hostile payloads, a round trip over generated batches, vLLM's
//! endpoint rules, the translation of the manager's events, and the publisher over a real
//! socket (the sequence, the replay socket's answers, the high-water mark, bad endpoints).

use std::time::Duration;

use kvtier::kv_events::{
    BlockHash, BlockRemoved, BlockStored, END_SEQ, EndpointProblem, EventBatch, HashForm, Int,
    KvEvent, MEDIUM_CPU, PublishError, Publisher, PublisherConfig, ReplayBuffer, TierEvents,
    decode, encode, is_bind_endpoint, offset_endpoint, start_sequence,
};
use kvtier_core::BlockKey;
use kvtier_core::manager::{EventKind, OffloadEvent};
use kvtier_tests::kv_events::{batch, ipc, read, subscribed};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/data/kv_events/{name}", env!("CARGO_MANIFEST_DIR"));
    let hex = std::fs::read_to_string(path).expect("fixture");
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn stored(hashes: Vec<BlockHash>, block_size: u64, medium: Option<&str>) -> BlockStored {
    BlockStored::new(hashes, block_size, medium.map(str::to_owned))
}

fn cpu_tier_batch() -> EventBatch {
    let mut s = stored(
        [5, u64::MAX, 200, 70_000, 1 << 33]
            .map(|h| BlockHash::Int(h.into()))
            .to_vec(),
        16,
        Some(MEDIUM_CPU),
    );
    s.group_idx = Some(0);
    EventBatch {
        ts: 1.5,
        events: vec![
            KvEvent::Stored(Box::new(s)),
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![BlockHash::Int(5)],
                medium: Some(MEDIUM_CPU.into()),
                group_idx: Some(0),
                locality: None,
                ownership: None,
            }),
        ],
        data_parallel_rank: None,
    }
}

fn every_field_batch() -> EventBatch {
    let sha = BlockHash::Bytes((0..32).collect());
    let s = BlockStored {
        block_hashes: vec![sha.clone(), BlockHash::Bytes(vec![0])],
        parent_block_hash: Some(sha.clone()),
        token_ids: vec![1 << 40],
        block_size: 65_536,
        lora_id: Some(-1),
        medium: Some("STORAGE".into()),
        lora_name: Some("adapter".into()),
        extra_keys: Some(rmpv::Value::Array(vec![
            rmpv::Value::Array(vec!["adapter".into(), "img".into(), 0.into()]),
            rmpv::Value::Nil,
        ])),
        group_idx: Some(70_000),
        kv_cache_spec_kind: Some("full_attention".into()),
        kv_cache_spec_sliding_window: Some(128),
        locality: Some("LOCAL".into()),
        ownership: Some("tier2".into()),
        session_id: Some("s1".into()),
        lookahead_token_ids: Some(vec![vec![1, 2], vec![3]]),
    };
    EventBatch {
        ts: 1_700_000_000.25,
        events: vec![
            KvEvent::Stored(Box::new(s)),
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![sha],
                medium: None,
                group_idx: Some(1),
                locality: Some("REMOTE".into()),
                ownership: Some("tier2".into()),
            }),
            KvEvent::AllCleared,
        ],
        data_parallel_rank: Some(3),
    }
}

#[test]
fn encodes_as_vllm_byte_for_byte() {
    assert_eq!(encode(&cpu_tier_batch()), fixture("cpu-tier.msgpack.hex"));
    assert_eq!(
        encode(&every_field_batch()),
        fixture("every-field.msgpack.hex")
    );
}

#[test]
fn decodes_what_vllm_wrote() {
    assert_eq!(
        decode(&fixture("cpu-tier.msgpack.hex")),
        Ok(cpu_tier_batch())
    );
    assert_eq!(
        decode(&fixture("every-field.msgpack.hex")),
        Ok(every_field_batch())
    );
}

#[test]
fn decode_refuses_what_is_not_a_batch() {
    let good = fixture("cpu-tier.msgpack.hex");
    for cut in [0, 1, 5, good.len() / 2, good.len() - 1] {
        assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert_eq!(
        decode(&trailing).unwrap_err().to_string(),
        "1 bytes after the batch"
    );
    // An array claiming 2^32 - 1 items in 5 bytes costs no memory and is refused.
    assert!(decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    // Nested past the depth limit.
    assert!(decode(&[0x91; 40]).is_err());
    // An unknown tag, a missing required field, a wrong type.
    let unknown = [
        0x92, 0x00, 0x91, 0x81, 0xa4, b't', b'y', b'p', b'e', 0xa1, b'X',
    ];
    assert_eq!(
        decode(&unknown).unwrap_err().to_string(),
        "event 0: `type` takes BlockStored, BlockRemoved or AllBlocksCleared, not another name"
    );
    let mut no_medium = rmpv::Value::Map(vec![
        ("type".into(), "BlockRemoved".into()),
        ("block_hashes".into(), rmpv::Value::Array(vec![])),
    ]);
    let bytes = |v: &rmpv::Value| {
        let batch = rmpv::Value::Array(vec![0.into(), rmpv::Value::Array(vec![v.clone()])]);
        let mut b = Vec::new();
        rmpv::encode::write_value(&mut b, &batch).expect("vec");
        b
    };
    assert_eq!(
        decode(&bytes(&no_medium)).unwrap_err().to_string(),
        "event 0: the required `medium` is missing"
    );
    if let rmpv::Value::Map(m) = &mut no_medium {
        m.push(("medium".into(), 3.into()));
    }
    assert!(decode(&bytes(&no_medium)).is_err());
    // A batch of two items (no rank) and integer timestamps read as msgspec reads them.
    let two = [0x92, 0x07, 0x90];
    assert_eq!(
        decode(&two),
        Ok(EventBatch {
            ts: 7.0,
            events: vec![],
            data_parallel_rank: None
        })
    );
}

/// Any msgpack integer: what msgspec's `int` takes.
fn int() -> impl Strategy<Value = Int> {
    prop_oneof![
        any::<i64>().prop_map(Int::from),
        any::<u64>().prop_map(Int::from),
    ]
}

fn hash() -> impl Strategy<Value = BlockHash> {
    prop_oneof![
        int().prop_map(BlockHash::Int),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(BlockHash::Bytes),
    ]
}

fn opt_str() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("[a-zA-Z0-9_]{0,40}")
}

fn event() -> impl Strategy<Value = KvEvent> {
    let stored = (
        proptest::collection::vec(hash(), 0..5),
        proptest::option::of(hash()),
        proptest::collection::vec(int(), 0..5),
        int(),
        proptest::option::of(int()),
        opt_str(),
        opt_str(),
        (
            proptest::option::of(int()),
            opt_str(),
            proptest::option::of(int()),
            opt_str(),
            opt_str(),
            opt_str(),
            proptest::option::of(proptest::collection::vec(
                proptest::collection::vec(int(), 0..3),
                0..3,
            )),
        ),
    )
        .prop_map(
            |(h, p, t, bs, lora, medium, name, (g, kind, win, loc, own, sess, la))| {
                KvEvent::Stored(Box::new(BlockStored {
                    block_hashes: h,
                    parent_block_hash: p,
                    token_ids: t,
                    block_size: bs,
                    lora_id: lora,
                    medium,
                    lora_name: name,
                    extra_keys: None,
                    group_idx: g,
                    kv_cache_spec_kind: kind,
                    kv_cache_spec_sliding_window: win,
                    locality: loc,
                    ownership: own,
                    session_id: sess,
                    lookahead_token_ids: la,
                }))
            },
        );
    let removed = (
        proptest::collection::vec(hash(), 0..5),
        opt_str(),
        proptest::option::of(int()),
        opt_str(),
        opt_str(),
    )
        .prop_map(|(h, medium, g, loc, own)| {
            KvEvent::Removed(BlockRemoved {
                block_hashes: h,
                medium,
                group_idx: g,
                locality: loc,
                ownership: own,
            })
        });
    prop_oneof![stored, removed, Just(KvEvent::AllCleared)]
}

proptest! {
    /// decode(encode(b)) is b, for batches over every field's range (the reference model
    /// is the batch itself); and decoding never panics on arbitrary bytes.
    #[test]
    fn encode_then_decode_is_identity(
        ts in any::<f64>().prop_filter("NaN is not equal to itself", |t| !t.is_nan()),
        events in proptest::collection::vec(event(), 0..6),
        rank in proptest::option::of(int()),
    ) {
        let b = EventBatch { ts, events, data_parallel_rank: rank };
        prop_assert_eq!(decode(&encode(&b)), Ok(b));
    }

    #[test]
    fn decode_of_any_bytes_answers(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
    }
}

#[test]
fn endpoints_follow_vllm() {
    assert!(is_bind_endpoint("tcp://*:5557"));
    assert!(is_bind_endpoint("tcp://[::]:5557"));
    assert!(is_bind_endpoint("ipc:///tmp/kv"));
    assert!(is_bind_endpoint("inproc://kv"));
    assert!(!is_bind_endpoint("tcp://127.0.0.1:5557"));
    assert_eq!(
        offset_endpoint("tcp://*:5557", 0).as_deref(),
        Ok("tcp://*:5557")
    );
    assert_eq!(
        offset_endpoint("tcp://*:5557", 3).as_deref(),
        Ok("tcp://*:5560")
    );
    assert_eq!(offset_endpoint("tcp://h:0", 3).as_deref(), Ok("tcp://h:0"));
    assert_eq!(
        offset_endpoint("inproc://c", 2).as_deref(),
        Ok("inproc://c_dp2")
    );
    assert_eq!(
        offset_endpoint("ipc:///tmp/kv", 0).as_deref(),
        Ok("ipc:///tmp/kv")
    );
    let e = |s: &str, r| offset_endpoint(s, r).unwrap_err().reason;
    assert_eq!(e("ipc:///tmp/kv", 1), EndpointProblem::Transport);
    assert_eq!(e("tcp://host", 1), EndpointProblem::Port);
    assert_eq!(e("tcp://h:x1", 1), EndpointProblem::Port);
    assert_eq!(e("tcp://h:65535", 1), EndpointProblem::PortOverflow);
    assert_eq!(
        e("tcp://h:99999999999999999999999", 1),
        EndpointProblem::PortOverflow
    );
}

#[test]
fn replay_pieces_follow_vllm() {
    assert_eq!(END_SEQ, [0xff; 8]);
    assert_eq!(start_sequence(&[]), 0);
    assert_eq!(start_sequence(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 9]), 9);
    assert_eq!(start_sequence(&[2, 0, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
    let mut b = ReplayBuffer::new(3);
    for s in 0..5 {
        b.push(s, vec![u8::try_from(s).expect("small")]);
    }
    assert_eq!(b.len(), 3);
    assert_eq!(b.from(0).map(|(s, _)| s).collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(b.from(4).collect::<Vec<_>>(), [(4, &[4u8][..])]);
    let mut none = ReplayBuffer::new(0);
    none.push(0, vec![]);
    assert!(none.is_empty());
}

#[test]
fn manager_events_take_the_offloading_connector_shape() {
    let tier = TierEvents::cpu(16, HashForm::Int);
    let keys = [
        BlockKey::new(1, 0),
        BlockKey::new(2, 1),
        BlockKey::new(3, 0),
    ];
    let mut out = Vec::new();
    tier.push(
        OffloadEvent {
            kind: EventKind::Stored,
            keys: &keys,
        },
        &mut out,
    );
    assert_eq!(out.len(), 3);
    let KvEvent::Stored(s) = &out[1] else {
        panic!("{out:?}")
    };
    let mut want = BlockStored::new(vec![BlockHash::Int(2)], 16, Some(MEDIUM_CPU.into()));
    want.group_idx = Some(1);
    assert_eq!(**s, want);
    out.clear();
    tier.push(
        OffloadEvent {
            kind: EventKind::Removed,
            keys: &keys,
        },
        &mut out,
    );
    let removed = |hashes: &[u64], group| {
        KvEvent::Removed(BlockRemoved {
            block_hashes: hashes.iter().map(|h| BlockHash::Int((*h).into())).collect(),
            medium: Some(MEDIUM_CPU.into()),
            group_idx: Some(group),
            locality: None,
            ownership: None,
        })
    };
    assert_eq!(out, [removed(&[1, 3], 0), removed(&[2], 1)]);
    out.clear();
    tier.push(
        OffloadEvent {
            kind: EventKind::RemovedMetadataOnly,
            keys: &keys,
        },
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(
        HashForm::Bytes.hash(0x0102),
        BlockHash::Bytes(vec![0, 0, 0, 0, 0, 0, 1, 2])
    );
}

fn replay(endpoint: &str, start: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).expect("dealer");
    d.set_rcvtimeo(10_000).expect("timeout");
    d.connect(endpoint).expect("connect");
    d.send_multipart([&b""[..], start], 0).expect("send");
    let mut got = Vec::new();
    loop {
        let f = d.recv_multipart(0).expect("a reply");
        if f[2] == END_SEQ {
            assert_eq!(f, [vec![], vec![], END_SEQ.to_vec(), vec![]]);
            return got;
        }
        got.push(f);
    }
}

#[test]
fn publisher_numbers_batches_and_replays_as_vllm() {
    let endpoint = ipc("pub");
    let config = PublisherConfig {
        endpoint: endpoint.clone(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        buffer_steps: 4,
        topic: "kv".into(),
        data_parallel_rank: 0,
        ..PublisherConfig::default()
    };
    let p = Publisher::start(&config).expect("start");
    let replay_at = p.replay_endpoint().expect("bound").to_owned();
    assert!(replay_at.starts_with("tcp://127.0.0.1:") && !replay_at.ends_with(":0"));
    let sub = subscribed(&p, &endpoint);
    let probes = p.stats().batches;
    for n in 0..6 {
        assert!(p.publish(batch(n)).expect("publish"));
    }
    assert!(
        !p.publish(EventBatch {
            ts: 0.0,
            events: vec![],
            data_parallel_rank: None
        })
        .expect("empty")
    );
    let got = read(&sub, 6);
    assert_eq!(got.len(), 6);
    for (i, m) in got.iter().enumerate() {
        let i = i as u64;
        assert_eq!(m.topic, b"kv");
        assert_eq!(m.seq, probes + i);
        let mut want = batch(i);
        want.data_parallel_rank = Some(0);
        assert_eq!(m.batch(), Ok(want));
    }
    // The last 4 batches are buffered; a start past them answers only the end marker.
    let last = probes + 5;
    let all = replay(&replay_at, &0u64.to_be_bytes());
    let seqs: Vec<u64> = all
        .iter()
        .map(|f| u64::from_be_bytes(f[2].as_slice().try_into().expect("8 bytes")))
        .collect();
    assert_eq!(seqs, (last - 3..=last).collect::<Vec<_>>());
    assert!(
        all.iter()
            .zip(&got[2..])
            .all(|(f, m)| f[1] == b"kv" && f[3] == m.payload)
    );
    assert_eq!(replay(&replay_at, &last.to_be_bytes()).len(), 1);
    assert!(replay(&replay_at, &(last + 1).to_be_bytes()).is_empty());
    assert!(replay(&replay_at, &[0xff; 9]).is_empty());
    let stats = p.shutdown();
    assert_eq!((stats.batches, stats.events), (probes + 6, probes + 6));
    assert_eq!((stats.dropped, stats.replay_requests), (0, 4));
}

#[test]
fn a_slow_subscriber_loses_messages_past_the_high_water_mark() {
    let endpoint = ipc("hwm");
    let config = PublisherConfig {
        endpoint: endpoint.clone(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        hwm: 10,
        buffer_steps: 20_000,
        ..PublisherConfig::default()
    };
    let p = Publisher::start(&config).expect("start");
    let sub = subscribed(&p, &endpoint);
    let first = p.stats().batches;
    let sent = 20_000u64;
    for n in 0..sent {
        p.publish(batch(n)).expect("publish");
    }
    while p.stats().batches < first + sent {
        std::thread::sleep(Duration::from_millis(10));
    }
    let got = read(&sub, usize::MAX);
    // libzmq drops past the pipes' marks (the PUB's 10 and the SUB's default 1,000).
    assert!(got.len() < 5_000, "{} of {sent} arrived", got.len());
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(got.windows(2).any(|w| w[1].seq > w[0].seq + 1), "no gap");
    // The gaps are in the replay buffer.
    let replay_at = p.replay_endpoint().expect("bound").to_owned();
    assert_eq!(replay(&replay_at, &first.to_be_bytes()).len() as u64, sent);
}

#[test]
fn a_bad_endpoint_is_an_error_naming_it() {
    let start = |endpoint: &str, replay: Option<&str>, rank| {
        Publisher::start(&PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: replay.map(str::to_owned),
            data_parallel_rank: rank,
            ..PublisherConfig::default()
        })
        .unwrap_err()
    };
    let e = start("nonsense://x", None, 0);
    assert!(
        matches!(e, PublishError::Socket { socket: "PUB", .. }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("cannot connect the kv-events PUB socket to nonsense://x: ")
    );
    let e = start("tcp://*:notaport", None, 0);
    assert!(
        e.to_string()
            .starts_with("cannot bind the kv-events PUB socket to tcp://*:notaport: ")
    );
    // A replay endpoint already in use.
    let first = Publisher::start(&PublisherConfig {
        endpoint: ipc("first"),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        ..PublisherConfig::default()
    })
    .expect("start");
    let taken = first.replay_endpoint().expect("bound").to_owned();
    let e = start(&ipc("second"), Some(&taken), 0);
    assert!(
        e.to_string().starts_with(&format!(
            "cannot bind the kv-events replay socket to {taken}: "
        )),
        "{e}"
    );
    let e = start("ipc:///tmp/kv", None, 1);
    assert_eq!(
        e.to_string(),
        "kv-events endpoint ipc:///tmp/kv: a data-parallel rank above 0 needs an inproc or tcp endpoint"
    );
    let zero = Publisher::start(&PublisherConfig {
        max_queue_size: 0,
        ..PublisherConfig::default()
    });
    assert!(matches!(zero, Err(PublishError::ZeroQueue)));
}
