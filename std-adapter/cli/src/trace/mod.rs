//! kvtrace v1 (`docs/formats/kvtrace.md`): the streaming reader and the writer of the file format.
//!
//! A kvtrace is text, one record per line: `# key=value` header lines (the first is
//! `# format=kvtrace v1`), then `L rid n h1 … hn` (request `rid` arrives with its `n` block
//! hashes, 16 lowercase hex digits each), `S rid` (its store phase begins) and `C rid` (its stores
//! completed). Every request has one `L`, then one `S`, then one `C`; records of different
//! requests interleave.
//!
//! - [`TraceReader`] reads any [`std::io::BufRead`] in constant memory and lends each
//!   [`Record`]'s hashes; every malformed input is a [`TraceError`] naming the line.
//! - [`TraceWriter`] writes a [`Header`] and records.
//! - [`CompactTrace`] holds a trace parsed once (or one chunk of it) in two flat buffers.
//! - [`MooncakeReader`] reads a Mooncake JSONL trace as kvtrace records.
//! - [`RecordSource`] lets a replay take any of them, or the built-in workload's
//!   [`Generator`](crate::workload::Generator).
//!
//! Hard limits of the reader (inputs beyond them are errors, not allocations):
//! [`MAX_LINE_BYTES`], [`MAX_BLOCKS_PER_RECORD`], [`MAX_OPEN_REQUESTS`],
//! [`MAX_COMPLETED_RANGES`], [`MAX_HEADER_LINES`], [`MAX_HEADER_BYTES`],
//! [`MAX_HEADER_VALUE_BYTES`].
//!
//! ```
//! use kvtier_cli::trace::{Header, Record, TraceReader, TraceWriter};
//! let mut file = Vec::new();
//! let mut writer = TraceWriter::new(&mut file, &Header::default())?;
//! writer.write_record(&Record::Load { rid: 0, hashes: &[0xab, 0xcd] })?;
//! writer.write_record(&Record::Start { rid: 0 })?;
//! writer.write_record(&Record::Complete { rid: 0 })?;
//! writer.finish()?;
//!
//! let mut reader = TraceReader::new(file.as_slice())?;
//! let mut records = 0;
//! while reader.next_record()?.is_some() {
//!     records += 1;
//! }
//! assert_eq!(records, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod compact;
mod error;
mod header;
mod hex;
mod mooncake;
mod reader;
mod record;
mod tracker;
mod writer;

pub use compact::{CompactCursor, CompactError, CompactLimits, CompactTrace};
pub use error::{Field, ReadError, TraceError, TraceErrorKind};
pub use header::{DEFAULT_BLOCK_TOKENS, FORMAT_V1, Header, HeaderKey};
pub use hex::{HashProblem, format_hash, parse_hash};
pub use mooncake::{
    DEFAULT_DECODE_US_PER_TOKEN, DEFAULT_MOONCAKE_BLOCK_TOKENS, DEFAULT_PREFILL_TOKENS_PER_S,
    MooncakeError, MooncakeErrorKind, MooncakeField, MooncakeLineError, MooncakeReader,
    MooncakeTiming, TimingError,
};
pub use reader::TraceReader;
pub use record::{OwnedRecord, Record, RecordKind};
pub use writer::{TraceWriter, WriteError};

/// The longest line the reader accepts, in bytes without the `\n` (2 MiB: room for an `L` of
/// [`MAX_BLOCKS_PER_RECORD`] hashes). A longer line is [`TraceErrorKind::LineTooLong`], found
/// without buffering more than this.
pub const MAX_LINE_BYTES: usize = 2 * 1024 * 1024;

/// The largest `n` of an `L` record (65,536 blocks, i.e. 1,048,576 tokens at 16 per block).
pub const MAX_BLOCKS_PER_RECORD: u64 = 65_536;

/// The most requests the reader lets be open (loaded, not completed) at once.
pub const MAX_OPEN_REQUESTS: usize = 1 << 20;

/// The most header lines the reader accepts.
pub const MAX_HEADER_LINES: usize = 1024;

/// The most bytes of header lines the reader accepts, over all of them (64 KiB, line ends
/// excluded).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The longest header value the reader accepts (4 KiB).
pub const MAX_HEADER_VALUE_BYTES: usize = 4 * 1024;

/// The most separate ranges the completed request ids may form (the reader remembers them
/// to reject a repeated `L`). Ids given as `0, 1, 2, …` in `L` order — what every generator
/// writes — never form more ranges than there are requests open plus one, so this is reached
/// only by ids with gaps, such as even ids alone.
pub const MAX_COMPLETED_RANGES: usize = MAX_OPEN_REQUESTS;

/// A stream of kvtrace records: a [`TraceReader`], a [`MooncakeReader`] or the workload's
/// [`Generator`](crate::workload::Generator), so a replay can take any of them.
pub trait RecordSource {
    /// The error of reading a record ([`core::convert::Infallible`] for the generator).
    type Error;

    /// The trace's header.
    fn header(&self) -> &Header;

    /// The next record, or `None` at the end.
    ///
    /// # Errors
    /// The source's error.
    fn next_record(&mut self) -> Result<Option<Record<'_>>, Self::Error>;

    /// The 1-based line of the record returned last, when the source reads lines (`None`
    /// for the generator, or before the first record).
    fn line(&self) -> Option<u64>;
}

impl<R: std::io::BufRead> RecordSource for TraceReader<R> {
    type Error = ReadError;

    fn header(&self) -> &Header {
        TraceReader::header(self)
    }

    fn next_record(&mut self) -> Result<Option<Record<'_>>, ReadError> {
        TraceReader::next_record(self)
    }

    fn line(&self) -> Option<u64> {
        (self.records_read() > 0).then(|| self.line_number())
    }
}
