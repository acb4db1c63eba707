//! The command's umbrella error: every error of the command's operations (a replay run, a
//! sweep, the capacity report, a conversion, serving, printing) and of the std adapter beneath
//! them, with `From` impls so `?` works across them. It sits at the top of the package's
//! layering: it imports the error types of the modules it wraps, and only the command layer
//! ([`crate::cli`]) uses it; no module it wraps imports it back.

use std::fmt;
use std::io;

use kvtier::export::{EncodeError, ExporterError, ObserveError, RenderError};
use kvtier::shared::{CollectorClosed, FrameError, MetricsRegisterError};

use crate::cli::OutputError;
use crate::convert::ConvertError;
use crate::from_variants::from_variants;
use crate::input::{FormatError, OpenError};
use crate::replay::SimpleRunError;
use crate::replay::TransferError;
use crate::replay::{ManagerError, RunError};
use crate::serve::ServeError;
use crate::sizing::{DtypeError, ReportError, SizeError};
use crate::sweep::{ChunkBytesError, GridError, SweepRunError};
use crate::sweep::{RangeError, SweepError};

/// Any error of the `kvtier` command.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An error of the std adapter (export, threading, HTTP) or of kvtier-core.
    Adapter(kvtier::Error),
    /// A trace file could not be opened.
    Open(OpenError),
    /// A trace's format could not be detected.
    Format(FormatError),
    /// A replay run failed.
    Run(RunError),
    /// A replay's manager could not be built.
    Manager(ManagerError),
    /// The replay's transfer model could not be built.
    Transfer(TransferError),
    /// The capacity report could not be computed.
    Report(ReportError),
    /// A size (`--memory`, `--cpu-bytes`) could not be parsed.
    Size(SizeError),
    /// A KV-cache dtype is unknown.
    Dtype(DtypeError),
    /// A Mooncake trace could not be converted.
    Convert(ConvertError),
    /// A sweep's grid of configurations could not be built.
    Grid(GridError),
    /// A sweep's capacity range could not be built.
    Range(RangeError),
    /// A sweep's bytes per chunk could not be computed.
    ChunkBytes(ChunkBytesError),
    /// A case of a sweep failed.
    Sweep(SweepError),
    /// A sweep run failed.
    SweepRun(SweepRunError),
    /// Serving failed (a bad `--rate`, the endpoint, the replay thread).
    Serve(ServeError),
    /// `replay --offloader simple` failed.
    Simple(SimpleRunError),
    /// A command's report could not be printed.
    Output(OutputError),
    /// A report could not be serialised as JSON.
    Json(serde_json::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Adapter(e) => e.fmt(f),
            Error::Open(e) => e.fmt(f),
            Error::Format(e) => e.fmt(f),
            Error::Run(e) => e.fmt(f),
            Error::Manager(e) => e.fmt(f),
            Error::Transfer(e) => e.fmt(f),
            Error::Report(e) => e.fmt(f),
            Error::Size(e) => e.fmt(f),
            Error::Dtype(e) => e.fmt(f),
            Error::Convert(e) => e.fmt(f),
            Error::Grid(e) => e.fmt(f),
            Error::Range(e) => e.fmt(f),
            Error::ChunkBytes(e) => e.fmt(f),
            Error::Sweep(e) => e.fmt(f),
            Error::SweepRun(e) => e.fmt(f),
            Error::Serve(e) => e.fmt(f),
            Error::Simple(e) => e.fmt(f),
            Error::Output(e) => e.fmt(f),
            Error::Json(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Adapter(e) => Some(e),
            Error::Open(e) => Some(e),
            Error::Format(e) => Some(e),
            Error::Run(e) => Some(e),
            Error::Manager(e) => Some(e),
            Error::Transfer(e) => Some(e),
            Error::Report(e) => Some(e),
            Error::Size(e) => Some(e),
            Error::Dtype(e) => Some(e),
            Error::Convert(e) => Some(e),
            Error::Grid(e) => Some(e),
            Error::Range(e) => Some(e),
            Error::ChunkBytes(e) => Some(e),
            Error::Sweep(e) => Some(e),
            Error::SweepRun(e) => Some(e),
            Error::Serve(e) => Some(e),
            Error::Simple(e) => Some(e),
            Error::Output(e) => Some(e),
            Error::Json(e) => Some(e),
        }
    }
}

from_variants!(
    Error:
    kvtier::Error => Adapter,
    OpenError => Open,
    FormatError => Format,
    RunError => Run,
    ManagerError => Manager,
    TransferError => Transfer,
    ReportError => Report,
    SizeError => Size,
    DtypeError => Dtype,
    ConvertError => Convert,
    GridError => Grid,
    RangeError => Range,
    ChunkBytesError => ChunkBytes,
    SweepError => Sweep,
    SweepRunError => SweepRun,
    ServeError => Serve,
    SimpleRunError => Simple,
    OutputError => Output,
    serde_json::Error => Json,
);

/// `From<T>` through [`kvtier::Error`] for the adapter's errors the command meets directly.
macro_rules! from_adapter {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Adapter(kvtier::Error::from(e))
            }
        }
    )*};
}

from_adapter!(
    ExporterError,
    ObserveError,
    EncodeError,
    RenderError,
    FrameError,
    CollectorClosed,
    MetricsRegisterError,
    kvtier::kv_events::PublishError,
    io::Error,
);
