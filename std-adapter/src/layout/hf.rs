//! Hugging Face `config.json`: the shape facts that define a model's KV cache.
//!
//! Read: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads` (default: the
//! attention heads), `head_dim` (default `hidden_size / num_attention_heads`), `torch_dtype` /
//! `dtype`, `max_position_embeddings`, and the attention pattern:
//! * `layer_types` (`full_attention`, `sliding_attention`, `chunked_attention`) when present;
//! * Gemma 2 (`model_type` `gemma2`): even layers slide over `sliding_window`;
//! * Gemma 3 (`gemma3`, `gemma3_text`; a nested `text_config` is read): every
//!   `sliding_window_pattern`-th layer (default 6) is full, the others slide;
//! * Qwen2/Qwen3 with `use_sliding_window: true`: layers from `max_window_layers` on slide;
//!   `use_sliding_window: false` ignores `sliding_window`;
//! * any other config with a numeric `sliding_window`: every layer slides (Mistral v0.1);
//! * DeepSeek-style MLA (`kv_lora_rank` present): one latent head of
//!   `kv_lora_rank + qk_rope_head_dim`, `head_size_v = 0`.

use kvtier_core::capacity::{LayerKind, LayerSpec, MAX_LAYERS};
use serde_json::{Map, Value};

use super::{LayoutError, LayoutShape, ModelLayout, dtype_bytes};

/// Choices a config.json does not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfOptions {
    /// Tokens per block (vLLM's default on CUDA is 16).
    pub block_size: u64,
    /// Cache dtype bytes, overriding the config's dtype (`--dtype`).
    pub dtype_bytes: Option<u64>,
}

impl Default for HfOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            dtype_bytes: None,
        }
    }
}

fn get_u64(m: &Map<String, Value>, key: &str) -> Result<Option<u64>, LayoutError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| LayoutError::new(key, "must be a non-negative integer")),
    }
}

fn need_u64(m: &Map<String, Value>, key: &str) -> Result<u64, LayoutError> {
    match get_u64(m, key)? {
        Some(0) => Err(LayoutError::new(key, "must be at least 1")),
        Some(v) => Ok(v),
        None => Err(LayoutError::new(key, "is required")),
    }
}

#[derive(Clone, Copy)]
enum Attn {
    Full,
    Sliding,
    Chunked,
}

/// Parses a Hugging Face `config.json` text.
///
/// # Errors
/// [`LayoutError`] naming the config key that is missing, malformed or unsupported.
pub fn parse_hf_config(text: &str, opts: &HfOptions) -> Result<ModelLayout, LayoutError> {
    let root: Value = serde_json::from_str(text)
        .map_err(|e| LayoutError::new("", format!("config.json: {e}")))?;
    let Value::Object(root) = root else {
        return Err(LayoutError::new("", "config.json must be a JSON object"));
    };
    let model_type = root
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    // Multimodal wrappers (Gemma 3) keep the language model in text_config.
    let m = match root.get("text_config") {
        Some(Value::Object(t)) => t,
        _ => &root,
    };
    let inner_type = m
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or(&model_type)
        .to_owned();
    let n_layers = need_u64(m, "num_hidden_layers")?;
    let n = usize::try_from(n_layers)
        .ok()
        .filter(|&n| n <= MAX_LAYERS)
        .ok_or_else(|| {
            LayoutError::new(
                "num_hidden_layers",
                format!("more than {MAX_LAYERS} layers"),
            )
        })?;
    let dtype = match opts.dtype_bytes {
        Some(b) => b,
        None => {
            let key = if m.contains_key("torch_dtype") {
                "torch_dtype"
            } else {
                "dtype"
            };
            match m.get(key).or_else(|| root.get(key)) {
                Some(Value::String(s)) => dtype_bytes(s)
                    .ok_or_else(|| LayoutError::new(key, format!("unknown dtype \"{s}\"")))?,
                None | Some(Value::Null) => 2,
                Some(_) => return Err(LayoutError::new(key, "must be a string")),
            }
        }
    };
    let block = opts.block_size;
    let max_len = get_u64(m, "max_position_embeddings")?;

    // MLA (DeepSeek V2/V3).
    if let Some(rank) = get_u64(m, "kv_lora_rank")? {
        let rope = get_u64(m, "qk_rope_head_dim")?.unwrap_or(0);
        let head = rank.checked_add(rope).filter(|&h| h > 0).ok_or_else(|| {
            LayoutError::new(
                "kv_lora_rank",
                "kv_lora_rank + qk_rope_head_dim must be at least 1",
            )
        })?;
        let spec = LayerSpec::attention(LayerKind::Mla, block, 1, head, dtype);
        spec.validate()
            .map_err(|e| LayoutError::new("kv_lora_rank", e.to_string()))?;
        return Ok(ModelLayout {
            name: model_type,
            shape: LayoutShape::Layers(vec![spec; n]),
            max_model_len: max_len,
            max_num_batched_tokens: None,
            max_concurrent_batches: None,
        });
    }

    let heads = need_u64(m, "num_attention_heads")?;
    let kv_heads = get_u64(m, "num_key_value_heads")?.unwrap_or(heads);
    if kv_heads == 0 {
        return Err(LayoutError::new(
            "num_key_value_heads",
            "must be at least 1",
        ));
    }
    let head_dim = match get_u64(m, "head_dim")? {
        Some(0) => return Err(LayoutError::new("head_dim", "must be at least 1")),
        Some(h) => h,
        None => {
            let hidden = need_u64(m, "hidden_size")?;
            if hidden % heads != 0 {
                return Err(LayoutError::new(
                    "hidden_size",
                    "is not a multiple of num_attention_heads; give head_dim",
                ));
            }
            hidden / heads
        }
    };
    let window = get_u64(m, "sliding_window")?;
    let chunk = get_u64(m, "attention_chunk_size")?;

    let pattern: Vec<Attn> = if let Some(types) = m.get("layer_types") {
        let Value::Array(types) = types else {
            return Err(LayoutError::new(
                "layer_types",
                "must be an array of strings",
            ));
        };
        if types.len() != n {
            return Err(LayoutError::new(
                "layer_types",
                format!("has {} entries for {n} layers", types.len()),
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("full_attention" | "attention") => Ok(Attn::Full),
                Some("sliding_attention") => Ok(Attn::Sliding),
                Some("chunked_attention") => Ok(Attn::Chunked),
                Some(other) => Err(LayoutError::new(
                    format!("layer_types[{i}]"),
                    format!("unsupported layer type \"{other}\""),
                )),
                None => Err(LayoutError::new(
                    format!("layer_types[{i}]"),
                    "must be a string",
                )),
            })
            .collect::<Result<_, _>>()?
    } else if inner_type == "gemma2" {
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    Attn::Sliding
                } else {
                    Attn::Full
                }
            })
            .collect()
    } else if inner_type.starts_with("gemma3") {
        let p = get_u64(m, "sliding_window_pattern")?.unwrap_or(6);
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| LayoutError::new("sliding_window_pattern", "must be at least 1"))?;
        (0..n)
            .map(|i| {
                if (i + 1) % p == 0 {
                    Attn::Full
                } else {
                    Attn::Sliding
                }
            })
            .collect()
    } else if let Some(use_sw) = m.get("use_sliding_window") {
        if use_sw.as_bool() == Some(true) {
            let from = get_u64(m, "max_window_layers")?.unwrap_or(0);
            (0..n)
                .map(|i| {
                    if u64::try_from(i).is_ok_and(|i| i >= from) {
                        Attn::Sliding
                    } else {
                        Attn::Full
                    }
                })
                .collect()
        } else {
            vec![Attn::Full; n]
        }
    } else if window.is_some() {
        vec![Attn::Sliding; n]
    } else {
        vec![Attn::Full; n]
    };

    let mut layers = Vec::with_capacity(n);
    for a in pattern {
        let kind = match a {
            Attn::Full => LayerKind::Full,
            Attn::Sliding => LayerKind::SlidingWindow {
                window: window.filter(|&w| w > 0).ok_or_else(|| {
                    LayoutError::new(
                        "sliding_window",
                        "a sliding layer needs a window of at least 1",
                    )
                })?,
                extra_retained_tokens: 0,
            },
            Attn::Chunked => LayerKind::ChunkedLocal {
                chunk: chunk.filter(|&c| c > 0).ok_or_else(|| {
                    LayoutError::new(
                        "attention_chunk_size",
                        "a chunked layer needs a chunk of at least 1",
                    )
                })?,
            },
        };
        let spec = LayerSpec::attention(kind, block, kv_heads, head_dim, dtype);
        spec.validate()
            .map_err(|e| LayoutError::new("num_key_value_heads", e.to_string()))?;
        layers.push(spec);
    }
    Ok(ModelLayout {
        name: if inner_type.is_empty() {
            "config.json".to_owned()
        } else {
            inner_type
        },
        shape: LayoutShape::Layers(layers),
        max_model_len: max_len,
        max_num_batched_tokens: None,
        max_concurrent_batches: None,
    })
}
