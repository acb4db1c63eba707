//! The metric families of vLLM 0.33.0 that kvtier reports, in one place.
//!
//! Every family is a [`MetricDef`]: its exposed name, its [`MetricKind`], a help text, the extra
//! label names (the engine labels `model_name` and `engine` are not listed: the exporter adds them
//! first), the histogram bucket bounds in integer base units, and the [`Unit`] those values are
//! counted in. Times are nanoseconds in the core and seconds on export, so a family measured in
//! [`Unit::Nanoseconds`] has an export divisor of `1_000_000_000`.
//!
//! [`CATALOGUE`] is sorted by name; [`lookup`] finds a family by a perfect hash of its name.
//!
//! | module | holds |
//! |---|---|
//! | this one | [`MetricDef`], [`MetricKind`], [`Unit`] |
//! | `names` | the family names, histogram bounds, declared label names and known label values |
//! | `table` | [`CATALOGUE`], [`lookup`], [`all`] |
//! | `index` | the compile-time perfect hash behind [`lookup`] and the known label texts |
//! | `check` | [`check_series`] and its [`SeriesMismatch`], [`deprecated_mirror`] |
//!
//! ```
//! use kvtier_core::stats::catalogue::{self, MetricKind, Unit};
//!
//! let def = catalogue::lookup(catalogue::LOOKUP_SYNC_DELAY_SECONDS).unwrap();
//! assert_eq!(def.kind, MetricKind::Histogram);
//! assert_eq!(def.unit, Unit::Nanoseconds);
//! assert_eq!(def.bounds[0], 10_000); // 1e-5 s
//! assert!(catalogue::lookup("vllm:no_such_metric").is_none());
//! ```

use core::fmt;

/// The three kinds of metric a payload carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetricKind {
    /// A monotonically increasing total; payloads carry per-interval increments that sum.
    Counter,
    /// A value that is overwritten; the latest one wins.
    Gauge,
    /// Observations counted into fixed buckets; merged bucket by bucket.
    Histogram,
}

impl MetricKind {
    /// The name vLLM's payload uses for this kind (`"counter"`, `"gauge"`, `"histogram"`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The base unit of a family's integer values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Nanoseconds in the core; exported as seconds.
    Nanoseconds,
    /// CPU-tier chunks.
    Chunks,
    /// KV blocks.
    Blocks,
    /// Tokens.
    Tokens,
    /// Plain event counts.
    Count,
    /// A fraction in `[0, 1]`, held as an exact ratio.
    Fraction,
    /// An info series: the value is always 1, the facts are in the labels.
    Info,
}

impl Unit {
    /// What a value in this unit is divided by on export (`1_000_000_000` for nanoseconds →
    /// seconds, 1 otherwise).
    #[must_use]
    pub const fn export_divisor(self) -> u64 {
        match self {
            Unit::Nanoseconds => 1_000_000_000,
            _ => 1,
        }
    }
}

/// One metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricDef {
    /// The name as vLLM registers it (counters get `_total` on exposition unless they end in it).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// What the family measures.
    pub help: &'static str,
    /// Extra label names, after the engine labels.
    pub labels: &'static [&'static str],
    /// Finite histogram bucket bounds in base units (empty for counters and gauges).
    pub bounds: &'static [u64],
    /// The base unit of the values.
    pub unit: Unit,
    /// The exporter shows this family from the start, at zero, for every engine (an empty
    /// histogram; both `transfer_type` values for a deprecated family), so a dashboard panel
    /// that reads it has a series before the first observation. True for every family of the
    /// offloading connector except its info series, and for `vllm:num_requests_running`.
    pub zero_at_start: bool,
}

impl MetricDef {
    /// The divisor that turns a base-unit value into the exported value.
    #[must_use]
    pub const fn export_divisor(&self) -> u64 {
        self.unit.export_divisor()
    }
}

mod check;
mod index;
mod names;
mod table;

pub use check::{SeriesMismatch, check_series, deprecated_mirror};
pub use names::*;
pub(crate) use table::position_bytes;
pub use table::{CATALOGUE, all, lookup};
