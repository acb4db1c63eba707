//! # kvtier
//!
//! The std adapter of kvtier that a service embeds around [`kvtier_core`]: threaded access to
//! the offload manager, a stats collector that aggregates engines, threads and processes, a
//! Prometheus exporter under vLLM 0.33.0's metric names on a registry the caller owns, and a
//! small `/metrics` endpoint, and the tier's events as vLLM's KV-events stream. It depends on
//! kvtier-core, the `prometheus` crate (text exposition, no default features), `zmq` and
//! `rmp`/`rmpv` (for the events): no command-line, plotting, progress or JSON crates. The
//! `kvtier` command and its tool library (traces, replay, sizing, sweeps) are the package
//! `kvtier-cli`.
//!
//! | module | holds |
//! |---|---|
//! | [`shared`] | [`shared::SharedManager`] (lookup-then-pin atomic), [`shared::ShardedManager`], [`shared::StatsCollector`] and its bounded queue |
//! | [`export`] | [`export::OffloadExporter`] on a caller's registry, its `prometheus_client`-format text, [`export::render`] of one payload |
//! | [`kv_events`] | the tier's events as vLLM's KV-events stream: [`kv_events::Publisher`] (ZMQ PUB and ROUTER replay), the msgpack codec ([`kv_events::encode()`], [`kv_events::decode()`]), the manager's events in vLLM's shape ([`kv_events::TierEvents`]) |
//! | [`http`] | [`http::MetricsServer`], the `/metrics` endpoint (loopback unless told otherwise) |
//! | [`sync`] | the lock facade (std or loom) and its poisoning policy |
//! | [`memory`] | the machine's available memory (a default manager budget) |
//! | [`error`] | [`Error`], the umbrella of this package's errors and the core's |
//!
//! ```
//! use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
//! use kvtier::shared::SharedManager;
//! use kvtier_core::manager::{ManagerConfig, OffloadManager};
//! use prometheus::Registry;
//!
//! let shared = SharedManager::new(OffloadManager::<u64>::new(ManagerConfig::new(64))?);
//! let registry = Registry::new();
//! let exporter = OffloadExporter::register(&registry, ExporterConfig::new("my-model", 1))?;
//! exporter.observe(&shared.drain_payload(), 0)?;
//! assert!(encode_text(&registry)?.contains("vllm:kv_offload_"));
//! # Ok::<(), kvtier::Error>(())
//! ```

pub mod error;
pub mod export;
pub mod http;
pub mod kv_events;
pub mod memory;
pub mod shared;
pub mod sync;

pub use error::Error;
