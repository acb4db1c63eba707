//! Lazy stores: each step, walk the GPU free queue from a cursor and copy the cached blocks
//! nearest eviction that the CPU pool lacks.

use super::SimpleScheduler;
use super::gpu::GpuBlocks;

impl SimpleScheduler {
    /// `_prepare_lazy_store_specs`: walks the GPU free queue after the cursor (from its front
    /// when the cursor is unset or its block was taken out of the queue), covering up to
    /// `target_free` blocks and stopping once as many blocks are selected as the CPU pool has
    /// free. A block is selected when it holds a hash, is not the null block, and the CPU pool
    /// does not hold that hash. The cursor moves to the last block visited; the selected
    /// blocks get CPU destinations and are pinned.
    pub(super) fn lazy_stores(&mut self, gpu: &mut impl GpuBlocks) {
        let target = self.v.target_free as usize;
        if target == 0 {
            return;
        }
        let num_cpu_free = self.cpu.free_count() as usize;
        if self.cursor.is_some_and(|c| gpu.ref_count(c) > 0) {
            self.cursor = None;
        }
        let mut last = self.cursor;
        for (covered, node) in gpu.free_queue_after(self.cursor).enumerate() {
            if covered >= target || self.store_gpu.len() >= num_cpu_free {
                break;
            }
            last = Some(node);
            if node == 0 || node >= gpu.num_blocks() {
                continue;
            }
            if let Some(h) = gpu.block_hash(node)
                && self.cpu.get_one_block(&h.key).is_none()
            {
                self.store_gpu.push(node);
            }
        }
        self.cursor = last;
        let n = super::len32(self.store_gpu.len());
        if n == 0 {
            return;
        }
        self.alloc_cpu(n);
        for i in 0..n as usize {
            let c = self.got[i];
            self.store_cpu.push(c);
            self.xfer.req[c as usize] = (super::requests::NIL, 0);
            self.xfer.set_meta(c, None, &[]);
        }
        gpu.touch(&self.store_gpu);
    }
}
