//! What can be wrong with a kvtrace: [`TraceError`] (a line number and a [`TraceErrorKind`]) and
//! [`ReadError`] (a [`TraceError`] or an I/O failure of the underlying reader).

use super::header::HeaderKey;
use super::hex::HashProblem;
use super::record::RecordKind;

/// A field of a record line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// The request id (`rid`) of any record.
    RequestId,
    /// The block count `n` of an `L` record.
    BlockCount,
}

impl core::fmt::Display for Field {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Field::RequestId => "request id",
            Field::BlockCount => "block count",
        })
    }
}

/// What is wrong with a kvtrace, without the line number (see [`TraceError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The input is empty or its first line is not a `# key=value` header line.
    MissingFormatHeader,
    /// The first header line is not `# format=kvtrace v1`.
    WrongFirstHeader,
    /// The `format` header names another format or version than `kvtrace v1`.
    UnsupportedFormat,
    /// A line starting with `#` is not of the form `# key=value` with a non-empty key, or it
    /// holds a carriage return.
    MalformedHeader,
    /// A header key appears twice.
    DuplicateHeaderKey,
    /// A known header key has a value that is not what it must be (a decimal u64; for
    /// `block_tokens` a decimal u32 ≥ 1).
    BadHeaderValue {
        /// The key.
        key: HeaderKey,
    },
    /// More header lines than [`super::MAX_HEADER_LINES`].
    TooManyHeaderLines,
    /// The header lines together are longer than [`super::MAX_HEADER_BYTES`].
    HeaderTooLarge,
    /// A header value is longer than [`super::MAX_HEADER_VALUE_BYTES`].
    HeaderValueTooLong,
    /// The file starts with a UTF-8 byte order mark.
    ByteOrderMark,
    /// A line ends in a carriage return (CRLF line ends).
    CarriageReturn,
    /// A record line ends in a space or a tab.
    TrailingWhitespace,
    /// A number field of a record has a leading zero (`007`).
    LeadingZero {
        /// The field.
        field: Field,
    },
    /// A header line after the first record.
    HeaderAfterRecords,
    /// An empty line.
    EmptyLine,
    /// The line does not start with `L `, `S ` or `C `.
    UnknownRecord,
    /// A field is missing at the end of the line.
    MissingField {
        /// The field.
        field: Field,
    },
    /// A field is not a decimal u64 (empty, a non-digit, a doubled space, or too large).
    BadNumber {
        /// The field.
        field: Field,
    },
    /// An `S` or `C` line has something after its request id.
    TrailingField,
    /// An `L` record with `n = 0`.
    ZeroBlocks,
    /// An `L` record whose `n` exceeds [`super::MAX_BLOCKS_PER_RECORD`].
    TooManyBlocks {
        /// The `n` the line declares.
        declared: u64,
    },
    /// An `L` record whose number of hashes is not its `n`.
    BlockCountMismatch {
        /// The `n` the line declares.
        declared: u64,
        /// The number of hash fields the line holds.
        found: u64,
    },
    /// A hash field is not 16 lowercase hex digits.
    BadHash {
        /// The hash's position in the record, 1-based.
        index: u64,
        /// What is wrong with it.
        problem: HashProblem,
    },
    /// An `L` for a request id already loaded (still open, or `completed`).
    RepeatedLoad {
        /// The request id.
        rid: u64,
        /// Whether the earlier request had already completed.
        completed: bool,
    },
    /// An `S` or `C` for a request id that has no `L` before it.
    UnknownRequest {
        /// The record.
        record: RecordKind,
        /// The request id.
        rid: u64,
    },
    /// An `S` or `C` for a request that already completed.
    AfterComplete {
        /// The record.
        record: RecordKind,
        /// The request id.
        rid: u64,
    },
    /// A second `S` for the same request.
    RepeatedStart {
        /// The request id.
        rid: u64,
    },
    /// A `C` for a request that has had its `L` but not its `S`.
    CompleteBeforeStart {
        /// The request id.
        rid: u64,
    },
    /// More requests open at once than [`super::MAX_OPEN_REQUESTS`].
    TooManyOpenRequests,
    /// The completed request ids form more than [`super::MAX_COMPLETED_RANGES`] separate
    /// ranges (ids far from `0, 1, 2, …` in `L` order).
    SparseRequestIds,
    /// The input ended while requests were open; the error's line is the `L` of the open request
    /// with the smallest id.
    OpenAtEnd {
        /// The smallest open request id.
        rid: u64,
        /// How many requests were left open.
        open: u64,
    },
    /// The `records` header does not match the number of records in the file (the file may
    /// have been cut short).
    RecordCountMismatch {
        /// The header's `records`.
        declared: u64,
        /// The records read.
        found: u64,
    },
    /// The `requests` header does not match the number of `L` records in the file.
    RequestCountMismatch {
        /// The header's `requests`.
        declared: u64,
        /// The `L` records read.
        found: u64,
    },
    /// The line is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than [`super::MAX_LINE_BYTES`] bytes (line end excluded).
    LineTooLong,
}

impl core::fmt::Display for TraceErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use TraceErrorKind as K;
        match *self {
            K::MissingFormatHeader => f.write_str("missing the `# format=kvtrace v1` header"),
            K::WrongFirstHeader => {
                f.write_str("the first header line must be `# format=kvtrace v1`")
            }
            K::UnsupportedFormat => f.write_str("unsupported format (only `kvtrace v1` is read)"),
            K::MalformedHeader => f.write_str("malformed header line (expected `# key=value`)"),
            K::DuplicateHeaderKey => f.write_str("header key given twice"),
            K::BadHeaderValue { key } => {
                write!(f, "bad value for header `{key}`: {}", key.expects())
            }
            K::TooManyHeaderLines => {
                write!(f, "more than {} header lines", super::MAX_HEADER_LINES)
            }
            K::HeaderTooLarge => write!(
                f,
                "the header lines exceed {} bytes in total",
                super::MAX_HEADER_BYTES
            ),
            K::HeaderValueTooLong => write!(
                f,
                "header value longer than {} bytes",
                super::MAX_HEADER_VALUE_BYTES
            ),
            K::ByteOrderMark => f.write_str(
                "a UTF-8 byte order mark (BOM) is not allowed: the file must start with \
                 `# format=kvtrace v1`",
            ),
            K::CarriageReturn => {
                f.write_str("CRLF line endings are not allowed (kvtrace lines end in `\\n` alone)")
            }
            K::TrailingWhitespace => {
                f.write_str("malformed line: trailing whitespace at the end of the line")
            }
            K::LeadingZero { field } => write!(
                f,
                "malformed line: the {field} has a leading zero (write `7`, not `007`)"
            ),
            K::HeaderAfterRecords => f.write_str("header line after the first record"),
            K::EmptyLine => f.write_str("empty line"),
            K::UnknownRecord => {
                f.write_str("malformed line: expected `L `, `S ` or `C ` at its start")
            }
            K::MissingField { field } => write!(f, "malformed line: missing the {field}"),
            K::BadNumber { field } => write!(f, "malformed line: the {field} is not a decimal u64"),
            K::TrailingField => {
                f.write_str("malformed line: unexpected field after the request id")
            }
            K::ZeroBlocks => f.write_str("an `L` record needs n >= 1 blocks, found n = 0"),
            K::TooManyBlocks { declared } => write!(
                f,
                "n = {declared} blocks exceeds the limit of {} per record",
                super::MAX_BLOCKS_PER_RECORD
            ),
            K::BlockCountMismatch { declared, found } => {
                write!(f, "n = {declared} but the line holds {found} hashes")
            }
            K::BadHash { index, problem } => write!(f, "hash {index} {problem}"),
            K::RepeatedLoad { rid, completed } => {
                let state = if completed { "completed" } else { "open" };
                write!(f, "repeated `L` for request {rid} (already {state})")
            }
            K::UnknownRequest { record, rid } => {
                write!(
                    f,
                    "`{}` for unknown request {rid} (no `L` before it)",
                    record.letter()
                )
            }
            K::AfterComplete { record, rid } => {
                write!(
                    f,
                    "`{}` for request {rid}, which already completed",
                    record.letter()
                )
            }
            K::RepeatedStart { rid } => write!(f, "repeated `S` for request {rid}"),
            K::CompleteBeforeStart { rid } => {
                write!(f, "`C` for request {rid} before its `S`")
            }
            K::TooManyOpenRequests => write!(
                f,
                "more than {} requests open at once",
                super::MAX_OPEN_REQUESTS
            ),
            K::SparseRequestIds => write!(
                f,
                "the completed request ids form more than {} separate ranges: request ids \
                 must stay close to 0, 1, 2, … in `L` order",
                super::MAX_COMPLETED_RANGES
            ),
            K::OpenAtEnd { rid, open } => write!(
                f,
                "request {rid}, loaded here, is still open at the end of the input \
                 ({open} requests left open)"
            ),
            K::RecordCountMismatch { declared, found } => {
                write!(
                    f,
                    "the header declares {declared} records, the file holds {found}"
                )
            }
            K::RequestCountMismatch { declared, found } => {
                write!(
                    f,
                    "the header declares {declared} requests, the file holds {found}"
                )
            }
            K::InvalidUtf8 => f.write_str("invalid UTF-8"),
            K::LineTooLong => write!(f, "line longer than {} bytes", super::MAX_LINE_BYTES),
        }
    }
}

/// A malformed kvtrace: the 1-based line number and what is wrong there.
///
/// Errors found at the end of the input (a request left open, a count mismatch) name the line of
/// the open request's `L`, or one past the last line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceError {
    /// The 1-based line number.
    pub line: u64,
    /// What is wrong.
    pub kind: TraceErrorKind,
}

impl core::fmt::Display for TraceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)
    }
}

impl core::error::Error for TraceError {}

/// An error of [`super::TraceReader`]: the trace is malformed, or the underlying reader failed.
#[derive(Debug)]
pub enum ReadError {
    /// The trace is malformed.
    Trace(TraceError),
    /// Reading failed at the given 1-based line.
    Io {
        /// The line being read.
        line: u64,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl ReadError {
    /// The trace error, if this is one.
    #[must_use]
    pub const fn trace_error(&self) -> Option<&TraceError> {
        match self {
            ReadError::Trace(e) => Some(e),
            ReadError::Io { .. } => None,
        }
    }

    /// The 1-based line number the error is about.
    #[must_use]
    pub const fn line(&self) -> u64 {
        match self {
            ReadError::Trace(e) => e.line,
            ReadError::Io { line, .. } => *line,
        }
    }
}

impl From<TraceError> for ReadError {
    fn from(e: TraceError) -> Self {
        ReadError::Trace(e)
    }
}

impl core::fmt::Display for ReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReadError::Trace(e) => e.fmt(f),
            ReadError::Io { line, source } => write!(f, "line {line}: read error: {source}"),
        }
    }
}

impl core::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            ReadError::Trace(e) => Some(e),
            ReadError::Io { source, .. } => Some(source),
        }
    }
}
