//! What the engine tells the tier behind the GPU: [`Connector`], the scheduler-side hooks of a
//! vLLM KV connector, called by [`Engine`](super::Engine) at the points of a step where vLLM's
//! scheduler calls its connector.
//!
//! | hook | vLLM's call | when (see `docs/engine-model.md`) |
//! |---|---|---|
//! | [`Connector::lookup`] | `get_num_new_matched_tokens` | a request's first admission attempt, after the GPU lookup |
//! | [`Connector::allocated`] | `update_state_after_alloc` | the request's blocks were allocated |
//! | [`Connector::load_done`] | `finished_recving` in the worker output | the end of step `t + T` for a load issued in step `t` |
//! | [`Connector::prefill_done`] | the stores of the prompt's blocks | the step whose tokens complete the prompt, the first time |
//! | [`Connector::step`] | `build_connector_meta` | once per step, after scheduling |
//! | [`Connector::finished`] | `request_finished` and the stores' completion | the end of the step its stores complete in (or it finishes in, if later) |
//!
//! `load_done` and `step` have defaults that do nothing.

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::Handoff;

use super::GroupTables;

/// A request's lookup in the tier (vLLM's `get_num_new_matched_tokens` with the GPU's
/// block-aligned hit as `num_computed_tokens`).
#[derive(Clone, Copy, Debug)]
pub struct LookupQuery<'a> {
    /// The request.
    pub rid: u64,
    /// All of the request's block hashes (group 0), first to last.
    pub block_hashes: &'a [u64],
    /// `request.num_tokens` (the prompt, plus the outputs of a preempted request).
    pub num_tokens: u64,
    /// Leading blocks the GPU prefix cache already holds: the lookup starts after them.
    pub gpu_hit_blocks: usize,
    /// The most blocks the tier may report: the hit may not reach the request's last token.
    pub max_hit_blocks: usize,
}

impl LookupQuery<'_> {
    /// The hashes the tier looks up: those after the GPU's hit.
    #[must_use]
    pub fn remaining(&self) -> &[u64] {
        self.block_hashes
            .get(self.gpu_hit_blocks..)
            .unwrap_or_default()
    }
}

/// A request that finished, as its stores completed (vLLM's `request_finished` arguments).
#[derive(Clone, Copy, Debug)]
pub struct FinishedRequest<'a> {
    /// The request.
    pub rid: u64,
    /// Its block table, freed right after the call.
    pub block_ids: &'a [u32],
    /// Tokens it computed (its prompt and all outputs but the last).
    pub num_computed_tokens: u64,
    /// Its block hashes (its prompt's blocks).
    pub block_hashes: &'a [u64],
}

/// One scheduled request of a step (the parts of vLLM's `SchedulerOutput` a connector reads).
#[derive(Clone, Copy, Debug)]
pub struct ScheduledRequest<'a> {
    /// The request.
    pub rid: u64,
    /// Tokens computed before this step.
    pub num_computed_tokens: u64,
    /// Tokens this step computes.
    pub num_scheduled_tokens: u64,
    /// The request's whole block table after this step's allocation.
    pub block_ids: &'a [u32],
    /// Blocks of `block_ids` newly taken from the free queue in this step (its tail).
    pub num_new_blocks: usize,
    /// Admitted or resumed in this step: vLLM's scheduler output then carries the whole
    /// table (`block_ids`), the hit blocks included, as the request's new block ids.
    pub full_table: bool,
    /// The request's block hashes.
    pub block_hashes: &'a [u64],
}

/// One engine step as a connector's `build_connector_meta` sees it.
#[derive(Clone, Copy, Debug)]
pub struct StepRecord<'a> {
    /// The step, from 0.
    pub step: u64,
    /// The requests scheduled, running ones first, then the admitted ones, in order.
    pub scheduled: &'a [ScheduledRequest<'a>],
    /// Requests preempted in this step.
    pub preempted: &'a [u64],
    /// A hybrid model's boundary hand-offs drained in this step (vLLM's
    /// `boundary_state_offloads`): per request, in the order they were made, the Mamba state
    /// blocks cached since the last step. Empty for a dense model.
    pub handoffs: &'a [Handoff<'a>],
}

/// The scheduler side of the tier behind the GPU.
pub trait Connector {
    /// Why a hook failed.
    type Error;

    /// The number of leading blocks of [`LookupQuery::remaining`] the tier can load, at most
    /// [`LookupQuery::max_hit_blocks`]; more than 0 makes the engine load them asynchronously.
    /// It must change nothing in the tier: when the allocation fails, the engine asks again
    /// at the next attempt (as vLLM does); [`Connector::allocated`] commits the answer.
    ///
    /// # Errors
    /// The connector's own.
    fn lookup(&mut self, query: &LookupQuery<'_>) -> Result<usize, Self::Error>;

    /// The request's blocks are allocated at its first admission, with `external_blocks` the
    /// last [`Connector::lookup`] answer for `query`: `tables.attention` is its table, whose
    /// blocks `gpu_hit_blocks..gpu_hit_blocks + external_blocks` the tier loads;
    /// `tables.mamba` a hybrid model's state table (empty for a dense model).
    ///
    /// # Errors
    /// The connector's own.
    fn allocated(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        query: &LookupQuery<'_>,
        tables: GroupTables<'_>,
        external_blocks: usize,
    ) -> Result<(), Self::Error>;

    /// The request's loads completed.
    ///
    /// # Errors
    /// The connector's own.
    fn load_done(&mut self, _rid: u64) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The request's prompt is computed: the blocks the GPU computed (those past the GPU's
    /// and the tier's hits) are offered for storing.
    ///
    /// # Errors
    /// The connector's own.
    fn prefill_done(&mut self, rid: u64) -> Result<(), Self::Error>;

    /// One step's schedule.
    ///
    /// # Errors
    /// The connector's own.
    fn step(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        _step: &StepRecord<'_>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The request finished and its stores completed; the engine frees its blocks right
    /// after this call.
    ///
    /// # Errors
    /// The connector's own.
    fn finished(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), Self::Error>;
}

/// No tier behind the GPU: nothing hits, nothing is stored.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoConnector;

impl Connector for NoConnector {
    type Error = core::convert::Infallible;

    fn lookup(&mut self, _query: &LookupQuery<'_>) -> Result<usize, Self::Error> {
        Ok(0)
    }

    fn allocated(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        _query: &LookupQuery<'_>,
        _tables: GroupTables<'_>,
        _external_blocks: usize,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn prefill_done(&mut self, _rid: u64) -> Result<(), Self::Error> {
        Ok(())
    }

    fn finished(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        _req: &FinishedRequest<'_>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }
}
