//! Converting a Mooncake JSONL trace (`docs/formats/mooncake.md`) into a kvtrace (`kvtier convert
//! --from mooncake IN -o OUT`): records exactly the spec's, with the header it lists.
//!
//! The input is read twice: once to check every line and count the requests (so the header
//! can carry `requests`, `records` and `skipped`, and a bad line leaves no output), then to
//! write.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter};
use std::path::PathBuf;

use crate::input::TimingArgs;
use crate::trace::{MooncakeError, MooncakeReader, TimingError, TraceWriter, WriteError};

/// `--from` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FromArg {
    /// Mooncake-style JSONL.
    Mooncake,
}

/// What to convert, and where to (the options of `kvtier convert`).
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertOptions {
    /// The input's format.
    #[arg(long, value_enum)]
    pub from: FromArg,
    /// The input trace.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// The kvtrace to write.
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
    /// Tokens per hash id.
    #[arg(long, default_value_t = crate::trace::DEFAULT_MOONCAKE_BLOCK_TOKENS, value_name = "N")]
    pub block_tokens: u32,
    /// The timing model.
    #[command(flatten)]
    pub timing: TimingArgs,
}

/// What a conversion wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Requests written (`L` records).
    pub requests: u64,
    /// Requests skipped (no full block).
    pub skipped: u64,
    /// Records written.
    pub records: u64,
    /// Full blocks over all requests.
    pub blocks: u64,
}

/// Why a conversion failed; every message names the file (and line) or the option at fault.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConvertError {
    /// The input could not be opened.
    Open {
        /// The input.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The timing model (`--block-tokens`, `--prefill-tokens-per-s`) is refused.
    Timing(TimingError),
    /// A line of the input is malformed (or reading it failed).
    Read {
        /// The input.
        path: PathBuf,
        /// The line's error.
        error: MooncakeError,
    },
    /// The output could not be created.
    Create {
        /// The output.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// Writing the output failed.
    Write {
        /// The output.
        path: PathBuf,
        /// The writer's error.
        error: WriteError,
    },
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConvertError::Open { path, error } | ConvertError::Create { path, error } => {
                write!(f, "{}: {error}", path.display())
            }
            ConvertError::Timing(e) => write!(f, "--block-tokens / --prefill-tokens-per-s: {e}"),
            ConvertError::Read { path, error } => write!(f, "{}: {error}", path.display()),
            ConvertError::Write { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for ConvertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConvertError::Open { error, .. } | ConvertError::Create { error, .. } => Some(error),
            ConvertError::Timing(e) => Some(e),
            ConvertError::Read { error, .. } => Some(error),
            ConvertError::Write { error, .. } => Some(error),
        }
    }
}

/// Converts as `options` say.
///
/// # Errors
/// [`ConvertError`] naming the file and line at fault; the output is not created (or is
/// removed) when the input is malformed or writing fails.
pub fn convert(options: &ConvertOptions) -> Result<ConvertSummary, ConvertError> {
    let FromArg::Mooncake = options.from;
    let timing = options.timing.timing(Some(options.block_tokens));
    let input = &options.input;
    let read = |error| ConvertError::Read {
        path: input.clone(),
        error,
    };
    let open = || -> Result<MooncakeReader<BufReader<File>>, ConvertError> {
        let file = File::open(input).map_err(|error| ConvertError::Open {
            path: input.clone(),
            error,
        })?;
        MooncakeReader::new(BufReader::with_capacity(1 << 16, file), timing)
            .map_err(ConvertError::Timing)
    };
    // Pass 1: check every line and count.
    let mut check = open()?;
    while check.next_record().map_err(read)?.is_some() {}
    let mut header = check.header().clone();
    header.requests = Some(check.requests());
    header.records = Some(check.requests().saturating_mul(3));
    header
        .extra
        .push(("skipped".to_owned(), check.skipped().to_string()));
    let summary = ConvertSummary {
        requests: check.requests(),
        skipped: check.skipped(),
        records: check.requests().saturating_mul(3),
        blocks: check.blocks(),
    };
    // Pass 2: write.
    let out = &options.output;
    let write_err = |error| ConvertError::Write {
        path: out.clone(),
        error,
    };
    let write = || -> Result<(), ConvertError> {
        let file = File::create(out).map_err(|error| ConvertError::Create {
            path: out.clone(),
            error,
        })?;
        let mut writer = TraceWriter::new(BufWriter::new(file), &header).map_err(write_err)?;
        let mut reader = open()?;
        while let Some(rec) = reader.next_record().map_err(read)? {
            writer.write_record(&rec).map_err(write_err)?;
        }
        writer.finish().map_err(write_err)?;
        Ok(())
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(out);
    })?;
    Ok(summary)
}
