//! Operation enums and reference models shared by proptests and fuzz targets.
//!
//! [`ModelPayload`] mirrors vLLM's stats dict as plainly as possible: a `types` map, a `data` map
//! of label tuple → value, histograms as the **list of raw observations** (as vLLM keeps them),
//! and the info list. [`StatsOp`] drives both it and [`Payload`] so a proptest can compare them.

use std::collections::BTreeMap;

use kvtier_core::stats::catalogue::{self, MetricKind};
use kvtier_core::stats::{Gauge, Histogram, InfoSeries, InfoValue, Payload, UpdateError, Value};

/// A value in the model: counters and gauges as exact integers / ratios, histograms as the raw
/// observations with the bounds they are bucketed by.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelValue {
    /// A counter total.
    Counter(u64),
    /// A gauge as `(numerator, denominator)`, not reduced.
    Gauge(i64, u64),
    /// Bounds and every raw observation.
    Histogram(Vec<u64>, Vec<u64>),
}

/// vLLM's dict, kept in ordered maps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelPayload {
    /// Metric name → kind.
    pub types: BTreeMap<String, MetricKind>,
    /// Metric name → label tuple → value.
    pub data: BTreeMap<String, BTreeMap<Vec<String>, ModelValue>>,
    /// The info series: label name → rendered value.
    pub info: Option<Vec<BTreeMap<String, String>>>,
}

/// One update applied to both the payload and the model.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum StatsOp {
    /// `increase_counter(name, labels, by)`.
    Counter(String, Vec<String>, u64),
    /// `set_gauge(name, labels, num/den)` (den 0 means 0, as an empty pool reports).
    Gauge(String, Vec<String>, u32, u32),
    /// Observations merged into a histogram with the given bounds.
    Histogram(String, Vec<String>, Vec<u64>, Vec<u64>),
    /// `set_info` with `(key, value)` lists.
    Info(Vec<Vec<(String, Option<String>)>>),
}

fn mean_f64(v: u64, divisor: u64) -> f64 {
    if divisor <= 1 {
        v as f64
    } else {
        v as f64 / divisor as f64
    }
}

fn py_repr(s: &str) -> String {
    let mut out = String::new();
    kvtier_core::stats::reduce::push_python_str_repr(&mut out, s);
    out
}

impl ModelPayload {
    fn kind_ok(&self, name: &str, kind: MetricKind) -> bool {
        self.types.get(name).is_none_or(|k| *k == kind)
    }

    /// Applies one op with vLLM's semantics, refusing (as kvtier does) a kind conflict or a
    /// histogram with other bounds. Returns whether it applied.
    pub fn apply(&mut self, op: &StatsOp) -> bool {
        match op {
            StatsOp::Counter(name, labels, by) => {
                if !self.kind_ok(name, MetricKind::Counter) {
                    return false;
                }
                self.types.insert(name.clone(), MetricKind::Counter);
                let e = self.data.entry(name.clone()).or_default();
                let slot = e.entry(labels.clone()).or_insert(ModelValue::Counter(0));
                if let ModelValue::Counter(c) = slot {
                    *c = c.saturating_add(*by);
                }
                true
            }
            StatsOp::Gauge(name, labels, num, den) => {
                if !self.kind_ok(name, MetricKind::Gauge) {
                    return false;
                }
                self.types.insert(name.clone(), MetricKind::Gauge);
                let value = if *den == 0 {
                    ModelValue::Gauge(0, 1)
                } else {
                    ModelValue::Gauge(i64::from(*num), u64::from(*den))
                };
                self.data
                    .entry(name.clone())
                    .or_default()
                    .insert(labels.clone(), value);
                true
            }
            StatsOp::Histogram(name, labels, bounds, obs) => {
                if !self.kind_ok(name, MetricKind::Histogram) {
                    return false;
                }
                let family = self.data.get(name);
                if let Some(ModelValue::Histogram(b, _)) = family.and_then(|f| f.get(labels))
                    && b != bounds
                {
                    return false;
                }
                self.types.insert(name.clone(), MetricKind::Histogram);
                let e = self.data.entry(name.clone()).or_default();
                let slot = e
                    .entry(labels.clone())
                    .or_insert_with(|| ModelValue::Histogram(bounds.clone(), Vec::new()));
                if let ModelValue::Histogram(_, list) = slot {
                    list.extend(obs);
                }
                true
            }
            StatsOp::Info(series) => {
                self.info = Some(
                    series
                        .iter()
                        .map(|s| {
                            s.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.clone().unwrap_or_else(|| "None".into()))
                                })
                                .collect()
                        })
                        .collect(),
                );
                true
            }
        }
    }

    /// vLLM's `aggregate`, validated first like kvtier's. Returns whether it applied.
    pub fn aggregate(&mut self, other: &ModelPayload) -> bool {
        for (name, family) in &other.data {
            let Some(kind) = other.types.get(name) else {
                return false;
            };
            if !self.kind_ok(name, *kind) {
                return false;
            }
            for (labels, v) in family {
                if let (Some(ModelValue::Histogram(a, _)), ModelValue::Histogram(b, _)) =
                    (self.data.get(name).and_then(|f| f.get(labels)), v)
                    && a != b
                {
                    return false;
                }
            }
        }
        if other.info.is_some() {
            self.info.clone_from(&other.info);
        }
        for (name, family) in &other.data {
            if let Some(kind) = other.types.get(name) {
                self.types.entry(name.clone()).or_insert(*kind);
            }
            let mine = self.data.entry(name.clone()).or_default();
            for (labels, v) in family {
                match (mine.get_mut(labels), v) {
                    (Some(ModelValue::Counter(a)), ModelValue::Counter(b)) => {
                        *a = a.saturating_add(*b);
                    }
                    (Some(ModelValue::Histogram(_, a)), ModelValue::Histogram(_, b)) => {
                        a.extend(b);
                    }
                    (Some(slot), v) => *slot = v.clone(),
                    (None, v) => {
                        mine.insert(labels.clone(), v.clone());
                    }
                }
            }
        }
        true
    }

    /// vLLM's `reduce`, keys sorted.
    pub fn reduce(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for (name, family) in &self.data {
            if name == catalogue::SIMPLE_INFO {
                continue;
            }
            let divisor = catalogue::lookup(name).map_or(1, |d| d.export_divisor());
            for (labels, v) in family {
                let key = match labels.len() {
                    0 => name.clone(),
                    1 => format!("{name}:({},)", py_repr(&labels[0])),
                    _ => {
                        let parts: Vec<String> = labels.iter().map(|l| py_repr(l)).collect();
                        format!("{name}:({})", parts.join(", "))
                    }
                };
                match v {
                    ModelValue::Counter(c) => out.push((key, mean_f64(*c, divisor))),
                    ModelValue::Gauge(n, d) => out.push((key, *n as f64 / *d as f64)),
                    ModelValue::Histogram(_, list) => {
                        let sum = list.iter().fold(0u64, |a, b| a.saturating_add(*b));
                        out.push((format!("{key}_count"), list.len() as f64));
                        out.push((format!("{key}_sum"), mean_f64(sum, divisor)));
                    }
                }
            }
        }
        out
    }

    /// vLLM's `is_empty`.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty() && self.info.is_none()
    }

    /// Per-bucket counts of a histogram's raw observations (`le` inclusive, then `+Inf`).
    pub fn bucket_counts(bounds: &[u64], obs: &[u64]) -> Vec<u64> {
        let mut counts = vec![0u64; bounds.len() + 1];
        for o in obs {
            counts[bounds.partition_point(|b| b < o)] += 1;
        }
        counts
    }
}

/// Applies `op` to a payload; returns whether it applied.
pub fn apply_to_payload(p: &mut Payload, op: &StatsOp) -> bool {
    let labels: Vec<&str> = match op {
        StatsOp::Counter(_, l, _) | StatsOp::Gauge(_, l, _, _) | StatsOp::Histogram(_, l, _, _) => {
            l.iter().map(String::as_str).collect()
        }
        StatsOp::Info(_) => Vec::new(),
    };
    let r: Result<(), UpdateError> = match op {
        StatsOp::Counter(name, _, by) => p.increase_counter(name.clone(), &labels, *by),
        StatsOp::Gauge(name, _, num, den) => {
            let g = Gauge::fraction(u64::from(*num), u64::from(*den));
            p.set_gauge(name.clone(), &labels, g)
        }
        StatsOp::Histogram(name, _, bounds, obs) => {
            let mut h = Histogram::new(bounds).expect("strategies give valid bounds");
            for o in obs {
                h.observe(*o);
            }
            p.merge_histogram(name.clone(), &labels, &h)
        }
        StatsOp::Info(series) => {
            let info = series
                .iter()
                .map(|s| {
                    let mut out = InfoSeries::new();
                    for (k, v) in s {
                        let v = v
                            .clone()
                            .map_or(InfoValue::None, |t| InfoValue::Text(t.into()));
                        out.insert(k.clone(), v)
                            .expect("strategies stay in the limits");
                    }
                    out
                })
                .collect();
            return p.set_info(info).is_ok();
        }
    };
    r.is_ok()
}

/// Checks that `p` holds exactly the model's series (values, bucket counts, sums) and info.
///
/// # Panics
/// On the first difference, with a message naming it.
pub fn assert_matches(p: &Payload, m: &ModelPayload) {
    let n: usize = m.data.values().map(BTreeMap::len).sum();
    assert_eq!(p.len(), n, "series count");
    for (name, family) in &m.data {
        assert_eq!(p.kind(name), m.types.get(name).copied(), "kind of {name}");
        for (labels, v) in family {
            let l: Vec<&str> = labels.iter().map(String::as_str).collect();
            let got = p
                .get(name, &l)
                .unwrap_or_else(|| panic!("missing {name} {labels:?}"));
            match (got, v) {
                (Value::Counter(a), ModelValue::Counter(b)) => assert_eq!(a, b, "{name}"),
                (Value::Gauge(a), ModelValue::Gauge(n, d)) => {
                    assert_eq!(
                        i128::from(a.numerator()) * i128::from(*d),
                        i128::from(*n) * i128::from(a.denominator()),
                        "{name}"
                    );
                }
                (Value::Histogram(h), ModelValue::Histogram(bounds, obs)) => {
                    assert_eq!(h.bounds(), bounds.as_slice());
                    assert_eq!(h.count(), obs.len() as u64);
                    assert_eq!(h.sum(), obs.iter().fold(0u64, |a, b| a.saturating_add(*b)));
                    assert_eq!(h.bucket_counts(), ModelPayload::bucket_counts(bounds, obs));
                }
                (a, b) => panic!("{name}: {a:?} vs {b:?}"),
            }
        }
    }
    let info: Option<Vec<BTreeMap<String, String>>> = p.info().map(|i| {
        i.iter()
            .map(|s| {
                s.iter()
                    .map(|(k, v)| (k.to_owned(), v.to_string()))
                    .collect()
            })
            .collect()
    });
    assert_eq!(info, m.info, "info");
    assert_eq!(p.is_empty(), m.is_empty());
}
