//! [`OutputError`]: why a command's report could not be printed.

use std::fmt;

use kvtier::export::RenderError;

/// Why a command's report could not be printed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutputError {
    /// The report could not be serialised as JSON (not expected: plain numbers and strings).
    Json(serde_json::Error),
    /// The metrics exposition could not be rendered.
    Metrics(RenderError),
    /// Writing the report to stdout failed.
    Write(std::io::Error),
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::Json(e) => e.fmt(f),
            OutputError::Metrics(e) => write!(f, "rendering the metrics: {e}"),
            OutputError::Write(e) => write!(f, "writing the report: {e}"),
        }
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutputError::Json(e) => Some(e),
            OutputError::Metrics(e) => Some(e),
            OutputError::Write(e) => Some(e),
        }
    }
}
