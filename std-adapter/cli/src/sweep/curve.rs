//! The curve methods of `kvtier sweep` (`--method stack|sample`): the core's one-pass LRU
//! stack and its sampled curves, fed from the parsed trace, and the checkpoint replays that
//! show a sampled curve's error.
//!
//! - `stack`: one pass gives the LRU curve (store threshold 0 or 1) at every capacity up to
//!   the largest asked; each capacity the pass certifies takes its hit blocks, hit requests
//!   and digest from it, every other case (uncertified capacities, ARC, a store threshold) is
//!   replayed, so every row still equals `kvtier replay`.
//! - `sample`: the hottest keys (`--hot-keys` counters of a first pass) counted exactly, a
//!   fraction of the others (`--sample`) through miniature replays of every policy and
//!   threshold at every capacity, and exact replays at `--verify` checkpoints beside them.

use std::fmt;

use kvtier_core::curve::{
    Curve, CurveError, HotCounter, HotKeys, LruStack, SampledConfig, SampledCurves, Sink,
    StackConfig,
};
use kvtier_core::manager::PolicyKind;
use serde::Serialize;

use crate::replay::ReplayCounts;
use crate::replay::progress_bar;
use crate::sweep::{MakeReplayer, SweepCase, SweepError, SweepPoint};
use crate::trace::{CompactTrace, Record};

/// How `kvtier sweep` computes its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// One replay per configuration: every column exact (the default, since only replays
    /// give the eviction and store columns).
    #[default]
    Exact,
    /// The one-pass LRU stack at its certified capacities, replays elsewhere.
    Stack,
    /// Miniature replays of sampled keys, with exact checkpoints beside them.
    Sample,
}

/// Why a curve pass failed.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum CurveRunError {
    /// The core's curve refused a record or its configuration.
    Curve(CurveError),
    /// `--sample` outside `(0, 1]`.
    Rate(f64),
}

impl fmt::Display for CurveRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CurveRunError::Curve(e) => write!(f, "curve: {e}"),
            CurveRunError::Rate(r) => write!(f, "--sample {r}: give a rate in (0, 1]"),
        }
    }
}

impl std::error::Error for CurveRunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CurveRunError::Curve(e) => Some(e),
            CurveRunError::Rate(_) => None,
        }
    }
}

impl From<CurveError> for CurveRunError {
    fn from(e: CurveError) -> Self {
        CurveRunError::Curve(e)
    }
}

/// Feeds every record of `trace` to `curve`, calling `tick` every 65,536 records.
fn feed(trace: &CompactTrace, curve: &mut impl Sink, tick: &dyn Fn(u64)) -> Result<(), CurveError> {
    for (i, rec) in trace.cursor().enumerate() {
        match rec {
            Record::Load { rid, hashes } => curve.lookup(rid, hashes)?,
            Record::Start { rid } => curve.store(rid)?,
            Record::Complete { rid } => curve.finish(rid)?,
        }
        if i % 65_536 == 65_535 {
            tick(65_536);
        }
    }
    Ok(())
}

/// The LRU curve of `trace` at every capacity up to `max` (one pass).
///
/// # Errors
/// [`CurveRunError`] when the stack refuses a record or its bounds.
pub(crate) fn stack_curve(
    trace: &CompactTrace,
    max: u32,
    max_requests: u32,
    tick: &dyn Fn(u64),
) -> Result<Curve, CurveRunError> {
    let mut cfg = StackConfig::new(max.max(1));
    cfg.max_open_requests = max_requests;
    let mut s = LruStack::new(cfg)?;
    feed(trace, &mut s, tick)?;
    Ok(s.curve()?)
}

/// Distinct sampled keys the control variate remembers (at most 64 MiB): past them the
/// estimates go uncorrected.
pub const MAX_SEEN_KEYS: u32 = 1 << 22;

/// The sampled curves of `trace` for one store threshold: miniature replays of `policies` at
/// `capacities`.
///
/// # Errors
/// [`CurveRunError`] for a bad rate or a record the curves refuse.
#[expect(
    clippy::too_many_arguments,
    reason = "the sweep's options, passed through"
)]
pub(crate) fn sampled(
    trace: &CompactTrace,
    rate: f64,
    capacities: &[u32],
    policies: &[PolicyKind],
    threshold: u32,
    block_tokens: u64,
    max_requests: u32,
    hot: &HotKeys,
    seed: u64,
    tick: &dyn Fn(u64),
) -> Result<SampledCurves, CurveRunError> {
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(CurveRunError::Rate(rate));
    }
    let cfg = SampledConfig {
        store_threshold: threshold,
        block_tokens,
        max_requests,
        seed,
        hot: hot.clone(),
        max_seen_keys: MAX_SEEN_KEYS,
        ..SampledConfig::new(rate, capacities.to_vec(), policies.to_vec())
    };
    let mut s = SampledCurves::new(&cfg)?;
    feed(trace, &mut s, tick)?;
    Ok(s)
}

/// The hot keys of `trace` from one counting pass in `k` counters (none for `k = 0`).
///
/// # Errors
/// [`CurveRunError::Curve`] when the counters cannot be had.
pub(crate) fn hot_keys(trace: &CompactTrace, k: u32) -> Result<HotKeys, CurveRunError> {
    if k == 0 {
        return Ok(HotKeys::default());
    }
    let mut h = HotCounter::new(k)?;
    for rec in trace.cursor() {
        if let Record::Load { hashes, .. } = rec {
            h.add_all(hashes);
        }
    }
    Ok(h.finish()?)
}

/// `n` checkpoints among `capacities` (sorted, distinct): evenly spread over their indices,
/// the largest always among them.
#[must_use]
pub(crate) fn checkpoints(capacities: &[u32], n: usize) -> Vec<u32> {
    let mut sorted = capacities.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if n == 0 || sorted.is_empty() {
        return Vec::new();
    }
    let len = sorted.len();
    let mut out: Vec<u32> = (1..=n.min(len))
        .map(|i| sorted[(i * len).div_ceil(n.min(len)) - 1])
        .collect();
    out.dedup();
    out
}

/// One checkpoint of a sampled curve: the estimate beside the exact replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Checkpoint {
    /// Capacity in chunks.
    pub capacity: u32,
    /// The policy.
    pub policy: &'static str,
    /// The store threshold.
    pub store_threshold: u32,
    /// The sampled estimate of the block hit rate.
    pub sampled_block_hit_rate: f64,
    /// The replay's block hit rate.
    pub exact_block_hit_rate: f64,
    /// `sampled − exact`, in percentage points.
    pub error_points: f64,
}

#[cfg(test)]
mod tests {
    use super::checkpoints;

    #[test]
    fn checkpoints_spread_over_the_capacities_and_end_at_the_largest() {
        assert_eq!(
            checkpoints(&[10, 20, 30, 40, 50, 60, 70, 80], 4),
            [20, 40, 60, 80]
        );
        assert_eq!(checkpoints(&[5, 1, 3], 8), [1, 3, 5]);
        assert_eq!(checkpoints(&[5, 1, 3], 1), [5]);
        assert!(checkpoints(&[5], 0).is_empty());
    }
}

/// Where a row's numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A replay of its configuration: every column exact.
    Replay,
    /// The LRU stack at a capacity it certifies: hit blocks, hit requests and digest exact,
    /// the eviction and store columns not computed.
    Stack,
    /// A miniature replay of sampled keys: the block hit rate is an estimate.
    Sample,
}

impl Source {
    /// Its name in tables.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Source::Replay => "replay",
            Source::Stack => "stack",
            Source::Sample => "sample",
        }
    }
}

/// The points of a sweep by one method, each with its source, and the checkpoints of a
/// sampled one.
#[derive(Debug)]
pub struct MethodPoints {
    /// One point per case, in the cases' order.
    pub points: Vec<(SweepPoint, Source)>,
    /// The sampled estimates beside exact replays (`sample` only).
    pub checkpoints: Vec<Checkpoint>,
    /// Cases replayed in full.
    pub replayed: usize,
    /// The trace's infinite-cache bound ([`repeat_bound`](crate::sweep::repeat_bound)),
    /// when the method computed it (`sample`: its control variate).
    pub bound: Option<(u64, u64)>,
}

/// Why a method's points could not be had.
#[derive(Debug)]
#[non_exhaustive]
pub enum MethodError {
    /// The curve pass.
    Curve(CurveRunError),
    /// A replay.
    Sweep(SweepError),
}

/// What the curve methods need besides the trace and the cases.
#[derive(Clone, Copy, Debug)]
pub struct MethodSpec {
    /// The method.
    pub method: Method,
    /// `--sample`.
    pub rate: f64,
    /// `--verify`.
    pub verify: usize,
    /// `--hot-keys`.
    pub hot_keys: u32,
    /// `--sample-seed` (the sampler's hash seed).
    pub seed: u64,
    /// Threads for the replays.
    pub jobs: usize,
    /// Tokens per block.
    pub block_tokens: u64,
    /// The manager's `max_requests`.
    pub max_requests: u32,
    /// Show progress bars.
    pub progress: bool,
}

/// Replays `cases` (in parallel), `tick` per case done.
fn replay_cases(
    cases: &[SweepCase],
    spec: &MethodSpec,
    make_replayer: &MakeReplayer<'_>,
    trace: &CompactTrace,
) -> Result<Vec<SweepPoint>, MethodError> {
    if cases.is_empty() {
        return Ok(Vec::new());
    }
    let bar = progress_bar(
        spec.progress,
        "replays",
        cases.len() as u64,
        "configurations",
    );
    let result = crate::sweep::run(cases, spec.jobs, make_replayer, &|| trace.cursor(), &|_| {
        bar.inc(1);
    });
    bar.finish_and_clear();
    result.map(|s| s.points).map_err(MethodError::Sweep)
}

/// A point from the curve's numbers at `case`.
fn point(case: SweepCase, counts: ReplayCounts) -> SweepPoint {
    SweepPoint {
        case,
        counts,
        resident_blocks: 0,
    }
}

/// The points of `cases` by `spec.method` (`Exact` replays them all).
///
/// # Errors
/// [`MethodError`]: the curve pass or a replay.
pub(crate) fn points(
    spec: &MethodSpec,
    cases: &[SweepCase],
    make_replayer: &MakeReplayer<'_>,
    trace: &CompactTrace,
) -> Result<MethodPoints, MethodError> {
    let records = trace.records();
    let curve_bar = |what: &str| progress_bar(spec.progress, what, records, "records");
    let (requests, request_blocks) = (trace.requests(), trace.request_blocks());
    match spec.method {
        Method::Exact => Ok(MethodPoints {
            points: replay_cases(cases, spec, make_replayer, trace)?
                .into_iter()
                .map(|p| (p, Source::Replay))
                .collect(),
            checkpoints: Vec::new(),
            replayed: cases.len(),
            bound: None,
        }),
        Method::Stack => {
            let stacked = |c: &SweepCase| c.policy == PolicyKind::Lru && c.threshold <= 1;
            let max = cases
                .iter()
                .filter(|c| stacked(c))
                .map(|c| c.capacity)
                .max();
            let curve = match max {
                Some(max) => {
                    let bar = curve_bar("stack");
                    let curve = stack_curve(trace, max, spec.max_requests, &|n| bar.inc(n));
                    bar.finish_and_clear();
                    Some(curve.map_err(MethodError::Curve)?)
                }
                None => None,
            };
            let certified = |c: &SweepCase| {
                curve
                    .as_ref()
                    .filter(|_| stacked(c))
                    .and_then(|k| k.at(c.capacity))
                    .filter(|p| p.exact)
            };
            let rest: Vec<SweepCase> = cases
                .iter()
                .filter(|c| certified(c).is_none())
                .copied()
                .collect();
            let mut replayed = replay_cases(&rest, spec, make_replayer, trace)?.into_iter();
            let mut out = Vec::with_capacity(cases.len());
            for c in cases {
                match certified(c) {
                    Some(p) => {
                        let counts = ReplayCounts {
                            requests,
                            request_blocks,
                            hit_blocks: p.hit_blocks,
                            hit_requests: p.hit_requests,
                            digest: p.digest,
                            ..ReplayCounts::default()
                        };
                        out.push((point(*c, counts), Source::Stack));
                    }
                    None => {
                        let Some(p) = replayed.next() else {
                            return Err(MethodError::Sweep(SweepError::Thread(
                                "a replay went missing".into(),
                            )));
                        };
                        out.push((p, Source::Replay));
                    }
                }
            }
            Ok(MethodPoints {
                points: out,
                checkpoints: Vec::new(),
                replayed: rest.len(),
                bound: None,
            })
        }
        Method::Sample => sample_points(spec, cases, make_replayer, trace),
    }
}

/// The sampled passes of `sample`, one per store threshold, each split over the threads by
/// capacity: every pass with the cases it stands for.
fn sampled_passes(
    spec: &MethodSpec,
    cases: &[SweepCase],
    thresholds: &[u32],
    trace: &CompactTrace,
) -> Result<Vec<(Vec<SweepCase>, SampledCurves)>, MethodError> {
    let hot = hot_keys(trace, spec.hot_keys).map_err(MethodError::Curve)?;
    let hot = &hot;
    let mut out = Vec::new();
    for &t in thresholds {
        let mine: Vec<SweepCase> = cases.iter().filter(|c| c.threshold == t).copied().collect();
        let mut caps: Vec<u32> = mine.iter().map(|c| c.capacity).collect();
        caps.sort_unstable();
        caps.dedup();
        let mut policies: Vec<PolicyKind> = mine.iter().map(|c| c.policy).collect();
        policies.dedup();
        // The capacities split over the threads, each chunk its own miniature replays over
        // the shared parsed trace.
        let chunks: Vec<&[u32]> = caps
            .chunks(caps.len().div_ceil(spec.jobs.max(1)).max(1))
            .collect();
        let bar = progress_bar(
            spec.progress,
            "sample",
            trace.records() * chunks.len() as u64,
            "records",
        );
        let results: Vec<Result<SampledCurves, CurveRunError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunks
                .iter()
                .map(|chunk| {
                    let (bar, policies) = (&bar, &policies);
                    scope.spawn(move || {
                        sampled(
                            trace,
                            spec.rate,
                            chunk,
                            policies,
                            t,
                            spec.block_tokens,
                            spec.max_requests,
                            hot,
                            spec.seed,
                            &|n| bar.inc(n),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or(Err(CurveRunError::Curve(CurveError::OutOfMemory)))
                })
                .collect()
        });
        bar.finish_and_clear();
        for s in results {
            out.push((mine.clone(), s.map_err(MethodError::Curve)?));
        }
    }
    Ok(out)
}

/// `sample`: one sampled pass per store threshold, then the checkpoint replays.
fn sample_points(
    spec: &MethodSpec,
    cases: &[SweepCase],
    make_replayer: &MakeReplayer<'_>,
    trace: &CompactTrace,
) -> Result<MethodPoints, MethodError> {
    let (requests, request_blocks) = (trace.requests(), trace.request_blocks());
    let mut thresholds: Vec<u32> = cases.iter().map(|c| c.threshold).collect();
    thresholds.sort_unstable();
    thresholds.dedup();
    // The control variate's exact side (the repeat bound) runs beside the hot-key pass and
    // the sampled passes, on the core the single-threaded phases leave idle.
    let (curves, bound) = std::thread::scope(|outer| {
        let rb = outer.spawn(|| crate::sweep::repeat_bound(trace.cursor()));
        let curves = sampled_passes(spec, cases, &thresholds, trace);
        let bound = rb
            .join()
            .unwrap_or_else(|_| crate::sweep::repeat_bound(trace.cursor()));
        (curves, bound)
    });
    let mut est: Vec<(SweepCase, f64)> = Vec::new();
    for (mine, s) in curves? {
        for c in &mine {
            if let Some(m) = s.mini(c.policy, c.capacity) {
                est.push((*c, s.estimate_controlled(m, bound.0)));
            }
        }
    }
    // Each estimate as a count of hit blocks, and the rate the row shows from it.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an estimate of a count, in [0, request_blocks]"
    )]
    let hits_of = |c: &SweepCase| {
        let rate = est.iter().find(|(e, _)| e == c).map_or(0.0, |(_, r)| *r);
        (rate * request_blocks as f64).round() as u64
    };
    let counts_of = |c: &SweepCase| ReplayCounts {
        requests,
        request_blocks,
        hit_blocks: hits_of(c),
        ..ReplayCounts::default()
    };
    let caps: Vec<u32> = cases.iter().map(|c| c.capacity).collect();
    let at = checkpoints(&caps, spec.verify);
    let verify: Vec<SweepCase> = cases
        .iter()
        .filter(|c| at.contains(&c.capacity))
        .copied()
        .collect();
    let exact = replay_cases(&verify, spec, make_replayer, trace)?;
    let checkpoints = exact
        .iter()
        .map(|p| {
            let sampled = counts_of(&p.case).block_hit_rate();
            let exact = p.counts.block_hit_rate();
            Checkpoint {
                capacity: p.case.capacity,
                policy: p.case.policy.name(),
                store_threshold: p.case.threshold,
                sampled_block_hit_rate: sampled,
                exact_block_hit_rate: exact,
                error_points: 100.0 * (sampled - exact),
            }
        })
        .collect();
    let points = cases
        .iter()
        .map(|c| (point(*c, counts_of(c)), Source::Sample))
        .collect();
    Ok(MethodPoints {
        points,
        checkpoints,
        replayed: verify.len(),
        bound: Some(bound),
    })
}
