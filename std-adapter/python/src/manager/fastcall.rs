//! `Manager.lookup` through a raw vectorcall entry: vLLM's most frequent call (one per block a
//! request hits, plus one) without PyO3's argument extraction and trampoline.
//!
//! [`bound_lookup`] makes a builtin method bound to a `Manager`, the same kind of object as
//! `manager.lookup` with the same name, qualified name, signature and doc (a test compares
//! them), whose C function ([`lookup`]) runs the call vLLM makes, `lookup(key, req_context)`
//! with two positional arguments, itself, and hands any other call (keywords, another count)
//! to PyO3's `Manager.lookup` as it came, so that every answer and every error is the one
//! PyO3's method gives. `kvtier.vllm` installs it as the manager's `lookup`.
//!
//! What [`lookup`] does in place of PyO3's trampoline: it catches a panic and raises PyO3's
//! `PanicException` for it, as PyO3 does. It does not count the thread as attached in PyO3's
//! own bookkeeping, which only changes when a `Py` dropped during the call releases its
//! reference: at once under PyO3's trampoline, at PyO3's next entry here. The answer is handed
//! to Python and drops none; only the raising of an error (a key that is not bytes, a hash
//! that raises, a manager called from inside its own call) drops the exception's type and
//! value that way, which the manager's next call through PyO3 then releases.

use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{Borrowed, ffi, intern};

use super::Manager;

/// A `PyMethodDef` that can live in a `static`.
struct MethodDef(ffi::PyMethodDef);

// SAFETY: the def is never written (CPython only reads a function's def), and its pointers are
// to `'static` data: string literals and a function.
unsafe impl Sync for MethodDef {}

/// `lookup`'s definition: the name, signature and doc of PyO3's `Manager.lookup`.
static LOOKUP: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"lookup".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: lookup,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"lookup($self, key, req_context)\n--\n\nvLLM's `lookup`: MISS, HIT_PENDING or HIT (changes nothing)."
        .as_ptr(),
});

/// `manager.lookup` with the raw entry [`lookup`].
///
/// # Errors
/// `MemoryError` when Python cannot allocate the method object.
pub(crate) fn bound_lookup<'py>(manager: &Bound<'py, Manager>) -> PyResult<Bound<'py, PyAny>> {
    let py = manager.py();
    // SAFETY: `LOOKUP` is a valid, `'static` method definition whose function has the
    // METH_FASTCALL | METH_KEYWORDS signature its flags declare (CPython never writes through
    // the pointer). `manager` is a live object, which the new function holds a strong reference
    // to. PyCFunction_NewEx returns a new reference, or null with an exception set.
    unsafe {
        let def = std::ptr::from_ref(&LOOKUP.0).cast_mut();
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyCFunction_NewEx(def, manager.as_ptr(), std::ptr::null_mut()),
        )
    }
}

/// The C function of [`bound_lookup`]'s method.
///
/// # Safety
/// Called by CPython only, as the METH_FASTCALL | METH_KEYWORDS function of a method made by
/// [`bound_lookup`], with the thread attached: `slf` is the `Manager` it was made for, `args`
/// holds the `nargs` positional arguments followed by one value per name in `kwnames` (null,
/// or a tuple of names), all live for the call.
unsafe extern "C" fn lookup(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a builtin's C function with the thread attached (holding the GIL).
    let py = unsafe { Python::assume_attached() };
    let result = catch_unwind(AssertUnwindSafe(|| -> PyResult<*mut ffi::PyObject> {
        // SAFETY: `slf` is the method's self: the live `Manager` `bound_lookup` was given,
        // which the method object holds a strong reference to for the call.
        let slf = unsafe { Borrowed::from_ptr(py, slf) };
        if nargs != 2 || !kwnames.is_null() {
            return by_pyo3(slf, args, nargs, kwnames);
        }
        // SAFETY: with two positional arguments and no keywords, `args` points at two
        // references (not null) that the caller keeps live for the call.
        let (key, req_context) = unsafe {
            (
                Borrowed::from_ptr(py, *args),
                Borrowed::from_ptr(py, *args.add(1)),
            )
        };
        let manager = slf.cast::<Manager>()?;
        let answer = manager.try_borrow_mut()?.lookup_of(&key, &req_context)?;
        Ok(answer.into_ptr())
    }));
    let err = match result {
        Ok(Ok(answer)) => return answer,
        Ok(Err(err)) => err,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("panic from Rust code");
            PanicException::new_err(msg.to_owned())
        }
    };
    err.restore(py);
    std::ptr::null_mut()
}

/// A call [`lookup`] does not run itself, made to PyO3's `Manager.lookup` bound to `slf`
/// with the same arguments (as a tuple and a dict: vectorcall is not in the stable ABI before
/// Python 3.12).
#[cold]
fn by_pyo3(
    slf: Borrowed<'_, '_, PyAny>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    let py = slf.py();
    let arg = |i: usize| {
        // SAFETY: `args` holds `nargs` positional arguments followed by one value per name in
        // `kwnames` (all live for the call, not null), and callers ask for `i` below that
        // total.
        unsafe { Borrowed::from_ptr(py, *args.add(i)) }
    };
    let positional = usize::try_from(nargs).unwrap_or(0);
    let positional = PyTuple::new(py, (0..positional).map(arg))?;
    let keywords = if kwnames.is_null() {
        None
    } else {
        // SAFETY: a non-null `kwnames` is a live tuple of the keyword names (strings).
        let names = unsafe { Borrowed::from_ptr(py, kwnames) }.cast::<PyTuple>()?;
        let keywords = PyDict::new(py);
        for (j, name) in names.iter().enumerate() {
            keywords.set_item(name, arg(positional.len() + j))?;
        }
        Some(keywords)
    };
    let answer = slf
        .getattr(intern!(py, "lookup"))?
        .call(positional, keywords.as_ref())?;
    Ok(answer.into_ptr())
}
