//! # kvtier-cli
//!
//! The `kvtier` command and the tool library behind it, around [`kvtier_core`] and the std
//! adapter [`kvtier`]: kvtrace and Mooncake traces, the built-in workload, the replayer, the
//! capacity report, sweeps and their plots, serving `/metrics` while replaying. A service that
//! only needs threaded access, the stats collector and the Prometheus exporter depends on
//! `kvtier` alone; this package is for the command and for Rust programs that replay traces
//! or size a tier themselves (a [`replay::Replayer`] over their own records, a
//! [`trace::TraceReader`], a [`sweep`] of their own grid).
//!
//! | module | holds |
//! |---|---|
//! | [`trace`] | kvtrace v1 (reader, writer, records, the compact parsed form), the Mooncake JSONL reader |
//! | [`workload`] | the built-in deterministic workload generator |
//! | [`input`] | opening a trace file in either format as one record source |
//! | [`convert`] | Mooncake JSONL to kvtrace |
//! | [`replay`] | [`replay::Replayer`]: the kvtrace replay protocol over one manager |
//! | [`replay_stats`] | what a replay adds to the manager's stats: the transfer model, requests running |
//! | [`replay_run`] | a whole replay run into a [`replay_run::ReplayReport`] |
//! | [`replay_simple`] | `replay --offloader simple`: the simple CPU offloader behind the GPU front |
//! | [`simple_tier`] | the simple CPU offloader as the engine's connector |
//! | [`serve_simple`] | the replay thread of `serve --offloader simple` |
//! | [`engine`] | the GPU prefix cache in front of the tier and the engine step model (`--gpu-blocks`) |
//! | [`kv_events_run`] | publishing a replay's tier events as vLLM's KV-events stream (`--kv-events-*`) |
//! | [`layout`] | model layouts: presets, layout JSON, Hugging Face `config.json` |
//! | [`sizing`] | the capacity report model |
//! | [`sweep`] | many configurations of one parsed trace on threads |
//! | [`sweep_simple`] | `sweep --offloader simple`: the simple offloader at many pool sizes |
//! | [`sweep_run`] | a whole sweep run into a [`sweep_run::SweepReport`] and its plot |
//! | [`plot`] | the sweep's hit-rate curve (SVG, PNG) |
//! | [`serve`] | serving `/metrics` while a replay runs |
//! | [`numfmt`] | numbers for people |
//! | [`cli`] | the command: argument parsing and printing only |
//! | [`error`] | [`Error`], the command's umbrella error |

pub mod cli;
pub mod convert;
pub mod engine;
pub mod error;
mod from_variants;
pub mod input;
pub mod kv_events_run;
pub mod layout;
pub mod numfmt;
pub mod plot;
pub mod replay;
pub mod replay_run;
pub mod replay_simple;
pub mod replay_stats;
pub mod serve;
pub mod serve_simple;
pub mod simple_tier;
pub mod sizing;
pub mod sweep;
pub mod sweep_curve;
pub mod sweep_run;
pub mod sweep_simple;
pub mod trace;
pub mod workload;

pub use error::Error;
