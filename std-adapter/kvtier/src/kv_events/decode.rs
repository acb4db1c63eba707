//! [`decode()`]: the msgpack bytes of a vLLM `KVEventBatch` back into an [`EventBatch`], as
//! msgspec's decoder reads them: map keys in any order, unknown keys ignored, a missing
//! required field or a wrong type an error, nothing after the batch.
//!
//! The bytes are read by `rmpv` with a nesting limit ([`MAX_DEPTH`]) and its bounded
//! preallocation, so a hostile payload costs at most memory proportional to its own length.

use std::fmt;

use rmpv::Value;

use super::event::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};

/// The deepest nesting read (a batch, its events, their lists and `extra_keys`' tuples).
pub const MAX_DEPTH: usize = 16;

/// Why a payload is not a `KVEventBatch`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not msgpack, cut short, or nested deeper than [`MAX_DEPTH`].
    Msgpack(String),
    /// Bytes follow the batch.
    Trailing(usize),
    /// The batch is not an array of 2 or 3 items.
    Batch,
    /// An event is not a map with a known `type`.
    Event(usize),
    /// A field of event `event` (`None`: of the batch) is missing or of the wrong type.
    Field {
        /// The event's index in the batch.
        event: Option<usize>,
        /// The field.
        field: &'static str,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Msgpack(e) => write!(f, "not a msgpack value: {e}"),
            DecodeError::Trailing(n) => write!(f, "{n} bytes after the batch"),
            DecodeError::Batch => f.write_str("a KVEventBatch is an array [ts, events, rank]"),
            DecodeError::Event(i) => {
                write!(
                    f,
                    "event {i} is not a map tagged BlockStored, BlockRemoved or AllBlocksCleared"
                )
            }
            DecodeError::Field {
                event: Some(i),
                field,
            } => {
                write!(f, "event {i}: `{field}` is missing or of the wrong type")
            }
            DecodeError::Field { event: None, field } => {
                write!(f, "the batch's `{field}` is of the wrong type")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one payload (the third frame of a KV-events message).
///
/// # Errors
/// [`DecodeError`] when `bytes` is not exactly one `KVEventBatch`.
pub fn decode(bytes: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut rd = bytes;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::Trailing(rd.len()));
    }
    let Value::Array(items) = value else {
        return Err(DecodeError::Batch);
    };
    if !(2..=3).contains(&items.len()) {
        return Err(DecodeError::Batch);
    }
    let batch_field = |field| DecodeError::Field { event: None, field };
    let ts = number(&items[0]).ok_or(batch_field("ts"))?;
    let Value::Array(raw) = &items[1] else {
        return Err(batch_field("events"));
    };
    let events = raw
        .iter()
        .enumerate()
        .map(|(i, v)| event(i, v))
        .collect::<Result<Vec<_>, _>>()?;
    let data_parallel_rank = match items.get(2) {
        None | Some(Value::Nil) => None,
        Some(v) => Some(v.as_i64().ok_or(batch_field("data_parallel_rank"))?),
    };
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank,
    })
}

/// The fields of one event's map, looked up by name.
struct Fields<'a> {
    index: usize,
    map: &'a [(Value, Value)],
}

impl<'a> Fields<'a> {
    fn err(&self, field: &'static str) -> DecodeError {
        DecodeError::Field {
            event: Some(self.index),
            field,
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// A required field (present, possibly nil).
    fn required(&self, key: &'static str) -> Result<&'a Value, DecodeError> {
        self.get(key).ok_or(self.err(key))
    }

    /// An optional field: absent or nil is `None`.
    fn optional(&self, key: &'static str) -> Option<&'a Value> {
        self.get(key).filter(|v| !v.is_nil())
    }

    fn hashes(&self, key: &'static str) -> Result<Vec<BlockHash>, DecodeError> {
        let Value::Array(vs) = self.required(key)? else {
            return Err(self.err(key));
        };
        vs.iter().map(|v| hash(v).ok_or(self.err(key))).collect()
    }

    fn opt_str(&self, key: &'static str, required: bool) -> Result<Option<String>, DecodeError> {
        let v = if required {
            Some(self.required(key)?).filter(|v| !v.is_nil())
        } else {
            self.optional(key)
        };
        v.map(|v| v.as_str().map(str::to_owned).ok_or(self.err(key)))
            .transpose()
    }

    fn opt_int(&self, key: &'static str, required: bool) -> Result<Option<i64>, DecodeError> {
        let v = if required {
            Some(self.required(key)?).filter(|v| !v.is_nil())
        } else {
            self.optional(key)
        };
        v.map(|v| v.as_i64().ok_or(self.err(key))).transpose()
    }

    fn uints(&self, v: &Value, key: &'static str) -> Result<Vec<u64>, DecodeError> {
        let Value::Array(vs) = v else {
            return Err(self.err(key));
        };
        vs.iter().map(|v| v.as_u64().ok_or(self.err(key))).collect()
    }
}

/// A float field as msgspec reads one: a float, or an integer.
fn number(v: &Value) -> Option<f64> {
    #[expect(
        clippy::cast_precision_loss,
        reason = "msgspec reads an integer as a float too"
    )]
    v.as_f64()
        .or_else(|| v.as_i64().map(|i| i as f64))
        .or_else(|| v.as_u64().map(|u| u as f64))
}

fn hash(v: &Value) -> Option<BlockHash> {
    match v {
        Value::Binary(b) => Some(BlockHash::Bytes(b.clone())),
        v => v.as_u64().map(BlockHash::Int),
    }
}

fn event(index: usize, v: &Value) -> Result<KvEvent, DecodeError> {
    let Value::Map(map) = v else {
        return Err(DecodeError::Event(index));
    };
    let f = Fields { index, map };
    match f.get("type").and_then(Value::as_str) {
        Some("BlockStored") => stored(&f).map(|s| KvEvent::Stored(Box::new(s))),
        Some("BlockRemoved") => removed(&f).map(KvEvent::Removed),
        Some("AllBlocksCleared") => Ok(KvEvent::AllCleared),
        _ => Err(DecodeError::Event(index)),
    }
}

fn stored(f: &Fields<'_>) -> Result<BlockStored, DecodeError> {
    let parent_block_hash = match f.required("parent_block_hash")? {
        Value::Nil => None,
        v => Some(hash(v).ok_or(f.err("parent_block_hash"))?),
    };
    let lookahead_token_ids = match f.optional("lookahead_token_ids") {
        None => None,
        Some(Value::Array(ls)) => Some(
            ls.iter()
                .map(|l| f.uints(l, "lookahead_token_ids"))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(f.err("lookahead_token_ids")),
    };
    Ok(BlockStored {
        block_hashes: f.hashes("block_hashes")?,
        parent_block_hash,
        token_ids: f.uints(f.required("token_ids")?, "token_ids")?,
        block_size: f
            .required("block_size")?
            .as_u64()
            .ok_or(f.err("block_size"))?,
        lora_id: f.opt_int("lora_id", true)?,
        medium: f.opt_str("medium", true)?,
        lora_name: f.opt_str("lora_name", true)?,
        extra_keys: f.optional("extra_keys").cloned(),
        group_idx: f.opt_int("group_idx", false)?,
        kv_cache_spec_kind: f.opt_str("kv_cache_spec_kind", false)?,
        kv_cache_spec_sliding_window: f.opt_int("kv_cache_spec_sliding_window", false)?,
        locality: f.opt_str("locality", false)?,
        ownership: f.opt_str("ownership", false)?,
        session_id: f.opt_str("session_id", false)?,
        lookahead_token_ids,
    })
}

fn removed(f: &Fields<'_>) -> Result<BlockRemoved, DecodeError> {
    Ok(BlockRemoved {
        block_hashes: f.hashes("block_hashes")?,
        medium: f.opt_str("medium", true)?,
        group_idx: f.opt_int("group_idx", false)?,
        locality: f.opt_str("locality", false)?,
        ownership: f.opt_str("ownership", false)?,
    })
}
