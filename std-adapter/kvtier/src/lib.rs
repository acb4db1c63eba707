#![doc = include_str!("../README.md")]

pub mod error;
pub mod export;
pub mod http;
pub mod kv_events;
pub mod memory;
pub mod shared;
pub mod sync;

pub use error::Error;
