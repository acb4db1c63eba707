//! Threaded access to managers and stats: [`SharedManager`] (one manager behind a lock),
//! [`ShardedManager`] (one per engine), and [`StatsCollector`] (drains, aggregates, exports).
//!
//! Locks come from the [`sync`] facade, whose poisoning policy is to recover the value: every
//! manager call validates before it mutates, so the value is consistent at any panic.

pub mod sync;
