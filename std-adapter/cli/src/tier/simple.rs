//! The core's simple CPU offloader ([`kvtier_core::simple::SimpleScheduler`], vLLM's
//! `SimpleCPUOffloadScheduler`) as the connector behind the engine model's GPU front
//! ([`crate::engine`], `docs/engine-model.md`), one step at a time.
//!
//! [`SimpleTier`] is the offloader as the engine's [`Connector`]: the engine's hooks are the
//! scheduler calls vLLM makes; loads complete when the engine says so, and each store event
//! completes, reported by all `world_size` workers, at the end of the step `transfer_steps`
//! after the one that issued it. Finished requests reach the next step's input. The model
//! hashes prompt blocks only, so the computed tokens the offloader is shown are capped at them.

use std::collections::VecDeque;
use std::fmt;

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::{
    AllocStateError, Finished, InputError, LookupRequest, OutputError, Progress, Scheduled,
    SimpleScheduler, StepInput, WorkerOutput,
};

use crate::engine::{Connector, FinishedRequest, GroupTables, LookupQuery, StepRecord};
use crate::tier::EventStream;

/// A call the simple offloader refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimpleTierError {
    /// A lookup or a step's input.
    Input(InputError),
    /// `update_state_after_alloc`.
    Alloc(AllocStateError),
    /// `update_connector_output`.
    Output(OutputError),
    /// The KV-events publisher stopped.
    EventsClosed,
}

impl fmt::Display for SimpleTierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simple offloader: ")?;
        match self {
            SimpleTierError::Input(e) => e.fmt(f),
            SimpleTierError::Alloc(e) => e.fmt(f),
            SimpleTierError::Output(e) => e.fmt(f),
            SimpleTierError::EventsClosed => f.write_str("the KV-events publisher stopped"),
        }
    }
}

impl std::error::Error for SimpleTierError {}

crate::from_variants::from_variants!(
    SimpleTierError:
    InputError => Input,
    AllocStateError => Alloc,
    OutputError => Output,
);

/// The simple offloader as the engine's connector.
#[derive(Debug)]
pub struct SimpleTier {
    s: SimpleScheduler,
    bt: u64,
    transfer_steps: u64,
    world_size: u32,
    finished: Vec<u64>,
    recv: Vec<u64>,
    /// Store events in flight and the step at whose end they complete.
    stores: VecDeque<(u64, u64)>,
    done: Vec<(u64, u32)>,
    /// Where each step's events go (the offloader records them only then).
    events: Option<EventStream>,
}

impl SimpleTier {
    /// The offloader `s` for `block_tokens`-token blocks, its transfers taking
    /// `transfer_steps` steps.
    #[must_use]
    pub fn new(s: SimpleScheduler, block_tokens: u32, transfer_steps: u64) -> Self {
        SimpleTier {
            world_size: s.config().world_size,
            s,
            bt: u64::from(block_tokens),
            transfer_steps,
            finished: Vec::new(),
            recv: Vec::new(),
            stores: VecDeque::new(),
            done: Vec::new(),
            events: None,
        }
    }

    /// Publishes the offloader's events to `stream` at the end of every step, one batch a
    /// step with events (the offloader must record them: `enable_events`).
    #[must_use]
    pub fn with_events(mut self, stream: EventStream) -> Self {
        self.events = Some(stream);
        self
    }

    /// The event stream, taken out (no event is published after).
    pub fn take_events(&mut self) -> Option<EventStream> {
        self.events.take()
    }

    /// The offloader.
    pub fn scheduler(&mut self) -> &mut SimpleScheduler {
        &mut self.s
    }

    /// The offloader, to read.
    #[must_use]
    pub fn offloader(&self) -> &SimpleScheduler {
        &self.s
    }

    /// Whether transfers or finished requests are still to be handed over.
    #[must_use]
    pub fn busy(&self) -> bool {
        self.s.has_pending_stores() || !self.stores.is_empty() || !self.finished.is_empty()
    }

    fn covered(&self, computed: u64, hashes: &[u64]) -> u64 {
        computed.min(hashes.len() as u64 * self.bt)
    }

    /// Reports the loads done and the stores due by the end of step `t`.
    fn complete(&mut self, gpu: &mut BlockPool<BlockKey>, t: u64) -> Result<(), SimpleTierError> {
        self.done.clear();
        while let Some(&(event, due)) = self.stores.front() {
            if due > t {
                break;
            }
            self.stores.pop_front();
            self.done.push((event, self.world_size));
        }
        let out = WorkerOutput {
            finished_recving: &self.recv,
            completed_stores: &self.done,
        };
        self.s.update_connector_output(gpu, &out)?;
        self.recv.clear();
        if let Some(stream) = &mut self.events {
            stream
                .step_simple(&mut self.s)
                .map_err(|_| SimpleTierError::EventsClosed)?;
        }
        Ok(())
    }

    /// A step with nothing scheduled at step `t` (it issues queued flushes), then its
    /// completions: for the offloader's transfers after the engine's last step.
    ///
    /// # Errors
    /// [`SimpleTierError`] when the offloader refuses a call.
    pub fn idle_step(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        t: u64,
    ) -> Result<(), SimpleTierError> {
        let input = StepInput {
            finished: &self.finished,
            ..StepInput::default()
        };
        let event = self.s.build_connector_meta(gpu, &input)?.store_event;
        if let Some(e) = event {
            self.stores.push_back((e, t + self.transfer_steps));
        }
        self.finished.clear();
        self.complete(gpu, t)
    }
}

impl SimpleTier {
    /// After the engine's last step `t − 1`: one step `t` with nothing scheduled hands the
    /// last finished requests over (issuing their queued flushes; in lazy mode it also walks
    /// the GPU free queue once), then the stores in flight complete at the ends of their due
    /// steps with no further step planned: an engine with no request left schedules none, so
    /// no further lazy walk runs. Returns the step after the last completion.
    ///
    /// # Errors
    /// [`SimpleTierError`] when the offloader refuses a call.
    pub fn drain(&mut self, gpu: &mut BlockPool<BlockKey>, t: u64) -> Result<u64, SimpleTierError> {
        self.idle_step(gpu, t)?;
        let mut t = t + 1;
        while !self.stores.is_empty() {
            self.complete(gpu, t)?;
            t += 1;
        }
        Ok(t)
    }
}

impl Connector for SimpleTier {
    type Error = SimpleTierError;

    fn lookup(&mut self, q: &LookupQuery<'_>) -> Result<usize, SimpleTierError> {
        let req = LookupRequest {
            req: q.rid,
            block_hashes: q.block_hashes,
            num_tokens: q.num_tokens,
            skip_reading_prefix_cache: false,
        };
        let computed = q.gpu_hit_blocks as u64 * self.bt;
        let (tokens, _) = self.s.get_num_new_matched_tokens(&req, computed)?;
        let blocks = usize::try_from(tokens / self.bt).unwrap_or(usize::MAX);
        Ok(blocks.min(q.max_hit_blocks))
    }

    fn allocated(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        q: &LookupQuery<'_>,
        tables: GroupTables<'_>,
        external_blocks: usize,
    ) -> Result<(), SimpleTierError> {
        let tokens = external_blocks as u64 * self.bt;
        let per_group = tables.per_group();
        let groups = self.s.config().layout.len().min(per_group.len());
        Ok(self
            .s
            .update_state_after_alloc_groups(gpu, q.rid, &per_group[..groups], tokens)?)
    }

    fn load_done(&mut self, rid: u64) -> Result<(), SimpleTierError> {
        self.recv.push(rid);
        Ok(())
    }

    fn prefill_done(&mut self, _rid: u64) -> Result<(), SimpleTierError> {
        Ok(())
    }

    fn step(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        step: &StepRecord<'_>,
    ) -> Result<(), SimpleTierError> {
        // The attention group's new blocks (the core does not read a Mamba table's).
        let new: Vec<[&[u32]; 1]> = step
            .scheduled
            .iter()
            .map(|r| {
                [if r.full_table {
                    r.block_ids
                } else {
                    let from = r.block_ids.len().saturating_sub(r.num_new_blocks);
                    r.block_ids.get(from..).unwrap_or_default()
                }]
            })
            .collect();
        let scheduled: Vec<Scheduled<'_>> = step
            .scheduled
            .iter()
            .zip(&new)
            .map(|(r, new)| Scheduled {
                req: r.rid,
                new_block_ids: Some(new),
                full_table: r.full_table,
                num_scheduled_tokens: r.num_scheduled_tokens,
                progress: Progress {
                    num_computed_tokens: self.covered(r.num_computed_tokens, r.block_hashes),
                    num_output_placeholders: 0,
                    block_hashes: r.block_hashes,
                },
            })
            .collect();
        let input = StepInput {
            handoffs: step.handoffs,
            preempted: step.preempted,
            finished: &self.finished,
            scheduled: &scheduled,
        };
        let event = self.s.build_connector_meta(gpu, &input)?.store_event;
        if let Some(e) = event {
            self.stores.push_back((e, step.step + self.transfer_steps));
        }
        self.finished.clear();
        self.complete(gpu, step.step)
    }

    fn finished(
        &mut self,
        gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), SimpleTierError> {
        let tables = [req.block_ids];
        let done = Finished {
            req: req.rid,
            block_ids: &tables,
            // Read only with fine-grained hits, which the engine model's layouts never enable.
            num_prompt_tokens: 0,
            progress: Progress {
                num_computed_tokens: self.covered(req.num_computed_tokens, req.block_hashes),
                num_output_placeholders: 0,
                block_hashes: req.block_hashes,
            },
        };
        self.s.request_finished_all_groups(gpu, &done)?;
        self.finished.push(req.rid);
        Ok(())
    }
}
