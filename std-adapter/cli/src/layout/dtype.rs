//! Dtype names, and the KV-cache dtype vLLM 0.33.0 picks when both `--dtype` and
//! `--kv-cache-dtype` are `auto` (its defaults).
//!
//! vLLM resolves `dtype = "auto"` from the config's dtype (`_resolve_auto_dtype` in
//! `vllm/config/model.py`): the platform's supported dtypes in order — bfloat16, float16,
//! float32 on a CUDA GPU of compute capability 8.0 or newer — less float16 for the model
//! types that forbid it (gemma2, gemma3, gemma3_text, glm4); a float32 config is downcast to
//! the first of them; a dtype that is then supported is kept; anything else falls back to the
//! first. `kv_cache_dtype = "auto"` then takes the model dtype
//! (`kv_cache_dtype_str_to_dtype` in `vllm/utils/torch_utils.py`). A config without a dtype
//! counts as float32. On such a GPU every config dtype therefore gives a 2-byte cache: float32
//! (Gemma-2's released configs) becomes bfloat16, not a 4-byte cache.

/// Bytes per element of a dtype name (`float32`/`fp32` 4, `bfloat16`/`float16`/`half` 2,
/// `fp8*`/`int8`/`uint8` 1), or `None` when unknown.
#[must_use]
pub fn dtype_bytes(name: &str) -> Option<u64> {
    let n = normalized(name);
    match n.as_str() {
        "float32" | "fp32" | "float" => Some(4),
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => Some(2),
        "int8" | "uint8" => Some(1),
        _ if n.starts_with("fp8") || n.starts_with("float8") => Some(1),
        _ => None,
    }
}

fn normalized(name: &str) -> String {
    name.trim()
        .trim_start_matches("torch.")
        .to_ascii_lowercase()
}

/// The model dtypes the resolution distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelDtype {
    Float32,
    Float16,
    BFloat16,
    /// Any other dtype torch names (float64, int8, float8 variants, ...).
    Other,
}

impl ModelDtype {
    fn parse(name: &str) -> Option<Self> {
        let n = normalized(name);
        Some(match n.as_str() {
            "float32" | "float" | "fp32" => Self::Float32,
            "float16" | "half" | "fp16" => Self::Float16,
            "bfloat16" | "bf16" => Self::BFloat16,
            "float64" | "double" => Self::Other,
            _ if dtype_bytes(&n).is_some() => Self::Other,
            _ => return None,
        })
    }
}

/// Model types for which vLLM 0.33.0 refuses float16 (`_FLOAT16_NOT_SUPPORTED_MODELS`).
const NO_FLOAT16: &[&str] = &["gemma2", "gemma3", "gemma3_text", "glm4"];

/// A config dtype name that torch does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownDtype {
    /// The name the config gives.
    pub name: String,
}

impl core::fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown dtype \"{}\"", self.name)
    }
}

impl core::error::Error for UnknownDtype {}

/// The KV-cache dtype vLLM 0.33.0 uses with `--dtype auto --kv-cache-dtype auto` on a CUDA GPU
/// of compute capability 8.0 or newer (`"bfloat16"` or `"float16"`), for a config whose
/// `model_type` (the top-level one) and dtype name (`None` when the config gives none) are
/// these. See the module docs; [`dtype_bytes`] gives its size.
///
/// ```
/// use kvtier_cli::layout::auto_kv_dtype;
/// assert_eq!(auto_kv_dtype("gemma2", Some("float32")), Ok("bfloat16")); // downcast
/// assert_eq!(auto_kv_dtype("llama", Some("float16")), Ok("float16"));
/// assert_eq!(auto_kv_dtype("gemma2", Some("float16")), Ok("bfloat16")); // float16 refused
/// assert!(auto_kv_dtype("llama", Some("float31")).is_err());
/// ```
///
/// # Errors
/// [`UnknownDtype`] naming a dtype that torch does not know.
pub fn auto_kv_dtype(
    model_type: &str,
    config_dtype: Option<&str>,
) -> Result<&'static str, UnknownDtype> {
    let config = match config_dtype {
        None => ModelDtype::Float32,
        Some(name) => ModelDtype::parse(name).ok_or_else(|| UnknownDtype {
            name: name.to_owned(),
        })?,
    };
    // float32 is downcast to the preferred bfloat16; bfloat16 is kept; float16 is kept unless
    // the model type forbids it; anything else falls back to bfloat16.
    Ok(match config {
        ModelDtype::Float16 if !NO_FLOAT16.contains(&model_type) => "float16",
        ModelDtype::Float32 | ModelDtype::BFloat16 | ModelDtype::Float16 | ModelDtype::Other => {
            "bfloat16"
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_resolution_follows_vllm() {
        // float32 configs (and configs without a dtype) are downcast to bfloat16.
        assert_eq!(auto_kv_dtype("gemma2", Some("float32")), Ok("bfloat16"));
        assert_eq!(
            auto_kv_dtype("llama", Some("torch.float32")),
            Ok("bfloat16")
        );
        assert_eq!(auto_kv_dtype("llama", None), Ok("bfloat16"));
        // float16 is kept, except for the models that forbid it.
        assert_eq!(auto_kv_dtype("llama", Some("float16")), Ok("float16"));
        for t in ["gemma2", "gemma3", "gemma3_text", "glm4"] {
            assert_eq!(auto_kv_dtype(t, Some("half")), Ok("bfloat16"), "{t}");
        }
        assert_eq!(auto_kv_dtype("qwen3", Some("bfloat16")), Ok("bfloat16"));
        // Unsupported dtypes fall back to bfloat16.
        assert_eq!(auto_kv_dtype("llama", Some("float64")), Ok("bfloat16"));
        assert_eq!(auto_kv_dtype("llama", Some("int8")), Ok("bfloat16"));
        let e = auto_kv_dtype("llama", Some("float31")).unwrap_err();
        assert_eq!(e.name, "float31");
        assert_eq!(e.to_string(), "unknown dtype \"float31\"");
        assert_eq!(dtype_bytes("bfloat16"), Some(2));
        assert_eq!(dtype_bytes("float16"), Some(2));
    }
}
