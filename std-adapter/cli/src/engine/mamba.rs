//! The Mamba group of a hybrid model (`EngineConfig::hybrid`): vLLM's `MambaManager` in
//! `align` mode as the engine model keeps it, in the GPU pool the attention group uses.
//!
//! A request's state table has one entry per block position: entry `i` holds the state after
//! the first `i + 1` blocks' tokens, or the null block 0 for a state not kept. The model
//! (`docs/engine-model.md`, "A hybrid model"):
//!
//! * [`GpuCache::state_hit`]: a GPU hit ends at the last of the attention hit's blocks whose
//!   state is cached (the hybrid coordinator's reconciliation); its state block is touched.
//! * [`GpuCache::release_stale_states`]: before an allocation, every state but the last is
//!   freed (vLLM's `remove_skipped_blocks` at `num_computed_tokens − 1`).
//! * [`GpuCache::extend_states`]: an allocation that reaches a new block position appends
//!   nulls and one new block, the running state (`allocate_new_blocks` in align mode).
//! * [`GpuCache::cache_state`]: when a prompt chunk (or a load) ends on a block boundary, the
//!   state there is cached under the block's hash in the Mamba group and offered as a
//!   boundary hand-off (`cache_blocks` in align mode).

use kvtier_core::BlockKey;

use kvtier_core::simple::Layout;

use super::EngineConfig;
use super::gpu::{GpuCache, GpuError};

/// The Mamba group's id in the engine model (the attention group is 0).
pub const MAMBA_GROUP: u32 = 1;

/// The engine model's KV-cache groups as the simple offloader's core sees them: one
/// full-attention group, and with `hybrid` a Mamba group ([`MAMBA_GROUP`]).
#[must_use]
pub fn layout(hybrid: bool) -> Layout {
    if hybrid {
        Layout::hybrid_mamba(true)
    } else {
        Layout::dense()
    }
}

/// A request's GPU block tables after allocation, in the engine model's groups.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupTables<'a> {
    /// The full-attention group's table.
    pub attention: &'a [u32],
    /// The Mamba group's table (empty in a dense model): null entries for skipped states.
    pub mamba: &'a [u32],
}

impl<'a> GroupTables<'a> {
    /// The tables in group order (a dense model's core reads the first alone).
    #[must_use]
    pub fn per_group(&self) -> [&'a [u32]; 2] {
        [self.attention, self.mamba]
    }
}

impl GpuCache {
    /// Of the first `attention_hit` blocks of `hashes`, the last whose Mamba state the GPU
    /// caches: the hit's length in blocks and the state's block.
    #[must_use]
    pub fn state_hit(&self, hashes: &[u64], attention_hit: usize) -> Option<(usize, u32)> {
        let hashes = hashes.get(..attention_hit).unwrap_or(hashes);
        hashes.iter().enumerate().rev().find_map(|(i, &h)| {
            self.pool
                .get_one_block(&BlockKey::new(h, MAMBA_GROUP))
                .map(|b| (i + 1, b))
        })
    }

    /// Frees every state of `table` but the last (tail first) and nulls their entries.
    ///
    /// # Errors
    /// [`GpuError::Free`] when the pool refuses (a state freed more often than held).
    pub fn release_stale_states(&mut self, table: &mut [u32]) -> Result<(), GpuError> {
        let Some(last) = table.iter().rposition(|&b| b != 0) else {
            return Ok(());
        };
        self.reversed.clear();
        for b in table[..last].iter_mut().rev() {
            if *b != 0 {
                self.reversed.push(core::mem::take(b));
            }
        }
        self.pool.free_blocks(&self.reversed)?;
        Ok(())
    }

    /// New blocks a state table of `len` entries takes to cover `tokens`: 1 when they reach a
    /// new block position.
    #[must_use]
    pub fn states_needed(&self, len: usize, tokens: u64) -> u64 {
        u64::from(tokens.div_ceil(u64::from(self.block_tokens())) > len as u64)
    }

    /// Extends `table` to cover `tokens`: a hit's state first (at its position, already
    /// touched by [`GpuCache::allocate`]), then, when `tokens` reach a new block position,
    /// nulls and one new block.
    ///
    /// # Errors
    /// [`GpuError`] when the pool refuses (no free block: check
    /// [`GpuCache::states_needed`] first).
    pub fn extend_states(
        &mut self,
        table: &mut Vec<u32>,
        hit: Option<(usize, u32)>,
        tokens: u64,
    ) -> Result<(), GpuError> {
        if let Some((blocks, state)) = hit {
            table.resize(blocks - 1, 0);
            table.push(state);
        }
        let want = tokens.div_ceil(u64::from(self.block_tokens()));
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        if want > table.len() {
            table.resize(want - 1, 0);
            self.pool.get_new_blocks(1, |b| table.push(b))?;
        }
        Ok(())
    }

    /// With `boundary` blocks of the prompt computed (or loaded), caches the state at that
    /// boundary under `(hashes[boundary − 1], MAMBA_GROUP)` if the table holds it and it is
    /// not cached yet; returns it, the block to hand off.
    ///
    /// # Errors
    /// [`GpuError::Cache`] when the pool refuses.
    pub fn cache_state(
        &mut self,
        table: &[u32],
        hashes: &[u64],
        boundary: usize,
    ) -> Result<Option<u32>, GpuError> {
        let Some(i) = boundary.checked_sub(1) else {
            return Ok(None);
        };
        let (Some(&b), Some(&h)) = (table.get(i), hashes.get(i)) else {
            return Ok(None);
        };
        if b == 0 || self.pool.block_hash(b).is_some() {
            return Ok(None);
        }
        let key = BlockKey::new(h, MAMBA_GROUP);
        let n = boundary as u64 * u64::from(self.block_tokens());
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.pool
            .cache_full_blocks(&[b], &[key], 0, 1, n, None)
            .map_err(GpuError::Cache)?;
        Ok(Some(b))
    }
}

/// Tokens a request of `num_tokens` tokens (`prompt` of them its prompt) computes from `start`
/// within `budget`: the rest, at most the budget; in a hybrid model a chunk that ends inside
/// the prompt ends on a block boundary (vLLM's align mode), so it may be 0.
pub(super) fn chunk(
    config: &EngineConfig,
    num_tokens: u64,
    prompt: u64,
    start: u64,
    budget: u64,
) -> u64 {
    let n = (num_tokens - start).min(budget);
    if !config.hybrid || start + n >= prompt {
        return n;
    }
    let bt = u64::from(config.block_tokens);
    ((start + n) / bt * bt).saturating_sub(start)
}

/// The hand-offs `(request, block)` grouped per request, in the order each request first
/// made one (vLLM's `boundary_state_offloads` dict).
pub(super) fn group_offers(offers: &[(u64, u32)]) -> Vec<(u64, Vec<u32>)> {
    let mut out: Vec<(u64, Vec<u32>)> = Vec::new();
    for &(rid, b) in offers {
        match out.iter_mut().find(|(r, _)| *r == rid) {
            Some((_, blocks)) => blocks.push(b),
            None => out.push((rid, vec![b])),
        }
    }
    out
}
