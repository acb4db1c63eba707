//! The stats a replay reports beside the manager's own, under the offloading connector's
//! names: the transfers (from a model of their size and speed), the lookup-scan times, and the
//! requests in flight.
//!
//! - **Transfers.** A request whose lookup found `k > 0` leading hits loads `k` blocks (one
//!   transfer); its `S` record stores the blocks `prepare_store` allocated (one transfer). Each
//!   adds `blocks × bytes_per_block` to `vllm:kv_offload_load_bytes` / `_store_bytes`, one
//!   observation of that size to `_load_size` / `_store_size`, and `bytes / bandwidth` to
//!   `_load_time` / `_store_time`. The bytes per block come from the model's layout (as
//!   `kvtier capacity` reads it); the time is a model, not a measurement: a fixed bandwidth
//!   ([`TransferModel`]). Without a layout the transfer families stay at zero.
//! - **Lookup delay.** Each `L` record's lookup scan is timed (wall clock) and observed in
//!   `vllm:kv_offload_lookup_sync_delay_seconds`, the call vLLM's scheduler times. A replay never
//!   defers a lookup, so `_lookup_async_delay_seconds` has no observations.
//! - **Requests running.** `vllm:num_requests_running` is the number of requests between their
//!   `L` and `C` records when the stats are drained.
//!
//! ```
//! use kvtier_cli::replay::TransferModel;
//!
//! // Llama-3-8B's 2 MiB blocks at 25 GB/s: 8 blocks take 671,089 ns.
//! let m = TransferModel::new(2 * 1024 * 1024, 25.0).unwrap();
//! assert_eq!(m.transfer(8), (16_777_216, 671_089));
//! ```

use std::fmt;

use kvtier_core::stats::catalogue::{
    LOAD_BYTES, LOAD_SIZE, LOAD_TIME, LOOKUP_SYNC_DELAY_SECONDS, NUM_REQUESTS_RUNNING, STORE_BYTES,
    STORE_SIZE, STORE_TIME,
};
use kvtier_core::stats::{Gauge, Payload};

use kvtier_core::capacity::PoolLayout;

use crate::replay::{ReplayError, Replayer};
use crate::sizing::{ModelArgs, ReportError};
use crate::trace::Record;

/// The default of `--transfer-gbps`: about what a PCIe 4.0 x16 link moves.
pub const DEFAULT_TRANSFER_GBPS: f64 = 25.0;

/// A transfer of `blocks` blocks moves `blocks × bytes_per_block` bytes at a fixed bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransferModel {
    bytes_per_block: u64,
    gigabytes_per_second: f64,
}

/// Why a [`TransferModel`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum TransferModelError {
    /// The bandwidth is not a positive, finite number of GB/s.
    Bandwidth(f64),
}

impl fmt::Display for TransferModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferModelError::Bandwidth(g) => {
                write!(f, "--transfer-gbps must be a positive number, not {g}")
            }
        }
    }
}

impl std::error::Error for TransferModelError {}

impl TransferModel {
    /// Blocks of `bytes_per_block` bytes moved at `gigabytes_per_second` GB/s (10^9 bytes per
    /// second).
    ///
    /// # Errors
    /// [`TransferModelError::Bandwidth`] for a bandwidth that is not positive and finite.
    pub fn new(
        bytes_per_block: u64,
        gigabytes_per_second: f64,
    ) -> Result<Self, TransferModelError> {
        if !(gigabytes_per_second.is_finite() && gigabytes_per_second > 0.0) {
            return Err(TransferModelError::Bandwidth(gigabytes_per_second));
        }
        Ok(TransferModel {
            bytes_per_block,
            gigabytes_per_second,
        })
    }

    /// Bytes of one block.
    #[must_use]
    pub fn bytes_per_block(&self) -> u64 {
        self.bytes_per_block
    }

    /// `(bytes, nanoseconds)` of one transfer of `blocks` blocks (bytes saturate at `u64::MAX`;
    /// nanoseconds are rounded to the nearest).
    #[must_use]
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a modelled time: the float is positive and saturates on the cast"
    )]
    pub fn transfer(&self, blocks: u64) -> (u64, u64) {
        let bytes = blocks.saturating_mul(self.bytes_per_block);
        // bytes / (G · 10^9 B/s) in ns = bytes / G.
        let nanos = (bytes as f64 / self.gigabytes_per_second).round() as u64;
        (bytes, nanos)
    }
}

/// The command-line options of the transfer model (`kvtier replay` and `kvtier serve`): the
/// model's layout as `kvtier capacity` takes it, and the bandwidth.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TransferArgs {
    /// The model whose blocks the transfers move (as `kvtier capacity` takes it); feeds the
    /// `vllm:kv_offload_load_*` / `_store_*` families.
    #[command(flatten)]
    pub source: ModelArgs,
    /// The modelled bandwidth of every transfer, in GB/s (10^9 bytes per second): a transfer's
    /// time is its bytes divided by this (a model, not a measurement).
    #[arg(long, default_value_t = DEFAULT_TRANSFER_GBPS, value_name = "GB/S")]
    pub transfer_gbps: f64,
}

/// Why [`TransferArgs::model`] could not build the transfer model.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransferError {
    /// `--transfer-gbps` is refused.
    Bandwidth(TransferModelError),
    /// The model's layout could not give its block bytes.
    Layout(ReportError),
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferError::Bandwidth(e) => e.fmt(f),
            TransferError::Layout(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TransferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransferError::Bandwidth(e) => Some(e),
            TransferError::Layout(e) => Some(e),
        }
    }
}

impl TransferArgs {
    /// The transfer model of these options with `block_tokens` tokens per block (for presets
    /// and config.json), or `None` without a model.
    ///
    /// # Errors
    /// [`TransferError`] naming the option at fault (the layout's, or `--transfer-gbps`).
    pub fn model(&self, block_tokens: u32) -> Result<Option<TransferModel>, TransferError> {
        let bandwidth =
            TransferModel::new(0, self.transfer_gbps).map_err(TransferError::Bandwidth)?;
        if !self.source.is_given() {
            return Ok(None);
        }
        let bytes = self
            .source
            .bytes_per_block(block_tokens, PoolLayout::LayerOutermost)
            .map_err(TransferError::Layout)?;
        Ok(Some(TransferModel {
            bytes_per_block: bytes,
            ..bandwidth
        }))
    }
}

/// Applies records to a [`Replayer`] and collects the replay's own stats (the modelled
/// transfers, the lookup-scan times, the requests in flight) until they are drained.
#[derive(Debug)]
pub struct ReplayStats {
    model: Option<TransferModel>,
    pending: Payload,
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ReplayStats {
    /// Stats with this transfer model (`None`: the transfer families stay at zero).
    #[must_use]
    pub fn new(model: Option<TransferModel>) -> Self {
        ReplayStats {
            model,
            pending: Payload::new(),
        }
    }

    fn transfer(&mut self, blocks: u64, names: [&'static str; 3]) {
        let [bytes_name, size, time] = names;
        let Some(model) = self.model.filter(|_| blocks > 0) else {
            return;
        };
        let (bytes, ns) = model.transfer(blocks);
        // Unlabelled catalogue families: they fit any payload, which holds at most these eight.
        let _ = self.pending.increase_counter(bytes_name, &[], bytes);
        let _ = self.pending.increase_counter(time, &[], ns);
        let _ = self.pending.observe(size, &[], bytes);
    }

    /// Replays `rec` on `replayer` and records what it moved and how long its lookup took.
    ///
    /// # Errors
    /// The replayer's [`ReplayError`]; nothing is recorded then.
    pub fn apply(&mut self, replayer: &mut Replayer, rec: Record<'_>) -> Result<(), ReplayError> {
        match rec {
            Record::Load { .. } => {
                let before = replayer.counts().hit_blocks;
                replayer.apply(rec)?;
                let scan = nanos(replayer.last_lookup());
                let _ = self.pending.observe(LOOKUP_SYNC_DELAY_SECONDS, &[], scan);
                let loaded = replayer.counts().hit_blocks.saturating_sub(before);
                self.transfer(loaded, [LOAD_BYTES, LOAD_SIZE, LOAD_TIME]);
            }
            Record::Start { .. } => {
                let before = replayer.counts().stored_blocks;
                replayer.apply(rec)?;
                let stored = replayer.counts().stored_blocks.saturating_sub(before);
                self.transfer(stored, [STORE_BYTES, STORE_SIZE, STORE_TIME]);
            }
            Record::Complete { .. } => replayer.apply(rec)?,
        }
        Ok(())
    }

    /// What was recorded since the last drain, with `vllm:num_requests_running` set to the
    /// requests `replayer` has open now.
    pub fn drain(&mut self, replayer: &Replayer) -> Payload {
        let running = i64::try_from(replayer.open_requests()).unwrap_or(i64::MAX);
        let _ = self
            .pending
            .set_gauge(NUM_REQUESTS_RUNNING, &[], Gauge::int(running));
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "test code: a failed unwrap is a failed test"
    )]

    use super::*;
    use kvtier_core::manager::{ManagerConfig, OffloadManager};
    use kvtier_core::stats::catalogue::LOOKUP_ASYNC_DELAY_SECONDS;

    #[test]
    fn a_transfer_takes_its_bytes_over_the_bandwidth() {
        let m = TransferModel::new(1000, 2.0).unwrap();
        assert_eq!(m.transfer(0), (0, 0));
        assert_eq!(m.transfer(3), (3000, 1500));
        assert_eq!(m.transfer(u64::MAX).0, u64::MAX);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(TransferModel::new(1000, bad).is_err(), "{bad}");
        }
        assert_eq!(
            TransferModel::new(1, 0.0).unwrap_err().to_string(),
            "--transfer-gbps must be a positive number, not 0"
        );
    }

    #[test]
    fn the_layout_options_give_the_block_bytes() {
        let mut args = TransferArgs {
            transfer_gbps: DEFAULT_TRANSFER_GBPS,
            ..TransferArgs::default()
        };
        assert_eq!(args.model(16).unwrap(), None);
        args.source.model = Some("llama-3-8b".into());
        // 32 layers · 8 KV heads · (128 + 128) · 2 bytes · 16 tokens.
        let m = args.model(16).unwrap().unwrap();
        assert_eq!(m.bytes_per_block(), 2_097_152);
        assert_eq!(
            args.model(32).unwrap().unwrap().bytes_per_block(),
            4_194_304
        );
        args.source.layout = Some("x.json".into());
        assert_eq!(
            args.model(16).unwrap_err().to_string(),
            "--model: give only one of --model, --layout and --hf-config"
        );
        args.source.layout = None;
        args.transfer_gbps = -3.0;
        assert!(matches!(
            args.model(16),
            Err(TransferError::Bandwidth(TransferModelError::Bandwidth(
                -3.0
            )))
        ));
        assert_eq!(
            args.model(16).unwrap_err().to_string(),
            "--transfer-gbps must be a positive number, not -3"
        );
    }

    #[test]
    fn records_feed_transfers_lookups_and_running_requests() {
        let manager = OffloadManager::new(ManagerConfig::new(16)).unwrap();
        let mut replayer = Replayer::new(manager, 16);
        let model = TransferModel::new(1000, 1.0).unwrap();
        let mut stats = ReplayStats::new(Some(model));
        let keys = [11, 12, 13];
        // Request 1 misses, stores its three blocks and completes; request 2 loads them.
        stats
            .apply(
                &mut replayer,
                Record::Load {
                    rid: 1,
                    hashes: &keys,
                },
            )
            .unwrap();
        stats
            .apply(&mut replayer, Record::Start { rid: 1 })
            .unwrap();
        stats
            .apply(&mut replayer, Record::Complete { rid: 1 })
            .unwrap();
        stats
            .apply(
                &mut replayer,
                Record::Load {
                    rid: 2,
                    hashes: &keys,
                },
            )
            .unwrap();
        assert_eq!(replayer.counts().hit_blocks, 3);
        // A record the replayer refuses records nothing.
        assert!(
            stats
                .apply(&mut replayer, Record::Start { rid: 9 })
                .is_err()
        );
        let p = stats.drain(&replayer);
        assert_eq!(p.counter(STORE_BYTES, &[]), Some(3000));
        assert_eq!(p.counter(STORE_TIME, &[]), Some(3000));
        assert_eq!(p.counter(LOAD_BYTES, &[]), Some(3000));
        assert_eq!(p.counter(LOAD_TIME, &[]), Some(3000));
        let size = p.histogram(STORE_SIZE, &[]).unwrap();
        assert_eq!((size.count(), size.sum()), (1, 3000));
        let size = p.histogram(LOAD_SIZE, &[]).unwrap();
        assert_eq!((size.count(), size.sum()), (1, 3000));
        // Two lookup scans timed; a replay never defers one.
        assert_eq!(
            p.histogram(LOOKUP_SYNC_DELAY_SECONDS, &[])
                .map(|h| h.count()),
            Some(2)
        );
        assert_eq!(p.histogram(LOOKUP_ASYNC_DELAY_SECONDS, &[]), None);
        assert_eq!(p.gauge(NUM_REQUESTS_RUNNING, &[]), Some(Gauge::int(1)));
        // Drained: the next drain has only the gauge.
        let next = stats.drain(&replayer);
        assert_eq!(next.len(), 1);
        assert_eq!(next.gauge(NUM_REQUESTS_RUNNING, &[]), Some(Gauge::int(1)));
    }

    #[test]
    fn without_a_layout_nothing_is_transferred() {
        let manager = OffloadManager::new(ManagerConfig::new(16)).unwrap();
        let mut replayer = Replayer::new(manager, 16);
        let mut stats = ReplayStats::new(None);
        stats
            .apply(
                &mut replayer,
                Record::Load {
                    rid: 1,
                    hashes: &[5],
                },
            )
            .unwrap();
        stats
            .apply(&mut replayer, Record::Start { rid: 1 })
            .unwrap();
        assert_eq!(replayer.counts().stored_blocks, 1);
        let p = stats.drain(&replayer);
        assert_eq!(p.counter(STORE_BYTES, &[]), None);
        assert_eq!(
            p.histogram(LOOKUP_SYNC_DELAY_SECONDS, &[])
                .map(|h| h.count()),
            Some(1)
        );
    }
}
