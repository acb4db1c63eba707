//! The replay thread of `kvtier serve --offloader simple`: a [`SimpleRun`] fed record by
//! record, its stats drained to the collector as the default path drains the manager's (every
//! 256 requests or 100 ms, and once at the end): the simple offloader's five
//! `vllm:simple_kv_offload_*` series, the GPU front's series and `vllm:num_requests_running`
//! (the engine's running requests).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::engine::EngineCounts;
use crate::replay::{ReplayOptions, RunError};
use crate::replay::{SimpleRun, SimpleRunError};
use crate::serve::{ReplayContext, ServeSummary, drain_due, pace};
use crate::tier::SimpleOptions;
use crate::trace::{Record, RecordSource};

/// What the simple offloader did in a `kvtier serve` replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleSummary {
    /// The seven save outcomes' totals, in vLLM's label order.
    pub outcomes: [(&'static str, u64); 7],
    /// Blocks of completed loads.
    pub load_blocks: u64,
    /// `vllm:simple_kv_offload_used_blocks` at the end.
    pub used_blocks: i64,
    /// `vllm:simple_kv_offload_pending_store_blocks` at the end.
    pub pending_store_blocks: u64,
    /// Blocks in the CPU prefix cache at the end.
    pub cached_blocks: usize,
    /// The engine's counts.
    pub engine: EngineCounts,
}

pub(crate) fn replay_thread(
    args: &ReplayOptions,
    simple: SimpleOptions,
    ctx: &ReplayContext<'_>,
) -> Result<ServeSummary, SimpleRunError> {
    match &args.trace {
        Some(path) => {
            let reader = args
                .input
                .open_path(path, args.block_tokens, args.capacity.is_some(), |f| f)
                .map_err(RunError::from)?;
            drive(args, simple, reader, ctx)
        }
        None => {
            let generator = args.generator().map_err(RunError::from)?;
            drive(args, simple, generator, ctx)
        }
    }
}

fn drive<S: RecordSource>(
    args: &ReplayOptions,
    simple: SimpleOptions,
    mut source: S,
    ctx: &ReplayContext<'_>,
) -> Result<ServeSummary, SimpleRunError>
where
    S::Error: Into<RunError>,
{
    let header = source.header().clone();
    let mut run = SimpleRun::new(args, simple, &header, ctx.kv_events.clone())?;
    let fail = |line, error| SimpleRunError::Engine { line, error };
    let send = |run: &mut SimpleRun| -> Result<(), SimpleRunError> {
        let payload = run.drain()?;
        ctx.sender.send(0, payload).map_err(RunError::from)?;
        Ok(())
    };
    // The first scrape sees the pool's gauges and the info series.
    send(&mut run)?;
    let start = Instant::now();
    let mut last_drain = Instant::now();
    let mut requests = 0u64;
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            break;
        }
        let Some(rec) = source.next_record().map_err(Into::into)? else {
            break;
        };
        let is_load = matches!(rec, Record::Load { .. });
        if let Err(e) = run.apply(rec) {
            return Err(fail(source.line(), e));
        }
        if !is_load {
            continue;
        }
        requests += 1;
        pace(ctx.rate, requests, start, ctx.stop);
        if drain_due(requests, last_drain) {
            send(&mut run)?;
            last_drain = Instant::now();
        }
    }
    run.finish().map_err(|e| fail(None, e))?;
    send(&mut run)?;
    // The publisher is the server's: it goes on serving replays until the server stops.
    let _ = run.finish_events();
    let s = run.offloader();
    let outcomes = kvtier_core::stats::simple_offload::SaveOutcome::ALL
        .map(|o| (o.label(), s.boundary_total(o)));
    let free = s.cpu_pool().free_count();
    Ok(ServeSummary {
        counts: crate::replay::ReplayCounts::default(),
        capacity: s.num_cpu_blocks(),
        simple: Some(SimpleSummary {
            outcomes,
            load_blocks: run.load_blocks(),
            used_blocks: i64::from(s.num_cpu_blocks()) - i64::from(free),
            pending_store_blocks: s.pending_store_blocks(),
            cached_blocks: s.cpu_pool().cached_key_count(),
            engine: run.engine().counts(),
        }),
    })
}
