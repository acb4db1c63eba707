//! The adapter's umbrella error: every error of the export, threading and HTTP layers, with
//! `From` impls so `?` works across them.

use std::fmt;
use std::io;

use crate::export::{EncodeError, ExporterError, ObserveError};
use crate::shared::{CollectorClosed, FrameError};

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
    /// Binding, accepting or a thread failed.
    Io(io::Error),
    /// A configuration or replay problem, as text.
    Other(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Exporter(e) => e.fmt(f),
            Error::Observe(e) => e.fmt(f),
            Error::Encode(e) => e.fmt(f),
            Error::Frame(e) => e.fmt(f),
            Error::CollectorClosed(e) => e.fmt(f),
            Error::Io(e) => e.fmt(f),
            Error::Other(e) => f.write_str(e),
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
            Error::Io(e) => Some(e),
            Error::Other(_) => None,
        }
    }
}

macro_rules! from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::$v(e)
            }
        }
    )*};
}

from!(
    ExporterError => Exporter,
    ObserveError => Observe,
    EncodeError => Encode,
    FrameError => Frame,
    CollectorClosed => CollectorClosed,
    io::Error => Io,
    String => Other,
);
