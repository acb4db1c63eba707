//! [`InfoSeries`]: the info series of a payload (label name → [`InfoValue`]).

use alloc::vec::Vec;
use core::fmt;

use super::{MAX_INFO_LABELS, MAX_INFO_SERIES, MAX_LABEL_LEN, Text};

/// The value of one info label, rendered as Python's `str()` renders it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InfoValue {
    /// Python's `None`, rendered `"None"`.
    None,
    /// A boolean, rendered `"True"`/`"False"`.
    Bool(bool),
    /// An integer, rendered in decimal.
    Int(i64),
    /// Text, rendered as is.
    Text(Text),
}

impl fmt::Display for InfoValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InfoValue::None => f.write_str("None"),
            InfoValue::Bool(true) => f.write_str("True"),
            InfoValue::Bool(false) => f.write_str("False"),
            InfoValue::Int(v) => write!(f, "{v}"),
            InfoValue::Text(t) => f.write_str(t),
        }
    }
}

/// Why an info series or an info list was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InfoError {
    /// More than [`MAX_INFO_SERIES`] series.
    TooManySeries,
    /// More than [`MAX_INFO_LABELS`] labels in one series.
    TooManyLabels,
    /// A label name or text value longer than [`MAX_LABEL_LEN`] bytes.
    TextTooLong,
}

impl fmt::Display for InfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InfoError::TooManySeries => {
                write!(f, "a payload carries at most {MAX_INFO_SERIES} info series")
            }
            InfoError::TooManyLabels => {
                write!(f, "an info series takes at most {MAX_INFO_LABELS} labels")
            }
            InfoError::TextTooLong => {
                write!(
                    f,
                    "info label names and values are limited to {MAX_LABEL_LEN} bytes"
                )
            }
        }
    }
}

impl core::error::Error for InfoError {}

/// One info series: label name → value, sorted by name, names unique.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct InfoSeries {
    pairs: Vec<(Text, InfoValue)>,
}

impl InfoSeries {
    /// An empty series (vLLM still exports it, with every declared label empty).
    #[must_use]
    pub const fn new() -> Self {
        InfoSeries { pairs: Vec::new() }
    }

    /// Sets label `key` to `value`, returning the previous value.
    ///
    /// # Errors
    /// [`InfoError::TooManyLabels`] or [`InfoError::TextTooLong`]; the series is unchanged.
    pub fn insert(
        &mut self,
        key: impl Into<Text>,
        value: InfoValue,
    ) -> Result<Option<InfoValue>, InfoError> {
        let key = key.into();
        let too_long = |t: &str| t.len() > MAX_LABEL_LEN;
        if too_long(&key) || matches!(&value, InfoValue::Text(t) if too_long(t)) {
            return Err(InfoError::TextTooLong);
        }
        match self.pairs.binary_search_by(|(k, _)| k.as_ref().cmp(&key)) {
            Ok(i) => Ok(self
                .pairs
                .get_mut(i)
                .map(|slot| core::mem::replace(&mut slot.1, value))),
            Err(i) => {
                if self.pairs.len() >= MAX_INFO_LABELS {
                    return Err(InfoError::TooManyLabels);
                }
                self.pairs.insert(i, (key, value));
                Ok(None)
            }
        }
    }

    /// Builder form of [`insert`](Self::insert).
    ///
    /// # Errors
    /// As [`insert`](Self::insert).
    pub fn with(mut self, key: impl Into<Text>, value: InfoValue) -> Result<Self, InfoError> {
        self.insert(key, value)?;
        Ok(self)
    }

    /// The value of label `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&InfoValue> {
        self.pairs
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .and_then(|i| self.pairs.get(i))
            .map(|(_, v)| v)
    }

    /// `(name, value)` pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &InfoValue)> {
        self.pairs.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// The number of labels.
    #[must_use]
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when no label is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Wraps pairs the caller has checked: sorted, unique, within the limits.
    pub(crate) fn from_checked_pairs(pairs: Vec<(Text, InfoValue)>) -> Self {
        InfoSeries { pairs }
    }
}
