//! `kvtier._native.Manager`: the one place that calls kvtier's [`OffloadManager`] from Python.
//!
//! It takes vLLM's arguments as vLLM passes them (bytes keys, a `ReqContext`) and answers with
//! vLLM's own objects, whose classes `kvtier.vllm` hands over at construction. Request state
//! lives on the `ReqContext` (a [`RequestState`] in its `_state` scratch dict, as vLLM's own
//! manager keeps its state there); a context dropped without `on_request_finished` releases
//! its request slot at the manager's next call.
//!
//! A call reads and checks all its arguments (keys, context, positions) before it touches the
//! manager or the request's state, so a bad argument raises with nothing changed. A call the
//! manager refuses (where vLLM's manager asserts) changes nothing either, except that a context
//! seen for the first time keeps the request state made for it, as vLLM's keeps its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvtier_core::manager::{
    CompleteLoadError, EventKind, LoadError, LookupResult, ManagerConfig, OffloadManager,
    PolicyKind, RequestError, RequestId, StoreError, StoreOutcome, StorePlan,
};
use pyo3::Borrowed;
use pyo3::exceptions::{
    PyAssertionError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{PyTypeInfo, ffi, intern};

use crate::fastcall;
use crate::keys::{Interner, VKey};
use crate::vocab::Vocab;

/// The most request states live at once (contexts between their first call and
/// `on_request_finished`, or until Python frees them).
const MAX_REQUESTS: u32 = 262_144;

/// The most allocation-size samples kept between two `take_stats` calls.
const MAX_SIZE_SAMPLES: usize = 1 << 20;

/// What `take_stats` returns to Python.
type StatsTuple<'py> = (u64, u64, u64, Bound<'py, PyList>, Option<u64>);

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

/// kvtier's offload manager with vLLM's calling conventions (used by
/// `kvtier.vllm.KvtierOffloadingManager`).
#[pyclass(module = "kvtier._native")]
#[derive(Debug)]
pub(crate) struct Manager {
    m: OffloadManager<VKey>,
    keys: Interner<Py<PyBytes>>,
    vocab: Vocab,
    serial: u64,
    generation: u64,
    orphans: Arc<Orphans>,
    sizes: Vec<u64>,
    sizes_dropped: u64,
    plan: StorePlan<VKey>,
    scratch: Vec<VKey>,
    positions: Vec<u64>,
    cursors: Cursors,
}

/// How a call treats keys the manager has never seen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unknown {
    /// Intern them (a store offer).
    Intern,
    /// Pass a key the manager cannot hold (it answers as for any absent key).
    Absent,
}

fn assertion(e: impl std::fmt::Display) -> PyErr {
    PyAssertionError::new_err(e.to_string())
}

fn request_error(e: RequestError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

fn clamp_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

#[pymethods]
impl Manager {
    /// `types` = (LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.HIT,
    /// CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent, Medium.CPU,
    /// RequestOffloadingContext).
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
        let m = OffloadManager::new(cfg).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let vocab = Vocab::new(types)?;
        Ok(Manager {
            m,
            keys: Interner::default(),
            vocab,
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            orphans: Arc::default(),
            sizes: Vec::new(),
            sizes_dropped: 0,
            plan: StorePlan::new(),
            scratch: Vec::new(),
            positions: Vec::new(),
            cursors: Cursors::default(),
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
        self.release_orphans();
        // The arguments are read before the request state is made, so that a bad argument
        // leaves no state behind.
        let with_pos = self.collect(keys, Some(req_context), Unknown::Absent)?;
        let req = self.request(py, req_context, true)?;
        let pos = with_pos.then_some(self.positions.as_slice());
        let slots = match self.m.prepare_load(req, &self.scratch, pos) {
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
        self.release_orphans();
        self.collect(keys, None, Unknown::Absent)?;
        self.m.touch(&self.scratch);
        Ok(())
    }

    /// vLLM's `complete_load`: undoes one pin per key.
    fn complete_load(
        &mut self,
        keys: &Bound<'_, PyAny>,
        req_context: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _ = req_context;
        self.release_orphans();
        self.collect(keys, None, Unknown::Absent)?;
        self.m
            .complete_load(&self.scratch)
            .map_err(|e: CompleteLoadError| assertion(e))
    }

    /// vLLM's `prepare_store`: `None` when there is no room, else a `PrepareStoreOutput`.
    fn prepare_store<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        req_context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.release_orphans();
        if self.keys.sweep_due() {
            let m = &self.m;
            self.keys
                .sweep(|f| m.for_each_held_key(f), |v| v.as_ptr() as usize);
        }
        let with_pos = self.collect(keys, Some(req_context), Unknown::Intern)?;
        let req = self.request(py, req_context, true)?;
        let pos = with_pos.then_some(self.positions.as_slice());
        match self
            .m
            .prepare_store(req, &self.scratch, pos, &mut self.plan)
        {
            Ok(()) => {}
            Err(StoreError::NoRoom { need, .. }) => {
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
        self.release_orphans();
        self.collect(keys, None, Unknown::Absent)?;
        let outcome = if success {
            StoreOutcome::Stored
        } else {
            StoreOutcome::Failed
        };
        self.m.complete_store(&self.scratch, outcome);
        Ok(())
    }

    /// vLLM's `on_new_request`: starts the request's state, returns a
    /// `RequestOffloadingContext()` (chunk-level offloading).
    fn on_new_request<'py>(
        &mut self,
        py: Python<'py>,
        req_context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.release_orphans();
        self.request(py, req_context, false)?;
        self.vocab.request_offloading_context(py)
    }

    /// vLLM's `on_request_finished`: commits the request's recency to the policy.
    fn on_request_finished(&mut self, req_context: &Bound<'_, PyAny>) -> PyResult<()> {
        self.release_orphans();
        let Some(state) = self.state_of(req_context)? else {
            return Ok(());
        };
        let state = state.get();
        if state.finished.load(Ordering::Acquire) {
            return Ok(());
        }
        let id = RequestId::from_u64(state.handle);
        // A request untouched since a reset commits nothing (the manager sees its state as
        // stale, as vLLM does); either way the handle is released.
        self.m.on_request_finished(id).map_err(request_error)?;
        state.finished.store(true, Ordering::Release);
        Ok(())
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
        self.release_orphans();
        self.m.reset_cache();
        self.generation += 1;
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

    /// Releases the request slots of contexts Python has freed.
    fn release_orphans(&mut self) {
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
            let _ = self.m.drop_request(RequestId::from_u64(h));
        }
    }

    /// This manager's state on `ctx`, if any.
    fn state_of<'py>(&self, ctx: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, RequestState>>> {
        self.state_in(&scratch_dict(ctx)?)
    }

    /// This manager's state in a context's scratch dict, if any.
    fn state_in<'py>(
        &self,
        dict: &Bound<'py, PyDict>,
    ) -> PyResult<Option<Bound<'py, RequestState>>> {
        let Some(s) = dict.get_item(RequestState::type_object(dict.py()))? else {
            return Ok(None);
        };
        let s = s.cast_into::<RequestState>()?;
        Ok((s.get().owner == self.serial).then_some(s))
    }

    /// The request handle of `ctx`, creating the request state when it has none from this
    /// manager or its state is from before a reset and finished. `submit`: a store or load,
    /// which a finished request may not issue.
    fn request(
        &mut self,
        py: Python<'_>,
        ctx: &Bound<'_, PyAny>,
        submit: bool,
    ) -> PyResult<RequestId> {
        let dict = scratch_dict(ctx)?;
        if let Some(state) = self.state_in(&dict)? {
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
        let id = self.m.on_new_request().map_err(request_error)?;
        let state = RequestState {
            owner: self.serial,
            handle: id.to_u64(),
            generation: AtomicU64::new(self.generation),
            finished: AtomicBool::new(false),
            orphans: Arc::clone(&self.orphans),
        };
        let set =
            Py::new(py, state).and_then(|st| dict.set_item(RequestState::type_object(py), st));
        if let Err(e) = set {
            let _ = self.m.drop_request(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Fills `scratch` with the manager keys of `keys` and, if `ctx` is given and every key
    /// has an end-token position there, `positions`. Returns whether positions were found.
    fn collect<'py>(
        &mut self,
        keys: &Bound<'py, PyAny>,
        ctx: Option<&Bound<'py, PyAny>>,
        unknown: Unknown,
    ) -> PyResult<bool> {
        let py = keys.py();
        self.scratch.clear();
        self.positions.clear();
        let map = match ctx {
            Some(c) => {
                let d = c.getattr(intern!(py, "_offload_key_positions"))?;
                let d = d.cast_into::<PyDict>()?;
                (!d.is_empty()).then(|| PositionMap::new(d, &self.cursors))
            }
            None => None,
        };
        let mut c = Collector {
            keys: &mut self.keys,
            scratch: &mut self.scratch,
            positions: &mut self.positions,
            map,
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
        let (map, missing) = (c.map, c.missing);
        let Some(map) = map else {
            return Ok(false);
        };
        self.cursors.store(&map);
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

/// What [`Manager::collect`] fills, key by key.
struct Collector<'a, 'py> {
    keys: &'a mut Interner<Py<PyBytes>>,
    scratch: &'a mut Vec<VKey>,
    positions: &'a mut Vec<u64>,
    map: Option<PositionMap<'py>>,
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
        if let Some(map) = &mut self.map {
            match map.int_at_cursor(obj.as_ptr()) {
                Step::Int(p) => self.positions.push(p),
                step => {
                    self.one_slow(&obj.to_owned(), Some((k, step)))?;
                    return Ok(true);
                }
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
                let step = match &mut self.map {
                    Some(map) => map.int_at_cursor(obj.as_ptr()),
                    None => Step::Elsewhere,
                };
                (k, step)
            }
        };
        self.scratch.push(k);
        if let Some(map) = &mut self.map {
            if let Step::Int(p) = step {
                self.positions.push(p);
                return Ok(());
            }
            match map.get(obj, step)? {
                // vLLM reads the map with `dict.get` and takes None for no position.
                Some(p) if !p.is_none() => self.positions.push(position(&p)?),
                _ => self.missing += 1,
            }
        }
        Ok(())
    }
}

/// A key's end-token position, checked against the manager's bound here so that a bad
/// position fails the call before anything is made for it.
#[inline]
fn position(p: &Bound<'_, PyAny>) -> PyResult<u64> {
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
struct Cursors {
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
    fn store(&mut self, map: &PositionMap<'_>) {
        let addr = map.dict.as_ptr() as usize;
        self.slots[Self::bucket(addr)] = (addr, map.next);
    }
}

/// A position map being read, with its cursor (see [`Cursors`]).
struct PositionMap<'py> {
    dict: Bound<'py, PyDict>,
    next: ffi::Py_ssize_t,
}

/// What a [`PositionMap`]'s cursor held for a key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The key's entry, holding an `int` in 0..2^63 (the cursor is now past it).
    Int(u64),
    /// The key's entry, holding something else.
    Other,
    /// Another entry, or none.
    Elsewhere,
}

impl<'py> PositionMap<'py> {
    fn new(dict: Bound<'py, PyDict>, cursors: &Cursors) -> Self {
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
    fn int_at_cursor(&mut self, key: *mut ffi::PyObject) -> Step {
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
    fn get(&mut self, key: &Bound<'py, PyAny>, step: Step) -> PyResult<Option<Bound<'py, PyAny>>> {
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

/// A `ReqContext`'s scratch dict (`_state`), where request states live.
fn scratch_dict<'py>(ctx: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    Ok(ctx
        .getattr(intern!(ctx.py(), "_state"))?
        .cast_into::<PyDict>()?)
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
fn resolve(
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
    let b = key_bytes(obj)?;
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

/// Whether an interned key object holds the bytes of `probe` (the very object, or equal bytes).
#[inline]
fn is_key<'a>(probe: &'a Bound<'_, PyBytes>) -> impl Fn(&Py<PyBytes>) -> bool + 'a {
    move |held| {
        held.as_ptr() == probe.as_ptr() || held.bind(probe.py()).as_bytes() == probe.as_bytes()
    }
}

fn key_bytes<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyBytes>> {
    obj.cast::<PyBytes>().map_err(|_| {
        PyTypeError::new_err(format!(
            "offload keys are bytes (block hash + 4-byte group), got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    })
}

/// Python's own (cached) hash of a bytes object.
fn py_hash(b: &Bound<'_, PyBytes>) -> PyResult<u64> {
    Ok(b.hash()?.cast_unsigned() as u64)
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
