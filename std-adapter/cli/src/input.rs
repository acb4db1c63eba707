//! Opening a trace file in either format, for a replay, a sweep and `serve`: kvtrace
//! (`docs/formats/kvtrace.md`) or Mooncake JSONL (`docs/formats/mooncake.md`), chosen by `--format` or
//! detected from the first non-whitespace byte (`#` kvtrace, `{` Mooncake) by
//! [`detect_format`]; [`TraceInput`] reads either as one [`RecordSource`].

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::trace::{
    DEFAULT_DECODE_US_PER_TOKEN, DEFAULT_MOONCAKE_BLOCK_TOKENS, DEFAULT_PREFILL_TOKENS_PER_S,
    Header, MooncakeError, MooncakeReader, MooncakeTiming, ReadError, Record, RecordSource,
    TimingError, TraceReader,
};

/// `--format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FormatArg {
    /// Detect from the content: `#` first is kvtrace, `{` first is Mooncake JSONL.
    #[default]
    Auto,
    /// kvtrace v1.
    Kvtrace,
    /// Mooncake-style JSONL, one request per line.
    Mooncake,
}

/// A trace format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// kvtrace v1.
    Kvtrace,
    /// Mooncake-style JSONL.
    Mooncake,
}

impl TraceFormat {
    /// The format's name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            TraceFormat::Kvtrace => "kvtrace",
            TraceFormat::Mooncake => "mooncake",
        }
    }
}

/// The Mooncake timing model's options (the block size is the command's `--block-tokens`).
#[derive(Debug, Clone, clap::Args)]
pub struct TimingArgs {
    /// Mooncake traces: prefill speed in tokens per second (sets each `S` time).
    #[arg(long, default_value_t = DEFAULT_PREFILL_TOKENS_PER_S, value_name = "N")]
    pub prefill_tokens_per_s: u64,
    /// Mooncake traces: decode time per output token in microseconds (sets each `C` time).
    #[arg(long, default_value_t = DEFAULT_DECODE_US_PER_TOKEN, value_name = "US")]
    pub decode_us_per_token: u64,
}

impl Default for TimingArgs {
    fn default() -> Self {
        TimingArgs {
            prefill_tokens_per_s: DEFAULT_PREFILL_TOKENS_PER_S,
            decode_us_per_token: DEFAULT_DECODE_US_PER_TOKEN,
        }
    }
}

impl TimingArgs {
    /// The Mooncake timing model, with `block_tokens` (default 512).
    #[must_use]
    pub fn timing(&self, block_tokens: Option<u32>) -> MooncakeTiming {
        MooncakeTiming {
            block_tokens: block_tokens.unwrap_or(DEFAULT_MOONCAKE_BLOCK_TOKENS),
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            decode_us_per_token: self.decode_us_per_token,
        }
    }
}

/// The trace-format options shared by `replay`, `serve` and `sweep`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FormatArgs {
    /// The trace's format (auto: `#` first is kvtrace, `{` first is Mooncake JSONL).
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    pub format: FormatArg,
    /// The Mooncake timing model.
    #[command(flatten)]
    pub timing: TimingArgs,
}

impl FormatArgs {
    /// The format of the file at `path`: `--format`, or detected.
    ///
    /// # Errors
    /// [`OpenError::Io`] for an unreadable file, [`OpenError::Format`] for (auto) content that
    /// is neither format.
    pub fn resolve(&self, path: &Path) -> Result<TraceFormat, OpenError> {
        match self.format {
            FormatArg::Kvtrace => Ok(TraceFormat::Kvtrace),
            FormatArg::Mooncake => Ok(TraceFormat::Mooncake),
            FormatArg::Auto => {
                let file = File::open(path).map_err(|error| OpenError::Io {
                    path: path.to_owned(),
                    error,
                })?;
                detect_format(file).map_err(|error| OpenError::Format {
                    path: path.to_owned(),
                    error,
                })
            }
        }
    }

    /// Opens `reader` (the content of a trace in `format`) as a record source.
    ///
    /// # Errors
    /// [`ReaderError`]: the kvtrace header's error, or a bad timing parameter.
    pub fn open_reader<R: BufRead>(
        &self,
        format: TraceFormat,
        reader: R,
        block_tokens: Option<u32>,
    ) -> Result<TraceInput<R>, ReaderError> {
        match format {
            TraceFormat::Kvtrace => TraceReader::new(reader)
                .map(TraceInput::Kvtrace)
                .map_err(ReaderError::Header),
            TraceFormat::Mooncake => MooncakeReader::new(reader, self.timing.timing(block_tokens))
                .map(TraceInput::Mooncake)
                .map_err(ReaderError::Timing),
        }
    }

    /// Opens the file at `path` (through `wrap`, e.g. a progress bar's reader). A Mooncake
    /// trace has no capacity of its own: `capacity_given` must then be true.
    ///
    /// # Errors
    /// [`OpenError`], whose message starts with the path: unreadable, neither format, a bad
    /// kvtrace header, or a Mooncake trace without `--capacity`.
    pub fn open_path<R: Read>(
        &self,
        path: &Path,
        block_tokens: Option<u32>,
        capacity_given: bool,
        wrap: impl FnOnce(File) -> R,
    ) -> Result<TraceInput<BufReader<R>>, OpenError> {
        let format = self.resolve(path)?;
        if format == TraceFormat::Mooncake && !capacity_given {
            return Err(OpenError::NoCapacity {
                path: path.to_owned(),
            });
        }
        let file = File::open(path).map_err(|error| OpenError::Io {
            path: path.to_owned(),
            error,
        })?;
        self.open_reader(
            format,
            BufReader::with_capacity(1 << 16, wrap(file)),
            block_tokens,
        )
        .map_err(|error| OpenError::Reader {
            path: path.to_owned(),
            error,
        })
    }
}

/// Why [`detect_format`] found no format.
#[derive(Debug)]
#[non_exhaustive]
pub enum FormatError {
    /// Reading the content failed.
    Read(io::Error),
    /// The content is empty (or only whitespace).
    Empty,
    /// The first non-whitespace byte is neither `#` nor `{`.
    Unknown,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Read(e) => e.fmt(f),
            FormatError::Empty => f.write_str(
                "empty trace: expected a kvtrace (`# format=kvtrace v1` first) or a \
                 Mooncake JSONL trace (one `{...}` request per line)",
            ),
            FormatError::Unknown => f.write_str(
                "unknown trace format: a kvtrace starts with `# format=kvtrace v1`, \
                 a Mooncake JSONL trace with `{` (give --format to choose)",
            ),
        }
    }
}

impl std::error::Error for FormatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FormatError::Read(e) => Some(e),
            _ => None,
        }
    }
}

/// Why [`FormatArgs::open_reader`] could not open a trace's content.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReaderError {
    /// The kvtrace header is malformed.
    Header(ReadError),
    /// The Mooncake timing model (`--block-tokens`, `--prefill-tokens-per-s`) is refused.
    Timing(TimingError),
}

impl fmt::Display for ReaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReaderError::Header(e) => e.fmt(f),
            ReaderError::Timing(e) => write!(f, "--block-tokens / --prefill-tokens-per-s: {e}"),
        }
    }
}

impl std::error::Error for ReaderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReaderError::Header(e) => Some(e),
            ReaderError::Timing(e) => Some(e),
        }
    }
}

/// Why [`FormatArgs::resolve`] or [`FormatArgs::open_path`] could not open a trace file; the
/// message starts with the path.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The file could not be opened.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The content is neither format.
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        error: FormatError,
    },
    /// A Mooncake trace, which has no capacity of its own, without `--capacity`.
    NoCapacity {
        /// The file.
        path: PathBuf,
    },
    /// The content could not be opened as its format.
    Reader {
        /// The file.
        path: PathBuf,
        /// Why.
        error: ReaderError,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            OpenError::Format { path, error } => write!(f, "{}: {error}", path.display()),
            OpenError::NoCapacity { path } => write!(
                f,
                "{}: a Mooncake trace has no capacity of its own: give --capacity \
                 (in chunks of --block-tokens tokens, default 512)",
                path.display()
            ),
            OpenError::Reader { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { error, .. } => Some(error),
            OpenError::Format { error, .. } => Some(error),
            OpenError::NoCapacity { .. } => None,
            OpenError::Reader { error, .. } => Some(error),
        }
    }
}

/// The format of a trace from its first non-whitespace byte: `#` kvtrace, `{` Mooncake JSONL.
///
/// ```
/// use kvtier_cli::input::{FormatError, TraceFormat, detect_format};
/// assert_eq!(detect_format(&b"# format=kvtrace v1\n"[..]).ok(), Some(TraceFormat::Kvtrace));
/// assert_eq!(detect_format(&b"\n {\"timestamp\": 0}"[..]).ok(), Some(TraceFormat::Mooncake));
/// assert!(matches!(detect_format(&b"L 0 1 00"[..]), Err(FormatError::Unknown)));
/// ```
///
/// # Errors
/// [`FormatError`]: other content (its message names both formats), an empty input or a
/// read error.
pub fn detect_format(mut reader: impl Read) -> Result<TraceFormat, FormatError> {
    let mut buf = [0u8; 4096];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FormatError::Read(e)),
        };
        if n == 0 {
            return Err(FormatError::Empty);
        }
        match buf[..n].iter().find(|b| !b.is_ascii_whitespace()) {
            None => {}
            Some(b'#') => return Ok(TraceFormat::Kvtrace),
            Some(b'{') => return Ok(TraceFormat::Mooncake),
            Some(_) => return Err(FormatError::Unknown),
        }
    }
}

/// A trace in either format, as one [`RecordSource`].
#[derive(Debug)]
pub enum TraceInput<R> {
    /// A kvtrace.
    Kvtrace(TraceReader<R>),
    /// A Mooncake JSONL trace.
    Mooncake(MooncakeReader<R>),
}

/// An error of [`TraceInput`].
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceInputError {
    /// The kvtrace reader's.
    Kvtrace(ReadError),
    /// The Mooncake reader's.
    Mooncake(MooncakeError),
}

impl core::fmt::Display for TraceInputError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TraceInputError::Kvtrace(e) => e.fmt(f),
            TraceInputError::Mooncake(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for TraceInputError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            TraceInputError::Kvtrace(e) => Some(e),
            TraceInputError::Mooncake(e) => Some(e),
        }
    }
}

impl<R: BufRead> TraceInput<R> {
    /// The format.
    #[must_use]
    pub const fn format(&self) -> TraceFormat {
        match self {
            TraceInput::Kvtrace(_) => TraceFormat::Kvtrace,
            TraceInput::Mooncake(_) => TraceFormat::Mooncake,
        }
    }
}

impl<R: BufRead> RecordSource for TraceInput<R> {
    type Error = TraceInputError;

    fn header(&self) -> &Header {
        match self {
            TraceInput::Kvtrace(r) => r.header(),
            TraceInput::Mooncake(r) => r.header(),
        }
    }

    fn next_record(&mut self) -> Result<Option<Record<'_>>, TraceInputError> {
        match self {
            TraceInput::Kvtrace(r) => r.next_record().map_err(TraceInputError::Kvtrace),
            TraceInput::Mooncake(r) => r.next_record().map_err(TraceInputError::Mooncake),
        }
    }

    fn line(&self) -> Option<u64> {
        match self {
            TraceInput::Kvtrace(r) => r.line(),
            TraceInput::Mooncake(r) => r.line(),
        }
    }
}
