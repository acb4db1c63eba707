//! Replaying one trace under many configurations, in parallel: "how big should the CPU tier
//! be, with which policy?".
//!
//! A sweep is the cross product of capacities, policies and store thresholds
//! ([`SweepGrid::cases`]). [`run`](fn@run) replays every case from its own cursor over one shared,
//! already parsed trace (a source factory that is `Sync`), on `jobs` threads that take cases
//! from a shared counter, so the parse is never repeated per case and memory is the trace plus
//! one manager per thread. Each case is exactly the single replay of that configuration.
//!
//! [`repeat_bound`] gives the infinite-cache bound (every block whose key appeared in an
//! earlier request hits), [`Sweep::knee`] the smallest capacity within a margin of the best
//! hit rate, [`geometric_capacities`] a log-spaced capacity range.
//!
//! What `kvtier sweep` runs, one child module each: a whole sweep of one trace file into a
//! [`SweepReport`] ([`sweep`], with the curve methods of [`Method`]: exact, stack distances,
//! sampling), the simple CPU offloader at many pool sizes ([`sweep_simple`]), and the
//! hit-rate plot ([`plot`]).
//!
//! ```
//! use kvtier_cli::replay::Replayer;
//! use kvtier_cli::sweep::{CaseReplay, SweepGrid, run};
//! use kvtier_cli::trace::OwnedRecord;
//! use kvtier_cli::workload::{Generator, GeneratorConfig};
//! use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};
//!
//! let records: Vec<OwnedRecord> = Generator::new(GeneratorConfig::new(1, 500))?.into_owned_records().collect();
//! let grid = SweepGrid {
//!     capacities: vec![64, 256],
//!     policies: vec![PolicyKind::Lru, PolicyKind::Arc],
//!     thresholds: vec![1],
//! };
//! let make_replayer = |case: &kvtier_cli::sweep::SweepCase| -> Result<CaseReplay, kvtier_cli::sweep::CaseError> {
//!     let mut cfg = ManagerConfig::new(case.capacity);
//!     cfg.policy = case.policy;
//!     cfg.store_threshold = case.threshold;
//!     Ok(Replayer::new(OffloadManager::new(cfg)?, 16).into())
//! };
//! let records = || records.iter().map(|r| r.as_record());
//! let sweep = run(&grid.cases(), 2, &make_replayer, &records, &|_| {})?;
//! assert_eq!(sweep.points.len(), 4);
//! assert!(sweep.points[1].counts.hit_blocks >= sweep.points[0].counts.hit_blocks);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod curve;
pub mod plot;
mod run;
mod simple;

pub(crate) use curve::points;
pub use curve::{
    Checkpoint, CurveRunError, MAX_SEEN_KEYS, Method, MethodError, MethodPoints, MethodSpec, Source,
};
pub use run::{
    ChunkBytesError, GridError, SweepOptions, SweepReport, SweepRow, SweepRunError, sweep,
};
pub use simple::{SimpleSweepReport, SimpleSweepRow, sweep_simple};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kvtier_core::hashing::Set;
use kvtier_core::manager::PolicyKind;

use crate::engine::{Engine, EngineError};
use crate::replay::{ReplayCounts, ReplayError, Replayer};
use crate::tier::TierConnector;
use crate::trace::Record;

/// The configurations of a sweep, as three lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepGrid {
    /// Tier sizes in chunks.
    pub capacities: Vec<u32>,
    /// Eviction policies.
    pub policies: Vec<PolicyKind>,
    /// Store thresholds (0 or 1: no filter).
    pub thresholds: Vec<u32>,
}

impl SweepGrid {
    /// Every configuration: for each policy, each threshold, each capacity (in the lists'
    /// order), so one policy/threshold line is contiguous.
    #[must_use]
    pub fn cases(&self) -> Vec<SweepCase> {
        let mut out = Vec::new();
        for &policy in &self.policies {
            for &threshold in &self.thresholds {
                for &capacity in &self.capacities {
                    out.push(SweepCase {
                        capacity,
                        policy,
                        threshold,
                    });
                }
            }
        }
        out
    }
}

/// One configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SweepCase {
    /// Tier size in chunks.
    pub capacity: u32,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Store threshold.
    pub threshold: u32,
}

/// The replay of one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepPoint {
    /// The configuration.
    pub case: SweepCase,
    /// What the replay counted.
    pub counts: ReplayCounts,
    /// Chunks resident at the end.
    pub resident_blocks: u32,
}

/// A whole sweep: one point per case, in the cases' order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// The points.
    pub points: Vec<SweepPoint>,
}

impl Sweep {
    /// The point with the smallest capacity whose block hit rate is within `margin` (a
    /// fraction, e.g. 0.01 for one percentage point) of the best over the sweep; ties go to
    /// the earlier case. `None` for an empty sweep.
    #[must_use]
    pub fn knee(&self, margin: f64) -> Option<&SweepPoint> {
        let best = self
            .points
            .iter()
            .map(|p| p.counts.block_hit_rate())
            .fold(f64::NEG_INFINITY, f64::max);
        self.points
            .iter()
            .filter(|p| p.counts.block_hit_rate() >= best - margin)
            .min_by_key(|p| p.case.capacity)
    }
}

/// Why a sweep failed: the first case that did, and why.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SweepError {
    /// The manager (or replayer) of a case could not be built.
    Manager {
        /// The case.
        case: SweepCase,
        /// Why: the factory's error.
        error: Arc<dyn core::error::Error + Send + Sync>,
    },
    /// A record could not be replayed.
    Replay {
        /// The case.
        case: SweepCase,
        /// The 1-based record.
        record: u64,
        /// Why.
        error: ReplayError,
    },
    /// The GPU front of a case stopped (`--gpu-blocks`).
    Engine {
        /// The case.
        case: SweepCase,
        /// The 1-based record (the record count at the trace's end).
        record: u64,
        /// Why.
        error: EngineError<ReplayError>,
    },
    /// A worker thread could not be started or panicked.
    Thread(String),
}

impl core::fmt::Display for SweepError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let name = |c: &SweepCase| {
            format!(
                "{} capacity {} threshold {}",
                c.policy.name(),
                c.capacity,
                c.threshold
            )
        };
        match self {
            SweepError::Manager { case, error } => write!(f, "{}: {error}", name(case)),
            SweepError::Replay {
                case,
                record,
                error,
            } => write!(f, "{}: record {record}: {error}", name(case)),
            SweepError::Engine {
                case,
                record,
                error,
            } => write!(f, "{}: record {record}: {error}", name(case)),
            SweepError::Thread(m) => write!(f, "sweep thread: {m}"),
        }
    }
}

impl core::error::Error for SweepError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            SweepError::Replay { error, .. } => Some(error),
            SweepError::Engine { error, .. } => Some(error),
            SweepError::Manager { error, .. } => Some(error.as_ref()),
            SweepError::Thread(_) => None,
        }
    }
}

/// What replays one case: the tier's replayer, alone or behind a GPU front.
#[derive(Debug)]
pub struct CaseReplay {
    /// The tier's replayer.
    pub replayer: Replayer,
    /// The GPU front (`--gpu-blocks`): the replayer then sees only the GPU's misses.
    pub engine: Option<Engine>,
}

impl From<Replayer> for CaseReplay {
    fn from(replayer: Replayer) -> Self {
        CaseReplay {
            replayer,
            engine: None,
        }
    }
}

/// Replays `records` through `case` to the end: the tier's counts and the chunks resident.
///
/// # Errors
/// The 1-based record that could not be replayed (the record count for the GPU front's
/// last steps), and why: a replayer's error is [`EngineError::Connector`].
pub fn replay_one<'a>(
    case: CaseReplay,
    records: impl Iterator<Item = Record<'a>>,
) -> Result<(ReplayCounts, u32), (u64, EngineError<ReplayError>)> {
    let CaseReplay {
        mut replayer,
        mut engine,
    } = case;
    let mut keys = Vec::new();
    let mut n = 0;
    for (i, record) in records.enumerate() {
        n = i as u64 + 1;
        match engine.as_mut() {
            Some(e) => {
                let mut tier = TierConnector::new(None, &mut replayer, &mut keys);
                e.apply(record, &mut tier).map_err(|e| (n, e))?;
            }
            None => replayer
                .apply(record)
                .map_err(|e| (n, EngineError::Connector(e)))?,
        }
    }
    if let Some(e) = engine.as_mut() {
        let mut tier = TierConnector::new(None, &mut replayer, &mut keys);
        e.finish(&mut tier).map_err(|e| (n, e))?;
    }
    Ok((replayer.counts(), replayer.manager().inspect().allocated()))
}

/// Why the replayer of a case could not be built: any error of the caller's factory.
pub type CaseError = Box<dyn core::error::Error + Send + Sync>;

/// The replayer (its manager, block size and limits, and its GPU front if any) of a case.
pub type MakeReplayer<'a> = dyn Fn(&SweepCase) -> Result<CaseReplay, CaseError> + Sync + 'a;

/// Replays every case on `jobs` threads (at least 1), each case from a fresh iterator of
/// `records` (which must give the same records every time: a cursor over a parsed trace).
/// `done` is called after each case (from the worker threads, in completion order).
///
/// # Errors
/// [`SweepError`] for the first case (in case order) that failed; the other cases stop early.
pub fn run<'t, I, F>(
    cases: &[SweepCase],
    jobs: usize,
    make_replayer: &MakeReplayer<'_>,
    records: &F,
    done: &(dyn Fn(&SweepPoint) + Sync),
) -> Result<Sweep, SweepError>
where
    F: Fn() -> I + Sync,
    I: Iterator<Item = Record<'t>>,
{
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let slots: Mutex<Vec<Option<Result<SweepPoint, SweepError>>>> =
        Mutex::new(vec![None; cases.len()]);
    let work = || {
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&case) = cases.get(i) else { break };
            let result = make_replayer(&case)
                .map_err(|e| SweepError::Manager {
                    case,
                    error: Arc::from(e),
                })
                .and_then(|r| {
                    replay_one(r, records()).map_err(|(record, error)| match error {
                        EngineError::Connector(error) => SweepError::Replay {
                            case,
                            record,
                            error,
                        },
                        error => SweepError::Engine {
                            case,
                            record,
                            error,
                        },
                    })
                })
                .map(|(counts, resident_blocks)| SweepPoint {
                    case,
                    counts,
                    resident_blocks,
                });
            match &result {
                Ok(point) => done(point),
                Err(_) => stop.store(true, Ordering::Relaxed),
            }
            // A poisoned lock only means another worker panicked; its slot stays empty.
            let mut guard = slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(slot) = guard.get_mut(i) {
                *slot = Some(result);
            }
        }
    };
    let threads = jobs.clamp(1, cases.len().max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|n| {
                std::thread::Builder::new()
                    .name(format!("kvtier-sweep-{n}"))
                    .spawn_scoped(scope, work)
            })
            .collect();
        for h in handles {
            match h {
                Ok(h) => h
                    .join()
                    .map_err(|_| SweepError::Thread("a worker panicked".into()))?,
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(SweepError::Thread(e.to_string()));
                }
            }
        }
        Ok(())
    })?;
    let slots = slots
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut points = Vec::with_capacity(cases.len());
    for slot in slots {
        match slot {
            Some(Ok(p)) => points.push(p),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    if points.len() != cases.len() {
        return Err(SweepError::Thread("a case was not replayed".into()));
    }
    Ok(Sweep { points })
}

/// The infinite-cache bound of a trace: `(repeated, blocks)`, the request blocks whose key
/// appeared in an earlier request (or earlier in the same one) and all request blocks. No
/// capacity or policy hits more than `repeated`.
#[must_use]
pub fn repeat_bound<'a>(records: impl Iterator<Item = Record<'a>>) -> (u64, u64) {
    let mut seen: Set<u64> = Set::default();
    let (mut repeated, mut blocks) = (0u64, 0u64);
    for record in records {
        if let Record::Load { hashes, .. } = record {
            for &h in hashes {
                blocks += 1;
                if !seen.insert(h) {
                    repeated += 1;
                }
            }
        }
    }
    (repeated, blocks)
}

/// Why [`geometric_capacities`] refused a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeError {
    /// `from` is 0, `from > to`, or `steps` is 0.
    Bounds {
        /// The smallest capacity.
        from: u32,
        /// The largest capacity.
        to: u32,
        /// The number of capacities.
        steps: u32,
    },
    /// One step, but `from != to`.
    OneStep,
}

impl core::fmt::Display for RangeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RangeError::Bounds { from, to, steps } => write!(
                f,
                "need 1 <= from <= to and steps >= 1 (from {from}, to {to}, steps {steps})"
            ),
            RangeError::OneStep => f.write_str("one step needs from == to"),
        }
    }
}

impl core::error::Error for RangeError {}

/// `steps` capacities from `from` to `to`, evenly spaced on a log scale, rounded to whole
/// chunks, without repeats (so fewer than `steps` when the range is narrow).
///
/// ```
/// use kvtier_cli::sweep::{RangeError, geometric_capacities};
/// assert_eq!(geometric_capacities(256, 65_536, 5), Ok(vec![256, 1024, 4096, 16_384, 65_536]));
/// assert_eq!(geometric_capacities(1, 3, 5), Ok(vec![1, 2, 3]));
/// assert_eq!(geometric_capacities(4, 8, 1), Err(RangeError::OneStep));
/// ```
///
/// # Errors
/// [`RangeError`] when `from` is 0, `from > to`, or `steps` is 0 (1 step needs `from == to`).
pub fn geometric_capacities(from: u32, to: u32, steps: u32) -> Result<Vec<u32>, RangeError> {
    if from == 0 || from > to || steps == 0 {
        return Err(RangeError::Bounds { from, to, steps });
    }
    if steps == 1 {
        return if from == to {
            Ok(vec![from])
        } else {
            Err(RangeError::OneStep)
        };
    }
    let (lo, hi) = (f64::from(from).ln(), f64::from(to).ln());
    let mut out: Vec<u32> = Vec::with_capacity(steps as usize);
    for i in 0..steps {
        let x = (lo + (hi - lo) * f64::from(i) / f64::from(steps - 1)).exp();
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "rounded and clamped to [from, to]"
        )]
        let c = (x.round() as u32).clamp(from, to);
        if out.last() != Some(&c) {
            out.push(c);
        }
    }
    Ok(out)
}
