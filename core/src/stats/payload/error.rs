//! Why an update or an aggregation of a [`Payload`](super::Payload) was rejected.

use core::fmt;

use super::{LabelError, MAX_NAME_LEN, MAX_SERIES, Text};
use crate::stats::catalogue::MetricKind;

/// Why an update (`increase_counter`, `set_gauge`, `observe`, `merge_histogram`) was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateError {
    /// The metric name is longer than [`MAX_NAME_LEN`] bytes.
    NameTooLong,
    /// The label tuple is too long or has a value that is too long.
    Labels(LabelError),
    /// The name already holds a metric of another kind.
    KindConflict {
        /// The kind the payload holds.
        existing: MetricKind,
        /// The kind of the update.
        requested: MetricKind,
    },
    /// The payload already holds [`MAX_SERIES`] series.
    TooManySeries,
    /// `observe` on a name that the catalogue does not list as a histogram (use
    /// `merge_histogram` with explicit bounds).
    UnknownHistogram,
    /// The histogram to merge has other bounds than the one in the payload.
    BoundsMismatch,
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::NameTooLong => {
                write!(f, "a metric name is limited to {MAX_NAME_LEN} bytes")
            }
            UpdateError::Labels(e) => e.fmt(f),
            UpdateError::KindConflict {
                existing,
                requested,
            } => write!(f, "the metric is a {existing}, not a {requested}"),
            UpdateError::TooManySeries => {
                write!(f, "a payload holds at most {MAX_SERIES} series")
            }
            UpdateError::UnknownHistogram => f.write_str(
                "the catalogue has no histogram of that name; merge a histogram with explicit bounds",
            ),
            UpdateError::BoundsMismatch => {
                f.write_str("the histogram's bucket bounds differ from the payload's")
            }
        }
    }
}

impl core::error::Error for UpdateError {}

impl From<LabelError> for UpdateError {
    fn from(e: LabelError) -> Self {
        UpdateError::Labels(e)
    }
}

/// Why `aggregate` was rejected (the receiver is unchanged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AggregateError {
    /// A name holds different kinds in the two payloads.
    KindConflict {
        /// The metric name.
        name: Text,
        /// Its kind in the receiver.
        existing: MetricKind,
        /// Its kind in the other payload.
        other: MetricKind,
    },
    /// A histogram series has other bounds in the two payloads.
    BoundsMismatch {
        /// The metric name.
        name: Text,
    },
    /// The union would hold more than [`MAX_SERIES`] series.
    TooManySeries,
}

impl fmt::Display for AggregateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateError::KindConflict {
                name,
                existing,
                other,
            } => write!(
                f,
                "stats key {name} is a {existing} here and a {other} in the other payload"
            ),
            AggregateError::BoundsMismatch { name } => {
                write!(
                    f,
                    "histogram {name} has different bucket bounds in the two payloads"
                )
            }
            AggregateError::TooManySeries => {
                write!(f, "the aggregate would hold more than {MAX_SERIES} series")
            }
        }
    }
}

impl core::error::Error for AggregateError {}
