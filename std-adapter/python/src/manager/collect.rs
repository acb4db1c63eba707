//! A call's key arguments read into manager keys: each key object resolved through the key
//! table (by identity when its cache knows the object, else by Python's hash and the bytes)
//! and, for the calls that order keys, its end-token position in the request context.

use pyo3::Borrowed;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{ffi, intern};

use super::positions::{Cursors, PositionMap, Step, position};
use super::request::Context;
use crate::keys::{Interner, VKey};

/// How a call treats keys the manager has never seen.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// Intern them (a store offer).
    Intern,
    /// Pass a key the manager cannot hold (it answers as for any absent key), as for any
    /// hashable key that is not bytes.
    Absent,
}

/// A call's keys as the manager takes them, in buffers reused from call to call.
#[derive(Debug, Default)]
pub(crate) struct KeyArgs {
    /// The manager keys of the last call's key objects, in their order.
    pub(crate) scratch: Vec<VKey>,
    /// Their end-token positions, when every key had one.
    pub(crate) positions: Vec<u64>,
    cursors: Cursors,
}

impl KeyArgs {
    /// Fills [`scratch`](Self::scratch) with the manager keys of `keys` and, if `ctx` is
    /// given and every key has an end-token position there, [`positions`](Self::positions).
    /// Returns whether positions were found.
    pub(crate) fn collect<'py>(
        &mut self,
        interner: &mut Interner<Py<PyBytes>>,
        keys: &Bound<'py, PyAny>,
        ctx: Option<Context<'_, 'py>>,
        unknown: Unknown,
    ) -> PyResult<bool> {
        let py = keys.py();
        self.scratch.clear();
        self.positions.clear();
        let source = match ctx {
            Some(Context::Exact(c)) => {
                let d = c.getattr(intern!(py, "_offload_key_positions"))?;
                let d = d.cast_into::<PyDict>()?;
                match d.is_empty() {
                    true => Source::None,
                    false => Source::Map(PositionMap::new(d, &self.cursors)),
                }
            }
            Some(Context::Other(c)) => {
                Source::Method(c.getattr(intern!(py, "get_offload_key_position"))?)
            }
            None => Source::None,
        };
        let mut c = Collector {
            keys: interner,
            scratch: &mut self.scratch,
            positions: &mut self.positions,
            source,
            missing: 0,
            unknown,
        };
        if let Ok(list) = keys.cast::<PyList>() {
            // As `list.iter()` reads a list (up to the smaller of its first and its current
            // length), but taking each item as a borrowed reference while no Python code runs.
            let mut len = list.len();
            let mut i = 0;
            while i < len {
                let index = ffi::Py_ssize_t::try_from(i).unwrap_or(ffi::Py_ssize_t::MAX);
                // SAFETY: `list` is a live list and `i` is below its length: no Python code
                // ran since the length was read (it is read again after any call that may
                // have run some), and only Python code could change the list while this
                // thread holds the GIL. So PyList_GetItem returns a borrowed reference to a
                // live item (not null), which stays live until Python code runs: `one` makes
                // it a strong reference before it may run any.
                let obj =
                    unsafe { Borrowed::from_ptr(py, ffi::PyList_GetItem(list.as_ptr(), index)) };
                if c.one(obj)? {
                    len = len.min(list.len());
                }
                i += 1;
            }
        } else if let Ok(t) = keys.cast::<PyTuple>() {
            for obj in t.iter() {
                c.one(obj.as_borrowed())?;
            }
        } else {
            for obj in keys.try_iter()? {
                c.one(obj?.as_borrowed())?;
            }
        }
        let (source, missing) = (c.source, c.missing);
        match source {
            Source::None => return Ok(false),
            Source::Map(map) => self.cursors.store(&map),
            Source::Method(_) => {}
        }
        match missing {
            _ if self.scratch.is_empty() => Ok(false),
            0 => Ok(true),
            m if m == self.scratch.len() => {
                self.positions.clear();
                Ok(false)
            }
            m => Err(PyValueError::new_err(format!(
                "{m} of {} keys have no end-token position in the request context: kvtier \
                 needs a position for every key of one call, or for none",
                self.scratch.len()
            ))),
        }
    }
}

/// Where a call's end-token positions come from.
enum Source<'py> {
    /// Nowhere: the call reads none, or the context's position map is empty.
    None,
    /// An exact `ReqContext`'s position map.
    Map(PositionMap<'py>),
    /// Another context's bound `get_offload_key_position`.
    Method(Bound<'py, PyAny>),
}

/// What [`KeyArgs::collect`] fills, key by key.
struct Collector<'a, 'py> {
    keys: &'a mut Interner<Py<PyBytes>>,
    scratch: &'a mut Vec<VKey>,
    positions: &'a mut Vec<u64>,
    source: Source<'py>,
    missing: usize,
    unknown: Unknown,
}

impl<'py> Collector<'_, 'py> {
    /// Reads the key object `obj`: its manager key and, when positions are read, its
    /// position. A key the identity cache knows whose position, if one is read, is an `int`
    /// at the map's cursor is read without running any Python code or taking a reference;
    /// any other key is made a strong reference first. Returns whether Python code may
    /// have run (so that the caller's borrowed items may be stale).
    #[inline(always)]
    fn one(&mut self, obj: Borrowed<'_, 'py, PyAny>) -> PyResult<bool> {
        let Some(k) = known(self.keys, obj.as_ptr()) else {
            self.one_slow(&obj.to_owned(), None)?;
            return Ok(true);
        };
        match &mut self.source {
            Source::None => {}
            Source::Map(map) => match map.int_at_cursor(obj.as_ptr()) {
                Step::Int(p) => self.positions.push(p),
                step => {
                    self.one_slow(&obj.to_owned(), Some((k, step)))?;
                    return Ok(true);
                }
            },
            Source::Method(_) => {
                self.one_slow(&obj.to_owned(), Some((k, Step::Elsewhere)))?;
                return Ok(true);
            }
        }
        self.scratch.push(k);
        Ok(false)
    }

    /// [`one`](Self::one) for the other keys: `known` is the key the identity cache gave
    /// for `obj` with what the cursor held (no Python code ran since), if it knew `obj`.
    #[inline(always)]
    fn one_slow(&mut self, obj: &Bound<'py, PyAny>, known: Option<(VKey, Step)>) -> PyResult<()> {
        let (k, step) = match known {
            Some(found) => found,
            None => {
                let k = resolve_by_hash(self.keys, obj, self.unknown)?;
                let step = match &mut self.source {
                    Source::Map(map) => map.int_at_cursor(obj.as_ptr()),
                    Source::None | Source::Method(_) => Step::Elsewhere,
                };
                (k, step)
            }
        };
        self.scratch.push(k);
        let p = match (&mut self.source, step) {
            (Source::None, _) => return Ok(()),
            (Source::Map(_), Step::Int(p)) => {
                self.positions.push(p);
                return Ok(());
            }
            // vLLM reads the map with `dict.get`.
            (Source::Map(map), step) => map.get(obj, step)?,
            (Source::Method(get), _) => Some(get.call1((obj,))?),
        };
        match p {
            // None is no position, as vLLM reads it.
            Some(p) if !p.is_none() => self.positions.push(position(&p)?),
            _ => self.missing += 1,
        }
        Ok(())
    }
}

/// The manager key of the key object at `obj` if the interner's identity cache knows the
/// object. The address names the object: the cache's entry is taken only when the id's live
/// value is this very object (which the interner holds, so the address is not reused
/// meanwhile). Runs no Python code.
#[inline(always)]
fn known(keys: &Interner<Py<PyBytes>>, obj: *mut ffi::PyObject) -> Option<VKey> {
    keys.recall(obj as usize, |v| v.as_ptr() == obj)
}

/// The manager key of the key object `obj`: by identity when the interner's cache knows the
/// object ([`known`]), else by Python's hash and the bytes (interning it when `unknown` says
/// so).
#[inline(always)]
pub(crate) fn resolve(
    keys: &mut Interner<Py<PyBytes>>,
    obj: &Bound<'_, PyAny>,
    unknown: Unknown,
) -> PyResult<VKey> {
    match known(keys, obj.as_ptr()) {
        Some(k) => Ok(k),
        None => resolve_by_hash(keys, obj, unknown),
    }
}

/// [`resolve`] for an object the identity cache does not know.
#[inline(never)]
fn resolve_by_hash(
    keys: &mut Interner<Py<PyBytes>>,
    obj: &Bound<'_, PyAny>,
    unknown: Unknown,
) -> PyResult<VKey> {
    let b = match obj.cast::<PyBytes>() {
        Ok(b) => b,
        // Only a store offer needs the bytes.
        Err(_) if unknown == Unknown::Absent => return find_as_dict_does(keys, obj),
        Err(_) => return Err(not_bytes(obj)),
    };
    let h = py_hash(b)?;
    let k = match unknown {
        Unknown::Intern => keys
            .intern(h, b.as_bytes(), is_key(b), || b.clone().unbind())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
        Unknown::Absent => match keys.find(h, is_key(b)) {
            Some(k) => k,
            None => return Ok(VKey::absent()),
        },
    };
    keys.remember(obj.as_ptr() as usize, k);
    Ok(k)
}

/// The manager key a key object that is not bytes stands for, found as vLLM's dicts find it:
/// by its hash (an unhashable key raises, as `hash()` does), then by `==` with the interned
/// keys of that hash (a `memoryview` of a held key's bytes is that key). Any other key is
/// one no chunk has. Python code may run (the key's `__hash__` and `__eq__`); the first error
/// it raises is the call's.
#[cold]
#[inline(never)]
fn find_as_dict_does(keys: &Interner<Py<PyBytes>>, obj: &Bound<'_, PyAny>) -> PyResult<VKey> {
    let h = obj.hash()?.cast_unsigned() as u64;
    let failed = std::cell::RefCell::new(None);
    let found = keys.find(h, |held| {
        if failed.borrow().is_some() {
            return false;
        }
        PyAnyMethods::eq(held.bind(obj.py()).as_any(), obj).unwrap_or_else(|e| {
            *failed.borrow_mut() = Some(e);
            false
        })
    });
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(found.unwrap_or_else(VKey::absent)),
    }
}

/// Whether an interned key object holds the bytes of `probe` (the very object, or equal bytes).
#[inline]
fn is_key<'a>(probe: &'a Bound<'_, PyBytes>) -> impl Fn(&Py<PyBytes>) -> bool + 'a {
    move |held| {
        held.as_ptr() == probe.as_ptr() || held.bind(probe.py()).as_bytes() == probe.as_bytes()
    }
}

/// The error for a store offer's key that is not bytes.
#[cold]
fn not_bytes(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "offload keys offered for storing are bytes (block hash + 4-byte group), got {}",
        obj.get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string())
    ))
}

/// Python's own (cached) hash of a bytes object.
fn py_hash(b: &Bound<'_, PyBytes>) -> PyResult<u64> {
    Ok(b.hash()?.cast_unsigned() as u64)
}
