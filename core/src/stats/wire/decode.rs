//! [`decode`]: the owned payload, built from the same validating walk as the view.

use alloc::string::String;
use alloc::vec::Vec;

use super::DecodeError;
use super::walk::Walker;
use crate::stats::payload::{Labels, Payload, Series, Text};

/// Decodes a payload from exactly `bytes`.
///
/// # Errors
/// [`DecodeError::Truncated`] when `bytes` ends early; another [`DecodeError`] when it is not a
/// canonical encoding (including bytes after the payload).
pub fn decode(bytes: &[u8]) -> Result<Payload, DecodeError> {
    let mut walker = Walker::new(bytes)?;
    // Each series takes at least two bytes, which bounds the allocation by the input size too.
    let mut series: Vec<Series> = Vec::with_capacity(walker.left().min(bytes.len() / 2));
    let mut name: Text = Text::Borrowed("");
    while let Some(opens_family) = walker.next_series()? {
        if opens_family {
            name = match walker.def() {
                Some(def) => Text::Borrowed(def.name),
                None => Text::Owned(String::from(walker.name())),
            };
        }
        series.push(Series {
            name: name.clone(),
            labels: Labels::from_known(walker.labels().iter().map(|l| l.to_text())),
            value: walker.value().to_value(),
        });
    }
    let info = walker.finish(true)?;
    Ok(Payload::from_checked_parts(series, info))
}
