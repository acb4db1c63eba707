//! `kvtier replay --offloader simple`: the core's simple CPU offloader
//! ([`kvtier_core::simple::SimpleScheduler`], vLLM's `SimpleCPUOffloadScheduler`) behind the
//! engine model's GPU front ([`crate::engine`], `docs/engine-model.md`), one step at a time.
//!
//! [`SimpleTier`] is the offloader as the engine's [`Connector`]: the engine's hooks are the
//! scheduler calls vLLM makes; loads complete when the engine says so, and each store event
//! completes, reported by all `world_size` workers, at the end of the step `transfer_steps`
//! after the one that issued it. Finished requests reach the next step's input. The model
//! hashes prompt blocks only, so the computed tokens the offloader is shown are capped at them.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Instant;

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;
use kvtier_core::simple::{
    AllocStateError, Finished, InputError, LookupRequest, NewError, OutputError, Progress,
    Scheduled, SimpleConfig, SimpleScheduler, StepInput, WorkerOutput,
};
use kvtier_core::stats::Payload;
use kvtier_core::stats::catalogue::{SIMPLE_LOAD_BLOCKS, SIMPLE_USED_BLOCKS};
use kvtier_core::stats::simple_offload::SaveOutcome;

use crate::engine::{Connector, EngineError, FinishedRequest, LookupQuery, StepRecord};
use crate::replay_run::{GpuReport, ReplayOptions, RunError, add_gpu_series};
use crate::trace::RecordSource;

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
}

impl fmt::Display for SimpleTierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simple offloader: ")?;
        match self {
            SimpleTierError::Input(e) => e.fmt(f),
            SimpleTierError::Alloc(e) => e.fmt(f),
            SimpleTierError::Output(e) => e.fmt(f),
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
        }
    }

    /// The offloader.
    pub fn scheduler(&mut self) -> &mut SimpleScheduler {
        &mut self.s
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
        block_ids: &[u32],
        external_blocks: usize,
    ) -> Result<(), SimpleTierError> {
        let tokens = external_blocks as u64 * self.bt;
        Ok(self
            .s
            .update_state_after_alloc(gpu, q.rid, block_ids, tokens)?)
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
        let scheduled: Vec<Scheduled<'_>> = step
            .scheduled
            .iter()
            .map(|r| Scheduled {
                req: r.rid,
                new_block_ids: Some(if r.full_table {
                    r.block_ids
                } else {
                    let from = r.block_ids.len().saturating_sub(r.num_new_blocks);
                    r.block_ids.get(from..).unwrap_or_default()
                }),
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
            handoffs: &[],
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
        let done = Finished {
            req: req.rid,
            block_ids: req.block_ids,
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

/// Why `replay --offloader simple` failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimpleRunError {
    /// Opening or reading the trace, or building the GPU front.
    Run(RunError),
    /// `--offloader simple` without `--gpu-blocks`.
    NeedsGpu,
    /// `--offloader simple` where the command does not run it yet (`kvtier serve`).
    NotIn(&'static str),
    /// The offloader's configuration.
    Config(NewError),
    /// The engine or the offloader stopped at a record (`None` after the trace's end).
    Engine {
        /// The record's line, when the source has lines.
        line: Option<u64>,
        /// Why.
        error: EngineError<SimpleTierError>,
    },
}

impl fmt::Display for SimpleRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimpleRunError::Run(e) => e.fmt(f),
            SimpleRunError::NeedsGpu => {
                f.write_str("--offloader simple needs a GPU in front: give --gpu-blocks")
            }
            SimpleRunError::NotIn(cmd) => write!(f, "{cmd} does not run --offloader simple"),
            SimpleRunError::Config(e) => e.fmt(f),
            SimpleRunError::Engine {
                line: Some(l),
                error,
            } => write!(f, "line {l}: {error}"),
            SimpleRunError::Engine { error, .. } => error.fmt(f),
        }
    }
}

impl std::error::Error for SimpleRunError {}

impl From<RunError> for SimpleRunError {
    fn from(e: RunError) -> Self {
        SimpleRunError::Run(e)
    }
}

/// The simple offloader's options of `kvtier replay`.
#[derive(Clone, Copy, Debug)]
pub struct SimpleOptions {
    /// Lazy offload (vLLM's `lazy_offload`); eager otherwise.
    pub lazy: bool,
    /// Workers that report each store (`world_size`).
    pub world_size: u32,
}

/// What `replay --offloader simple` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimpleReport {
    /// Where the records came from.
    pub source: String,
    /// CPU blocks, the null block included.
    pub cpu_blocks: u32,
    /// Lazy mode.
    pub lazy: bool,
    /// `world_size`.
    pub world_size: u32,
    /// The seven save outcomes of the boundary hand-offs, by vLLM's label.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Blocks of completed loads (`vllm:simple_kv_offload_load_blocks_total`).
    pub load_blocks: u64,
    /// `vllm:simple_kv_offload_used_blocks` at the end.
    pub used_blocks: i64,
    /// `vllm:simple_kv_offload_pending_store_blocks` at the end.
    pub pending_store_blocks: u64,
    /// Blocks in the CPU prefix cache at the end.
    pub cached_blocks: usize,
    /// The GPU front.
    pub gpu: GpuReport,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// The offloader's stats and the GPU series, as vLLM's payload.
    #[serde(skip)]
    pub payload: Payload,
}

/// Replays `opts` through the simple offloader behind `opts.gpu`.
///
/// # Errors
/// [`SimpleRunError`]: no GPU, a trace that cannot be read, a configuration the offloader
/// refuses, or a step that failed.
pub fn replay_simple(
    opts: &ReplayOptions,
    simple: SimpleOptions,
) -> Result<SimpleReport, SimpleRunError> {
    let started = Instant::now();
    match &opts.trace {
        Some(path) => {
            let reader = opts
                .input
                .open_path(path, opts.block_tokens, opts.capacity.is_some(), |f| f)
                .map_err(RunError::from)?;
            drive(opts, simple, reader, path.display().to_string(), started)
        }
        None => {
            let name = format!("builtin(seed={}, requests={})", opts.seed, opts.requests);
            let generator = opts.generator().map_err(RunError::from)?;
            drive(opts, simple, generator, name, started)
        }
    }
}

fn drive<S: RecordSource>(
    opts: &ReplayOptions,
    simple: SimpleOptions,
    mut source: S,
    name: String,
    started: Instant,
) -> Result<SimpleReport, SimpleRunError>
where
    S::Error: Into<RunError>,
{
    let front = opts.gpu.ok_or(SimpleRunError::NeedsGpu)?;
    let header = source.header().clone();
    let bt = opts.block_tokens.unwrap_or(header.block_tokens);
    if bt == 0 {
        return Err(RunError::ZeroBlockTokens.into());
    }
    let cpu_blocks = match (opts.capacity, header.capacity) {
        (Some(c), _) => c,
        (None, Some(c)) => u32::try_from(c).unwrap_or(u32::MAX),
        (None, None) => 1024,
    };
    let mut engine = front.engine(bt)?;
    let mut cfg = SimpleConfig::with_cpu_blocks(bt, front.num_gpu_blocks, cpu_blocks);
    cfg.lazy_offload = simple.lazy;
    cfg.world_size = simple.world_size;
    cfg.max_num_batched_tokens =
        u32::try_from(front.engine.max_num_batched_tokens).unwrap_or(u32::MAX);
    // Pending hits, loads and store states: at most the engine's requests in flight.
    let seqs = u32::try_from(front.engine.max_num_seqs).unwrap_or(u32::MAX);
    cfg.max_requests = seqs.saturating_mul(4).saturating_add(64);
    let s = SimpleScheduler::new(cfg).map_err(SimpleRunError::Config)?;
    let mut tier = SimpleTier::new(s, bt, front.engine.transfer_steps);
    let fail = |line, error| SimpleRunError::Engine { line, error };
    while let Some(rec) = source.next_record().map_err(Into::into)? {
        if let Err(e) = engine.apply(rec, &mut tier) {
            return Err(fail(source.line(), e));
        }
    }
    engine.finish(&mut tier).map_err(|e| fail(None, e))?;
    let mut t = engine.counts().steps;
    while tier.busy() {
        let gpu = engine.gpu_mut().pool_mut();
        let r = tier.idle_step(gpu, t);
        r.map_err(|e| fail(None, EngineError::Connector(e)))?;
        t += 1;
    }
    let mut payload = tier.s.get_stats();
    add_gpu_series(&mut payload, &engine, &Default::default()).map_err(RunError::from)?;
    let outcomes = SaveOutcome::ALL
        .iter()
        .map(|&o| (o.label(), tier.s.boundary_total(o)))
        .collect();
    Ok(SimpleReport {
        source: name,
        cpu_blocks,
        lazy: simple.lazy,
        world_size: simple.world_size,
        outcomes,
        load_blocks: payload.counter(SIMPLE_LOAD_BLOCKS, &[]).unwrap_or(0),
        used_blocks: payload
            .gauge(SIMPLE_USED_BLOCKS, &[])
            .map_or(0, |g| g.numerator()),
        pending_store_blocks: tier.s.pending_store_blocks(),
        cached_blocks: tier.s.cpu_pool().cached_key_count(),
        gpu: GpuReport::new(&engine),
        wall_s: started.elapsed().as_secs_f64(),
        payload,
    })
}
