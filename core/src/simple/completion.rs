//! Worker output (load completions; store completions once every worker reported them),
//! finishing requests, and `reset`.

use super::error::{InputError, OutputError};
use super::gpu::{Finished, GpuBlocks, WorkerOutput};
use super::requests::{NIL, Requests};
use super::transfers::Chain;
use super::{SimpleEvent, SimpleScheduler, len32};

impl SimpleScheduler {
    /// vLLM's `update_connector_output`: first the loads in `finished_recving` (their pins
    /// released, their blocks counted in `load_blocks_total` when the load had been issued),
    /// then the store reports. A store event completes when the reports summed over steps
    /// reach `world_size`: its CPU blocks take the GPU blocks' hashes (a `BlockStored` each,
    /// with events on) and both sides' pins are released, CPU then GPU, in the event's order.
    /// An event abandoned by a reset only releases its pins. Reports of events already
    /// completed are ignored.
    ///
    /// # Errors
    /// [`OutputError::UnknownStoreEvent`] for an event never issued;
    /// [`OutputError::GpuBlockUnhashed`] when a block of a reported event lost its hash.
    /// Nothing changes then.
    pub fn update_connector_output(
        &mut self,
        gpu: &mut impl GpuBlocks,
        out: &WorkerOutput<'_>,
    ) -> Result<(), OutputError> {
        for &(e, _) in out.completed_stores {
            if e >= self.store_counter {
                return Err(OutputError::UnknownStoreEvent { event: e });
            }
            let Some(ev) = self.xfer.event_mut(e) else {
                continue;
            };
            let (chain, abandoned) = (ev.chain, ev.abandoned);
            if abandoned {
                continue;
            }
            for c in self.xfer.blocks(chain) {
                let g = self.xfer.gpu[c as usize];
                if gpu.block_hash(g).is_none() {
                    return Err(OutputError::GpuBlockUnhashed { block: g });
                }
            }
        }
        for &r in out.finished_recving {
            if let Some(s) = self.reqs.find(r) {
                let n = self.cleanup_load(gpu, s);
                self.stats.record_load_completed(n);
                self.reqs.release_if_idle(s);
            }
        }
        let world = self.config.world_size;
        for &(e, count) in out.completed_stores {
            let Some(ev) = self.xfer.event_mut(e) else {
                continue;
            };
            ev.reported = ev.reported.saturating_add(count);
            if ev.reported >= world {
                self.process_store_event(gpu, e);
            }
        }
        Ok(())
    }

    /// `_process_store_event` for an event all workers reported.
    fn process_store_event(&mut self, gpu: &mut impl GpuBlocks, e: u64) {
        let Some(ev) = self.xfer.take(e) else {
            return;
        };
        if ev.abandoned {
            self.release_chain(gpu, ev.chain);
            return;
        }
        let eager = !self.config.lazy_offload;
        self.got.clear();
        self.tmp.clear();
        for c in self.xfer.blocks(ev.chain) {
            self.got.push(c);
            self.tmp.push(self.xfer.gpu[c as usize]);
        }
        for i in 0..self.got.len() {
            let (c, g) = (self.got[i], self.tmp[i]);
            if eager {
                self.set_in_flight(g, false);
            }
            // Checked in update_connector_output: every block of the event holds a hash.
            if let Some(h) = gpu.block_hash(g) {
                self.copy_hashes(gpu, c, g, h);
            }
        }
        let r = self.cpu.free_blocks(&self.got);
        debug_assert!(r.is_ok());
        gpu.free(&self.tmp);
        if eager {
            for i in 0..self.got.len() {
                let (s, generation) = self.xfer.req[self.got[i] as usize];
                if s == NIL {
                    continue;
                }
                let slot = &mut self.reqs.slots[s as usize];
                if !slot.live || slot.generation != generation || !slot.store.active {
                    continue;
                }
                slot.store.events = slot.store.events.saturating_sub(1);
                if slot.store.finished && slot.store.events == 0 {
                    slot.store.active = false;
                    self.reqs.release_if_idle(s);
                }
            }
        }
    }

    /// `_process_store_completion` for one block: CPU block `c` takes GPU block `g`'s hash
    /// `h` and its secondary hashes, a `BlockStored` for each (events on): the hash with its
    /// positional payload at the group's block size, each secondary hash with the request's
    /// own hash block at that boundary, or without a payload and block size 0.
    fn copy_hashes(
        &mut self,
        gpu: &impl GpuBlocks,
        c: u32,
        g: u32,
        h: crate::block_pool::BlockHash<crate::BlockKey>,
    ) {
        let medium = self.medium;
        let r = self.cpu.insert_hash(c, h.key, h.num_tokens);
        debug_assert!(r.is_ok(), "a CPU block being written holds no hash");
        let block_size = self
            .v
            .group_block_sizes
            .get(h.key.group as usize)
            .copied()
            .unwrap_or(self.config.block_size);
        let meta = self.xfer.meta.get(c as usize).copied().flatten();
        self.push_event(SimpleEvent::Stored {
            key: h.key,
            block_size,
            meta,
            medium,
        });
        let hash = u64::from(self.v.hash_block_size);
        gpu.secondary_hashes(g, |key| {
            if let Err(e) = self.cpu.insert_secondary_hash(c, key, 0) {
                debug_assert!(matches!(
                    e,
                    crate::block_pool::InsertHashError::NoSecondaryRoom { .. }
                ));
                self.dropped_secondary = self.dropped_secondary.saturating_add(1);
                return;
            }
            let meta = self.xfer.secondary_meta(c, key, hash);
            self.push_event(SimpleEvent::Stored {
                key,
                block_size: if meta.is_some() {
                    self.v.hash_block_size
                } else {
                    0
                },
                meta,
                medium,
            });
        });
    }

    /// Releases a transfer's pins without caching its data (`_release_transfer_refs`).
    fn release_chain(&mut self, gpu: &mut impl GpuBlocks, chain: Chain) {
        self.got.clear();
        self.tmp.clear();
        for c in self.xfer.blocks(chain) {
            self.got.push(c);
            self.tmp.push(self.xfer.gpu[c as usize]);
        }
        let r = self.cpu.free_blocks(&self.got);
        debug_assert!(r.is_ok());
        gpu.free(&self.tmp);
    }

    /// `_cleanup_load_request`: releases slot `s`'s load (or the load a reset abandoned),
    /// returning its block count when it had been issued.
    fn cleanup_load(&mut self, gpu: &mut impl GpuBlocks, s: u32) -> u64 {
        let slot = &mut self.reqs.slots[s as usize];
        let load = if slot.load.active {
            &mut slot.load
        } else if slot.abandoned.active {
            &mut slot.abandoned
        } else {
            return 0;
        };
        load.active = false;
        let r = self.cpu.free_blocks(&load.cpu);
        debug_assert!(r.is_ok());
        gpu.free(&load.gpu);
        let n = load.gpu.len() as u64;
        let issued = load.event.take().is_some();
        load.gpu.clear();
        load.cpu.clear();
        if issued {
            n
        } else {
            Requests::unlist(&mut self.reqs.load_order, s);
            0
        }
    }

    /// vLLM's `request_finished`: releases the pending hit, the load if it was never issued
    /// (an issued one is released when it completes) and, in eager mode, the store state
    /// unless stores naming the request are in flight (then it goes when they complete).
    pub fn request_finished(&mut self, gpu: &mut impl GpuBlocks, req: u64) {
        let Some(s) = self.reqs.find(req) else {
            return;
        };
        self.free_pending_hit(s);
        let slot = &self.reqs.slots[s as usize];
        if slot.load.active && slot.load.event.is_none() {
            self.cleanup_load(gpu, s);
        }
        if !self.config.lazy_offload {
            let st = &mut self.reqs.slots[s as usize].store;
            if st.active {
                if st.events > 0 {
                    st.finished = true;
                } else {
                    st.active = false;
                }
            }
        }
        self.reqs.release_if_idle(s);
    }

    /// vLLM's `request_finished_all_groups` (the call vLLM's scheduler makes for this
    /// connector): in eager mode, the request's confirmed blocks from its cursor that are
    /// ready to store are queued as a flush (pinned now, issued with the next step's store
    /// event); then [`request_finished`](Self::request_finished).
    ///
    /// # Errors
    /// [`InputError`] for a GPU id out of range, a table longer than
    /// `max_blocks_per_request`, or (events on) hashes that do not cover the computed tokens. Nothing
    /// changes then.
    pub fn request_finished_all_groups(
        &mut self,
        gpu: &mut impl GpuBlocks,
        fin: &Finished<'_>,
    ) -> Result<(), InputError> {
        for t in fin.block_ids {
            self.check_gpu(gpu, t)?;
        }
        if let Some(s) = self.reqs.find(fin.req)
            && self.reqs.slots[s as usize].store.active
        {
            let max = self.config.max_blocks_per_request as usize;
            if fin.block_ids.iter().any(|t| t.len() > max) {
                return Err(InputError::TooManyBlocks { req: fin.req });
            }
            let hash = u64::from(self.v.hash_block_size);
            // vLLM reads the hashes of every flushed block for the events' payloads.
            if self.config.enable_events
                && (fin.progress.block_hashes.len() as u64)
                    < fin.progress.num_computed_tokens / hash
            {
                return Err(InputError::HashesTooShort { req: fin.req });
            }
            self.queue_flush(gpu, s, fin);
        }
        self.request_finished(gpu, fin.req);
        Ok(())
    }

    /// vLLM's `reset`: releases every pending hit, abandons issued stores (their pins held
    /// until they complete), releases queued flushes and unissued loads, abandons issued loads,
    /// drops every store state and the lazy cursor, and re-seeds the outcome counters with
    /// the deltas not yet drained. Returns false while abandoned transfers are outstanding,
    /// otherwise whether the CPU prefix cache could be cleared (only the null block in use).
    pub fn reset(&mut self, gpu: &mut impl GpuBlocks) -> bool {
        while let Some(&s) = self.reqs.hit_order.first() {
            self.free_pending_hit(s);
        }
        self.xfer.abandon_all();
        for i in 0..self.xfer.flushes.len() {
            let chain = self.xfer.flushes[i];
            self.release_chain(gpu, chain);
            self.xfer.pending_blocks -= u64::from(chain.len);
        }
        self.xfer.flushes.clear();
        self.in_flight.fill(0);
        while let Some(&s) = self.reqs.load_order.first() {
            self.cleanup_load(gpu, s);
        }
        let mut abandoned_loads = false;
        for slot in &mut self.reqs.slots {
            if !slot.live {
                continue;
            }
            if slot.load.active {
                // An earlier abandoned load of the same request is dropped with its pins
                // still held, as vLLM's dict assignment drops it.
                core::mem::swap(&mut slot.load, &mut slot.abandoned);
                slot.load.active = false;
                slot.load.event = None;
                slot.load.gpu.clear();
                slot.load.cpu.clear();
            }
            abandoned_loads |= slot.abandoned.active;
            slot.store.active = false;
            slot.store.finished = false;
            slot.store.events = 0;
            slot.store.last_event = None;
        }
        for s in 0..len32(self.reqs.slots.len()) {
            self.reqs.release_if_idle(s);
        }
        self.cursor = None;
        self.stats.reset();
        if self.xfer.abandoned_events > 0 || abandoned_loads {
            return false;
        }
        let ok = self.cpu.reset_prefix_cache();
        self.pull_pool_events();
        ok
    }
}
