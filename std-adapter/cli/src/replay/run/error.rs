//! [`RunError`]: why a replay run failed, naming the file, the line and the option at fault.

use std::convert::Infallible;
use std::fmt;
use std::path::PathBuf;

use kvtier::kv_events::PublishError;
use kvtier_core::stats::{AggregateError, UpdateError};

use crate::engine::EngineError;
use crate::input::{OpenError, TraceInputError};
use crate::replay::ManagerError;
use crate::replay::ReplayError;
use crate::replay::TransferError;
use crate::trace::CompactError;
use crate::workload::GeneratorError;

/// Why a replay run failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// The trace file could not be opened.
    Open(OpenError),
    /// The built-in workload's configuration is refused.
    Workload(GeneratorError),
    /// The manager could not be built.
    Manager(ManagerError),
    /// `--block-tokens` (or the header's `block_tokens`) is 0.
    ZeroBlockTokens,
    /// The transfer model could not be built.
    Transfer(TransferError),
    /// A record could not be read (a malformed trace, an I/O error, out of memory).
    Read(CompactError<TraceInputError>),
    /// A record could not be replayed.
    Record {
        /// The record's line, when the source has lines.
        line: Option<u64>,
        /// The 1-based record.
        record: u64,
        /// Why.
        error: ReplayError,
    },
    /// The stats could not be aggregated.
    Stats(AggregateError),
    /// The engine model in front of the tier stopped (`--gpu-blocks`).
    Engine {
        /// The record's line, when the source has lines (none at the trace's end).
        line: Option<u64>,
        /// The 1-based record (the record count at the trace's end).
        record: u64,
        /// Why.
        error: EngineError<ReplayError>,
    },
    /// A GPU series could not be added to the stats.
    Series(UpdateError),
    /// The stats collector of `kvtier serve` has stopped.
    Collector(kvtier::shared::CollectorClosed),
    /// The KV-events publisher could not start or has stopped.
    KvEvents(PublishError),
    /// An error while replaying the trace file `path`.
    Trace {
        /// The trace file.
        path: PathBuf,
        /// The error.
        error: Box<RunError>,
    },
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Open(e) => e.fmt(f),
            RunError::Workload(e) => e.fmt(f),
            RunError::Manager(e) => e.fmt(f),
            RunError::ZeroBlockTokens => f.write_str("--block-tokens must be at least 1"),
            RunError::Transfer(e) => e.fmt(f),
            RunError::Read(e) => e.fmt(f),
            RunError::Record {
                line,
                record,
                error,
            } => {
                let hint = option_hint(error);
                match line {
                    Some(line) => write!(f, "line {line}: {error}{hint}"),
                    None => write!(f, "record {record}: {error}{hint}"),
                }
            }
            RunError::Stats(e) => e.fmt(f),
            RunError::Engine {
                line: Some(line),
                error,
                ..
            } => write!(f, "line {line}: {error}"),
            RunError::Engine { record, error, .. } => write!(f, "record {record}: {error}"),
            RunError::Series(e) => e.fmt(f),
            RunError::Collector(e) => e.fmt(f),
            RunError::KvEvents(e) => e.fmt(f),
            RunError::Trace { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Open(e) => Some(e),
            RunError::Workload(e) => Some(e),
            RunError::Manager(e) => Some(e),
            RunError::ZeroBlockTokens => None,
            RunError::Transfer(e) => Some(e),
            RunError::Read(e) => Some(e),
            RunError::Record { error, .. } => Some(error),
            RunError::Stats(e) => Some(e),
            RunError::Engine { error, .. } => Some(error),
            RunError::Series(e) => Some(e),
            RunError::Collector(e) => Some(e),
            RunError::KvEvents(e) => Some(e),
            RunError::Trace { error, .. } => Some(error.as_ref()),
        }
    }
}

crate::from_variants::from_variants!(
    RunError:
    OpenError => Open,
    GeneratorError => Workload,
    ManagerError => Manager,
    TransferError => Transfer,
    AggregateError => Stats,
    UpdateError => Series,
    kvtier::shared::CollectorClosed => Collector,
    PublishError => KvEvents,
);

impl From<TraceInputError> for RunError {
    fn from(e: TraceInputError) -> Self {
        RunError::Read(CompactError::Source(e))
    }
}

impl From<CompactError<TraceInputError>> for RunError {
    fn from(e: CompactError<TraceInputError>) -> Self {
        RunError::Read(e)
    }
}

/// The generator never fails to give a record.
impl From<Infallible> for RunError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

/// The generator's records: only the chunk's own limits can fail.
impl From<CompactError<Infallible>> for RunError {
    fn from(e: CompactError<Infallible>) -> Self {
        RunError::Read(match e {
            CompactError::Source(never) => match never {},
            CompactError::TooManyRecords { line, max_records } => {
                CompactError::TooManyRecords { line, max_records }
            }
            CompactError::TooManyHashes { line, max_hashes } => {
                CompactError::TooManyHashes { line, max_hashes }
            }
            CompactError::OutOfMemory { line } => CompactError::OutOfMemory { line },
        })
    }
}

impl RunError {
    /// `self`, inside the trace file `path`.
    #[must_use]
    pub fn in_trace(self, path: PathBuf) -> Self {
        RunError::Trace {
            path,
            error: Box::new(self),
        }
    }
}

/// The option that raises the limit a replay error hit, as a sentence's end.
fn option_hint(e: &ReplayError) -> &'static str {
    match e {
        ReplayError::TooManyRequests { .. } => " (raise it with --max-requests)",
        ReplayError::TooManyOpenBlocks { .. } => " (raise it with --max-open-blocks)",
        _ => "",
    }
}
