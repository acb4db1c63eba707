//! Reading KV layouts: the JSON layout file, Hugging Face `config.json`, built-in presets.
//!
//! Every reader produces a [`ModelLayout`]: the layer specs (in model order) or explicit
//! groups, plus the scheduler defaults the source carries (`max_model_len`, ...). Errors are
//! [`LayoutError`]s that name the field at fault.

mod dtype;
mod file;
mod hf;
mod presets;
mod state_layers;

pub use dtype::{UnknownDtype, auto_kv_dtype, dtype_bytes};
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

    /// The same error with the file it came from in front of the field (`FILE: field`, or
    /// just `FILE` when the error concerns the whole text).
    #[must_use]
    pub fn in_file(self, path: &str) -> Self {
        let field = if self.field.is_empty() {
            path.to_owned()
        } else {
            format!("{path}: {}", self.field)
        };
        Self { field, ..self }
    }
}

/// The most bytes `--layout` and `--hf-config` files may have (4 MiB): real layout files and
/// config.json files are a few KiB, and a larger input (or a device such as `/dev/zero`) is
/// refused before it is parsed.
pub const MAX_LAYOUT_FILE_BYTES: u64 = 4 << 20;

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
