//! `trace_parse`: arbitrary bytes to the kvtrace reader. It never panics; every error names a
//! line that exists (1-based, at most one past the last line); a trace that reads to the end
//! is written back with `TraceWriter` and read again to the same header and records. The
//! compact form (whole, and in small chunks) holds the same records with the same lines, or
//! fails with the streaming reader's error.
#![no_main]

use kvtier_cli::trace::{
    CompactError, CompactLimits, CompactTrace, OwnedRecord, ReadError, RecordSource, TraceReader,
    TraceWriter,
};
use libfuzzer_sys::fuzz_target;

/// Lines in `data`: `\n`-terminated ones plus a final unterminated one.
fn line_count(data: &[u8]) -> u64 {
    let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
    newlines + u64::from(!data.is_empty() && !data.ends_with(b"\n"))
}

fn check_line(e: &ReadError, data: &[u8]) {
    let lines = line_count(data);
    assert!(
        (1..=lines + 1).contains(&e.line()),
        "error names line {} of a {lines}-line input: {e}",
        e.line()
    );
    assert!(
        e.trace_error().is_some(),
        "an in-memory read reported I/O: {e}"
    );
    assert!(
        e.to_string().starts_with(&format!("line {}: ", e.line())),
        "{e}"
    );
}

/// Reads all of `data`: the records, or the first error.
fn read_all(data: &[u8]) -> Result<(kvtier_cli::trace::Header, Vec<OwnedRecord>), ReadError> {
    let (header, located) = read_located(data)?;
    Ok((header, located.into_iter().map(|(r, _)| r).collect()))
}

/// Every record of a source with its line, or the source's first error.
fn drain<S: RecordSource>(source: &mut S) -> Result<Vec<(OwnedRecord, Option<u64>)>, S::Error> {
    let mut out = Vec::new();
    while let Some(r) = source.next_record()? {
        let owned = r.to_owned_record();
        out.push((owned, source.line()));
    }
    Ok(out)
}

/// Reads all of `data` with each record's line.
fn read_located(
    data: &[u8],
) -> Result<(kvtier_cli::trace::Header, Vec<(OwnedRecord, Option<u64>)>), ReadError> {
    let mut reader = TraceReader::new(data)?;
    let records = drain(&mut reader)?;
    Ok((reader.header().clone(), records))
}

/// The compact form of `data`, whole and in chunks of 3 records or 5 hashes, agrees with the
/// streaming read `expected`.
fn check_compact(
    data: &[u8],
    expected: &Result<(kvtier_cli::trace::Header, Vec<(OwnedRecord, Option<u64>)>), ReadError>,
) {
    let Ok(mut reader) = TraceReader::new(data) else {
        return;
    };
    let whole = CompactTrace::read_from(&mut reader, CompactLimits::new(1 << 20, 1 << 24));
    match (expected, whole) {
        (Ok((header, records)), Ok(trace)) => {
            assert_eq!(trace.header(), header);
            let got = drain(&mut trace.cursor()).unwrap_or_else(|never| match never {});
            assert_eq!(&got, records, "compact records differ");
        }
        (Err(want), Err(CompactError::Source(got))) => {
            assert_eq!(got.trace_error(), want.trace_error());
        }
        (want, got) => panic!("streaming {want:?}, compact {got:?}"),
    }
    let Ok(mut reader) = TraceReader::new(data) else {
        return;
    };
    let limits = CompactLimits::new(3, 5);
    let mut chunk = CompactTrace::new(reader.header().clone(), limits);
    let mut got = Vec::new();
    loop {
        match chunk.refill_from(&mut reader) {
            Ok(0) => break,
            Ok(n) => {
                assert!(n <= 3 && n == chunk.records());
                got.extend(drain(&mut chunk.cursor()).unwrap_or_else(|never| match never {}));
            }
            Err(CompactError::Source(e)) => {
                let want = expected.as_ref().err().map(ReadError::trace_error);
                assert_eq!(Some(e.trace_error()), want, "chunked error differs");
                return;
            }
            Err(e) => panic!("chunked read: {e:?}"),
        }
    }
    let (_, records) = expected.as_ref().expect("chunks read to the end");
    assert_eq!(&got, records, "chunked records differ");
}

fuzz_target!(|data: &[u8]| {
    let located = read_located(data);
    check_compact(data, &located);
    let (header, records) = match located {
        Ok((header, located)) => (
            header,
            located.into_iter().map(|(r, _)| r).collect::<Vec<_>>(),
        ),
        Err(e) => {
            check_line(&e, data);
            return;
        }
    };
    let mut writer = TraceWriter::new(Vec::new(), &header).expect("writing to a Vec");
    for r in &records {
        writer
            .write_record(&r.as_record())
            .expect("re-writing a record just read");
    }
    let bytes = writer.finish().expect("finishing a Vec");
    let (header2, records2) =
        read_all(&bytes).unwrap_or_else(|e| panic!("re-reading a re-written trace: {e}"));
    assert_eq!(records2, records, "records changed through write + read");
    assert_eq!(header2, header, "header changed through write + read");
});
