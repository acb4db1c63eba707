//! Builds the `prometheus` metric families from a copy of the exporter's per-engine state.

use kvtier_core::stats::catalogue::{
    self, CACHE_CONFIG_INFO, CACHE_CONFIG_INFO_LABELS, CONFIG_INFO, MetricDef, MetricKind,
};
use kvtier_core::stats::{Histogram, Payload, Value};
use prometheus::proto::{self, LabelPair, Metric, MetricFamily, MetricType};

use super::{Engine, EngineState, exposed_name, help_text, is_deprecated};

/// `value / divisor` as the exported float.
fn scaled(value: u64, divisor: u64) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "values leave the library as floats"
    )]
    if divisor <= 1 {
        value as f64
    } else {
        value as f64 / divisor as f64
    }
}

fn pair(name: &str, value: &str) -> LabelPair {
    let mut p = LabelPair::default();
    p.set_name(name.to_owned());
    p.set_value(value.to_owned());
    p
}

fn engine_pairs<'a>(
    engine: &Engine,
    extra: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<LabelPair> {
    let mut v = vec![
        pair("model_name", &engine.model_name),
        pair("engine", &engine.engine),
    ];
    v.extend(extra.map(|(k, val)| pair(k, val)));
    v
}

fn gauge_metric(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut g = proto::Gauge::default();
    g.set_value(value);
    let mut m = Metric::from_gauge(g);
    m.set_label(labels);
    m
}

fn counter_metric(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut c = proto::Counter::default();
    c.set_value(value);
    let mut m = Metric::default();
    m.set_counter(c);
    m.set_label(labels);
    m
}

fn histogram_metric(labels: Vec<LabelPair>, h: &Histogram, divisor: u64) -> Metric {
    let mut cumulative = 0u64;
    let buckets = h
        .bounds()
        .iter()
        .zip(h.bucket_counts())
        .map(|(bound, count)| {
            cumulative = cumulative.saturating_add(*count);
            let mut b = proto::Bucket::default();
            b.set_upper_bound(scaled(*bound, divisor));
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    let mut ph = proto::Histogram::default();
    ph.set_bucket(buckets);
    ph.set_sample_count(h.count());
    ph.set_sample_sum(scaled(h.sum(), divisor));
    let mut m = Metric::default();
    m.set_histogram(ph);
    m.set_label(labels);
    m
}

fn value_metric(def: &MetricDef, labels: Vec<LabelPair>, value: &Value) -> Metric {
    let divisor = def.export_divisor();
    match value {
        Value::Counter(c) => counter_metric(labels, scaled(*c, divisor)),
        Value::Gauge(g) => gauge_metric(labels, g.to_f64()),
        Value::Histogram(h) => histogram_metric(labels, h, divisor),
    }
}

/// The deprecated `transfer_type` mirror of one engine: `(transfer_type, value)` pairs.
fn deprecated_values(totals: &Payload, def: &MetricDef) -> Vec<(&'static str, Value)> {
    catalogue::deprecated_mirror(totals, def)
        .map(Vec::from)
        .unwrap_or_default()
}

fn family_metrics(
    def: &MetricDef,
    engines: &[Engine],
    states: &[EngineState],
    info_labels: &[String],
    deprecated: bool,
) -> Vec<Metric> {
    let mut metrics = Vec::new();
    for (engine, state) in engines.iter().zip(states) {
        if def.name == CONFIG_INFO {
            for values in &state.info {
                let extra = info_labels
                    .iter()
                    .map(String::as_str)
                    .zip(values.iter().map(String::as_str));
                metrics.push(gauge_metric(engine_pairs(engine, extra), 1.0));
            }
        } else if def.name == CACHE_CONFIG_INFO {
            if let Some(values) = &state.cache_config {
                let labels = CACHE_CONFIG_INFO_LABELS
                    .iter()
                    .zip(values)
                    .map(|(k, v)| pair(k, v))
                    .collect();
                metrics.push(gauge_metric(labels, 1.0));
            }
        } else if is_deprecated(def.name) {
            if deprecated {
                for (transfer_type, value) in deprecated_values(&state.totals, def) {
                    let labels =
                        engine_pairs(engine, core::iter::once(("transfer_type", transfer_type)));
                    metrics.push(value_metric(def, labels, &value));
                }
            }
        } else {
            let series = state.totals.series();
            let start = series.partition_point(|s| s.name() < def.name);
            let end = series.partition_point(|s| s.name() <= def.name);
            for s in series.get(start..end).unwrap_or(&[]) {
                let extra = def.labels.iter().copied().zip(s.labels().iter());
                metrics.push(value_metric(def, engine_pairs(engine, extra), s.value()));
            }
        }
    }
    metrics
}

/// Every family with at least one sample, in catalogue (name) order.
pub(super) fn build(
    engines: &[Engine],
    states: &[EngineState],
    info_labels: &[String],
    deprecated: bool,
) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    for def in catalogue::all() {
        let metrics = family_metrics(def, engines, states, info_labels, deprecated);
        if metrics.is_empty() {
            continue;
        }
        let mut mf = MetricFamily::default();
        mf.set_name(exposed_name(def.name, def.kind));
        mf.set_help(help_text(def.name, def.help));
        mf.set_field_type(match def.kind {
            MetricKind::Counter => MetricType::COUNTER,
            MetricKind::Gauge => MetricType::GAUGE,
            MetricKind::Histogram => MetricType::HISTOGRAM,
        });
        mf.set_metric(metrics);
        out.push(mf);
    }
    out
}
