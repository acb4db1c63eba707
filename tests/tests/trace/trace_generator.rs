//! The built-in workload generator: structure like the sample traces, determinism, validity of
//! every trace it makes (proptest), round trips through the writer and the reader, and config
//! validation.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test helpers: a panic is a test failure; sizes are small"
)]

use std::collections::HashMap;
use std::io::BufReader;

use kvtier_cli::trace::{OwnedRecord, Record, TraceReader, TraceWriter};
use kvtier_cli::workload::{BlockRange, Generator, GeneratorConfig, GeneratorError, RangeParam};
use proptest::prelude::*;

fn data(name: &str) -> String {
    format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn records(config: GeneratorConfig) -> Vec<OwnedRecord> {
    Generator::new(config)
        .unwrap()
        .into_owned_records()
        .collect()
}

fn write(config: GeneratorConfig) -> Vec<u8> {
    let mut generator = Generator::new(config).unwrap();
    let mut writer = TraceWriter::new(Vec::new(), generator.header()).unwrap();
    while let Some(record) = generator.next_record() {
        writer.write_record(&record).unwrap();
    }
    writer.finish().unwrap()
}

fn letters_and_rids(records: impl Iterator<Item = (char, u64)>) -> (String, Vec<u64>) {
    records.unzip()
}

#[test]
fn pipeline_matches_the_sample_trace_structure() {
    // small-a: 1000 requests, 32 in flight. The generator's L/S/C interleaving (which request,
    // which record, in which order) equals the sample's exactly; only the hashes differ.
    let mut reader = TraceReader::new(BufReader::new(
        std::fs::File::open(data("small-a.kvtrace")).unwrap(),
    ))
    .unwrap();
    let mut sample = Vec::new();
    while let Some(r) = reader.next_record().unwrap() {
        sample.push((r.kind().letter(), r.rid()));
    }
    let generated: Vec<(char, u64)> = records(GeneratorConfig::new(11, 1000))
        .iter()
        .map(|r| (r.as_record().kind().letter(), r.as_record().rid()))
        .collect();
    assert_eq!(generated.len(), 3000);
    assert_eq!(generated, sample);
    let (letters, _) = letters_and_rids(generated.into_iter());
    assert!(letters.starts_with(&format!("{}S", "L".repeat(17))));
    assert!(letters.ends_with(&format!("LSC{}{}", "S".repeat(16), "C".repeat(32))));
}

#[test]
fn small_configs_interleave_as_documented() {
    let letters = |requests, inflight| {
        let mut c = GeneratorConfig::new(5, requests);
        c.inflight = inflight;
        records(c)
            .iter()
            .map(|r| {
                let r = r.as_record();
                format!("{}{}", r.kind().letter(), r.rid())
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(letters(3, 0), "L0 S0 C0 L1 S1 C1 L2 S2 C2");
    assert_eq!(letters(3, 1), "L0 S0 L1 S1 C0 L2 S2 C1 C2");
    assert_eq!(letters(4, 2), "L0 L1 S0 L2 S1 C0 L3 S2 C1 S3 C2 C3");
    assert_eq!(letters(0, 32), "");
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let a = write(GeneratorConfig::new(42, 2000));
    let b = write(GeneratorConfig::new(42, 2000));
    let c = write(GeneratorConfig::new(43, 2000));
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Same structure, different hashes.
    let strip = |t: &[u8]| -> Vec<String> {
        String::from_utf8(t.to_vec())
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(strip(&a), strip(&c));
}

#[test]
fn a_fixed_seed_gives_fixed_hashes() {
    // Golden values: the built-in workload must not change across releases or dependency
    // upgrades. If this fails, the generator's output changed: every published figure made
    // with `kvtier replay` (no --trace) changes with it.
    let first = records(GeneratorConfig::new(1, 1)).remove(0);
    let OwnedRecord::Load { rid, hashes } = first else {
        panic!("expected L");
    };
    assert_eq!(rid, 0);
    assert_eq!(hashes.len(), 41);
    assert_eq!(hashes[0], 0xbc7f_90c3_c9fe_20c4);
    assert_eq!(hashes[40], 0x6f9b_6dae_6f4c_57a8);
    // The request count does not change the first request.
    let again = records(GeneratorConfig::new(1, 5)).remove(0);
    assert_eq!(again, OwnedRecord::Load { rid: 0, hashes });
}

#[test]
fn round_trip_generator_writer_reader() {
    let mut config = GeneratorConfig::new(9, 1500);
    config.capacity = 2048;
    let expected = records(config);
    let bytes = write(config);
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    assert_eq!(reader.header(), Generator::new(config).unwrap().header());
    assert_eq!(reader.header().capacity, Some(2048));
    assert_eq!(reader.header().records, Some(4500));
    assert_eq!(reader.header().get_extra("generator"), Some("kvtier"));
    assert_eq!(reader.header().get_extra("zipf_s"), Some("1"));
    assert_eq!(reader.header().get_extra("followup"), Some("0.3"));
    assert_eq!(reader.header().get_extra("turn_blocks"), Some("1:16"));
    let mut got = Vec::new();
    while let Some(r) = reader.next_record().unwrap() {
        got.push(r.to_owned_record());
    }
    assert_eq!(got, expected);
}

#[test]
fn shared_prefixes_follow_zipf_popularity() {
    let mut config = GeneratorConfig::new(3, 20_000);
    config.followup = 0.0;
    let mut by_first: HashMap<u64, u64> = HashMap::new();
    let mut generator = Generator::new(config).unwrap();
    while let Some(r) = generator.next_record() {
        if let Record::Load { hashes, .. } = r {
            *by_first.entry(hashes[0]).or_default() += 1;
        }
    }
    let mut counts: Vec<u64> = by_first.values().copied().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    // Zipf(1) over 100 prefixes: rank k has probability 1 / (k · H_100), H_100 = 5.187.
    // Expected: 3856, 1928, 1285 requests for the top three; all 100 prefixes appear.
    assert_eq!(counts.len(), 100);
    assert!((3600..=4100).contains(&counts[0]), "{counts:?}");
    assert!((1750..=2100).contains(&counts[1]), "{counts:?}");
    assert!((1150..=1420).contains(&counts[2]), "{counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), 20_000);
}

#[test]
fn follow_ups_extend_a_recent_conversation() {
    let mut config = GeneratorConfig::new(4, 400);
    config.followup = 1.0;
    config.max_blocks = 65_536;
    config.inflight = 4;
    config.recent_convs = 8;
    let all = records(config);
    let mut completed: Vec<Vec<u64>> = Vec::new();
    let mut loads: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut follow_ups = 0;
    for r in &all {
        match r {
            OwnedRecord::Load { rid, hashes } => {
                let recent = &completed[completed.len().saturating_sub(8)..];
                if !completed.is_empty() {
                    let parent = recent.iter().find(|c| {
                        hashes.len() > c.len()
                            && hashes.len() <= c.len() + 16
                            && hashes.starts_with(c)
                    });
                    assert!(
                        parent.is_some(),
                        "request {rid} extends no recent conversation"
                    );
                    follow_ups += 1;
                }
                loads.insert(*rid, hashes.clone());
            }
            OwnedRecord::Complete { rid } => completed.push(loads.remove(rid).unwrap()),
            OwnedRecord::Start { .. } => {}
        }
    }
    // Requests 0..=4 (inflight + 1) arrive before the first C; each later one is a follow-up.
    assert_eq!(follow_ups, 395);
}

#[test]
fn request_sizes_resemble_the_sample_trace() {
    // small-a (seed 11, 1000 requests, 100 prefixes) holds 30,722 request blocks of which
    // 9,832 are distinct (68.0 % of blocks repeat an earlier one). The generator with the same
    // parameters lands within 10 % of both.
    let mut generator = Generator::new(GeneratorConfig::new(11, 1000)).unwrap();
    let mut blocks = 0u64;
    let mut distinct = std::collections::HashSet::new();
    while let Some(r) = generator.next_record() {
        if let Record::Load { hashes, .. } = r {
            blocks += hashes.len() as u64;
            distinct.extend(hashes.iter().copied());
        }
    }
    let distinct = distinct.len() as u64;
    assert!((27_650..=33_800).contains(&blocks), "{blocks}");
    assert!((8_850..=10_820).contains(&distinct), "{distinct}");
}

#[test]
fn max_blocks_caps_every_request() {
    let mut config = GeneratorConfig::new(8, 3000);
    config.max_blocks = 40;
    config.followup = 0.8;
    let mut longest = 0;
    let mut generator = Generator::new(config).unwrap();
    while let Some(r) = generator.next_record() {
        if let Record::Load { hashes, .. } = r {
            assert!(!hashes.is_empty());
            longest = longest.max(hashes.len());
        }
    }
    assert_eq!(longest, 40);
}

#[test]
fn memory_is_bounded_by_the_parameters_not_the_requests() {
    let mut config = GeneratorConfig::new(6, 30_000);
    config.recent_convs = 16;
    config.inflight = 8;
    config.max_blocks = 48;
    let bound = 2 * (16 + 8 + 2) * 48;
    let mut generator = Generator::new(config).unwrap();
    let mut peak = 0;
    let mut records = 0u64;
    while generator.next_record().is_some() {
        records += 1;
        peak = peak.max(generator.held_hashes());
    }
    assert_eq!(records, 90_000);
    assert!(peak <= bound, "peak {peak} > {bound}");
    // And it is really used: more than the in-flight requests alone.
    assert!(peak > 8 * 4, "peak {peak}");
}

#[test]
fn config_validation() {
    let base = GeneratorConfig::new(0, 10);
    assert_eq!(base.validate(), Ok(()));
    let check = |edit: fn(&mut GeneratorConfig), want: GeneratorError| {
        let mut c = base;
        edit(&mut c);
        assert_eq!(c.validate(), Err(want));
        assert_eq!(Generator::new(c).unwrap_err(), want);
    };
    check(|c| c.requests = u64::MAX, GeneratorError::TooManyRequests);
    check(|c| c.prefixes = 0, GeneratorError::PrefixesOutOfRange);
    check(
        |c| c.prefixes = (1 << 20) + 1,
        GeneratorError::PrefixesOutOfRange,
    );
    check(|c| c.zipf_s = f64::NAN, GeneratorError::ZipfOutOfRange);
    check(|c| c.zipf_s = -0.5, GeneratorError::ZipfOutOfRange);
    check(|c| c.followup = 1.01, GeneratorError::FollowupOutOfRange);
    check(
        |c| c.followup = f64::NAN,
        GeneratorError::FollowupOutOfRange,
    );
    check(
        |c| c.prefix_blocks = BlockRange::new(0, 4),
        GeneratorError::BadRange {
            param: RangeParam::PrefixBlocks,
        },
    );
    check(
        |c| c.suffix_blocks = BlockRange::new(9, 4),
        GeneratorError::BadRange {
            param: RangeParam::SuffixBlocks,
        },
    );
    check(
        |c| c.turn_blocks = BlockRange::new(1, 65_537),
        GeneratorError::BadRange {
            param: RangeParam::TurnBlocks,
        },
    );
    check(|c| c.max_blocks = 0, GeneratorError::MaxBlocksOutOfRange);
    check(
        |c| c.recent_convs = u32::MAX,
        GeneratorError::RecentConvsOutOfRange,
    );
    check(
        |c| c.inflight = u32::MAX,
        GeneratorError::InflightOutOfRange,
    );
    check(|c| c.block_tokens = 0, GeneratorError::ZeroBlockTokens);
    check(
        |c| {
            c.recent_convs = 1 << 20;
            c.max_blocks = 65_536;
        },
        GeneratorError::TooMuchMemory,
    );
    assert_eq!(
        GeneratorError::BadRange {
            param: RangeParam::TurnBlocks
        }
        .to_string(),
        "turn_blocks must be `min:max` with min <= max <= 65536 (and min >= 1 for prefix_blocks)"
    );
    // Edge values that are valid.
    let mut c = base;
    c.zipf_s = 0.0;
    c.followup = 1.0;
    c.suffix_blocks = BlockRange::new(0, 0);
    c.turn_blocks = BlockRange::new(0, 0);
    c.inflight = 0;
    c.recent_convs = 0;
    assert_eq!(Generator::new(c).unwrap().into_owned_records().count(), 30);
}

#[test]
fn block_range_parsing() {
    assert_eq!("1:16".parse::<BlockRange>(), Ok(BlockRange::new(1, 16)));
    for bad in [
        "",
        "1",
        "1:",
        ":2",
        "a:2",
        "1:2:3",
        "-1:2",
        "1:4294967296",
        "+1:2",
    ] {
        assert!(bad.parse::<BlockRange>().is_err(), "{bad:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every generated trace reads back cleanly through the (validating) reader, with the
    /// header's counts, at most `inflight + 1` requests open, and blocks within `max_blocks`.
    #[test]
    fn generated_traces_are_valid(
        seed in any::<u64>(),
        requests in 0u64..120,
        prefixes in 1u32..12,
        zipf_s in 0.0f64..3.0,
        prefix in (1u32..10, 0u32..10),
        suffix in (0u32..6, 0u32..6),
        turn in (0u32..5, 0u32..5),
        followup in 0.0f64..=1.0,
        recent_convs in 0u32..10,
        max_blocks in 1u32..40,
        inflight in 0u32..12,
    ) {
        let range = |(a, b): (u32, u32)| BlockRange::new(a, a + b);
        let config = GeneratorConfig {
            prefixes,
            zipf_s,
            prefix_blocks: range(prefix),
            suffix_blocks: range(suffix),
            followup,
            turn_blocks: range(turn),
            recent_convs,
            max_blocks,
            inflight,
            ..GeneratorConfig::new(seed, requests)
        };
        let mut generator = Generator::new(config).unwrap();
        let mut max_open_generator = 0;
        let mut writer = TraceWriter::new(Vec::new(), generator.header()).unwrap();
        while let Some(record) = generator.next_record() {
            writer.write_record(&record).unwrap();
            max_open_generator = max_open_generator.max(generator.open_requests());
        }
        let bytes = writer.finish().unwrap();
        let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
        let mut max_open = 0;
        let mut next_rid = 0;
        while let Some(record) = reader.next_record().unwrap() {
            if let Record::Load { rid, hashes } = record {
                prop_assert_eq!(rid, next_rid);
                next_rid += 1;
                prop_assert!(!hashes.is_empty() && hashes.len() <= max_blocks as usize);
            }
            max_open = max_open.max(reader.open_requests());
        }
        prop_assert_eq!(reader.loads_read(), requests);
        prop_assert_eq!(reader.records_read(), 3 * requests);
        prop_assert_eq!(max_open, max_open_generator);
        let bound = (inflight as u64 + 1).min(requests) as usize;
        prop_assert_eq!(max_open, bound);
    }
}
