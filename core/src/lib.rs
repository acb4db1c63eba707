//! # kvtier-core
//!
//! The `no_std` bookkeeping core of a KV-cache offload tier for LLM inference servers.
//!
//! LLM servers keep attention state (the KV cache) in fixed-size blocks. When device memory runs
//! short, blocks are copied to a CPU (or disk) pool and copied back when a later request shares
//! the prefix. Everything about that pool that is pure logic lives here, and reproduces the
//! observable behaviour of vLLM 0.33.0 exactly: the same slot ids, the same victims in the same
//! order, the same events and the same gauges.
//!
//! | module | holds |
//! |---|---|
//! | [`hashing`] | [`hashing::FixedState`], the deterministic hasher every map in the core uses |
//! | [`key`] | [`key::BlockKey`], the provided 64-bit hash + KV-group key |
//! | [`ratio`] | [`ratio::Ratio`], the exact rational of usage, concurrency and gauges, and its `gcd` |
//! | [`capacity`] | KV layout specs, page sizes, blocks from a memory budget, max concurrency, the CPU tier's size |
//! | [`allocator`] | [`allocator::SlotPool`] (the CPU tier's slot order) and [`allocator::FreeQueue`] (the GPU pool's free list) |
//! | [`manager`] | [`manager::OffloadManager`]: lookup, load, store, eviction policies (LRU, ARC), the reuse filter, events |
//! | [`curve`] | sizing curves in one pass: the exact LRU curve at every capacity ([`curve::LruStack`]), SHARDS sampling and miniature replays |
//! | [`block_pool`] | vLLM's GPU-style `BlockPool` with a null block and a prefix-hash map |
//! | [`simple`] | [`simple::SimpleScheduler`]: vLLM's simple CPU offloader (scheduler side) on a `BlockPool`: lookups and pins, eager and lazy stores, the seven save outcomes, completions, reset, its stats |
//! | [`stats`] | Self-describing stats payloads, the metric catalogue, integer histograms, the wire codec |
//!
//! Rules that hold everywhere: no panic on any input from outside (each operation returns its
//! own small error enum and changes nothing on error), no clock, no RNG and no randomly seeded
//! hasher, integer-exact counters and ratios, memory fixed at construction, no `unsafe`.
#![no_std]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod allocator;
pub mod block_pool;
pub mod capacity;
pub mod curve;
pub mod hashing;
pub mod key;
pub mod manager;
pub mod ratio;
mod reserve;
pub mod simple;
pub mod stats;

pub use key::{BlockKey, OffloadKey};
pub use reserve::AllocError;
