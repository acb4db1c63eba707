//! The core's errors as Python exceptions: a bound of kvtier's fixed tables passed is a
//! `RuntimeError` naming the extra-config key that raises it; an input vLLM's manager asserts
//! on is an `AssertionError`; any other input out of range a `ValueError`.

use kvtier_core::simple::{AllocStateError, InputError};
use pyo3::PyErr;
use pyo3::exceptions::{PyAssertionError, PyRuntimeError, PyValueError};

/// The exception for an [`InputError`].
pub(super) fn input_error(e: InputError) -> PyErr {
    match e {
        InputError::TooManyRequests => PyRuntimeError::new_err(format!(
            "{e} (kvtier_max_requests in kv_connector_extra_config raises the bound)"
        )),
        InputError::TooManyBlocks { .. } => PyRuntimeError::new_err(format!(
            "{e} (kvtier_max_blocks_per_request in kv_connector_extra_config raises the bound)"
        )),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// The exception for an [`AllocStateError`] (vLLM asserts each of its own cases).
pub(super) fn alloc_error(e: AllocStateError) -> PyErr {
    match e {
        AllocStateError::Input(
            e @ (InputError::TooManyRequests | InputError::TooManyBlocks { .. }),
        ) => input_error(e),
        _ => PyAssertionError::new_err(e.to_string()),
    }
}
