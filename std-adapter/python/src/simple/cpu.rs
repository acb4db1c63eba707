//! `kvtier._native.CpuBlockPool`: the scheduler's CPU [`BlockPool`](kvtier_core::block_pool)
//! as `kvtier.simple` exposes it (vLLM's `cpu_block_pool`): free count, live ref counts and
//! key objects, lookup by key, and the checked `touch` / `free_blocks` / `get_new_blocks` /
//! `cache_full_blocks`.
//!
//! Keys come back as the GPU block key objects the interner holds (vLLM's
//! `BlockHashWithGroupId` bytes), and a lookup takes the same bytes, so what a block answers
//! compares equal to what vLLM's own code builds with `make_block_hash_with_group_id`.

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use kvtier_core::BlockKey;

use super::SimpleScheduler;

/// A view of one scheduler's CPU pool; every answer is read live from the scheduler.
#[pyclass(module = "kvtier._native")]
pub(crate) struct CpuBlockPool {
    pub(super) sched: Py<SimpleScheduler>,
}

impl CpuBlockPool {
    fn check(s: &SimpleScheduler, block: u32) -> PyResult<()> {
        let n = s.s.cpu_pool().num_blocks();
        if block >= n {
            return Err(PyIndexError::new_err(format!(
                "CPU block {block} is out of range (the pool has {n})"
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl CpuBlockPool {
    /// The pool's blocks, the null block (0) included.
    fn num_blocks(&self, py: Python<'_>) -> u32 {
        self.sched.borrow(py).s.cpu_pool().num_blocks()
    }

    /// Blocks in the free queue (`get_num_free_blocks`).
    fn free_count(&self, py: Python<'_>) -> u32 {
        self.sched.borrow(py).s.cpu_pool().free_count()
    }

    /// Block `block`'s reference count (0 for the null block).
    ///
    /// # Errors
    /// `IndexError` for a block out of range.
    fn ref_cnt(&self, py: Python<'_>, block: u32) -> PyResult<u32> {
        let s = self.sched.borrow(py);
        Self::check(&s, block)?;
        Ok(s.s.cpu_pool().ref_count(block).unwrap_or(0))
    }

    /// The key object block `block` holds (hash ‖ group, vLLM's `BlockHashWithGroupId`),
    /// `None` for none.
    ///
    /// # Errors
    /// `IndexError` for a block out of range.
    fn block_hash(&self, py: Python<'_>, block: u32) -> PyResult<Option<Py<PyBytes>>> {
        let s = self.sched.borrow(py);
        Self::check(&s, block)?;
        let keys = s.keys.borrow();
        Ok(s.s
            .cpu_pool()
            .block_hash(block)
            .and_then(|h| keys.key_object(py, h.key.hash, h.key.group))
            .map(Bound::unbind))
    }

    /// The prefix tokens block `block`'s hash covers (`block_hash_num_tokens`), `None` without
    /// a hash.
    ///
    /// # Errors
    /// `IndexError` for a block out of range.
    fn block_hash_num_tokens(&self, py: Python<'_>, block: u32) -> PyResult<Option<u64>> {
        let s = self.sched.borrow(py);
        Self::check(&s, block)?;
        Ok(s.s.cpu_pool().block_hash(block).map(|h| h.num_tokens))
    }

    /// The key objects of block `block`'s secondary hashes (`cached_block_hashes_by_block`),
    /// in insertion order.
    ///
    /// # Errors
    /// `IndexError` for a block out of range.
    fn secondary_hashes(&self, py: Python<'_>, block: u32) -> PyResult<Vec<Py<PyBytes>>> {
        let s = self.sched.borrow(py);
        Self::check(&s, block)?;
        let keys = s.keys.borrow();
        Ok(s.s
            .cpu_pool()
            .secondary_hashes(block)
            .filter_map(|k| keys.key_object(py, k.hash, k.group))
            .map(Bound::unbind)
            .collect())
    }

    /// The block cached under `key` (`cached_block_hash_to_block.get_one_block`), the first
    /// cached when several share it; `None` when no block holds it.
    ///
    /// # Errors
    /// `TypeError` when `key` is not `bytes`.
    fn get_one_block(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        let s = self.sched.borrow(py);
        let Some((id, group)) = s.keys.borrow().find_key(key)? else {
            return Ok(None);
        };
        Ok(s.s
            .cpu_pool()
            .get_one_block(&BlockKey::new(u64::from(id), group)))
    }

    /// `touch`: one more reference on each block, in order.
    ///
    /// # Errors
    /// `ValueError` for a block out of range or a count overflow; nothing changes then.
    fn touch(&self, py: Python<'_>, blocks: Vec<u32>) -> PyResult<()> {
        let mut s = self.sched.borrow_mut(py);
        s.s.cpu_touch(&blocks)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// `get_new_blocks`: `n` blocks from the front of the free queue, each with one
    /// reference (their hashes removed).
    ///
    /// # Errors
    /// `ValueError` when fewer than `n` blocks are free; nothing changes then.
    fn get_new_blocks(&self, py: Python<'_>, n: u32) -> PyResult<Vec<u32>> {
        let mut s = self.sched.borrow_mut(py);
        let mut got = Vec::new();
        s.s.cpu_get_new_blocks(n, |b| got.push(b))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(got)
    }

    /// `cache_full_blocks`: `blocks[i]` under the key object `keys[i]` (vLLM's
    /// `BlockHashWithGroupId` bytes, the request's hash at the block's end) over
    /// `(i + 1) · block_size` tokens, for `i` in `num_cached..num_full`.
    ///
    /// # Errors
    /// `ValueError` for a key of fewer than 4 bytes or what the pool refuses (lists too short,
    /// a block out of range, one already hashed); nothing changes then.
    fn cache_full_blocks(
        &self,
        py: Python<'_>,
        blocks: Vec<u32>,
        keys: Vec<Bound<'_, PyBytes>>,
        num_cached: u32,
        num_full: u32,
        block_size: u32,
    ) -> PyResult<()> {
        let mut s = self.sched.borrow_mut(py);
        let mut interned = Vec::with_capacity(keys.len());
        {
            let mut k = s.keys.borrow_mut();
            for key in &keys {
                let (id, group) = k.intern_key(key)?;
                interned.push(BlockKey::new(u64::from(id), group));
            }
        }
        s.s.cpu_cache_full_blocks(&blocks, &interned, num_cached, num_full, block_size)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// `free_blocks`: one reference less on each block, in eviction order.
    ///
    /// # Errors
    /// `ValueError` for a block out of range or not in use; nothing changes then.
    fn free_blocks(&self, py: Python<'_>, blocks: Vec<u32>) -> PyResult<()> {
        let mut s = self.sched.borrow_mut(py);
        s.s.cpu_free_blocks(&blocks)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
