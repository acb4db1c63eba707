//! `kvtier replay`.

/// Options of `kvtier replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {}

/// Runs `kvtier replay`.
///
/// # Errors
/// Any error of reading or replaying the trace, as text.
pub fn run(_args: &ReplayArgs) -> Result<(), String> {
    Ok(())
}
