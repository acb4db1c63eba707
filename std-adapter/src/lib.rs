//! # kvtier
//!
//! The std side of kvtier: the `kvtier` command (trace replay, capacity sizing), the kvtrace
//! reader and writer, the built-in workload generator, layout readers, and the Prometheus
//! export of stats payloads, all around [`kvtier_core`].

pub mod cli;
pub mod error;
pub mod export;
pub mod http;
pub mod layout;
pub mod memory;
pub mod plot;
pub mod replay;
pub mod replay_stats;
pub mod shared;
pub mod sweep;
pub mod sync;
pub mod trace;
pub mod workload;

pub use error::Error;
