//! Mooncake JSONL traces: the records of `docs/formats/mooncake.md` exactly, vLLM 0.33.0's own results
//! on the sample trace (`expected-mooncake.tsv`), and malformed lines that name their line.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs::File;
use std::io::BufReader;

use kvtier_cli::trace::{
    MooncakeError, MooncakeErrorKind, MooncakeField, MooncakeReader, MooncakeTiming, OwnedRecord,
    Record,
};
use kvtier_tests::expected::{data, replay_row, rows};

fn sample() -> MooncakeReader<BufReader<File>> {
    let file = File::open(data("mooncake-synthetic.jsonl")).unwrap();
    MooncakeReader::new(BufReader::new(file), MooncakeTiming::default()).unwrap()
}

fn read_all(text: &str, timing: MooncakeTiming) -> Result<Vec<OwnedRecord>, MooncakeError> {
    let mut r = MooncakeReader::new(text.as_bytes(), timing).unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record()? {
        out.push(rec.to_owned_record());
    }
    Ok(out)
}

#[test]
fn every_expected_mooncake_row_matches_exactly() {
    let rows = rows(&data("expected-mooncake.tsv")).unwrap();
    assert_eq!(rows.len(), 4);
    for row in &rows {
        assert_eq!(row.trace, "mooncake-synthetic.jsonl");
        let got = replay_row(row, sample(), 512).unwrap();
        assert_eq!(
            got, row.cols,
            "{} {} {}",
            row.policy, row.capacity, row.threshold
        );
    }
}

#[test]
fn sample_statistics_match_the_spec() {
    let mut r = sample();
    let (mut loads, mut records, mut blocks) = (0u64, 0u64, 0u64);
    let mut distinct = std::collections::HashSet::new();
    while let Some(rec) = r.next_record().unwrap() {
        records += 1;
        if let Record::Load { hashes, .. } = rec {
            loads += 1;
            blocks += hashes.len() as u64;
            distinct.extend(hashes.iter().copied());
        }
    }
    assert_eq!(r.line_number(), 3993);
    assert_eq!(
        (loads, r.requests(), r.skipped()),
        (2886, 2886, 3993 - 2886)
    );
    assert_eq!(records, 3 * 2886);
    assert_eq!((blocks, r.blocks()), (117_888, 117_888));
    assert_eq!(distinct.len(), 40_148);
    assert!(r.peak_in_flight() > 1 && r.peak_in_flight() < 2886);
}

/// A reference of the spec's conversion: every record with its time, sorted.
fn reference(text: &str, t: MooncakeTiming) -> Vec<OwnedRecord> {
    let mut all = Vec::new();
    let mut rid = 0u64;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let input = v["input_length"].as_u64().unwrap();
        let f = usize::try_from(input / u64::from(t.block_tokens))
            .unwrap()
            .min(ids.len());
        if f == 0 {
            continue;
        }
        let arrive = v["timestamp"].as_u64().unwrap() * 1000;
        let prefill = arrive + (input * 1_000_000).div_ceil(t.prefill_tokens_per_s);
        let finish = prefill + v["output_length"].as_u64().unwrap() * t.decode_us_per_token;
        all.push((
            arrive,
            0,
            rid,
            OwnedRecord::Load {
                rid,
                hashes: ids[..f].to_vec(),
            },
        ));
        all.push((prefill, 1, rid, OwnedRecord::Start { rid }));
        all.push((finish, 2, rid, OwnedRecord::Complete { rid }));
        rid += 1;
    }
    all.sort_by_key(|(t, k, r, _)| (*t, *k, *r));
    all.into_iter().map(|(.., r)| r).collect()
}

#[test]
fn records_are_the_specs_in_time_kind_rid_order() {
    // Short and long requests overlap; equal times tie-break on kind then rid; request 2 has
    // fewer ids than full blocks, request 3 has a partial last block, the fourth line is skipped.
    let text = "\
{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 10, \"hash_ids\": [1, 2]}
{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [3], \"turn\": 2}
{\"timestamp\": 50, \"input_length\": 5000, \"output_length\": 1, \"hash_ids\": [4, 5]}
{\"timestamp\": 51, \"input_length\": 511, \"output_length\": 1, \"hash_ids\": [6]}
{\"timestamp\": 52, \"input_length\": 1500, \"output_length\": 3, \"hash_ids\": [7, 8, 9]}
{\"session_id\": \"x\", \"timestamp\": 400, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [1]}
";
    let t = MooncakeTiming::default();
    let got = read_all(text, t).unwrap();
    assert_eq!(got, reference(text, t));
    let lines: Vec<String> = got.iter().map(|r| r.as_record().to_string()).collect();
    let want = [
        "L 0 2 0000000000000001 0000000000000002", // 0 us
        "L 1 1 0000000000000003",                  // 0 us
        "L 2 2 0000000000000004 0000000000000005", // 50,000 us
        "S 1",                                     // 51,200 us
        "C 1",                                     // 51,200 us (no output)
        "L 3 2 0000000000000007 0000000000000008", // 52,000 us
        "S 0",                                     // 102,400 us
        "S 3",                                     // 202,000 us
        "C 3",                                     // 292,000 us
        "L 4 1 0000000000000001",                  // 400,000 us
        "C 0",                                     // 402,400 us
        "S 4",                                     // 451,200 us
        "C 4",                                     // 511,200 us
        "S 2",                                     // 550,000 us
        "C 2",                                     // 580,000 us
    ];
    assert_eq!(lines, want);

    // Each record names its request's line (the fourth line was skipped).
    use kvtier_cli::trace::RecordSource;
    let mut r = MooncakeReader::new(text.as_bytes(), t).unwrap();
    let mut named = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        let letter = rec.kind().letter();
        let rid = rec.rid();
        named.push((letter, rid, RecordSource::line(&r).unwrap()));
    }
    assert_eq!(
        &named[..5],
        &[
            ('L', 0, 1),
            ('L', 1, 2),
            ('L', 2, 3),
            ('S', 1, 2),
            ('C', 1, 2)
        ]
    );
    assert_eq!(named[5], ('L', 3, 5));
    assert_eq!(named[14], ('C', 2, 3));
}

const GOOD: &str = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 18446744073709551615]}\n";

/// `bad` as line 3, after a good line and a blank one: the error, with its line.
fn error_of(bad: &str) -> MooncakeError {
    let text = format!("{GOOD}  \n{bad}\n{GOOD}");
    let mut r = MooncakeReader::new(text.as_bytes(), MooncakeTiming::default()).unwrap();
    let e = loop {
        match r.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error for {bad}"),
            Err(e) => break e,
        }
    };
    // Every later call returns the same error.
    assert_eq!(r.next_record().unwrap_err().to_string(), e.to_string());
    e
}

fn kind_at_line_3(bad: &str) -> MooncakeErrorKind {
    let e = error_of(bad);
    assert_eq!(e.line(), 3, "{bad}: {e}");
    assert!(e.to_string().starts_with("line 3: "), "{e}");
    match e {
        MooncakeError::Line(l) => l.kind,
        other => panic!("{other}"),
    }
}

#[test]
fn malformed_lines_name_their_line_and_what_is_wrong() {
    use MooncakeErrorKind as K;
    use MooncakeField as F;
    let ok = |ts: &str, i: &str, o: &str, ids: &str| {
        format!(
            "{{\"timestamp\": {ts}, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": [{ids}]}}"
        )
    };
    let json = |bad: &str| match kind_at_line_3(bad) {
        K::Json { message, .. } => message,
        other => panic!("{bad}: {other}"),
    };
    assert!(json("{\"timestamp\": 7,").contains("EOF"));
    assert_eq!(kind_at_line_3("[5, 600, 1, [1]]"), K::NotAnObject);
    assert!(json("5").contains("invalid type"));
    assert!(json("not json").contains("expected"));
    assert!(json(&ok("\"7\"", "600", "1", "1")).contains("string"));
    assert!(json(&ok("7", "600", "1", "1, \"x\"")).contains("string"));
    assert_eq!(
        kind_at_line_3("{\"timestamp\": 7, \"input_length\": 600, \"output_length\": 1}"),
        K::MissingField { field: F::HashIds }
    );
    assert_eq!(
        kind_at_line_3(
            "{\"timestamp\": null, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": []}"
        ),
        K::MissingField {
            field: F::Timestamp
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("7", "-600", "1", "1")),
        K::Negative {
            field: F::InputLength,
            index: None
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("7", "600", "1.5", "1")),
        K::NotAnInteger {
            field: F::OutputLength,
            index: None
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("7e3", "600", "1", "1")),
        K::NotAnInteger {
            field: F::Timestamp,
            index: None
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("7", "600", "1", "1, -2")),
        K::Negative {
            field: F::HashIds,
            index: Some(2)
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("7", "600", "1", "18446744073709551616")),
        K::NotAnInteger {
            field: F::HashIds,
            index: Some(1)
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("4", "600", "1", "1")),
        K::TimestampDecreased {
            previous: 5,
            found: 4
        }
    );
    assert_eq!(
        kind_at_line_3(&ok("18446744073709551", "600", "1", "1")),
        K::TimeOverflow
    );
    assert_eq!(
        kind_at_line_3(&ok("7", "600", "18446744073709551615", "1")),
        K::TimeOverflow
    );
    let long = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(kvtier_cli::trace::MAX_LINE_BYTES)
    );
    assert_eq!(kind_at_line_3(&long), K::LineTooLong);
    let many: Vec<String> = (0..=kvtier_cli::trace::MAX_BLOCKS_PER_RECORD)
        .map(|i| i.to_string())
        .collect();
    assert_eq!(
        kind_at_line_3(&ok("7", "999999999999", "1", &many.join(","))),
        K::TooManyBlocks {
            blocks: kvtier_cli::trace::MAX_BLOCKS_PER_RECORD + 1
        }
    );
}

#[test]
fn requests_in_flight_are_capped_with_an_error_naming_the_line() {
    // Each request takes 10 s to decode; the third arrives while two are in flight, the fourth
    // after the first two completed.
    let line = |ts: u64| {
        format!(
            "{{\"timestamp\": {ts}, \"input_length\": 512, \"output_length\": 200, \"hash_ids\": [{ts}]}}\n"
        )
    };
    let overlapping: String = [0, 1, 2].into_iter().map(line).collect();
    let spaced: String = [0, 1, 20_000, 20_001].into_iter().map(line).collect();
    let read = |text: &str| {
        let mut r = MooncakeReader::new(text.as_bytes(), MooncakeTiming::default())
            .unwrap()
            .with_max_in_flight(2);
        loop {
            match r.next_record() {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(r.peak_in_flight()),
                Err(e) => return Err(e),
            }
        }
    };
    let e = read(&overlapping).unwrap_err();
    assert_eq!(e.line(), 3, "{e}");
    assert!(matches!(&e, MooncakeError::Line(l) if l.kind == MooncakeErrorKind::TooManyInFlight));
    assert_eq!(read(&spaced).unwrap(), 2);
}

#[test]
fn timing_parameters_change_the_records_and_are_checked() {
    let text = "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n\
                {\"timestamp\": 0, \"input_length\": 16, \"output_length\": 0, \"hash_ids\": [4]}\n";
    let t = MooncakeTiming {
        block_tokens: 16,
        prefill_tokens_per_s: 8,
        decode_us_per_token: 1,
    };
    let got = read_all(text, t).unwrap();
    assert_eq!(got, reference(text, t));
    // 40 tokens at 8/s = 5 s; 16 tokens = 2 s: request 1 starts and completes first.
    assert_eq!(
        got[2..]
            .iter()
            .map(|r| r.as_record().to_string())
            .collect::<Vec<_>>(),
        ["S 1", "C 1", "S 0", "C 0"]
    );
    assert_eq!(
        got[0],
        OwnedRecord::Load {
            rid: 0,
            hashes: vec![1, 2]
        }
    );
    let zero = MooncakeTiming {
        block_tokens: 0,
        ..MooncakeTiming::default()
    };
    assert!(MooncakeReader::new(text.as_bytes(), zero).is_err());
    let zero = MooncakeTiming {
        prefill_tokens_per_s: 0,
        ..MooncakeTiming::default()
    };
    assert!(MooncakeReader::new(text.as_bytes(), zero).is_err());
}

fn parse(argv: &[&str]) -> kvtier_cli::Cli {
    let mut full = vec!["kvtier"];
    full.extend_from_slice(argv);
    kvtier_cli::Cli::try_parse_from(full).unwrap()
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-mooncake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `kvtier convert --from mooncake IN -o OUT EXTRA…`.
fn convert(
    input: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> Result<kvtier_cli::convert::ConvertSummary, String> {
    let mut argv = vec![
        "convert",
        "--from",
        "mooncake",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    let a = parse(&argv);
    kvtier_cli::convert::convert(a.convert_options().unwrap()).map_err(|e| e.to_string())
}

#[test]
fn convert_writes_the_header_and_exactly_the_readers_records() {
    let out = tmp("sample.kvtrace");
    let input = data("mooncake-synthetic.jsonl");
    let s = convert(&input, &out, &[]).unwrap();
    assert_eq!(
        (s.requests, s.skipped, s.records, s.blocks),
        (2886, 1107, 8658, 117_888)
    );
    let mut kv =
        kvtier_cli::trace::TraceReader::new(BufReader::new(File::open(&out).unwrap())).unwrap();
    let h = kv.header().clone();
    assert_eq!(
        (h.block_tokens, h.requests, h.records),
        (512, Some(2886), Some(8658))
    );
    assert_eq!(h.get_extra("source"), Some("mooncake"));
    assert_eq!(h.get_extra("prefill_tokens_per_s"), Some("10000"));
    assert_eq!(h.get_extra("decode_us_per_token"), Some("30000"));
    assert_eq!(h.get_extra("skipped"), Some("1107"));
    let mut mc = sample();
    let mut n = 0;
    while let Some(a) = kv.next_record().unwrap() {
        let a = a.to_owned_record();
        assert_eq!(
            Some(a),
            mc.next_record().unwrap().map(|r| r.to_owned_record())
        );
        n += 1;
    }
    assert_eq!(n, 8658);
    assert!(mc.next_record().unwrap().is_none());

    // Other timing parameters reach the header and the records.
    let s = convert(
        &input,
        &out,
        &[
            "--block-tokens",
            "256",
            "--prefill-tokens-per-s",
            "5000",
            "--decode-us-per-token",
            "7",
        ],
    )
    .unwrap();
    assert!(s.blocks > 117_888 && s.requests > 2886, "{s:?}");
    let kv =
        kvtier_cli::trace::TraceReader::new(BufReader::new(File::open(&out).unwrap())).unwrap();
    assert_eq!(kv.header().block_tokens, 256);
    assert_eq!(kv.header().get_extra("decode_us_per_token"), Some("7"));
}

#[test]
fn convert_of_a_bad_line_names_it_and_writes_nothing() {
    let input = tmp("bad.jsonl");
    let out = tmp("bad.kvtrace");
    std::fs::write(&input, format!("{GOOD}{GOOD}{{\"timestamp\": 1}}\n")).unwrap();
    let _ = std::fs::remove_file(&out);
    let e = convert(&input, &out, &[]).unwrap_err();
    assert!(e.ends_with("line 3: missing field `input_length`"), "{e}");
    assert!(!out.exists());
}

fn replay(argv: &[&str]) -> Result<kvtier_cli::replay::ReplayReport, String> {
    let mut full = vec!["replay"];
    full.extend_from_slice(argv);
    let a = parse(&full);
    kvtier_cli::replay::replay(&a.replay_options().unwrap(), false).map_err(|e| e.to_string())
}

#[test]
fn replay_detects_the_format_or_takes_it_from_the_option() {
    let jsonl = data("mooncake-synthetic.jsonl");
    let jsonl = jsonl.to_str().unwrap();
    let auto = replay(&["--trace", jsonl, "--capacity", "2048"]).unwrap();
    assert_eq!(format!("{:016x}", auto.counts.digest), "80267ea8e8704c8d");
    let forced = replay(&[
        "--trace",
        jsonl,
        "--capacity",
        "2048",
        "--format",
        "mooncake",
    ])
    .unwrap();
    assert_eq!(forced.counts, auto.counts);
    let e = replay(&[
        "--trace",
        jsonl,
        "--capacity",
        "2048",
        "--format",
        "kvtrace",
    ])
    .unwrap_err();
    assert!(e.contains("format=kvtrace"), "{e}");
    let e = replay(&["--trace", jsonl]).unwrap_err();
    assert!(e.contains("give --capacity"), "{e}");
    // Another timing model changes the overlap, so the result.
    let slow = replay(&[
        "--trace",
        jsonl,
        "--capacity",
        "2048",
        "--prefill-tokens-per-s",
        "1000",
    ])
    .unwrap();
    assert_ne!(slow.counts.digest, auto.counts.digest);

    let kv = data("small-a.kvtrace");
    let r = replay(&["--trace", kv.to_str().unwrap(), "--capacity", "1024"]).unwrap();
    assert_eq!(format!("{:016x}", r.counts.digest), "bcfa623160a0a602");

    let other = tmp("other.txt");
    std::fs::write(&other, "\n  L 0 1 0000000000000001\n").unwrap();
    let e = replay(&["--trace", other.to_str().unwrap(), "--capacity", "8"]).unwrap_err();
    assert!(e.contains("kvtrace") && e.contains("Mooncake"), "{e}");
}
