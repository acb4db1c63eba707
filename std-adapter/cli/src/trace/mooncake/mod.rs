//! Mooncake-style JSONL traces (`docs/formats/mooncake.md`), read as kvtrace records.
//!
//! One line is one request: `{"timestamp": ms, "input_length": n, "output_length": n,
//! "hash_ids": [id, …]}` (other fields ignored). [`MooncakeReader`] turns the requests into the
//! exact kvtrace records of the spec, in a single pass:
//!
//! - request `f = min(len(hash_ids), input_length / block_tokens)` full blocks; `f = 0` is
//!   skipped (counted), the others get rids 0, 1, 2, … in file order;
//! - `L` at `timestamp · 1000` µs, `S` at `+ ceil(input_length · 10^6 / prefill_tokens_per_s)`,
//!   `C` at `+ output_length · decode_us_per_token`;
//! - all records ordered by `(time, kind, rid)`, `L < S < C`.
//!
//! Timestamps are non-decreasing, so every pending `S`/`C` earlier than the next arrival can be
//! emitted before it: the reader keeps a min-heap of one pending event per request in flight
//! (its `S`, then its `C`), never the file. That heap is capped at [`MAX_OPEN_REQUESTS`]
//! requests (an error naming the line beyond it), a line at [`MAX_LINE_BYTES`], a request at
//! [`MAX_BLOCKS_PER_RECORD`] full blocks.
//!
//! ```
//! use kvtier_cli::trace::{MooncakeReader, MooncakeTiming, Record};
//! let jsonl = r#"{"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8, 9]}
//! {"timestamp": 1, "input_length": 100, "output_length": 1, "hash_ids": [5]}
//! "#;
//! let mut reader = MooncakeReader::new(jsonl.as_bytes(), MooncakeTiming::default())?;
//! assert_eq!(reader.next_record()?, Some(Record::Load { rid: 0, hashes: &[7, 8] }));
//! assert_eq!(reader.next_record()?, Some(Record::Start { rid: 0 }));
//! assert_eq!(reader.next_record()?, Some(Record::Complete { rid: 0 }));
//! assert_eq!(reader.next_record()?, None);
//! assert_eq!((reader.requests(), reader.skipped()), (1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, Read};

use crate::trace::header::Header;
use crate::trace::record::Record;
use crate::trace::{MAX_BLOCKS_PER_RECORD, MAX_LINE_BYTES, MAX_OPEN_REQUESTS};

mod error;

pub use error::{MooncakeError, MooncakeErrorKind, MooncakeField, MooncakeLineError, TimingError};

/// The spec's tokens per hash id (Mooncake's 512).
pub const DEFAULT_MOONCAKE_BLOCK_TOKENS: u32 = 512;
/// The spec's default prefill speed, in tokens per second.
pub const DEFAULT_PREFILL_TOKENS_PER_S: u64 = 10_000;
/// The spec's default decode time per output token, in microseconds.
pub const DEFAULT_DECODE_US_PER_TOKEN: u64 = 30_000;

/// The integer timing model that turns a request into `L`/`S`/`C` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MooncakeTiming {
    /// Tokens one hash id covers (≥ 1).
    pub block_tokens: u32,
    /// Prefill speed in tokens per second (≥ 1).
    pub prefill_tokens_per_s: u64,
    /// Decode time per output token, in microseconds.
    pub decode_us_per_token: u64,
}

impl Default for MooncakeTiming {
    fn default() -> Self {
        MooncakeTiming {
            block_tokens: DEFAULT_MOONCAKE_BLOCK_TOKENS,
            prefill_tokens_per_s: DEFAULT_PREFILL_TOKENS_PER_S,
            decode_us_per_token: DEFAULT_DECODE_US_PER_TOKEN,
        }
    }
}

/// The fields kvtier reads; serde skips every other.
#[derive(serde::Deserialize)]
struct RawLine {
    timestamp: Option<serde_json::Number>,
    input_length: Option<serde_json::Number>,
    output_length: Option<serde_json::Number>,
    hash_ids: Option<Vec<serde_json::Number>>,
}

/// A parsed, not yet emitted request.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    rid: u64,
    line: u64,
    arrive: u64,
    prefill_done: u64,
    finish: u64,
}

/// A pending `S` (kind 1, with the `C` time to push after it) or `C` (kind 2), ordered by
/// `(time, kind, rid)`, with the request's line last.
type Event = Reverse<(u64, u8, u64, u64, u64)>;
const KIND_START: u8 = 1;
const KIND_COMPLETE: u8 = 2;

/// Reads a Mooncake JSONL trace as the kvtrace records of `docs/formats/mooncake.md`.
///
/// Memory is bounded by the requests in flight (at most [`MAX_OPEN_REQUESTS`], 40 bytes each)
/// and one line ([`MAX_LINE_BYTES`]), never by the file. Every malformed line is a
/// [`MooncakeError`] naming it, and every later call returns that error again. Lines holding
/// only whitespace are ignored.
#[derive(Debug)]
pub struct MooncakeReader<R> {
    reader: R,
    timing: MooncakeTiming,
    header: Header,
    line: Vec<u8>,
    hashes: Vec<u64>,
    line_no: u64,
    record_line: Option<u64>,
    last_timestamp: u64,
    pending: Option<Arrival>,
    events: BinaryHeap<Event>,
    max_in_flight: usize,
    peak_in_flight: usize,
    requests: u64,
    skipped: u64,
    blocks: u64,
    eof: bool,
    failed: Option<MooncakeLineError>,
}

impl<R: BufRead> MooncakeReader<R> {
    /// A reader of `reader` with `timing`.
    ///
    /// # Errors
    /// [`TimingError`] for a zero `block_tokens` or prefill speed.
    pub fn new(reader: R, timing: MooncakeTiming) -> Result<Self, TimingError> {
        if timing.block_tokens == 0 {
            return Err(TimingError::ZeroBlockTokens);
        }
        if timing.prefill_tokens_per_s == 0 {
            return Err(TimingError::ZeroPrefillSpeed);
        }
        Ok(MooncakeReader {
            reader,
            timing,
            header: timing_header(&timing),
            line: Vec::new(),
            hashes: Vec::new(),
            line_no: 0,
            record_line: None,
            last_timestamp: 0,
            pending: None,
            events: BinaryHeap::new(),
            max_in_flight: MAX_OPEN_REQUESTS,
            peak_in_flight: 0,
            requests: 0,
            skipped: 0,
            blocks: 0,
            eof: false,
            failed: None,
        })
    }

    /// The same reader holding at most `max` requests in flight (default
    /// [`MAX_OPEN_REQUESTS`]); a request that arrives while `max` are in flight is
    /// [`MooncakeErrorKind::TooManyInFlight`].
    #[must_use]
    pub const fn with_max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// The kvtrace header of the records: `block_tokens`, `source=mooncake` and the timing
    /// parameters (the counts are known only at the end: see [`Self::requests`]).
    #[must_use]
    pub const fn header(&self) -> &Header {
        &self.header
    }

    /// The timing model.
    #[must_use]
    pub const fn timing(&self) -> MooncakeTiming {
        self.timing
    }

    /// Requests given a rid so far (their `L` read from the file, maybe not yet returned).
    #[must_use]
    pub const fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests skipped so far (no full block).
    #[must_use]
    pub const fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Full blocks of the requests so far.
    #[must_use]
    pub const fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The number of the last line read (1-based).
    #[must_use]
    pub const fn line_number(&self) -> u64 {
        self.line_no
    }

    /// The line of the request of the record returned last (`S` and `C` records name their
    /// request's line); `None` before the first record.
    #[must_use]
    pub const fn record_line(&self) -> Option<u64> {
        self.record_line
    }

    /// The most requests that were in flight at once (the reorder heap's peak).
    #[must_use]
    pub const fn peak_in_flight(&self) -> usize {
        self.peak_in_flight
    }

    /// The next record, or `None` at the end.
    ///
    /// # Errors
    /// [`MooncakeError::Line`] for a malformed line (returned again by every later call);
    /// [`MooncakeError::Io`] when reading fails.
    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, MooncakeError> {
        if let Some(e) = &self.failed {
            return Err(MooncakeError::Line(e.clone()));
        }
        while self.pending.is_none() && !self.eof {
            self.read_request()?;
        }
        let next_event = self.events.peek().map(|Reverse(e)| *e);
        match (self.pending, next_event) {
            (Some(a), Some((time, ..))) if time < a.arrive => Ok(self.pop_event()),
            (Some(_), _) if self.events.len() >= self.max_in_flight => {
                // Every request still in the heap finishes at or after this arrival.
                Err(self.fail(MooncakeErrorKind::TooManyInFlight))
            }
            (Some(a), _) => {
                self.pending = None;
                self.record_line = Some(a.line);
                self.events.push(Reverse((
                    a.prefill_done,
                    KIND_START,
                    a.rid,
                    a.finish,
                    a.line,
                )));
                self.peak_in_flight = self.peak_in_flight.max(self.events.len());
                Ok(Some(Record::Load {
                    rid: a.rid,
                    hashes: &self.hashes,
                }))
            }
            (None, _) => Ok(self.pop_event()),
        }
    }

    /// Pops the earliest pending event and, for an `S`, pushes its `C`; `None` when there is
    /// none.
    fn pop_event(&mut self) -> Option<Record<'static>> {
        let Reverse((_, kind, rid, finish, line)) = self.events.pop()?;
        self.record_line = Some(line);
        if kind == KIND_START {
            self.events
                .push(Reverse((finish, KIND_COMPLETE, rid, finish, line)));
            Some(Record::Start { rid })
        } else {
            Some(Record::Complete { rid })
        }
    }

    fn fail(&mut self, kind: MooncakeErrorKind) -> MooncakeError {
        let e = MooncakeLineError {
            line: self.line_no,
            kind,
        };
        self.failed = Some(e.clone());
        MooncakeError::Line(e)
    }

    /// Reads lines until one request is pending, or the end of input.
    fn read_request(&mut self) -> Result<(), MooncakeError> {
        if !self.read_line()? {
            self.eof = true;
            return Ok(());
        }
        if self.line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match self.parse_line() {
            Ok(arrival) => {
                self.pending = arrival;
                Ok(())
            }
            Err(kind) => Err(self.fail(kind)),
        }
    }

    /// Parses the line buffer; `Some` for a request with at least one full block (its keys in
    /// `self.hashes`), `None` for a skipped one.
    fn parse_line(&mut self) -> Result<Option<Arrival>, MooncakeErrorKind> {
        let first = self.line.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'[') {
            return Err(MooncakeErrorKind::NotAnObject);
        }
        let raw: RawLine =
            serde_json::from_slice(&self.line).map_err(|e| MooncakeErrorKind::Json {
                column: e.column(),
                message: strip_position(&e.to_string()),
            })?;
        let timestamp = integer(raw.timestamp, MooncakeField::Timestamp)?;
        let input = integer(raw.input_length, MooncakeField::InputLength)?;
        let output = integer(raw.output_length, MooncakeField::OutputLength)?;
        let ids = raw.hash_ids.ok_or(MooncakeErrorKind::MissingField {
            field: MooncakeField::HashIds,
        })?;
        let mut values = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            values.push(number(id, MooncakeField::HashIds, Some(i + 1))?);
        }
        if timestamp < self.last_timestamp {
            return Err(MooncakeErrorKind::TimestampDecreased {
                previous: self.last_timestamp,
                found: timestamp,
            });
        }
        let full = (input / u64::from(self.timing.block_tokens)).min(values.len() as u64);
        let times = self.times(timestamp, input, output)?;
        if full > MAX_BLOCKS_PER_RECORD {
            return Err(MooncakeErrorKind::TooManyBlocks { blocks: full });
        }
        self.last_timestamp = timestamp;
        if full == 0 {
            self.skipped += 1;
            return Ok(None);
        }
        let rid = self.requests;
        self.requests += 1;
        self.blocks += full;
        values.truncate(usize::try_from(full).unwrap_or(usize::MAX));
        self.hashes = values;
        let (arrive, prefill_done, finish) = times;
        Ok(Some(Arrival {
            rid,
            line: self.line_no,
            arrive,
            prefill_done,
            finish,
        }))
    }

    /// `(arrive, prefill_done, finish)` in µs, exact.
    fn times(
        &self,
        timestamp: u64,
        input: u64,
        output: u64,
    ) -> Result<(u64, u64, u64), MooncakeErrorKind> {
        let t = &self.timing;
        let arrive = timestamp.checked_mul(1000);
        let prefill = (u128::from(input) * 1_000_000).div_ceil(u128::from(t.prefill_tokens_per_s));
        let prefill_done = arrive
            .and_then(|a| u64::try_from(u128::from(a) + prefill).ok())
            .ok_or(MooncakeErrorKind::TimeOverflow)?;
        let finish = output
            .checked_mul(t.decode_us_per_token)
            .and_then(|d| prefill_done.checked_add(d))
            .ok_or(MooncakeErrorKind::TimeOverflow)?;
        Ok((arrive.unwrap_or(0), prefill_done, finish))
    }

    /// Reads the next line (without its `\n`) into `self.line`; `false` at the end of input.
    fn read_line(&mut self) -> Result<bool, MooncakeError> {
        self.line.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        let read = loop {
            match (&mut self.reader)
                .take(limit)
                .read_until(b'\n', &mut self.line)
            {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                other => break other,
            }
        };
        let n = read.map_err(|source| MooncakeError::Io {
            line: self.line_no.saturating_add(1),
            source,
        })?;
        if n == 0 {
            return Ok(false);
        }
        self.line_no += 1;
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        if self.line.len() > MAX_LINE_BYTES {
            return Err(self.fail(MooncakeErrorKind::LineTooLong));
        }
        Ok(true)
    }
}

/// The header of a Mooncake trace read with `timing` (counts not included).
fn timing_header(timing: &MooncakeTiming) -> Header {
    Header {
        block_tokens: timing.block_tokens,
        extra: vec![
            ("source".to_owned(), "mooncake".to_owned()),
            (
                "prefill_tokens_per_s".to_owned(),
                timing.prefill_tokens_per_s.to_string(),
            ),
            (
                "decode_us_per_token".to_owned(),
                timing.decode_us_per_token.to_string(),
            ),
        ],
        ..Header::default()
    }
}

/// serde_json's message without its ` at line L column C` suffix (the reader names the line).
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

fn integer(
    value: Option<serde_json::Number>,
    field: MooncakeField,
) -> Result<u64, MooncakeErrorKind> {
    let value = value.ok_or(MooncakeErrorKind::MissingField { field })?;
    number(&value, field, None)
}

fn number(
    value: &serde_json::Number,
    field: MooncakeField,
    index: Option<usize>,
) -> Result<u64, MooncakeErrorKind> {
    if let Some(v) = value.as_u64() {
        return Ok(v);
    }
    if value.is_i64() || value.as_f64().is_some_and(|f| f < 0.0) {
        return Err(MooncakeErrorKind::Negative { field, index });
    }
    Err(MooncakeErrorKind::NotAnInteger { field, index })
}

impl<R: BufRead> crate::trace::RecordSource for MooncakeReader<R> {
    type Error = MooncakeError;

    fn header(&self) -> &Header {
        MooncakeReader::header(self)
    }

    fn next_record(&mut self) -> Result<Option<Record<'_>>, MooncakeError> {
        MooncakeReader::next_record(self)
    }

    fn line(&self) -> Option<u64> {
        self.record_line
    }
}
