//! Statistics that leave a manager or a pool: integer histograms (and, in later work, the
//! self-describing payload, the metric catalogue and the wire codec).

pub mod histogram;

pub use histogram::{Histogram, HistogramError};
