//! # kvtier
//!
//! The std side of kvtier: the `kvtier` command (trace replay, capacity sizing), the kvtrace
//! reader and generator, and (in later work) Prometheus export and threaded access around
//! [`kvtier_core`].

pub mod cli;
pub mod trace;
