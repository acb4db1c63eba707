//! `kvtier convert --from mooncake IN -o OUT`: writes the kvtrace of a Mooncake JSONL trace
//! (`spec/mooncake.md`), records exactly the spec's, with the header it lists.
//!
//! The input is read twice: once to check every line and count the requests (so the header
//! can carry `requests`, `records` and `skipped`, and a bad line leaves no output), then to
//! write.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use super::input::{TimingArgs, TraceFormat};
use crate::trace::{MooncakeReader, TraceWriter};

/// `--from` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FromArg {
    /// Mooncake-style JSONL.
    Mooncake,
}

/// Options of `kvtier convert`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertArgs {
    /// The input's format.
    #[arg(long, value_enum)]
    pub from: FromArg,
    /// The input trace.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// The kvtrace to write.
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
    /// Tokens per hash id.
    #[arg(long, default_value_t = crate::trace::DEFAULT_MOONCAKE_BLOCK_TOKENS, value_name = "N")]
    pub block_tokens: u32,
    /// The timing model.
    #[command(flatten)]
    pub timing: TimingArgs,
}

/// What a conversion wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Requests written (`L` records).
    pub requests: u64,
    /// Requests skipped (no full block).
    pub skipped: u64,
    /// Records written.
    pub records: u64,
    /// Full blocks over all requests.
    pub blocks: u64,
}

/// Converts as `args` say.
///
/// # Errors
/// A message naming the file and line at fault; the output is not created (or is removed)
/// when the input is malformed or writing fails.
pub fn convert(args: &ConvertArgs) -> Result<ConvertSummary, String> {
    let FromArg::Mooncake = args.from;
    let timing = args.timing.timing(Some(args.block_tokens));
    let input = &args.input;
    let at = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let open = || -> Result<MooncakeReader<BufReader<File>>, String> {
        let file = File::open(input).map_err(|e| at(input, &e))?;
        MooncakeReader::new(BufReader::with_capacity(1 << 16, file), timing)
            .map_err(|e| format!("--block-tokens / --prefill-tokens-per-s: {e}"))
    };
    // Pass 1: check every line and count.
    let mut check = open()?;
    while check.next_record().map_err(|e| at(input, &e))?.is_some() {}
    let mut header = check.header().clone();
    header.requests = Some(check.requests());
    header.records = Some(check.requests().saturating_mul(3));
    header
        .extra
        .push(("skipped".to_owned(), check.skipped().to_string()));
    let summary = ConvertSummary {
        requests: check.requests(),
        skipped: check.skipped(),
        records: check.requests().saturating_mul(3),
        blocks: check.blocks(),
    };
    // Pass 2: write.
    let out = &args.output;
    let write = || -> Result<(), String> {
        let file = File::create(out).map_err(|e| at(out, &e))?;
        let mut writer =
            TraceWriter::new(BufWriter::new(file), &header).map_err(|e| at(out, &e))?;
        let mut reader = open()?;
        while let Some(rec) = reader.next_record().map_err(|e| at(input, &e))? {
            writer.write_record(&rec).map_err(|e| at(out, &e))?;
        }
        writer.finish().map_err(|e| at(out, &e))?;
        Ok(())
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(out);
    })?;
    Ok(summary)
}

/// Runs `kvtier convert`.
///
/// # Errors
/// See [`convert`].
pub fn run(args: &ConvertArgs) -> Result<(), String> {
    let s = convert(args)?;
    eprintln!(
        "kvtier convert: {} -> {} ({}): {} requests, {} skipped (no full block), {} records, \
         {} blocks",
        args.input.display(),
        args.output.display(),
        TraceFormat::Kvtrace.name(),
        s.requests,
        s.skipped,
        s.records,
        s.blocks
    );
    Ok(())
}
