//! The flat summary of a payload for vLLM's log line (`KV Transfer metrics: k=v, …`).
//!
//! Keys follow vLLM: `name` for an unlabeled series and `name:<tuple>` otherwise, the tuple in
//! Python's `repr` form (`x:('a',)`, `x:('a', 'b')`). A histogram gives `<key>_count` and
//! `<key>_sum`. Info series are left out, and so is the simple offloader's info gauge
//! ([`SIMPLE_INFO`]). Values leave the integer world here: nanosecond families are divided by
//! 10⁹ (so a `load_time` of 500 000 000 ns reduces to `0.5`), gauges become their correctly rounded
//! quotient.
//!
//! One difference from vLLM: vLLM's dict keeps insertion order, kvtier's list is in key order.
//!
//! ```
//! use kvtier_core::stats::{Payload, catalogue};
//!
//! let mut p = Payload::new();
//! p.increase_counter(catalogue::LOAD_TIME, &[], 500_000_000).unwrap();
//! p.increase_counter("x", &["a"], 2).unwrap();
//! let r = p.reduce();
//! assert_eq!(r[0], ("vllm:kv_offload_load_time".to_string(), 0.5));
//! assert_eq!(r[1], ("x:('a',)".to_string(), 2.0));
//! ```

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write as _;

use super::catalogue::{self, SIMPLE_INFO};
use super::payload::{Labels, Payload, Value};

/// `value / divisor` as a float (the divisor is 1 or a power of ten).
pub(crate) fn scaled(value: u64, divisor: u64) -> f64 {
    if divisor <= 1 {
        value as f64
    } else {
        value as f64 / divisor as f64
    }
}

/// Appends Python's `repr` of a string: single quotes unless the text holds a single quote and
/// no double quote; backslash, the chosen quote and control characters escaped.
pub fn push_python_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if u32::from(c) < 0x20 || (0x7f..0xa0).contains(&u32::from(c)) => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// vLLM's log-line key of a series: `name`, or `name:('a',)`, `name:('a', 'b')`, ….
#[must_use]
pub fn series_key(name: &str, labels: &Labels) -> String {
    let mut key = String::with_capacity(name.len() + 8 * labels.len());
    key.push_str(name);
    if labels.is_empty() {
        return key;
    }
    key.push_str(":(");
    for (i, v) in labels.iter().enumerate() {
        if i > 0 {
            key.push_str(", ");
        }
        push_python_str_repr(&mut key, v);
    }
    if labels.len() == 1 {
        key.push(',');
    }
    key.push(')');
    key
}

impl Payload {
    /// The flat `(key, value)` summary for the log line, in key order. See the
    /// [module docs](crate::stats::reduce).
    #[must_use]
    pub fn reduce(&self) -> Vec<(String, f64)> {
        let mut out = Vec::with_capacity(self.len());
        for s in self.series() {
            if s.name() == SIMPLE_INFO {
                continue;
            }
            let divisor = catalogue::lookup(s.name()).map_or(1, |d| d.export_divisor());
            let key = series_key(s.name(), s.labels());
            match s.value() {
                Value::Counter(v) => out.push((key, scaled(*v, divisor))),
                Value::Gauge(g) => out.push((key, g.to_f64())),
                Value::Histogram(h) => {
                    let mut count_key = key.clone();
                    count_key.push_str("_count");
                    let mut sum_key = key;
                    sum_key.push_str("_sum");
                    out.push((count_key, scaled(h.count(), 1)));
                    out.push((sum_key, scaled(h.sum(), divisor)));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn repr(s: &str) -> String {
        let mut out = String::new();
        push_python_str_repr(&mut out, s);
        out
    }

    #[test]
    fn python_repr_quoting() {
        assert_eq!(repr("a"), "'a'");
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(repr("x\\y\n\u{1}"), "'x\\\\y\\n\\x01'");
        assert_eq!(repr("é"), "'é'");
    }

    #[test]
    fn keys_follow_python_tuples() {
        let one = Labels::from_strs(&["a"]).unwrap();
        let two = Labels::from_strs(&["a", "b"]).unwrap();
        assert_eq!(series_key("x", &Labels::new()), "x");
        assert_eq!(series_key("x", &one), "x:('a',)");
        assert_eq!(series_key("x", &two), "x:('a', 'b')");
        assert_eq!(scaled(1, 1_000_000_000), 1e-9);
        assert_eq!(
            "0.5".parse::<f64>().unwrap(),
            scaled(500_000_000, 1_000_000_000)
        );
        assert_eq!(scaled(3, 1).to_string(), "3");
    }
}
