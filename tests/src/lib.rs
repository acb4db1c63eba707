//! Shared helpers for kvtier's black-box tests: scenario ports of vLLM 0.33.0, trace replays
//! against `expected.tsv`, and the operation enums and reference models that both the proptests
//! here and the fuzz targets in `fuzz/` drive.

extern crate alloc;

pub mod allocator_model;
pub mod block_pool_model;
pub mod capacity_gen;
pub mod curve;
pub mod engine_model;
pub mod expected;
pub mod generated;
pub mod kv_events;
pub mod manager_checks;
pub mod manager_model;
pub mod prometheus_server;
pub mod scenarios;
pub mod simple_drive;
pub mod simple_fixture;
pub mod simple_model;
pub mod simple_ops;
pub mod stats_model;
pub mod store;
pub mod trace_order;
pub mod xorshift;

/// The repository README's Rust examples, compiled and run as doctests so they cannot rot
/// (here rather than in a published crate, whose package does not hold the repository README).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The kvtrace format page's Rust example (a whole replay through the library), run as a
/// doctest like the README's.
#[doc = include_str!("../../docs/formats/kvtrace.md")]
#[cfg(doctest)]
pub struct KvtraceFormatDoctests;
