//! `kvtier convert --from mooncake IN -o OUT`: runs [`crate::convert`] and prints its summary.

use crate::convert::ConvertOptions;

use crate::convert::{ConvertError, convert};
use crate::input::TraceFormat;

/// Runs `kvtier convert`.
///
/// # Errors
/// See [`convert`].
pub(crate) fn run(options: &ConvertOptions) -> Result<(), ConvertError> {
    let s = convert(options)?;
    eprintln!(
        "kvtier convert: {} -> {} ({}): {} requests, {} skipped (no full block), {} records, \
         {} blocks",
        options.input.display(),
        options.output.display(),
        TraceFormat::Kvtrace.name(),
        s.requests,
        s.skipped,
        s.records,
        s.blocks
    );
    Ok(())
}
