//! `trace_parse`: arbitrary bytes to the kvtrace reader. It never panics; every error names a
//! line that exists (1-based, at most one past the last line); a trace that reads to the end
//! is written back with `TraceWriter` and read again to the same header and records.
#![no_main]

use kvtier::trace::{OwnedRecord, ReadError, TraceReader, TraceWriter};
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
fn read_all(data: &[u8]) -> Result<(kvtier::trace::Header, Vec<OwnedRecord>), ReadError> {
    let mut reader = TraceReader::new(data)?;
    let mut records = Vec::new();
    while let Some(r) = reader.next_record()? {
        records.push(r.to_owned_record());
    }
    Ok((reader.header().clone(), records))
}

fuzz_target!(|data: &[u8]| {
    let (header, records) = match read_all(data) {
        Ok(parsed) => parsed,
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
