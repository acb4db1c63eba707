//! Shared by the sizing-curve tests and benchmarks: a trace of `tests/data/` as records, and
//! records fed to any curve.

use std::fs::File;
use std::io::BufReader;

use kvtier_cli::trace::{OwnedRecord, Record, TraceReader};
use kvtier_core::curve::{CurveError, Sink};

/// The records of the kvtrace file `name` in `tests/data/`.
///
/// # Panics
/// When the file cannot be read: the shared traces are part of the repository.
#[must_use]
pub fn read(name: &str) -> Vec<OwnedRecord> {
    let path = crate::expected::data(name);
    let file = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut rd = TraceReader::new(BufReader::new(file)).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    while let Some(r) = rd.next_record().unwrap_or_else(|e| panic!("{e}")) {
        out.push(r.to_owned_record());
    }
    out
}

/// Feeds `records` to `sink` in order.
///
/// # Errors
/// The first [`CurveError`] the sink returns.
pub fn feed(records: &[OwnedRecord], sink: &mut impl Sink) -> Result<(), CurveError> {
    for rec in records {
        match rec.as_record() {
            Record::Load { rid, hashes } => sink.lookup(rid, hashes)?,
            Record::Start { rid } => sink.store(rid)?,
            Record::Complete { rid } => sink.finish(rid)?,
        }
    }
    Ok(())
}
