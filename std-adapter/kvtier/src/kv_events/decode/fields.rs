//! The fields of the three event kinds, as they are read from an event's map.

use rmpv::Value;

use super::{BlockHash, BlockRemoved, BlockStored, DecodeError, Int, KvEvent};

/// The three event kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    Stored,
    Removed,
    AllCleared,
}

/// Every field and the kinds that have it.
pub(super) const FIELDS: [(&str, &[Tag]); 15] = [
    ("block_hashes", &[Tag::Stored, Tag::Removed]),
    ("parent_block_hash", &[Tag::Stored]),
    ("token_ids", &[Tag::Stored]),
    ("block_size", &[Tag::Stored]),
    ("lora_id", &[Tag::Stored]),
    ("medium", &[Tag::Stored, Tag::Removed]),
    ("lora_name", &[Tag::Stored]),
    ("extra_keys", &[Tag::Stored]),
    ("group_idx", &[Tag::Stored, Tag::Removed]),
    ("kv_cache_spec_kind", &[Tag::Stored]),
    ("kv_cache_spec_sliding_window", &[Tag::Stored]),
    ("locality", &[Tag::Stored, Tag::Removed]),
    ("ownership", &[Tag::Stored, Tag::Removed]),
    ("session_id", &[Tag::Stored]),
    ("lookahead_token_ids", &[Tag::Stored]),
];

/// The fields read so far; a required one is `Some` once seen (possibly `Some(None)`).
#[derive(Default)]
pub(super) struct EventFields {
    pub(super) block_hashes: Option<Vec<BlockHash>>,
    pub(super) parent_block_hash: Option<Option<BlockHash>>,
    pub(super) token_ids: Option<Vec<Int>>,
    pub(super) block_size: Option<Int>,
    pub(super) lora_id: Option<Option<Int>>,
    pub(super) medium: Option<Option<String>>,
    pub(super) lora_name: Option<Option<String>>,
    pub(super) extra_keys: Option<Value>,
    pub(super) group_idx: Option<Int>,
    pub(super) kv_cache_spec_kind: Option<String>,
    pub(super) kv_cache_spec_sliding_window: Option<Int>,
    pub(super) locality: Option<String>,
    pub(super) ownership: Option<String>,
    pub(super) session_id: Option<String>,
    pub(super) lookahead_token_ids: Option<Vec<Vec<Int>>>,
}

fn required<T>(v: Option<T>, event: usize, field: &'static str) -> Result<T, DecodeError> {
    v.ok_or(DecodeError::Missing { event, field })
}

impl EventFields {
    pub(super) fn finish(self, tag: Tag, i: usize) -> Result<KvEvent, DecodeError> {
        Ok(match tag {
            Tag::AllCleared => KvEvent::AllCleared,
            Tag::Removed => KvEvent::Removed(BlockRemoved {
                block_hashes: required(self.block_hashes, i, "block_hashes")?,
                medium: required(self.medium, i, "medium")?,
                group_idx: self.group_idx,
                locality: self.locality,
                ownership: self.ownership,
            }),
            Tag::Stored => KvEvent::Stored(Box::new(BlockStored {
                block_hashes: required(self.block_hashes, i, "block_hashes")?,
                parent_block_hash: required(self.parent_block_hash, i, "parent_block_hash")?,
                token_ids: required(self.token_ids, i, "token_ids")?,
                block_size: required(self.block_size, i, "block_size")?,
                lora_id: required(self.lora_id, i, "lora_id")?,
                medium: required(self.medium, i, "medium")?,
                lora_name: required(self.lora_name, i, "lora_name")?,
                extra_keys: self.extra_keys,
                group_idx: self.group_idx,
                kv_cache_spec_kind: self.kv_cache_spec_kind,
                kv_cache_spec_sliding_window: self.kv_cache_spec_sliding_window,
                locality: self.locality,
                ownership: self.ownership,
                session_id: self.session_id,
                lookahead_token_ids: self.lookahead_token_ids,
            })),
        })
    }
}
