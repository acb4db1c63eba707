//! Hugging Face `config.json`: the shape facts that define a model's KV cache.
//!
//! Read: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads` (default: the
//! attention heads), `head_dim` (default `hidden_size / num_attention_heads`), `torch_dtype` /
//! `dtype`, `max_position_embeddings`, and the attention pattern:
//! * Llama 4 (`llama4`, `llama4_text`): layers whose `no_rope_layers` entry is 0 (NoPE layers;
//!   by default every `no_rope_layer_interval`-th, 4) are full attention, the others chunked
//!   local attention over `attention_chunk_size` (default 8192; null or 0: full attention);
//! * `layer_types` (`full_attention`, `sliding_attention`, `chunked_attention`) when present;
//! * Gemma 2 (`model_type` `gemma2`): even layers slide over `sliding_window`;
//! * Gemma 3 (`gemma3`, `gemma3_text`; a nested `text_config` is read): every
//!   `sliding_window_pattern`-th layer (default 6) is full, the others slide;
//! * Qwen2/Qwen3 with `use_sliding_window: true` (a JSON bool): layers from
//!   `max_window_layers` on slide; `use_sliding_window: false` ignores `sliding_window`;
//! * any other config with a numeric `sliding_window`: every layer slides (Mistral v0.1);
//! * `sliding_window: 0` means no sliding window, as in vLLM;
//! * DeepSeek-style MLA (`kv_lora_rank` present): one latent head of
//!   `kv_lora_rank + qk_rope_head_dim`, `head_size_v = 0`.
//!
//! The cache dtype is what vLLM 0.33.0 picks with its `auto` defaults (see
//! [`auto_kv_dtype`]: a float32 config gives a bfloat16 cache), unless
//! `--dtype` says otherwise.
//!
//! Refused with an error naming the field and the model type: models with Mamba /
//! linear-attention state layers (Jamba, Qwen3-Next, Mamba, Nemotron-H, ...), and an
//! `attention_chunk_size` on a model type whose chunked layers kvtier does not know (give
//! `layer_types`).

use kvtier_core::capacity::{LayerKind, LayerSpec, MAX_LAYERS};
use serde_json::{Map, Value};

use super::state_layers::{refuse_state_layer_type, refuse_state_layers};
use super::{LayoutError, LayoutShape, ModelLayout, UnknownDtype, auto_kv_dtype, dtype_bytes};

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Attn {
    Full,
    Sliding,
    Chunked,
}

/// transformers' default `attention_chunk_size` for Llama 4.
const LLAMA4_DEFAULT_CHUNK: u64 = 8192;

/// The config's dtype (`torch_dtype` or `dtype`, the top level first, then `text_config`), as
/// vLLM 0.33.0's `auto` defaults turn it into a KV-cache dtype.
fn config_kv_dtype_bytes(
    root: &Map<String, Value>,
    m: &Map<String, Value>,
    model_type: &str,
) -> Result<u64, LayoutError> {
    let mut found = None;
    'search: for config in [root, m] {
        for key in ["torch_dtype", "dtype"] {
            match config.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    found = Some((key, s.as_str()));
                    break 'search;
                }
                Some(_) => return Err(LayoutError::new(key, "must be a string")),
            }
        }
    }
    let key = found.map_or("torch_dtype", |(k, _)| k);
    let name = auto_kv_dtype(model_type, found.map(|(_, s)| s))
        .map_err(|e| LayoutError::new(key, e.to_string()))?;
    dtype_bytes(name).ok_or_else(|| {
        LayoutError::new(
            key,
            UnknownDtype {
                name: name.to_owned(),
            }
            .to_string(),
        )
    })
}

/// Llama 4's layers: NoPE layers (`no_rope_layers[i] == 0`) are full attention, the others
/// chunked local attention when a chunk is set (vLLM's `Llama4Attention`).
fn llama4_pattern(
    m: &Map<String, Value>,
    n: usize,
    chunk: Option<u64>,
) -> Result<Vec<Attn>, LayoutError> {
    let rope: Vec<bool> = match m.get("no_rope_layers") {
        Some(Value::Array(list)) if !list.is_empty() => {
            if list.len() != n {
                return Err(LayoutError::new(
                    "no_rope_layers",
                    format!("has {} entries for {n} layers", list.len()),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v.as_u64() {
                    Some(0) => Ok(false),
                    Some(1) => Ok(true),
                    _ => Err(LayoutError::new(
                        format!("no_rope_layers[{i}]"),
                        "must be 0 (NoPE layer) or 1 (RoPE layer)",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        // transformers fills an absent or empty list from the interval.
        None | Some(Value::Null) | Some(Value::Array(_)) => {
            let every = get_u64(m, "no_rope_layer_interval")?.unwrap_or(4);
            let every = usize::try_from(every)
                .ok()
                .filter(|&e| e > 0)
                .ok_or_else(|| LayoutError::new("no_rope_layer_interval", "must be at least 1"))?;
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
        Some(_) => {
            return Err(LayoutError::new(
                "no_rope_layers",
                "must be an array of 0 and 1",
            ));
        }
    };
    let chunked = chunk.is_some_and(|c| c > 0);
    Ok(rope
        .into_iter()
        .map(|r| {
            if r && chunked {
                Attn::Chunked
            } else {
                Attn::Full
            }
        })
        .collect())
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
    refuse_state_layers(&root, m, &inner_type, &model_type)?;
    let dtype = match opts.dtype_bytes {
        Some(b) => b,
        None => config_kv_dtype_bytes(&root, m, &model_type)?,
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
    // vLLM reads `sliding_window: 0` as "no sliding window".
    let raw_window = get_u64(m, "sliding_window")?;
    let window = raw_window.filter(|&w| w > 0);
    let llama4 = matches!(inner_type.as_str(), "llama4" | "llama4_text");
    let chunk = match m.get("attention_chunk_size") {
        // transformers' Llama 4 config defaults the chunk to 8192.
        None if llama4 => Some(LLAMA4_DEFAULT_CHUNK),
        _ => get_u64(m, "attention_chunk_size")?,
    };

    let mut pattern: Vec<Attn> = if llama4 {
        llama4_pattern(m, n, chunk)?
    } else if let Some(types) = m.get("layer_types") {
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
                Some(other) => {
                    refuse_state_layer_type(i, other, &inner_type)?;
                    Err(LayoutError::new(
                        format!("layer_types[{i}]"),
                        format!(
                            "unsupported layer type \"{other}\" (model type \"{inner_type}\"; \
                             known: full_attention, sliding_attention, chunked_attention)"
                        ),
                    ))
                }
                None => Err(LayoutError::new(
                    format!("layer_types[{i}]"),
                    "must be a string",
                )),
            })
            .collect::<Result<_, _>>()?
    } else if chunk.is_some() {
        return Err(LayoutError::new(
            "attention_chunk_size",
            format!(
                "which layers use chunked local attention is not known for model type \
                 \"{inner_type}\"; give layer_types (chunked_attention / full_attention)"
            ),
        ));
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
        let on = match use_sw {
            Value::Bool(b) => *b,
            Value::Null => false,
            other => {
                return Err(LayoutError::new(
                    "use_sliding_window",
                    format!("must be true or false (a JSON bool), not {other}"),
                ));
            }
        };
        if on {
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
    // A sliding layer without a window (`sliding_window: 0`) attends to everything.
    if raw_window == Some(0) {
        for a in &mut pattern {
            if *a == Attn::Sliding {
                *a = Attn::Full;
            }
        }
    }

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
