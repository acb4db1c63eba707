//! `kvtier._native.SimpleScheduler`: kvtier's [`SimpleScheduler`](Core) (vLLM 0.33.0's
//! `SimpleCPUOffloadScheduler`) on vLLM's own Python GPU `BlockPool`.
//!
//! `kvtier.simple.SimpleCPUOffloadScheduler` reads vLLM's objects (requests, block lists, the
//! scheduler output) into the plain arguments these methods take and builds vLLM's objects
//! from their answers. The GPU pool is the vLLM `BlockPool` given to [`bind`](SimpleScheduler::bind):
//! [`gpu`] reads and pins it through its own methods. Request ids map to the core's `u64`
//! ids while the core tracks them ([`ids`]); block hashes map to dense key ids the CPU pool
//! holds ([`hashes`]).

mod cpu;
mod errors;
mod gpu;
mod hashes;
mod ids;
mod layout;
mod step;
mod view;

use std::collections::HashSet;

use kvtier_core::simple::{
    Finished, LookupRequest, NewError, PoolSize, PoolSizing, Progress, SimpleConfig, SimpleEvent,
    SimpleScheduler as Core, WorkerOutput,
};
use kvtier_core::stats::Value;
use kvtier_core::stats::simple_offload::{Backend, SaveOutcome};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

pub(crate) use cpu::CpuBlockPool;
use errors::{alloc_error, input_error};
use gpu::PyGpu;
use hashes::KeysCell;
use ids::{ReqIds, UNKNOWN};
use layout::{layout, tables};
use step::StepArgs;

/// What `build_connector_meta` answers: `(store_event, store_gpu, store_cpu, load_event,
/// load_gpu, load_cpu, load_event_to_reqs, need_flush)`, events `-1` when absent.
type PlanTuple<'py> = (
    i64,
    Vec<u32>,
    Vec<u32>,
    i64,
    Vec<u32>,
    Vec<u32>,
    Bound<'py, PyDict>,
    bool,
);

/// What `prepare_store_specs` answers: `(gpu_blocks, cpu_blocks, req_ids)`.
type PreparedTuple = (Vec<u32>, Vec<u32>, Vec<Py<PyString>>);

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn event_or_minus_one(e: Option<u64>) -> i64 {
    e.map_or(-1, |e| i64::try_from(e).unwrap_or(i64::MAX))
}

/// kvtier's simple offloader, scheduler side, for `kvtier.simple`.
#[pyclass(module = "kvtier._native")]
#[derive(Debug)]
pub(crate) struct SimpleScheduler {
    s: Core,
    pool: Option<Py<PyAny>>,
    keys: KeysCell,
    ids: ReqIds,
    /// Issued load events with their requests in registration order (what vLLM's
    /// `_load_event_to_reqs` lists), cut down to the core's live loads at each step.
    load_reqs: Vec<(u64, Vec<u64>)>,
    /// Position-encoded hashes of one call's requests, back to back.
    positions: Vec<u64>,
    /// The list number the next `request_finished_all_groups` gives its hashes (from
    /// [`FLUSH_LISTS`] on, so that a queued flush's event payload names its own request).
    flush_serial: usize,
}

/// List numbers from here on name the requests of finish-time flushes (below: the scheduled
/// requests of one `build_connector_meta`).
const FLUSH_LISTS: usize = 1 << 21;

#[pymethods]
impl SimpleScheduler {
    /// The CPU pool's size follows vLLM's `_derive_cpu_config`: `num_cpu_blocks` (checked
    /// against the budget) when given, else `aligned_num_cpu_blocks` when given, else what
    /// `capacity_bytes` holds at the GPU's bytes per block.
    #[new]
    #[pyo3(signature = (
        block_size, num_gpu_blocks, capacity_bytes, gpu_total_bytes, num_cpu_blocks,
        aligned_num_cpu_blocks, lazy_offload, max_num_batched_tokens, world_size,
        num_prefill_lookahead_tokens, disk, page_cache, max_requests, max_blocks_per_request,
        enable_events, event_capacity, groups = vec![("full_attention".to_owned(), 0)],
        hash_block_size = None, group_block_sizes = Vec::new(), dcp_world_size = 1,
        secondary_hashes = None, use_eagle_block_drop = false, eagle_groups = Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: u32,
        num_gpu_blocks: u32,
        capacity_bytes: u64,
        gpu_total_bytes: u64,
        num_cpu_blocks: Option<u32>,
        aligned_num_cpu_blocks: Option<u32>,
        lazy_offload: bool,
        max_num_batched_tokens: u32,
        world_size: u32,
        num_prefill_lookahead_tokens: u32,
        disk: bool,
        page_cache: bool,
        max_requests: u32,
        max_blocks_per_request: u32,
        enable_events: bool,
        event_capacity: u32,
        groups: Vec<(String, u32)>,
        hash_block_size: Option<u32>,
        group_block_sizes: Vec<u32>,
        dcp_world_size: u32,
        secondary_hashes: Option<u32>,
        use_eagle_block_drop: bool,
        eagle_groups: Vec<u32>,
    ) -> PyResult<Self> {
        let size = match (num_cpu_blocks, aligned_num_cpu_blocks) {
            (Some(n), _) => PoolSize::Explicit(n),
            (None, Some(n)) => PoolSize::Aligned(n),
            (None, None) => PoolSize::FromBytes,
        };
        let sizing = PoolSizing {
            capacity_bytes,
            gpu_total_bytes,
            size,
        };
        let mut c = SimpleConfig::new(block_size, num_gpu_blocks, sizing);
        c.lazy_offload = lazy_offload;
        c.max_num_batched_tokens = max_num_batched_tokens;
        c.world_size = world_size;
        c.num_prefill_lookahead_tokens = num_prefill_lookahead_tokens;
        c.backend = if disk { Backend::Disk } else { Backend::Cpu };
        c.page_cache = page_cache;
        c.max_requests = max_requests;
        c.max_blocks_per_request = max_blocks_per_request;
        c.enable_events = enable_events;
        c.event_capacity = event_capacity;
        c.layout = layout(&groups, &group_block_sizes)?;
        for g in eagle_groups {
            c.layout = c.layout.with_eagle_group(g).map_err(value_error)?;
        }
        c.use_eagle_block_drop = use_eagle_block_drop;
        c.hash_block_size = hash_block_size;
        c.dcp_world_size = dcp_world_size;
        c.secondary_hashes = secondary_hashes;
        let s = Core::new(c).map_err(|e| match e {
            NewError::Config(c) => value_error(c),
            NewError::AllocFailed => PyMemoryError::new_err(e.to_string()),
        })?;
        Ok(SimpleScheduler {
            s,
            pool: None,
            keys: KeysCell::default(),
            ids: ReqIds::default(),
            load_reqs: Vec::new(),
            positions: Vec::new(),
            flush_serial: 0,
        })
    }

    /// The CPU pool's blocks, the null block included (vLLM's `num_cpu_blocks`).
    fn num_cpu_blocks(&self) -> u32 {
        self.s.num_cpu_blocks()
    }

    /// Lazy mode's `target_free` (0 in eager mode).
    fn target_free(&self) -> u32 {
        self.s.target_free()
    }

    /// Whether hits end on hash-block boundaries (vLLM's `enable_partial_hash_hits`).
    fn partial_hash_hits(&self) -> bool {
        self.s.validated().partial_hash_hits
    }

    /// Secondary hashes a completed store could not keep for want of room.
    fn dropped_secondary_hashes(&self) -> u64 {
        self.s.dropped_secondary_hashes()
    }

    /// Free CPU blocks (`cpu_block_pool.get_num_free_blocks()`).
    fn cpu_free_blocks(&self) -> u32 {
        self.s.cpu_pool().free_count()
    }

    /// A live view of the CPU pool (`cpu_block_pool`).
    fn cpu_pool(slf: Bound<'_, Self>) -> CpuBlockPool {
        CpuBlockPool {
            sched: slf.unbind(),
        }
    }

    /// `bind_gpu_block_pool`: the vLLM `BlockPool` every later call reads and pins.
    fn bind(&mut self, pool: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = pool.getattr("blocks")?.len()?;
        if n > self.s.config().num_gpu_blocks as usize {
            return Err(PyValueError::new_err(format!(
                "the GPU block pool has {n} blocks, more than the KV-cache config's {}",
                self.s.config().num_gpu_blocks
            )));
        }
        self.pool = Some(pool.clone().unbind());
        Ok(())
    }

    /// `get_num_new_matched_tokens`: `(tokens, is_async)`.
    fn get_num_new_matched_tokens(
        &mut self,
        req_id: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_tokens: u64,
        num_computed_tokens: u64,
        skip_reading_prefix_cache: bool,
    ) -> PyResult<(u64, bool)> {
        let hashes = self.lookup_hashes(
            block_hashes,
            num_tokens,
            num_computed_tokens,
            skip_reading_prefix_cache,
        )?;
        let req = self.ids.get_or_insert(req_id)?;
        let lookup = LookupRequest {
            req,
            block_hashes: &hashes,
            num_tokens,
            skip_reading_prefix_cache,
        };
        let r = self
            .s
            .get_num_new_matched_tokens(&lookup, num_computed_tokens);
        self.ids.forget_if_untracked(&self.s, req);
        r.map_err(input_error)
    }

    /// `update_state_after_alloc` with the request's block ids, one list per group.
    fn update_state_after_alloc(
        &mut self,
        py: Python<'_>,
        req_id: &Bound<'_, PyAny>,
        block_ids: Vec<Vec<u32>>,
        num_external_tokens: u64,
    ) -> PyResult<()> {
        let pool = self.pool(py)?;
        let req = self.ids.get_or_insert(req_id)?;
        let mut view = PyGpu::new(&pool, &self.keys, &[], 0)?;
        let r = self.s.update_state_after_alloc_groups(
            &mut view,
            req,
            &tables(&block_ids),
            num_external_tokens,
        );
        let py_err = view.finish();
        self.ids.forget_if_untracked(&self.s, req);
        py_err?;
        r.map_err(alloc_error)
    }

    /// `build_connector_meta`'s plan (see [`PlanTuple`]) for `step` ([`StepArgs`]).
    fn build_connector_meta<'py>(
        &mut self,
        py: Python<'py>,
        step: StepArgs<'py>,
    ) -> PyResult<PlanTuple<'py>> {
        let queued: Vec<u64> = self.s.queued_loads().collect();
        let (store_event, load_event, need_flush, out_lists) =
            self.run_step(py, &step, |s, view, step| {
                let plan = s.build_connector_meta(view, step)?;
                Ok((
                    plan.store_event,
                    plan.load_event,
                    plan.need_flush,
                    (
                        plan.store_gpu_blocks.to_vec(),
                        plan.store_cpu_blocks.to_vec(),
                        plan.load_gpu_blocks.to_vec(),
                        plan.load_cpu_blocks.to_vec(),
                    ),
                ))
            })?;
        if let Some(e) = load_event {
            self.load_reqs.push((e, queued));
        }
        let live: HashSet<(u64, u64)> = self.s.load_event_requests().collect();
        for (e, reqs) in &mut self.load_reqs {
            reqs.retain(|r| live.contains(&(*e, *r)));
        }
        self.load_reqs.retain(|(_, reqs)| !reqs.is_empty());
        let to_reqs = PyDict::new(py);
        for (e, reqs) in &self.load_reqs {
            let names = PyList::empty(py);
            for r in reqs {
                if let Some(n) = self.ids.name(*r) {
                    names.append(n.bind(py))?;
                }
            }
            to_reqs.set_item(*e, names)?;
        }
        Ok((
            event_or_minus_one(store_event),
            out_lists.0,
            out_lists.1,
            event_or_minus_one(load_event),
            out_lists.2,
            out_lists.3,
            to_reqs,
            need_flush,
        ))
    }

    /// `prepare_store_specs`: the store half of `build_connector_meta` for `step`
    /// ([`StepArgs`]), `(gpu_blocks, cpu_blocks, req_ids)`; the stores are issued with the
    /// next store event (vLLM's leaves them in none).
    fn prepare_store_specs<'py>(
        &mut self,
        py: Python<'py>,
        step: StepArgs<'py>,
    ) -> PyResult<PreparedTuple> {
        let (gpu, cpu, reqs) = self.run_step(py, &step, |s, view, step| {
            let p = s.prepare_store_specs(view, step)?;
            Ok((
                p.gpu_blocks.to_vec(),
                p.cpu_blocks.to_vec(),
                p.requests.to_vec(),
            ))
        })?;
        let names = reqs
            .iter()
            .filter_map(|r| self.ids.name(*r).map(|n| n.clone_ref(py)))
            .collect();
        Ok((gpu, cpu, names))
    }

    /// `update_connector_output`: the requests whose loads finished and the store reports
    /// `(event, workers)` summed within the step.
    fn update_connector_output(
        &mut self,
        py: Python<'_>,
        finished_recving: Vec<Bound<'_, PyAny>>,
        completed_stores: Vec<(u64, u32)>,
    ) -> PyResult<()> {
        if finished_recving.is_empty() && completed_stores.is_empty() {
            return Ok(());
        }
        let pool = self.pool(py)?;
        let recv = finished_recving
            .iter()
            .map(|r| self.ids.get(r))
            .collect::<PyResult<Vec<u64>>>()?;
        self.keys.borrow_mut().maybe_sweep(&self.s);
        // Reports of events not in flight change nothing (vLLM's guard against stale
        // events): the core refuses those never issued, so they are left out here and the
        // report's other events still complete.
        let stores: Vec<(u64, u32)> = completed_stores
            .into_iter()
            .filter(|&(e, _)| self.s.store_event_state(e).is_some())
            .collect();
        let out = WorkerOutput {
            finished_recving: &recv,
            completed_stores: &stores,
        };
        let mut view = PyGpu::new(&pool, &self.keys, &[], 0)?;
        let r = self.s.update_connector_output(&mut view, &out);
        let py_err = view.finish();
        self.ids.forget_untracked(&self.s);
        py_err?;
        r.map_err(value_error)
    }

    /// Whether the request has eager store state (what a finish-time flush reads the block
    /// tables of).
    fn is_storing(&self, req_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let req = self.ids.get(req_id)?;
        Ok(req != UNKNOWN && self.s.is_storing(req))
    }

    /// `request_finished`.
    fn request_finished(&mut self, py: Python<'_>, req_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let req = self.ids.get(req_id)?;
        if req == UNKNOWN {
            return Ok(());
        }
        let pool = self.pool(py)?;
        let mut view = PyGpu::new(&pool, &self.keys, &[], 0)?;
        self.s.request_finished(&mut view, req);
        let py_err = view.finish();
        self.ids.forget_if_untracked(&self.s, req);
        py_err
    }

    /// `request_finished_all_groups` with the request's block ids (one list per group) and progress;
    /// returns the list number its event payloads name (see [`stored_meta`](Self::stored_meta)).
    #[allow(clippy::too_many_arguments)]
    fn request_finished_all_groups(
        &mut self,
        py: Python<'_>,
        req_id: &Bound<'_, PyAny>,
        block_ids: Vec<Vec<u32>>,
        num_computed_tokens: u64,
        num_output_placeholders: u64,
        block_hashes: &Bound<'_, PyAny>,
        num_prompt_tokens: u64,
    ) -> PyResult<Option<usize>> {
        let req = self.ids.get(req_id)?;
        if req == UNKNOWN {
            return Ok(None);
        }
        let pool = self.pool(py)?;
        let list = FLUSH_LISTS + self.flush_serial;
        self.flush_serial = (self.flush_serial + 1) % FLUSH_LISTS;
        self.positions.clear();
        let (a, b) = self.push_positions(list, Some(block_hashes))?;
        let block_tables = tables(&block_ids);
        let fin = Finished {
            req,
            block_ids: &block_tables,
            num_prompt_tokens,
            progress: Progress {
                num_computed_tokens,
                num_output_placeholders,
                block_hashes: &self.positions[a..b],
            },
        };
        let lists = [block_hashes.clone()];
        self.keys.borrow_mut().maybe_sweep(&self.s);
        let mut view = PyGpu::new(&pool, &self.keys, &lists, list)?;
        let r = self.s.request_finished_all_groups(&mut view, &fin);
        let py_err = view.finish();
        self.ids.forget_if_untracked(&self.s, req);
        py_err?;
        r.map_err(input_error)?;
        Ok(Some(list))
    }

    /// `reset`: whether the CPU prefix cache was cleared.
    fn reset(&mut self, py: Python<'_>) -> PyResult<bool> {
        let pool = self.pool(py)?;
        let mut view = PyGpu::new(&pool, &self.keys, &[], 0)?;
        let ok = self.s.reset(&mut view);
        let py_err = view.finish();
        self.ids.forget_untracked(&self.s);
        py_err?;
        Ok(ok)
    }

    /// `has_pending_stores`.
    fn has_pending_stores(&self) -> bool {
        self.s.has_pending_stores()
    }

    /// `get_stats` drained: `[(name, labelvalues, is_counter, value)]`.
    fn get_stats<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let p = self.s.get_stats();
        let mut out = Vec::with_capacity(p.len());
        for series in p.series() {
            let labels = PyTuple::new(py, series.labels().iter().collect::<Vec<_>>())?;
            let (counter, value) = match series.value() {
                Value::Counter(v) => (true, i128::from(*v)),
                Value::Gauge(g) => (false, i128::from(g.numerator())),
                Value::Histogram(_) => continue,
            };
            out.push(PyTuple::new(
                py,
                [
                    series.name().into_pyobject(py)?.into_any(),
                    labels.into_any(),
                    counter.into_pyobject(py)?.to_owned().into_any(),
                    value.into_pyobject(py)?.into_any(),
                ],
            )?);
        }
        Ok(out)
    }

    /// The cumulative boundary hand-off counts (vLLM's `BoundaryStoreStats` fields, in its
    /// order): `(published, stored, dropped_cpu_full, dropped_request_gone,
    /// skipped_already_cached, skipped_in_flight, dropped_null_block, dropped_not_hashed)`.
    fn boundary_store_stats(&self) -> (u64, u64, u64, u64, u64, u64, u64, u64) {
        let t = |o| self.s.boundary_total(o);
        (
            self.s.published(),
            t(SaveOutcome::Stored),
            t(SaveOutcome::DroppedCpuFull),
            t(SaveOutcome::DroppedRequestGone),
            t(SaveOutcome::SkippedAlreadyCached),
            t(SaveOutcome::SkippedInFlight),
            t(SaveOutcome::DroppedNullBlock),
            t(SaveOutcome::DroppedNotHashed),
        )
    }

    /// The CPU prefix cache's changes since the last call, oldest first (events on):
    /// `("removed", key)` for a key (vLLM's `BlockHashWithGroupId`, its group the KV-cache
    /// group's) a CPU block lost, `("cleared", None)` for a reset that cleared the cache. Completed stores are not listed (`kvtier.simple` emits them from
    /// the payloads it captured when it issued them). Call after every call that changes
    /// the pool: a removed key's object is kept only until the next call.
    fn take_pool_events(&mut self, py: Python<'_>) -> Vec<(&'static str, Option<Py<PyAny>>)> {
        let keys = self.keys.borrow();
        let mut out = Vec::new();
        for e in self.s.take_events() {
            match e {
                SimpleEvent::Removed { key, .. } => out.push((
                    "removed",
                    keys.key_object(py, key.hash, key.group)
                        .map(|v| v.into_any().unbind()),
                )),
                SimpleEvent::AllCleared => out.push(("cleared", None)),
                SimpleEvent::Stored { .. } => {}
            }
        }
        out
    }

    /// The event payload of CPU block `cpu_block` of the store just issued:
    /// `(list, index, token_start, req_id)` naming the parent hash `block_hashes[index]` of
    /// the call's `list`-th request (`list` and `index` `None` for a request's first block)
    /// and the request whose table named the block, or `None` for a store without a payload.
    #[allow(clippy::type_complexity)]
    fn stored_meta(
        &self,
        py: Python<'_>,
        cpu_block: u32,
    ) -> Option<(Option<usize>, Option<usize>, u64, Option<Py<PyString>>)> {
        let m = self.s.stored_meta(cpu_block)?;
        let parent = m.parent_hash.and_then(hashes::decode_position);
        let name = self.ids.name(m.req).map(|n| n.clone_ref(py));
        Some((
            parent.map(|p| p.0),
            parent.map(|p| p.1),
            m.token_start,
            name,
        ))
    }

    /// `Some(abandoned)` while store event `event` is issued and not completed.
    fn store_event_state(&self, event: u64) -> Option<bool> {
        self.s.store_event_state(event)
    }

    /// Events the core dropped (more than `event_capacity` between two drains).
    fn dropped_events(&self) -> u64 {
        self.s.dropped_events()
    }

    /// The request ids forgotten since the last call (their requests are no longer tracked).
    fn take_forgotten(&mut self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.ids
            .take_forgotten()
            .into_iter()
            .map(|n| n.into_bound(py).into_any().unbind())
            .collect()
    }

    /// Request ids mapped now (at most the requests the core tracks).
    fn mapped_requests(&self) -> usize {
        self.ids.len()
    }

    /// Block keys interned now.
    fn interned_keys(&self) -> usize {
        self.keys.borrow().len()
    }
}
