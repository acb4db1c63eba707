//! vLLM's classes and constants the manager answers with, and the cheap way to make them.
//!
//! `CPULoadStoreSpec`, `PrepareStoreOutput` and `RequestOffloadingContext` are plain Python
//! classes whose `__init__` only sets attributes. Running that `__init__` (a Python frame,
//! argument binding, for the spec a NumPy conversion of a list) costs more than the manager's
//! own work, so the manager makes the instance with `object.__new__(cls)` (what `cls()` calls
//! before `__init__`) and sets the same attributes, in the same order, itself: the objects are equal, attribute for attribute, to what the
//! constructors make (the differential test compares them with vLLM's).

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};

use super::request::Context;

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
    /// Whether `cls`'s `tp_setattro` slot is `PyObject_GenericSetAttr` (what `setattr` runs
    /// for a plain class), called directly then.
    generic_setattr: bool,
}

/// Whether a type's `tp_setattro` slot is `PyObject_GenericSetAttr`.
fn has_generic_setattr(ty: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: `ty` is a live type object (the callers hold it). PyType_GetSlot reads any
    // type's slot from Python 3.10 on (this is an abi3-py310 module); it is only compared by
    // address.
    let f = unsafe { ffi::PyType_GetSlot(ty, ffi::Py_tp_setattro) };
    let generic: ffi::setattrofunc = ffi::PyObject_GenericSetAttr;
    std::ptr::eq(f, generic as *mut c_void)
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
        let generic_setattr = has_generic_setattr(cls.as_type_ptr());
        Ok(Blank {
            generic_setattr,
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

    /// `setattr(obj, name, value)` for an instance `obj` of `cls` (what `cls.__init__` does
    /// for each attribute it sets).
    ///
    /// # Errors
    /// Python's errors.
    #[inline]
    fn set(
        &self,
        obj: &Bound<'_, PyAny>,
        name: &Bound<'_, PyString>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !self.generic_setattr {
            return obj.setattr(name, value);
        }
        // SAFETY: `obj` is a live instance of `cls`, whose `tp_setattro` is
        // PyObject_GenericSetAttr: calling it directly is what `setattr` does for an (already
        // interned) string name. It borrows its arguments and returns -1 with an exception
        // set on failure.
        if unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) } < 0
        {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(())
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
    /// vLLM's `ReqContext` class: a context of exactly this class is read through its fields
    /// (what its methods read), any other through its methods.
    req_context: Py<PyType>,
}

impl Vocab {
    /// From `types` = (LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.HIT,
    /// CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent, Medium.CPU,
    /// RequestOffloadingContext, ReqContext).
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
            req_context: ty(8)?.unbind(),
        })
    }

    /// `ctx` as the binding reads it: exact when of exactly vLLM's `ReqContext` class (not a
    /// subclass), whose methods read its `_state` and `_offload_key_positions` dicts.
    #[inline]
    pub(crate) fn context<'a, 'py>(&self, ctx: &'a Bound<'py, PyAny>) -> Context<'a, 'py> {
        // SAFETY: `ctx` is a live object, whose type pointer is only compared by address.
        let ty = unsafe { ffi::Py_TYPE(ctx.as_ptr()) };
        if std::ptr::eq(ty, self.req_context.as_ptr().cast()) {
            Context::Exact(ctx)
        } else {
            Context::Other(ctx)
        }
    }

    /// A `CPULoadStoreSpec` over `slots` (an int32 array, as vLLM builds it).
    ///
    /// # Errors
    /// `ValueError` for a chunk id above 2^31 − 1; Python's errors otherwise.
    pub(crate) fn spec<'py>(&self, py: Python<'py>, slots: &[u32]) -> PyResult<Bound<'py, PyAny>> {
        if slots.iter().any(|&s| i32::try_from(s).is_err()) {
            return Err(PyValueError::new_err("chunk id above 2^31"));
        }
        // SAFETY: a new, C-contiguous array of `slots.len()` int32 items that it owns; no
        // Python code sees it before each of its items is written below.
        let arr = unsafe { PyArray1::<i32>::new(py, [slots.len()], false) };
        let data = arr.data();
        for (i, &s) in slots.iter().enumerate() {
            // SAFETY: `i` is below the array's length, `data` points at its items (aligned
            // int32s, not read before written).
            unsafe { data.add(i).write(i32::try_from(s).unwrap_or(i32::MAX)) };
        }
        let spec = self.load_store_spec.make(py)?;
        self.load_store_spec
            .set(&spec, intern!(py, "block_ids"), arr.as_any())?;
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
        let blank = &self.prepare_store_output;
        blank.set(&out, intern!(py, "keys_to_store"), &keys_to_store)?;
        blank.set(&out, intern!(py, "store_spec"), &store_spec)?;
        blank.set(&out, intern!(py, "evicted_keys"), &evicted_keys)?;
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
            self.request_offloading_context
                .set(&context, name.bind(py), value.bind(py))?;
        }
        Ok(context)
    }
}
