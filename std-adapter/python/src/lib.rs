//! The `kvtier` Python package's native module, `kvtier._native`: kvtier's offload manager
//! behind vLLM 0.33.0's `OffloadingManager` calling conventions (see `python/kvtier/vllm.py`),
//! and its simple offloader's scheduler behind `python/kvtier/simple/`.
//!
//! `manager` is `kvtier._native.Manager` and its parts (key arguments, request state, the
//! vLLM objects it answers with), `simple` is `kvtier._native.SimpleScheduler` and its CPU
//! pool view; `keys`, the interning of vLLM's bytes keys, serves both.
//!
//! The binding reaches past PyO3 into CPython's C API where PyO3's safe calls cost more than
//! the manager's own work (`manager`'s list building, key collection, position reads, object
//! creation and `lookup`'s raw entry). Every `unsafe` block says why it is sound in a
//! `// SAFETY:` comment; the lint below keeps it so.
#![deny(clippy::undocumented_unsafe_blocks)]

mod keys;
mod manager;
mod simple;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<manager::Manager>()?;
    m.add_class::<manager::request::RequestState>()?;
    m.add_class::<simple::SimpleScheduler>()?;
    m.add_class::<simple::CpuBlockPool>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
