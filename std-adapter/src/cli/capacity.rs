//! `kvtier capacity`.

/// Options of `kvtier capacity`.
#[derive(Debug, clap::Args)]
pub struct CapacityArgs {}

/// Runs `kvtier capacity`.
///
/// # Errors
/// Any error of reading the layout or computing the figures, as text.
pub fn run(_args: &CapacityArgs) -> Result<(), String> {
    Ok(())
}
