//! `kvtier sweep`: replays one trace (kvtrace or Mooncake JSONL) under many capacities,
//! policies and store thresholds, in parallel, and prints the hit-rate table (or CSV, JSON)
//! and draws the curve: "how many GiB of CPU tier, with which policy?".
//!
//! The trace is parsed once into a [`CompactTrace`]; every configuration replays its own
//! cursor over it ([`crate::sweep::run`]), with the manager `kvtier replay` builds for the
//! same options, so each row equals that single replay.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvtier_core::manager::PolicyKind;
use serde::Serialize;

use super::capacity::{CapacityArgs, ModelArgs, report, thousands};
use super::input::FormatArgs;
use super::replay::{ReplayArgs, parse_policy};
use crate::plot::{KNEE_MARGIN, PlotSpec, draw, parse_size};
use crate::replay::{DEFAULT_MAX_OPEN_BLOCKS, Replayer};
use crate::sweep::{Sweep, SweepCase, SweepGrid, SweepPoint, geometric_capacities, repeat_bound};
use crate::trace::{CompactLimits, CompactTrace};

/// Options of `kvtier sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// The trace, kvtrace or Mooncake JSONL (see --format).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The trace's format and the Mooncake timing model.
    #[command(flatten)]
    pub input: FormatArgs,
    /// Tokens per block (default: the trace header's `block_tokens`; 512 for Mooncake).
    #[arg(long, value_name = "N")]
    pub block_tokens: Option<u32>,
    /// Capacities in chunks, comma-separated (or --from/--to/--steps).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", conflicts_with_all = ["from", "to", "steps"])]
    pub capacities: Vec<u32>,
    /// Smallest capacity of a geometric range, in chunks.
    #[arg(long, value_name = "N", requires_all = ["to", "steps"])]
    pub from: Option<u32>,
    /// Largest capacity of a geometric range, in chunks.
    #[arg(long, value_name = "N", requires_all = ["from", "steps"])]
    pub to: Option<u32>,
    /// Capacities in the geometric range (evenly spaced on a log scale).
    #[arg(long, value_name = "N", requires_all = ["from", "to"])]
    pub steps: Option<u32>,
    /// Eviction policies, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "lru,arc", value_parser = parse_policy)]
    pub policies: Vec<PolicyKind>,
    /// Store thresholds, comma-separated (0 or 1: no filter).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1",
        value_name = "T,T,..."
    )]
    pub thresholds: Vec<u32>,
    /// Size of the reuse tracker.
    #[arg(long, default_value_t = 64_000, value_name = "M")]
    pub max_tracker_size: u32,
    /// Requests in flight each manager can hold at once.
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub max_requests: u32,
    /// Blocks each replayer holds over the requests open at once (see `kvtier replay`).
    #[arg(long, default_value_t = DEFAULT_MAX_OPEN_BLOCKS, value_name = "N")]
    pub max_open_blocks: u64,
    /// The most records of the trace held in memory (24 bytes each).
    #[arg(long, default_value_t = 100_000_000, value_name = "N")]
    pub max_records: u64,
    /// The most block hashes of the trace held in memory (8 bytes each).
    #[arg(long, default_value_t = 400_000_000, value_name = "N")]
    pub max_hashes: u64,
    /// Threads (default: every core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// The model, to show each capacity as CPU memory (as `kvtier capacity` takes it).
    #[command(flatten)]
    pub source: ModelArgs,
    /// The model's GPU block size in tokens (a chunk of the trace is `block_tokens /
    /// block_size` GPU blocks).
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Print CSV instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw the hit-rate curve to this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The plot's size in pixels.
    #[arg(long, default_value = "1200x750", value_parser = parse_size, value_name = "WxH")]
    pub plot_size: (u32, u32),
}

/// One row of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepRow {
    /// Capacity in chunks.
    pub capacity: u32,
    /// The capacity as CPU memory in GiB (with a model).
    pub gib: Option<f64>,
    /// The policy.
    pub policy: &'static str,
    /// The store threshold.
    pub store_threshold: u32,
    /// hit blocks / request blocks.
    pub block_hit_rate: f64,
    /// hit requests / requests.
    pub request_hit_rate: f64,
    /// hit blocks · tokens per chunk.
    pub prefill_tokens_saved: u64,
    /// Blocks evicted.
    pub evicted_blocks: u64,
    /// Stores the reuse filter rejected (null without a filter).
    pub stores_skipped: Option<u64>,
    /// `prepare_store` calls that failed.
    pub store_failures: u64,
    /// Requests.
    pub requests: u64,
    /// Request blocks.
    pub request_blocks: u64,
    /// Hit blocks.
    pub hit_blocks: u64,
    /// Hit requests.
    pub hit_requests: u64,
    /// Stored blocks.
    pub stored_blocks: u64,
    /// Lookups that stopped at a pending block.
    pub stopped_at_pending: u64,
    /// Chunks resident at the end.
    pub resident_blocks: u32,
    /// The hit digest, 16 hex digits.
    pub digest: String,
}

/// Everything `kvtier sweep` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    /// The trace file.
    pub trace: String,
    /// `kvtrace` or `mooncake`.
    pub format: &'static str,
    /// Tokens per chunk.
    pub block_tokens: u32,
    /// The model, when given.
    pub model: Option<String>,
    /// Exact CPU bytes per chunk of the model (page aligned), when given.
    pub bytes_per_chunk: Option<u64>,
    /// Requests of the trace.
    pub requests: u64,
    /// Request blocks of the trace.
    pub request_blocks: u64,
    /// Request blocks whose key appeared before (the infinite-cache bound's hits).
    pub repeated_blocks: u64,
    /// repeated_blocks / request_blocks.
    pub infinite_cache_hit_rate: f64,
    /// The smallest capacity within one point of the best block hit rate.
    pub knee: Option<SweepRow>,
    /// Threads used.
    pub jobs: usize,
    /// Seconds parsing the trace (once).
    pub parse_s: f64,
    /// Seconds replaying every configuration.
    pub sweep_s: f64,
    /// Seconds in all, plot included.
    pub wall_s: f64,
    /// Heap bytes of the parsed trace.
    pub trace_heap_bytes: u64,
    /// The rows, per policy and threshold, by capacity.
    pub rows: Vec<SweepRow>,
    /// The sweep itself.
    #[serde(skip)]
    pub sweep: Sweep,
}

impl SweepArgs {
    /// The capacities: `--capacities`, or the geometric `--from/--to/--steps`.
    ///
    /// # Errors
    /// A message naming the option at fault.
    pub fn capacity_list(&self) -> Result<Vec<u32>, String> {
        match (self.from, self.to, self.steps) {
            (Some(from), Some(to), Some(steps)) => geometric_capacities(from, to, steps)
                .map_err(|e| format!("--from/--to/--steps: {e}")),
            _ if self.capacities.is_empty() => {
                Err("give --capacities a,b,c or --from N --to N --steps N".into())
            }
            _ => Ok(self.capacities.clone()),
        }
    }

    /// The grid of configurations.
    ///
    /// # Errors
    /// A message naming the option at fault.
    pub fn grid(&self) -> Result<SweepGrid, String> {
        if self.policies.is_empty() {
            return Err("--policies: give at least one".into());
        }
        if self.thresholds.is_empty() {
            return Err("--thresholds: give at least one".into());
        }
        Ok(SweepGrid {
            capacities: self.capacity_list()?,
            policies: self.policies.clone(),
            thresholds: self.thresholds.clone(),
        })
    }

    /// The options of the single `kvtier replay` of `case` (whose manager the sweep uses).
    #[must_use]
    pub fn replay_args(&self, case: &SweepCase) -> ReplayArgs {
        ReplayArgs {
            trace: Some(self.trace.clone()),
            input: self.input.clone(),
            requests: 0,
            seed: 0,
            policy: case.policy,
            capacity: Some(case.capacity),
            store_threshold: case.threshold,
            max_tracker_size: self.max_tracker_size,
            max_requests: self.max_requests,
            max_open_blocks: self.max_open_blocks,
            // Each case's manager is limited by the machine's available memory, as a single
            // `kvtier replay` is.
            memory_limit: None,
            block_tokens: self.block_tokens,
            json: false,
            metrics: false,
            model_name: String::new(),
            log_interval: None,
            transfer: crate::replay_stats::TransferArgs::default(),
        }
    }

    /// The model's exact CPU bytes per chunk of `block_tokens` tokens, through `kvtier
    /// capacity`'s layout loading and the core's CPU-tier sizing; `None` without a model.
    ///
    /// # Errors
    /// A message for a bad model, or `block_tokens` not a multiple of `--block-size`.
    pub fn bytes_per_chunk(&self, block_tokens: u32) -> Result<Option<(String, u64)>, String> {
        if !self.source.is_given() {
            return Ok(None);
        }
        if self.block_size == 0 || !block_tokens.is_multiple_of(self.block_size) {
            return Err(format!(
                "--block-size {}: a chunk of the trace is {block_tokens} tokens, which must be a \
                 whole number of GPU blocks",
                self.block_size
            ));
        }
        let args = CapacityArgs {
            source: self.source.clone(),
            block_size: self.block_size,
            max_model_len: Some(u64::from(block_tokens)),
            cpu_bytes: Some(1 << 40),
            blocks_per_chunk: u64::from(block_tokens / self.block_size),
            workers: 1,
            world_size: 1,
            ..CapacityArgs::default()
        };
        let r = report(&args).map_err(|e| e.to_string())?;
        let cpu = r.cpu.ok_or("the CPU tier could not be sized")?;
        if cpu.aligned_chunk_bytes == 0 {
            return Err(format!("{}: a chunk holds no bytes", r.model));
        }
        Ok(Some((r.model, cpu.aligned_chunk_bytes)))
    }
}

fn row(p: &SweepPoint, block_tokens: u32, bytes_per_chunk: Option<u64>) -> SweepRow {
    let c = &p.counts;
    #[expect(clippy::cast_precision_loss, reason = "a size for people")]
    let gib =
        bytes_per_chunk.map(|b| f64::from(p.case.capacity) * b as f64 / f64::from(1u32 << 30));
    SweepRow {
        capacity: p.case.capacity,
        gib,
        policy: p.case.policy.name(),
        store_threshold: p.case.threshold,
        block_hit_rate: c.block_hit_rate(),
        request_hit_rate: c.request_hit_rate(),
        prefill_tokens_saved: c.hit_blocks.saturating_mul(u64::from(block_tokens)),
        evicted_blocks: c.evicted_blocks,
        stores_skipped: c.stores_skipped,
        store_failures: c.store_failures,
        requests: c.requests,
        request_blocks: c.request_blocks,
        hit_blocks: c.hit_blocks,
        hit_requests: c.hit_requests,
        stored_blocks: c.stored_blocks,
        stopped_at_pending: c.stopped_at_pending,
        resident_blocks: p.resident_blocks,
        digest: format!("{:016x}", c.digest),
    }
}

fn progress_bar(show: bool, len: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} sweep [{bar:40}] {pos}/{len} configurations ({eta})",
    ) {
        b.set_style(style);
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// Runs the sweep `args` describe and draws the plot if asked; `progress` shows a bar on
/// stderr.
///
/// # Errors
/// Any error of the options, the trace, a replay or the plot, as text.
pub fn sweep(args: &SweepArgs, progress: bool) -> Result<SweepReport, String> {
    let started = Instant::now();
    let grid = args.grid()?;
    let cases = grid.cases();
    let path = &args.trace;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut input = args.input.open_path(path, args.block_tokens, true, |f| f)?;
    let format = input.format();
    let limits = CompactLimits::new(args.max_records, args.max_hashes);
    let trace = CompactTrace::read_from(&mut input, limits).map_err(|e| at(&e))?;
    drop(input);
    let parse_s = started.elapsed().as_secs_f64();
    let block_tokens = args.block_tokens.unwrap_or(trace.header().block_tokens);
    let model = args.bytes_per_chunk(block_tokens)?;
    let bytes_per_chunk = model.as_ref().map(|(_, b)| *b);

    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let bar = progress_bar(progress, cases.len());
    let make_replayer = |case: &SweepCase| -> Result<Replayer, String> {
        let (manager, _) = args.replay_args(case).manager(None)?;
        Ok(Replayer::new(manager, u64::from(block_tokens))
            .with_max_open_blocks(args.max_open_blocks))
    };
    let t = Instant::now();
    let result = crate::sweep::run(&cases, jobs, &make_replayer, &|| trace.cursor(), &|_| {
        bar.inc(1)
    });
    bar.finish_and_clear();
    let sweep = result.map_err(|e| at(&e))?;
    let sweep_s = t.elapsed().as_secs_f64();
    let (repeated, blocks) = repeat_bound(trace.cursor());
    #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
    let bound = if blocks == 0 {
        0.0
    } else {
        repeated as f64 / blocks as f64
    };

    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if let Some(plot) = &args.plot {
        let spec = PlotSpec {
            sweep: &sweep,
            trace: name.clone(),
            block_tokens: u64::from(block_tokens),
            bound: Some(bound),
            model: model.clone(),
            size: args.plot_size,
        };
        draw(&spec, plot).map_err(|e| e.to_string())?;
    }
    let rows: Vec<SweepRow> = sweep
        .points
        .iter()
        .map(|p| row(p, block_tokens, bytes_per_chunk))
        .collect();
    Ok(SweepReport {
        trace: path.display().to_string(),
        format: format.name(),
        block_tokens,
        model: model.map(|(m, _)| m),
        bytes_per_chunk,
        requests: trace.requests(),
        request_blocks: blocks,
        repeated_blocks: repeated,
        infinite_cache_hit_rate: bound,
        knee: sweep
            .knee(KNEE_MARGIN)
            .map(|p| row(p, block_tokens, bytes_per_chunk)),
        jobs,
        parse_s,
        sweep_s,
        wall_s: started.elapsed().as_secs_f64(),
        trace_heap_bytes: trace.heap_bytes(),
        rows,
        sweep,
    })
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// The table for people.
#[must_use]
pub fn table(r: &SweepReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kvtier sweep: {} ({}, {} requests, {} request blocks of {} tokens)",
        r.trace,
        r.format,
        thousands(r.requests),
        thousands(r.request_blocks),
        r.block_tokens
    );
    if let (Some(m), Some(b)) = (&r.model, r.bytes_per_chunk) {
        let _ = writeln!(
            s,
            "model {m}: {} bytes of CPU memory per chunk",
            thousands(b)
        );
    }
    let _ = writeln!(
        s,
        "infinite-cache bound: {} of blocks (every repeated block hits)",
        pct(r.infinite_cache_hit_rate)
    );
    let _ = writeln!(
        s,
        "{} configurations on {} threads: trace parsed once in {:.3} s, replays {:.3} s, \
         wall {:.3} s",
        r.rows.len(),
        r.jobs,
        r.parse_s,
        r.sweep_s,
        r.wall_s
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>10} {:>9} {:>6} {:>9} {:>10} {:>11} {:>15} {:>11} {:>14} {:>14}",
        "capacity",
        "GiB",
        "policy",
        "threshold",
        "block hit",
        "request hit",
        "prefill saved",
        "evictions",
        "stores skipped",
        "store failures"
    );
    for row in &r.rows {
        let gib = row
            .gib
            .map_or_else(|| "-".to_owned(), |g| format!("{g:.1}"));
        let skipped = row.stores_skipped.map_or_else(|| "-".to_owned(), thousands);
        let _ = writeln!(
            s,
            "{:>10} {:>9} {:>6} {:>9} {:>10} {:>11} {:>15} {:>11} {:>14} {:>14}",
            thousands(u64::from(row.capacity)),
            gib,
            row.policy,
            row.store_threshold,
            pct(row.block_hit_rate),
            pct(row.request_hit_rate),
            thousands(row.prefill_tokens_saved),
            thousands(row.evicted_blocks),
            skipped,
            thousands(row.store_failures)
        );
    }
    if let Some(k) = &r.knee {
        let gib = k.gib.map_or_else(String::new, |g| format!(" = {g:.1} GiB"));
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "smallest capacity within 1 point of the best: {} chunks{gib} ({}, threshold {}, \
             {} of blocks)",
            thousands(u64::from(k.capacity)),
            k.policy,
            k.store_threshold,
            pct(k.block_hit_rate)
        );
    }
    s
}

/// The rows as CSV, with a header line.
#[must_use]
pub fn csv(r: &SweepReport) -> String {
    let mut s = String::from(
        "capacity,gib,policy,store_threshold,block_hit_rate,request_hit_rate,\
         prefill_tokens_saved,evicted_blocks,stores_skipped,store_failures,requests,\
         request_blocks,hit_blocks,hit_requests,stored_blocks,stopped_at_pending,\
         resident_blocks,digest\n",
    );
    for row in &r.rows {
        let opt = |v: Option<String>| v.unwrap_or_default();
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            row.capacity,
            opt(row.gib.map(|g| format!("{g:.3}"))),
            row.policy,
            row.store_threshold,
            row.block_hit_rate,
            row.request_hit_rate,
            row.prefill_tokens_saved,
            row.evicted_blocks,
            opt(row.stores_skipped.map(|v| v.to_string())),
            row.store_failures,
            row.requests,
            row.request_blocks,
            row.hit_blocks,
            row.hit_requests,
            row.stored_blocks,
            row.stopped_at_pending,
            row.resident_blocks,
            row.digest
        );
    }
    s
}

/// Runs `kvtier sweep`.
///
/// # Errors
/// See [`sweep`].
pub fn run(args: &SweepArgs) -> Result<(), String> {
    let r = sweep(args, std::io::stderr().is_terminal())?;
    let text = if args.json {
        let mut t = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
        t.push('\n');
        t
    } else if args.csv {
        csv(&r)
    } else {
        table(&r)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| format!("writing the report: {e}"))
}
