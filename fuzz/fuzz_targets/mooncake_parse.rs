//! `mooncake_parse`: arbitrary bytes to the Mooncake JSONL reader. It never panics; every error
//! names a line that exists and starts with `line N: `; a trace that reads to the end gives
//! each request `L`, `S`, `C` in that order with rids 0, 1, 2, … in order of arrival, one `L`
//! per counted request, and its records written as a kvtrace read back the same.
#![no_main]

use kvtier_cli::trace::{
    MAX_BLOCKS_PER_RECORD, MooncakeReader, MooncakeTiming, OwnedRecord, TraceReader, TraceWriter,
};
use libfuzzer_sys::fuzz_target;

/// Lines in `data`: `\n`-terminated ones plus a final unterminated one.
fn line_count(data: &[u8]) -> u64 {
    let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
    newlines + u64::from(!data.is_empty() && !data.ends_with(b"\n"))
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks a small block size, so short inputs have full blocks.
    let (timing, body) = match data.split_first() {
        Some((&b, rest)) => (
            MooncakeTiming {
                block_tokens: u32::from(b % 8) + 1,
                prefill_tokens_per_s: u64::from(b / 8) + 1,
                decode_us_per_token: u64::from(b),
            },
            rest,
        ),
        None => (MooncakeTiming::default(), data),
    };
    let mut reader = MooncakeReader::new(body, timing).expect("a valid timing");
    let mut records = Vec::new();
    loop {
        match reader.next_record() {
            Ok(Some(r)) => records.push(r.to_owned_record()),
            Ok(None) => break,
            Err(e) => {
                let lines = line_count(body);
                assert!(
                    (1..=lines).contains(&e.line()),
                    "line {} of {lines}: {e}",
                    e.line()
                );
                assert!(
                    e.to_string().starts_with(&format!("line {}: ", e.line())),
                    "{e}"
                );
                return;
            }
        }
    }
    // Per request: L, then S, then C; rids dense in order of their L.
    let mut state: Vec<u8> = Vec::new();
    for r in &records {
        match r {
            OwnedRecord::Load { rid, hashes } => {
                assert_eq!(*rid, state.len() as u64, "rids in order");
                assert!(!hashes.is_empty() && hashes.len() as u64 <= MAX_BLOCKS_PER_RECORD);
                state.push(1);
            }
            OwnedRecord::Start { rid } => {
                let s = &mut state[usize::try_from(*rid).unwrap()];
                assert_eq!(*s, 1, "S after L");
                *s = 2;
            }
            OwnedRecord::Complete { rid } => {
                let s = &mut state[usize::try_from(*rid).unwrap()];
                assert_eq!(*s, 2, "C after S");
                *s = 3;
            }
        }
    }
    assert!(state.iter().all(|&s| s == 3), "every request completed");
    assert_eq!(state.len() as u64, reader.requests());

    let mut header = reader.header().clone();
    header.requests = Some(reader.requests());
    let mut writer = TraceWriter::new(Vec::new(), &header).expect("writing to a Vec");
    for r in &records {
        writer
            .write_record(&r.as_record())
            .expect("writing a record just read");
    }
    let bytes = writer.finish().expect("finishing a Vec");
    let mut back = TraceReader::new(bytes.as_slice()).expect("re-reading the header");
    let mut again = Vec::new();
    while let Some(r) = back.next_record().expect("re-reading a written trace") {
        again.push(r.to_owned_record());
    }
    assert_eq!(again, records);
});
