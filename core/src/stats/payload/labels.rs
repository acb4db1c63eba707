//! [`Labels`]: a series' label-value tuple, and the interning of known names and values.

use alloc::borrow::Cow;
use alloc::string::String;
use core::fmt;

use super::{MAX_LABEL_LEN, MAX_LABELS, Text};
use crate::stats::catalogue;

/// Why a label tuple could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelError {
    /// More than [`MAX_LABELS`] values.
    TooManyLabels,
    /// A value longer than [`MAX_LABEL_LEN`] bytes.
    LabelTooLong,
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::TooManyLabels => write!(f, "a series takes at most {MAX_LABELS} labels"),
            LabelError::LabelTooLong => {
                write!(f, "a label value is limited to {MAX_LABEL_LEN} bytes")
            }
        }
    }
}

impl core::error::Error for LabelError {}

/// A label-value tuple (empty for an unlabeled metric), ordered lexicographically.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(heapless::Vec<Text, MAX_LABELS>);

fn intern_label(value: &str) -> Text {
    match catalogue::known_label(value) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(String::from(value)),
    }
}

impl Labels {
    /// The empty tuple.
    #[must_use]
    pub const fn new() -> Self {
        Labels(heapless::Vec::new())
    }

    /// A tuple of copies of `values` (known values are borrowed, not copied).
    ///
    /// # Errors
    /// [`LabelError`] when there are too many values or one is too long.
    pub fn from_strs(values: &[&str]) -> Result<Self, LabelError> {
        check_labels(values)?;
        let mut out = heapless::Vec::new();
        for v in values {
            out.push(intern_label(v))
                .map_err(|_| LabelError::TooManyLabels)?;
        }
        Ok(Labels(out))
    }

    /// A tuple of values the caller knows to be within the limits (at most [`MAX_LABELS`];
    /// any further value is dropped).
    pub(crate) fn from_known(values: impl IntoIterator<Item = Text>) -> Self {
        let mut out = heapless::Vec::new();
        for v in values {
            if out.push(v).is_err() {
                break;
            }
        }
        Labels(out)
    }

    /// Appends one value.
    ///
    /// # Errors
    /// [`LabelError`] when the tuple is full or the value is too long; the tuple is unchanged.
    pub fn push(&mut self, value: impl Into<Text>) -> Result<(), LabelError> {
        let value = value.into();
        if value.len() > MAX_LABEL_LEN {
            return Err(LabelError::LabelTooLong);
        }
        self.0.push(value).map_err(|_| LabelError::TooManyLabels)
    }

    /// The values.
    #[must_use]
    pub fn as_slice(&self) -> &[Text] {
        &self.0
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty tuple.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values as `&str`.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|t| t.as_ref())
    }
}

pub(crate) fn check_labels(values: &[&str]) -> Result<(), LabelError> {
    if values.len() > MAX_LABELS {
        return Err(LabelError::TooManyLabels);
    }
    if values.iter().any(|v| v.len() > MAX_LABEL_LEN) {
        return Err(LabelError::LabelTooLong);
    }
    Ok(())
}
