//! Eager stores: boundary hand-offs classified one block at a time into the seven outcomes,
//! the per-request cursor scan of confirmed blocks, and the finishing request's final flush.

use super::gpu::{Finished, GpuBlocks, Progress, StepInput, Tables};
use super::requests::NIL;
use super::transfers::{NO_KEY, StoredMeta};
use super::{InputError, SimpleScheduler, len32};
use crate::BlockKey;
use crate::stats::simple_offload::SaveOutcome;

/// Why a GPU block is or is not stored (`_StoreAdmission`, in vLLM's check order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    Ready,
    NullBlock,
    NotHashed,
    InFlight,
    AlreadyCached,
}

impl SimpleScheduler {
    /// `_classify_store_candidate`.
    pub(super) fn classify(&self, gpu: &impl GpuBlocks, block: u32) -> Admission {
        if block == 0 {
            return Admission::NullBlock;
        }
        let Some(h) = gpu.block_hash(block) else {
            return Admission::NotHashed;
        };
        if self.is_in_flight(block) {
            return Admission::InFlight;
        }
        if self.cpu.get_one_block(&h.key).is_some() {
            return Admission::AlreadyCached;
        }
        Admission::Ready
    }

    /// Refuses an eager step input the tables cannot hold, before anything changes.
    pub(super) fn check_eager_step(&mut self, step: &StepInput<'_>) -> Result<(), InputError> {
        self.step = self.step.wrapping_add(1);
        let hash = u64::from(self.v.hash_block_size);
        for sc in step.scheduled {
            let Some(s) = self.reqs.find(sc.req) else {
                continue;
            };
            let slot = &mut self.reqs.slots[s as usize];
            if !slot.store.active || slot.store.finished {
                continue;
            }
            if slot.stamp == self.step {
                return Err(InputError::DuplicateRequest { req: sc.req });
            }
            slot.stamp = self.step;
            let reset = sc.full_table || step.preempted.contains(&sc.req);
            let kinds = self.config.layout.kinds();
            for (g, table) in slot.store.tables.iter().enumerate() {
                if !kinds.get(g).is_some_and(|k| k.is_positional()) {
                    continue; // never read, so never kept
                }
                let base = if reset { 0 } else { table.len() };
                let add = sc
                    .new_block_ids
                    .and_then(|t| t.get(g))
                    .map_or(0, |t| t.len());
                if base + add > self.config.max_blocks_per_request as usize {
                    return Err(InputError::TooManyBlocks { req: sc.req });
                }
            }
            // vLLM reads the hashes of every stored block for the events' payloads.
            if self.config.enable_events
                && sc.num_scheduled_tokens > 0
                && (sc.progress.block_hashes.len() as u64) < sc.progress.num_computed_tokens / hash
            {
                return Err(InputError::HashesTooShort { req: sc.req });
            }
        }
        Ok(())
    }

    /// `_prepare_eager_store_specs`: appends this step's stores to the store lists.
    pub(super) fn eager_stores(&mut self, gpu: &mut impl GpuBlocks, step: &StepInput<'_>) {
        let event = self.store_counter;
        let mut num_free = self.cpu.free_count();
        for h in step.handoffs {
            let slot = self.reqs.find(h.req);
            let gone = match slot {
                None => true,
                Some(s) => {
                    let st = &self.reqs.slots[s as usize].store;
                    !st.active
                        || st.finished
                        || step.preempted.contains(&h.req)
                        || step.finished.contains(&h.req)
                }
            };
            let Some(s) = slot.filter(|_| !gone) else {
                self.stats
                    .record(SaveOutcome::DroppedRequestGone, h.gpu_blocks.len() as u64);
                continue;
            };
            for &g in h.gpu_blocks {
                let outcome = match self.classify(gpu, g) {
                    Admission::NullBlock => SaveOutcome::DroppedNullBlock,
                    Admission::NotHashed => SaveOutcome::DroppedNotHashed,
                    Admission::InFlight => SaveOutcome::SkippedInFlight,
                    Admission::AlreadyCached => SaveOutcome::SkippedAlreadyCached,
                    Admission::Ready if num_free == 0 => SaveOutcome::DroppedCpuFull,
                    Admission::Ready => SaveOutcome::Stored,
                };
                self.stats.record(outcome, 1);
                if outcome != SaveOutcome::Stored {
                    continue;
                }
                self.alloc_cpu(1);
                let c = self.got[0];
                self.push_store(g, c, None);
                self.mark_request(s, c, event);
                self.set_in_flight(g, true);
                gpu.touch(&[g]);
                num_free -= 1;
            }
        }
        for &r in step.preempted {
            if let Some(s) = self.reqs.find(r) {
                let st = &mut self.reqs.slots[s as usize].store;
                if st.active {
                    st.clear();
                }
            }
        }
        for sc in step.scheduled {
            let Some(s) = self.reqs.find(sc.req) else {
                continue;
            };
            let st = &mut self.reqs.slots[s as usize].store;
            if !st.active || st.finished {
                continue;
            }
            if sc.full_table {
                st.tables.iter_mut().for_each(alloc::vec::Vec::clear);
            }
            if let Some(new) = sc.new_block_ids {
                let kinds = self.config.layout.kinds();
                for ((table, new), kind) in st.tables.iter_mut().zip(new).zip(kinds) {
                    if kind.is_positional() {
                        table.extend_from_slice(new); // within the reserve: checked
                    }
                }
            }
            if sc.num_scheduled_tokens == 0 {
                continue;
            }
            self.select_request(gpu, s, None, &sc.progress);
            let n = len32(self.sel_gpu.len());
            if n > 0 {
                self.alloc_cpu(n);
                for i in 0..n as usize {
                    let (g, c) = (self.sel_gpu[i], self.got[i]);
                    self.push_store(g, c, Some(i));
                    self.set_in_flight(g, true);
                }
                self.mark_request(s, self.got[0], event);
                gpu.touch(&self.sel_gpu);
            }
        }
    }

    /// `_select_eager_blocks_to_store`: fills `sel_gpu` (and `sel_meta` with events on) with
    /// the confirmed blocks of slot `s`'s positional groups, group after group, from each
    /// group's cursor on, that are ready to store while CPU blocks are free. The tables are
    /// the slot's own, and the cursors advance; or `given` (a finishing request's), and they
    /// stay.
    pub(super) fn select_request(
        &mut self,
        gpu: &impl GpuBlocks,
        s: u32,
        given: Option<Tables<'_>>,
        p: &Progress<'_>,
    ) {
        self.sel_gpu.clear();
        self.sel_meta.clear();
        self.sel_keys.clear();
        let num_free = self.cpu.free_count() as usize;
        let layout = self.config.layout;
        let groups = match given {
            Some(t) => t.len(),
            None => self.reqs.slots[s as usize].store.tables.len(),
        };
        for (g, kind) in layout.kinds().iter().enumerate().take(groups) {
            if !kind.is_positional() {
                continue;
            }
            if self.sel_gpu.len() >= num_free {
                break;
            }
            let st = &mut self.reqs.slots[s as usize].store;
            let cursor = st.cursors[g];
            let owned = core::mem::take(&mut st.tables[g]);
            let ids = given.map_or(&owned[..], |t| t[g]);
            let advanced = self.select(gpu, s, len32(g), ids, cursor, p, num_free);
            let st = &mut self.reqs.slots[s as usize].store;
            st.tables[g] = owned;
            if given.is_none() {
                // vLLM's final flush leaves the cursors as they are.
                st.cursors[g] = cursor.saturating_add(advanced);
            }
        }
    }

    /// One group's part of [`select_request`](Self::select_request) for slot `s`: appends
    /// group `group`'s ready blocks from `ids[cursor..]` while fewer than `num_free` are
    /// selected; returns how far the group's cursor advances.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &mut self,
        gpu: &impl GpuBlocks,
        s: u32,
        group: u32,
        ids: &[u32],
        cursor: u32,
        p: &Progress<'_>,
        num_free: usize,
    ) -> u32 {
        let bs = u64::from(self.config.block_size);
        let gb = u64::from(self.v.group_block_sizes[group as usize]);
        let hash = u64::from(self.v.hash_block_size);
        // Hash blocks per block: block `i` is keyed by hash `(i + 1)·per − 1`.
        let per = usize::try_from(gb / hash).unwrap_or(usize::MAX);
        let confirmed = p
            .num_computed_tokens
            .saturating_sub(p.num_output_placeholders);
        // vLLM's `get_num_cacheable_tokens`: a hybrid coordinator caches what a later hit
        // can end on (an EAGLE group one block past it, short of the re-prefillable tail),
        // a unitary one all but the re-prefillable tail.
        let align = |n: u64| {
            if self.v.partial_hash_hits {
                n
            } else {
                n - n % bs
            }
        };
        let cacheable = if !self.config.layout.is_hybrid() {
            confirmed.saturating_sub(u64::from(self.v.reprefillable))
        } else if self.v.specs.eagle(group) && align(confirmed) > 0 {
            let finalized = confirmed.saturating_sub(u64::from(self.v.prefill_reprefillable));
            finalized.min(align(finalized).saturating_add(gb))
        } else {
            align(confirmed)
        };
        let ready = ids
            .len()
            .min(usize::try_from(cacheable / gb).unwrap_or(usize::MAX));
        let hash_at = |j: Option<usize>| j.and_then(|j| p.block_hashes.get(j).copied());
        let block_hash =
            |i: usize| hash_at((i + 1).checked_mul(per).and_then(|e| e.checked_sub(1)));
        let keys_per = self.xfer.per();
        let mut advanced = 0u32;
        let start = cursor as usize;
        for (i, &id) in ids.iter().enumerate().take(ready).skip(start) {
            let mut g = id;
            if g == 0 {
                // A block that left a sliding window: stored from the GPU's prefix cache
                // while the GPU still holds it.
                let recovered = block_hash(i)
                    .and_then(|h| gpu.cached_block(BlockKey::new(h, group)))
                    .filter(|&b| b < gpu.num_blocks());
                let Some(b) = recovered else {
                    advanced += 1;
                    continue;
                };
                g = b;
            }
            if self.classify(gpu, g) != Admission::Ready {
                advanced += 1;
                continue;
            }
            // At most `num_free` and the tables' blocks (each within max_blocks_per_request,
            // checked) are selected: within the reserve.
            if self.sel_gpu.len() >= num_free {
                break;
            }
            self.sel_gpu.push(g);
            advanced += 1;
            if self.config.enable_events {
                let first = i.saturating_mul(per);
                self.sel_meta.push(Some(StoredMeta {
                    req: self.reqs.slots[s as usize].id,
                    parent_hash: hash_at(first.checked_sub(1)),
                    token_start: i as u64 * gb,
                }));
                for j in 0..keys_per {
                    let k = (j < per)
                        .then(|| hash_at(first.checked_add(j)))
                        .flatten()
                        .map_or(NO_KEY, |h| BlockKey::new(h, group));
                    self.sel_keys.push(k);
                }
            }
        }
        advanced
    }

    /// vLLM's `_find_fa_partial_tail_source`: with fine-grained hits, the full-attention
    /// block the prompt's last hash boundary ends inside, when that boundary is computed, not
    /// a block edge, the block is not null nor in flight, holds the boundary's key (as its
    /// hash or a secondary one) and the CPU pool lacks that key.
    fn partial_tail(
        &self,
        gpu: &impl GpuBlocks,
        tables: Tables<'_>,
        fin: &Finished<'_>,
    ) -> Option<u32> {
        if !self.v.partial_hash_hits {
            return None;
        }
        let fa = self.config.layout.attention_group();
        let hash = u64::from(self.v.hash_block_size);
        let fa_block = u64::from(self.v.group_block_sizes[fa as usize]);
        let boundary = fin.num_prompt_tokens / hash * hash;
        if boundary == 0
            || boundary > fin.progress.num_computed_tokens
            || boundary.is_multiple_of(fa_block)
        {
            return None;
        }
        let idx = usize::try_from(boundary / fa_block).ok()?;
        let block = *tables.get(fa as usize)?.get(idx)?;
        if block == 0 || self.is_in_flight(block) {
            return None;
        }
        let h = *fin
            .progress
            .block_hashes
            .get(usize::try_from(boundary / hash - 1).ok()?)?;
        // The block's own keys are read first: a view may learn keys as it reports them.
        let own = gpu.block_hash(block).map(|b| b.key);
        let key = gpu.request_key(BlockKey::new(h, fa));
        let holds = own == Some(key) || {
            let mut found = false;
            gpu.secondary_hashes(block, |k| found |= k == key);
            found
        };
        (holds && self.cpu.get_one_block(&key).is_none()).then_some(block)
    }

    /// `_queue_finished_eager_store`: the finishing request's confirmed blocks not yet
    /// stored become a flush, issued with the next step's store event.
    pub(super) fn queue_flush(&mut self, gpu: &mut impl GpuBlocks, s: u32, fin: &Finished<'_>) {
        if !self.reqs.slots[s as usize].store.active {
            return;
        }
        self.select_request(gpu, s, Some(fin.block_ids), &fin.progress);
        if let Some(tail) = self.partial_tail(gpu, fin.block_ids, fin)
            // Decode may have filled the boundary block: then the scan selected it already.
            && !self.sel_gpu.contains(&tail)
            && self.sel_gpu.len() < self.cpu.free_count() as usize
            && self.sel_gpu.len() < self.sel_gpu.capacity()
        {
            self.sel_gpu.push(tail);
            if self.config.enable_events {
                // No payload: the block's own keys are read when the copy completes.
                self.sel_meta.push(None);
                self.sel_keys.extend((0..self.xfer.per()).map(|_| NO_KEY));
            }
        }
        let n = len32(self.sel_gpu.len());
        if n == 0 {
            return;
        }
        self.alloc_cpu(n);
        for i in 0..n as usize {
            let c = self.got[i];
            self.xfer.req[c as usize] = (NIL, 0);
            self.set_selected_meta(c, i);
            self.set_in_flight(self.sel_gpu[i], true);
        }
        let chain = self.xfer.thread(&self.sel_gpu, &self.got);
        self.xfer.flushes.push(chain);
        self.xfer.pending_blocks += u64::from(n);
        gpu.touch(&self.sel_gpu);
    }

    /// Records selected block `i`'s metadata (events on) for CPU block `c`.
    fn set_selected_meta(&mut self, c: u32, i: usize) {
        let per = self.xfer.per();
        let meta = self.sel_meta.get(i).copied().flatten();
        let at = i.saturating_mul(per);
        let keys = self.sel_keys.get(at..at + per).unwrap_or_default();
        self.xfer.set_meta(c, meta, keys);
    }

    /// Appends one store to the step's lists, with no request mark yet; its metadata is
    /// selected block `sel` (`None`: no payload).
    fn push_store(&mut self, g: u32, c: u32, sel: Option<usize>) {
        self.store_gpu.push(g);
        self.store_cpu.push(c);
        self.xfer.req[c as usize] = (NIL, 0);
        match sel {
            Some(i) => self.set_selected_meta(c, i),
            None => self.xfer.set_meta(c, None, &[]),
        }
    }

    /// Counts slot `s` once in store event `event`, marking CPU block `c` as its reference.
    fn mark_request(&mut self, s: u32, c: u32, event: u64) {
        let slot = &mut self.reqs.slots[s as usize];
        let id = slot.id;
        if slot.store.last_event != Some(event) {
            slot.store.last_event = Some(event);
            slot.store.events += 1;
            self.xfer.req[c as usize] = (s, slot.generation);
        }
        if self.collect_reqs
            && !self.store_reqs.contains(&id)
            && self.store_reqs.len() < self.store_reqs.capacity()
        {
            self.store_reqs.push(id);
        }
    }
}
