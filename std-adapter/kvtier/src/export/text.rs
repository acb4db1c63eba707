//! The text exposition (format 0.0.4) of gathered metric families, written as Python's
//! `prometheus_client` writes it, so a kvtier endpoint prints what a vLLM server prints:
//!
//! - `# HELP` and `# TYPE` with the family name (a counter's name ends in `_total`);
//! - label pairs sorted by name, `le` among them;
//! - a histogram's `_bucket` series (with `le="+Inf"`), then `_count`, then `_sum`;
//! - numbers as `prometheus_client` formats them (`6.0`, `0.25`, `1e-05`, `1e+06`).
//!
//! The `prometheus` crate's own `TextEncoder` writes the same samples with Rust's float format
//! (`6`, `1000000`) and other orders; Prometheus reads both, people and text diffs do not.

use std::fmt::Write as _;

use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType};

use super::EncodeError;
use super::python_float_str;

/// Formats a sample value as `prometheus_client` does (`floatToGoString`): Python's shortest
/// `repr`, with values of a million and more in Go's exponent style.
#[must_use]
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let s = python_float_str(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits: String = s.chars().filter(|c| *c != '.').collect();
            let (first, rest) = digits.split_at(1);
            let mantissa = format!("{first}.{rest}");
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+{:02}", dot - 1)
        }
        _ => s,
    }
}

fn escape(out: &mut String, v: &str, quote: bool) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// Writes one sample line: `name{labels…} value`.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v, true);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&format_float(value));
    out.push('\n');
}

/// The metric's label pairs plus `extra`, sorted by name.
fn labels<'a>(m: &'a Metric, extra: Option<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
    let mut v: Vec<(&str, &str)> = m
        .get_label()
        .iter()
        .map(|p: &LabelPair| (p.name(), p.value()))
        .chain(extra)
        .collect();
    v.sort_unstable_by(|a, b| a.0.cmp(b.0));
    v
}

#[expect(clippy::cast_precision_loss, reason = "the text format carries floats")]
fn count(c: u64) -> f64 {
    c as f64
}

#[expect(
    deprecated,
    reason = "another collector's untyped metric still carries its value there"
)]
fn untyped_value(m: &Metric) -> f64 {
    m.get_untyped().get_value()
}

fn write_metric(out: &mut String, name: &str, kind: MetricType, m: &Metric) {
    match kind {
        MetricType::COUNTER => sample(out, name, &labels(m, None), m.get_counter().get_value()),
        MetricType::GAUGE => sample(out, name, &labels(m, None), m.get_gauge().get_value()),
        MetricType::UNTYPED => sample(out, name, &labels(m, None), untyped_value(m)),
        MetricType::HISTOGRAM => {
            let h = m.get_histogram();
            let bucket = format!("{name}_bucket");
            let mut inf_seen = false;
            for b in h.get_bucket() {
                let le = format_float(b.upper_bound());
                inf_seen |= b.upper_bound() == f64::INFINITY;
                let cumulative = count(b.cumulative_count());
                sample(out, &bucket, &labels(m, Some(("le", &le))), cumulative);
            }
            if !inf_seen {
                let all = count(h.get_sample_count());
                sample(out, &bucket, &labels(m, Some(("le", "+Inf"))), all);
            }
            let plain = labels(m, None);
            sample(
                out,
                &format!("{name}_count"),
                &plain,
                count(h.get_sample_count()),
            );
            sample(out, &format!("{name}_sum"), &plain, h.get_sample_sum());
        }
        MetricType::SUMMARY => {
            let s = m.get_summary();
            for q in s.get_quantile() {
                let quantile = format_float(q.quantile());
                sample(
                    out,
                    name,
                    &labels(m, Some(("quantile", &quantile))),
                    q.value(),
                );
            }
            let plain = labels(m, None);
            sample(
                out,
                &format!("{name}_count"),
                &plain,
                count(s.sample_count()),
            );
            sample(out, &format!("{name}_sum"), &plain, s.sample_sum());
        }
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Writes `families` in the text exposition format (see the [module docs](self)).
///
/// # Errors
/// [`EncodeError`] naming the offending name, when a family or label name is not a valid
/// Prometheus name (the text would not parse); nothing is returned then.
pub fn encode_families(families: &[MetricFamily]) -> Result<String, EncodeError> {
    let mut out = String::with_capacity(4096);
    for mf in families {
        let name = mf.name();
        if !is_metric_name(name) {
            return Err(EncodeError::MetricName(name.to_owned()));
        }
        let bad_label = mf
            .get_metric()
            .iter()
            .flat_map(Metric::get_label)
            .find(|p| !is_label_name(p.name()));
        if let Some(p) = bad_label {
            return Err(EncodeError::LabelName {
                label: p.name().to_owned(),
                family: name.to_owned(),
            });
        }
        let _ = write!(out, "# HELP {name} ");
        escape(&mut out, mf.help(), false);
        let kind = mf.get_field_type();
        let type_name = match kind {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        let _ = writeln!(out, "\n# TYPE {name} {type_name}");
        for m in mf.get_metric() {
            write_metric(&mut out, name, kind, m);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_follow_prometheus_client() {
        let cases: [(f64, &str); 20] = [
            (0.0, "0.0"),
            (1.0, "1.0"),
            (6.0, "6.0"),
            (0.25, "0.25"),
            (1e-5, "1e-05"),
            (5e-5, "5e-05"),
            (0.0001, "0.0001"),
            (262_144.0, "262144.0"),
            (1e6, "1e+06"),
            (1.5e8, "1.5e+08"),
            (2e8, "2e+08"),
            (1e10, "1e+10"),
            (2_097_152.0, "2.097152e+06"),
            (1.234_567_89e11, "1.23456789e+11"),
            (1e100, "1e+100"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-1e6, "-1000000.0"),
            (1.0 / 3.0, "0.3333333333333333"),
            (f64::INFINITY, "+Inf"),
        ];
        for (v, s) in cases {
            assert_eq!(format_float(v), s, "{v}");
        }
        assert_eq!(python_float_str(1e-7), "1e-07");
        assert_eq!(python_float_str(1.25e-7), "1.25e-07");
        assert_eq!(python_float_str(1e22), "1e+22");
    }
}
