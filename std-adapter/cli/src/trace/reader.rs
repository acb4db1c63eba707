//! The streaming kvtrace v1 reader.

use std::io::BufRead;

use super::error::{Field, ReadError, TraceError, TraceErrorKind};
use super::header::{
    FORMAT_V1, Header, HeaderKey, HeaderLineError, SeenKeys, apply_header_pair, parse_decimal,
    split_header_line,
};
use super::hex::parse_hash;
use super::record::{Record, RecordKind};
use super::tracker::RequestTracker;
use super::{
    MAX_BLOCKS_PER_RECORD, MAX_COMPLETED_RANGES, MAX_HEADER_BYTES, MAX_HEADER_LINES,
    MAX_HEADER_VALUE_BYTES, MAX_LINE_BYTES, MAX_OPEN_REQUESTS,
};

/// Where the reader stands.
#[derive(Debug)]
enum State {
    /// A record line has been read into the line buffer but not yet parsed.
    Pending,
    /// Reading records.
    Reading,
    /// The input ended cleanly.
    Done,
    /// An error was returned; every later call returns it again (the I/O error as its kind).
    Failed(Failed),
}

#[derive(Clone, Copy, Debug)]
enum Failed {
    Trace(TraceError),
    Io(u64, std::io::ErrorKind),
}

impl Failed {
    fn to_error(self) -> ReadError {
        match self {
            Failed::Trace(e) => ReadError::Trace(e),
            Failed::Io(line, kind) => ReadError::Io {
                line,
                source: std::io::Error::new(kind, "the reader failed earlier"),
            },
        }
    }
}

/// A streaming kvtrace v1 reader over any [`BufRead`].
///
/// Memory is independent of the trace's length: one line buffer and one hash buffer, both
/// reused (a line is at most [`MAX_LINE_BYTES`]), the header (at most [`MAX_HEADER_BYTES`]), a
/// map of the requests in flight (at most [`MAX_OPEN_REQUESTS`]) and the completed ids as
/// ranges (at most [`MAX_COMPLETED_RANGES`]; one range when ids are `0, 1, 2, …` in `L`
/// order and no request is open). [`TraceReader::next_record`] lends each record's hashes without
/// allocating. Every malformed input is a [`TraceError`] naming the line; nothing panics.
/// After an error, every later call returns that error again.
///
/// ```
/// use kvtier_cli::trace::{Record, TraceReader};
/// let text = "# format=kvtrace v1\n# capacity=8\nL 0 2 0000000000000001 00000000000000ff\nS 0\nC 0\n";
/// let mut reader = TraceReader::new(text.as_bytes())?;
/// assert_eq!(reader.header().capacity, Some(8));
/// assert_eq!(reader.next_record()?, Some(Record::Load { rid: 0, hashes: &[1, 255] }));
/// assert_eq!(reader.next_record()?, Some(Record::Start { rid: 0 }));
/// assert_eq!(reader.next_record()?, Some(Record::Complete { rid: 0 }));
/// assert_eq!(reader.next_record()?, None);
/// # Ok::<(), kvtier_cli::trace::ReadError>(())
/// ```
#[derive(Debug)]
pub struct TraceReader<R> {
    reader: R,
    header: Header,
    line: Vec<u8>,
    hashes: Vec<u64>,
    line_no: u64,
    tracker: RequestTracker,
    records: u64,
    loads: u64,
    blocks: u64,
    state: State,
}

impl<R: BufRead> TraceReader<R> {
    /// Reads the header (up to the first record line) and returns the reader.
    ///
    /// # Errors
    /// [`ReadError::Trace`] when the first line is not `# format=kvtrace v1` or a header line is
    /// malformed (see [`TraceErrorKind`]); [`ReadError::Io`] when reading fails.
    pub fn new(reader: R) -> Result<Self, ReadError> {
        let mut this = TraceReader {
            reader,
            header: Header::default(),
            line: Vec::new(),
            hashes: Vec::new(),
            line_no: 0,
            tracker: RequestTracker::new(MAX_OPEN_REQUESTS, MAX_COMPLETED_RANGES),
            records: 0,
            loads: 0,
            blocks: 0,
            state: State::Reading,
        };
        this.read_header()?;
        Ok(this)
    }

    /// The underlying reader (positioned after the last line read).
    #[must_use]
    pub fn into_inner(self) -> R {
        self.reader
    }

    /// The trace's header.
    #[must_use]
    pub const fn header(&self) -> &Header {
        &self.header
    }

    /// The number of the last line read (1-based; 0 before any).
    #[must_use]
    pub const fn line_number(&self) -> u64 {
        self.line_no
    }

    /// The records returned so far.
    #[must_use]
    pub const fn records_read(&self) -> u64 {
        self.records
    }

    /// The `L` records returned so far (the requests).
    #[must_use]
    pub const fn loads_read(&self) -> u64 {
        self.loads
    }

    /// The block hashes of the `L` records returned so far (the request blocks).
    #[must_use]
    pub const fn blocks_read(&self) -> u64 {
        self.blocks
    }

    /// The requests loaded and not yet completed.
    #[must_use]
    pub fn open_requests(&self) -> usize {
        self.tracker.open_count()
    }

    /// The requests completed so far.
    #[must_use]
    pub fn completed_requests(&self) -> u64 {
        self.tracker.closed().len()
    }

    /// The separate ranges the completed request ids form (what the reader's memory grows with
    /// besides the open requests; at most [`MAX_COMPLETED_RANGES`]).
    #[must_use]
    pub fn completed_ranges(&self) -> usize {
        self.tracker.closed().intervals()
    }

    /// The next record, or `None` at the end of a valid trace.
    ///
    /// # Errors
    /// [`ReadError::Trace`] for a malformed line, a record out of order, or (at the end) a
    /// request left open or a count that differs from the header; [`ReadError::Io`] when reading
    /// fails.
    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, ReadError> {
        match self.state {
            State::Failed(failed) => return Err(failed.to_error()),
            State::Done => return Ok(None),
            State::Pending => self.state = State::Reading,
            State::Reading => {
                if !self.read_line()? {
                    self.finish()?;
                    return Ok(None);
                }
            }
        }
        let (kind, rid) = match self.parse_record_line() {
            Ok(parsed) => parsed,
            Err(kind) => return Err(self.fail(kind)),
        };
        self.records = self.records.saturating_add(1);
        Ok(Some(match kind {
            RecordKind::Load => {
                self.loads = self.loads.saturating_add(1);
                self.blocks = self.blocks.saturating_add(self.hashes.len() as u64);
                Record::Load {
                    rid,
                    hashes: &self.hashes,
                }
            }
            RecordKind::Start => Record::Start { rid },
            RecordKind::Complete => Record::Complete { rid },
        }))
    }

    /// Records `kind` at the current line as the reader's terminal error and returns it.
    fn fail(&mut self, kind: TraceErrorKind) -> ReadError {
        self.fail_at(self.line_no, kind)
    }

    fn fail_at(&mut self, line: u64, kind: TraceErrorKind) -> ReadError {
        let e = TraceError { line, kind };
        self.state = State::Failed(Failed::Trace(e));
        ReadError::Trace(e)
    }

    /// The end-of-input checks.
    fn finish(&mut self) -> Result<(), ReadError> {
        if let Some((rid, line)) = self.tracker.first_open() {
            let open = self.tracker.open_count() as u64;
            return Err(self.fail_at(line, TraceErrorKind::OpenAtEnd { rid, open }));
        }
        let past_end = self.line_no.saturating_add(1);
        if let Some(declared) = self.header.records.filter(|&d| d != self.records) {
            let found = self.records;
            return Err(self.fail_at(
                past_end,
                TraceErrorKind::RecordCountMismatch { declared, found },
            ));
        }
        if let Some(declared) = self.header.requests.filter(|&d| d != self.loads) {
            let found = self.loads;
            return Err(self.fail_at(
                past_end,
                TraceErrorKind::RequestCountMismatch { declared, found },
            ));
        }
        self.state = State::Done;
        Ok(())
    }

    /// Reads the next line (without its `\n`) into `self.line`; `false` at the end of input.
    fn read_line(&mut self) -> Result<bool, ReadError> {
        self.line.clear();
        let next_line = self.line_no.saturating_add(1);
        let mut any = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.state = State::Failed(Failed::Io(next_line, e.kind()));
                    return Err(ReadError::Io {
                        line: next_line,
                        source: e,
                    });
                }
            };
            if available.is_empty() {
                break;
            }
            any = true;
            let (chunk, used, ended) = match find_newline(available) {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            if self.line.len() + chunk.len() > MAX_LINE_BYTES {
                self.line_no = next_line;
                return Err(self.fail(TraceErrorKind::LineTooLong));
            }
            self.line.extend_from_slice(chunk);
            self.reader.consume(used);
            if ended {
                break;
            }
        }
        if any {
            self.line_no = next_line;
            if self.line.last() == Some(&b'\r') {
                return Err(self.fail(TraceErrorKind::CarriageReturn));
            }
        }
        Ok(any)
    }

    /// Reads the header lines and leaves the first record line pending.
    fn read_header(&mut self) -> Result<(), ReadError> {
        if !self.read_line()? {
            return Err(self.fail_at(1, TraceErrorKind::MissingFormatHeader));
        }
        if self.line.starts_with("\u{feff}".as_bytes()) {
            return Err(self.fail(TraceErrorKind::ByteOrderMark));
        }
        let first = match utf8(&self.line) {
            Ok(text) => split_header_line(text).map(|(k, v)| (k == "format", v == FORMAT_V1)),
            Err(kind) => return Err(self.fail(kind)),
        };
        match first {
            Ok((true, true)) => {}
            Ok((true, false)) => return Err(self.fail(TraceErrorKind::UnsupportedFormat)),
            Ok((false, _)) => return Err(self.fail(TraceErrorKind::WrongFirstHeader)),
            Err(_) if !self.line.starts_with(b"#") => {
                return Err(self.fail(TraceErrorKind::MissingFormatHeader));
            }
            Err(_) => return Err(self.fail(TraceErrorKind::MalformedHeader)),
        }
        let mut seen = SeenKeys::default();
        seen.insert(HeaderKey::Format);
        let mut header_lines = 1usize;
        let mut header_bytes = self.line.len();
        while self.read_line()? {
            if !self.line.starts_with(b"#") {
                self.state = State::Pending;
                return Ok(());
            }
            header_lines += 1;
            header_bytes = header_bytes.saturating_add(self.line.len());
            if header_lines > MAX_HEADER_LINES {
                return Err(self.fail(TraceErrorKind::TooManyHeaderLines));
            }
            if header_bytes > MAX_HEADER_BYTES {
                return Err(self.fail(TraceErrorKind::HeaderTooLarge));
            }
            let text = match utf8(&self.line) {
                Ok(text) => text,
                Err(kind) => return Err(self.fail(kind)),
            };
            let applied = split_header_line(text).and_then(|(k, v)| {
                if v.len() > MAX_HEADER_VALUE_BYTES {
                    return Err(HeaderLineError::ValueTooLong);
                }
                apply_header_pair(&mut self.header, &mut seen, k, v)
            });
            if let Err(e) = applied {
                let kind = match e {
                    HeaderLineError::Malformed => TraceErrorKind::MalformedHeader,
                    HeaderLineError::Duplicate => TraceErrorKind::DuplicateHeaderKey,
                    HeaderLineError::BadValue(key) => TraceErrorKind::BadHeaderValue { key },
                    HeaderLineError::UnsupportedFormat => TraceErrorKind::UnsupportedFormat,
                    HeaderLineError::ValueTooLong => TraceErrorKind::HeaderValueTooLong,
                };
                return Err(self.fail(kind));
            }
        }
        Ok(())
    }

    /// Parses the line buffer as a record and checks its order.
    fn parse_record_line(&mut self) -> Result<(RecordKind, u64), TraceErrorKind> {
        let parsed = parse_record(&self.line, &mut self.hashes).map_err(|kind| {
            if std::str::from_utf8(&self.line).is_err() {
                TraceErrorKind::InvalidUtf8
            } else {
                kind
            }
        })?;
        let (kind, rid) = parsed;
        match kind {
            RecordKind::Load => self.tracker.load(rid, self.line_no)?,
            RecordKind::Start => self.tracker.start(rid)?,
            RecordKind::Complete => self.tracker.complete(rid)?,
        }
        Ok(parsed)
    }
}

/// The line as text, or [`TraceErrorKind::InvalidUtf8`].
fn utf8(line: &[u8]) -> Result<&str, TraceErrorKind> {
    std::str::from_utf8(line).map_err(|_| TraceErrorKind::InvalidUtf8)
}

/// Parses one record line (without its line end); an `L`'s hashes go to `hashes`.
fn parse_record(line: &[u8], hashes: &mut Vec<u64>) -> Result<(RecordKind, u64), TraceErrorKind> {
    if matches!(line.last(), Some(b' ' | b'\t')) {
        return Err(TraceErrorKind::TrailingWhitespace);
    }
    let (kind, rest) = match line {
        [] => return Err(TraceErrorKind::EmptyLine),
        [b'#', ..] => return Err(TraceErrorKind::HeaderAfterRecords),
        [b'L', b' ', rest @ ..] => (RecordKind::Load, rest),
        [b'S', b' ', rest @ ..] => (RecordKind::Start, rest),
        [b'C', b' ', rest @ ..] => (RecordKind::Complete, rest),
        _ => return Err(TraceErrorKind::UnknownRecord),
    };
    let (rid_field, rest) = split_field(rest);
    let rid = parse_record_number(rid_field, Field::RequestId)?;
    if kind != RecordKind::Load {
        return match rest {
            None => Ok((kind, rid)),
            Some(_) => Err(TraceErrorKind::TrailingField),
        };
    }
    let rest = rest.ok_or(TraceErrorKind::MissingField {
        field: Field::BlockCount,
    })?;
    let (n_field, rest) = split_field(rest);
    let declared = parse_record_number(n_field, Field::BlockCount)?;
    if declared == 0 {
        return Err(TraceErrorKind::ZeroBlocks);
    }
    if declared > MAX_BLOCKS_PER_RECORD {
        return Err(TraceErrorKind::TooManyBlocks { declared });
    }
    hashes.clear();
    let mut rest = rest;
    // Fast path: 16-digit fields separated by single spaces.
    while let Some(fields) = rest {
        let Some((field, after)) = fields.split_first_chunk::<16>() else {
            break;
        };
        let after = match after.split_first() {
            None => None,
            Some((b' ', after)) => Some(after),
            Some(_) => break,
        };
        if hashes.len() as u64 >= declared {
            break;
        }
        let Ok(hash) = parse_hash(field) else {
            break;
        };
        hashes.push(hash);
        rest = after;
    }
    // General path: what the fast path could not take, with exact errors.
    while let Some(fields) = rest {
        let (field, after) = split_field(fields);
        let index = hashes.len() as u64 + 1;
        if index > declared {
            let extra = fields.split(|&b| b == b' ').count() as u64;
            return Err(TraceErrorKind::BlockCountMismatch {
                declared,
                found: declared.saturating_add(extra),
            });
        }
        let hash =
            parse_hash(field).map_err(|problem| TraceErrorKind::BadHash { index, problem })?;
        hashes.push(hash);
        rest = after;
    }
    let found = hashes.len() as u64;
    if found != declared {
        return Err(TraceErrorKind::BlockCountMismatch { declared, found });
    }
    Ok((kind, rid))
}

/// A record's decimal field, in its one spelling: no leading zero.
fn parse_record_number(bytes: &[u8], field: Field) -> Result<u64, TraceErrorKind> {
    let value = parse_decimal(bytes).ok_or(TraceErrorKind::BadNumber { field })?;
    if bytes.len() > 1 && bytes[0] == b'0' {
        return Err(TraceErrorKind::LeadingZero { field });
    }
    Ok(value)
}

/// The index of the first `\n` in `bytes`, a word at a time.
#[inline]
fn find_newline(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ (ONES * u64::from(b'\n'));
        // The lowest set high bit marks the first zero byte exactly (false positives can only
        // sit above a true zero).
        let zero = x.wrapping_sub(ONES) & !x & HIGH;
        if zero != 0 {
            return Some(offset + (zero.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| offset + i)
}

/// Splits at the first space: the field, and what follows the space (`None` when no space).
#[inline]
fn split_field(bytes: &[u8]) -> (&[u8], Option<&[u8]>) {
    // Hash fields are 16 bytes: look there first.
    if bytes.len() > 16 && bytes[16] == b' ' && !bytes[..16].contains(&b' ') {
        return (&bytes[..16], Some(&bytes[17..]));
    }
    match bytes.iter().position(|&b| b == b' ') {
        Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
        None => (bytes, None),
    }
}
