//! The Mooncake reader's errors: a timing that cannot be used, a line that is not a request,
//! and the reader's error naming the line.

use crate::trace::{MAX_BLOCKS_PER_RECORD, MAX_LINE_BYTES};

/// A [`MooncakeTiming`](super::MooncakeTiming) that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimingError {
    /// `block_tokens` is 0.
    ZeroBlockTokens,
    /// `prefill_tokens_per_s` is 0.
    ZeroPrefillSpeed,
}

impl core::fmt::Display for TimingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TimingError::ZeroBlockTokens => "block_tokens must be at least 1",
            TimingError::ZeroPrefillSpeed => "prefill_tokens_per_s must be at least 1",
        })
    }
}

impl core::error::Error for TimingError {}

/// A field of a Mooncake line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MooncakeField {
    /// `timestamp`.
    Timestamp,
    /// `input_length`.
    InputLength,
    /// `output_length`.
    OutputLength,
    /// `hash_ids`.
    HashIds,
}

impl core::fmt::Display for MooncakeField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MooncakeField::Timestamp => "timestamp",
            MooncakeField::InputLength => "input_length",
            MooncakeField::OutputLength => "output_length",
            MooncakeField::HashIds => "hash_ids",
        })
    }
}

/// What is wrong with a Mooncake line (see [`MooncakeLineError`] for the line number).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MooncakeErrorKind {
    /// The line is not a JSON object of the expected shape (serde_json's message, without its
    /// position, and the 1-based column).
    Json {
        /// The 1-based column where parsing stopped (0 when unknown).
        column: usize,
        /// What serde_json found.
        message: String,
    },
    /// The line is JSON but not an object (serde would read an array by position).
    NotAnObject,
    /// A required field is absent or `null`.
    MissingField {
        /// The field.
        field: MooncakeField,
    },
    /// A field (or one hash id, `index` 1-based) is negative.
    Negative {
        /// The field.
        field: MooncakeField,
        /// For `hash_ids`, the 1-based position of the id.
        index: Option<usize>,
    },
    /// A field (or one hash id) is not an integer below 2^64 (a fraction, an exponent, or too
    /// large).
    NotAnInteger {
        /// The field.
        field: MooncakeField,
        /// For `hash_ids`, the 1-based position of the id.
        index: Option<usize>,
    },
    /// The timestamp is lower than the previous line's.
    TimestampDecreased {
        /// The previous line's timestamp.
        previous: u64,
        /// This line's.
        found: u64,
    },
    /// A time of the request (in µs) does not fit in 64 bits.
    TimeOverflow,
    /// The request has more full blocks than [`MAX_BLOCKS_PER_RECORD`].
    TooManyBlocks {
        /// Its full blocks.
        blocks: u64,
    },
    /// More requests would be in flight at once than the reader holds
    /// ([`MooncakeReader::with_max_in_flight`](super::MooncakeReader::with_max_in_flight),
    /// default [`MAX_OPEN_REQUESTS`](crate::trace::MAX_OPEN_REQUESTS)).
    TooManyInFlight,
    /// The line is longer than [`MAX_LINE_BYTES`] bytes.
    LineTooLong,
}

impl core::fmt::Display for MooncakeErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use MooncakeErrorKind as K;
        let at = |index: &Option<usize>| index.map_or_else(String::new, |i| format!(" (id {i})"));
        match self {
            K::Json { column, message } => write!(
                f,
                "not a Mooncake request object (column {column}): {message}"
            ),
            K::NotAnObject => f.write_str("not a JSON object"),
            K::MissingField { field } => write!(f, "missing field `{field}`"),
            K::Negative { field, index } => write!(f, "`{field}`{} is negative", at(index)),
            K::NotAnInteger { field, index } => write!(
                f,
                "`{field}`{} is not an integer from 0 to 2^64 - 1",
                at(index)
            ),
            K::TimestampDecreased { previous, found } => write!(
                f,
                "timestamp {found} is lower than the previous line's {previous}"
            ),
            K::TimeOverflow => f.write_str("the request's times in microseconds overflow 64 bits"),
            K::TooManyBlocks { blocks } => write!(
                f,
                "{blocks} full blocks exceed the limit of {MAX_BLOCKS_PER_RECORD} per request"
            ),
            K::TooManyInFlight => f.write_str(
                "too many requests in flight at once (a request arrives before enough earlier \
                 ones complete)",
            ),
            K::LineTooLong => write!(f, "line longer than {MAX_LINE_BYTES} bytes"),
        }
    }
}

/// A malformed Mooncake trace: the 1-based line and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MooncakeLineError {
    /// The 1-based line number.
    pub line: u64,
    /// What is wrong.
    pub kind: MooncakeErrorKind,
}

impl core::fmt::Display for MooncakeLineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)
    }
}

impl core::error::Error for MooncakeLineError {}

/// An error of [`MooncakeReader`](super::MooncakeReader): a malformed line, or the underlying
/// reader failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum MooncakeError {
    /// A malformed line.
    Line(MooncakeLineError),
    /// Reading failed at the given 1-based line.
    Io {
        /// The line being read.
        line: u64,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl MooncakeError {
    /// The 1-based line the error is about.
    #[must_use]
    pub const fn line(&self) -> u64 {
        match self {
            MooncakeError::Line(e) => e.line,
            MooncakeError::Io { line, .. } => *line,
        }
    }
}

impl core::fmt::Display for MooncakeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MooncakeError::Line(e) => e.fmt(f),
            MooncakeError::Io { line, source } => write!(f, "line {line}: read error: {source}"),
        }
    }
}

impl core::error::Error for MooncakeError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            MooncakeError::Line(e) => Some(e),
            MooncakeError::Io { source, .. } => Some(source),
        }
    }
}
