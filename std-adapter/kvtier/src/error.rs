//! The adapter's umbrella error: every error of the export, threading and HTTP layers and of
//! the kvtier-core calls a service makes through them, with `From` impls so `?` works across
//! them. It imports the error types of the modules it wraps; none of them imports it back.

use std::fmt;
use std::io;

use kvtier_core::manager::{
    CompleteLoadError, ConfigError, LoadError, RequestError, StoreError, UnknownPolicy,
};

use crate::export::{EncodeError, ExporterError, ObserveError, RenderError};
use crate::kv_events::{DecodeError as KvEventsDecodeError, PublishError, RecvError};
use crate::shared::{CollectorClosed, FrameError, MetricsRegisterError};

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
    /// The KV-events publisher could not start or has stopped.
    KvEvents(PublishError),
    /// A KV-events message could not be read.
    KvEventsRecv(RecvError),
    /// A KV-events payload is not a `KVEventBatch`.
    KvEventsDecode(KvEventsDecodeError),
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
            Error::KvEvents(e) => e.fmt(f),
            Error::KvEventsRecv(e) => e.fmt(f),
            Error::KvEventsDecode(e) => e.fmt(f),
            Error::Io(e) => e.fmt(f),
            Error::Config(e) => e.fmt(f),
            Error::Request(e) => e.fmt(f),
            Error::Load(e) => e.fmt(f),
            Error::CompleteLoad(e) => e.fmt(f),
            Error::Store(e) => e.fmt(f),
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
            Error::KvEvents(e) => Some(e),
            Error::KvEventsRecv(e) => Some(e),
            Error::KvEventsDecode(e) => Some(e),
            Error::Io(e) => Some(e),
            Error::Config(e) => Some(e),
            Error::Request(e) => Some(e),
            Error::Load(e) => Some(e),
            Error::CompleteLoad(e) => Some(e),
            Error::Store(e) => Some(e),
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

from_variants!(
    Error:
    ExporterError => Exporter,
    ObserveError => Observe,
    EncodeError => Encode,
    FrameError => Frame,
    CollectorClosed => CollectorClosed,
    MetricsRegisterError => CollectorMetrics,
    PublishError => KvEvents,
    RecvError => KvEventsRecv,
    KvEventsDecodeError => KvEventsDecode,
    io::Error => Io,
    ConfigError => Config,
    RequestError => Request,
    LoadError => Load,
    CompleteLoadError => CompleteLoad,
    StoreError => Store,
);

impl From<RenderError> for Error {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Exporter(e) => Error::Exporter(e),
            RenderError::Observe(e) => Error::Observe(e),
            RenderError::Encode(e) => Error::Encode(e),
        }
    }
}

/// `From<T>` into [`Error::Core`] for kvtier-core errors without a variant of their own.
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
