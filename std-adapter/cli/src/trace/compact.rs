//! A trace parsed once and held compactly in memory: [`CompactTrace`].

use core::convert::Infallible;

use super::RecordSource;
use super::header::Header;
use super::record::{Record, RecordKind};

/// One record of a [`CompactTrace`]; an `L`'s hashes are the next `blocks` of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    rid: u64,
    /// The source's 1-based line, 0 when the source has no lines.
    line: u64,
    blocks: u32,
    kind: RecordKind,
}

/// How much a [`CompactTrace`] may hold: records, and block hashes over all `L` records.
///
/// The memory of a full trace is at most [`CompactLimits::bytes`]:
/// [`CompactTrace::RECORD_BYTES`] per record plus [`CompactTrace::HASH_BYTES`] per hash.
///
/// ```
/// use kvtier_cli::trace::CompactLimits;
/// let limits = CompactLimits::new(1_000, 10_000);
/// assert_eq!(limits.bytes(), 1_000 * 24 + 10_000 * 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompactLimits {
    /// The most records held.
    pub max_records: u64,
    /// The most block hashes held (over all `L` records).
    pub max_hashes: u64,
}

impl CompactLimits {
    /// The chunk `kvtier replay` reads a trace in: 65,536 records, 1,048,576 hashes (about
    /// 9.5 MiB).
    pub const REPLAY_CHUNK: CompactLimits = CompactLimits::new(1 << 16, 1 << 20);

    /// Limits of `max_records` records and `max_hashes` hashes.
    #[must_use]
    pub const fn new(max_records: u64, max_hashes: u64) -> Self {
        CompactLimits {
            max_records,
            max_hashes,
        }
    }

    /// The heap bytes a trace at both limits holds (saturating).
    #[must_use]
    pub const fn bytes(&self) -> u64 {
        self.max_records
            .saturating_mul(CompactTrace::RECORD_BYTES)
            .saturating_add(self.max_hashes.saturating_mul(CompactTrace::HASH_BYTES))
    }
}

/// Why a [`CompactTrace`] could not take a record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompactError<E = Infallible> {
    /// The record source failed (a malformed trace, an I/O error).
    Source(E),
    /// The trace holds more records than [`CompactLimits::max_records`].
    TooManyRecords {
        /// The line of the first record past the limit, when the source has lines.
        line: Option<u64>,
        /// The limit.
        max_records: u64,
    },
    /// The trace's `L` records hold more hashes than [`CompactLimits::max_hashes`].
    TooManyHashes {
        /// The line of the `L` record that passes the limit, when the source has lines.
        line: Option<u64>,
        /// The limit.
        max_hashes: u64,
    },
    /// Growing the record or hash buffer failed: out of memory.
    OutOfMemory {
        /// The line of the record that could not be stored, when the source has lines.
        line: Option<u64>,
    },
}

impl CompactError {
    /// The same error at `line`, typed for a source whose error type is `E`.
    fn at_line<E>(self, line: Option<u64>) -> CompactError<E> {
        match self {
            CompactError::Source(never) => match never {},
            CompactError::TooManyRecords { max_records, .. } => {
                CompactError::TooManyRecords { line, max_records }
            }
            CompactError::TooManyHashes { max_hashes, .. } => {
                CompactError::TooManyHashes { line, max_hashes }
            }
            CompactError::OutOfMemory { .. } => CompactError::OutOfMemory { line },
        }
    }
}

/// `line N: ` when the line is known.
fn line_prefix(f: &mut core::fmt::Formatter<'_>, line: Option<u64>) -> core::fmt::Result {
    match line {
        Some(line) => write!(f, "line {line}: "),
        None => Ok(()),
    }
}

impl<E: core::fmt::Display> core::fmt::Display for CompactError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CompactError::Source(e) => e.fmt(f),
            CompactError::TooManyRecords { line, max_records } => {
                line_prefix(f, *line)?;
                write!(
                    f,
                    "the trace holds more than {max_records} records, the in-memory limit"
                )
            }
            CompactError::TooManyHashes { line, max_hashes } => {
                line_prefix(f, *line)?;
                write!(
                    f,
                    "the trace holds more than {max_hashes} block hashes, the in-memory limit"
                )
            }
            CompactError::OutOfMemory { line } => {
                line_prefix(f, *line)?;
                f.write_str("out of memory while holding the trace")
            }
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for CompactError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            CompactError::Source(e) => Some(e),
            _ => None,
        }
    }
}

/// A trace's records parsed once and held in two flat buffers: one entry per record (its
/// kind, request id and source line) and one arena of every `L`'s block hashes.
///
/// Build one from any [`RecordSource`] — a whole trace with [`CompactTrace::read_from`], or
/// chunk by chunk into one reused buffer with [`CompactTrace::refill_from`] — then read it
/// with [`CompactTrace::cursor`], a [`RecordSource`] itself. A `CompactTrace` is `Sync`: many
/// threads can replay one shared `&CompactTrace`, each with its own cursor.
///
/// ```
/// use kvtier_cli::trace::{CompactLimits, CompactTrace, Record, RecordSource, TraceReader};
/// let text = "# format=kvtrace v1\nL 0 2 0000000000000001 0000000000000002\nS 0\nC 0\n";
/// let mut reader = TraceReader::new(text.as_bytes())?;
/// let trace = CompactTrace::read_from(&mut reader, CompactLimits::new(100, 100))?;
/// assert_eq!((trace.records(), trace.requests(), trace.request_blocks()), (3, 1, 2));
/// let mut cursor = trace.cursor();
/// assert_eq!(cursor.next_record()?, Some(Record::Load { rid: 0, hashes: &[1, 2] }));
/// assert_eq!(cursor.line(), Some(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactTrace {
    header: Header,
    limits: CompactLimits,
    entries: Vec<Entry>,
    hashes: Vec<u64>,
    requests: u64,
}

impl CompactTrace {
    /// Heap bytes per record held.
    pub const RECORD_BYTES: u64 = size_of::<Entry>() as u64;
    /// Heap bytes per block hash held.
    pub const HASH_BYTES: u64 = size_of::<u64>() as u64;

    /// An empty trace with `header`, that will hold at most `limits` (nothing is allocated
    /// before the first record).
    #[must_use]
    pub const fn new(header: Header, limits: CompactLimits) -> Self {
        CompactTrace {
            header,
            limits,
            entries: Vec::new(),
            hashes: Vec::new(),
            requests: 0,
        }
    }

    /// Reads every record of `source` (its header copied once).
    ///
    /// # Errors
    /// [`CompactError::Source`] for the source's error; [`CompactError::TooManyRecords`] or
    /// [`CompactError::TooManyHashes`] when the trace is larger than `limits` (found without
    /// holding more than the limits); [`CompactError::OutOfMemory`].
    pub fn read_from<S: RecordSource>(
        source: &mut S,
        limits: CompactLimits,
    ) -> Result<Self, CompactError<S::Error>> {
        let mut trace = CompactTrace::new(source.header().clone(), limits);
        loop {
            let record = match source.next_record() {
                Ok(Some(record)) => record,
                Ok(None) => return Ok(trace),
                Err(e) => return Err(CompactError::Source(e)),
            };
            let pushed = trace.push_parts(RecordParts::of(&record), true);
            // The record borrowed the source until here; now its line can be asked for.
            trace.place(pushed, source.line())?;
        }
    }

    /// Empties the trace (keeping its header and buffers) and reads the next chunk of
    /// `source` into it: records until the trace holds [`CompactLimits::max_records`] records
    /// or at least [`CompactLimits::max_hashes`] hashes. So a chunk never holds more than
    /// `max_hashes - 1` hashes plus one record's, and its buffers, reused, stay that size.
    /// Returns the records read: 0 at the end of the source.
    ///
    /// ```
    /// use kvtier_cli::trace::{CompactLimits, CompactTrace, RecordSource};
    /// use kvtier_cli::workload::{Generator, GeneratorConfig};
    /// let mut generator = Generator::new(GeneratorConfig::new(3, 1_000))?;
    /// let mut chunk = CompactTrace::new(generator.header().clone(), CompactLimits::new(256, 4096));
    /// let mut records = 0;
    /// loop {
    ///     let n = chunk.refill_from(&mut generator)?;
    ///     if n == 0 {
    ///         break;
    ///     }
    ///     assert!(n <= 256);
    ///     records += n;
    /// }
    /// assert_eq!(records, 3_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`CompactError::Source`] for the source's error (the chunk then holds the records read
    /// before it); [`CompactError::OutOfMemory`].
    pub fn refill_from<S: RecordSource>(
        &mut self,
        source: &mut S,
    ) -> Result<u64, CompactError<S::Error>> {
        self.clear();
        let mut read = 0;
        while (self.entries.len() as u64) < self.limits.max_records
            && (self.hashes.len() as u64) < self.limits.max_hashes
        {
            let record = match source.next_record() {
                Ok(Some(record)) => record,
                Ok(None) => break,
                Err(e) => return Err(CompactError::Source(e)),
            };
            let pushed = self.push_parts(RecordParts::of(&record), false);
            self.place(pushed, source.line())?;
            read += 1;
        }
        Ok(read)
    }

    /// Appends one record read at `line` (1-based, `None` when the source has no lines).
    ///
    /// # Errors
    /// [`CompactError::TooManyRecords`] or [`CompactError::TooManyHashes`] past the limits,
    /// [`CompactError::OutOfMemory`]; the trace is unchanged then.
    pub fn push(&mut self, record: &Record<'_>, line: Option<u64>) -> Result<(), CompactError> {
        let pushed = self.push_parts(RecordParts::of(record), true);
        self.place(pushed, line)
    }

    /// Gives the record just pushed (or the error of pushing it) its line.
    fn place<E>(
        &mut self,
        pushed: Result<(), CompactError>,
        line: Option<u64>,
    ) -> Result<(), CompactError<E>> {
        match pushed {
            Ok(()) => {
                if let Some(last) = self.entries.last_mut() {
                    last.line = line.unwrap_or(0);
                }
                Ok(())
            }
            Err(e) => Err(e.at_line(line)),
        }
    }

    /// Appends a record with no line yet; unchanged on error.
    fn push_parts(
        &mut self,
        parts: RecordParts<'_>,
        check_hashes: bool,
    ) -> Result<(), CompactError> {
        let line = None;
        if self.entries.len() as u64 >= self.limits.max_records {
            return Err(CompactError::TooManyRecords {
                line,
                max_records: self.limits.max_records,
            });
        }
        let too_many_hashes = CompactError::TooManyHashes {
            line,
            max_hashes: self.limits.max_hashes,
        };
        let total = (self.hashes.len() as u64).saturating_add(parts.hashes.len() as u64);
        if check_hashes && total > self.limits.max_hashes {
            return Err(too_many_hashes);
        }
        let blocks = u32::try_from(parts.hashes.len()).map_err(|_| too_many_hashes)?;
        if self.entries.try_reserve(1).is_err()
            || self.hashes.try_reserve(parts.hashes.len()).is_err()
        {
            return Err(CompactError::OutOfMemory { line });
        }
        self.entries.push(Entry {
            rid: parts.rid,
            line: 0,
            blocks,
            kind: parts.kind,
        });
        self.hashes.extend_from_slice(parts.hashes);
        if parts.kind == RecordKind::Load {
            self.requests += 1;
        }
        Ok(())
    }

    /// Removes every record, keeping the header and the buffers' capacity.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.hashes.clear();
        self.requests = 0;
    }

    /// The trace's header.
    #[must_use]
    pub const fn header(&self) -> &Header {
        &self.header
    }

    /// The limits the trace was made with.
    #[must_use]
    pub const fn limits(&self) -> CompactLimits {
        self.limits
    }

    /// The records held.
    #[must_use]
    pub fn records(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `L` records held.
    #[must_use]
    pub const fn requests(&self) -> u64 {
        self.requests
    }

    /// The block hashes held, over all `L` records (the request blocks).
    #[must_use]
    pub fn request_blocks(&self) -> u64 {
        self.hashes.len() as u64
    }

    /// The heap bytes of the record and hash buffers (their capacity).
    #[must_use]
    pub fn heap_bytes(&self) -> u64 {
        (self.entries.capacity() as u64)
            .saturating_mul(Self::RECORD_BYTES)
            .saturating_add((self.hashes.capacity() as u64).saturating_mul(Self::HASH_BYTES))
    }

    /// A cursor at the first record.
    #[must_use]
    pub const fn cursor(&self) -> CompactCursor<'_> {
        CompactCursor {
            trace: self,
            next: 0,
            hash_at: 0,
            line: None,
        }
    }
}

/// A record's fields without the borrow of its source.
#[derive(Clone, Copy)]
struct RecordParts<'a> {
    kind: RecordKind,
    rid: u64,
    hashes: &'a [u64],
}

impl<'a> RecordParts<'a> {
    fn of(record: &Record<'a>) -> Self {
        let hashes = match *record {
            Record::Load { hashes, .. } => hashes,
            Record::Start { .. } | Record::Complete { .. } => &[],
        };
        RecordParts {
            kind: record.kind(),
            rid: record.rid(),
            hashes,
        }
    }
}

/// Reads a [`CompactTrace`] from its first record: a [`RecordSource`] (never failing) and an
/// [`Iterator`] of records that borrow the trace, not the cursor.
#[derive(Clone, Debug)]
pub struct CompactCursor<'a> {
    trace: &'a CompactTrace,
    next: usize,
    hash_at: usize,
    line: Option<u64>,
}

impl<'a> CompactCursor<'a> {
    /// The next record and its source line, or `None` at the end.
    pub fn next_with_line(&mut self) -> Option<(Record<'a>, Option<u64>)> {
        let entry = *self.trace.entries.get(self.next)?;
        self.next += 1;
        let line = (entry.line != 0).then_some(entry.line);
        self.line = line;
        let record = match entry.kind {
            RecordKind::Load => {
                let end = self.hash_at + entry.blocks as usize;
                let hashes = self.trace.hashes.get(self.hash_at..end).unwrap_or(&[]);
                self.hash_at = end;
                Record::Load {
                    rid: entry.rid,
                    hashes,
                }
            }
            RecordKind::Start => Record::Start { rid: entry.rid },
            RecordKind::Complete => Record::Complete { rid: entry.rid },
        };
        Some((record, line))
    }

    /// The records not yet read.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.trace.entries.len() - self.next
    }
}

impl<'a> Iterator for CompactCursor<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        self.next_with_line().map(|(record, _)| record)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

impl RecordSource for CompactCursor<'_> {
    type Error = Infallible;

    fn header(&self) -> &Header {
        &self.trace.header
    }

    fn next_record(&mut self) -> Result<Option<Record<'_>>, Infallible> {
        Ok(self.next_with_line().map(|(record, _)| record))
    }

    fn line(&self) -> Option<u64> {
        self.line
    }
}
