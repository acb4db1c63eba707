//! Prometheus text exposition of a stats payload under the names a vLLM server exposes.
//!
//! [`render`] writes what vLLM's Prometheus client would show for the same values:
//!
//! - `# HELP` / `# TYPE` per family, families in catalogue (name) order;
//! - counters as `<name>_total` (a name that already ends in `_total` keeps it, and `HELP`/`TYPE`
//!   use the name without it, as `prometheus_client` does);
//! - histograms as cumulative `_bucket{le="…"}`, then `_count` and `_sum`, bounds and sums scaled
//!   to the exported unit (nanoseconds → seconds);
//! - the payload's info series as `vllm:kv_offload_config_info{…} 1.0`, one sample per series,
//!   with the declared labels (a label a series does not fill is `""`; labels that are not
//!   declared are dropped), and the simple offloader's info gauge as it is;
//! - the engine labels `model_name` and `engine` first on every sample;
//! - numbers formatted as `prometheus_client` formats them (`1.0`, `0.25`, `1e-05`, `1e+06`).
//!
//! Counters are rendered from the payload as given, so pass a cumulative payload (the
//! [`aggregate`](kvtier_core::stats::Payload::aggregate) of every drained interval). There is no
//! `_created` series: the core has no clock.
//!
//! The whole payload is checked against the catalogue before anything is written, as vLLM's
//! observer asserts: an unknown name, a kind that differs from the catalogue, a wrong label count
//! or histogram bounds other than the catalogue's are errors.
//!
//! ```
//! use kvtier::exposition::{EngineLabels, ExpositionOptions, render};
//! use kvtier_core::stats::{Payload, catalogue};
//!
//! let mut p = Payload::new();
//! p.increase_counter(catalogue::LOAD_TIME, &[], 500_000_000).unwrap();
//! let text = render(&p, &EngineLabels::new("m", "0"), &ExpositionOptions::default()).unwrap();
//! assert!(text.contains("# TYPE vllm:kv_offload_load_time counter\n"));
//! assert!(text.contains("vllm:kv_offload_load_time_total{model_name=\"m\",engine=\"0\"} 0.5\n"));
//! ```

use std::fmt::{self, Write as _};

use kvtier_core::stats::catalogue::{
    self, CONFIG_INFO, CPU_CONFIG_INFO_LABELS, MetricDef, SeriesMismatch,
};
use kvtier_core::stats::{Histogram, InfoSeries, MetricKind, Payload, Series, Value};

/// The engine labels every sample carries first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLabels<'a> {
    /// The served model name.
    pub model_name: &'a str,
    /// The engine index, as text.
    pub engine: &'a str,
}

impl<'a> EngineLabels<'a> {
    /// Labels for one engine.
    #[must_use]
    pub const fn new(model_name: &'a str, engine: &'a str) -> Self {
        EngineLabels { model_name, engine }
    }
}

/// Options of [`render`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpositionOptions<'a> {
    /// The label names the offloading spec declares for `vllm:kv_offload_config_info` (the CPU
    /// spec's four by default).
    pub config_info_labels: &'a [&'a str],
    /// Also render the deprecated `transfer_type` families (`vllm:kv_offload_total_bytes`,
    /// `_total_time`, `_size`) mirrored from the unlabeled load/store series, as vLLM does for
    /// the CPU offloading spec (default false). Both directions are always present then, at 0
    /// when the payload has nothing.
    pub deprecated_transfer_series: bool,
}

impl Default for ExpositionOptions<'_> {
    fn default() -> Self {
        ExpositionOptions {
            config_info_labels: &CPU_CONFIG_INFO_LABELS,
            deprecated_transfer_series: false,
        }
    }
}

/// Why a payload could not be rendered (nothing is written then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpositionError {
    /// A series does not fit its catalogue family.
    Series(SeriesMismatch),
}

impl fmt::Display for ExpositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpositionError::Series(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ExpositionError {}

/// Formats a sample value as Python's `prometheus_client` does (`floatToGoString`): Python's
/// shortest `repr`, with values of a million and more in Go's exponent style.
#[must_use]
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let s = crate::export::python_float_str(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits: String = s.chars().filter(|c| *c != '.').collect();
            let (first, rest) = digits.split_at(1);
            let mantissa = format!("{first}.{rest}");
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => s,
    }
}

fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn escape_help(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn scaled(v: u64, divisor: u64) -> f64 {
    if divisor <= 1 {
        v as f64
    } else {
        v as f64 / divisor as f64
    }
}

/// Writes `{engine labels, extra labels…}` (plus `le` when given).
fn write_labels<'a>(
    out: &mut String,
    engine: &EngineLabels<'_>,
    extra: impl Iterator<Item = (&'a str, &'a str)>,
    le: Option<&str>,
) {
    out.push_str("{model_name=\"");
    escape_label(out, engine.model_name);
    out.push_str("\",engine=\"");
    escape_label(out, engine.engine);
    out.push('"');
    for (k, v) in extra {
        let _ = write!(out, ",{k}=\"");
        escape_label(out, v);
        out.push('"');
    }
    if let Some(le) = le {
        let _ = write!(out, ",le=\"{le}\"");
    }
    out.push('}');
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: impl FnOnce(&mut String), v: f64) {
    out.push_str(name);
    out.push_str(suffix);
    labels(out);
    out.push(' ');
    out.push_str(&format_float(v));
    out.push('\n');
}

fn write_histogram(
    out: &mut String,
    def: &MetricDef,
    engine: &EngineLabels<'_>,
    extra: &[(&str, &str)],
    h: &Histogram,
) {
    let divisor = def.export_divisor();
    let mut cumulative = 0u64;
    for (bound, count) in h.bounds().iter().zip(h.bucket_counts()) {
        cumulative = cumulative.saturating_add(*count);
        let le = format_float(scaled(*bound, divisor));
        let labels = |o: &mut String| write_labels(o, engine, extra.iter().copied(), Some(&le));
        sample(out, def.name, "_bucket", labels, scaled(cumulative, 1));
    }
    let plain = |o: &mut String| write_labels(o, engine, extra.iter().copied(), None);
    let inf = |o: &mut String| write_labels(o, engine, extra.iter().copied(), Some("+Inf"));
    sample(out, def.name, "_bucket", inf, scaled(h.count(), 1));
    sample(out, def.name, "_count", plain, scaled(h.count(), 1));
    sample(out, def.name, "_sum", plain, scaled(h.sum(), divisor));
}

fn write_value(
    out: &mut String,
    def: &MetricDef,
    engine: &EngineLabels<'_>,
    extra: &[(&str, &str)],
    value: &Value,
) {
    let plain = |o: &mut String| write_labels(o, engine, extra.iter().copied(), None);
    match value {
        Value::Counter(c) => {
            let base = def.name.strip_suffix("_total").unwrap_or(def.name);
            sample(out, base, "_total", plain, scaled(*c, def.export_divisor()));
        }
        Value::Gauge(g) => sample(out, def.name, "", plain, g.to_f64()),
        Value::Histogram(h) => write_histogram(out, def, engine, extra, h),
    }
}

fn check(s: &Series) -> Result<(), ExpositionError> {
    catalogue::check_series(s)
        .map(|_| ())
        .map_err(ExpositionError::Series)
}

fn info_sample(
    out: &mut String,
    engine: &EngineLabels<'_>,
    declared: &[&str],
    series: &InfoSeries,
) {
    let values: Vec<String> = declared
        .iter()
        .map(|k| series.get(k).map(ToString::to_string).unwrap_or_default())
        .collect();
    let pairs = declared
        .iter()
        .copied()
        .zip(values.iter().map(String::as_str));
    let labels = |o: &mut String| write_labels(o, engine, pairs, None);
    sample(out, CONFIG_INFO, "", labels, 1.0);
}

/// Renders `payload` in the Prometheus text exposition format. See the [module docs](self).
///
/// # Errors
/// [`ExpositionError`] when a series does not match the catalogue; nothing is rendered then.
pub fn render(
    payload: &Payload,
    engine: &EngineLabels<'_>,
    options: &ExpositionOptions<'_>,
) -> Result<String, ExpositionError> {
    payload.series().iter().try_for_each(check)?;
    let mut out = String::with_capacity(256 * payload.len() + 256);
    for def in catalogue::all() {
        let start = payload.series().partition_point(|s| s.name() < def.name);
        let end = payload.series().partition_point(|s| s.name() <= def.name);
        let own = payload.series().get(start..end).unwrap_or(&[]);
        let info = if def.name == CONFIG_INFO {
            payload.info()
        } else {
            None
        };
        let mirrored = if options.deprecated_transfer_series {
            catalogue::deprecated_mirror(payload, def)
        } else {
            None
        };
        if own.is_empty() && info.is_none() && mirrored.is_none() {
            continue;
        }
        let base = match def.kind {
            MetricKind::Counter => def.name.strip_suffix("_total").unwrap_or(def.name),
            _ => def.name,
        };
        let _ = write!(out, "# HELP {base} ");
        escape_help(&mut out, def.help);
        let _ = writeln!(out, "\n# TYPE {base} {}", def.kind);
        if let Some(mirrored) = &mirrored {
            for (transfer_type, value) in mirrored {
                write_value(
                    &mut out,
                    def,
                    engine,
                    &[("transfer_type", transfer_type)],
                    value,
                );
            }
        } else {
            for s in own {
                let extra: Vec<(&str, &str)> =
                    def.labels.iter().copied().zip(s.labels().iter()).collect();
                write_value(&mut out, def, engine, &extra, s.value());
            }
        }
        for series in info.unwrap_or(&[]) {
            info_sample(&mut out, engine, options.config_info_labels, series);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_follow_prometheus_client() {
        let cases: [(f64, &str); 16] = [
            (0.0, "0.0"),
            (1.0, "1.0"),
            (0.25, "0.25"),
            (1e-5, "1e-05"),
            (5e-5, "5e-05"),
            (0.0001, "0.0001"),
            (262_144.0, "262144.0"),
            (1e6, "1e+06"),
            (1.5e8, "1.5e+08"),
            (2e8, "2e+08"),
            (1e10, "1e+010"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-1e6, "-1000000.0"),
            (1.0 / 3.0, "0.3333333333333333"),
            (f64::INFINITY, "+Inf"),
        ];
        for (v, s) in cases {
            assert_eq!(format_float(v), s, "{v}");
        }
        assert_eq!(crate::export::python_float_str(1e-7), "1e-07");
        assert_eq!(crate::export::python_float_str(1.25e-7), "1.25e-07");
        assert_eq!(crate::export::python_float_str(1e22), "1e+22");
    }
}
