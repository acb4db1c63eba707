//! vLLM's classes and constants the manager answers with, and the cheap way to make them.
//!
//! `CPULoadStoreSpec`, `PrepareStoreOutput` and `RequestOffloadingContext` are plain Python
//! classes whose `__init__` only sets attributes. Running that `__init__` (a Python frame,
//! argument binding, for the spec a NumPy conversion of a list) costs more than the manager's
//! own work, so the manager makes the instance with `object.__new__(cls)` (what `cls()` calls
//! before `__init__`) and sets the same attributes, in the same order, itself: the objects are equal, attribute for attribute, to what the
//! constructors make (the differential test compares them with vLLM's).

use numpy::PyArray1;
use pyo3::exceptions::{PyTypeError, PyValueError};
use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};

/// Makes attribute-less instances of one class with `object.__new__(cls)`.
#[derive(Debug)]
pub(crate) struct Blank {
    cls: Py<PyType>,
    /// `object.__new__`.
    object_new: Py<PyAny>,
    /// `cls`'s `tp_new` slot when it is `object`'s own (what `object.__new__(cls)` runs,
    /// called directly without building an argument tuple each time).
    tp_new: Option<ffi::newfunc>,
    /// `()`, the arguments `tp_new` is called with.
    no_args: Py<PyTuple>,
}

/// A type's `tp_new` slot.
fn tp_new_of(ty: *mut ffi::PyTypeObject) -> Option<ffi::newfunc> {
    // SAFETY: `ty` is a live type object (the callers hold it). PyType_GetSlot reads any
    // type's slot from Python 3.10 on (this is an abi3-py310 module); the `Py_tp_new` slot
    // holds either null or a `newfunc`, so the non-null pointer is one.
    unsafe {
        let f = ffi::PyType_GetSlot(ty, ffi::Py_tp_new);
        (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, ffi::newfunc>(f))
    }
}

impl Blank {
    /// A maker for `cls`, which must take `object.__new__` unchanged and be instantiable
    /// (checked here by making one instance).
    ///
    /// # Errors
    /// `TypeError` when `cls` defines its own `__new__` or cannot be instantiated.
    fn new(cls: Bound<'_, PyType>) -> PyResult<Self> {
        let py = cls.py();
        let object_new = py.get_type::<PyAny>().getattr(intern!(py, "__new__"))?;
        if !cls.getattr(intern!(py, "__new__"))?.is(&object_new) {
            return Err(PyTypeError::new_err(format!(
                "{} defines its own __new__: kvtier builds vLLM 0.33.0's plain classes only",
                cls.name()?
            )));
        }
        // Raises for an abstract class, as object.__new__ does.
        object_new.call1((&cls,))?;
        let object_tp_new = tp_new_of(py.get_type::<PyAny>().as_type_ptr());
        let tp_new = tp_new_of(cls.as_type_ptr())
            .filter(|&f| object_tp_new.is_some_and(|o| std::ptr::fn_addr_eq(f, o)));
        Ok(Blank {
            cls: cls.unbind(),
            object_new: object_new.unbind(),
            tp_new,
            no_args: PyTuple::empty(py).unbind(),
        })
    }

    /// A new instance with no attribute set.
    ///
    /// # Errors
    /// `MemoryError` when Python cannot allocate it.
    #[inline]
    fn make<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.tp_new {
            // SAFETY: `f` is `cls`'s tp_new, object's own, called as `cls()` calls it: with
            // the type, an argument tuple (empty) and no keywords; it returns a new
            // reference, or null with an exception set.
            Some(f) => unsafe {
                Bound::from_owned_ptr_or_err(
                    py,
                    f(
                        self.cls.as_ptr().cast(),
                        self.no_args.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                )
            },
            None => self.object_new.bind(py).call1((self.cls.bind(py),)),
        }
    }
}

/// vLLM's classes and constants the manager answers with.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) miss: Py<PyAny>,
    pub(crate) hit_pending: Py<PyAny>,
    pub(crate) hit: Py<PyAny>,
    load_store_spec: Blank,
    prepare_store_output: Blank,
    pub(crate) event: Py<PyType>,
    pub(crate) medium: Py<PyAny>,
    request_offloading_context: Blank,
    /// The attributes `RequestOffloadingContext()` sets, with their (immutable) defaults.
    context_defaults: Vec<(Py<PyString>, Py<PyAny>)>,
}

impl Vocab {
    /// From `types` = (LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.HIT,
    /// CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent, Medium.CPU,
    /// RequestOffloadingContext).
    ///
    /// # Errors
    /// `TypeError` or `IndexError` when `types` is not that tuple.
    pub(crate) fn new(types: &Bound<'_, PyTuple>) -> PyResult<Self> {
        let py = types.py();
        let item = |i: usize| types.get_item(i).map(Bound::unbind);
        let ty = |i: usize| -> PyResult<Bound<'_, PyType>> {
            Ok(types.get_item(i)?.cast_into::<PyType>()?)
        };
        // The attributes a default RequestOffloadingContext carries, read from one made by
        // its own constructor.
        let context = ty(7)?.call0()?;
        let context_defaults = context
            .getattr(intern!(py, "__dict__"))?
            .cast_into::<PyDict>()?
            .iter()
            .map(|(k, v)| Ok((k.cast_into::<PyString>()?.unbind(), v.unbind())))
            .collect::<PyResult<_>>()?;
        Ok(Vocab {
            miss: item(0)?,
            hit_pending: item(1)?,
            hit: item(2)?,
            load_store_spec: Blank::new(ty(3)?)?,
            prepare_store_output: Blank::new(ty(4)?)?,
            event: ty(5)?.unbind(),
            medium: item(6)?,
            request_offloading_context: Blank::new(ty(7)?)?,
            context_defaults,
        })
    }

    /// A `CPULoadStoreSpec` over `slots` (an int32 array, as vLLM builds it); `ids` is
    /// scratch.
    ///
    /// # Errors
    /// `ValueError` for a chunk id above 2^31 − 1; Python's errors otherwise.
    pub(crate) fn spec<'py>(
        &self,
        py: Python<'py>,
        ids: &mut Vec<i32>,
        slots: &[u32],
    ) -> PyResult<Bound<'py, PyAny>> {
        ids.clear();
        for &s in slots {
            ids.push(i32::try_from(s).map_err(|_| PyValueError::new_err("chunk id above 2^31"))?);
        }
        let arr = PyArray1::from_slice(py, ids);
        let spec = self.load_store_spec.make(py)?;
        spec.setattr(intern!(py, "block_ids"), arr)?;
        Ok(spec)
    }

    /// A `PrepareStoreOutput(keys_to_store, store_spec, evicted_keys)`.
    ///
    /// # Errors
    /// Python's errors.
    pub(crate) fn prepare_store_output<'py>(
        &self,
        py: Python<'py>,
        keys_to_store: Bound<'py, PyAny>,
        store_spec: Bound<'py, PyAny>,
        evicted_keys: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let out = self.prepare_store_output.make(py)?;
        out.setattr(intern!(py, "keys_to_store"), keys_to_store)?;
        out.setattr(intern!(py, "store_spec"), store_spec)?;
        out.setattr(intern!(py, "evicted_keys"), evicted_keys)?;
        Ok(out)
    }

    /// A `RequestOffloadingContext()`.
    ///
    /// # Errors
    /// Python's errors.
    pub(crate) fn request_offloading_context<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let context = self.request_offloading_context.make(py)?;
        for (name, value) in &self.context_defaults {
            context.setattr(name.bind(py), value.bind(py))?;
        }
        Ok(context)
    }
}
