//! The kvtrace v1 reader: the sample traces, every malformed input with the line it names, and
//! a proptest against a reference model of the L → S → C rule.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test helpers: a panic is a test failure; sizes are small"
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};

use kvtier_cli::trace::{
    Field, HashProblem, HeaderKey, MAX_BLOCKS_PER_RECORD, MAX_LINE_BYTES, ReadError, Record,
    RecordKind, TraceError, TraceErrorKind, TraceReader, format_hash, parse_hash,
};
use proptest::prelude::*;

fn data(name: &str) -> String {
    format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Counts of a whole trace.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    loads: u64,
    starts: u64,
    completes: u64,
    blocks: u64,
    max_open: usize,
}

fn count<R: BufRead>(reader: &mut TraceReader<R>) -> Result<Counts, ReadError> {
    let mut c = Counts::default();
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Load { hashes, .. } => {
                c.loads += 1;
                c.blocks += hashes.len() as u64;
            }
            Record::Start { .. } => c.starts += 1,
            Record::Complete { .. } => c.completes += 1,
        }
        c.max_open = c.max_open.max(reader.open_requests());
    }
    Ok(c)
}

fn open_file(name: &str) -> TraceReader<BufReader<std::fs::File>> {
    let file = std::fs::File::open(data(name)).unwrap();
    TraceReader::new(BufReader::new(file)).unwrap()
}

#[test]
fn small_a_counts_and_header() {
    let mut reader = open_file("small-a.kvtrace");
    let h = reader.header().clone();
    assert_eq!(h.seed, Some(11));
    assert_eq!(h.requests, Some(1000));
    assert_eq!(h.records, Some(3000));
    assert_eq!(h.capacity, Some(1024));
    assert_eq!(h.block_tokens, 16);
    assert_eq!(h.get_extra("generator"), Some("gen_trace.py"));
    assert_eq!(h.get_extra("prefixes"), Some("100"));
    assert_eq!(h.get_extra("prefix_blocks"), Some("4:64"));
    assert_eq!(h.extra.len(), 10);
    let c = count(&mut reader).unwrap();
    assert_eq!(
        c,
        Counts {
            loads: 1000,
            starts: 1000,
            completes: 1000,
            blocks: 30_722,
            max_open: 33,
        }
    );
    assert_eq!(reader.records_read(), 3000);
    assert_eq!(reader.blocks_read(), 30_722);
    // 16 header lines + 3000 records.
    assert_eq!(reader.line_number(), 3016);
    assert_eq!(reader.open_requests(), 0);
    // Dense ids: the completed set is one interval, however long the trace.
    assert_eq!(reader.completed_requests(), 1000);
    assert_eq!(reader.completed_ranges(), 1);
    // The end is sticky.
    assert_eq!(reader.next_record().unwrap(), None);
}

#[test]
fn small_b_counts() {
    let mut reader = open_file("small-b.kvtrace");
    assert_eq!(reader.header().seed, Some(12));
    assert_eq!(reader.header().capacity, Some(4096));
    assert_eq!(reader.header().get_extra("prefixes"), Some("500"));
    let c = count(&mut reader).unwrap();
    assert_eq!(
        c,
        Counts {
            loads: 10_000,
            starts: 10_000,
            completes: 10_000,
            blocks: 302_290,
            max_open: 33,
        }
    );
    assert_eq!(reader.completed_ranges(), 1);
}

#[test]
fn first_records_of_small_a() {
    let mut reader = open_file("small-a.kvtrace");
    let first = reader.next_record().unwrap().unwrap().to_owned_record();
    let Record::Load { rid, hashes } = first.as_record() else {
        panic!("expected L, got {first:?}");
    };
    assert_eq!(rid, 0);
    assert_eq!(hashes.len(), 18);
    assert_eq!(hashes[0], 0x4ba4_dcee_67d5_d881);
    assert_eq!(hashes[17], 0xe071_ae59_2b43_aa9d);
    // L 1 … L 16, then the first S is request 0's.
    for rid in 1..=16 {
        assert_eq!(reader.next_record().unwrap().unwrap().rid(), rid);
    }
    assert_eq!(
        reader.next_record().unwrap(),
        Some(Record::Start { rid: 0 })
    );
}

#[test]
fn tiny_buffer_reads_the_same_as_a_large_one() {
    let text = std::fs::read(data("small-a.kvtrace")).unwrap();
    let mut small = TraceReader::new(BufReader::with_capacity(7, text.as_slice())).unwrap();
    let mut large = TraceReader::new(text.as_slice()).unwrap();
    assert_eq!(small.header(), large.header());
    loop {
        let a = small.next_record().unwrap().map(|r| r.to_owned_record());
        let b = large.next_record().unwrap().map(|r| r.to_owned_record());
        assert_eq!(a, b);
        if a.is_none() {
            break;
        }
    }
}

const HEAD: &str = "# format=kvtrace v1\n";
const H1: &str = "0000000000000001";
const H2: &str = "00000000000000ff";

/// Reads `text` to the end and returns the error (panics if it reads cleanly).
fn error_of(text: &[u8]) -> TraceError {
    let mut reader = match TraceReader::new(text) {
        Ok(r) => r,
        Err(e) => return *e.trace_error().unwrap(),
    };
    loop {
        match reader.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("read cleanly: {}", String::from_utf8_lossy(text)),
            Err(e) => {
                let first = *e.trace_error().unwrap();
                // Sticky: the same error again.
                let again = reader.next_record().unwrap_err();
                assert_eq!(again.trace_error(), Some(&first));
                return first;
            }
        }
    }
}

fn err(line: u64, kind: TraceErrorKind) -> TraceError {
    TraceError { line, kind }
}

#[test]
fn header_errors_name_their_line() {
    use TraceErrorKind as K;
    let cases: Vec<(String, TraceError)> = vec![
        (String::new(), err(1, K::MissingFormatHeader)),
        (format!("L 0 1 {H1}\n"), err(1, K::MissingFormatHeader)),
        ("# seed=1\n".into(), err(1, K::WrongFirstHeader)),
        ("# format=kvtrace v2\n".into(), err(1, K::UnsupportedFormat)),
        ("#format=kvtrace v1\n".into(), err(1, K::MalformedHeader)),
        (format!("{HEAD}# seed\n"), err(2, K::MalformedHeader)),
        (format!("{HEAD}# =3\n"), err(2, K::MalformedHeader)),
        (
            format!("{HEAD}# seed=1\n# seed=2\n"),
            err(3, K::DuplicateHeaderKey),
        ),
        (
            format!("{HEAD}# note=a\n# note=b\n"),
            err(3, K::DuplicateHeaderKey),
        ),
        (
            format!("{HEAD}# format=kvtrace v1\n"),
            err(2, K::DuplicateHeaderKey),
        ),
        (
            format!("{HEAD}# capacity=-4\n"),
            err(
                2,
                K::BadHeaderValue {
                    key: HeaderKey::Capacity,
                },
            ),
        ),
        (
            format!("{HEAD}# seed=18446744073709551616\n"),
            err(
                2,
                K::BadHeaderValue {
                    key: HeaderKey::Seed,
                },
            ),
        ),
        (
            format!("{HEAD}# block_tokens=0\n"),
            err(
                2,
                K::BadHeaderValue {
                    key: HeaderKey::BlockTokens,
                },
            ),
        ),
        (
            format!("{HEAD}# block_tokens=4294967296\n"),
            err(
                2,
                K::BadHeaderValue {
                    key: HeaderKey::BlockTokens,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 1 {H1}\n# seed=1\nS 0\nC 0\n"),
            err(3, K::HeaderAfterRecords),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(error_of(text.as_bytes()), expected, "input {text:?}");
    }
}

#[test]
fn malformed_lines_name_their_line() {
    use TraceErrorKind as K;
    let cases: Vec<(String, TraceError)> = vec![
        (format!("{HEAD}\n"), err(2, K::EmptyLine)),
        (format!("{HEAD}X 0\n"), err(2, K::UnknownRecord)),
        (format!("{HEAD}L\n"), err(2, K::UnknownRecord)),
        (format!("{HEAD}l 0 1 {H1}\n"), err(2, K::UnknownRecord)),
        (format!("{HEAD}S\n"), err(2, K::UnknownRecord)),
        (format!("{HEAD}S \n"), err(2, K::TrailingWhitespace)),
        (
            format!("{HEAD}L x 1 {H1}\n"),
            err(
                2,
                K::BadNumber {
                    field: Field::RequestId,
                },
            ),
        ),
        (
            format!("{HEAD}L  0 1 {H1}\n"),
            err(
                2,
                K::BadNumber {
                    field: Field::RequestId,
                },
            ),
        ),
        (
            format!("{HEAD}L -1 1 {H1}\n"),
            err(
                2,
                K::BadNumber {
                    field: Field::RequestId,
                },
            ),
        ),
        (
            format!("{HEAD}L 18446744073709551616 1 {H1}\n"),
            err(
                2,
                K::BadNumber {
                    field: Field::RequestId,
                },
            ),
        ),
        (
            format!("{HEAD}L 0\n"),
            err(
                2,
                K::MissingField {
                    field: Field::BlockCount,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 one {H1}\n"),
            err(
                2,
                K::BadNumber {
                    field: Field::BlockCount,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 1 {H1}\nS 0 x\n"),
            err(3, K::TrailingField),
        ),
        (
            format!("{HEAD}L 0 1 {H1}\nS 0\nC 0 \n"),
            err(4, K::TrailingWhitespace),
        ),
        (
            format!("{HEAD}L 0 1 {H1}\r\nS 0\nC 0\n"),
            err(2, K::CarriageReturn),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(error_of(text.as_bytes()), expected, "input {text:?}");
    }
}

#[test]
fn block_count_and_hash_errors() {
    use TraceErrorKind as K;
    let cases: Vec<(String, TraceError)> = vec![
        (format!("{HEAD}L 0 0\n"), err(2, K::ZeroBlocks)),
        (format!("{HEAD}L 0 0 {H1}\n"), err(2, K::ZeroBlocks)),
        (
            format!("{HEAD}L 0 65537 {H1}\n"),
            err(2, K::TooManyBlocks { declared: 65_537 }),
        ),
        (
            format!("{HEAD}L 0 18446744073709551615 {H1}\n"),
            err(2, K::TooManyBlocks { declared: u64::MAX }),
        ),
        (
            format!("{HEAD}L 0 2 {H1}\n"),
            err(
                2,
                K::BlockCountMismatch {
                    declared: 2,
                    found: 1,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 1 {H1} {H2} {H2}\n"),
            err(
                2,
                K::BlockCountMismatch {
                    declared: 1,
                    found: 3,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 2\n"),
            err(
                2,
                K::BlockCountMismatch {
                    declared: 2,
                    found: 0,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 2 {H1} 00000000000000FF\n"),
            err(
                2,
                K::BadHash {
                    index: 2,
                    problem: HashProblem::Uppercase,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 2 {H1} 00000000000000fg\n"),
            err(
                2,
                K::BadHash {
                    index: 2,
                    problem: HashProblem::NotHex,
                },
            ),
        ),
        (
            format!("{HEAD}L 0 1 fff\n"),
            err(
                2,
                K::BadHash {
                    index: 1,
                    problem: HashProblem::WrongLength { len: 3 },
                },
            ),
        ),
        (
            format!("{HEAD}L 0 1 {H1}0\n"),
            err(
                2,
                K::BadHash {
                    index: 1,
                    problem: HashProblem::WrongLength { len: 17 },
                },
            ),
        ),
        (
            format!("{HEAD}L 0 2 {H1}  {H2}\n"),
            err(
                2,
                K::BadHash {
                    index: 2,
                    problem: HashProblem::WrongLength { len: 0 },
                },
            ),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(error_of(text.as_bytes()), expected, "input {text:?}");
    }
    // The limit itself is accepted.
    let n = MAX_BLOCKS_PER_RECORD;
    let mut line = format!("{HEAD}L 0 {n}");
    for _ in 0..n {
        line.push(' ');
        line.push_str(H1);
    }
    line.push_str("\nS 0\nC 0\n");
    let mut reader = TraceReader::new(line.as_bytes()).unwrap();
    let Some(Record::Load { hashes, .. }) = reader.next_record().unwrap() else {
        panic!("expected L");
    };
    assert_eq!(hashes.len() as u64, n);
}

#[test]
fn order_errors_name_their_line() {
    use TraceErrorKind as K;
    let l = |rid: u64| format!("L {rid} 1 {H1}\n");
    let cases: Vec<(String, TraceError)> = vec![
        (
            format!("{HEAD}S 4\n"),
            err(
                2,
                K::UnknownRequest {
                    record: RecordKind::Start,
                    rid: 4,
                },
            ),
        ),
        (
            format!("{HEAD}{}C 4\n", l(3)),
            err(
                3,
                K::UnknownRequest {
                    record: RecordKind::Complete,
                    rid: 4,
                },
            ),
        ),
        (
            format!("{HEAD}{}C 3\n", l(3)),
            err(3, K::CompleteBeforeStart { rid: 3 }),
        ),
        (
            format!("{HEAD}{}S 3\nS 3\n", l(3)),
            err(4, K::RepeatedStart { rid: 3 }),
        ),
        (
            format!("{HEAD}{}{}", l(3), l(3)),
            err(
                3,
                K::RepeatedLoad {
                    rid: 3,
                    completed: false,
                },
            ),
        ),
        (
            format!("{HEAD}{}S 3\nC 3\n{}", l(3), l(3)),
            err(
                5,
                K::RepeatedLoad {
                    rid: 3,
                    completed: true,
                },
            ),
        ),
        (
            format!("{HEAD}{}S 3\nC 3\nS 3\n", l(3)),
            err(
                5,
                K::AfterComplete {
                    record: RecordKind::Start,
                    rid: 3,
                },
            ),
        ),
        (
            format!("{HEAD}{}S 3\nC 3\nC 3\n", l(3)),
            err(
                5,
                K::AfterComplete {
                    record: RecordKind::Complete,
                    rid: 3,
                },
            ),
        ),
        // Open at the end: the error names the L of the smallest open id.
        (
            format!("{HEAD}{}{}{}S 9\nC 9\nS 5\n", l(9), l(7), l(5)),
            err(4, K::OpenAtEnd { rid: 5, open: 2 }),
        ),
        // No trailing newline on the last line is fine; an L alone is open at the end.
        (
            format!("{HEAD}L 1 1 {H1}"),
            err(2, K::OpenAtEnd { rid: 1, open: 1 }),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(error_of(text.as_bytes()), expected, "input {text:?}");
    }
}

#[test]
fn header_counts_are_checked_at_the_end() {
    use TraceErrorKind as K;
    let body = format!("L 0 1 {H1}\nS 0\nC 0\n");
    let text = format!("{HEAD}# records=4\n{body}");
    assert_eq!(
        error_of(text.as_bytes()),
        err(
            6,
            K::RecordCountMismatch {
                declared: 4,
                found: 3
            }
        )
    );
    let text = format!("{HEAD}# requests=2\n{body}");
    assert_eq!(
        error_of(text.as_bytes()),
        err(
            6,
            K::RequestCountMismatch {
                declared: 2,
                found: 1
            }
        )
    );
    // A cut-short sample trace: every request completed but records are missing.
    let full = std::fs::read_to_string(data("small-a.kvtrace")).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    // Drop the L/S/C of request 999 (its three lines are all in the tail).
    let kept: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.ends_with(" 999") && !l.starts_with("L 999 "))
        .collect();
    assert_eq!(kept.len(), lines.len() - 3);
    let cut = kept.join("\n");
    assert_eq!(
        error_of(cut.as_bytes()),
        err(
            3014,
            K::RecordCountMismatch {
                declared: 3000,
                found: 2997
            }
        )
    );
}

#[test]
fn invalid_utf8_is_an_error() {
    let mut text = HEAD.as_bytes().to_vec();
    text.extend_from_slice(b"# note=\xff\xfe\n");
    assert_eq!(error_of(&text), err(2, TraceErrorKind::InvalidUtf8));
    let mut text = HEAD.as_bytes().to_vec();
    text.extend_from_slice(b"L 0 1 \xc3\x28000000000000000\n");
    assert_eq!(error_of(&text), err(2, TraceErrorKind::InvalidUtf8));
    // Valid UTF-8 that is not a hex digit is a hash error, not a UTF-8 error.
    let text = format!("{HEAD}L 0 1 é00000000000000\n");
    assert_eq!(
        error_of(text.as_bytes()),
        err(
            2,
            TraceErrorKind::BadHash {
                index: 1,
                problem: HashProblem::NotHex
            }
        )
    );
}

/// A reader that yields `prefix`, then endless bytes without a newline, counting what it gave.
#[derive(Debug)]
struct Endless {
    prefix: Vec<u8>,
    given: usize,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.prefix.get(self.given + i).copied().unwrap_or(b'a');
        }
        self.given += n;
        Ok(n)
    }
}

#[test]
fn over_long_lines_stop_at_the_limit() {
    let prefix = format!("{HEAD}L 0 1 {H1}\n").into_bytes();
    let endless = Endless { prefix, given: 0 };
    let mut reader = TraceReader::new(BufReader::with_capacity(64 * 1024, endless)).unwrap();
    assert_eq!(reader.next_record().unwrap().map(|r| r.rid()), Some(0));
    let failure = reader.next_record().unwrap_err();
    assert_eq!(
        failure.trace_error(),
        Some(&TraceError {
            line: 3,
            kind: TraceErrorKind::LineTooLong
        })
    );
    // It stopped reading soon after the limit instead of buffering the endless line.
    let given = reader_bytes_given(reader);
    assert!(given <= MAX_LINE_BYTES + 2 * 64 * 1024, "{given}");
    // A line of exactly the limit is read (and fails on its content, not its length).
    let mut text = HEAD.as_bytes().to_vec();
    text.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES));
    text.push(b'\n');
    assert_eq!(error_of(&text), err(2, TraceErrorKind::UnknownRecord));
    text.insert(HEAD.len(), b'x');
    assert_eq!(error_of(&text), err(2, TraceErrorKind::LineTooLong));
}

fn reader_bytes_given(reader: TraceReader<BufReader<Endless>>) -> usize {
    reader.into_inner().into_inner().given
}

/// A reader that fails after `ok` bytes.
#[derive(Debug)]
struct Failing<'a> {
    data: &'a [u8],
    ok: usize,
}

impl Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.ok == 0 {
            return Err(std::io::Error::other("disk on fire"));
        }
        let n = buf.len().min(self.ok).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.ok -= n;
        Ok(n)
    }
}

#[test]
fn io_errors_name_the_line_being_read() {
    let text = format!("{HEAD}L 0 1 {H1}\nS 0\nC 0\n");
    let ok = HEAD.len() + 5;
    let reader = BufReader::with_capacity(
        4,
        Failing {
            data: text.as_bytes(),
            ok,
        },
    );
    let err = TraceReader::new(reader).unwrap_err();
    let ReadError::Io { line, source } = &err else {
        panic!("expected an I/O error, got {err}");
    };
    assert_eq!(*line, 2);
    assert_eq!(source.to_string(), "disk on fire");
    assert_eq!(err.to_string(), "line 2: read error: disk on fire");
}

#[test]
fn messages_say_what_and_where() {
    let text = format!("{HEAD}L 0 2 {H1} 00000000000000FF\n");
    let e = error_of(text.as_bytes());
    assert_eq!(
        e.to_string(),
        "line 2: hash 2 has an uppercase hex digit (must be lowercase)"
    );
    let text = format!("{HEAD}L 0 1 {H1}\nC 0\n");
    assert_eq!(
        error_of(text.as_bytes()).to_string(),
        "line 3: `C` for request 0 before its `S`"
    );
    let text = format!("{HEAD}L 5 1 {H1}\n");
    assert_eq!(
        error_of(text.as_bytes()).to_string(),
        "line 2: request 5, loaded here, is still open at the end of the input (1 requests left open)"
    );
}

#[test]
fn out_of_order_completions_keep_few_intervals() {
    // Dense ids completed in a shuffled order: the completed set ends as one interval and never
    // holds more than the gaps in flight.
    let order = [3u64, 0, 4, 1, 2, 7, 5, 6];
    let mut text = String::from(HEAD);
    for rid in order {
        text.push_str(&format!("L {rid} 1 {H1}\n"));
    }
    for rid in order {
        text.push_str(&format!("S {rid}\n"));
    }
    for rid in order {
        text.push_str(&format!("C {rid}\n"));
    }
    let mut reader = TraceReader::new(text.as_bytes()).unwrap();
    let mut intervals = Vec::new();
    while reader.next_record().unwrap().is_some() {
        intervals.push(reader.completed_ranges());
    }
    // After each C: {3} {0}{3} {0}{3-4} {0-1}{3-4} {0-4} {0-4}{7} {0-5}{7} {0-7}.
    assert_eq!(intervals[16..], [1, 2, 2, 2, 1, 2, 2, 1]);
    assert_eq!(reader.completed_requests(), 8);
}

// ---------------------------------------------------------------------------------------------
// Proptest: the reader's verdict on random L/S/C sequences equals a reference model's.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelState {
    Loaded(u64),
    Started(u64),
    Completed,
}

/// The reference: a map of every id ever seen (unbounded, simple) and the first violation.
fn model(ops: &[(u8, u64)]) -> Result<(), TraceError> {
    use TraceErrorKind as K;
    let mut state: BTreeMap<u64, ModelState> = BTreeMap::new();
    for (i, &(op, rid)) in ops.iter().enumerate() {
        let line = i as u64 + 2;
        let e = |kind| Err(TraceError { line, kind });
        let current = state.get(&rid).copied();
        match (op, current) {
            (0, None) => {
                state.insert(rid, ModelState::Loaded(line));
            }
            (0, Some(ModelState::Completed)) => {
                return e(K::RepeatedLoad {
                    rid,
                    completed: true,
                });
            }
            (0, Some(_)) => {
                return e(K::RepeatedLoad {
                    rid,
                    completed: false,
                });
            }
            (1, Some(ModelState::Loaded(l))) => {
                state.insert(rid, ModelState::Started(l));
            }
            (1, Some(ModelState::Started(_))) => return e(K::RepeatedStart { rid }),
            (2, Some(ModelState::Started(_))) => {
                state.insert(rid, ModelState::Completed);
            }
            (2, Some(ModelState::Loaded(_))) => return e(K::CompleteBeforeStart { rid }),
            (op, None) => {
                let record = if op == 1 {
                    RecordKind::Start
                } else {
                    RecordKind::Complete
                };
                return e(K::UnknownRequest { record, rid });
            }
            (op, Some(ModelState::Completed)) => {
                let record = if op == 1 {
                    RecordKind::Start
                } else {
                    RecordKind::Complete
                };
                return e(K::AfterComplete { record, rid });
            }
            _ => unreachable!(),
        }
    }
    let open: Vec<(u64, u64)> = state
        .iter()
        .filter_map(|(&rid, s)| match *s {
            ModelState::Loaded(l) | ModelState::Started(l) => Some((rid, l)),
            ModelState::Completed => None,
        })
        .collect();
    if let Some(&(rid, line)) = open.first() {
        return Err(TraceError {
            line,
            kind: K::OpenAtEnd {
                rid,
                open: open.len() as u64,
            },
        });
    }
    Ok(())
}

fn render(ops: &[(u8, u64)]) -> String {
    let mut text = String::from(HEAD);
    for &(op, rid) in ops {
        match op {
            0 => text.push_str(&format!("L {rid} 2 {H1} {H2}\n")),
            1 => text.push_str(&format!("S {rid}\n")),
            _ => text.push_str(&format!("C {rid}\n")),
        }
    }
    text
}

fn read_all(text: &[u8]) -> Result<u64, TraceError> {
    let mut reader = TraceReader::new(text).map_err(|e| *e.trace_error().unwrap())?;
    let mut n = 0;
    while reader
        .next_record()
        .map_err(|e| *e.trace_error().unwrap())?
        .is_some()
    {
        n += 1;
    }
    Ok(n)
}

/// Valid interleavings: each rid's L, S, C at increasing positions.
fn valid_ops(rids: u64) -> impl Strategy<Value = Vec<(u8, u64)>> {
    proptest::collection::vec(any::<u32>(), (rids * 3) as usize)
        .prop_map(|keys| kvtier_tests::trace_order::interleave(&keys))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn reader_matches_the_model_on_random_sequences(
        ops in proptest::collection::vec((0u8..3, 0u64..6), 0..40)
    ) {
        let text = render(&ops);
        let got = read_all(text.as_bytes());
        let want = model(&ops).map(|()| ops.len() as u64);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn hashes_parse_like_a_reference(
        value in any::<u64>(),
        noise in proptest::collection::vec(
            proptest::sample::select(b"0123456789abcdefABCDEFgz /".to_vec()),
            16,
        ),
    ) {
        // Round trip of the canonical form.
        let text = format!("{value:016x}");
        prop_assert_eq!(parse_hash(text.as_bytes()), Ok(value));
        prop_assert_eq!(format_hash(value), *<&[u8; 16]>::try_from(text.as_bytes()).unwrap());
        // Random fields: valid exactly when all 16 bytes are lowercase hex digits.
        let want = if noise.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
            Ok(u64::from_str_radix(std::str::from_utf8(&noise).unwrap(), 16).unwrap())
        } else if noise.iter().all(u8::is_ascii_hexdigit) {
            Err(HashProblem::Uppercase)
        } else {
            Err(HashProblem::NotHex)
        };
        prop_assert_eq!(parse_hash(&noise), want);
    }

    #[test]
    fn valid_interleavings_read_cleanly(ops in valid_ops(12)) {
        let text = render(&ops);
        prop_assert_eq!(model(&ops), Ok(()));
        prop_assert_eq!(read_all(text.as_bytes()), Ok(36));
    }

    #[test]
    fn mutated_sample_prefix_never_panics(
        edits in proptest::collection::vec((0usize..6000, any::<u8>()), 1..8)
    ) {
        // The first 6,000 bytes of small-a, cut at a line end, with random byte edits.
        let full = std::fs::read(data("small-a.kvtrace")).unwrap();
        let mut text = full[..6000].to_vec();
        for (pos, byte) in edits {
            text[pos] = byte;
        }
        let lines = text.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
        match read_all(&text) {
            Ok(_) => {}
            Err(e) => prop_assert!(e.line >= 1 && e.line <= lines + 1, "{e}"),
        }
    }
}
