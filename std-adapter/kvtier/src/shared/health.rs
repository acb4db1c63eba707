//! The collector's own health on `/metrics`: why payloads were rejected
//! (`kvtier_collector_rejected_payloads_total{reason}`), exports, and the queue's levels, as
//! one registry entry.

use std::fmt;

use kvtier_core::stats::catalogue::SeriesMismatch;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, Opts, PullingGauge};

use crate::export::ObserveError;

/// Why a payload was rejected: the `reason` label of
/// `kvtier_collector_rejected_payloads_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The bytes are not a [`wire`](kvtier_core::stats::wire) payload.
    Decode,
    /// A series' name is not in the catalogue.
    UnknownMetric,
    /// A series has another kind than its catalogue family.
    TypeMismatch,
    /// A series has another number of labels than its catalogue family.
    LabelCount,
    /// A histogram has other bounds than its catalogue family.
    BoundsMismatch,
    /// No engine of the exporter has the payload's engine index.
    UnknownEngine,
    /// The engine's totals would hold more series than a payload can.
    TooManySeries,
    /// The engine would keep too many config info series (the rest was exported).
    TooManyInfoSeries,
}

impl RejectReason {
    /// Every reason, in label order.
    pub const ALL: [RejectReason; 8] = [
        RejectReason::Decode,
        RejectReason::UnknownMetric,
        RejectReason::TypeMismatch,
        RejectReason::LabelCount,
        RejectReason::BoundsMismatch,
        RejectReason::UnknownEngine,
        RejectReason::TooManySeries,
        RejectReason::TooManyInfoSeries,
    ];

    /// The `reason` label value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            RejectReason::Decode => "decode",
            RejectReason::UnknownMetric => "unknown_metric",
            RejectReason::TypeMismatch => "type_mismatch",
            RejectReason::LabelCount => "label_count",
            RejectReason::BoundsMismatch => "bounds_mismatch",
            RejectReason::UnknownEngine => "unknown_engine",
            RejectReason::TooManySeries => "too_many_series",
            RejectReason::TooManyInfoSeries => "too_many_info_series",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&SeriesMismatch> for RejectReason {
    fn from(e: &SeriesMismatch) -> Self {
        match e {
            SeriesMismatch::UnknownMetric(_) => RejectReason::UnknownMetric,
            SeriesMismatch::KindMismatch { .. } => RejectReason::TypeMismatch,
            SeriesMismatch::LabelCount { .. } => RejectReason::LabelCount,
            SeriesMismatch::BoundsMismatch(_) => RejectReason::BoundsMismatch,
        }
    }
}

impl From<&ObserveError> for RejectReason {
    fn from(e: &ObserveError) -> Self {
        match e {
            ObserveError::UnknownEngine(_) => RejectReason::UnknownEngine,
            ObserveError::Series(s) => s.into(),
            ObserveError::TooManySeries => RejectReason::TooManySeries,
            ObserveError::TooManyInfoSeries => RejectReason::TooManyInfoSeries,
        }
    }
}

/// The registry refused the collector's own metrics (e.g. they are registered already).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsRegisterError(pub(super) String);

impl fmt::Display for MetricsRegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the registry refused the collector's metrics: {}",
            self.0
        )
    }
}

impl std::error::Error for MetricsRegisterError {}

/// The collector's own metrics (shared by the handle and the thread).
#[derive(Clone, Debug)]
pub(super) struct Metrics {
    pub(super) rejected: IntCounterVec,
    pub(super) exports: IntCounter,
}

impl Metrics {
    pub(super) fn new() -> Result<Self, prometheus::Error> {
        let rejected = IntCounterVec::new(
            Opts::new(
                "kvtier_collector_rejected_payloads_total",
                "Stats payloads the collector rejected, by reason; the rest of their interval \
                 is exported.",
            ),
            &["reason"],
        )?;
        for r in RejectReason::ALL {
            // Every reason is exposed from the start, at 0.
            let _ = rejected.get_metric_with_label_values(&[r.as_str()])?;
        }
        let exports = IntCounter::new(
            "kvtier_collector_exports_total",
            "Times the collector handed the aggregated payloads to the exporter.",
        )?;
        Ok(Metrics { rejected, exports })
    }

    pub(super) fn reject(&self, reason: RejectReason) {
        if let Ok(c) = self
            .rejected
            .get_metric_with_label_values(&[reason.as_str()])
        {
            c.inc();
        }
    }
}

/// The collector's metrics as one registry entry, so that registering them is all or nothing.
pub(super) struct Exposed {
    pub(super) rejected: IntCounterVec,
    pub(super) exports: IntCounter,
    pub(super) queue: [PullingGauge; 2],
}

impl Collector for Exposed {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.rejected.desc();
        d.extend(self.exports.desc());
        d.extend(self.queue.iter().flat_map(Collector::desc));
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut f = self.rejected.collect();
        f.extend(self.exports.collect());
        f.extend(self.queue.iter().flat_map(Collector::collect));
        f
    }
}
