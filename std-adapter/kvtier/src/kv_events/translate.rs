//! [`TierEvents`]: the manager's drained events as the stream's events, shaped as vLLM's
//! offloading connector shapes the events of its CPU tier when it has no request metadata
//! for them (its placeholder payload): one `BlockStored` per stored key (its one hash, no
//! parent, no tokens), one `BlockRemoved` per group of an eviction, and nothing for a failed
//! store's metadata-only removal (no subscriber was told of that store).
//!
//! [`TierEvents::push_simple`] does the same for the simple offloader's events
//! ([`SimpleEvent`]), shaped as vLLM's `SimpleCPUOffloadScheduler.take_events` gives them.

use kvtier_core::BlockKey;
use kvtier_core::manager::{EventKind, OffloadEvent};
use kvtier_core::simple::{GroupKind, Layout, Medium, SimpleEvent};

use super::event::{BlockRemoved, BlockStored, HashForm, Int, KvEvent, MEDIUM_CPU, MEDIUM_STORAGE};

/// vLLM's `KVCacheSpecKind.FULL_ATTENTION`, the kind of the simple offloader's attention
/// group.
pub const FULL_ATTENTION: &str = "full_attention";

/// vLLM's `KVCacheSpecKind.MAMBA`, the kind of a hybrid model's Mamba group.
pub const MAMBA: &str = "mamba";

/// vLLM's `KVCacheSpecKind.SLIDING_WINDOW`.
pub const SLIDING_WINDOW: &str = "sliding_window";

/// vLLM's `KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION`.
pub const CHUNKED_LOCAL_ATTENTION: &str = "chunked_local_attention";

/// vLLM's `KVCacheSpecKind.UNKNOWN`.
pub const UNKNOWN: &str = "unknown";

/// A group kind's `kv_cache_spec_kind` and `kv_cache_spec_sliding_window`, as vLLM names them.
#[must_use]
pub fn spec_kind(kind: GroupKind) -> (&'static str, Option<i64>) {
    match kind {
        GroupKind::FullAttention => (FULL_ATTENTION, None),
        GroupKind::SlidingWindow { window } => (SLIDING_WINDOW, Some(i64::from(window))),
        GroupKind::ChunkedLocal { .. } => (CHUNKED_LOCAL_ATTENTION, None),
        GroupKind::Mamba => (MAMBA, None),
        GroupKind::Scratch => (UNKNOWN, None),
    }
}

/// The `locality` of every simple-offloader event.
pub const LOCAL: &str = "LOCAL";

/// How one tier's events are told: its block size, hash form and medium.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierEvents {
    /// Tokens per block (the trace's).
    pub block_size: u64,
    /// How hashes are sent.
    pub hash_form: HashForm,
    /// The tier's medium ([`MEDIUM_CPU`] by default).
    pub medium: String,
}

impl TierEvents {
    /// The CPU tier's events with `block_size` tokens a block.
    #[must_use]
    pub fn cpu(block_size: u64, hash_form: HashForm) -> Self {
        TierEvents {
            block_size,
            hash_form,
            medium: MEDIUM_CPU.to_owned(),
        }
    }

    /// Appends the stream's events for one drained manager event to `out`.
    pub fn push(&self, event: OffloadEvent<'_, BlockKey>, out: &mut Vec<KvEvent>) {
        match event.kind {
            EventKind::Stored => out.extend(event.keys.iter().map(|k| {
                let mut s = BlockStored::new(
                    vec![self.hash_form.hash(k.hash)],
                    self.block_size,
                    Some(self.medium.clone()),
                );
                s.group_idx = Some(Int::from(k.group));
                KvEvent::Stored(Box::new(s))
            })),
            EventKind::Removed => {
                // One removal per group, groups in the order they first appear.
                let mut groups: Vec<(u32, BlockRemoved)> = Vec::new();
                for k in event.keys {
                    let i = match groups.iter().position(|(g, _)| *g == k.group) {
                        Some(i) => i,
                        None => {
                            groups.push((
                                k.group,
                                BlockRemoved {
                                    block_hashes: Vec::new(),
                                    medium: Some(self.medium.clone()),
                                    group_idx: Some(Int::from(k.group)),
                                    locality: None,
                                    ownership: None,
                                },
                            ));
                            groups.len() - 1
                        }
                    };
                    groups[i].1.block_hashes.push(self.hash_form.hash(k.hash));
                }
                out.extend(groups.into_iter().map(|(_, r)| KvEvent::Removed(r)));
            }
            EventKind::RemovedMetadataOnly => {}
        }
    }

    /// Appends the stream's event for one of the simple offloader's events to `out`: a
    /// `BlockStored` of the one block (its key's group and that group's kind in `layout`, see
    /// [`spec_kind`]; `LOCAL`, the parent hash when the store knew it; no token ids,
    /// which a trace does not carry), a `BlockRemoved` of the one hash (its group, `LOCAL`),
    /// or `AllBlocksCleared`. The medium is the event's own (this tier's `medium` is not
    /// used).
    pub fn push_simple(&self, event: &SimpleEvent, layout: &Layout, out: &mut Vec<KvEvent>) {
        let medium = |m: Medium| {
            Some(match m {
                Medium::Cpu => MEDIUM_CPU.to_owned(),
                Medium::Storage => MEDIUM_STORAGE.to_owned(),
            })
        };
        out.push(match *event {
            SimpleEvent::Stored {
                key,
                block_size,
                meta,
                medium: m,
            } => {
                let mut s = BlockStored::new(
                    vec![self.hash_form.hash(key.hash)],
                    u64::from(block_size),
                    medium(m),
                );
                s.parent_block_hash = meta
                    .and_then(|m| m.parent_hash)
                    .map(|h| self.hash_form.hash(h));
                s.group_idx = Some(Int::from(key.group));
                let (kind, window) =
                    spec_kind(layout.kind(key.group).unwrap_or(GroupKind::Scratch));
                s.kv_cache_spec_kind = Some(kind.to_owned());
                s.kv_cache_spec_sliding_window = window.map(Int::from);
                s.locality = Some(LOCAL.to_owned());
                KvEvent::Stored(Box::new(s))
            }
            SimpleEvent::Removed { key, medium: m } => KvEvent::Removed(BlockRemoved {
                block_hashes: vec![self.hash_form.hash(key.hash)],
                medium: medium(m),
                group_idx: Some(Int::from(key.group)),
                locality: Some(LOCAL.to_owned()),
                ownership: None,
            }),
            SimpleEvent::AllCleared => KvEvent::AllCleared,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_block_names_its_group_kind() {
        let form = TierEvents::cpu(16, HashForm::Int);
        let stored = |group| SimpleEvent::Stored {
            key: BlockKey::new(7, group),
            block_size: 16,
            meta: None,
            medium: Medium::Cpu,
        };
        let mut out = Vec::new();
        let hybrid = Layout::hybrid_mamba(true);
        let gemma = Layout::new(&[
            GroupKind::FullAttention,
            GroupKind::SlidingWindow { window: 512 },
            GroupKind::ChunkedLocal { chunk: 64 },
        ])
        .unwrap();
        form.push_simple(&stored(1), &hybrid, &mut out);
        form.push_simple(&stored(0), &hybrid, &mut out);
        form.push_simple(&stored(1), &Layout::dense(), &mut out);
        form.push_simple(&stored(1), &gemma, &mut out);
        form.push_simple(&stored(2), &gemma, &mut out);
        let kinds: Vec<(Option<Int>, Option<&str>, Option<Int>)> = out
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) => (
                    s.group_idx,
                    s.kv_cache_spec_kind.as_deref(),
                    s.kv_cache_spec_sliding_window,
                ),
                _ => (None, None, None),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (Some(1), Some(MAMBA), None),
                (Some(0), Some(FULL_ATTENTION), None),
                // A group the layout does not have.
                (Some(1), Some(UNKNOWN), None),
                (Some(1), Some(SLIDING_WINDOW), Some(512)),
                (Some(2), Some(CHUNKED_LOCAL_ATTENTION), None),
            ]
        );
    }
}
