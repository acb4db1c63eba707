//! [`Series`]: one metric name, label tuple and [`Value`].

use alloc::boxed::Box;
use core::cmp::Ordering;

use super::{Gauge, Labels, Text};
use crate::stats::catalogue::MetricKind;
use crate::stats::histogram::Histogram;

/// The value of one series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A counter increment (times in nanoseconds).
    Counter(u64),
    /// A gauge snapshot.
    Gauge(Gauge),
    /// Histogram observations (boxed: a histogram is ~300 bytes, the other values 16).
    Histogram(Box<Histogram>),
}

impl Value {
    /// The metric kind of this value.
    #[must_use]
    pub const fn kind(&self) -> MetricKind {
        match self {
            Value::Counter(_) => MetricKind::Counter,
            Value::Gauge(_) => MetricKind::Gauge,
            Value::Histogram(_) => MetricKind::Histogram,
        }
    }
}

/// One series: a metric name, a label tuple and a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub(crate) name: Text,
    pub(crate) labels: Labels,
    pub(crate) value: Value,
}

impl Series {
    /// The metric name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The metric name as stored: borrowed for catalogue names, owned otherwise.
    #[must_use]
    pub fn name_text(&self) -> &Text {
        &self.name
    }

    /// The label values.
    #[must_use]
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The value.
    #[must_use]
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The metric kind.
    #[must_use]
    pub fn kind(&self) -> MetricKind {
        self.value.kind()
    }

    pub(super) fn cmp_key(&self, name: &str, labels: &[&str]) -> Ordering {
        self.name
            .as_ref()
            .cmp(name)
            .then_with(|| self.labels.iter().cmp(labels.iter().copied()))
    }

    pub(crate) fn key_cmp(&self, other: &Series) -> Ordering {
        self.name
            .cmp(&other.name)
            .then_with(|| self.labels.cmp(&other.labels))
    }
}
