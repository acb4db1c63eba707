//! [`decode`]: the owned payload, built by a [`Visitor`] of the validating walk.

use alloc::string::String;
use alloc::vec::Vec;
use core::mem;

use super::DecodeError;
use super::reader::{Checked, to_text, utf8};
use super::value::ValueView;
use super::walk::{InfoRaw, Tuple, Visitor, walk};
use crate::stats::MetricKind;
use crate::stats::catalogue::{self, CATALOGUE};
use crate::stats::payload::{InfoSeries, InfoValue, Labels, Payload, Series, Text};

/// Decodes a payload from exactly `bytes`.
///
/// # Errors
/// [`DecodeError::Truncated`] when `bytes` ends early; another [`DecodeError`] when it is not a
/// canonical encoding (including bytes after the payload).
pub fn decode(bytes: &[u8]) -> Result<Payload, DecodeError> {
    let mut build = Build {
        series: Vec::new(),
        name: Text::Borrowed(""),
        position: None,
        info: None,
        pairs: None,
    };
    walk(bytes, &mut build)?;
    build.close_info_series();
    Ok(Payload::from_checked_parts(build.series, build.info))
}

/// The visitor that builds the payload as the walk checks it.
struct Build {
    series: Vec<Series>,
    /// The name of the family opened last.
    name: Text,
    /// The catalogue position of the family name read last, if it is a catalogue name.
    position: Option<usize>,
    info: Option<Vec<InfoSeries>>,
    /// The labels of the info series opened last.
    pairs: Option<Vec<(Text, InfoValue)>>,
}

impl Build {
    /// Adds the info series opened last (if any) to the info list.
    fn close_info_series(&mut self) {
        if let (Some(info), Some(pairs)) = (&mut self.info, self.pairs.take()) {
            info.push(InfoSeries::from_checked_pairs(pairs));
        }
    }
}

impl<'a> Visitor<'a> for Build {
    fn total(&mut self, total: usize, input: usize) {
        // Each series takes at least two bytes, which bounds the allocation by the input size
        // too.
        self.series = Vec::with_capacity(total.min(input / 2));
    }

    fn known_name(&mut self, name: &'a [u8]) -> Option<Checked> {
        // Looked up once: `family` names the family from it.
        let position = catalogue::position_bytes(name);
        match (mem::replace(&mut self.position, position), position) {
            (Some(prev), Some(at)) => Some(Checked {
                ascending: prev < at,
                utf8: true,
                ascii: false,
            }),
            _ => None,
        }
    }

    fn family(&mut self, name: &'a [u8], _kind: MetricKind) -> Result<(), DecodeError> {
        self.name = match self.position.and_then(|i| CATALOGUE.get(i)) {
            Some(def) => Text::Borrowed(def.name),
            None => Text::Owned(String::from(utf8(name)?)),
        };
        Ok(())
    }

    fn series(&mut self, labels: Tuple<'a>, value: ValueView<'a>) -> Result<(), DecodeError> {
        // The walk checked every label (at most MAX_LABELS, UTF-8), so `to_text` cannot fail;
        // were it to, its error is kept and returned (the payload is dropped then). The labels
        // are built in place in the pushed series (a copy of them costs more than the check).
        let mut failed = None;
        self.series.push(Series {
            name: self.name.clone(),
            labels: Labels::from_known(
                labels
                    .labels()
                    .map_while(|raw| to_text(raw).map_err(|e| failed = Some(e)).ok()),
            ),
            value: value.to_value(),
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn info(&mut self, count: usize, left: usize) {
        self.info = Some(Vec::with_capacity(count.min(left)));
    }

    fn info_series(&mut self, count: usize, left: usize) {
        self.close_info_series();
        self.pairs = Some(Vec::with_capacity(count.min(left)));
    }

    fn info_label(&mut self, name: &'a [u8], value: InfoRaw<'a>) -> Result<(), DecodeError> {
        let value = match value {
            InfoRaw::None => InfoValue::None,
            InfoRaw::Bool(b) => InfoValue::Bool(b),
            InfoRaw::Int(i) => InfoValue::Int(i),
            InfoRaw::Text(t) => InfoValue::Text(to_text(t)?),
        };
        let name = to_text(name)?;
        if let Some(pairs) = &mut self.pairs {
            pairs.push((name, value));
        }
        Ok(())
    }
}
