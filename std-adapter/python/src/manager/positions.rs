//! A request's end-token positions as the binding reads them: a `ReqContext`'s position map
//! (`_offload_key_positions`, a dict) read at a per-map cursor, and the checked conversion of a
//! position object.

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A key's end-token position, checked against the manager's bound here so that a bad
/// position fails the call before anything is made for it.
#[inline]
pub(crate) fn position(p: &Bound<'_, PyAny>) -> PyResult<u64> {
    p.extract::<u64>()
        .ok()
        .filter(|&v| i64::try_from(v).is_ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "end-token position {p} of a key is not an integer in 0..2^63"
            ))
        })
}

/// Entries of the position-map cursor cache (a power of two).
const CURSORS: usize = 256;

/// Where the last reading of each position map (a `ReqContext`'s `_offload_key_positions`,
/// named by its address) stopped. The scheduler records a request's positions in key order and
/// offers the keys in that order, so the entry after the last one read usually holds the next
/// key: reading it costs one step of the dict's iteration instead of a lookup. An entry is a
/// guess only: the entry found there is used only if its key is the very key object looked
/// for, else the map is looked up as `dict.get` does; a stale or reused address costs a miss.
#[derive(Debug)]
pub(crate) struct Cursors {
    slots: Box<[(usize, ffi::Py_ssize_t)]>,
}

impl Default for Cursors {
    fn default() -> Self {
        Cursors {
            slots: vec![(0, 0); CURSORS].into_boxed_slice(),
        }
    }
}

impl Cursors {
    #[inline]
    fn bucket(addr: usize) -> usize {
        let h = (addr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        usize::try_from(h >> (64 - CURSORS.trailing_zeros())).unwrap_or(0)
    }

    /// Where to start reading the map at `addr`.
    #[inline]
    fn start(&self, addr: usize) -> ffi::Py_ssize_t {
        match self.slots[Self::bucket(addr)] {
            (a, next) if a == addr => next,
            _ => 0,
        }
    }

    /// Remembers where reading `map` stopped.
    #[inline]
    pub(crate) fn store(&mut self, map: &PositionMap<'_>) {
        let addr = map.dict.as_ptr() as usize;
        self.slots[Self::bucket(addr)] = (addr, map.next);
    }
}

/// A position map being read, with its cursor (see [`Cursors`]).
pub(crate) struct PositionMap<'py> {
    dict: Bound<'py, PyDict>,
    next: ffi::Py_ssize_t,
}

/// What a [`PositionMap`]'s cursor held for a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The key's entry, holding an `int` in 0..2^63 (the cursor is now past it).
    Int(u64),
    /// The key's entry, holding something else.
    Other,
    /// Another entry, or none.
    Elsewhere,
}

impl<'py> PositionMap<'py> {
    pub(crate) fn new(dict: Bound<'py, PyDict>, cursors: &Cursors) -> Self {
        let next = cursors.start(dict.as_ptr() as usize);
        PositionMap { dict, next }
    }

    /// The value of the map's entry after `*pos` if its key is `key` (the very object),
    /// advancing `*pos` past it: a borrowed reference, valid until Python code runs. Runs
    /// no Python code.
    #[inline(always)]
    fn value_after(
        &self,
        pos: &mut ffi::Py_ssize_t,
        key: *mut ffi::PyObject,
    ) -> Option<*mut ffi::PyObject> {
        let mut k = std::ptr::null_mut();
        let mut v = std::ptr::null_mut();
        // SAFETY: `self.dict` is a live dict (a strong reference held by `self`), and `pos`,
        // `k`, `v` are valid places to write. PyDict_Next runs no Python code; the borrowed
        // references it leaves in `k` and `v` are valid until the dict changes, which only
        // Python code could do: `k` is only compared by address, and `v` is handed back
        // (never null when PyDict_Next returns true) to callers that read it, or make it a
        // strong reference, before any Python code runs.
        let found = unsafe { ffi::PyDict_Next(self.dict.as_ptr(), pos, &mut k, &mut v) } != 0;
        (found && std::ptr::eq(k, key)).then_some(v)
    }

    /// What the cursor holds for `key` (the very object); advances the cursor past an
    /// [`Step::Int`]. Runs no Python code.
    #[inline]
    pub(crate) fn int_at_cursor(&mut self, key: *mut ffi::PyObject) -> Step {
        let mut pos = self.next;
        let Some(v) = self.value_after(&mut pos, key) else {
            return Step::Elsewhere;
        };
        // SAFETY: `v` was just returned by `value_after`, and no Python code ran since.
        match unsafe { exact_position(v) } {
            Some(p) => {
                self.next = pos;
                Step::Int(p)
            }
            None => Step::Other,
        }
    }

    /// The position object `dict.get(key)` returns, once the cursor has been read for `key`
    /// (`step`, no Python code run since): the value of the entry whose key is `key` itself,
    /// at the cursor if it is there, else (for a cursor left by another map at the same
    /// address) at the map's start, else by lookup.
    #[inline]
    pub(crate) fn get(
        &mut self,
        key: &Bound<'py, PyAny>,
        step: Step,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut pos = self.next;
        let mut found = None;
        if step != Step::Elsewhere {
            found = self.value_after(&mut pos, key.as_ptr());
        }
        if found.is_none() && self.next != 0 {
            pos = 0;
            found = self.value_after(&mut pos, key.as_ptr());
        }
        match found {
            Some(v) => {
                self.next = pos;
                // SAFETY: `v` is the live value of a live entry (see `value_after`), made a
                // strong reference here before any Python code runs.
                Ok(Some(unsafe { Bound::from_borrowed_ptr(key.py(), v) }))
            }
            None => self.dict.get_item(key),
        }
    }
}

/// The position an exact `int` at `v` holds, if in 0..2^63 (anything else is read by
/// [`position`], which runs Python code). Runs no Python code.
///
/// # Safety
/// `v` is a live object (a reference [`PositionMap::value_after`] returned, no Python code
/// run since).
#[inline(always)]
unsafe fn exact_position(v: *mut ffi::PyObject) -> Option<u64> {
    // SAFETY: `v` is a live object (the caller's contract). For an exact `int`,
    // PyLong_AsLongLongAndOverflow runs no Python code and raises nothing: a value outside
    // i64 only sets `overflow`.
    let p = unsafe {
        if ffi::PyLong_CheckExact(v) == 0 {
            return None;
        }
        let mut overflow = 0;
        let p = ffi::PyLong_AsLongLongAndOverflow(v, &mut overflow);
        if overflow != 0 {
            return None;
        }
        p
    };
    u64::try_from(p).ok()
}
