//! The model a command sizes: [`ModelArgs`] (a preset, a layout file or a config.json, and the
//! cache dtype) and its resolution into a [`ModelLayout`], with [`parse_dtype`] for `--dtype`.

use std::fmt;
use std::io::Read as _;

use kvtier_core::capacity::{PoolLayout, promote_local_layers};

use super::{ReportError, opt};
use crate::layout::{
    HfOptions, LayoutShape, MAX_LAYOUT_FILE_BYTES, ModelLayout, dtype_bytes, parse_hf_config,
    parse_layout_json, preset,
};

/// The model's KV layout, as every command takes it (`capacity`; `replay` and `serve` for the
/// transfer model; `sweep` for CPU memory): one of a preset, a layout file or a config.json,
/// and the cache dtype.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelArgs {
    /// A built-in model preset (llama-3-8b, llama-3.1-8b, llama-3.1-70b, mistral-7b-v0.1,
    /// qwen2.5-7b, qwen3-8b, gemma-2-9b, gemma-3-27b, deepseek-v3).
    #[arg(long, value_name = "NAME", value_parser = boxed_str)]
    pub model: Option<Box<str>>,
    /// The model as a JSON layout file.
    #[arg(long, value_name = "FILE.json", value_parser = boxed_str)]
    pub layout: Option<Box<str>>,
    /// The model as a Hugging Face config.json.
    #[arg(long, value_name = "FILE", value_parser = boxed_str)]
    pub hf_config: Option<Box<str>>,
    /// KV-cache dtype for presets and config.json (fp32, bf16, fp16, fp8).
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<u64>,
}

impl ModelArgs {
    /// Whether a model was given at all.
    #[must_use]
    pub fn is_given(&self) -> bool {
        self.model.is_some() || self.layout.is_some() || self.hf_config.is_some()
    }

    /// Bytes of one KV block of the whole model (every layer, `pool`'s alignment), with
    /// `block_size` tokens per block for presets and `config.json`. Memory, lengths and the CPU
    /// tier are not needed.
    ///
    /// # Errors
    /// [`ReportError`] naming the option or field at fault.
    pub fn bytes_per_block(&self, block_size: u32, pool: PoolLayout) -> Result<u64, ReportError> {
        Ok(self
            .layout(block_size, false)?
            .0
            .grouped()?
            .bytes_per_block(pool)?)
    }

    /// The layout `--model`, `--layout` or `--hf-config` give (`block_size` and `--dtype` for
    /// presets and `config.json`, local layers promoted when `disable_hybrid` is set, as
    /// vLLM's `--disable-hybrid-kv-cache-manager`), and where it came from.
    pub(super) fn layout(
        &self,
        block_size: u32,
        disable_hybrid: bool,
    ) -> Result<(ModelLayout, Source<'_>), ReportError> {
        if block_size == 0 {
            return Err(opt("--block-size", "must be at least 1"));
        }
        let hf = HfOptions {
            block_size: u64::from(block_size),
            dtype_bytes: self.dtype,
        };
        let (mut model, source) = self.load(&hf)?;
        if disable_hybrid {
            match &mut model.shape {
                LayoutShape::Layers(layers) => promote_local_layers(layers)
                    .map_err(|e| opt("--disable-hybrid-kv-cache-manager", e.to_string()))?,
                LayoutShape::Groups(_) => {
                    return Err(opt(
                        "--disable-hybrid-kv-cache-manager",
                        "does not apply to a layout file's explicit groups (give layers)",
                    ));
                }
            }
        }
        Ok((model, source))
    }

    /// The layout as given, without `--disable-hybrid-kv-cache-manager`.
    fn load(&self, hf: &HfOptions) -> Result<(ModelLayout, Source<'_>), ReportError> {
        match (
            self.model.as_deref(),
            self.layout.as_deref(),
            self.hf_config.as_deref(),
        ) {
            (Some(name), None, None) => Ok((preset(name, hf)?, Source::Preset)),
            (None, Some(path), None) => {
                let mut l = parse_layout_json(&read_capped("--layout", path)?)
                    .map_err(|e| e.in_file(path))?;
                path.clone_into(&mut l.name);
                Ok((l, Source::File(path)))
            }
            (None, None, Some(path)) => Ok((
                parse_hf_config(&read_capped("--hf-config", path)?, hf)
                    .map_err(|e| e.in_file(path))?,
                Source::File(path),
            )),
            (None, None, None) => Err(opt(
                "--model",
                "give one of --model, --layout or --hf-config",
            )),
            _ => Err(opt(
                "--model",
                "give only one of --model, --layout and --hf-config",
            )),
        }
    }
}

#[expect(
    clippy::unnecessary_wraps,
    reason = "clap value parsers return a Result"
)]
fn boxed_str(s: &str) -> Result<Box<str>, std::convert::Infallible> {
    Ok(s.into())
}

/// A KV-cache dtype name that is none of the known ones (`--dtype`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DtypeError {
    /// The name given.
    pub name: String,
}

impl fmt::Display for DtypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown dtype \"{}\" (fp32, bf16, fp16, fp8)", self.name)
    }
}

impl std::error::Error for DtypeError {}

/// Parses a KV-cache dtype name into bytes per element.
///
/// ```
/// assert_eq!(kvtier_cli::sizing::parse_dtype("bf16"), Ok(2));
/// assert_eq!(
///     kvtier_cli::sizing::parse_dtype("fp7").unwrap_err().to_string(),
///     "unknown dtype \"fp7\" (fp32, bf16, fp16, fp8)"
/// );
/// ```
///
/// # Errors
/// [`DtypeError`], whose message lists the known names.
pub fn parse_dtype(s: &str) -> Result<u64, DtypeError> {
    dtype_bytes(s).ok_or_else(|| DtypeError { name: s.to_owned() })
}

/// Reads a `--layout` / `--hf-config` file of at most [`MAX_LAYOUT_FILE_BYTES`].
fn read_capped(option: &'static str, path: &str) -> Result<String, ReportError> {
    let io = |error| ReportError::Io {
        path: path.to_owned(),
        error,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_LAYOUT_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(io)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > MAX_LAYOUT_FILE_BYTES) {
        return Err(ReportError::TooLarge {
            option,
            path: path.to_owned(),
            limit: MAX_LAYOUT_FILE_BYTES,
        });
    }
    String::from_utf8(bytes)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Where the layout came from, for messages about its fields.
pub(super) enum Source<'a> {
    Preset,
    File(&'a str),
}

impl Source<'_> {
    /// `FILE: field`, or the option when the value is not from a file.
    pub(super) fn field(&self, field: &str, option: &str) -> String {
        match self {
            Self::Preset => option.to_owned(),
            Self::File(path) => format!("{path}: {field}"),
        }
    }
}
