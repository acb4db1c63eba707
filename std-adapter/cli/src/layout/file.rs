//! The JSON layout file.
//!
//! ```json
//! { "max_model_len": 8192, "max_num_batched_tokens": 2048,
//!   "layers": [ { "kind": "full", "block_size": 16, "num_kv_heads": 8, "head_size": 128,
//!                 "dtype_bytes": 2, "layers": 32 } ] }
//! ```
//!
//! Top level: `max_model_len` (required), `max_num_batched_tokens`, `max_concurrent_batches`
//! (each at least 1), and exactly one non-empty list: `layers` (kvtier groups them as vLLM
//! does) or `groups` (explicit groups).
//! Each entry: `kind` (`full`, `mla`, `sliding_window`, `chunked_local`, `mamba`, `cross`,
//! `encoder_only`), `block_size`, `num_kv_heads`, `head_size`, `head_size_v`, `dtype_bytes`,
//! `window`, `extra_retained_tokens`, `chunk`, `state_bytes`, `speculative_blocks`,
//! `prefill_checkpoint_blocks`, `page_size_padded`, `stride_alignment`, and `layers` (how many
//! layers share it, default 1). Unknown fields, fields of another kind and impossible values
//! are errors naming the field.

use kvtier_core::capacity::{LayerKind, LayerSpec, MAX_LAYERS};
use serde::Deserialize;

use super::{LayoutError, LayoutShape, ModelLayout};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTop {
    max_model_len: Option<u64>,
    max_num_batched_tokens: Option<u64>,
    max_concurrent_batches: Option<u64>,
    layers: Option<Vec<Entry>>,
    groups: Option<Vec<Entry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    kind: String,
    block_size: Option<u64>,
    num_kv_heads: Option<u64>,
    head_size: Option<u64>,
    head_size_v: Option<u64>,
    dtype_bytes: Option<u64>,
    window: Option<u64>,
    extra_retained_tokens: Option<u64>,
    chunk: Option<u64>,
    state_bytes: Option<u64>,
    speculative_blocks: Option<u64>,
    prefill_checkpoint_blocks: Option<u64>,
    page_size_padded: Option<u64>,
    stride_alignment: Option<u64>,
    layers: Option<u64>,
}

fn require(v: Option<u64>, path: &str, field: &str, kind: &str) -> Result<u64, LayoutError> {
    match v {
        Some(0) => Err(LayoutError::new(
            format!("{path}.{field}"),
            "must be at least 1",
        )),
        Some(x) => Ok(x),
        None => Err(LayoutError::new(
            format!("{path}.{field}"),
            format!("is required for kind \"{kind}\""),
        )),
    }
}

fn forbid(v: Option<u64>, path: &str, field: &str, kind: &str) -> Result<(), LayoutError> {
    match v {
        Some(_) => Err(LayoutError::new(
            format!("{path}.{field}"),
            format!("does not apply to kind \"{kind}\""),
        )),
        None => Ok(()),
    }
}

fn entry_spec(e: &Entry, path: &str) -> Result<(LayerSpec, u64), LayoutError> {
    let kind_name = e.kind.as_str();
    let block_size = require(e.block_size, path, "block_size", kind_name)?;
    let count = match e.layers {
        Some(0) => {
            return Err(LayoutError::new(
                format!("{path}.layers"),
                "must be at least 1",
            ));
        }
        Some(n) => n,
        None => 1,
    };
    let windowed = matches!(kind_name, "sliding_window");
    if !windowed {
        forbid(e.window, path, "window", kind_name)?;
        forbid(
            e.extra_retained_tokens,
            path,
            "extra_retained_tokens",
            kind_name,
        )?;
    }
    if kind_name != "chunked_local" {
        forbid(e.chunk, path, "chunk", kind_name)?;
    }
    let mut spec = if kind_name == "mamba" {
        for (v, f) in [
            (e.num_kv_heads, "num_kv_heads"),
            (e.head_size, "head_size"),
            (e.head_size_v, "head_size_v"),
            (e.dtype_bytes, "dtype_bytes"),
        ] {
            forbid(v, path, f, kind_name)?;
        }
        let mut s = LayerSpec::mamba(
            block_size,
            require(e.state_bytes, path, "state_bytes", kind_name)?,
        );
        s.kind = LayerKind::Mamba {
            state_bytes: s.unpadded_page_bytes().unwrap_or(0),
            speculative_blocks: e.speculative_blocks.unwrap_or(0),
            prefill_checkpoint_blocks: e.prefill_checkpoint_blocks.unwrap_or(0),
        };
        s
    } else {
        forbid(e.state_bytes, path, "state_bytes", kind_name)?;
        forbid(e.speculative_blocks, path, "speculative_blocks", kind_name)?;
        forbid(
            e.prefill_checkpoint_blocks,
            path,
            "prefill_checkpoint_blocks",
            kind_name,
        )?;
        let kind = match kind_name {
            "full" => LayerKind::Full,
            "mla" => LayerKind::Mla,
            "sliding_window" => LayerKind::SlidingWindow {
                window: require(e.window, path, "window", kind_name)?,
                extra_retained_tokens: e.extra_retained_tokens.unwrap_or(0),
            },
            "chunked_local" => LayerKind::ChunkedLocal {
                chunk: require(e.chunk, path, "chunk", kind_name)?,
            },
            "cross" => LayerKind::Cross,
            "encoder_only" => LayerKind::EncoderOnly,
            other => {
                return Err(LayoutError::new(
                    format!("{path}.kind"),
                    format!(
                        "unknown kind \"{other}\" (expected full, mla, sliding_window, chunked_local, mamba, cross, encoder_only)"
                    ),
                ));
            }
        };
        let heads = if kind == LayerKind::Mla {
            e.num_kv_heads.unwrap_or(1)
        } else {
            require(e.num_kv_heads, path, "num_kv_heads", kind_name)?
        };
        let mut s = LayerSpec::attention(
            kind,
            block_size,
            heads,
            require(e.head_size, path, "head_size", kind_name)?,
            require(e.dtype_bytes, path, "dtype_bytes", kind_name)?,
        );
        if let Some(v) = e.head_size_v {
            s.head_size_v = v;
        }
        s
    };
    spec.page_size_padded = e.page_size_padded;
    if let Some(a) = e.stride_alignment {
        spec.stride_alignment = a;
    }
    spec.validate()
        .map_err(|err| LayoutError::new(path.to_owned(), err.to_string()))?;
    Ok((spec, count))
}

fn total_ok(total: u64, field: &str) -> Result<(), LayoutError> {
    if usize::try_from(total).map_or(true, |t| t > MAX_LAYERS) {
        return Err(LayoutError::new(
            field,
            format!("more than {MAX_LAYERS} layers in total"),
        ));
    }
    Ok(())
}

/// Parses a layout file's text.
///
/// # Errors
/// [`LayoutError`] naming the field: malformed JSON, unknown or misplaced fields, missing or
/// zero values, invalid specs, too many layers.
pub fn parse_layout_json(text: &str) -> Result<ModelLayout, LayoutError> {
    let top: FileTop = serde_json::from_str(text)
        .map_err(|e| LayoutError::new("", format!("layout file: {e}")))?;
    let max_model_len = match top.max_model_len {
        Some(0) => return Err(LayoutError::new("max_model_len", "must be at least 1")),
        Some(l) => l,
        None => return Err(LayoutError::new("max_model_len", "is required")),
    };
    for (v, field) in [
        (top.max_num_batched_tokens, "max_num_batched_tokens"),
        (top.max_concurrent_batches, "max_concurrent_batches"),
    ] {
        if v == Some(0) {
            return Err(LayoutError::new(field, "must be at least 1"));
        }
    }
    for (list, field) in [(&top.layers, "layers"), (&top.groups, "groups")] {
        if list.as_ref().is_some_and(Vec::is_empty) {
            return Err(LayoutError::new(
                field,
                "is empty: a layout needs at least one layer",
            ));
        }
    }
    let shape = match (top.layers, top.groups) {
        (Some(_), Some(_)) => {
            return Err(LayoutError::new(
                "groups",
                "give either layers or groups, not both",
            ));
        }
        (None, None) => {
            return Err(LayoutError::new(
                "layers",
                "either layers or groups is required",
            ));
        }
        (Some(entries), None) => {
            let mut layers = Vec::new();
            let mut total = 0u64;
            for (i, e) in entries.iter().enumerate() {
                let path = format!("layers[{i}]");
                let (spec, count) = entry_spec(e, &path)?;
                total = total.saturating_add(count);
                total_ok(total, &format!("{path}.layers"))?;
                layers.extend(std::iter::repeat_n(
                    spec,
                    usize::try_from(count).unwrap_or(0),
                ));
            }
            LayoutShape::Layers(layers)
        }
        (None, Some(entries)) => {
            let mut groups = Vec::new();
            let mut total = 0u64;
            for (i, e) in entries.iter().enumerate() {
                let path = format!("groups[{i}]");
                let (spec, count) = entry_spec(e, &path)?;
                total = total.saturating_add(count);
                total_ok(total, &format!("{path}.layers"))?;
                groups.push(vec![spec; usize::try_from(count).unwrap_or(0)]);
            }
            LayoutShape::Groups(groups)
        }
    };
    Ok(ModelLayout {
        name: "layout file".to_owned(),
        shape,
        max_model_len: Some(max_model_len),
        max_num_batched_tokens: top.max_num_batched_tokens,
        max_concurrent_batches: top.max_concurrent_batches,
    })
}
