//! The core's offload manager and its allocators: vLLM 0.33.0's scenarios, the model-based
//! proptests against the reference models of `kvtier_tests`, the typed errors, the shared
//! manager under threads, and the firmware run on an emulated Cortex-M4.

mod allocator_model;
mod block_pool;
mod cortex_m;
mod free_queue;
mod held_keys;
mod manager_errors;
mod manager_model;
mod manager_scenarios;
mod shared;
