//! Reading KV layouts: the JSON layout file, Hugging Face `config.json`, built-in presets.
//!
//! Every reader produces a [`ModelLayout`]: the layer specs (in model order) or explicit
//! groups, plus the scheduler defaults the source carries (`max_model_len`, ...). Errors are
//! [`LayoutError`]s that name the field at fault.

mod file;
mod hf;
mod presets;

pub use file::parse_layout_json;
pub use hf::{HfOptions, parse_hf_config};
pub use presets::{PRESETS, preset};

use kvtier_core::capacity::{GroupedLayout, GroupingError, LayerSpec};

/// A model's KV layout as read from a file or preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayout {
    /// What it was read from (preset name, `model_type`, or "layout file").
    pub name: String,
    /// The layers, in model order, or explicit groups.
    pub shape: LayoutShape,
    /// The source's `max_model_len` (layout file) or `max_position_embeddings` (config.json).
    pub max_model_len: Option<u64>,
    /// The layout file's `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// The layout file's `max_concurrent_batches`.
    pub max_concurrent_batches: Option<u64>,
}

/// Layers to be grouped as vLLM groups them, or groups given explicitly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutShape {
    /// One spec per layer; kvtier groups them.
    Layers(Vec<LayerSpec>),
    /// Explicit KV-cache groups.
    Groups(Vec<Vec<LayerSpec>>),
}

impl ModelLayout {
    /// Groups the layers (or takes the explicit groups).
    ///
    /// # Errors
    /// [`GroupingError`].
    pub fn grouped(&self) -> Result<GroupedLayout, GroupingError> {
        match &self.shape {
            LayoutShape::Layers(l) => GroupedLayout::from_layers(l),
            LayoutShape::Groups(g) => GroupedLayout::from_groups(g),
        }
    }

    /// Number of layers.
    #[must_use]
    pub fn num_layers(&self) -> usize {
        match &self.shape {
            LayoutShape::Layers(l) => l.len(),
            LayoutShape::Groups(g) => g.iter().map(Vec::len).sum(),
        }
    }
}

/// A layout that could not be read: the field (a JSON path such as `layers[2].window`, or a
/// config.json key) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    /// The field at fault.
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl LayoutError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{}: {}", self.field, self.problem)
        }
    }
}

impl std::error::Error for LayoutError {}

/// Bytes per element of a dtype name (`float32`/`fp32` 4, `bfloat16`/`float16`/`half` 2,
/// `fp8*`/`int8`/`uint8` 1), or `None` when unknown.
#[must_use]
pub fn dtype_bytes(name: &str) -> Option<u64> {
    let n = name
        .trim()
        .trim_start_matches("torch.")
        .to_ascii_lowercase();
    match n.as_str() {
        "float32" | "fp32" | "float" => Some(4),
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => Some(2),
        "int8" | "uint8" => Some(1),
        _ if n.starts_with("fp8") || n.starts_with("float8") => Some(1),
        _ => None,
    }
}
