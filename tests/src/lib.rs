//! Shared helpers for kvtier's black-box tests: scenario ports of vLLM 0.33.0, trace replays
//! against `expected.tsv`, and the operation enums and reference models that both the proptests
//! here and the fuzz targets in `fuzz/` drive.

pub mod allocator_model;
pub mod block_pool_model;
pub mod expected;
pub mod manager_checks;
pub mod manager_model;
pub mod stats_model;
pub mod trace_order;
