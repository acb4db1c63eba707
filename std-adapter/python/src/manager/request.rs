//! Request state: a request's kvtier handle kept on its `ReqContext` (a [`RequestState`] in the
//! context's `_state` scratch dict, where vLLM's own manager keeps its state), and the slots of
//! contexts Python freed before `on_request_finished`, released at the manager's next call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvtier_core::manager::{OffloadManager, RequestError, RequestId};
use pyo3::PyTypeInfo;
use pyo3::exceptions::{PyAssertionError, PyRuntimeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::keys::VKey;

/// Serial numbers telling managers apart (a context may meet several).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Request slots whose context Python freed before `on_request_finished`.
#[derive(Debug, Default)]
struct Orphans {
    any: AtomicBool,
    handles: Mutex<Vec<u64>>,
}

impl Orphans {
    fn push(&self, handle: u64) {
        if let Ok(mut v) = self.handles.lock() {
            v.push(handle);
            self.any.store(true, Ordering::Release);
        }
    }
}

/// A request's kvtier state, kept in its `ReqContext`'s scratch dict.
#[pyclass(module = "kvtier._native", frozen)]
#[derive(Debug)]
pub(crate) struct RequestState {
    owner: u64,
    handle: u64,
    /// The cache generation of the request's last call.
    generation: AtomicU64,
    finished: AtomicBool,
    orphans: Arc<Orphans>,
}

impl Drop for RequestState {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) {
            self.orphans.push(self.handle);
        }
    }
}

/// A call's request context, by the way the binding reads it.
#[derive(Clone, Copy)]
pub(crate) enum Context<'a, 'py> {
    /// Of exactly vLLM's `ReqContext` class: its `_state` and `_offload_key_positions` dicts
    /// are read directly (what its methods read).
    Exact(&'a Bound<'py, PyAny>),
    /// Of another class (a subclass, or a look-alike): its methods are called
    /// (`get_state`, `set_state`, `get_offload_key_position` for each key).
    Other(&'a Bound<'py, PyAny>),
}

/// Where a context keeps request states.
enum Scratch<'a, 'py> {
    /// An exact `ReqContext`'s `_state` dict, keyed by the state's type (what its
    /// `get_state` and `set_state` use).
    Dict(Bound<'py, PyDict>),
    /// Another context, through its `get_state` and `set_state`.
    Methods(&'a Bound<'py, PyAny>),
}

impl<'a, 'py> Scratch<'a, 'py> {
    fn of(ctx: Context<'a, 'py>) -> PyResult<Self> {
        Ok(match ctx {
            Context::Exact(c) => Scratch::Dict(
                c.getattr(intern!(c.py(), "_state"))?
                    .cast_into::<PyDict>()?,
            ),
            Context::Other(c) => Scratch::Methods(c),
        })
    }

    /// The [`RequestState`] kept there, if any (of any manager).
    fn get(&self) -> PyResult<Option<Bound<'py, RequestState>>> {
        let found = match self {
            Scratch::Dict(d) => d.get_item(RequestState::type_object(d.py()))?,
            Scratch::Methods(c) => {
                let py = c.py();
                let s =
                    c.call_method1(intern!(py, "get_state"), (RequestState::type_object(py),))?;
                (!s.is_none()).then_some(s)
            }
        };
        match found {
            Some(s) => Ok(Some(s.cast_into::<RequestState>()?)),
            None => Ok(None),
        }
    }

    /// Keeps `state` there, replacing any other.
    fn set(&self, state: Bound<'py, RequestState>) -> PyResult<()> {
        match self {
            Scratch::Dict(d) => d.set_item(RequestState::type_object(d.py()), state),
            Scratch::Methods(c) => c
                .call_method1(intern!(c.py(), "set_state"), (state,))
                .map(drop),
        }
    }
}

/// The request states of one manager: which contexts are its own, and the cache generation
/// their states are checked against.
#[derive(Debug)]
pub(crate) struct Contexts {
    serial: u64,
    /// The number of `reset_cache` calls so far.
    pub(crate) generation: u64,
    orphans: Arc<Orphans>,
}

impl Contexts {
    /// The states of a new manager.
    pub(crate) fn new() -> Self {
        Contexts {
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            orphans: Arc::default(),
        }
    }

    /// Releases the request slots of contexts Python has freed.
    pub(crate) fn release_orphans(&mut self, m: &mut OffloadManager<VKey>) {
        if !self.orphans.any.load(Ordering::Acquire) {
            return;
        }
        let handles = match self.orphans.handles.lock() {
            Ok(mut v) => {
                self.orphans.any.store(false, Ordering::Release);
                std::mem::take(&mut *v)
            }
            Err(_) => return,
        };
        for h in handles {
            // A handle finished or dropped already is stale: nothing to release.
            let _ = m.drop_request(RequestId::from_u64(h));
        }
    }

    /// This manager's state kept in `scratch`, if any.
    fn state_in<'py>(
        &self,
        scratch: &Scratch<'_, 'py>,
    ) -> PyResult<Option<Bound<'py, RequestState>>> {
        Ok(scratch.get()?.filter(|s| s.get().owner == self.serial))
    }

    /// The request handle of `ctx`, creating the request state when it has none from this
    /// manager or its state is from before a reset and finished. `submit`: a store or load,
    /// which a finished request may not issue.
    pub(crate) fn request(
        &mut self,
        m: &mut OffloadManager<VKey>,
        py: Python<'_>,
        ctx: Context<'_, '_>,
        submit: bool,
    ) -> PyResult<RequestId> {
        let scratch = Scratch::of(ctx)?;
        if let Some(state) = self.state_in(&scratch)? {
            let st = state.get();
            let generation = st.generation.load(Ordering::Acquire);
            if !st.finished.load(Ordering::Acquire) {
                st.generation.store(self.generation, Ordering::Release);
                return Ok(RequestId::from_u64(st.handle));
            }
            if generation == self.generation {
                if submit {
                    return Err(PyAssertionError::new_err(
                        "the request has finished: no store or load may follow \
                         on_request_finished (kvtier keeps no state for it)",
                    ));
                }
                return Ok(RequestId::from_u64(st.handle));
            }
        }
        let id = m.on_new_request().map_err(request_error)?;
        let state = RequestState {
            owner: self.serial,
            handle: id.to_u64(),
            generation: AtomicU64::new(self.generation),
            finished: AtomicBool::new(false),
            orphans: Arc::clone(&self.orphans),
        };
        let set = Bound::new(py, state).and_then(|st| scratch.set(st));
        if let Err(e) = set {
            let _ = m.drop_request(id);
            return Err(e);
        }
        Ok(id)
    }

    /// `on_request_finished` for `ctx`: releases the request's handle, committing its recency
    /// unless the request is stale (untouched since a reset; vLLM ignores its state then).
    /// A context without this manager's state, or finished already, changes nothing.
    pub(crate) fn finish(
        &self,
        m: &mut OffloadManager<VKey>,
        ctx: Context<'_, '_>,
    ) -> PyResult<()> {
        let Some(state) = self.state_in(&Scratch::of(ctx)?)? else {
            return Ok(());
        };
        let state = state.get();
        if state.finished.load(Ordering::Acquire) {
            return Ok(());
        }
        m.on_request_finished(RequestId::from_u64(state.handle))
            .map_err(request_error)?;
        state.finished.store(true, Ordering::Release);
        Ok(())
    }
}

pub(crate) fn request_error(e: RequestError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}
