//! What every method of [`SimpleScheduler`] starts from: the bound GPU pool, and the
//! position keys of the request hash lists a call passes.

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;

use super::SimpleScheduler;
use super::hashes::encode_position;

impl SimpleScheduler {
    /// The bound GPU pool.
    pub(super) fn pool<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.pool {
            Some(p) => Ok(p.bind(py).clone()),
            None => Err(PyAssertionError::new_err(
                "bind_gpu_block_pool() must be called before the GPU pool is used",
            )),
        }
    }

    /// Appends the position keys of `hashes` (the call's `list`-th hash list, `None` for
    /// none) to `positions`, returning their range.
    pub(super) fn push_positions(
        &mut self,
        list: usize,
        hashes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(usize, usize)> {
        let start = self.positions.len();
        let n = match hashes {
            Some(h) => h.len()?,
            None => 0,
        };
        for i in 0..n {
            let p = encode_position(list, i)
                .ok_or_else(|| PyValueError::new_err("too many block hashes in one call"))?;
            self.positions.push(p);
        }
        Ok((start, self.positions.len()))
    }
}
