//! `kvtier replay --offloader simple`: runs [`crate::replay_simple::replay_simple`] and prints
//! its report for people or as one JSON object, with `--metrics` the offloader's five series
//! and the GPU's.

use kvtier_core::stats::simple_offload::SaveOutcome;

use super::replay::{ReplayArgs, print_kv_events, print_report};
use crate::replay_simple::{SimpleReport, replay_simple};

/// Runs `kvtier replay --offloader simple`.
///
/// # Errors
/// Any error of the run or of printing the report.
pub fn run(args: &ReplayArgs) -> Result<(), crate::Error> {
    let report = replay_simple(&args.replay_options(), args.simple_options())?;
    print_kv_events(report.kv_events);
    let json = || serde_json::to_string(&report);
    print_report(args, json, || human(&report), &report.payload)?;
    Ok(())
}

/// The report for people.
#[must_use]
pub fn human(r: &SimpleReport) -> String {
    let g = &r.gpu;
    let mut s = format!(
        "kvtier replay --offloader simple: {source}\n\
         {mode} mode, {cpu} CPU blocks, world size {ws}; GPU front (engine model, \
         docs/engine-model.md): {gpu} blocks{hybrid}\n\
         \n",
        source = r.source,
        mode = if r.lazy { "lazy" } else { "eager" },
        cpu = r.cpu_blocks,
        ws = r.world_size,
        gpu = g.gpu_blocks,
        hybrid = if g.hybrid {
            ", hybrid (attention + Mamba in align mode)"
        } else {
            ""
        },
    );
    for o in SaveOutcome::ALL {
        let n = r.outcomes.get(o.label()).copied().unwrap_or(0);
        s.push_str(&format!("save {:<22} {n:>14}\n", o.label()));
    }
    s.push_str(&format!(
        "load blocks                 {load:>14}\n\
         used blocks (end)           {used:>14}\n\
         pending store blocks (end)  {pend:>14}\n\
         cached CPU blocks (end)     {cached:>14}\n\
         engine steps                {steps:>14}\n\
         preemptions                 {pre:>14}\n\
         prefix cache hits           {h:>14} of {q} tokens\n\
         external hits               {eh:>14} of {eq} tokens\n\
         wall time                   {wall:>12.3} s\n",
        load = r.load_blocks,
        used = r.used_blocks,
        pend = r.pending_store_blocks,
        cached = r.cached_blocks,
        steps = g.counts.steps,
        pre = g.counts.preemptions,
        h = g.counts.prefix_cache_hits,
        q = g.counts.prefix_cache_queries,
        eh = g.counts.external_prefix_cache_hits,
        eq = g.counts.external_prefix_cache_queries,
        wall = r.wall_s,
    ));
    s
}
