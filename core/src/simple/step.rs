//! `build_connector_meta`: the step's stores (eager or lazy, then the queued flushes) under
//! one store event, and the step's loads under one load event; `prepare_store_specs`, its
//! store half alone.

use super::gpu::{GpuBlocks, StepInput};
use super::{InputError, PreparedStores, SimpleScheduler, StepPlan};

impl SimpleScheduler {
    /// vLLM's `build_connector_meta`: plans this step's transfers.
    ///
    /// Stores: eager mode classifies the boundary hand-offs, resets the cursors of preempted
    /// requests, then scans each scheduled request's confirmed blocks from its cursor; lazy
    /// mode walks the GPU free queue. The queued finish-time flushes follow. When any block
    /// is stored, the lists become the next store event. Loads: every load registered since
    /// the previous step, in registration order, becomes the next load event.
    ///
    /// # Errors
    /// [`InputError`] for a GPU view of the wrong size, a GPU id out of range, a request
    /// scheduled twice, a table longer than `max_blocks_per_request`, or block hashes that do
    /// not cover a request's computed tokens. Nothing changes then.
    pub fn build_connector_meta(
        &mut self,
        gpu: &mut impl GpuBlocks,
        step: &StepInput<'_>,
    ) -> Result<StepPlan<'_>, InputError> {
        self.check_step(gpu, step)?;
        let load_blocks: usize = self
            .reqs
            .load_order
            .iter()
            .map(|&s| self.reqs.slots[s as usize].load.gpu.len())
            .sum();
        // The bound reserved at construction (a clone's lists keep only their length).
        if load_blocks > self.config.num_gpu_blocks as usize {
            return Err(InputError::TooManyLoadBlocks);
        }
        self.plan_stores(gpu, step, false);
        let fresh = self.store_gpu.len() as u64;
        for i in 0..self.xfer.flushes.len() {
            let chain = self.xfer.flushes[i];
            for c in self.xfer.blocks(chain) {
                self.store_gpu.push(self.xfer.gpu[c as usize]);
                self.store_cpu.push(c);
            }
        }
        self.xfer.flushes.clear();
        let store_event = if self.store_gpu.is_empty() {
            None
        } else {
            let idx = self.store_counter;
            self.store_counter += 1;
            let chain = self.xfer.thread(&self.store_gpu, &self.store_cpu);
            self.xfer.issue(idx, chain);
            self.xfer.pending_blocks += fresh;
            Some(idx)
        };
        self.load_gpu.clear();
        self.load_cpu.clear();
        let load_event = if self.reqs.load_order.is_empty() {
            None
        } else {
            let idx = self.load_counter;
            self.load_counter += 1;
            for &s in &self.reqs.load_order {
                let load = &mut self.reqs.slots[s as usize].load;
                self.load_gpu.extend_from_slice(&load.gpu);
                self.load_cpu.extend_from_slice(&load.cpu);
                load.event = Some(idx);
            }
            self.reqs.load_order.clear();
            Some(idx)
        };
        Ok(StepPlan {
            store_event,
            store_gpu_blocks: &self.store_gpu,
            store_cpu_blocks: &self.store_cpu,
            load_event,
            load_gpu_blocks: &self.load_gpu,
            load_cpu_blocks: &self.load_cpu,
            need_flush: !step.preempted.is_empty(),
        })
    }

    /// vLLM's `prepare_store_specs`, the store half of
    /// [`build_connector_meta`](Self::build_connector_meta): plans this step's stores as it
    /// would (the same outcomes counted, CPU blocks allocated, GPU blocks pinned, cursors
    /// advanced) and returns them with the requests they came from, without a store event.
    ///
    /// vLLM's own method leaves such stores in no event: their CPU blocks and pins are never
    /// released. Here they are queued like a finishing request's flush: the next
    /// `build_connector_meta` issues them in its store event after that step's own stores,
    /// [`reset`](Self::reset) releases them, and
    /// [`pending_store_blocks`](Self::pending_store_blocks) counts them meanwhile.
    ///
    /// # Errors
    /// As [`build_connector_meta`](Self::build_connector_meta), for the same inputs (the
    /// loads are not read). Nothing changes then.
    pub fn prepare_store_specs(
        &mut self,
        gpu: &mut impl GpuBlocks,
        step: &StepInput<'_>,
    ) -> Result<PreparedStores<'_>, InputError> {
        self.check_step(gpu, step)?;
        self.plan_stores(gpu, step, true);
        if !self.store_gpu.is_empty() {
            let chain = self.xfer.thread(&self.store_gpu, &self.store_cpu);
            self.xfer.flushes.push(chain);
            self.xfer.pending_blocks += u64::from(chain.len);
        }
        Ok(PreparedStores {
            gpu_blocks: &self.store_gpu,
            cpu_blocks: &self.store_cpu,
            requests: &self.store_reqs,
        })
    }

    /// The checks both step calls make before anything changes.
    fn check_step(&mut self, gpu: &impl GpuBlocks, step: &StepInput<'_>) -> Result<(), InputError> {
        self.check_gpu(gpu, &[])?;
        if !self.config.lazy_offload {
            for h in step.handoffs {
                self.check_gpu(gpu, h.gpu_blocks)?;
            }
            for sc in step.scheduled {
                for t in sc.new_block_ids.unwrap_or_default() {
                    self.check_gpu(gpu, t)?;
                }
            }
            self.check_eager_step(step)?;
        }
        Ok(())
    }

    /// Fills the store lists with this step's eager or lazy stores; with `collect`, also the
    /// requests they came from, in first-stored order.
    fn plan_stores(&mut self, gpu: &mut impl GpuBlocks, step: &StepInput<'_>, collect: bool) {
        self.store_gpu.clear();
        self.store_cpu.clear();
        self.store_reqs.clear();
        self.collect_reqs = collect;
        if self.config.lazy_offload {
            self.lazy_stores(gpu);
        } else {
            self.eager_stores(gpu, step);
        }
        self.collect_reqs = false;
    }
}
