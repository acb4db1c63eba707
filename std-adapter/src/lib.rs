//! # kvtier
//!
//! The std side of kvtier: the `kvtier` command (trace replay, capacity sizing), the kvtrace
//! reader and writer, the built-in workload generator, layout readers, and the Prometheus
//! export of stats payloads, all around [`kvtier_core`].
//!
//! Modules: [`cli`] (the command: argument parsing and printing only), [`convert`] (Mooncake
//! JSONL to kvtrace), [`error`] (the umbrella [`Error`]), [`export`] (Prometheus families and
//! text), [`http`] (the `/metrics` endpoint), [`input`] (opening a trace file in either
//! format), [`layout`] (model layouts), [`memory`] (available memory), [`numfmt`] (numbers for
//! people), [`plot`] (the sweep's curve), [`replay`] (the [`replay::Replayer`]),
//! [`replay_run`] (a whole replay run into a report), [`replay_stats`] (the replay's own
//! stats), [`serve`] (serving `/metrics` while replaying), [`shared`] (the stats collector),
//! [`sizing`] (the capacity report model), [`sweep`] (replaying many configurations),
//! [`sweep_run`] (a whole sweep run into a report), [`sync`] (the lock facade, std or loom),
//! [`trace`] (kvtrace and Mooncake), [`workload`] (the built-in workload generator).

pub mod cli;
pub mod convert;
pub mod error;
pub mod export;
pub mod http;
pub mod input;
pub mod layout;
pub mod memory;
pub mod numfmt;
pub mod plot;
pub mod replay;
pub mod replay_run;
pub mod replay_stats;
pub mod serve;
pub mod shared;
pub mod sizing;
pub mod sweep;
pub mod sweep_run;
pub mod sync;
pub mod trace;
pub mod workload;

pub use error::Error;
