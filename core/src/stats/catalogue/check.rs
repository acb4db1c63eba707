//! Checking a payload series against its family ([`check_series`], [`SeriesMismatch`]) and the
//! values a deprecated family mirrors ([`deprecated_mirror`]).

use core::fmt;

use super::names::{
    DEPRECATED_SIZE, DEPRECATED_TOTAL_BYTES, DEPRECATED_TOTAL_TIME, LOAD_BYTES, LOAD_SIZE,
    LOAD_TIME, STORE_BYTES, STORE_SIZE, STORE_TIME, TRANSFER_TYPES,
};
use super::{MetricDef, MetricKind, lookup};

/// Why a payload series does not fit the catalogue (checked before anything is applied by an
/// exporter or a renderer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeriesMismatch {
    /// The catalogue has no family of that name.
    UnknownMetric(alloc::string::String),
    /// The payload's kind differs from the catalogue's.
    KindMismatch {
        /// The metric name.
        name: alloc::string::String,
        /// The catalogue's kind.
        expected: MetricKind,
        /// The payload's kind.
        found: MetricKind,
    },
    /// A series has a different number of labels than the family declares.
    LabelCount {
        /// The metric name.
        name: alloc::string::String,
        /// Labels the family declares.
        expected: usize,
        /// Labels the series has.
        got: usize,
    },
    /// A histogram's bounds differ from the catalogue's.
    BoundsMismatch(alloc::string::String),
}

impl fmt::Display for SeriesMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeriesMismatch::UnknownMetric(n) => write!(f, "unknown offloading stats key: {n}"),
            SeriesMismatch::KindMismatch {
                name,
                expected,
                found,
            } => {
                write!(
                    f,
                    "metric {name} is a {expected}, the payload has a {found}"
                )
            }
            SeriesMismatch::LabelCount {
                name,
                expected,
                got,
            } => {
                write!(f, "metric {name} expects {expected} labels, got {got}")
            }
            SeriesMismatch::BoundsMismatch(n) => {
                write!(
                    f,
                    "histogram {n} has other bucket bounds than the catalogue"
                )
            }
        }
    }
}

impl core::error::Error for SeriesMismatch {}

/// Checks one payload series against its catalogue family (name, kind, label count, histogram
/// bounds) and returns the family.
///
/// # Errors
/// [`SeriesMismatch`] saying what does not fit.
pub fn check_series(s: &crate::stats::Series) -> Result<&'static MetricDef, SeriesMismatch> {
    use alloc::borrow::ToOwned;
    let name = || s.name().to_owned();
    let def = lookup(s.name()).ok_or_else(|| SeriesMismatch::UnknownMetric(name()))?;
    if def.kind != s.kind() {
        return Err(SeriesMismatch::KindMismatch {
            name: name(),
            expected: def.kind,
            found: s.kind(),
        });
    }
    if def.labels.len() != s.labels().len() {
        return Err(SeriesMismatch::LabelCount {
            name: name(),
            expected: def.labels.len(),
            got: s.labels().len(),
        });
    }
    if let crate::stats::Value::Histogram(h) = s.value()
        && h.bounds() != def.bounds
    {
        return Err(SeriesMismatch::BoundsMismatch(name()));
    }
    Ok(def)
}

/// The values a deprecated `transfer_type` family (`DEPRECATED_TOTAL_BYTES`,
/// `DEPRECATED_TOTAL_TIME`, `DEPRECATED_SIZE`) mirrors from `payload`'s unlabeled load and store
/// series, as `(transfer_type, value)` for `CPU_to_GPU` then `GPU_to_CPU`; absent series read
/// as zero (an empty histogram). `None` for any other family.
#[must_use]
pub fn deprecated_mirror(
    payload: &crate::stats::Payload,
    def: &MetricDef,
) -> Option<[(&'static str, crate::stats::Value); 2]> {
    use crate::stats::Value;
    let counter = |name: &str| Value::Counter(payload.counter(name, &[]).unwrap_or(0));
    let histogram = |name: &str| {
        let h = payload.histogram(name, &[]).cloned();
        // The catalogue's bounds are valid, so the empty fallback never needs `default`.
        let h = h.unwrap_or_else(|| crate::stats::Histogram::new(def.bounds).unwrap_or_default());
        Value::Histogram(alloc::boxed::Box::new(h))
    };
    let [load, store] = TRANSFER_TYPES;
    match def.name {
        DEPRECATED_TOTAL_BYTES => {
            Some([(load, counter(LOAD_BYTES)), (store, counter(STORE_BYTES))])
        }
        DEPRECATED_TOTAL_TIME => Some([(load, counter(LOAD_TIME)), (store, counter(STORE_TIME))]),
        DEPRECATED_SIZE => Some([(load, histogram(LOAD_SIZE)), (store, histogram(STORE_SIZE))]),
        _ => None,
    }
}
