//! `kvtier._native.Manager`: the one place that calls kvtier's [`OffloadManager`] from Python.
//!
//! It takes vLLM's arguments as vLLM passes them (bytes keys, a `ReqContext`) and answers with
//! vLLM's own objects, whose classes `kvtier.vllm` hands over at construction. Reading the key
//! arguments is [`collect`]'s (with [`positions`], the request's end-token positions), the
//! request state on the context [`request`]'s, the vLLM objects it answers with [`vocab`]'s,
//! the reuse tracker's order [`reuse`]'s, and `lookup`'s raw entry [`fastcall`]'s; this module
//! converts each method's answer.
//!
//! A call reads and checks all its arguments (keys, context, positions) before it touches the
//! manager or the request's state, so a bad argument raises with nothing changed. A call the
//! manager refuses (where vLLM's manager asserts) changes nothing either, except that a context
//! seen for the first time keeps the request state made for it, as vLLM's keeps its own.

mod collect;
mod fastcall;
mod positions;
pub(crate) mod request;
mod reuse;
mod vocab;

use kvtier_core::manager::{
    CompleteLoadError, EventKind, LoadError, LookupResult, ManagerConfig, OffloadManager,
    PolicyKind, StoreError, StoreOutcome, StorePlan,
};
use pyo3::exceptions::{PyAssertionError, PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{ffi, intern};

use collect::{KeyArgs, Unknown, resolve};
use request::{Contexts, request_error};
use reuse::ReuseOrder;
use vocab::Vocab;

use crate::keys::{Interner, VKey};

/// The most request states live at once (contexts between their first call and
/// `on_request_finished`, or until Python frees them).
const MAX_REQUESTS: u32 = 262_144;

/// The most allocation-size samples kept between two `take_stats` calls.
const MAX_SIZE_SAMPLES: usize = 1 << 20;

/// What `take_stats` returns to Python.
type StatsTuple<'py> = (u64, u64, u64, Bound<'py, PyList>, Option<u64>);

/// kvtier's offload manager with vLLM's calling conventions (used by
/// `kvtier.vllm.KvtierOffloadingManager`).
#[pyclass(module = "kvtier._native")]
#[derive(Debug)]
pub(crate) struct Manager {
    m: OffloadManager<VKey>,
    keys: Interner<Py<PyBytes>>,
    vocab: Vocab,
    contexts: Contexts,
    sizes: Vec<u64>,
    sizes_dropped: u64,
    plan: StorePlan<VKey>,
    args: KeyArgs,
    /// The reuse tracker's order, with a reuse filter.
    reuse: Option<ReuseOrder>,
}

fn assertion(e: impl std::fmt::Display) -> PyErr {
    PyAssertionError::new_err(e.to_string())
}

fn clamp_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

#[pymethods]
impl Manager {
    /// `types` = (LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.HIT,
    /// CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent, Medium.CPU,
    /// RequestOffloadingContext, ReqContext).
    #[new]
    #[pyo3(signature = (num_chunks, cache_policy, store_threshold, max_tracker_size, enable_events, types))]
    fn new(
        num_chunks: i64,
        cache_policy: &str,
        store_threshold: i64,
        max_tracker_size: i64,
        enable_events: bool,
        types: &Bound<'_, PyTuple>,
    ) -> PyResult<Self> {
        let policy = PolicyKind::from_name(cache_policy).map_err(|e| {
            PyValueError::new_err(format!("Unknown cache policy: {cache_policy:?} ({e})"))
        })?;
        let n = u32::try_from(num_chunks).map_err(|_| {
            PyValueError::new_err(format!(
                "num_chunks must be between 0 and {} (got {num_chunks})",
                u32::MAX
            ))
        })?;
        let tracker = u32::try_from(max_tracker_size.max(0)).map_err(|_| {
            PyValueError::new_err(format!(
                "max_tracker_size must be at most {} (got {max_tracker_size})",
                u32::MAX
            ))
        })?;
        let mut cfg = ManagerConfig::new(n);
        cfg.policy = policy;
        // vLLM filters only from 2 on; any smaller value (negative included) means no filter.
        cfg.store_threshold = clamp_u32(store_threshold);
        cfg.max_tracker_size = tracker;
        cfg.enable_events = enable_events;
        cfg.max_requests = MAX_REQUESTS;
        let reuse = cfg.filter_enabled().then(ReuseOrder::default);
        let m = OffloadManager::new(cfg).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let vocab = Vocab::new(types)?;
        Ok(Manager {
            m,
            keys: Interner::default(),
            vocab,
            contexts: Contexts::new(),
            sizes: Vec::new(),
            sizes_dropped: 0,
            plan: StorePlan::new(),
            args: KeyArgs::default(),
            reuse,
        })
    }

    /// vLLM's `lookup`: MISS, HIT_PENDING or HIT (changes nothing).
    fn lookup(
        &mut self,
        key: &Bound<'_, PyAny>,
        req_context: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        self.lookup_of(key, req_context)
    }

    /// `lookup` bound to this manager through a raw vectorcall entry (what `kvtier.vllm`
    /// installs as the manager's `lookup`): the same answers and errors, name, signature and
    /// doc as `self.lookup`, for less work per call.
    fn _bound_lookup<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        fastcall::bound_lookup(slf)
    }

    /// vLLM's `prepare_load`: pins the keys and returns their chunks.
    fn prepare_load<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        req_context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.contexts.release_orphans(&mut self.m);
        let ctx = self.vocab.context(req_context);
        // The arguments are read before the request state is made, so that a bad argument
        // leaves no state behind.
        let with_pos = self
            .args
            .collect(&mut self.keys, keys, Some(ctx), Unknown::Absent)?;
        let req = self.contexts.request(&mut self.m, py, ctx, true)?;
        let pos = with_pos.then_some(self.args.positions.as_slice());
        let slots = match self.m.prepare_load(req, &self.args.scratch, pos) {
            Ok(s) => s,
            Err(LoadError::Request(e)) => return Err(request_error(e)),
            Err(e @ LoadError::Positions(_)) => return Err(PyValueError::new_err(e.to_string())),
            Err(e) => return Err(assertion(e)),
        };
        self.vocab.spec(py, slots)
    }

    /// vLLM's `touch`: marks the keys recently used.
    fn touch(&mut self, keys: &Bound<'_, PyAny>, req_context: &Bound<'_, PyAny>) -> PyResult<()> {
        let _ = req_context;
        self.contexts.release_orphans(&mut self.m);
        self.args
            .collect(&mut self.keys, keys, None, Unknown::Absent)?;
        self.m.touch(&self.args.scratch);
        Ok(())
    }

    /// vLLM's `complete_load`: undoes one pin per key.
    fn complete_load(
        &mut self,
        keys: &Bound<'_, PyAny>,
        req_context: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _ = req_context;
        self.contexts.release_orphans(&mut self.m);
        self.args
            .collect(&mut self.keys, keys, None, Unknown::Absent)?;
        self.m
            .complete_load(&self.args.scratch)
            .map_err(|e: CompleteLoadError| assertion(e))
    }

    /// vLLM's `prepare_store`: `None` when there is no room, else a `PrepareStoreOutput`.
    fn prepare_store<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        req_context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.contexts.release_orphans(&mut self.m);
        let ctx = self.vocab.context(req_context);
        if self.keys.sweep_due() {
            let m = &self.m;
            self.keys
                .sweep(|f| m.for_each_held_key(f), |v| v.as_ptr() as usize);
        }
        let with_pos = self
            .args
            .collect(&mut self.keys, keys, Some(ctx), Unknown::Intern)?;
        let req = self.contexts.request(&mut self.m, py, ctx, true)?;
        let pos = with_pos.then_some(self.args.positions.as_slice());
        match self
            .m
            .prepare_store(req, &self.args.scratch, pos, &mut self.plan)
        {
            Ok(()) => self.record_offer(),
            Err(StoreError::NoRoom { need, .. }) => {
                self.record_offer();
                // vLLM samples the allocation size before finding there is no room: the
                // candidates are the chunks to evict plus the free ones (which the failed
                // call left as they were).
                let size = u64::from(need) + u64::from(self.m.inspect().free_chunks());
                push_sample(&mut self.sizes, &mut self.sizes_dropped, size);
                return Ok(py.None().into_bound(py));
            }
            Err(StoreError::Request(e)) => return Err(request_error(e)),
            Err(e @ StoreError::OutOfMemory) => return Err(PyMemoryError::new_err(e.to_string())),
            Err(e) => return Err(PyValueError::new_err(e.to_string())),
        }
        let out = &self.plan;
        if !out.keys().is_empty() {
            push_sample(
                &mut self.sizes,
                &mut self.sizes_dropped,
                out.keys().len() as u64,
            );
        }
        let to_store = key_list(py, &self.keys, out.keys())?;
        let evicted = key_list(py, &self.keys, out.evicted())?;
        let spec = self.vocab.spec(py, out.slots())?;
        self.vocab
            .prepare_store_output(py, to_store.into_any(), spec, evicted.into_any())
    }

    /// vLLM's `complete_store`: on success the pending keys become readable, else they are
    /// removed.
    #[pyo3(signature = (keys, req_context, success = true))]
    fn complete_store(
        &mut self,
        keys: &Bound<'_, PyAny>,
        req_context: &Bound<'_, PyAny>,
        success: bool,
    ) -> PyResult<()> {
        let _ = req_context;
        self.contexts.release_orphans(&mut self.m);
        self.args
            .collect(&mut self.keys, keys, None, Unknown::Absent)?;
        let outcome = if success {
            StoreOutcome::Stored
        } else {
            StoreOutcome::Failed
        };
        self.m.complete_store(&self.args.scratch, outcome);
        Ok(())
    }

    /// vLLM's `on_new_request`: starts the request's state, returns a
    /// `RequestOffloadingContext()` (chunk-level offloading).
    fn on_new_request<'py>(
        &mut self,
        py: Python<'py>,
        req_context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.contexts.release_orphans(&mut self.m);
        self.contexts
            .request(&mut self.m, py, self.vocab.context(req_context), false)?;
        self.vocab.request_offloading_context(py)
    }

    /// vLLM's `on_request_finished`: commits the request's recency to the policy.
    fn on_request_finished(&mut self, req_context: &Bound<'_, PyAny>) -> PyResult<()> {
        self.contexts.release_orphans(&mut self.m);
        self.contexts
            .finish(&mut self.m, self.vocab.context(req_context))
    }

    /// vLLM's `take_events`, as a list.
    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let mut failed = None;
        let (keys, vocab) = (&self.keys, &self.vocab);
        self.m.drain_events(|e| {
            if failed.is_some() {
                return;
            }
            let made = key_list(py, keys, e.keys).and_then(|ks| {
                let kw = PyDict::new(py);
                kw.set_item(intern!(py, "keys"), ks)?;
                kw.set_item(intern!(py, "medium"), vocab.medium.bind(py))?;
                kw.set_item(intern!(py, "removed"), e.kind.removed())?;
                if e.kind == EventKind::RemovedMetadataOnly {
                    kw.set_item(intern!(py, "metadata_only"), true)?;
                }
                out.append(vocab.event.bind(py).call((), Some(&kw))?)
            });
            if let Err(err) = made {
                failed = Some(err);
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Drains the stats since the last call: `(num_used, write_pending, num_chunks,
    /// allocation sizes in call order, stores skipped or None without a filter)`.
    fn take_stats<'py>(&mut self, py: Python<'py>) -> PyResult<StatsTuple<'py>> {
        let s = self.m.take_stats();
        let skipped = s.stores_skipped;
        let sizes = PyList::new(py, self.sizes.drain(..))?;
        self.sizes_dropped = 0;
        Ok((s.num_used, s.write_pending, s.num_chunks, sizes, skipped))
    }

    /// vLLM's `reset_cache`: evicts everything; request states from before are stale.
    fn reset_cache(&mut self) {
        self.contexts.release_orphans(&mut self.m);
        self.m.reset_cache();
        self.contexts.generation += 1;
    }

    /// Store candidates the reuse filter skipped since the last `take_stats` (vLLM's
    /// `stores_skipped_in_current_batch`; 0 without a filter).
    fn stores_skipped(&self) -> u64 {
        self.m.inspect().stores_skipped_undrained()
    }

    /// The reuse tracker's `(key, offer count)` pairs, least recently offered first (vLLM's
    /// `counts`, in its order), or `None` without a reuse filter.
    fn tracker_entries<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(reuse) = &self.reuse else {
            return Ok(None);
        };
        let entries = reuse.entries(&self.m, &self.keys);
        let list = PyList::empty(py);
        for (key, count) in entries {
            list.append((key.clone_ref(py), count))?;
        }
        Ok(Some(list))
    }

    /// Distinct keys interned now (bounded by twice what the manager holds).
    fn interned_keys(&self) -> usize {
        self.keys.len()
    }

    /// Resident chunks (allocated slots).
    fn resident_chunks(&self) -> u32 {
        self.m.inspect().allocated()
    }

    /// Request states live in the manager.
    fn live_requests(&self) -> usize {
        self.m.live_requests()
    }

    /// Allocation-size samples dropped since the last `take_stats` (more than 2^20 store
    /// offers between two drains).
    fn dropped_size_samples(&self) -> u64 {
        self.sizes_dropped
    }
}

impl Manager {
    /// [`lookup`](Self::lookup)'s answer, for it and for its raw entry
    /// ([`fastcall::bound_lookup`]).
    #[inline(always)]
    pub(crate) fn lookup_of(
        &mut self,
        key: &Bound<'_, PyAny>,
        req_context: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let _ = req_context;
        let k = resolve(&mut self.keys, key, Unknown::Absent)?;
        let r = if k.is_absent() {
            LookupResult::Miss
        } else {
            self.m.lookup(&k)
        };
        let v = match r {
            LookupResult::Miss => &self.vocab.miss,
            LookupResult::HitPending => &self.vocab.hit_pending,
            LookupResult::Hit => &self.vocab.hit,
        };
        Ok(v.clone_ref(key.py()))
    }

    /// Stamps the offer in `args.scratch`, which the core's reuse tracker has just counted.
    fn record_offer(&mut self) {
        if let Some(reuse) = &mut self.reuse {
            reuse.record(&self.m, &self.args.scratch);
        }
    }
}

/// The Python key objects of `keys` (`None` for a key the interner no longer holds, which
/// the manager never hands out).
fn key_list<'py>(
    py: Python<'py>,
    interner: &Interner<Py<PyBytes>>,
    keys: &[VKey],
) -> PyResult<Bound<'py, PyList>> {
    let len = ffi::Py_ssize_t::try_from(keys.len())
        .map_err(|_| PyMemoryError::new_err("too many keys for a list"))?;
    // SAFETY: PyList_New returns a new list (so the cast holds) of `len` empty (null) items,
    // or null with an exception set.
    let list = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len))?.cast_into_unchecked::<PyList>()
    };
    for (i, k) in (0..len).zip(keys) {
        let item = match interner.value(k) {
            Some(v) => v.clone_ref(py).into_ptr(),
            None => py.None().into_ptr(),
        };
        // SAFETY: `list` is the new list, not yet seen by any Python code, and `i` is below
        // its length: PyList_SetItem stores `item` (a new reference, which it takes over) in
        // the empty item `i` and cannot fail. No Python code runs before every item is set.
        unsafe { ffi::PyList_SetItem(list.as_ptr(), i, item) };
    }
    Ok(list)
}

fn push_sample(sizes: &mut Vec<u64>, dropped: &mut u64, v: u64) {
    if sizes.len() < MAX_SIZE_SAMPLES {
        sizes.push(v);
    } else {
        *dropped += 1;
    }
}
