//! Threaded access to managers and stats.
//!
//! | module | holds |
//! |---|---|
//! | [`manager`] | [`SharedManager`] (one manager behind a lock, atomic lookup-then-pin) and [`ShardedManager`] (one per engine) |
//! | [`collector`] | [`StatsCollector`]: drains managers, aggregates payloads from threads and processes, feeds the exporter |
//! | `queue` | the collector's queue: first in first out, bounded by bytes and by payloads, senders wait for room |

pub mod collector;
pub mod frame;
pub mod health;
pub mod manager;
mod queue;

pub use collector::{
    CollectorClosed, CollectorConfig, CollectorReport, PayloadSender, QueueLevels, StatsCollector,
};
pub use frame::{FrameError, read_frame, write_frame};
pub use health::{MetricsRegisterError, RejectReason};
pub use manager::{Pinned, ShardedManager, SharedManager};
