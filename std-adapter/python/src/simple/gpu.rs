//! vLLM's own Python `BlockPool` (`vllm.v1.core.block_pool.BlockPool`, the pool vLLM's
//! scheduler binds with `bind_gpu_block_pool`) as the core's [`GpuBlocks`].
//!
//! Every read goes to the pool's objects (`blocks[i]._block_hash`, `ref_cnt`, the free queue's
//! links, `cached_block_hash_to_block`, `cached_block_hashes_by_block`), and every pin or release is the pool's own `touch` /
//! `free_blocks`, so vLLM's pool stays the one record of the GPU side. The core's trait cannot
//! fail; the first Python error a call meets is kept ([`PyGpu::finish`]) and raised once the
//! core's call returns.

use std::cell::RefCell;

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockHash;
use kvtier_core::simple::GpuBlocks;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::hashes::{ABSENT, KeysCell, decode_position};

/// One call's view of the GPU pool.
pub(super) struct PyGpu<'a, 'py> {
    py: Python<'py>,
    pool: &'a Bound<'py, PyAny>,
    blocks: Bound<'py, PyList>,
    num_blocks: u32,
    keys: &'a KeysCell,
    /// The `request.block_hashes` lists that position-encoded keys of this call name, the
    /// first being list number `list_base`.
    hash_lists: &'a [Bound<'py, PyAny>],
    list_base: usize,
    err: RefCell<Option<PyErr>>,
}

impl<'a, 'py> PyGpu<'a, 'py> {
    /// The view of `pool` (a vLLM `BlockPool`).
    pub(super) fn new(
        pool: &'a Bound<'py, PyAny>,
        keys: &'a KeysCell,
        hash_lists: &'a [Bound<'py, PyAny>],
        list_base: usize,
    ) -> PyResult<Self> {
        let py = pool.py();
        let blocks = pool.getattr(intern!(py, "blocks"))?.cast_into::<PyList>()?;
        let num_blocks = u32::try_from(blocks.len()).unwrap_or(u32::MAX);
        Ok(PyGpu {
            py,
            pool,
            blocks,
            num_blocks,
            keys,
            hash_lists,
            list_base,
            err: RefCell::new(None),
        })
    }

    /// The first Python error the core's call met through this view, if any.
    pub(super) fn finish(self) -> PyResult<()> {
        match self.err.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Keeps the first error; the value of a failed read is `None`.
    fn ok<T>(&self, r: PyResult<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let mut slot = self.err.borrow_mut();
                if slot.is_none() {
                    *slot = Some(e);
                }
                None
            }
        }
    }

    fn block(&self, id: u32) -> PyResult<Bound<'py, PyAny>> {
        self.blocks.get_item(id as usize)
    }

    fn block_id(blk: &Bound<'py, PyAny>) -> PyResult<u32> {
        blk.getattr(intern!(blk.py(), "block_id"))?.extract()
    }

    fn read_hash(&self, block: u32) -> PyResult<Option<BlockHash<BlockKey>>> {
        let blk = self.block(block)?;
        let h = blk.getattr(intern!(self.py, "_block_hash"))?;
        if h.is_none() {
            return Ok(None);
        }
        let (id, group) = self.keys.borrow_mut().intern_key(h.cast::<PyBytes>()?)?;
        let n = blk.getattr(intern!(self.py, "_block_hash_num_tokens"))?;
        let num_tokens = if n.is_none() { 0 } else { n.extract()? };
        Ok(Some(BlockHash {
            key: BlockKey::new(u64::from(id), group),
            num_tokens,
        }))
    }

    fn find_cached(&self, key: BlockKey) -> PyResult<Option<u32>> {
        if key.hash == ABSENT {
            return Ok(None);
        }
        if let Some((list, idx)) = decode_position(key.hash) {
            // A request's own hash (no group): vLLM's `get_cached_block(hash, [group])`.
            let Some(hashes) = list
                .checked_sub(self.list_base)
                .and_then(|l| self.hash_lists.get(l))
            else {
                return Ok(None);
            };
            let raw = hashes.get_item(idx)?;
            let got = self
                .pool
                .call_method1(intern!(self.py, "get_cached_block"), (raw, vec![key.group]))?;
            if got.is_none() {
                return Ok(None);
            }
            return Self::block_id(&got.get_item(0)?).map(Some);
        }
        let Some(full) = self.keys.borrow().key_object(self.py, key.hash, key.group) else {
            return Ok(None);
        };
        let map = self
            .pool
            .getattr(intern!(self.py, "cached_block_hash_to_block"))?;
        let got = map.call_method1(intern!(self.py, "get_one_block"), (full,))?;
        if got.is_none() {
            return Ok(None);
        }
        Self::block_id(&got).map(Some)
    }

    fn read_secondaries(&self, block: u32, sink: &mut dyn FnMut(BlockKey)) -> PyResult<()> {
        let by_block = self
            .pool
            .getattr(intern!(self.py, "cached_block_hashes_by_block"))?;
        let got = by_block.call_method1(intern!(self.py, "get"), (block,))?;
        if got.is_none() {
            return Ok(());
        }
        for key in got.try_iter()? {
            let (id, group) = self.keys.borrow_mut().intern_key(key?.cast::<PyBytes>()?)?;
            sink(BlockKey::new(u64::from(id), group));
        }
        Ok(())
    }

    fn call_with_blocks(&self, method: &Bound<'py, pyo3::types::PyString>, ids: &[u32]) {
        let r = (|| -> PyResult<()> {
            let list = PyList::empty(self.py);
            for &b in ids {
                list.append(self.block(b)?)?;
            }
            self.pool.call_method1(method, (list,))?;
            Ok(())
        })();
        self.ok(r);
    }
}

impl<'py> GpuBlocks for PyGpu<'_, 'py> {
    fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    fn block_hash(&self, block: u32) -> Option<BlockHash<BlockKey>> {
        let r = self.read_hash(block);
        self.ok(r).flatten()
    }

    fn ref_count(&self, block: u32) -> u32 {
        let r = self
            .block(block)
            .and_then(|b| b.getattr(intern!(self.py, "ref_cnt"))?.extract::<u32>());
        self.ok(r).unwrap_or(0)
    }

    fn cached_block(&self, key: BlockKey) -> Option<u32> {
        let r = self.find_cached(key);
        self.ok(r).flatten()
    }

    fn request_key(&self, key: BlockKey) -> BlockKey {
        let Some((list, idx)) = decode_position(key.hash) else {
            return key;
        };
        let r = (|| -> PyResult<u64> {
            let Some(hashes) = list
                .checked_sub(self.list_base)
                .and_then(|l| self.hash_lists.get(l))
            else {
                return Ok(ABSENT);
            };
            self.keys.borrow().find_raw(&hashes.get_item(idx)?)
        })();
        BlockKey::new(self.ok(r).unwrap_or(ABSENT), key.group)
    }

    fn secondary_hashes(&self, block: u32, mut sink: impl FnMut(BlockKey)) {
        let r = self.read_secondaries(block, &mut sink);
        self.ok(r);
    }

    fn free_queue_after(&self, cursor: Option<u32>) -> impl Iterator<Item = u32> + '_ {
        // `FreeKVCacheBlockQueue.iter_blocks_after`: from the cursor's successor (the head's
        // when `None`) up to the fake tail.
        let start = (|| -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
            let q = self.pool.getattr(intern!(self.py, "free_block_queue"))?;
            let tail = q.getattr(intern!(self.py, "fake_free_list_tail"))?;
            let from = match cursor {
                None => q.getattr(intern!(self.py, "fake_free_list_head"))?,
                Some(c) => self.block(c)?,
            };
            Ok((from.getattr(intern!(self.py, "next_free_block"))?, tail))
        })();
        let mut state = self.ok(start);
        core::iter::from_fn(move || {
            let (cur, tail) = state.take()?;
            if cur.is_none() || cur.is(&tail) {
                return None;
            }
            let step = (|| -> PyResult<(u32, Bound<'py, PyAny>)> {
                Ok((
                    Self::block_id(&cur)?,
                    cur.getattr(intern!(self.py, "next_free_block"))?,
                ))
            })();
            let (id, next) = self.ok(step)?;
            state = Some((next, tail));
            Some(id)
        })
    }

    fn touch(&mut self, blocks: &[u32]) {
        self.call_with_blocks(intern!(self.py, "touch"), blocks);
    }

    fn free(&mut self, blocks: &[u32]) {
        self.call_with_blocks(intern!(self.py, "free_blocks"), blocks);
    }
}
