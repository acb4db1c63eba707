//! Built-in presets: the shape facts of a few well-known open models, as the config.json
//! fragments that define their KV cache (written for kvtier, not copied).

use super::{HfOptions, LayoutError, ModelLayout, parse_hf_config};

/// `(name, config.json fragment)` of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "llama-3-8b",
        r#"{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16","max_position_embeddings":8192}"#,
    ),
    (
        "llama-3.1-8b",
        r#"{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16","max_position_embeddings":131072}"#,
    ),
    (
        "llama-3.1-70b",
        r#"{"model_type":"llama","num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"hidden_size":8192,"torch_dtype":"bfloat16","max_position_embeddings":131072}"#,
    ),
    (
        "mistral-7b-v0.1",
        r#"{"model_type":"mistral","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"sliding_window":4096,"torch_dtype":"bfloat16","max_position_embeddings":32768}"#,
    ),
    (
        "qwen2.5-7b",
        r#"{"model_type":"qwen2","num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"hidden_size":3584,"use_sliding_window":false,"sliding_window":131072,"torch_dtype":"bfloat16","max_position_embeddings":32768}"#,
    ),
    (
        "qwen3-8b",
        r#"{"model_type":"qwen3","num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"hidden_size":4096,"use_sliding_window":false,"torch_dtype":"bfloat16","max_position_embeddings":40960}"#,
    ),
    (
        "gemma-2-9b",
        r#"{"model_type":"gemma2","num_hidden_layers":42,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,"hidden_size":3584,"sliding_window":4096,"torch_dtype":"bfloat16","max_position_embeddings":8192}"#,
    ),
    (
        "gemma-3-27b",
        r#"{"model_type":"gemma3","text_config":{"model_type":"gemma3_text","num_hidden_layers":62,"num_attention_heads":32,"num_key_value_heads":16,"head_dim":128,"hidden_size":5376,"sliding_window":1024,"sliding_window_pattern":6,"max_position_embeddings":131072},"torch_dtype":"bfloat16"}"#,
    ),
    (
        "deepseek-v3",
        r#"{"model_type":"deepseek_v3","num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"hidden_size":7168,"torch_dtype":"bfloat16","max_position_embeddings":163840}"#,
    ),
];

/// The preset called `name`.
///
/// # Errors
/// [`LayoutError`] on `--model` when no preset has that name (the message lists them).
pub fn preset(name: &str, opts: &HfOptions) -> Result<ModelLayout, LayoutError> {
    let Some((_, json)) = PRESETS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) else {
        let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        return Err(LayoutError::new(
            "--model",
            format!("unknown preset \"{name}\" (known: {})", names.join(", ")),
        ));
    };
    let mut layout = parse_hf_config(json, opts)?;
    name.clone_into(&mut layout.name);
    Ok(layout)
}
