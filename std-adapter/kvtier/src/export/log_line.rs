//! vLLM's `KV Transfer metrics: k=v, …` log line and Python's `str(float)`.

use std::fmt::Write as _;

use kvtier_core::stats::catalogue::{self, SIMPLE_INFO, Unit};
use kvtier_core::stats::reduce::series_key;
use kvtier_core::stats::{Payload, Value};

/// Python's `repr`/`str` of a float: the shortest round-trip digits, fixed notation for
/// decimal exponents −4…15 (with `.0` when integral), else `d.ddde±XX`; `nan`, `inf`, `-inf`.
#[must_use]
pub fn python_float_str(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.unsigned_abs());
    }
    let point = usize::try_from(exp.saturating_add(1)).unwrap_or(0);
    if exp < 0 {
        let zeros = "0".repeat(
            usize::try_from(exp.unsigned_abs())
                .unwrap_or(1)
                .saturating_sub(1),
        );
        format!("{sign}0.{zeros}{digits}")
    } else if digits.len() <= point {
        let zeros = "0".repeat(point - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        let (int, frac) = digits.split_at(point);
        format!("{sign}{int}.{frac}")
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "values leave the library as floats"
)]
fn seconds(v: u64, divisor: u64) -> String {
    python_float_str(v as f64 / divisor as f64)
}

/// vLLM's log line for an accumulated payload: `KV Transfer metrics: k=v, k=v, …` over the
/// keys of [`Payload::reduce`], or `None` when that is empty (an empty or info-only payload).
///
/// Values print as Python prints them in vLLM: integer counts, bytes and chunks as integers;
/// seconds (nanosecond families ÷ 10⁹) and fractions as floats (`0.5`, `0.0`).
///
/// ```
/// use kvtier::export::log_line;
/// use kvtier_core::stats::{Gauge, Payload, catalogue};
///
/// let mut p = Payload::new();
/// p.increase_counter(catalogue::LOAD_BYTES, &[], 100).unwrap();
/// p.increase_counter(catalogue::LOAD_TIME, &[], 500_000_000).unwrap();
/// p.set_gauge(catalogue::CPU_CACHE_USAGE_PERC, &[], Gauge::fraction(1, 4)).unwrap();
/// assert_eq!(
///     log_line(&p).unwrap(),
///     "KV Transfer metrics: vllm:kv_offload_cpu_cache_usage_perc=0.25, \
///      vllm:kv_offload_load_bytes=100, vllm:kv_offload_load_time=0.5"
/// );
/// assert_eq!(log_line(&Payload::new()), None);
/// ```
#[must_use]
pub fn log_line(payload: &Payload) -> Option<String> {
    let mut out = String::from("KV Transfer metrics: ");
    let mut first = true;
    let mut item = |out: &mut String, key: &str, value: &str| {
        if !first {
            out.push_str(", ");
        }
        first = false;
        let _ = write!(out, "{key}={value}");
    };
    for s in payload.series() {
        if s.name() == SIMPLE_INFO {
            continue;
        }
        let def = catalogue::lookup(s.name());
        let unit = def.map(|d| d.unit);
        let divisor = def.map_or(1, |d| d.export_divisor());
        let key = series_key(s.name(), s.labels());
        match s.value() {
            Value::Counter(v) if divisor > 1 => item(&mut out, &key, &seconds(*v, divisor)),
            Value::Counter(v) => item(&mut out, &key, &v.to_string()),
            Value::Gauge(g) if g.denominator() == 1 && unit != Some(Unit::Fraction) => {
                item(&mut out, &key, &g.numerator().to_string());
            }
            Value::Gauge(g) => item(&mut out, &key, &python_float_str(g.to_f64())),
            Value::Histogram(h) => {
                item(&mut out, &format!("{key}_count"), &h.count().to_string());
                let sum = if divisor > 1 {
                    seconds(h.sum(), divisor)
                } else {
                    h.sum().to_string()
                };
                item(&mut out, &format!("{key}_sum"), &sum);
            }
        }
    }
    (!first).then_some(out)
}
