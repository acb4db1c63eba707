//! The sweep run's errors: the grid, the bytes per chunk and the run itself, each naming the
//! option or file at fault.

use std::fmt;
use std::path::PathBuf;

use crate::input::{OpenError, TraceInputError};
use crate::sizing::ReportError;
use crate::sweep::CurveRunError;
use crate::sweep::plot::PlotError;
use crate::sweep::{RangeError, SweepError};
use crate::trace::CompactError;

/// Why the grid of configurations could not be built; the message names the option at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GridError {
    /// `--from/--to/--steps` is not a range.
    Range(RangeError),
    /// Neither `--capacities` nor a range.
    NoCapacities,
    /// `--policies` is empty.
    NoPolicies,
    /// `--thresholds` is empty.
    NoThresholds,
    /// `--gpu-blocks` with `--method stack` or `sample`: those curves do not model the GPU
    /// front.
    GpuFrontNeedsExact,
}

impl fmt::Display for GridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GridError::Range(e) => write!(f, "--from/--to/--steps: {e}"),
            GridError::NoCapacities => {
                f.write_str("give --capacities a,b,c or --from N --to N --steps N")
            }
            GridError::NoPolicies => f.write_str("--policies: give at least one"),
            GridError::NoThresholds => f.write_str("--thresholds: give at least one"),
            GridError::GpuFrontNeedsExact => f.write_str(
                "--gpu-blocks works with --method exact only: the one-pass and sampled curves \
                 do not model the GPU front",
            ),
        }
    }
}

impl std::error::Error for GridError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GridError::Range(e) => Some(e),
            _ => None,
        }
    }
}

/// Why [`SweepOptions::bytes_per_chunk`](super::SweepOptions::bytes_per_chunk) could not size
/// a chunk of the model.
#[derive(Debug)]
#[non_exhaustive]
pub enum ChunkBytesError {
    /// A chunk of the trace is not a whole number of `--block-size` GPU blocks.
    BlockSize {
        /// `--block-size`.
        block_size: u32,
        /// Tokens per chunk of the trace.
        block_tokens: u32,
    },
    /// The model's capacity report failed.
    Model(ReportError),
    /// The report has no CPU tier.
    NoCpuTier,
    /// A chunk of the model holds no bytes.
    EmptyChunk {
        /// The model.
        model: String,
    },
}

impl fmt::Display for ChunkBytesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkBytesError::BlockSize {
                block_size,
                block_tokens,
            } => write!(
                f,
                "--block-size {block_size}: a chunk of the trace is {block_tokens} tokens, which \
                 must be a whole number of GPU blocks"
            ),
            ChunkBytesError::Model(e) => e.fmt(f),
            ChunkBytesError::NoCpuTier => f.write_str("the CPU tier could not be sized"),
            ChunkBytesError::EmptyChunk { model } => write!(f, "{model}: a chunk holds no bytes"),
        }
    }
}

impl std::error::Error for ChunkBytesError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChunkBytesError::Model(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a sweep run failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SweepRunError {
    /// The grid of configurations.
    Grid(GridError),
    /// The trace file could not be opened.
    Open(OpenError),
    /// The trace could not be read (or is over `--max-records` / `--max-hashes`).
    Read {
        /// The trace file.
        path: PathBuf,
        /// Why.
        error: CompactError<TraceInputError>,
    },
    /// The model's bytes per chunk.
    Model(ChunkBytesError),
    /// A case failed.
    Sweep {
        /// The trace file.
        path: PathBuf,
        /// Why.
        error: SweepError,
    },
    /// The plot could not be drawn.
    Plot(PlotError),
    /// The curve pass of `--method stack|sample`.
    Curve(CurveRunError),
    /// An option `--offloader simple` does not take (the message names it).
    SimpleOption(&'static str),
    /// The model's bytes per block for `--offloader simple`'s GiB column.
    SimpleModel(crate::sizing::ReportError),
    /// A case of `--offloader simple` failed.
    Simple {
        /// The trace file.
        path: PathBuf,
        /// The case's CPU blocks.
        capacity: u32,
        /// Why.
        error: crate::replay::SimpleRunError,
    },
}

impl fmt::Display for SweepRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SweepRunError::Grid(e) => e.fmt(f),
            SweepRunError::Open(e) => e.fmt(f),
            SweepRunError::Read { path, error } => write!(f, "{}: {error}", path.display()),
            SweepRunError::Model(e) => e.fmt(f),
            SweepRunError::Sweep { path, error } => write!(f, "{}: {error}", path.display()),
            SweepRunError::Plot(e) => e.fmt(f),
            SweepRunError::Curve(e) => e.fmt(f),
            SweepRunError::SimpleOption(s) => f.write_str(s),
            SweepRunError::SimpleModel(e) => e.fmt(f),
            SweepRunError::Simple {
                path,
                capacity,
                error,
            } => write!(f, "{}: {capacity} CPU blocks: {error}", path.display()),
        }
    }
}

impl std::error::Error for SweepRunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SweepRunError::Grid(e) => Some(e),
            SweepRunError::Open(e) => Some(e),
            SweepRunError::Read { error, .. } => Some(error),
            SweepRunError::Model(e) => Some(e),
            SweepRunError::Sweep { error, .. } => Some(error),
            SweepRunError::Plot(e) => Some(e),
            SweepRunError::Curve(e) => Some(e),
            SweepRunError::SimpleOption(_) => None,
            SweepRunError::SimpleModel(e) => Some(e),
            SweepRunError::Simple { error, .. } => Some(error),
        }
    }
}

crate::from_variants::from_variants!(
    SweepRunError:
    GridError => Grid,
    OpenError => Open,
    ChunkBytesError => Model,
    PlotError => Plot,
);
