//! `CompactTrace`: a trace parsed once holds exactly the records the streaming reader returns,
//! with their lines; chunked reads give the same records in bounded buffers; the limits are
//! typed errors naming the line; many threads can share one trace.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs::File;
use std::io::BufReader;

use kvtier_cli::trace::{
    CompactError, CompactLimits, CompactTrace, OwnedRecord, ReadError, Record, RecordSource,
    TraceReader,
};
use kvtier_cli::workload::{Generator, GeneratorConfig};

fn data(name: &str) -> String {
    format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn reader(name: &str) -> TraceReader<BufReader<File>> {
    TraceReader::new(BufReader::new(File::open(data(name)).unwrap())).unwrap()
}

/// Every record of a source with its line, owned.
fn drain<S: RecordSource>(source: &mut S) -> Vec<(OwnedRecord, Option<u64>)>
where
    S::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    while let Some(record) = source.next_record().unwrap() {
        let owned = record.to_owned_record();
        out.push((owned, source.line()));
    }
    out
}

const BIG: CompactLimits = CompactLimits::new(1 << 20, 1 << 24);

#[test]
fn whole_trace_holds_what_the_reader_returns_with_lines() {
    let streamed = drain(&mut reader("small-a.kvtrace"));
    let mut source = reader("small-a.kvtrace");
    let trace = CompactTrace::read_from(&mut source, BIG).unwrap();
    assert_eq!(trace.records(), 3000);
    assert_eq!(trace.requests(), 1000);
    assert_eq!(trace.request_blocks(), 30_722);
    assert_eq!(trace.header(), source.header());
    assert_eq!(drain(&mut trace.cursor()), streamed);
    // 16 header lines: the first record is line 17, the last line 3016.
    assert_eq!(streamed[0].1, Some(17));
    assert_eq!(streamed[2999].1, Some(3016));
    // Two cursors over one trace are independent.
    let mut a = trace.cursor();
    let mut b = trace.cursor();
    assert_eq!(a.next().map(|r| r.rid()), Some(0));
    assert_eq!(a.next().map(|r| r.rid()), Some(1));
    assert_eq!(b.next().map(|r| r.rid()), Some(0));
    assert_eq!(a.remaining(), 2998);
}

#[test]
fn generator_records_have_no_lines() {
    let mut generator = Generator::new(GeneratorConfig::new(9, 50)).unwrap();
    let expected = drain(&mut Generator::new(GeneratorConfig::new(9, 50)).unwrap());
    let trace = CompactTrace::read_from(&mut generator, BIG).unwrap();
    assert_eq!(drain(&mut trace.cursor()), expected);
    assert!(expected.iter().all(|(_, line)| line.is_none()));
    assert_eq!(trace.records(), 150);
}

#[test]
fn chunks_give_the_same_records_in_bounded_buffers() {
    let streamed = drain(&mut reader("small-b.kvtrace"));
    let limits = CompactLimits::new(500, 4_000);
    let mut source = reader("small-b.kvtrace");
    let mut chunk = CompactTrace::new(source.header().clone(), limits);
    let mut got = Vec::new();
    let mut chunks = 0;
    let mut peak_heap = 0;
    loop {
        let n = chunk.refill_from(&mut source).unwrap();
        if n == 0 {
            assert!(chunk.is_empty());
            break;
        }
        chunks += 1;
        assert_eq!(n, chunk.records());
        assert!(n <= 500, "{n} records in one chunk");
        // At most max_hashes - 1 plus one record's hashes (small-b's longest L has 106).
        assert!(
            chunk.request_blocks() < 4_000 + 106,
            "{}",
            chunk.request_blocks()
        );
        peak_heap = peak_heap.max(chunk.heap_bytes());
        got.extend(drain(&mut chunk.cursor()));
    }
    assert_eq!(got, streamed);
    assert!(chunks >= 60, "{chunks} chunks");
    // The reused buffers never grew past about one chunk (Vec growth doubles at most).
    assert!(
        peak_heap <= 2 * (500 * 24 + (4_000 + 106) * 8),
        "{peak_heap}"
    );
}

#[test]
fn a_trace_over_the_limits_is_an_error_naming_the_line() {
    // 3000 records: the 1001st (line 16 + 1001) is past a 1000-record limit.
    let mut source = reader("small-a.kvtrace");
    let e = CompactTrace::read_from(&mut source, CompactLimits::new(1000, 1 << 20)).unwrap_err();
    assert!(
        matches!(
            e,
            CompactError::TooManyRecords {
                line: Some(1017),
                max_records: 1000
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "line 1017: the trace holds more than 1000 records, the in-memory limit"
    );
    // small-a's first L holds 18 hashes, the second 64: a 20-hash limit stops at line 18.
    let mut source = reader("small-a.kvtrace");
    let e = CompactTrace::read_from(&mut source, CompactLimits::new(1 << 20, 20)).unwrap_err();
    assert!(
        matches!(
            e,
            CompactError::TooManyHashes {
                line: Some(18),
                max_hashes: 20
            }
        ),
        "{e:?}"
    );
    // A malformed trace is the source's error, unchanged.
    let text = "# format=kvtrace v1\nL 0 1 000000000000000g\n";
    let mut source = TraceReader::new(text.as_bytes()).unwrap();
    match CompactTrace::read_from(&mut source, BIG).unwrap_err() {
        CompactError::Source(ReadError::Trace(e)) => assert_eq!(e.line, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn push_past_a_limit_changes_nothing() {
    let mut trace = CompactTrace::new(Default::default(), CompactLimits::new(2, 3));
    trace
        .push(
            &Record::Load {
                rid: 0,
                hashes: &[1, 2],
            },
            Some(2),
        )
        .unwrap();
    let before = trace.clone();
    let e = trace
        .push(
            &Record::Load {
                rid: 1,
                hashes: &[3, 4],
            },
            Some(3),
        )
        .unwrap_err();
    assert_eq!(
        e,
        CompactError::TooManyHashes {
            line: Some(3),
            max_hashes: 3
        }
    );
    assert_eq!(trace, before);
    trace.push(&Record::Start { rid: 0 }, None).unwrap();
    let e = trace
        .push(&Record::Complete { rid: 0 }, Some(9))
        .unwrap_err();
    assert_eq!(
        e,
        CompactError::TooManyRecords {
            line: Some(9),
            max_records: 2
        }
    );
    let mut cursor = trace.cursor();
    assert_eq!(
        cursor.next_with_line(),
        Some((
            Record::Load {
                rid: 0,
                hashes: &[1, 2]
            },
            Some(2)
        ))
    );
    assert_eq!(
        cursor.next_with_line(),
        Some((Record::Start { rid: 0 }, None))
    );
    assert_eq!(cursor.next_with_line(), None);
}

#[test]
fn threads_share_one_trace() {
    fn assert_sync<T: Sync>(_: &T) {}
    let trace = CompactTrace::read_from(&mut reader("small-a.kvtrace"), BIG).unwrap();
    assert_sync(&trace);
    let blocks: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    trace
                        .cursor()
                        .map(|r| match r {
                            Record::Load { hashes, .. } => hashes.len() as u64,
                            _ => 0,
                        })
                        .sum()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(blocks, [30_722, 30_722, 30_722]);
}
