//! [`TierEvents`]: the manager's drained events as the stream's events, shaped as vLLM's
//! offloading connector shapes the events of its CPU tier when it has no request metadata
//! for them (its placeholder payload): one `BlockStored` per stored key (its one hash, no
//! parent, no tokens), one `BlockRemoved` per group of an eviction, and nothing for a failed
//! store's metadata-only removal (no subscriber was told of that store).

use kvtier_core::BlockKey;
use kvtier_core::manager::{EventKind, OffloadEvent};

use super::event::{BlockRemoved, BlockStored, HashForm, KvEvent, MEDIUM_CPU};

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
                s.group_idx = Some(i64::from(k.group));
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
                                    group_idx: Some(i64::from(k.group)),
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
}
