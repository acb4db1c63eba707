//! `kvtier sweep --offloader simple`: runs [`crate::sweep_simple::sweep_simple`] and prints its
//! rows as a table, CSV or one JSON object.

use std::fmt::Write as _;

use kvtier_core::stats::simple_offload::SaveOutcome;

pub use crate::sweep_simple::{SimpleSweepReport, SimpleSweepRow, sweep_simple};

use crate::numfmt::thousands;

fn outcome(row: &SimpleSweepRow, o: SaveOutcome) -> u64 {
    row.outcomes.get(o.label()).copied().unwrap_or(0)
}

/// The table for people.
#[must_use]
pub fn table(r: &SimpleSweepReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kvtier sweep --offloader simple: {} ({}, {} requests, blocks of {} tokens)",
        r.trace,
        r.format,
        thousands(r.requests),
        r.block_tokens
    );
    let _ = writeln!(
        s,
        "{} mode, world size {}; GPU front (engine model, docs/engine-model.md): {} blocks{}",
        if r.lazy { "lazy" } else { "eager" },
        r.world_size,
        thousands(u64::from(r.gpu_blocks)),
        if r.hybrid {
            ", hybrid (attention + Mamba in align mode)"
        } else {
            ""
        }
    );
    if let (Some(m), Some(b)) = (&r.model, r.bytes_per_block) {
        let _ = writeln!(s, "model {m}: {} bytes per block", thousands(b));
    }
    let _ = writeln!(
        s,
        "{} pool sizes on {} threads: trace parsed once in {:.3} s, rows {:.3} s, wall {:.3} s",
        r.rows.len(),
        r.jobs,
        r.parse_s,
        r.sweep_s,
        r.wall_s
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>10} {:>7} {:>10} {:>8} {:>12} {:>12} {:>9} {:>8} {:>8} {:>12} {:>8}",
        "CPU blocks",
        "GiB",
        "stored",
        "dropped",
        "skipped",
        "load blocks",
        "ext. hit",
        "used",
        "pending",
        "GPU hit tok",
        "steps"
    );
    for row in &r.rows {
        let dropped = outcome(row, SaveOutcome::DroppedCpuFull)
            + outcome(row, SaveOutcome::DroppedRequestGone)
            + outcome(row, SaveOutcome::DroppedNullBlock)
            + outcome(row, SaveOutcome::DroppedNotHashed);
        let skipped = outcome(row, SaveOutcome::SkippedAlreadyCached)
            + outcome(row, SaveOutcome::SkippedInFlight);
        let _ = writeln!(
            s,
            "{:>10} {:>7} {:>10} {:>8} {:>12} {:>12} {:>8.2}% {:>8} {:>8} {:>12} {:>8}",
            thousands(u64::from(row.cpu_blocks)),
            row.gib
                .map_or_else(|| "-".to_owned(), |g| format!("{g:.1}")),
            thousands(outcome(row, SaveOutcome::Stored)),
            thousands(dropped),
            thousands(skipped),
            thousands(row.load_blocks),
            100.0 * row.external_hit_rate,
            row.used_blocks,
            thousands(row.pending_store_blocks),
            thousands(row.gpu_hit_tokens),
            thousands(row.steps)
        );
    }
    let note = if r.hybrid {
        "save outcomes classify the Mamba group's boundary hand-offs (lazy mode reads none)"
    } else {
        "save outcomes classify boundary hand-offs (Mamba \"align\" groups in vLLM); a dense \
         model's single full-attention group has none, so they stay 0, as in vLLM (--hybrid \
         models one)"
    };
    let _ = writeln!(s, "\n{note}");
    s
}

/// The rows as CSV, with a header line: the seven outcomes by vLLM's label, then the loads,
/// the pool at the end and the GPU's figures.
#[must_use]
pub fn csv(r: &SimpleSweepReport) -> String {
    let mut s = String::from("cpu_blocks,gib");
    for o in SaveOutcome::ALL {
        s.push(',');
        s.push_str(o.label());
    }
    s.push_str(
        ",load_blocks,used_blocks,pending_store_blocks,cached_blocks,external_hit_tokens,\
         external_query_tokens,external_hit_rate,gpu_hit_tokens,gpu_query_tokens,steps,\
         preemptions\n",
    );
    for row in &r.rows {
        let _ = write!(
            s,
            "{},{}",
            row.cpu_blocks,
            row.gib.map(|g| format!("{g:.3}")).unwrap_or_default()
        );
        for o in SaveOutcome::ALL {
            let _ = write!(s, ",{}", outcome(row, o));
        }
        let _ = writeln!(
            s,
            ",{},{},{},{},{},{},{},{},{},{},{}",
            row.load_blocks,
            row.used_blocks,
            row.pending_store_blocks,
            row.cached_blocks,
            row.external_hit_tokens,
            row.external_query_tokens,
            row.external_hit_rate,
            row.gpu_hit_tokens,
            row.gpu_query_tokens,
            row.steps,
            row.preemptions
        );
    }
    s
}
