//! The self-describing stats payload: what a manager or a stats source reports per interval.
//!
//! It has vLLM's structure (metric types, values keyed by a label-value tuple, optional info
//! series) with integer-exact values:
//!
//! - counters are `u64` increments (times in nanoseconds) that sum, saturating;
//! - gauges are exact ratios [`Gauge`] (`num / den`, reduced), the latest value wins;
//! - histograms are [`Histogram`]s with fixed bounds, merged bucket by bucket;
//! - info is a list of [`InfoSeries`] (label name → [`InfoValue`]), replaced by a newer list and
//!   never cleared by a payload without one.
//!
//! Series are kept sorted by `(name, labels)` in one vector, so iteration, reduction and the wire
//! encoding are deterministic and a decoded payload costs one allocation for its series. Names and
//! label values are `Cow<'static, str>`: catalogue names and known label values are borrowed,
//! anything else (a payload from an unknown catalogue) is owned.
//!
//! # Hard limits
//!
//! | limit | value |
//! |---|---|
//! | series per payload | [`MAX_SERIES`] |
//! | bytes per metric name | [`MAX_NAME_LEN`] |
//! | labels per series | [`MAX_LABELS`] |
//! | bytes per label value, info key or info text | [`MAX_LABEL_LEN`] |
//! | info series | [`MAX_INFO_SERIES`] |
//! | labels per info series | [`MAX_INFO_LABELS`] |
//! | histogram bounds | [`histogram::MAX_BOUNDS`](super::histogram::MAX_BOUNDS) |
//!
//! An update that would pass a limit is an error and changes nothing.
//!
//! | module | holds |
//! |---|---|
//! | this one | [`Payload`], its reads and updates, the limits |
//! | `series` | [`Series`] and its [`Value`] |
//! | `aggregate` | [`Payload::aggregate`] |
//! | `gauge`, `labels`, `info` | [`Gauge`], [`Labels`], [`InfoSeries`] |
//! | `error` | [`UpdateError`], [`AggregateError`] |
//!
//! ```
//! use kvtier_core::stats::{Gauge, Payload, catalogue};
//!
//! let mut p = Payload::new();
//! p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4)).unwrap();
//! p.increase_counter(catalogue::STORES_SKIPPED, &[], 0).unwrap();
//! p.observe(catalogue::CPU_ALLOCATION_SIZE, &[], 2).unwrap();
//! let mut total = Payload::new();
//! total.aggregate(&p).unwrap();
//! total.aggregate(&p).unwrap();
//! assert_eq!(total.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap().count(), 2);
//! assert_eq!(total.gauge(catalogue::CPU_CACHE_USAGE_PERC, &[]).unwrap().to_f64(), 0.25);
//! ```

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::vec::Vec;

mod aggregate;
mod error;
mod gauge;
mod info;
mod labels;
mod series;

pub use error::{AggregateError, UpdateError};
pub use gauge::Gauge;
pub use info::{InfoError, InfoSeries, InfoValue};
pub(crate) use labels::check_labels;
pub use labels::{LabelError, Labels};
pub use series::{Series, Value};

use super::catalogue::{self, MetricKind};
use super::histogram::Histogram;

/// A metric name, label value or info text: borrowed when it is a known constant, owned
/// otherwise.
pub type Text = Cow<'static, str>;

/// The most series one payload holds.
pub const MAX_SERIES: usize = 256;
/// The longest metric name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// The most label values one series has.
pub const MAX_LABELS: usize = 8;
/// The longest label value, info label name or info text value, in bytes.
pub const MAX_LABEL_LEN: usize = 255;
/// The most info series one payload carries.
pub const MAX_INFO_SERIES: usize = 16;
/// The most labels one info series has.
pub const MAX_INFO_LABELS: usize = 16;

/// A stats payload. See the [module docs](self).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    series: Vec<Series>,
    info: Option<Vec<InfoSeries>>,
}

impl Payload {
    /// An empty payload (no series, no info).
    #[must_use]
    pub const fn new() -> Self {
        Payload {
            series: Vec::new(),
            info: None,
        }
    }

    /// Wraps parts the caller has checked: series sorted by key and unique, one kind per name,
    /// every limit respected.
    pub(crate) fn from_checked_parts(series: Vec<Series>, info: Option<Vec<InfoSeries>>) -> Self {
        debug_assert!(series.windows(2).all(|w| w[0].key_cmp(&w[1]).is_lt()));
        Payload { series, info }
    }

    /// True when there are no series **and** no info (vLLM's rule: an info-only payload is not
    /// empty, so it still reaches the exporter).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.series.is_empty() && self.info.is_none()
    }

    /// Forgets every series and the info.
    pub fn clear(&mut self) {
        self.series.clear();
        self.info = None;
    }

    /// The number of series.
    #[must_use]
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Every series, sorted by `(name, labels)`.
    #[must_use]
    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// The info series, if any were set.
    #[must_use]
    pub fn info(&self) -> Option<&[InfoSeries]> {
        self.info.as_deref()
    }

    /// The value of one series.
    #[must_use]
    pub fn get(&self, name: &str, labels: &[&str]) -> Option<&Value> {
        self.series
            .binary_search_by(|s| s.cmp_key(name, labels))
            .ok()
            .and_then(|i| self.series.get(i))
            .map(|s| &s.value)
    }

    /// A counter's value.
    #[must_use]
    pub fn counter(&self, name: &str, labels: &[&str]) -> Option<u64> {
        match self.get(name, labels) {
            Some(Value::Counter(v)) => Some(*v),
            _ => None,
        }
    }

    /// A gauge's value.
    #[must_use]
    pub fn gauge(&self, name: &str, labels: &[&str]) -> Option<Gauge> {
        match self.get(name, labels) {
            Some(Value::Gauge(v)) => Some(*v),
            _ => None,
        }
    }

    /// A histogram.
    #[must_use]
    pub fn histogram(&self, name: &str, labels: &[&str]) -> Option<&Histogram> {
        match self.get(name, labels) {
            Some(Value::Histogram(h)) => Some(&**h),
            _ => None,
        }
    }

    /// The kind a name holds, if the payload has a series of that name.
    #[must_use]
    pub fn kind(&self, name: &str) -> Option<MetricKind> {
        let i = self.series.partition_point(|s| s.name.as_ref() < name);
        self.series
            .get(i)
            .filter(|s| s.name.as_ref() == name)
            .map(Series::kind)
    }

    /// Finds where `(name, labels)` is or goes, checking limits and the family's kind.
    fn locate(
        &self,
        name: &str,
        labels: &[&str],
        kind: MetricKind,
    ) -> Result<Result<usize, usize>, UpdateError> {
        if name.len() > MAX_NAME_LEN {
            return Err(UpdateError::NameTooLong);
        }
        check_labels(labels)?;
        let pos = self.series.binary_search_by(|s| s.cmp_key(name, labels));
        let neighbour = match pos {
            Ok(i) => self.series.get(i),
            Err(i) => {
                if self.series.len() >= MAX_SERIES {
                    return Err(UpdateError::TooManySeries);
                }
                let before = i.checked_sub(1).and_then(|j| self.series.get(j));
                before
                    .filter(|s| s.name.as_ref() == name)
                    .or_else(|| self.series.get(i).filter(|s| s.name.as_ref() == name))
            }
        };
        if let Some(existing) = neighbour.map(Series::kind).filter(|k| *k != kind) {
            return Err(UpdateError::KindConflict {
                existing,
                requested: kind,
            });
        }
        Ok(pos)
    }

    fn insert_at(
        &mut self,
        at: usize,
        name: Text,
        labels: &[&str],
        value: Value,
    ) -> Result<(), UpdateError> {
        let labels = Labels::from_strs(labels)?;
        self.series.insert(
            at,
            Series {
                name,
                labels,
                value,
            },
        );
        Ok(())
    }

    /// Adds `by` to a counter (creating it at 0), saturating at `u64::MAX`. An increment of 0
    /// still creates the series (vLLM emits `stores_skipped = 0`).
    ///
    /// # Errors
    /// [`UpdateError`] on a limit or a kind conflict; the payload is unchanged.
    pub fn increase_counter(
        &mut self,
        name: impl Into<Text>,
        labels: &[&str],
        by: u64,
    ) -> Result<(), UpdateError> {
        let name = name.into();
        match self.locate(&name, labels, MetricKind::Counter)? {
            Ok(i) => {
                if let Some(Value::Counter(v)) = self.series.get_mut(i).map(|s| &mut s.value) {
                    *v = v.saturating_add(by);
                }
                Ok(())
            }
            Err(i) => self.insert_at(i, name, labels, Value::Counter(by)),
        }
    }

    /// Sets a gauge (creating it).
    ///
    /// # Errors
    /// [`UpdateError`] on a limit or a kind conflict; the payload is unchanged.
    pub fn set_gauge(
        &mut self,
        name: impl Into<Text>,
        labels: &[&str],
        value: Gauge,
    ) -> Result<(), UpdateError> {
        let name = name.into();
        match self.locate(&name, labels, MetricKind::Gauge)? {
            Ok(i) => {
                if let Some(Value::Gauge(v)) = self.series.get_mut(i).map(|s| &mut s.value) {
                    *v = value;
                }
                Ok(())
            }
            Err(i) => self.insert_at(i, name, labels, Value::Gauge(value)),
        }
    }

    /// Records one observation in a catalogue histogram (its bounds come from the catalogue when
    /// the series is new).
    ///
    /// # Errors
    /// [`UpdateError::UnknownHistogram`] when the catalogue has no histogram of that name, or
    /// another [`UpdateError`] on a limit or a kind conflict; the payload is unchanged.
    pub fn observe(
        &mut self,
        name: impl Into<Text>,
        labels: &[&str],
        value: u64,
    ) -> Result<(), UpdateError> {
        let name = name.into();
        match self.locate(&name, labels, MetricKind::Histogram)? {
            Ok(i) => {
                if let Some(Value::Histogram(h)) = self.series.get_mut(i).map(|s| &mut s.value) {
                    h.observe(value);
                }
                Ok(())
            }
            Err(i) => {
                let def = catalogue::lookup(&name)
                    .filter(|d| d.kind == MetricKind::Histogram)
                    .ok_or(UpdateError::UnknownHistogram)?;
                let mut h =
                    Histogram::new(def.bounds).map_err(|_| UpdateError::UnknownHistogram)?;
                h.observe(value);
                self.insert_at(i, name, labels, Value::Histogram(Box::new(h)))
            }
        }
    }

    /// Merges a whole histogram into a series (creating it with `histogram`'s bounds).
    ///
    /// # Errors
    /// [`UpdateError::BoundsMismatch`] when the series exists with other bounds, or another
    /// [`UpdateError`]; the payload is unchanged.
    pub fn merge_histogram(
        &mut self,
        name: impl Into<Text>,
        labels: &[&str],
        histogram: &Histogram,
    ) -> Result<(), UpdateError> {
        let name = name.into();
        match self.locate(&name, labels, MetricKind::Histogram)? {
            Ok(i) => match self.series.get_mut(i).map(|s| &mut s.value) {
                Some(Value::Histogram(h)) => {
                    h.merge(histogram).map_err(|_| UpdateError::BoundsMismatch)
                }
                _ => Ok(()),
            },
            Err(i) => self.insert_at(
                i,
                name,
                labels,
                Value::Histogram(Box::new(histogram.clone())),
            ),
        }
    }

    /// Replaces the info series.
    ///
    /// # Errors
    /// [`InfoError::TooManySeries`] when `info` has more than [`MAX_INFO_SERIES`] entries; the
    /// payload is unchanged.
    pub fn set_info(&mut self, info: Vec<InfoSeries>) -> Result<(), InfoError> {
        if info.len() > MAX_INFO_SERIES {
            return Err(InfoError::TooManySeries);
        }
        self.info = Some(info);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::catalogue::*;

    #[test]
    fn gauges_are_reduced_ratios() {
        assert_eq!(Gauge::fraction(2, 4), Gauge::ratio(1, 2).unwrap());
        assert_eq!(Gauge::fraction(4, 4), Gauge::int(1));
        assert_eq!(Gauge::fraction(3, 0), Gauge::ZERO);
        assert_eq!(Gauge::ratio(-6, 4).unwrap(), Gauge::ratio(-3, 2).unwrap());
        assert_eq!(Gauge::ratio(i64::MIN, 1 << 63).unwrap(), Gauge::int(-1));
        assert_eq!(Gauge::ratio(1, 0), None);
        assert_eq!(Gauge::fraction(1, 4).to_f64(), 0.25);
    }

    #[test]
    fn kind_conflicts_and_limits_change_nothing() {
        let mut p = Payload::new();
        p.increase_counter("x", &["a"], 2).unwrap();
        let before = p.clone();
        assert_eq!(
            p.set_gauge("x", &["b"], Gauge::int(1)),
            Err(UpdateError::KindConflict {
                existing: MetricKind::Counter,
                requested: MetricKind::Gauge
            })
        );
        assert_eq!(
            p.observe("x", &[], 1).unwrap_err(),
            UpdateError::KindConflict {
                existing: MetricKind::Counter,
                requested: MetricKind::Histogram
            }
        );
        assert_eq!(p.observe("y", &[], 1), Err(UpdateError::UnknownHistogram));
        let long = "n".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            p.increase_counter(long, &[], 1),
            Err(UpdateError::NameTooLong)
        );
        assert_eq!(
            p.increase_counter("z", &["a"; MAX_LABELS + 1], 1),
            Err(UpdateError::Labels(LabelError::TooManyLabels))
        );
        assert_eq!(p, before);
        for i in 0..MAX_SERIES - 1 {
            p.increase_counter(alloc::format!("c{i:03}"), &[], 1)
                .unwrap();
        }
        assert_eq!(
            p.increase_counter("zz", &[], 1),
            Err(UpdateError::TooManySeries)
        );
        p.increase_counter("x", &["a"], 1).unwrap();
        assert_eq!(p.counter("x", &["a"]), Some(3));
    }
}
