//! Operation enum and reference model for the GPU-style block pool, shared by proptests and fuzz
//! targets.
//!
//! [`PoolModel`] restates vLLM 0.33.0's `BlockPool` in the plainest terms: a `VecDeque` free
//! list, a `BTreeMap` from key to the blocks holding it (in insertion order), ref counts in a
//! `Vec`. Where vLLM asserts, it computes the error kvtier must return, checking in the same
//! order as the real pool (ranges over the whole input first, then per entry in input order).
//! [`apply_pool`] runs an op on a real [`BlockPool`] with the same outcome type, and
//! [`PoolSnapshot`] captures all observable state of either side for comparison.

use std::collections::{BTreeMap, VecDeque};

use kvtier_core::BlockKey;
use kvtier_core::block_pool::{
    BlockHash, BlockPool, CacheError, FreeError, GetBlocksError, OutOfRange, PoolEvent, TouchError,
};

/// One operation on a `BlockPool<BlockKey>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolOp {
    /// `get_new_blocks(n)`.
    GetNew(u32),
    /// `touch(blocks)`.
    Touch(Vec<u32>),
    /// `free_blocks(blocks)`.
    Free(Vec<u32>),
    /// `cache_full_blocks(...)`.
    CacheFull {
        /// All blocks of the request.
        blocks: Vec<u32>,
        /// One key per block.
        keys: Vec<BlockKey>,
        /// Blocks already cached.
        num_cached: u32,
        /// Blocks full after this call.
        num_full: u32,
        /// Tokens per block.
        block_size: u32,
        /// Optional mask over the new full blocks.
        mask: Option<Vec<bool>>,
    },
    /// `evict_blocks(blocks)`.
    Evict(Vec<u32>),
    /// `reset_prefix_cache()`.
    Reset,
    /// `take_events()`.
    TakeEvents,
}

/// Decodes a [`PoolOp`] from fuzzer bytes: block ids and counts as `u8` (fuzzed pools are
/// small), keys from a universe of four hashes in two groups (so keys collide and share
/// blocks), any token count per block. Hand-written because `BlockKey`, a core type, has no
/// `Arbitrary` impl (the core depends on nothing that would give it one).
#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for PoolOp {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        fn ids(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<Vec<u32>> {
            let raw: Vec<u8> = u.arbitrary()?;
            Ok(raw.into_iter().map(u32::from).collect())
        }
        Ok(match u.int_in_range(0u8..=6)? {
            0 => PoolOp::GetNew(u32::from(u.arbitrary::<u8>()?)),
            1 => PoolOp::Touch(ids(u)?),
            2 => PoolOp::Free(ids(u)?),
            3 => {
                let blocks = ids(u)?;
                let raw: Vec<u8> = u.arbitrary()?;
                let keys = raw
                    .into_iter()
                    .map(|k| BlockKey::new(u64::from(k % 4), u32::from(k / 4 % 2)))
                    .collect();
                PoolOp::CacheFull {
                    blocks,
                    keys,
                    num_cached: u32::from(u.arbitrary::<u8>()?),
                    num_full: u32::from(u.arbitrary::<u8>()?),
                    block_size: u.arbitrary()?,
                    mask: u.arbitrary()?,
                }
            }
            4 => PoolOp::Evict(ids(u)?),
            5 => PoolOp::Reset,
            _ => PoolOp::TakeEvents,
        })
    }
}

/// What a successful op returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolOutput {
    /// The blocks handed out by `GetNew`.
    Blocks(Vec<u32>),
    /// `Touch`, `Free`, `CacheFull`, `Evict` succeeded.
    Done,
    /// `Reset`'s result.
    Reset(bool),
    /// The drained events.
    Events(Vec<PoolEvent<BlockKey>>),
}

/// Any block pool error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolOpError {
    /// From `get_new_blocks`.
    Get(GetBlocksError),
    /// From `touch`.
    Touch(TouchError),
    /// From `free_blocks`.
    Free(FreeError),
    /// From `cache_full_blocks`.
    Cache(CacheError),
    /// From `evict_blocks`.
    Evict(OutOfRange),
}

/// An op's outcome.
pub type PoolOutcome = Result<PoolOutput, PoolOpError>;

/// All observable state of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// The free queue, front first.
    pub free: Vec<u32>,
    /// Ref count per block.
    pub ref_cnt: Vec<u32>,
    /// Hash per block.
    pub hashes: Vec<Option<BlockHash<BlockKey>>>,
    /// Distinct keys cached.
    pub cached_keys: usize,
    /// `usage()` as (used, total).
    pub usage: (u32, u32),
    /// Events dropped so far.
    pub dropped_events: u64,
}

/// Snapshot of a real pool.
#[must_use]
pub fn snapshot(pool: &BlockPool<BlockKey>) -> PoolSnapshot {
    let n = pool.num_blocks();
    let u = pool.usage();
    PoolSnapshot {
        free: pool.free_queue().iter().collect(),
        ref_cnt: (0..n)
            .map(|b| pool.ref_count(b).unwrap_or(u32::MAX))
            .collect(),
        hashes: (0..n).map(|b| pool.block_hash(b)).collect(),
        cached_keys: pool.cached_key_count(),
        usage: (u.used, u.total),
        dropped_events: pool.dropped_events(),
    }
}

/// Applies `op` to a real pool.
pub fn apply_pool(pool: &mut BlockPool<BlockKey>, op: &PoolOp) -> PoolOutcome {
    match op {
        &PoolOp::GetNew(n) => {
            let mut got = Vec::new();
            pool.get_new_blocks(n, |b| got.push(b))
                .map(|()| PoolOutput::Blocks(got))
                .map_err(PoolOpError::Get)
        }
        PoolOp::Touch(b) => pool
            .touch(b)
            .map(|()| PoolOutput::Done)
            .map_err(PoolOpError::Touch),
        PoolOp::Free(b) => pool
            .free_blocks(b)
            .map(|()| PoolOutput::Done)
            .map_err(PoolOpError::Free),
        PoolOp::CacheFull {
            blocks,
            keys,
            num_cached,
            num_full,
            block_size,
            mask,
        } => pool
            .cache_full_blocks(
                blocks,
                keys,
                *num_cached,
                *num_full,
                *block_size,
                mask.as_deref(),
            )
            .map(|()| PoolOutput::Done)
            .map_err(PoolOpError::Cache),
        PoolOp::Evict(b) => pool
            .evict_blocks(b)
            .map(|()| PoolOutput::Done)
            .map_err(PoolOpError::Evict),
        PoolOp::Reset => Ok(PoolOutput::Reset(pool.reset_prefix_cache())),
        PoolOp::TakeEvents => Ok(PoolOutput::Events(pool.take_events().collect())),
    }
}

/// Reference model of `BlockPool<BlockKey>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolModel {
    /// Blocks, the null block included.
    pub num_blocks: u32,
    /// Prefix caching on.
    pub caching: bool,
    /// Events recorded.
    pub events_on: bool,
    /// Most events held.
    pub event_capacity: usize,
    /// Ref count per block.
    pub ref_cnt: Vec<u32>,
    /// Hash per block.
    pub hashes: Vec<Option<BlockHash<BlockKey>>>,
    /// Free list, front first.
    pub free: VecDeque<u32>,
    /// Key → blocks holding it, first inserted first.
    pub map: BTreeMap<BlockKey, Vec<u32>>,
    /// Recorded events.
    pub events: Vec<PoolEvent<BlockKey>>,
    /// Dropped events.
    pub dropped: u64,
}

impl PoolModel {
    /// A model of a pool of `num_blocks > 0` blocks.
    #[must_use]
    pub fn new(num_blocks: u32, caching: bool, events_on: bool, event_capacity: usize) -> Self {
        let n = num_blocks as usize;
        PoolModel {
            num_blocks,
            caching,
            events_on,
            event_capacity,
            ref_cnt: vec![0; n],
            hashes: vec![None; n],
            free: (1..num_blocks).collect(),
            map: BTreeMap::new(),
            events: Vec::new(),
            dropped: 0,
        }
    }

    /// The model's observable state.
    #[must_use]
    pub fn snapshot(&self) -> PoolSnapshot {
        let total = self.num_blocks - 1;
        let free = u32::try_from(self.free.len()).unwrap_or(u32::MAX);
        PoolSnapshot {
            free: self.free.iter().copied().collect(),
            ref_cnt: self.ref_cnt.clone(),
            hashes: self.hashes.clone(),
            cached_keys: self.map.len(),
            usage: (total - free, total),
            dropped_events: self.dropped,
        }
    }

    /// The block `get_one_block(key)` must return.
    #[must_use]
    pub fn get_one_block(&self, key: &BlockKey) -> Option<u32> {
        self.map.get(key).and_then(|v| v.first().copied())
    }

    fn event(&mut self, e: PoolEvent<BlockKey>) {
        if !self.events_on {
            return;
        }
        if self.events.len() < self.event_capacity {
            self.events.push(e);
        } else {
            self.dropped += 1;
        }
    }

    fn remove_hash(&mut self, b: u32) {
        if let Some(h) = self.hashes[b as usize].take() {
            if let Some(v) = self.map.get_mut(&h.key) {
                v.retain(|&x| x != b);
                if v.is_empty() {
                    self.map.remove(&h.key);
                }
            }
            self.event(PoolEvent::Removed {
                key: h.key,
                block: b,
            });
        }
    }

    fn range(&self, blocks: &[u32]) -> Result<(), OutOfRange> {
        match blocks.iter().find(|&&b| b >= self.num_blocks) {
            Some(&b) => Err(OutOfRange {
                block: b,
                num_blocks: self.num_blocks,
            }),
            None => Ok(()),
        }
    }

    /// Applies `op` to the model.
    pub fn apply(&mut self, op: &PoolOp) -> PoolOutcome {
        match op {
            &PoolOp::GetNew(n) => {
                let free = u32::try_from(self.free.len()).unwrap_or(u32::MAX);
                if n > free {
                    return Err(PoolOpError::Get(GetBlocksError { requested: n, free }));
                }
                let got: Vec<u32> = self.free.drain(..n as usize).collect();
                for &b in &got {
                    if self.caching {
                        self.remove_hash(b);
                    }
                    self.ref_cnt[b as usize] += 1;
                }
                Ok(PoolOutput::Blocks(got))
            }
            PoolOp::Touch(blocks) => {
                self.range(blocks)
                    .map_err(|e| PoolOpError::Touch(TouchError::OutOfRange(e)))?;
                let mut counts = self.ref_cnt.clone();
                for &b in blocks.iter().filter(|&&b| b != 0) {
                    let Some(c) = counts[b as usize].checked_add(1) else {
                        return Err(PoolOpError::Touch(TouchError::RefCountOverflow {
                            block: b,
                        }));
                    };
                    counts[b as usize] = c;
                }
                for &b in blocks.iter().filter(|&&b| b != 0) {
                    if self.ref_cnt[b as usize] == 0 {
                        self.free.retain(|&x| x != b);
                    }
                    self.ref_cnt[b as usize] += 1;
                }
                Ok(PoolOutput::Done)
            }
            PoolOp::Free(blocks) => {
                self.range(blocks)
                    .map_err(|e| PoolOpError::Free(FreeError::OutOfRange(e)))?;
                let mut counts = self.ref_cnt.clone();
                let (mut first, mut last) = (Vec::new(), Vec::new());
                for &b in blocks.iter().filter(|&&b| b != 0) {
                    let c = &mut counts[b as usize];
                    if *c == 0 {
                        return Err(PoolOpError::Free(FreeError::NotInUse { block: b }));
                    }
                    *c -= 1;
                    if *c == 0 {
                        if self.hashes[b as usize].is_none() || !self.caching {
                            first.push(b);
                        } else {
                            last.push(b);
                        }
                    }
                }
                self.ref_cnt = counts;
                for &b in first.iter().rev() {
                    self.free.push_front(b);
                }
                self.free.extend(last);
                Ok(PoolOutput::Done)
            }
            PoolOp::CacheFull {
                blocks,
                keys,
                num_cached,
                num_full,
                block_size,
                mask,
            } => self
                .cache_full(
                    blocks,
                    keys,
                    *num_cached,
                    *num_full,
                    *block_size,
                    mask.as_deref(),
                )
                .map(|()| PoolOutput::Done)
                .map_err(PoolOpError::Cache),
            PoolOp::Evict(blocks) => {
                self.range(blocks).map_err(PoolOpError::Evict)?;
                for &b in blocks {
                    self.remove_hash(b);
                }
                Ok(PoolOutput::Done)
            }
            PoolOp::Reset => {
                if self.num_blocks as usize - self.free.len() != 1 {
                    return Ok(PoolOutput::Reset(false));
                }
                self.map.clear();
                self.hashes.iter_mut().for_each(|h| *h = None);
                self.event(PoolEvent::AllCleared);
                Ok(PoolOutput::Reset(true))
            }
            PoolOp::TakeEvents => Ok(PoolOutput::Events(std::mem::take(&mut self.events))),
        }
    }

    fn cache_full(
        &mut self,
        blocks: &[u32],
        keys: &[BlockKey],
        num_cached: u32,
        num_full: u32,
        block_size: u32,
        mask: Option<&[bool]>,
    ) -> Result<(), CacheError> {
        if num_cached >= num_full {
            return Ok(());
        }
        if block_size == 0 {
            return Err(CacheError::ZeroBlockSize);
        }
        let (c, f) = (num_cached as usize, num_full as usize);
        if blocks.len() < f {
            return Err(CacheError::BlocksTooShort {
                num_full_blocks: num_full,
                len: blocks.len(),
            });
        }
        if keys.len() < f {
            return Err(CacheError::KeysTooShort {
                num_full_blocks: num_full,
                len: keys.len(),
            });
        }
        if let Some(m) = mask
            && m.len() != f - c
        {
            return Err(CacheError::MaskLength {
                expected: f - c,
                len: m.len(),
            });
        }
        let chosen: Vec<(u32, BlockKey, u64)> = (c..f)
            .filter(|&i| blocks[i] != 0 && mask.is_none_or(|m| m[i - c]))
            .map(|i| (blocks[i], keys[i], (i as u64 + 1) * u64::from(block_size)))
            .collect();
        for &(b, _, tokens) in &chosen {
            if b >= self.num_blocks {
                return Err(CacheError::OutOfRange(OutOfRange {
                    block: b,
                    num_blocks: self.num_blocks,
                }));
            }
            if let Some(h) = self.hashes[b as usize]
                && h.num_tokens >= tokens
            {
                return Err(CacheError::AlreadyHashed {
                    block: b,
                    num_tokens: h.num_tokens,
                    new_num_tokens: tokens,
                });
            }
        }
        for &(b, key, num_tokens) in &chosen {
            self.remove_hash(b);
            self.hashes[b as usize] = Some(BlockHash { key, num_tokens });
            self.map.entry(key).or_default().push(b);
        }
        for &(block, key, num_tokens) in &chosen {
            self.event(PoolEvent::Stored {
                key,
                block,
                num_tokens,
            });
        }
        Ok(())
    }
}
