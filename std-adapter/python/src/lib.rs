//! The `kvtier` Python package's native module, `kvtier._native`: kvtier's offload manager
//! behind vLLM 0.33.0's `OffloadingManager` calling conventions (see `python/kvtier/vllm.py`).

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
