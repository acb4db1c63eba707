//! # kvtier
//!
//! The std side of kvtier: the `kvtier` command (trace replay, capacity sizing), the kvtrace
//! reader and generator, layout readers, and the Prometheus text exposition of stats payloads,
//! all around [`kvtier_core`].

pub mod cli;
pub mod error;
pub mod export;
pub mod exposition;
pub mod http;
pub mod layout;
pub mod plot;
pub mod replay;
pub mod shared;
pub mod sweep;
pub mod trace;

/// The README's Rust examples, compiled and run as doctests so they cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
