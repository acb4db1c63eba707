//! vLLM's block hashes as the core's [`BlockKey`](kvtier_core::BlockKey) hashes.
//!
//! A GPU block's key (`BlockHashWithGroupId`: the block hash ‖ the group's 4 bytes) is
//! interned ([`crate::keys::Interner`]) to a dense id by its block-hash part alone, so that a
//! request's own hash (`request.block_hashes[i]`, no group) finds the same id; the group
//! becomes the core key's `group` (a hybrid model keys one hash in both of its groups). The
//! core keeps keys across calls only in its CPU pool, so a sweep ([`HashKeys::maybe_sweep`])
//! keeps the ids the CPU pool holds and frees the rest: the interner stays within twice the
//! CPU pool's keys.
//!
//! Two more values a key's `hash` can carry, never an id (ids are below 2^32):
//! - [`ABSENT`]: a request hash no GPU block key was ever interned under, so the CPU pool
//!   cannot hold it;
//! - a *position* ([`encode_position`]): "the `idx`-th hash of the `list`-th hash list of this
//!   call", read from the Python list when the core asks the GPU pool for it (a null block's
//!   recovery), so a scan interns nothing for the hashes it only counts.

use core::hash::BuildHasher;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use kvtier_core::hashing::FixedState;
use kvtier_core::simple::SimpleScheduler;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::keys::Interner;

/// The key hash of a request hash the CPU pool cannot hold.
pub(super) const ABSENT: u64 = 1 << 62;

const POSITION: u64 = 1 << 63;
const INDEX_BITS: u32 = 40;
const MAX_LISTS: usize = 1 << 22;

/// The key hash naming `request.block_hashes[idx]` of the call's `list`-th hash list, or
/// `None` beyond the encodable range (2^22 lists, 2^40 hashes each).
pub(super) fn encode_position(list: usize, idx: usize) -> Option<u64> {
    let idx = u64::try_from(idx).ok().filter(|&i| i < 1 << INDEX_BITS)?;
    let list = u64::try_from(list).ok().filter(|&l| l < MAX_LISTS as u64)?;
    Some(POSITION | (list << INDEX_BITS) | idx)
}

/// The `(list, idx)` a position-encoded key hash names.
pub(super) fn decode_position(hash: u64) -> Option<(usize, usize)> {
    if hash & POSITION == 0 {
        return None;
    }
    let idx = usize::try_from(hash & ((1 << INDEX_BITS) - 1)).ok()?;
    let list = usize::try_from((hash & !POSITION) >> INDEX_BITS).ok()?;
    Some((list, idx))
}

/// [`HashKeys`] as the scheduler holds them: behind a lock that never waits, so that the
/// scheduler may be called from any thread (one call at a time: PyO3 refuses a call while
/// another holds the scheduler, with `RuntimeError`). A borrow that conflicts with one still
/// held panics, as a `RefCell`'s does; a lock poisoned by such a panic is taken over.
#[derive(Debug, Default)]
pub(super) struct KeysCell(RwLock<HashKeys>);

impl KeysCell {
    /// Shared access.
    pub(super) fn borrow(&self) -> RwLockReadGuard<'_, HashKeys> {
        match self.0.try_read() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => conflict(),
        }
    }

    /// Exclusive access.
    pub(super) fn borrow_mut(&self) -> RwLockWriteGuard<'_, HashKeys> {
        match self.0.try_write() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => PoisonError::into_inner(p),
            Err(TryLockError::WouldBlock) => conflict(),
        }
    }
}

#[cold]
fn conflict() -> ! {
    panic!("the scheduler's hash keys are already borrowed")
}

/// The interner of GPU block keys.
#[derive(Debug, Default)]
pub(super) struct HashKeys {
    keys: Interner<Py<PyBytes>>,
    hasher: FixedState,
}

/// Whether the held key object `held` (hash ‖ any group) has the block-hash part `raw`.
fn has_raw<'a>(py: Python<'a>, raw: &'a [u8]) -> impl Fn(&Py<PyBytes>) -> bool + 'a {
    move |held| {
        let b = held.bind(py).as_bytes();
        b.len() == raw.len() + 4 && b.starts_with(raw)
    }
}

/// A key's block-hash part and its group (`BlockHashWithGroupId`: the hash ‖ the group's
/// 4 bytes, big-endian), `None` for fewer than 4 bytes.
fn split_key(bytes: &[u8]) -> Option<(&[u8], u32)> {
    let n = bytes.len().checked_sub(4)?;
    let (raw, group) = bytes.split_at(n);
    Some((raw, u32::from_be_bytes(group.try_into().ok()?)))
}

impl HashKeys {
    /// The id and group of a GPU block's key (`hash ‖ u32_be(group)`), interning its hash.
    ///
    /// # Errors
    /// `ValueError` for a key of fewer than 4 bytes; `RuntimeError` when 2^32 − 1 keys are
    /// live.
    pub(super) fn intern_key(&mut self, key: &Bound<'_, PyBytes>) -> PyResult<(u32, u32)> {
        let Some((raw, group)) = split_key(key.as_bytes()) else {
            return Err(PyValueError::new_err("a block key has fewer than 4 bytes"));
        };
        let h = self.hasher.hash_one(raw);
        let k = self
            .keys
            .intern(h, raw, has_raw(key.py(), raw), || key.clone().unbind())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok((k.id(), group))
    }

    /// The key hash of a request's block hash: its id if interned, else [`ABSENT`].
    pub(super) fn find_raw(&self, raw: &Bound<'_, PyAny>) -> PyResult<u64> {
        let b = raw.cast::<PyBytes>()?;
        let bytes = b.as_bytes();
        let h = self.hasher.hash_one(bytes);
        Ok(self
            .keys
            .find(h, has_raw(raw.py(), bytes))
            .map_or(ABSENT, |k| u64::from(k.id())))
    }

    /// The id and group of a GPU block key object (`hash ‖ u32_be(group)`), `None` when its
    /// hash was never interned (no CPU block can hold it then).
    pub(super) fn find_key(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<(u32, u32)>> {
        let b = key.cast::<PyBytes>()?;
        let Some((raw, group)) = split_key(b.as_bytes()) else {
            return Ok(None);
        };
        let h = self.hasher.hash_one(raw);
        Ok(self
            .keys
            .find(h, has_raw(key.py(), raw))
            .map(|k| (k.id(), group)))
    }

    /// The key object of id `hash` in group `group` (vLLM's `BlockHashWithGroupId`), if
    /// live: the object interned when it names that group, else a new one.
    pub(super) fn key_object<'py>(
        &self,
        py: Python<'py>,
        hash: u64,
        group: u32,
    ) -> Option<Bound<'py, PyBytes>> {
        let held = self.value(hash)?.bind(py);
        let bytes = held.as_bytes();
        let (raw, g) = split_key(bytes)?;
        if g == group {
            return Some(held.clone());
        }
        let mut out = Vec::with_capacity(bytes.len());
        out.extend_from_slice(raw);
        out.extend_from_slice(&group.to_be_bytes());
        Some(PyBytes::new(py, &out))
    }

    /// The key object of id `hash`, if live.
    pub(super) fn value(&self, hash: u64) -> Option<&Py<PyBytes>> {
        let id = u32::try_from(hash).ok()?;
        self.keys.value(&self.keys.key_of(id)?)
    }

    /// Keys interned now.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Frees every id the scheduler's CPU pool does not hold (as a block's hash or a
    /// secondary hash), when enough were interned since the last sweep.
    pub(super) fn maybe_sweep(&mut self, s: &SimpleScheduler) {
        if !self.keys.sweep_due() {
            return;
        }
        let keys = &self.keys;
        let mut held = Vec::new();
        let cpu = s.cpu_pool();
        for b in 0..cpu.num_blocks() {
            let primary = cpu.block_hash(b).map(|h| h.key);
            for key in primary.into_iter().chain(cpu.secondary_hashes(b)) {
                if let Some(k) = u32::try_from(key.hash).ok().and_then(|id| keys.key_of(id)) {
                    held.push(k);
                }
            }
        }
        self.keys
            .sweep(|f| held.iter().for_each(f), |v| v.as_ptr() as usize);
    }
}
