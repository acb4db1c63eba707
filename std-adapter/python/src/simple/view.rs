//! What every method of [`SimpleScheduler`] starts from: the bound GPU pool, and the
//! position keys of the request hash lists a call passes.

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;

use super::SimpleScheduler;
use super::hashes::{ABSENT, encode_position};

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

    /// A lookup's hash list: the request's hashes after the computed ones as key ids
    /// ([`ABSENT`] for a hash no CPU block can hold), as many as the core's lookup can read
    /// (EAGLE's margin past the cap included).
    pub(super) fn lookup_hashes(
        &self,
        block_hashes: &Bound<'_, PyAny>,
        num_tokens: u64,
        num_computed_tokens: u64,
        skip_reading_prefix_cache: bool,
    ) -> PyResult<Vec<u64>> {
        let bs = u64::from(self.s.config().block_size);
        let v = self.s.validated();
        let hash = u64::from(v.hash_block_size);
        // Every group's block is the hash block: the hit is full attention's leading run, so
        // it ends at the first hash the CPU pool cannot hold. Otherwise a later hash may
        // still end a hit (a whole block's key past an interior boundary never stored).
        let leading_run = v.hash_blocks_per_block == 1;
        let mut hashes = Vec::new();
        if !skip_reading_prefix_cache && num_computed_tokens.is_multiple_of(bs) {
            let n = block_hashes.len()?;
            let skipped = usize::try_from(num_computed_tokens / hash).unwrap_or(usize::MAX);
            let cap = self.s.lookup_hash_count(num_tokens, num_computed_tokens);
            let end = n.min(skipped.saturating_add(usize::try_from(cap).unwrap_or(usize::MAX)));
            hashes.resize(skipped.min(n), ABSENT);
            let keys = self.keys.borrow();
            for i in skipped..end {
                let h = keys.find_raw(&block_hashes.get_item(i)?)?;
                hashes.push(h);
                if h == ABSENT && leading_run {
                    break;
                }
            }
        }
        Ok(hashes)
    }
}
