//! The step input both step methods of [`SimpleScheduler`] read (`build_connector_meta`,
//! `prepare_store_specs`): vLLM's scheduler output, as `kvtier.simple` flattens it, turned
//! into the core's [`StepInput`] over a view of the bound GPU pool.

use kvtier_core::simple::{
    Handoff, InputError, Progress, Scheduled, SimpleScheduler as Core, StepInput,
};
use pyo3::prelude::*;

use super::SimpleScheduler;
use super::errors::input_error;
use super::gpu::PyGpu;
use super::layout::tables;

/// One scheduled request as `kvtier.simple` passes it: `(req_id, new_block_ids per group or
/// None, is_full_table, num_scheduled_tokens, num_computed_tokens, num_output_placeholders,
/// block_hashes or None)`.
pub(super) type ScheduledArg<'py> = (
    Bound<'py, PyAny>,
    Option<Vec<Vec<u32>>>,
    bool,
    u64,
    u64,
    u64,
    Option<Bound<'py, PyAny>>,
);

/// One step's output as `kvtier.simple` passes it, a tuple `(handoffs, preempted,
/// finished, scheduled)`: boundary hand-offs `(req_id, GPU blocks)`, preempted and finished
/// request ids, scheduled requests.
#[derive(FromPyObject)]
pub(super) struct StepArgs<'py>(
    Vec<(Bound<'py, PyAny>, Vec<u32>)>,
    Vec<Bound<'py, PyAny>>,
    Vec<Bound<'py, PyAny>>,
    Vec<ScheduledArg<'py>>,
);

impl SimpleScheduler {
    /// Runs `f` on the core with the step `args` describe and a view of the GPU pool.
    /// Unknown request ids map to ids the core does not track.
    ///
    /// # Errors
    /// What `f` returns (as `ValueError`), then what the view raised.
    pub(super) fn run_step<'py, R>(
        &mut self,
        py: Python<'py>,
        args: &StepArgs<'py>,
        f: impl FnOnce(&mut Core, &mut PyGpu<'_, 'py>, &StepInput<'_>) -> Result<R, InputError>,
    ) -> PyResult<R> {
        let pool = self.pool(py)?;
        let ids = |list: &[Bound<'py, PyAny>]| -> PyResult<Vec<u64>> {
            list.iter().map(|r| self.ids.get(r)).collect()
        };
        let preempted = ids(&args.1)?;
        let finished = ids(&args.2)?;
        let handoff_ids = args
            .0
            .iter()
            .map(|(r, _)| self.ids.get(r))
            .collect::<PyResult<Vec<u64>>>()?;
        self.positions.clear();
        let scheduled = &args.3;
        let mut lists = Vec::with_capacity(scheduled.len());
        let mut ranges = Vec::with_capacity(scheduled.len());
        let mut sched_ids = Vec::with_capacity(scheduled.len());
        for (i, sc) in scheduled.iter().enumerate() {
            sched_ids.push(self.ids.get(&sc.0)?);
            ranges.push(self.push_positions(i, sc.6.as_ref())?);
            lists.push(sc.6.clone().unwrap_or_else(|| py.None().into_bound(py)));
        }
        let handoff_list: Vec<Handoff<'_>> = args
            .0
            .iter()
            .zip(&handoff_ids)
            .map(|((_, g), &req)| Handoff { req, gpu_blocks: g })
            .collect();
        let new: Vec<Option<Vec<&[u32]>>> = scheduled
            .iter()
            .map(|sc| sc.1.as_deref().map(tables))
            .collect();
        let sched_list: Vec<Scheduled<'_>> = scheduled
            .iter()
            .zip(&sched_ids)
            .zip(&ranges)
            .zip(&new)
            .map(|(((sc, &req), &(a, b)), new)| Scheduled {
                req,
                new_block_ids: new.as_deref(),
                full_table: sc.2,
                num_scheduled_tokens: sc.3,
                progress: Progress {
                    num_computed_tokens: sc.4,
                    num_output_placeholders: sc.5,
                    block_hashes: &self.positions[a..b],
                },
            })
            .collect();
        let step = StepInput {
            handoffs: &handoff_list,
            preempted: &preempted,
            finished: &finished,
            scheduled: &sched_list,
        };
        self.keys.borrow_mut().maybe_sweep(&self.s);
        let mut view = PyGpu::new(&pool, &self.keys, &lists, 0)?;
        let r = f(&mut self.s, &mut view, &step);
        let py_err = view.finish();
        let r = r.map_err(input_error)?;
        py_err?;
        Ok(r)
    }
}
