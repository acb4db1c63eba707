//! Fallible construction of the manager's fixed arrays, so that a capacity too large for the
//! machine is a [`ConfigError::OutOfMemory`](super::ConfigError::OutOfMemory), not an abort.

use alloc::vec::Vec;
use hashbrown::HashTable;

/// An allocation at construction failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutOfMemory;

/// `n` copies of `v`.
pub(crate) fn filled<T: Clone>(n: usize, v: T) -> Result<Vec<T>, OutOfMemory> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| OutOfMemory)?;
    out.resize(n, v);
    Ok(out)
}

/// An empty vector with room for `n` elements.
pub(crate) fn with_capacity<T>(n: usize) -> Result<Vec<T>, OutOfMemory> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| OutOfMemory)?;
    Ok(out)
}

/// The ids `n−1, …, 1, 0` (a free stack popping ascending ids).
pub(crate) fn descending(n: u32) -> Result<Vec<u32>, OutOfMemory> {
    let mut out = with_capacity(n as usize)?;
    out.extend((0..n).rev());
    Ok(out)
}

/// An empty hash table with room for `n` entries.
pub(crate) fn table<T>(n: usize) -> Result<HashTable<T>, OutOfMemory> {
    let mut t = HashTable::new();
    // The table is empty, so the rehash closure is never called.
    t.try_reserve(n, |_| 0).map_err(|_| OutOfMemory)?;
    Ok(t)
}
