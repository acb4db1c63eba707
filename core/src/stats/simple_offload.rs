//! The stats source of vLLM's simple CPU offloader (`SimpleCPUOffloadConnector`).
//!
//! The offloader classifies every block handed over for an eager store into one of seven
//! [`SaveOutcome`]s and counts blocks of completed loads. [`SimpleOffloadStats::drain`] turns
//! that into a [`Payload`] once per step, as vLLM's `get_stats` does:
//!
//! - `save_outcomes_total{outcome}`: the increase since the previous drain, **only when > 0**;
//! - `load_blocks_total`: blocks of loads completed in the interval, only when > 0;
//! - `used_blocks = capacity − free` (the caller passes the pool's free count; the pool's null
//!   block is never free, so an idle pool reports 1), always;
//! - `pending_store_blocks` (passed by the caller), always;
//! - the info gauge `{backend, page_cache, lazy_offload, capacity_blocks} = 1`, always.
//!
//! [`SimpleOffloadStats::reset`] (a cache reset) re-seeds the cumulative outcome counts with the
//! deltas not yet drained, so a reset in the middle of an interval loses no outcome.
//!
//! ```
//! use kvtier_core::stats::catalogue::{SIMPLE_SAVE_OUTCOMES, SIMPLE_USED_BLOCKS};
//! use kvtier_core::stats::simple_offload::{SaveOutcome, SimpleOffloadConfig, SimpleOffloadStats};
//! use kvtier_core::stats::Gauge;
//!
//! let mut stats = SimpleOffloadStats::new(SimpleOffloadConfig::new(8));
//! stats.record(SaveOutcome::Stored, 3);
//! let p = stats.drain(7, 0);
//! assert_eq!(p.counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), Some(3));
//! assert_eq!(p.gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(1)));
//! assert_eq!(stats.drain(7, 0).counter(SIMPLE_SAVE_OUTCOMES, &["stored"]), None);
//! ```

use alloc::borrow::Cow;
use alloc::string::ToString;
use alloc::vec::Vec;

use super::catalogue::{
    SIMPLE_INFO, SIMPLE_LOAD_BLOCKS, SIMPLE_PENDING_STORE_BLOCKS, SIMPLE_SAVE_OUTCOMES,
    SIMPLE_USED_BLOCKS,
};
use super::payload::{Gauge, Labels, Payload, Series, Text, Value};

/// What became of one block handed over for an eager store (checked in this order by vLLM
/// except that the list below is the label order of its metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaveOutcome {
    /// Copied to the CPU pool.
    Stored,
    /// No free CPU block was left.
    DroppedCpuFull,
    /// The request had finished, was preempted, or had no store state.
    DroppedRequestGone,
    /// The GPU block was the null block.
    DroppedNullBlock,
    /// The GPU block had no hash yet.
    DroppedNotHashed,
    /// The hash was already in the CPU cache.
    SkippedAlreadyCached,
    /// The GPU block was already being stored.
    SkippedInFlight,
}

impl SaveOutcome {
    /// Every outcome, in vLLM's emission order.
    pub const ALL: [SaveOutcome; 7] = [
        SaveOutcome::Stored,
        SaveOutcome::DroppedCpuFull,
        SaveOutcome::DroppedRequestGone,
        SaveOutcome::DroppedNullBlock,
        SaveOutcome::DroppedNotHashed,
        SaveOutcome::SkippedAlreadyCached,
        SaveOutcome::SkippedInFlight,
    ];

    /// The `outcome` label value.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            SaveOutcome::Stored => "stored",
            SaveOutcome::DroppedCpuFull => "dropped_cpu_full",
            SaveOutcome::DroppedRequestGone => "dropped_request_gone",
            SaveOutcome::DroppedNullBlock => "dropped_null_block",
            SaveOutcome::DroppedNotHashed => "dropped_not_hashed",
            SaveOutcome::SkippedAlreadyCached => "skipped_already_cached",
            SaveOutcome::SkippedInFlight => "skipped_in_flight",
        }
    }

    const fn index(self) -> usize {
        match self {
            SaveOutcome::Stored => 0,
            SaveOutcome::DroppedCpuFull => 1,
            SaveOutcome::DroppedRequestGone => 2,
            SaveOutcome::DroppedNullBlock => 3,
            SaveOutcome::DroppedNotHashed => 4,
            SaveOutcome::SkippedAlreadyCached => 5,
            SaveOutcome::SkippedInFlight => 6,
        }
    }
}

/// Where the simple offloader keeps its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Host memory.
    Cpu,
    /// A disk file, staged through host buffers.
    Disk,
}

/// The deployment facts on the info gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimpleOffloadConfig {
    /// Pool size in blocks (`num_cpu_blocks`, the null block included).
    pub capacity_blocks: u32,
    /// CPU or disk (default CPU).
    pub backend: Backend,
    /// Disk mode uses the OS page cache (reported `"true"` only with [`Backend::Disk`]).
    pub page_cache: bool,
    /// Lazy offload mode (default false).
    pub lazy_offload: bool,
}

impl SimpleOffloadConfig {
    /// The defaults (CPU, no page cache, eager) for a pool of `capacity_blocks`.
    #[must_use]
    pub const fn new(capacity_blocks: u32) -> Self {
        SimpleOffloadConfig {
            capacity_blocks,
            backend: Backend::Cpu,
            page_cache: false,
            lazy_offload: false,
        }
    }

    /// The info label values, in [`SIMPLE_INFO_LABELS`](super::catalogue::SIMPLE_INFO_LABELS)
    /// order: `backend`, `page_cache`, `lazy_offload`, `capacity_blocks`.
    #[must_use]
    pub fn info_labels(&self) -> [Text; 4] {
        let bool_text = |b: bool| Cow::Borrowed(if b { "true" } else { "false" });
        let disk = self.backend == Backend::Disk;
        [
            Cow::Borrowed(if disk { "disk" } else { "cpu" }),
            bool_text(disk && self.page_cache),
            bool_text(self.lazy_offload),
            Cow::Owned(self.capacity_blocks.to_string()),
        ]
    }
}

/// The simple offloader's interval statistics. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimpleOffloadStats {
    config: SimpleOffloadConfig,
    /// Cumulative outcome counts (since construction or the last reset, which carries the
    /// undrained part forward).
    current: [u64; 7],
    /// `current` at the last drain.
    snapshot: [u64; 7],
    /// Blocks of loads completed since the last drain (a reset does not clear it).
    interval_load_blocks: u64,
}

impl SimpleOffloadStats {
    /// A source with every count at 0.
    #[must_use]
    pub const fn new(config: SimpleOffloadConfig) -> Self {
        SimpleOffloadStats {
            config,
            current: [0; 7],
            snapshot: [0; 7],
            interval_load_blocks: 0,
        }
    }

    /// The deployment facts.
    #[must_use]
    pub const fn config(&self) -> &SimpleOffloadConfig {
        &self.config
    }

    /// Counts `blocks` hand-offs with `outcome` (saturating).
    pub fn record(&mut self, outcome: SaveOutcome, blocks: u64) {
        if let Some(c) = self.current.get_mut(outcome.index()) {
            *c = c.saturating_add(blocks);
        }
    }

    /// Counts the blocks of a load that completed (loads abandoned by a reset count when they
    /// complete later).
    pub fn record_load_completed(&mut self, blocks: u64) {
        self.interval_load_blocks = self.interval_load_blocks.saturating_add(blocks);
    }

    /// The cumulative count of one outcome (vLLM's `BoundaryStoreStats` field).
    #[must_use]
    pub fn total(&self, outcome: SaveOutcome) -> u64 {
        self.current.get(outcome.index()).copied().unwrap_or(0)
    }

    /// The cumulative count of every hand-off (vLLM's `published`, not exported).
    #[must_use]
    pub fn published(&self) -> u64 {
        self.current.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Drains the interval into a payload: outcome deltas and completed load blocks (each only
    /// when > 0), `used_blocks = capacity − free_blocks`, `pending_store_blocks`, and the info
    /// gauge.
    #[must_use]
    pub fn drain(&mut self, free_blocks: u32, pending_store_blocks: u64) -> Payload {
        let mut series = Vec::with_capacity(SaveOutcome::ALL.len() + 4);
        let series_of = |name: &'static str, labels: Labels, value: Value| Series {
            name: Cow::Borrowed(name),
            labels,
            value,
        };
        for outcome in SaveOutcome::ALL {
            let i = outcome.index();
            let now = self.current.get(i).copied().unwrap_or(0);
            let then = self.snapshot.get(i).copied().unwrap_or(0);
            let delta = now.saturating_sub(then);
            if delta > 0 {
                let labels = Labels::from_known([Cow::Borrowed(outcome.label())]);
                series.push(series_of(
                    SIMPLE_SAVE_OUTCOMES,
                    labels,
                    Value::Counter(delta),
                ));
            }
        }
        self.snapshot = self.current;
        if self.interval_load_blocks > 0 {
            series.push(series_of(
                SIMPLE_LOAD_BLOCKS,
                Labels::new(),
                Value::Counter(self.interval_load_blocks),
            ));
            self.interval_load_blocks = 0;
        }
        let used = i64::from(self.config.capacity_blocks) - i64::from(free_blocks);
        series.push(series_of(
            SIMPLE_USED_BLOCKS,
            Labels::new(),
            Value::Gauge(Gauge::int(used)),
        ));
        let pending = i64::try_from(pending_store_blocks).unwrap_or(i64::MAX);
        series.push(series_of(
            SIMPLE_PENDING_STORE_BLOCKS,
            Labels::new(),
            Value::Gauge(Gauge::int(pending)),
        ));
        series.push(series_of(
            SIMPLE_INFO,
            Labels::from_known(self.config.info_labels()),
            Value::Gauge(Gauge::int(1)),
        ));
        series.sort_unstable_by(Series::key_cmp);
        Payload::from_checked_parts(series, None)
    }

    /// A cache reset: the cumulative counts restart from the deltas not yet drained, so the
    /// next drain still reports them; the completed-load count is kept.
    pub fn reset(&mut self) {
        for (c, s) in self.current.iter_mut().zip(self.snapshot.iter()) {
            *c = c.saturating_sub(*s);
        }
        self.snapshot = [0; 7];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_labels_follow_vllm() {
        let mut c = SimpleOffloadConfig::new(8);
        c.page_cache = true;
        assert_eq!(c.info_labels(), ["cpu", "false", "false", "8"]);
        c.backend = Backend::Disk;
        c.lazy_offload = true;
        assert_eq!(c.info_labels(), ["disk", "true", "true", "8"]);
    }

    #[test]
    fn drain_is_sorted_and_idle_pool_reports_null_block() {
        let mut s = SimpleOffloadStats::new(SimpleOffloadConfig::new(4));
        for o in SaveOutcome::ALL {
            s.record(o, 1);
        }
        s.record_load_completed(2);
        let p = s.drain(3, 0);
        assert_eq!(p.len(), 11);
        assert!(p.series().windows(2).all(|w| w[0].key_cmp(&w[1]).is_lt()));
        assert_eq!(p.gauge(SIMPLE_USED_BLOCKS, &[]), Some(Gauge::int(1)));
        assert_eq!(s.published(), 7);
        assert_eq!(s.drain(3, 0).len(), 3);
    }
}
