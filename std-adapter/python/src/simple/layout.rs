//! The model's KV-cache groups and their tables as `kvtier.simple` passes them to the core.

use kvtier_core::simple::{GroupKind, Layout};
use pyo3::prelude::*;

use super::value_error;

/// The layout of `groups`, each `(kind, tokens)`: `"full_attention"`, `"sliding_window"`
/// (tokens: the window), `"chunked_local"` (tokens: the chunk), `"mamba"` or `"scratch"`;
/// `block_sizes[g]` is group `g`'s block size (none given: the scheduler's).
pub(super) fn layout(groups: &[(String, u32)], block_sizes: &[u32]) -> PyResult<Layout> {
    let kinds = groups
        .iter()
        .map(|(kind, tokens)| match kind.as_str() {
            "full_attention" => Ok(GroupKind::FullAttention),
            "sliding_window" => Ok(GroupKind::SlidingWindow { window: *tokens }),
            "chunked_local" => Ok(GroupKind::ChunkedLocal { chunk: *tokens }),
            "mamba" => Ok(GroupKind::Mamba),
            "scratch" => Ok(GroupKind::Scratch),
            other => Err(value_error(format!(
                "unknown KV-cache group kind {other:?}"
            ))),
        })
        .collect::<PyResult<Vec<_>>>()?;
    let mut l = Layout::new(&kinds).map_err(value_error)?;
    for (g, &b) in (0u32..).zip(block_sizes) {
        l = l.with_block_size(g, b).map_err(value_error)?;
    }
    Ok(l)
}

/// Borrows per-group lists as the core's tables.
pub(super) fn tables(lists: &[Vec<u32>]) -> Vec<&[u32]> {
    lists.iter().map(Vec::as_slice).collect()
}
