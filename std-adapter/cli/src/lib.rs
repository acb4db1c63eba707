#![doc = include_str!("../README.md")]

mod cli;
pub mod convert;
pub mod engine;
mod error;
mod from_variants;
pub mod input;
pub mod layout;
mod numfmt;
pub mod replay;
pub mod serve;
pub mod sizing;
pub mod sweep;
pub mod tier;
pub mod trace;
pub mod workload;

pub use cli::{Cli, OutputError};
pub use error::Error;
