//! Layer specs from raw numbers, shared by the capacity proptests
//! (`tests/capacity/capacity_props.rs`) and the `capacity_monotonic` fuzz target, so both reach
//! every [`LayerKind`] the same way.

use kvtier_core::capacity::{LayerKind, LayerSpec};

/// The layer kind numbered `index` (taken modulo the seven kinds), with `a` and `b` as its
/// parameters: the window and extra retained tokens of a sliding window, the chunk of a chunked
/// local layer, the state bytes and speculative blocks of a Mamba layer (whose prefill
/// checkpoint blocks are `b / 2`).
#[must_use]
pub fn layer_kind(index: u8, a: u64, b: u64) -> LayerKind {
    match index % 7 {
        0 => LayerKind::Full,
        1 => LayerKind::Mla,
        2 => LayerKind::SlidingWindow {
            window: a,
            extra_retained_tokens: b,
        },
        3 => LayerKind::ChunkedLocal { chunk: a },
        4 => LayerKind::Mamba {
            state_bytes: a,
            speculative_blocks: b,
            prefill_checkpoint_blocks: b / 2,
        },
        5 => LayerKind::Cross,
        _ => LayerKind::EncoderOnly,
    }
}

/// A well-formed spec of `kind`: a Mamba layer through [`LayerSpec::mamba`] (its state bytes
/// from the kind), any other through [`LayerSpec::attention`] with the given head geometry.
#[must_use]
pub fn realistic_spec(
    kind: LayerKind,
    block: u64,
    heads: u64,
    head_size: u64,
    dtype_bytes: u64,
) -> LayerSpec {
    match kind {
        LayerKind::Mamba { state_bytes, .. } => {
            let mut spec = LayerSpec::mamba(block, state_bytes);
            spec.kind = kind;
            spec
        }
        _ => LayerSpec::attention(kind, block, heads, head_size, dtype_bytes),
    }
}
