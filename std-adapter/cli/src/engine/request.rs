//! A request in the engine: its tables, its lookup query, and its allocation over both of
//! a hybrid model's groups.

use std::collections::VecDeque;

use super::EngineError;
use super::connector::LookupQuery;
use super::gpu::{GpuCache, GpuError, Other};

/// A request in the engine, from its arrival to the free of its blocks.
#[derive(Debug)]
pub(super) struct Req {
    pub(super) rid: u64,
    pub(super) hashes: Vec<u64>,
    /// Prompt tokens: `hashes.len() · block_tokens`.
    pub(super) prompt: u64,
    pub(super) table: Vec<u32>,
    /// A hybrid model's state table (`mamba`); empty for a dense model.
    pub(super) states: Vec<u32>,
    pub(super) computed: u64,
    pub(super) outputs: u64,
    /// Leading blocks of `table` in the GPU prefix cache.
    pub(super) cached: usize,
    /// The connector has committed its lookup ([`Connector::allocated`](super::Connector::allocated)).
    pub(super) admitted: bool,
    /// Blocks the GPU hit at the first admission and the tier loads after them.
    pub(super) gpu_hit: usize,
    pub(super) external: usize,
    pub(super) preempted: bool,
    pub(super) prefilled: bool,
    /// The step at whose end the stores (after `prefilled`) or the loads complete.
    pub(super) transfer_end: u64,
    /// Tokens scheduled in the current step.
    pub(super) scheduled: u64,
    pub(super) new_blocks: usize,
    /// Admitted (or resumed) in the current step: the schedule carries its whole table.
    pub(super) full_table: bool,
}

impl Req {
    pub(super) fn num_tokens(&self) -> u64 {
        self.prompt + self.outputs
    }

    /// The hit cap: block-aligned, short of the last token, within the hashed blocks.
    pub(super) fn max_hit_blocks(&self, block_tokens: u64) -> usize {
        let cap = (self.num_tokens() - 1) / block_tokens;
        usize::try_from(cap).map_or(self.hashes.len(), |c| c.min(self.hashes.len()))
    }
}

pub(super) fn query(r: &Req, gpu_hit_blocks: usize, max_total: usize) -> LookupQuery<'_> {
    LookupQuery {
        rid: r.rid,
        block_hashes: &r.hashes,
        num_tokens: r.num_tokens(),
        gpu_hit_blocks,
        max_hit_blocks: max_total - gpu_hit_blocks,
    }
}

/// Blocks the prefills in flight (running ones short of their prompt, loading and holding
/// ones) still need to finish their prompt (vLLM's `_inflight_prefill_reserved_blocks`),
/// counted after this step's allocations.
pub(super) fn prefill_reserve(
    running: &[Req],
    loading: &[Req],
    holding: &VecDeque<Req>,
    block_tokens: u64,
) -> u64 {
    running
        .iter()
        .filter(|r| r.computed + r.scheduled < r.prompt)
        .chain(loading)
        .chain(holding)
        .map(|r| {
            r.prompt
                .div_ceil(block_tokens)
                .saturating_sub(r.table.len() as u64)
        })
        .sum()
}

/// `allocate_slots` over a request's tables: a hybrid model's stale states are released
/// first, then the attention table and the state table grow together or not at all.
pub(super) fn allocate<E>(
    gpu: &mut GpuCache,
    r: &mut Req,
    hits: &[u32],
    state: Option<(usize, u32)>,
    tokens: u64,
    reserved: u64,
    hybrid: bool,
) -> Result<bool, EngineError<E>> {
    if !hybrid {
        return Ok(gpu.allocate(&mut r.table, hits, tokens, reserved, Other::default())?);
    }
    gpu.release_stale_states(&mut r.states)?;
    let len = state.map_or(r.states.len(), |(n, _)| n);
    let other = Other {
        hits: state
            .as_ref()
            .map(|(_, b)| core::slice::from_ref(b))
            .unwrap_or_default(),
        new: gpu.states_needed(len, tokens),
    };
    if !gpu.allocate(&mut r.table, hits, tokens, reserved, other)? {
        return Ok(false);
    }
    gpu.extend_states(&mut r.states, state, tokens)?;
    Ok(true)
}

/// `cache_blocks` after `blocks` blocks of `r` are computed (or loaded): its prompt blocks up
/// to there are cached, and in a hybrid model the state at that boundary is cached and offered
/// as a hand-off (`offers`).
pub(super) fn cache_prompt(
    gpu: &mut GpuCache,
    offers: &mut Vec<(u64, u32)>,
    r: &mut Req,
    blocks: u64,
) -> Result<(), GpuError> {
    let full = usize::try_from(blocks).map_or(r.hashes.len(), |f| f.min(r.hashes.len()));
    gpu.cache(&r.table, &r.hashes, r.cached, full)?;
    r.cached = r.cached.max(full);
    if let Some(b) = gpu.cache_state(&r.states, &r.hashes, full)? {
        offers.push((r.rid, b));
    }
    Ok(())
}
