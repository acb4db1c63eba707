//! `kvtier capacity`: parses the options, computes [`crate::sizing::report`] and prints it as
//! a table (with vLLM's log lines) or one JSON object.
use std::io::Write;

use super::OutputError;
use crate::sizing::CapacityOptions;

use crate::numfmt::thousands;
use crate::sizing::{CapacityReport, report};

/// Options of `kvtier capacity`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct CapacityArgs {
    /// What to size.
    #[command(flatten)]
    pub options: CapacityOptions,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The table for people, with vLLM's log lines.
#[must_use]
pub(crate) fn render_table(r: &CapacityReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model {}: {} layers, {} KV-cache groups",
        r.model,
        r.num_layers,
        r.groups.len()
    );
    let _ = writeln!(
        s,
        "max_model_len {}, max_num_batched_tokens {}, max_concurrent_batches {}, workers {}, {}",
        thousands(r.max_model_len),
        thousands(r.max_num_batched_tokens),
        r.max_concurrent_batches,
        r.workers,
        r.pool_layout
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>5}  {:<14} {:>6} {:>6} {:>12} {:>14} {:>14}",
        "group", "kind", "layers", "block", "page bytes", "group bytes", "blocks/request"
    );
    for g in &r.groups {
        let _ = writeln!(
            s,
            "{:>5}  {:<14} {:>6} {:>6} {:>12} {:>14} {:>14}",
            g.index,
            g.kind,
            g.layers,
            g.block_size,
            thousands(g.page_bytes),
            thousands(g.group_bytes),
            thousands(g.blocks_per_request)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "bytes per block       {}", thousands(r.bytes_per_block));
    let _ = writeln!(
        s,
        "blocks per request    {}",
        thousands(r.blocks_per_request)
    );
    let _ = writeln!(s, "bytes per request     {}", thousands(r.request_bytes));
    if let (Some(n), Some(mc), Some(exact), Some(tokens)) = (
        r.num_blocks,
        r.max_concurrency,
        &r.max_concurrency_exact,
        r.kv_cache_size_tokens,
    ) {
        let _ = writeln!(s, "num_gpu_blocks        {}", thousands(n));
        let _ = writeln!(s, "max concurrency       {exact} = {mc:.4}");
        if let Some(v) = r.kv_cache_size_tokens_vllm.filter(|&v| v != tokens) {
            let _ = writeln!(
                s,
                "note: vLLM's float product reports {} tokens",
                thousands(v)
            );
        }
        let _ = writeln!(
            s,
            "GPU KV cache size: {} tokens, Maximum concurrency for {} tokens per request: {mc:.2}x",
            thousands(tokens),
            thousands(r.max_model_len)
        );
    }
    if let Some(c) = &r.cpu {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "CPU tier              {} bytes, {} GPU block(s) per chunk",
            thousands(c.cpu_bytes),
            c.blocks_per_chunk
        );
        let _ = writeln!(
            s,
            "chunk bytes           {} (aligned {})",
            thousands(c.kv_bytes_per_chunk),
            thousands(c.aligned_chunk_bytes)
        );
        let _ = writeln!(s, "cpu_num_chunks        {}", thousands(c.num_chunks));
        let _ = writeln!(
            s,
            "cpu_kv_cache_size_bytes  {}",
            thousands(c.kv_cache_size_bytes)
        );
        let tokens = c
            .kv_cache_size_tokens
            .map_or_else(|| "None".to_owned(), thousands);
        let _ = writeln!(s, "CPU KV cache size: {tokens} tokens");
    }
    s
}

/// The report as one pretty-printed JSON object (fields in declaration order).
///
/// # Errors
/// serde_json's error (not expected: every field is a plain number, string or null).
pub(crate) fn report_json(r: &CapacityReport) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(r)
}

/// Runs `kvtier capacity`.
///
/// # Errors
/// Any error of reading the layout or computing the figures.
pub(crate) fn run(args: &CapacityArgs, out: &mut dyn Write) -> Result<(), crate::Error> {
    let r = report(&args.options)?;
    if args.json {
        writeln!(out, "{}", report_json(&r)?).map_err(OutputError::Write)?;
    } else {
        write!(out, "{}", render_table(&r)).map_err(OutputError::Write)?;
    }
    Ok(())
}
