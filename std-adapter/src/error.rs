//! The adapter's umbrella error: every error of the export, threading and HTTP layers, of the
//! commands' operations (a replay run, a sweep, the capacity report, a conversion, serving)
//! and of kvtier-core, with `From` impls so `?` works across them.

use std::fmt;
use std::io;

use kvtier_core::manager::{
    CompleteLoadError, ConfigError, LoadError, RequestError, StoreError, UnknownPolicy,
};

use crate::cli::OutputError;
use crate::convert::ConvertError;
use crate::export::{EncodeError, ExporterError, ObserveError};
use crate::input::{FormatError, OpenError};
use crate::replay_run::{ManagerError, RunError};
use crate::replay_stats::TransferError;
use crate::serve::ServeError;
use crate::shared::{CollectorClosed, FrameError, MetricsRegisterError};
use crate::sizing::{DtypeError, ReportError, SizeError};
use crate::sweep::{RangeError, SweepError};
use crate::sweep_run::{ChunkBytesError, GridError, SweepRunError};

/// Any error of the std adapter's service layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Building or registering the exporter failed.
    Exporter(ExporterError),
    /// A payload did not match the catalogue.
    Observe(ObserveError),
    /// The text exposition could not be encoded.
    Encode(EncodeError),
    /// A stats frame could not be read.
    Frame(FrameError),
    /// The stats collector has stopped.
    CollectorClosed(CollectorClosed),
    /// The registry refused the stats collector's own metrics.
    CollectorMetrics(MetricsRegisterError),
    /// Binding, accepting or a thread failed.
    Io(io::Error),
    /// A manager configuration was rejected.
    Config(ConfigError),
    /// A request handle could not be created or used.
    Request(RequestError),
    /// The manager refused a load.
    Load(LoadError),
    /// The manager refused to complete a load.
    CompleteLoad(CompleteLoadError),
    /// The manager refused a store (including [`StoreError::NoRoom`]).
    Store(StoreError),
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
    /// Serving failed (a bad `--rate`, the replay thread).
    Serve(ServeError),
    /// A command's report could not be printed.
    Output(OutputError),
    /// A report could not be serialised as JSON.
    Json(serde_json::Error),
    /// Any other kvtier-core error (capacity arithmetic, the block pool, allocators, stats
    /// payloads and their wire format).
    Core(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Exporter(e) => e.fmt(f),
            Error::Observe(e) => e.fmt(f),
            Error::Encode(e) => e.fmt(f),
            Error::Frame(e) => e.fmt(f),
            Error::CollectorClosed(e) => e.fmt(f),
            Error::CollectorMetrics(e) => e.fmt(f),
            Error::Io(e) => e.fmt(f),
            Error::Config(e) => e.fmt(f),
            Error::Request(e) => e.fmt(f),
            Error::Load(e) => e.fmt(f),
            Error::CompleteLoad(e) => e.fmt(f),
            Error::Store(e) => e.fmt(f),
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
            Error::Output(e) => e.fmt(f),
            Error::Json(e) => e.fmt(f),
            Error::Core(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Exporter(e) => Some(e),
            Error::Observe(e) => Some(e),
            Error::Encode(e) => Some(e),
            Error::Frame(e) => Some(e),
            Error::CollectorClosed(e) => Some(e),
            Error::CollectorMetrics(e) => Some(e),
            Error::Io(e) => Some(e),
            Error::Config(e) => Some(e),
            Error::Request(e) => Some(e),
            Error::Load(e) => Some(e),
            Error::CompleteLoad(e) => Some(e),
            Error::Store(e) => Some(e),
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
            Error::Output(e) => Some(e),
            Error::Json(e) => Some(e),
            Error::Core(e) => Some(e.as_ref()),
        }
    }
}

/// `From<T>` for an error enum whose variant `V` wraps a `T`: `from_variants!(Enum: T => V, …)`.
macro_rules! from_variants {
    ($enum:ident: $($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for $enum {
            fn from(e: $t) -> Self {
                $enum::$v(e)
            }
        }
    )*};
}

pub(crate) use from_variants;

from_variants!(
    Error:
    ExporterError => Exporter,
    ObserveError => Observe,
    EncodeError => Encode,
    FrameError => Frame,
    CollectorClosed => CollectorClosed,
    MetricsRegisterError => CollectorMetrics,
    io::Error => Io,
    ConfigError => Config,
    RequestError => Request,
    LoadError => Load,
    CompleteLoadError => CompleteLoad,
    StoreError => Store,
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
    OutputError => Output,
    serde_json::Error => Json,
);

macro_rules! from_core {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Core(Box::new(e))
            }
        }
    )*};
}

from_core!(
    UnknownPolicy,
    kvtier_core::AllocError,
    kvtier_core::allocator::SlotError,
    kvtier_core::allocator::QueueAllocError,
    kvtier_core::allocator::PopError,
    kvtier_core::allocator::PushError,
    kvtier_core::allocator::RemoveError,
    kvtier_core::block_pool::NewPoolError,
    kvtier_core::block_pool::GetBlocksError,
    kvtier_core::block_pool::OutOfRange,
    kvtier_core::block_pool::TouchError,
    kvtier_core::block_pool::FreeError,
    kvtier_core::block_pool::CacheError,
    kvtier_core::capacity::PoolError,
    kvtier_core::capacity::GpuCapacityError,
    kvtier_core::capacity::AdmissionError,
    kvtier_core::capacity::BlocksError,
    kvtier_core::capacity::ConcurrencyError,
    kvtier_core::capacity::CpuTierError,
    kvtier_core::capacity::GroupingError,
    kvtier_core::capacity::SizingError,
    kvtier_core::capacity::SpecError,
    kvtier_core::stats::HistogramError,
    kvtier_core::stats::catalogue::SeriesMismatch,
    kvtier_core::stats::AggregateError,
    kvtier_core::stats::InfoError,
    kvtier_core::stats::LabelError,
    kvtier_core::stats::UpdateError,
    kvtier_core::stats::wire::EncodeError,
    kvtier_core::stats::wire::DecodeError,
);
