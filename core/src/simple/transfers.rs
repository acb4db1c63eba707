//! Store transfers: each CPU block being written belongs to at most one transfer, so a
//! transfer is a list threaded through its CPU block ids (with each block's GPU source, the
//! request it counts for, and its event metadata). Issued store events live in a table with
//! room for one event per CPU block; queued finish-time flushes in a list.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use super::requests::NIL;
use crate::BlockKey;
use crate::hashing::FixedState;
use crate::reserve::{AllocError, filled, table, with_capacity};

/// What a `BlockStored` event of a positional store carries besides the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoredMeta {
    /// The request whose block table named the block (vLLM's payload reads this request's
    /// tokens, even when the GPU block has since been freed and hashed by another).
    pub req: u64,
    /// The request's previous block hash (`None` for its first block).
    pub parent_hash: Option<u64>,
    /// The first token of the block in the request (its token ids are
    /// `all_token_ids[token_start .. token_start + block_size]`).
    pub token_start: u64,
}

/// A transfer's CPU blocks: the first, the last and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) len: u32,
}

impl Chain {
    pub(super) const EMPTY: Chain = Chain {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// An issued store event.
#[derive(Clone, Copy, Debug)]
pub(super) struct Event {
    pub(super) idx: u64,
    pub(super) chain: Chain,
    /// Workers that reported it so far.
    pub(super) reported: u32,
    /// Abandoned by a reset: its completion only releases the pins.
    pub(super) abandoned: bool,
}

/// The transfer tables.
#[derive(Clone, Debug)]
pub(super) struct Transfers {
    hasher: FixedState,
    /// Per CPU block: the next block of its transfer.
    next: Vec<u32>,
    /// Per CPU block: the GPU block it copies.
    pub(super) gpu: Vec<u32>,
    /// Per CPU block: the request slot (and generation) this block counts its event for.
    pub(super) req: Vec<(u32, u32)>,
    /// Per CPU block: event metadata (only with events on).
    pub(super) meta: Vec<Option<StoredMeta>>,
    /// Per CPU block with metadata: the request's keys at each hash boundary of the block,
    /// `per` of them (padded with [`NO_KEY`]); empty unless events are on and a group's block
    /// spans several hash blocks.
    interior: Vec<BlockKey>,
    per: usize,
    events: HashTable<Event>,
    /// Queued finish-time flushes, oldest first.
    pub(super) flushes: Vec<Chain>,
    /// Blocks in issued, abandoned and queued transfers.
    pub(super) pending_blocks: u64,
    /// Issued events not abandoned.
    pub(super) live_events: u32,
    /// Abandoned events not yet completed.
    pub(super) abandoned_events: u32,
}

/// A key no block holds (group ids are below [`MAX_GROUPS`](super::MAX_GROUPS)).
pub(super) const NO_KEY: BlockKey = BlockKey::new(0, u32::MAX);

impl Transfers {
    /// Tables for `num_cpu_blocks` CPU blocks; with `with_meta`, room for event metadata and
    /// `per` boundary keys per block.
    pub(super) fn new(num_cpu_blocks: u32, with_meta: bool, per: u32) -> Result<Self, AllocError> {
        let n = num_cpu_blocks as usize;
        let per = if with_meta && per > 1 {
            per as usize
        } else {
            0
        };
        Ok(Transfers {
            hasher: FixedState::default(),
            next: filled(n, NIL)?,
            gpu: filled(n, NIL)?,
            req: filled(n, (NIL, 0))?,
            meta: filled(if with_meta { n } else { 0 }, None)?,
            interior: filled(n.saturating_mul(per), NO_KEY)?,
            per,
            // Twice the live maximum (one event per CPU block): at most half full, so
            // hashbrown clears tombstones in place instead of growing.
            events: table(n.saturating_mul(2))?,
            flushes: with_capacity(n)?,
            pending_blocks: 0,
            live_events: 0,
            abandoned_events: 0,
        })
    }

    /// Boundary keys kept per CPU block (0: none).
    pub(super) fn per(&self) -> usize {
        self.per
    }

    /// Records CPU block `c`'s event metadata and boundary keys (`keys` at most `per`).
    pub(super) fn set_meta(&mut self, c: u32, meta: Option<StoredMeta>, keys: &[BlockKey]) {
        if let Some(m) = self.meta.get_mut(c as usize) {
            *m = meta;
        }
        let at = (c as usize).saturating_mul(self.per);
        if let Some(slot) = self.interior.get_mut(at..at + self.per) {
            slot.fill(NO_KEY);
            for (d, &k) in slot.iter_mut().zip(keys) {
                *d = k;
            }
        }
    }

    /// The payload of a secondary hash `key` copied into CPU block `c`: the request's own
    /// hash block at that boundary (`hash` tokens), when `key` is one of the block's boundary
    /// keys (vLLM's `meta_by_hash`).
    pub(super) fn secondary_meta(&self, c: u32, key: BlockKey, hash: u64) -> Option<StoredMeta> {
        let m = self.meta.get(c as usize).copied().flatten()?;
        let at = (c as usize).saturating_mul(self.per);
        let keys = self.interior.get(at..at + self.per)?;
        let j = keys.iter().position(|&k| k == key)?;
        Some(StoredMeta {
            req: m.req,
            parent_hash: match j {
                0 => m.parent_hash,
                _ => Some(keys[j - 1].hash),
            },
            token_start: m.token_start + j as u64 * hash,
        })
    }

    /// Threads `pairs` (GPU source, CPU block) into a chain, recording each GPU source.
    pub(super) fn thread(&mut self, gpu: &[u32], cpu: &[u32]) -> Chain {
        let mut chain = Chain::EMPTY;
        for (&g, &c) in gpu.iter().zip(cpu) {
            let ci = c as usize;
            self.gpu[ci] = g;
            self.next[ci] = NIL;
            if chain.tail == NIL {
                chain.head = c;
            } else {
                self.next[chain.tail as usize] = c;
            }
            chain.tail = c;
            chain.len += 1;
        }
        chain
    }

    /// The CPU blocks of a chain, in order.
    pub(super) fn blocks(&self, chain: Chain) -> impl Iterator<Item = u32> + '_ {
        let mut cur = chain.head;
        core::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let c = cur;
            cur = self.next[c as usize];
            Some(c)
        })
    }

    /// Issues event `idx` over `chain`.
    pub(super) fn issue(&mut self, idx: u64, chain: Chain) {
        let h = self.hasher.hash_one(idx);
        let hasher = &self.hasher;
        // At most one event per CPU block is live; room was reserved for twice that many.
        self.events.insert_unique(
            h,
            Event {
                idx,
                chain,
                reported: 0,
                abandoned: false,
            },
            |e| hasher.hash_one(e.idx),
        );
        self.live_events += 1;
    }

    /// The event `idx`, if issued and not completed (read-only).
    pub(super) fn event(&self, idx: u64) -> Option<&Event> {
        let h = self.hasher.hash_one(idx);
        self.events.find(h, |e| e.idx == idx)
    }

    /// The event `idx`, if issued and not completed.
    pub(super) fn event_mut(&mut self, idx: u64) -> Option<&mut Event> {
        let h = self.hasher.hash_one(idx);
        self.events.find_mut(h, |e| e.idx == idx)
    }

    /// Removes event `idx`.
    pub(super) fn take(&mut self, idx: u64) -> Option<Event> {
        let h = self.hasher.hash_one(idx);
        let e = self.events.find_entry(h, |e| e.idx == idx).ok()?.remove().0;
        if e.abandoned {
            self.abandoned_events -= 1;
        } else {
            self.live_events -= 1;
        }
        self.pending_blocks -= u64::from(e.chain.len);
        Some(e)
    }

    /// Marks every issued event abandoned (a reset).
    pub(super) fn abandon_all(&mut self) {
        for e in self.events.iter_mut() {
            e.abandoned = true;
        }
        self.abandoned_events += self.live_events;
        self.live_events = 0;
    }

    /// Bytes of heap held.
    pub(super) fn heap_bytes(&self) -> usize {
        (self.next.capacity() + self.gpu.capacity()) * 4
            + self.req.capacity() * 8
            + self.meta.capacity() * size_of::<Option<StoredMeta>>()
            + self.interior.capacity() * size_of::<BlockKey>()
            + self.events.allocation_size()
            + self.flushes.capacity() * size_of::<Chain>()
    }
}
