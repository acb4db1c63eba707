//! Fallible allocation for fixed-size structures: one error ([`AllocError`]), reservations that
//! fail instead of aborting, the exact byte counts they take, and [`Lazy`], a fixed-length
//! array whose memory is reserved up front but written only where it is used.
//!
//! Reserving does not touch the pages of an allocation; writing does. A structure sized by a
//! capacity reserves its arrays here and fills them on demand, so a large tier costs the
//! machine only the part of it that holds data.

use alloc::vec::Vec;
use core::fmt;
use hashbrown::HashTable;

/// An allocation of a fixed-size structure failed: the memory cannot be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocError;

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("out of memory")
    }
}

impl core::error::Error for AllocError {}

/// An empty vector with room for exactly `n` elements (`n · size_of::<T>()` bytes).
pub(crate) fn with_capacity<T>(n: usize) -> Result<Vec<T>, AllocError> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| AllocError)?;
    Ok(out)
}

/// `n` copies of `v` (writes every element: for arrays that are used whole from the start).
pub(crate) fn filled<T: Clone>(n: usize, v: T) -> Result<Vec<T>, AllocError> {
    let mut out = with_capacity(n)?;
    out.resize(n, v);
    Ok(out)
}

/// An empty hash table with room for `n` entries ([`table_bytes`] bytes).
pub(crate) fn table<T>(n: usize) -> Result<HashTable<T>, AllocError> {
    let mut t = HashTable::new();
    // The table is empty, so the rehash closure is never called.
    t.try_reserve(n, |_| 0).map_err(|_| AllocError)?;
    Ok(t)
}

/// `n · size`, saturating (a byte count that cannot be had anyway).
#[must_use]
pub(crate) const fn array_bytes(n: u64, size: usize) -> u64 {
    n.saturating_mul(size as u64)
}

/// The bytes [`table`] allocates for `n` entries of `T`: hashbrown's bucket count (a power of
/// two at most 87.5 % full, at least 4) times the entry size, padded to the control-byte
/// alignment, plus one control byte per bucket and one trailing group. Computed for a group
/// width of 16 (SSE2); targets with 8-byte groups allocate at most 8 bytes less.
#[must_use]
pub(crate) fn table_bytes<T>(n: u64) -> u64 {
    const GROUP: u64 = 16;
    if n == 0 {
        return 0;
    }
    let size = core::mem::size_of::<T>() as u64;
    let buckets = if n < 15 {
        let min = match size {
            0..=1 => 14,
            2..=3 => 7,
            _ => 3,
        };
        match n.max(min) {
            0..=3 => 4,
            4..=7 => 8,
            _ => 16,
        }
    } else {
        match n
            .checked_mul(8)
            .and_then(|a| (a / 7).checked_next_power_of_two())
        {
            Some(b) => b,
            None => return u64::MAX,
        }
    };
    let align = GROUP.max(core::mem::align_of::<T>() as u64);
    let data = size.saturating_mul(buckets).saturating_add(align - 1) & !(align - 1);
    data.saturating_add(buckets).saturating_add(GROUP)
}

/// Writes `x` at `v[i]` within `v`'s reserved capacity, growing `v` with copies of `x` when
/// `i` is at or past its end (so a vector filled in ascending index order is written exactly
/// where it is used). An index at or past the capacity is ignored.
#[inline]
pub(crate) fn put<T: Copy>(v: &mut Vec<T>, i: usize, x: T) {
    if let Some(slot) = v.get_mut(i) {
        *slot = x;
    } else if i < v.capacity() {
        v.resize(i + 1, x);
    }
}

/// A fixed-length array of `len` elements whose memory is reserved at construction and
/// written only up to the highest index set so far; unset elements read as the fill value.
///
/// Setting an element beyond the written part fills the gap first (within the reserved
/// memory, so it never allocates). Structures that hand out indices in ascending order, as
/// the slot pool does, write exactly the elements they use.
#[derive(Clone, Debug)]
pub(crate) struct Lazy<T> {
    v: Vec<T>,
    len: usize,
    fill: T,
}

impl<T: Copy> Lazy<T> {
    /// `len` elements reading as `fill`, none written.
    pub(crate) fn new(len: usize, fill: T) -> Result<Self, AllocError> {
        Ok(Lazy {
            v: with_capacity(len)?,
            len,
            fill,
        })
    }

    /// The bytes [`Lazy::new`] allocates for `len` elements.
    #[must_use]
    pub(crate) const fn bytes(len: u64) -> u64 {
        array_bytes(len, core::mem::size_of::<T>())
    }

    /// Element `i` (the fill value where unset or out of range).
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> T {
        match self.v.get(i) {
            Some(&x) => x,
            None => self.fill,
        }
    }

    /// Sets element `i < len`; an index out of range is ignored.
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, x: T) {
        if let Some(slot) = self.v.get_mut(i) {
            *slot = x;
        } else {
            self.grow(i, x);
        }
    }

    /// Element `i < len` for writing, with the written prefix extended to it first (`None`
    /// out of range).
    #[inline(always)]
    pub(crate) fn slot(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.v.len() {
            self.grow(i, self.fill);
        }
        self.v.get_mut(i)
    }

    /// The first write at or past the written prefix: extends it (within the reserved
    /// capacity) to `i`. Kept out of line so that the common write stays small enough to
    /// inline into the list and rank operations.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, i: usize, x: T) {
        if i < self.len {
            self.v.resize(i, self.fill);
            self.v.push(x);
        }
    }

    /// The written prefix (every element at or beyond its end reads as the fill value).
    #[inline]
    pub(crate) fn written(&self) -> &[T] {
        &self.v
    }

    /// Every element back to the fill value (keeps the memory).
    pub(crate) fn clear(&mut self) {
        self.v.clear();
    }

    /// Bytes of heap held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.v.capacity() * core::mem::size_of::<T>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_reads_fill_until_set_and_fills_gaps() {
        let mut l = Lazy::new(5, 7u32).unwrap();
        assert_eq!((l.get(0), l.get(4), l.get(9)), (7, 7, 7));
        l.set(2, 1);
        assert_eq!(l.written(), &[7, 7, 1]);
        l.set(0, 3);
        l.set(5, 9);
        assert_eq!(l.written(), &[3, 7, 1]);
        l.clear();
        assert_eq!((l.written().len(), l.get(2)), (0, 7));
        assert_eq!(l.heap_bytes(), 20);
        *l.slot(3).unwrap() = 4;
        assert_eq!(l.written(), &[7, 7, 7, 4]);
        assert!(l.slot(5).is_none());
        assert_eq!(l.written().len(), 4);
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    fn table_bytes_match_hashbrown() {
        for n in [0usize, 1, 3, 4, 7, 8, 14, 15, 16, 100, 1000, 4096, 70_000] {
            let t = table::<u32>(n).unwrap();
            assert_eq!(
                table_bytes::<u32>(n as u64),
                t.allocation_size() as u64,
                "n = {n}"
            );
            let t = table::<(u64, u8)>(n).unwrap();
            assert_eq!(
                table_bytes::<(u64, u8)>(n as u64),
                t.allocation_size() as u64,
                "n = {n}"
            );
        }
        assert_eq!(table_bytes::<u32>(u64::MAX), u64::MAX);
    }
}
