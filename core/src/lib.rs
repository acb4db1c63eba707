#![doc = include_str!("../README.md")]
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
