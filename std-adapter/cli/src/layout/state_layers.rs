//! Models with Mamba / linear-attention state layers, which config.json reading refuses.
//!
//! vLLM 0.33.0 sizes such a layer's page from the model's code (the state shapes of
//! `get_mamba_state_shape_from_config`, e.g. Jamba's conv and SSM states, Qwen3-Next's gated
//! delta-net states) and then raises the attention block size until an attention page covers
//! the state page, by the attention backend's kernel block sizes
//! (`Platform._align_hybrid_block_size`). A config.json does not carry those facts, so instead of
//! a number that counts such a model as all attention, reading it fails with an error naming the
//! field that shows the state layers and the model type. A layout file can describe the model
//! exactly with `mamba` entries.

use serde_json::{Map, Value};

use super::LayoutError;

/// config.json keys that only models with state layers carry.
const STATE_FIELDS: &[&str] = &[
    // Jamba, Bamba, Zamba2, Falcon-H1, Plamo2.
    "layers_block_type",
    "attn_layer_period",
    "attn_layer_offset",
    "attn_layer_indices",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_d_ssm",
    "mamba_n_heads",
    // Nemotron-H, Mamba2, Granite 4 hybrid.
    "hybrid_override_pattern",
    "ssm_state_size",
    "mamba_num_heads",
    // Qwen3-Next, Qwen3.5 (gated delta-net), Kimi-Linear, MiniMax.
    "full_attention_interval",
    "linear_num_value_heads",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "linear_attn_config",
    "attn_type_list",
];

/// `architectures` that vLLM 0.33.0 runs with state layers (its `IsHybrid` and
/// `IsAttentionFree` model classes, and their registered aliases).
const STATE_ARCHITECTURES: &[&str] = &[
    "BailingMoeV25ForCausalLM",
    "BailingMoeV3ForCausalLM",
    "FalconH1ForCausalLM",
    "FalconMambaForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "JambaForCausalLM",
    "JambaForSequenceClassification",
    "KimiLinearForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "Lfm2VLForConditionalGeneration",
    "Mamba2ForCausalLM",
    "MambaForCausalLM",
    "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM",
    "NemotronH_Nano_VL_V2",
    "OlmoHybridForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Zamba2ForCausalLM",
];

/// `model_type`s of such models.
const STATE_MODEL_TYPES: &[&str] = &[
    "bamba",
    "falcon_h1",
    "falcon_mamba",
    "granitemoehybrid",
    "jamba",
    "kimi_linear",
    "lfm2",
    "lfm2_moe",
    "lfm2_vl",
    "mamba",
    "mamba2",
    "nemotron_h",
    "plamo2",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "qwen3_next",
    "zamba2",
];

/// `layer_types` entries that name a state layer.
const STATE_LAYER_TYPES: &[&str] = &[
    "linear_attention",
    "mamba",
    "mamba2",
    "conv",
    "short_conv",
    "ssm",
    "deltanet",
];

fn refusal(field: impl Into<String>, model_type: &str, what: &str) -> LayoutError {
    let shown = if model_type.is_empty() {
        "(none)"
    } else {
        model_type
    };
    LayoutError::new(
        field,
        format!(
            "{what} (model type \"{shown}\"): Mamba / linear-attention state layers are not sized \
             from config.json, since vLLM takes their state shapes from the model's code and pads \
             the attention block size to fit them; describe the model in a --layout file with \
             \"mamba\" entries"
        ),
    )
}

/// Fails when the config describes a model with state layers; `m` is the language model's
/// config (`text_config` when nested), `root` the whole file, `model_type` the language
/// model's type and `root_type` the file's.
pub(super) fn refuse_state_layers(
    root: &Map<String, Value>,
    m: &Map<String, Value>,
    model_type: &str,
    root_type: &str,
) -> Result<(), LayoutError> {
    for &key in STATE_FIELDS {
        if [m, root]
            .iter()
            .any(|c| c.get(key).is_some_and(|v| !v.is_null()))
        {
            return Err(refusal(key, model_type, "is a state-layer field"));
        }
    }
    if let Some(Value::Array(archs)) = root.get("architectures")
        && let Some(a) = archs
            .iter()
            .filter_map(Value::as_str)
            .find(|a| STATE_ARCHITECTURES.contains(a))
    {
        return Err(refusal(
            "architectures",
            model_type,
            &format!("\"{a}\" has state layers"),
        ));
    }
    if STATE_MODEL_TYPES.contains(&model_type) || STATE_MODEL_TYPES.contains(&root_type) {
        return Err(refusal("model_type", model_type, "has state layers"));
    }
    Ok(())
}

/// Fails when layer `i`'s `layer_types` entry names a state layer.
pub(super) fn refuse_state_layer_type(
    i: usize,
    layer_type: &str,
    model_type: &str,
) -> Result<(), LayoutError> {
    if STATE_LAYER_TYPES.contains(&layer_type) {
        return Err(refusal(
            format!("layer_types[{i}]"),
            model_type,
            &format!("\"{layer_type}\" is a state layer"),
        ));
    }
    Ok(())
}
